"""Suffix decoding through the host-proposal worker: lossless against target-only decoding (greedy tokens and
logprobs on a ragged batch, the exact law when sampling), what the global tree carries between calls, the fast path,
and `specdec generate --draft suffix`. Its proposals are tests/models/test_suffix.py's."""
from collections import Counter

import pytest

from specdec import Engine, SamplingParams, SpecConfig, SuffixDraft
from specdec.cli import main
from specdec.lab import target_law
from specdec.zoo import corpus
from tests.helpers import (FALSE_FAILURE_RATE, assert_same_as_baseline, chi_square_pvalue, logprob_params,
                           near_bigram_target)


@pytest.fixture(scope="module")
def prompts():
    return [[int(t) for t in w[:n]] for w, n in zip(corpus.heldout_windows(3, 160, seed=5), (160, 97, 64))]


@pytest.fixture(scope="module")
def baseline(small, prompts):
    return Engine(small.target, max_seq_len=320).generate(prompts, logprob_params(40))


@pytest.mark.parametrize("spec", [SpecConfig(24), pytest.param(SpecConfig(5, 4, 16), marks=pytest.mark.slow)],
                         ids=str)
def test_suffix_is_greedy_identical_to_target_only(small, prompts, baseline, spec):
    """A ragged batch (prompts of 160, 97 and 64 tokens), logprobs too; a second call proposes from the first's
    outputs too (the global tree), so it accepts more."""
    engine = Engine(small.target, draft=SuffixDraft(), spec=spec, max_seq_len=320)
    assert_same_as_baseline(engine.generate(prompts, logprob_params(40)), baseline)
    first = engine.last_stats.mean_accept_len
    assert first > 1.15  # code repeats itself: the prompt's tree proposes what follows
    assert_same_as_baseline(engine.generate(prompts, logprob_params(40)), baseline)
    assert engine.last_stats.mean_accept_len > first + 1


def test_a_ragged_batch_of_lengths_and_stops(small, prompts):
    """Requests that end at different steps (lengths, a stop id) leave the batch while the others decode on: each
    output is the one it decodes alone, target-only."""
    params = [SamplingParams(max_new_tokens=30), SamplingParams(max_new_tokens=7),
              SamplingParams(max_new_tokens=40, stop_token_ids=[10])]
    outs = Engine(small.target, draft=SuffixDraft(max_tree_depth=8), spec=SpecConfig(6), max_seq_len=320).generate(
        prompts, params)
    alone = Engine(small.target, max_seq_len=320)
    for out, prompt, p in zip(outs, prompts, params):
        assert out.token_ids == alone.generate([prompt], p)[0].token_ids


def test_flush_cache_forgets_earlier_requests(small, prompts):
    """After `flush_cache` the proposals are a fresh engine's, step by step; without it the second call drafts from
    the first's outputs. With no global tree (max_cached_requests=0) a request drafts from its own text only: the
    two calls propose alike, and differ from the calls whose requests also draft from each other's outputs."""
    params, batch = SamplingParams(max_new_tokens=24), prompts[:2]
    fresh = [o.accept_lens for o in Engine(small.target, draft=SuffixDraft(), spec=SpecConfig(8),
                                           max_seq_len=320).generate(batch, params)]
    engine = Engine(small.target, draft=SuffixDraft(), spec=SpecConfig(8), max_seq_len=320)
    engine.generate(batch, params)
    remembered = [o.accept_lens for o in engine.generate(batch, params)]
    engine.flush_cache()
    assert [o.accept_lens for o in engine.generate(batch, params)] == fresh != remembered
    own = Engine(small.target, draft=SuffixDraft(max_cached_requests=0), spec=SpecConfig(8), max_seq_len=320)
    first = [o.accept_lens for o in own.generate(batch, params)]
    assert [o.accept_lens for o in own.generate(batch, params)] == first != remembered


@pytest.mark.parametrize("spec", [SpecConfig(3), SpecConfig(3, 2, 6)], ids=str)
def test_suffix_sampling_is_the_exact_distribution(spec):
    """A repetitive prompt, so that the trees propose: the joint law of three sampled tokens against enumeration."""
    V, N = 6, 3000
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3)
    prompt = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2]
    exact = target_law(target, prompt, 3, SamplingParams(temperature=0.8))
    engine = Engine(target, draft=SuffixDraft(max_cached_requests=0), spec=spec, max_batch=N, max_seq_len=24)
    outs = engine.generate([prompt] * N, SamplingParams(max_new_tokens=3, temperature=0.8), seed=3)
    assert any(a > 1 for o in outs for a in o.accept_lens)  # drafts were accepted: verify decided the law
    assert chi_square_pvalue(Counter(tuple(o.token_ids) for o in outs), exact) > FALSE_FAILURE_RATE


def test_suffix_fast_path_is_identical_on_a_tiny_target():
    from specdec.models import random_llama
    target = random_llama(vocab_size=64, hidden_size=32, num_hidden_layers=2, seed=7)
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 6, 7, 5, 6]]
    ref = Engine(target, max_seq_len=48).generate(prompts, logprob_params(8))
    outs = Engine(target, draft=SuffixDraft(), spec=SpecConfig(3, 2, 5), impl="fast", max_seq_len=48).generate(
        prompts, logprob_params(8))
    assert_same_as_baseline(outs, ref)


def test_a_shape_the_suffix_draft_cannot_run_is_a_one_line_value_error():
    """A tree it cannot fill; a rule that needs the draft's distribution, which frequency counts are not."""
    from specdec.models import random_llama
    target = random_llama(vocab_size=16, hidden_size=32, num_hidden_layers=1, seed=1)
    with pytest.raises(ValueError, match=r"num_draft_tokens=16 cannot be filled by a SuffixDraft tree of depth 1 "
                                         r"with 4 children per node"):
        Engine(target, draft=SuffixDraft(max_tree_depth=1), spec=SpecConfig(5, 4, 16))
    for kwargs in ({"draft_sampling": "sample"}, {"draft_sampling": "sample", "verify": "rejection"}):
        with pytest.raises(ValueError, match="SUFFIX draft has no distribution") as e:
            Engine(target, draft=SuffixDraft(), spec=SpecConfig(3, **kwargs))
        assert "\n" not in str(e.value)


def test_generate_drafts_with_suffix_decoding(capsys):
    """`specdec generate --draft suffix`: no weights, the kind's default shape (vLLM's chain of 24), lossless."""
    assert main(["generate", "--model", "stdlib-byte-6l", "--draft", "suffix", "--max-new-tokens", "24",
                 "def f(x):\n    return x\n\ndef g(x):\n    return x\n\ndef h("]) == 0
    out = capsys.readouterr().out
    assert "[suffix: SuffixDraft S24" in out and out.rstrip().endswith("identical tokens: yes")


def test_suffix_is_lossless_as_the_shape_switches(small, prompts, baseline):
    """An adaptive tuned spec whose policy runs a chain, no draft, a tree and a long chain in turn: the trees keep
    indexing through the no-draft steps, and the output stays target-only's."""
    from specdec.ops.contract import NO_DRAFT
    from specdec.tuning import Bucket, Candidate, TunedSpec, fingerprint, parameters_entry
    from tests.helpers import CyclingSpec
    draft = SuffixDraft()
    cycle = [(4, 1, 5), NO_DRAFT, (3, 2, 6), (24, 1, 25)]
    tuned = TunedSpec({"fingerprint": fingerprint(small.target)},
                      {"kind": "suffix", "fingerprint": fingerprint(draft), **parameters_entry(draft)}, {},
                      {4: Bucket((4, 1, 5), tuple(Candidate(s, 2.0, 1.0) for s in cycle))}, adaptive=True)
    engine = Engine(small.target, draft=draft, spec=tuned, max_batch=4, max_seq_len=320)
    engine.tuned = CyclingSpec(cycle)
    assert_same_as_baseline(engine.generate(prompts, logprob_params(40)), baseline)
    assert set(engine.last_stats.step_shapes) == set(cycle)
