"""Soak: many generate calls with request turnover, mixed batches and all three workers on one engine each.

Checks that nothing accumulates: resident memory stays within a bound, every cache slot is free after
every call, a decode step costs as much at the end of the run as at its start, and the last calls still
decode what fresh engines do. CI runs a short version; `-m slow` runs thousands of decode steps.
"""
import random
import statistics
import time
from pathlib import Path

import pytest

from specdec import Engine, SamplingParams, SpecConfig
from tests.helpers import near_bigram_target, perfect_eagle, perfect_mtp

#: Resident memory rises by about 30 MB over the first few hundred calls (oneDNN's and the allocator's
#: caches filling for new shapes) and then stays flat: measured from a quarter into the run, the long
#: run may grow by RSS_BOUND_MB at most; the short one, which ends inside that warm-up, by the warm-up.
RSS_BOUND_MB = 8
RSS_WARMUP_MB = 40


def _rss_mb():
    status = Path("/proc/self/status")
    if not status.is_file():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def _engines(target):
    return {
        "target-only": Engine(target, impl="reference", max_batch=4, max_seq_len=80),
        "eagle": Engine(target, perfect_eagle(target), SpecConfig(3, 2, 6), impl="reference", max_batch=4,
                        max_seq_len=80),
        "mtp": Engine(target, perfect_mtp(target, 3, True), SpecConfig(3), impl="reference", max_batch=4,
                      max_seq_len=80),
    }


def _random_call(rng, V):
    B = rng.randint(1, 4)
    prompts = [[rng.randrange(V) for _ in range(rng.randint(1, 12))] for _ in range(B)]
    params = []
    for _ in range(B):
        sampled = rng.random() < 0.5
        params.append(SamplingParams(
            max_new_tokens=rng.randint(1, 24), temperature=rng.choice([0.6, 1.0]) if sampled else 0.0,
            top_k=rng.choice([-1, 5]) if sampled else -1, stop_token_ids=[rng.randrange(V)] if rng.random() < 0.3
            else [], return_logprob=rng.random() < 0.5, top_logprobs_num=rng.choice([0, 2])))
    return prompts, params


def soak(num_calls: int, seed: int = 0):
    target = near_bigram_target(seed=7, mix=0.4)
    V = target.config.vocab_size
    engines = _engines(target)
    rng = random.Random(seed)
    for engine in engines.values():  # warm-up: first-call allocations are not growth
        for _ in range(3):
            engine.generate(*_random_call(rng, V), seed=0)
    rss_start = None
    per_step = []  # (call index, CPU seconds per decode step)
    steps = 0
    last = None
    for call in range(num_calls):
        if call == num_calls // 4:
            rss_start = _rss_mb()
        name = ("target-only", "eagle", "mtp")[call % 3]
        engine = engines[name]
        prompts, params = _random_call(rng, V)
        t0 = time.process_time()
        outs = engine.generate(prompts, params, seed=call)
        dt = time.process_time() - t0
        n = engine.last_stats.num_decode_steps
        steps += n
        if n:
            per_step.append((call, dt / n))
        assert all(c.num_free == c.max_batch for c in engine.worker.caches()), (call, name)
        assert len(outs) == len(prompts)
        last = (name, prompts, params, call, outs)
    rss_end = _rss_mb()
    return dict(steps=steps, per_step=per_step, rss_start=rss_start, rss_end=rss_end, last=last, target=target)


def _check(result, num_calls, rss_bound_mb):
    q = max(1, len(result["per_step"]) // 4)
    first = statistics.median(t for _, t in result["per_step"][:q])
    final = statistics.median(t for _, t in result["per_step"][-q:])
    assert final <= 2.0 * first, f"decode steps slowed down: {first * 1e3:.2f} -> {final * 1e3:.2f} ms"
    if result["rss_start"] is not None:
        grown = result["rss_end"] - result["rss_start"]
        assert grown <= rss_bound_mb, f"resident memory grew by {grown:.0f} MB over the last 3/4 of {num_calls} calls"
    # the last call decodes what a fresh engine does (nothing stale survived the turnover)
    name, prompts, params, call, outs = result["last"]
    fresh = _engines(result["target"])[name].generate(prompts, params, seed=call)
    assert [o.token_ids for o in outs] == [o.token_ids for o in fresh]


def test_soak_short():
    result = soak(num_calls=150)
    assert result["steps"] > 800
    _check(result, 150, RSS_WARMUP_MB)


@pytest.mark.slow
def test_soak_thousands_of_steps():
    result = soak(num_calls=1500, seed=1)
    assert result["steps"] > 8000
    _check(result, 1500, RSS_BOUND_MB)
