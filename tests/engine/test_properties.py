"""Property-based tests (hypothesis): acceptance patterns, batch compositions, sampling parameters and stop
positions. The tree ops' properties (random tree shapes through the ladder) sit beside their ladders, in
tests/ops/test_tree_ops.py and tests/ops/test_fast_tree_ops.py.

The CI examples are derandomized and few (each property a few seconds); `-m slow` runs the same
properties with many more, freshly drawn examples. A failing example found here becomes a named
regression test beside the others.
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdec import Engine, SamplingParams, SpecConfig
from specdec.models import random_eagle_head, random_mtp
from specdec.ops.contract import max_num_draft_tokens
from tests.helpers import PROPERTY_CI, PROPERTY_SLOW, near_bigram_target, perfect_eagle, perfect_mtp


@st.composite
def requests(draw, vocab_size):
    """1-3 requests: ragged prompts, greedy or sampled, stop tokens anywhere, 1-14 new tokens."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        prompt = draw(st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=9))
        greedy = draw(st.booleans())
        params = SamplingParams(
            max_new_tokens=draw(st.integers(1, 14)),
            temperature=0.0 if greedy else draw(st.sampled_from([0.5, 1.0, 1.7])),
            top_k=-1 if greedy else draw(st.sampled_from([-1, 1, 3])),
            top_p=1.0 if greedy else draw(st.sampled_from([1.0, 0.8])),
            stop_token_ids=draw(st.lists(st.integers(0, vocab_size - 1), max_size=2)),
            return_logprob=True)
        out.append((prompt, params))
    return out


@st.composite
def speculative_cases(draw):
    kind = draw(st.sampled_from(["eagle", "mtp", "mtp_chain"]))
    if kind == "eagle":
        S, K = draw(st.integers(1, 4)), draw(st.integers(1, 3))
        W = S + 1 if K == 1 else draw(st.integers(2, max_num_draft_tokens(K, S)))
        spec = SpecConfig(S, K, W)
    else:
        spec = SpecConfig(draw(st.integers(1, 3)))
    return dict(kind=kind, spec=spec, model_seed=draw(st.integers(0, 10 ** 6)), mix=draw(st.sampled_from([0.2, 0.6])),
                perfect_draft=draw(st.booleans()), reqs=draw(requests(vocab_size=32)), seed=draw(st.integers(0, 99)))


def _greedy_speculation_property(case):
    """Every greedy request of a batch (whatever else is in it: sampled requests, other lengths, stop
    tokens) decodes exactly what target-only decoding gives it alone, and logprobs agree."""
    target = near_bigram_target(seed=case["model_seed"], mix=case["mix"], vocab_size=32)
    spec, kind = case["spec"], case["kind"]
    if kind == "eagle":
        draft = perfect_eagle(target) if case["perfect_draft"] else random_eagle_head(target, seed=1)
    else:
        chain = kind == "mtp_chain"
        draft = (perfect_mtp(target, spec.num_steps, chain) if case["perfect_draft"]
                 else random_mtp(target, spec.num_steps, chain, seed=1))
    prompts = [p for p, _ in case["reqs"]]
    params = [sp for _, sp in case["reqs"]]
    spec_out = Engine(target, draft, spec, impl="reference", max_batch=3, max_seq_len=48).generate(
        prompts, params, seed=case["seed"])
    alone = Engine(target, impl="reference", max_batch=1, max_seq_len=48)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        if not sp.is_greedy:
            continue
        want = alone.generate([p], sp)[0]
        got = spec_out[i]
        assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason, (i, got, want)
        assert max((abs(a - b) for a, b in zip(got.logprobs, want.logprobs)), default=0.0) <= 1e-4


@given(speculative_cases())
@PROPERTY_CI
def test_greedy_speculation_equals_target_only_on_random_batches(case):
    _greedy_speculation_property(case)


@pytest.mark.slow
@given(speculative_cases())
@PROPERTY_SLOW
def test_greedy_speculation_equals_target_only_many(case):
    _greedy_speculation_property(case)


def test_regression_a_tree_smaller_than_its_depth():
    """Found by the property above: W = 2 < S + 1 = 3 (a tree cut to one draft node) has an accept_index of
    S + 1 columns, more than its W nodes; commit_kv_cache once refused that as malformed."""
    case = dict(kind="eagle", spec=SpecConfig(2, 2, 2), model_seed=0, mix=0.2, perfect_draft=False, seed=0,
                reqs=[([0], SamplingParams(max_new_tokens=2, temperature=0.5, return_logprob=True)),
                      ([3, 1], SamplingParams(max_new_tokens=9, return_logprob=True))])
    _greedy_speculation_property(case)


def test_properties_see_a_broken_verify(monkeypatch):
    """The greedy property can fail: a verify whose bonus token is off by one changes the output. (Accepting
    fewer drafts than it could would not: that is still lossless, only slower.)"""
    import reference
    real = reference.verify_tree_greedy

    def off_by_one(*args):
        predict, accept_index, accept_length = real(*args)
        return (predict + 1) % 32, accept_index, accept_length

    monkeypatch.setattr(reference, "verify_tree_greedy", off_by_one)
    case = dict(kind="eagle", spec=SpecConfig(3, 2, 6), model_seed=1, mix=0.2, perfect_draft=True, seed=0,
                reqs=[([1, 2, 3], SamplingParams(max_new_tokens=12, return_logprob=True))])
    with pytest.raises(AssertionError):
        _greedy_speculation_property(case)
