"""STANDALONE drafting: a small causal LM of the target's vocabulary drafts chains and trees from its own tokens and
KV cache; lossless against target-only decoding (greedy tokens and logprobs, the exact distribution when sampling,
penalties, grammars, ragged batches), and the alignment checked by a perfect draft (the target itself)."""
from collections import Counter

import pytest

from specdec.lab import target_law
from specdec import Engine, SamplingParams, SpecConfig
from specdec.cli.generate import load_draft
from specdec.models import random_llama
from specdec.zoo import corpus
from tests.helpers import (FALSE_FAILURE_RATE, assert_same_as_baseline, chi_square_pvalue, logprob_params,
                           near_bigram_target)

SPECS = [SpecConfig(3, 1), SpecConfig(5, 4, 16), SpecConfig(4, 2, 7)]


@pytest.fixture(scope="module")
def prompts():
    return [[int(t) for t in w[:n]] for w, n in zip(corpus.heldout_windows(3, 100, seed=5), (100, 61, 33))]


@pytest.fixture(scope="module")
def baseline(small, prompts):
    return Engine(small.target, max_seq_len=256).generate(prompts, logprob_params(40))


@pytest.fixture(scope="module")
def small_lm():
    """A one-layer LM of the byte vocabulary at a quarter of the target's width (random: speed of the alignment)."""
    return random_llama(vocab_size=258, hidden_size=64, intermediate_size=128, num_hidden_layers=1, seed=1)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_the_target_as_its_own_draft_is_accepted_in_full(small, prompts, baseline, spec):
    """A draft LM equal to the target proposes the target's own greedy continuation: every draft is accepted, which
    only holds when its positions, cache and committed length line up with the target's."""
    engine = Engine(small.target, draft=small.target, spec=spec, max_seq_len=256)
    outs = engine.generate(prompts, logprob_params(40))
    assert_same_as_baseline(outs, baseline)
    if spec.topk == 1:  # every step but the one max_new_tokens cuts emits the whole chain
        assert all(a == spec.num_steps + 1 for o in outs for a in o.accept_lens[:-1])
    else:  # a tree keeps the W-1 likeliest nodes, which need not hold the greedy path to full depth
        assert engine.last_stats.mean_accept_len > 0.75 * (spec.num_steps + 1)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_a_small_draft_lm_is_greedy_identical(small, prompts, baseline, small_lm, spec):
    outs = Engine(small.target, draft=small_lm, spec=spec, max_seq_len=256).generate(prompts, logprob_params(40))
    assert_same_as_baseline(outs, baseline)


def test_the_fast_path_is_identical_on_a_tiny_pair():
    target = random_llama(vocab_size=64, hidden_size=32, num_hidden_layers=2, seed=7)
    draft = random_llama(vocab_size=64, hidden_size=16, num_hidden_layers=1, seed=8)
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9]]
    ref = Engine(target, max_seq_len=48).generate(prompts, logprob_params(8))
    outs = Engine(target, draft=draft, spec=SpecConfig(3, 2, 5), impl="fast", max_seq_len=48).generate(
        prompts, logprob_params(8))
    assert_same_as_baseline(outs, ref)


@pytest.mark.slow
def test_the_fast_path_is_identical(small, prompts, small_lm):
    ref = Engine(small.target, max_seq_len=256).generate(prompts[1:], logprob_params(12))
    outs = Engine(small.target, draft=small.target, spec=SpecConfig(3, 2, 5), impl="fast",
                  max_seq_len=256).generate(prompts[1:], logprob_params(12))
    assert_same_as_baseline(outs, ref)


def test_penalties_grammars_and_a_ragged_batch(small, prompts):
    tok = small.tokenizer
    params = [SamplingParams(max_new_tokens=24, frequency_penalty=0.8, presence_penalty=0.4, return_logprob=True),
              SamplingParams(max_new_tokens=16, regex=r"(def|class) [A-Za-z_]+", stop_token_ids=[32]),
              SamplingParams(max_new_tokens=20, repetition_penalty=1.4, min_new_tokens=5, stop_token_ids=[10]),
              SamplingParams(max_new_tokens=10, temperature=0.8)]
    batch = [prompts[0], tok.encode("import os\n\n"), prompts[2], prompts[1]]
    spec = SpecConfig(4, 2, 7, draft_penalties=True, draft_grammar=True)
    outs = Engine(small.target, draft=small.target, spec=spec, max_seq_len=256, tokenizer=tok).generate(batch, params)
    alone = Engine(small.target, max_seq_len=256, tokenizer=tok)
    for i in range(3):
        assert_same_as_baseline([outs[i]], [alone.generate([batch[i]], params[i])[0]])
    assert tok.decode(outs[1].token_ids) == "class "


@pytest.mark.parametrize("spec", [SpecConfig(3, 1), SpecConfig(3, 2, 6)], ids=str)
def test_sampling_is_the_exact_distribution(spec):
    V, N = 6, 3000
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3)
    draft = near_bigram_target(seed=22, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3)
    exact = target_law(target, [1, 2], 3, SamplingParams(temperature=0.8))
    outs = Engine(target, draft=draft, spec=spec, max_batch=N, max_seq_len=16).generate(
        [[1, 2]] * N, SamplingParams(max_new_tokens=3, temperature=0.8), seed=5)
    assert any(a > 1 for o in outs for a in o.accept_lens)  # drafts were accepted: verify decided the law
    assert chi_square_pvalue(Counter(tuple(o.token_ids) for o in outs), exact) > FALSE_FAILURE_RATE


def test_a_draft_lm_of_another_vocabulary_is_a_value_error(small, tmp_path):
    other = random_llama(vocab_size=300, hidden_size=32, num_hidden_layers=1)
    with pytest.raises(ValueError, match="draft vocab_size=300 does not match the target's vocab_size=258"):
        Engine(small.target, draft=other, spec=SpecConfig(3, 1))
    other.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"vocab_size=300 does not match the target's vocab_size=258: a draft must "
                                         r"share the target's tokenizer"):
        load_draft(small.target, small.path / "target", tmp_path, "auto")
    out = Engine(small.target, draft=small.target, spec=SpecConfig(2, 1), max_seq_len=32).generate(
        [[1, 2, 3]], SamplingParams(max_new_tokens=3))[0]
    assert len(out.token_ids) == 3


def test_generate_loads_a_draft_lm_directory_and_ngram(small, small_lm, tmp_path):
    small_lm.save_pretrained(tmp_path)
    draft, spec = load_draft(small.target, small.path / "target", tmp_path, "auto")
    assert type(draft).__name__ == "LlamaForCausalLM" and spec == SpecConfig(5, 4, 16)
    from specdec import NgramDraft
    assert load_draft(small.target, small.path / "target", "ngram", "auto") == (NgramDraft(), SpecConfig(5, 4, 16))
    # a head's directory still loads as a head
    head, _ = load_draft(small.target, small.path / "target", small.path / "eagle", "auto")
    assert type(head).__name__ == "EagleDraftHead"
