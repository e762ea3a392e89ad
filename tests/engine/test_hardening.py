"""Bad numbers and bad timing: non-finite logits, a poisoned KV cache, concurrent and interrupted calls.

Each test reproduces a failure found by trying the engine as a user would, and failed
before its fix."""
import threading

import pytest
import torch

from specdec import Engine, SamplingParams, SpecConfig
from tests.helpers import near_bigram_target, perfect_eagle, perfect_mtp

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 4], [10, 11, 12], [5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5]]
KINDS = ["target-only", "eagle", "mtp"]


def _engine(kind, target, **kw):
    draft, spec = {"target-only": (None, None), "eagle": (perfect_eagle(target), SpecConfig(3, 2, 6)),
                   "mtp": (perfect_mtp(target, 3, True), SpecConfig(3))}[kind]
    return Engine(target, draft, spec, impl="reference", max_batch=4, max_seq_len=96, **kw)


def _params(**kw):
    return SamplingParams(max_new_tokens=12, return_logprob=True, top_logprobs_num=2, **kw)


def _all_free(engine):
    return all(c.num_free == c.max_batch for c in engine.worker.caches())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_non_finite_target_logits_stop_the_request_with_an_error(kind, temperature):
    target = near_bigram_target(seed=2)
    engine = _engine(kind, target)
    with torch.no_grad():
        target.lm_head.weight[7].fill_(float("inf"))  # one vocabulary row: every request's logits hold an inf
    outs = engine.generate(PROMPTS, _params(temperature=temperature), seed=1)
    for r, o in enumerate(outs):
        assert o.finish_reason == "error" and o.token_ids == [] and o.logprobs == []
        assert o.error.startswith(f"request {r}: the target's logits at prefill hold a NaN or an infinity")
    assert _all_free(engine)


@pytest.mark.parametrize("kind", KINDS)
def test_a_nan_in_one_request_stops_only_that_request(kind):
    """Token 13's embedding is NaN: a request meets it only when it generates it (or has it in its prompt)."""
    target = near_bigram_target(seed=2)
    clean = _engine(kind, target).generate(PROMPTS, _params(), seed=1)
    with torch.no_grad():
        target.model.embed_tokens.weight[13].fill_(float("nan"))
    prompts = PROMPTS[:3] + [PROMPTS[3][:4] + [13] + PROMPTS[3][4:]]
    engine = _engine(kind, target)
    outs = engine.generate(prompts, _params(), seed=1)
    for o, c in zip(outs[:3], clean[:3]):
        if 13 in c.token_ids:  # it generated the bad token: stopped at the step after it, tokens kept up to it
            assert o.finish_reason == "error" and "decode step" in o.error
            assert o.token_ids == c.token_ids[:len(o.token_ids)] and o.token_ids[-1] == 13
        else:
            assert o.token_ids == c.token_ids and o.finish_reason == c.finish_reason and o.error is None
        assert all(x == x for x in o.logprobs)  # no NaN logprob is ever emitted
    assert outs[3].finish_reason == "error" and outs[3].token_ids == [] and "at prefill" in outs[3].error
    assert _all_free(engine)


def test_a_nan_draft_only_costs_acceptance():
    """A NaN in the draft (not the target) is no error: every proposal is rejected, the output is
    target-only's."""
    target = near_bigram_target(seed=2)
    ref = _engine("target-only", target).generate(PROMPTS, _params(), seed=1)
    for kind in ("eagle", "mtp"):
        engine = _engine(kind, target)
        with torch.no_grad():
            for p in engine.draft.parameters():
                p.fill_(float("nan"))
        outs = engine.generate(PROMPTS, _params(), seed=1)
        for o, r in zip(outs, ref):
            assert o.token_ids == r.token_ids and o.error is None
            assert set(o.accept_lens) == {1}


@pytest.mark.parametrize("kind", KINDS)
def test_nan_left_in_the_kv_cache_does_not_reach_a_later_request(kind):
    """A request with a NaN weight writes NaN keys and values into its cache row; once the weight is back,
    a batch of mixed prompt lengths on the same engine (shorter requests attend over that row's stale,
    masked positions) decodes exactly as on a fresh engine."""
    target = near_bigram_target(seed=4)
    engine = _engine(kind, target)
    v = target.model.layers[0].self_attn.qkv_proj.weight
    saved = v.detach().clone()
    with torch.no_grad():
        v.fill_(float("nan"))
    long_prompts = [list(range(1, 40))] * 4
    assert all(o.finish_reason == "error" for o in engine.generate(long_prompts, _params(), seed=0))
    with torch.no_grad():
        v.copy_(saved)
    got = engine.generate(PROMPTS, _params(temperature=0.7), seed=3)
    want = _engine(kind, target).generate(PROMPTS, _params(temperature=0.7), seed=3)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.error is None
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) <= 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_calls_run_one_at_a_time_and_leak_nothing(kind):
    target = near_bigram_target(seed=5)
    engine = _engine(kind, target)
    calls = [(PROMPTS[i:i + 2], _params(temperature=t), s) for i in range(3) for t, s in ((0.0, 0), (0.8, i))]
    want = [engine.generate(p, sp, seed=s) for p, sp, s in calls]
    got = [None] * len(calls)
    errors = []

    def run(k):
        try:
            got[k] = engine.generate(*calls[k][:2], seed=calls[k][2])
        except Exception as e:  # noqa: BLE001 -- the test reports any failure below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for g, w in zip(got, want):
        assert [o.token_ids for o in g] == [o.token_ids for o in w]
    assert _all_free(engine)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_call_frees_every_slot(kind, exc):
    target = near_bigram_target(seed=6)
    engine = _engine(kind, target)
    want = engine.generate(PROMPTS, _params(), seed=2)
    decode, calls = engine._decode, []

    def interrupted():
        calls.append(1)
        if len(calls) == 3:
            raise exc("interrupted mid-generation")
        return decode()

    engine._decode = interrupted
    with pytest.raises(exc):
        engine.generate(PROMPTS, _params(), seed=2)
    engine._decode = decode
    assert _all_free(engine)
    assert [o.token_ids for o in engine.generate(PROMPTS, _params(), seed=2)] == [o.token_ids for o in want]
