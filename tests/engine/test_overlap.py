"""Decoding ahead (`Engine(overlap=True)`): each decode step is enqueued before the host reads the one before it.
The outputs must be those of the plain loop that reads every step first (the independent computation here), for
every kind, greedy and sampled, with requests ending at different steps (a request's last step is followed by one
more whose results are dropped), NaN rows, through the CUDA-graph runner's static buffers, and at the end of the
cache, where decoding ahead stops."""
from __future__ import annotations

import pytest
import torch

from specdec import Engine, SamplingParams, SpecConfig
from specdec.draft_kinds import draft_kind
from specdec.workers.graphs import DecodeGraphs
from tests.helpers import assert_same_as_baseline, near_bigram_target, perfect_eagle, perfect_mtp

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 4], [10, 11, 12], [5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5], [3, 1]]


def requests() -> list[SamplingParams]:
    logprobs = dict(return_logprob=True, top_logprobs_num=2, token_ids_logprob=[0, 4])
    return [SamplingParams(max_new_tokens=3, **logprobs),
            SamplingParams(max_new_tokens=11, temperature=0.9, **logprobs),
            SamplingParams(max_new_tokens=7, stop_token_ids=[12, 13, 14], **logprobs),
            SamplingParams(max_new_tokens=1, **logprobs),
            SamplingParams(max_new_tokens=9, temperature=0.7, top_k=5, frequency_penalty=0.3, **logprobs)]


def drafts(target) -> dict:
    random_kinds = {k: draft_kind(k) for k in ("ngram", "draft_lm", "dflash", "dspark")}
    pairs = {"target-only": (None, None), "eagle": (perfect_eagle(target), SpecConfig(3, 2, 6)),
             "mtp": (perfect_mtp(target, 3, True), SpecConfig(3))}
    for name, kind in random_kinds.items():
        draft = kind.new_random_draft(target)
        pairs[name] = (draft, kind.default_spec(draft))
    return pairs


class CountedDecode:
    """Wraps an engine's decode: counts the steps enqueued."""

    def __init__(self, decode):
        self.decode, self.calls = decode, 0

    def __call__(self):
        self.calls += 1
        return self.decode()


def run(target, draft, spec, overlap: bool, graphs: bool = False, prompts=PROMPTS, params=None, max_seq_len=96):
    engine = Engine(target, draft, spec, impl="reference", max_batch=len(prompts), max_seq_len=max_seq_len,
                    overlap=overlap, preallocate=True)  # its decode is wrapped before the call
    if graphs:
        engine._decode = DecodeGraphs(engine.worker, capture=False).decode_step
    counted = engine._decode = CountedDecode(engine._decode)
    outs = engine.generate(prompts, params or requests(), seed=5)
    assert all(c.num_free == c.max_batch for c in engine.worker.caches())
    return outs, counted.calls, engine.last_stats.num_decode_steps


def assert_identical(outs, expected):
    """The same tokens, finish reasons, errors and accepted lengths; logprobs within the table's tolerance: a step
    enqueued ahead sees a looser host bound on the lengths, so its attention spans more (masked) keys, which moves
    the last bits of a sum."""
    assert_same_as_baseline(outs, expected)
    for o, e in zip(outs, expected):
        assert (o.accept_lens, o.error) == (e.accept_lens, e.error)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "static-buffers"])
@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp", "ngram", "draft_lm", "dflash", "dspark"])
def test_decoding_ahead_equals_reading_every_step_first(kind, graphs):
    target = near_bigram_target(seed=4, mix=0.4)
    draft, spec = drafts(target)[kind]
    expected, plain_calls, plain_steps = run(target, draft, spec, overlap=False, graphs=graphs)
    outs, calls, steps = run(target, draft, spec, overlap=True, graphs=graphs)
    assert_identical(outs, expected)
    assert plain_calls == plain_steps == steps
    # the step enqueued before the read that ended the last request is dropped; NGRAM reads each step first
    assert calls == steps + (kind != "ngram")
    if kind != "target-only":  # lossless: the greedy requests are target-only decoding's
        base, _, _ = run(target, None, None, overlap=False)
        assert_same_as_baseline([outs[i] for i in (0, 2, 3)], [base[i] for i in (0, 2, 3)])


@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_a_nan_row_stops_its_request_after_a_step_ahead(kind):
    """The embedding of a token a request generates mid-way is NaN: that request has one more step enqueued before
    its NaN row is read; that step runs on NaN state and is dropped, and the other requests are untouched."""
    target = near_bigram_target(seed=2)
    draft, spec = drafts(target)[kind]
    params = [SamplingParams(max_new_tokens=12, return_logprob=True, top_logprobs_num=2)] * len(PROMPTS)
    clean, _, _ = run(target, draft, spec, overlap=False, params=params)
    poisoned = clean[1].token_ids[3]
    with torch.no_grad():
        target.model.embed_tokens.weight[poisoned].fill_(float("nan"))
    expected, _, _ = run(target, draft, spec, overlap=False, params=params)
    outs, calls, steps = run(target, draft, spec, overlap=True, params=params)
    assert_identical(outs, expected)
    assert any(o.finish_reason == "error" and "decode step" in o.error for o in outs)
    assert calls == steps + 1


@pytest.mark.parametrize("kind", ["target-only", "eagle"])
def test_no_step_ahead_past_the_end_of_the_cache(kind):
    """Requests that fill their cache rows exactly: a step ahead is enqueued only while the host's bound on the
    lengths leaves room for it in every row, so nothing is written past a row (the reference ops' indexing would
    raise) and the outputs are the plain loop's."""
    target = near_bigram_target(seed=4, mix=0.4)
    draft, spec = drafts(target)[kind]
    margin = 0 if draft is None else draft_kind(kind).kv_margin(spec)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 4, 2, 2, 8, 1, 1]]
    params = [SamplingParams(max_new_tokens=20)] * 2
    max_seq_len = 7 + 20 + margin
    expected, _, _ = run(target, draft, spec, overlap=False, prompts=prompts, params=params, max_seq_len=max_seq_len)
    outs, calls, steps = run(target, draft, spec, overlap=True, prompts=prompts, params=params,
                             max_seq_len=max_seq_len)
    assert_identical(outs, expected)
    assert [len(o.token_ids) for o in outs] == [20, 20]
    assert calls <= steps + 1


def test_overlap_must_be_a_bool():
    target = near_bigram_target(seed=4)
    with pytest.raises(ValueError, match="overlap must be True, False or None, got 'yes'"):
        Engine(target, impl="reference", overlap="yes")
    assert Engine(target, impl="reference").overlap is False  # on by default only with CUDA graphs
