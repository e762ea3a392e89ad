"""NGRAM drafting: the verify input, the trie's capacity, and the worker lossless against target-only decoding under
every option (greedy tokens and logprobs, the exact distribution when sampling, penalties, grammars, ragged batches).
SGLang's tree rules are tests/models/test_ngram_sglang_rules.py's."""
import random
from collections import Counter

import pytest
import torch

from specdec.lab import target_law
from specdec import Engine, SamplingParams, SpecConfig
from specdec.models.ngram import NgramDraft, NgramTrie, verify_input
from specdec.zoo import corpus
from tests.helpers import (FALSE_FAILURE_RATE, CyclingSpec, assert_same_as_baseline, chi_square_pvalue,
                           logprob_params, near_bigram_target)


def test_ngram_prob_trees_decode_as_target_only(small, prompts, baseline):
    engine = Engine(small.target, draft=NgramDraft(match_type="PROB"), spec=SpecConfig(6, 3, 12), max_seq_len=320)
    assert_same_as_baseline(engine.generate(prompts, logprob_params(48)), baseline)
    assert engine.last_stats.mean_accept_len > 1.3


def test_the_verify_input_links_only_the_proposal():
    nodes = [(7, 0), (8, 0), (9, 1)]
    cand, mask, pos, ridx, nxt, sib = verify_input([5], [nodes], [10], 6)
    assert cand.tolist() == [[5, 7, 8, 9, 5, 5]]
    assert pos.tolist() == [[10, 11, 11, 12, 11, 11]]
    assert nxt.tolist() == [[1, 3, -1, -1, -1, -1]] and sib.tolist() == [[-1, 2, -1, -1, -1, -1]]
    want = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0], [1, 1, 0, 1, 0, 0],
                         [1, 0, 0, 0, 1, 0], [1, 0, 0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(mask[0], want) and ridx.tolist() == [list(range(6))]


def test_a_full_trie_drops_its_least_recently_touched_leaves():
    """Capacity 6: the root and 5 nodes. Worked by hand: inserting 1-2-3 walks 1-2-3 (3 nodes, touched deepest
    first, so 1-2-3 is the least recent), 2-3 (2 nodes: full), then 3 needs one: 1-2-3 goes. Inserting 4-5: 4-5
    needs two, so 1-2 (a leaf by then) and 1 go; 5 needs one more, and 2-3 goes."""
    trie = NgramTrie(3, 6)
    trie.insert([1, 2, 3])
    assert set(trie.root.children) == {1, 2, 3} and len(trie) == 5
    assert trie.root.children[1].children[2].children == {} and 3 in trie.root.children[2].children
    trie.insert([4, 5])
    assert set(trie.root.children) == {2, 3, 4, 5} and len(trie) == 5
    assert trie.root.children[2].children == {} and 5 in trie.root.children[4].children


# ---- the worker ------------------------------------------------------------------------------------------------

SPECS = [SpecConfig(4, 1), SpecConfig(5, 4, 16), SpecConfig(8, 2, 12)]
#: SGLang's rules, and each toolkit option in turn
OPTIONS = {"sglang": {}, "per-request": {"shared": False}, "sequence": {"indexing": "sequence"},
           "frequency": {"child_order": "frequency"}, "prob": {"match_type": "PROB"}}


@pytest.fixture(scope="module")
def prompts():
    return [[int(t) for t in w[:n]] for w, n in zip(corpus.heldout_windows(4, 160, seed=5), (160, 97, 130, 64))]


@pytest.fixture(scope="module")
def baseline(small, prompts):
    return Engine(small.target, max_seq_len=320).generate(prompts, logprob_params(48))


@pytest.mark.parametrize("spec, option", [(SPECS[0], "sglang"), (SPECS[1], "sequence"), (SPECS[1], "per-request"),
                                          (SPECS[2], "frequency"),
                                          pytest.param(SPECS[1], "sglang", marks=pytest.mark.slow),
                                          pytest.param(SPECS[0], "per-request", marks=pytest.mark.slow),
                                          pytest.param(SPECS[2], "prob", marks=pytest.mark.slow)], ids=str)
def test_ngram_is_greedy_identical_to_target_only(small, prompts, baseline, spec, option):
    draft = NgramDraft(**OPTIONS[option])
    engine = Engine(small.target, draft=draft, spec=spec, max_seq_len=320)
    outs = engine.generate(prompts, logprob_params(48))
    assert_same_as_baseline(outs, baseline)
    assert engine.last_stats.mean_accept_len > 1.15  # code repeats itself: the trie proposes what follows
    if draft.shared:  # the shared trie keeps what it saw: a second run accepts more
        first = engine.last_stats.mean_accept_len
        assert_same_as_baseline(engine.generate(prompts, logprob_params(48)), baseline)
        assert engine.last_stats.mean_accept_len > first


def test_flush_cache_forgets_what_the_shared_index_saw(small, prompts, baseline):
    """After `flush_cache` a shared draft proposes what a fresh engine's proposes: the same accepted lengths, step by
    step; without it the second run drafts from the first run's outputs."""
    params = logprob_params(48)
    first = [o.accept_lens for o in Engine(small.target, draft=NgramDraft(shared=True), spec=SPECS[0],
                                           max_seq_len=320).generate(prompts, params)]
    engine = Engine(small.target, draft=NgramDraft(shared=True), spec=SPECS[0], max_seq_len=320)
    engine.generate(prompts, params)
    remembered = [o.accept_lens for o in engine.generate(prompts, params)]
    engine.flush_cache()
    outs = engine.generate(prompts, params)
    assert_same_as_baseline(outs, baseline)
    assert [o.accept_lens for o in outs] == first and remembered != first
    Engine(small.target, max_seq_len=320).flush_cache()  # nothing to forget: a no-op


def test_ngram_fast_path_is_identical_on_a_tiny_target():
    from specdec.models import random_llama
    target = random_llama(vocab_size=64, hidden_size=32, num_hidden_layers=2, seed=7)
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 6, 7, 5, 6]]
    ref = Engine(target, max_seq_len=48).generate(prompts, logprob_params(8))
    outs = Engine(target, draft=NgramDraft(), spec=SpecConfig(3, 2, 5), impl="fast", max_seq_len=48).generate(
        prompts, logprob_params(8))
    assert_same_as_baseline(outs, ref)


@pytest.mark.slow
def test_ngram_fast_path_is_identical(small, prompts, baseline):
    engine = Engine(small.target, draft=NgramDraft(), spec=SpecConfig(3, 2, 6), impl="fast", max_seq_len=320)
    outs = engine.generate(prompts[:2], logprob_params(16))
    ref = Engine(small.target, max_seq_len=320).generate(prompts[:2], logprob_params(16))
    assert_same_as_baseline(outs, ref)


def test_a_request_with_nothing_to_match_decodes_one_token_a_step(small):
    """No proposal (a fresh trie, whose first decode step matches nothing): the step's target forward reads the root
    alone, as a target-only step does."""
    widths = []
    hook = small.target.register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[1]))
    try:
        engine = Engine(small.target, draft=NgramDraft(), spec=SpecConfig(5, 4, 16), max_seq_len=64)
        out = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))[0]
    finally:
        hook.remove()
    assert out.accept_lens == [1] and len(out.token_ids) == 2
    assert widths == [3, 1]  # the prefill, then one one-token step


def test_a_short_proposal_is_verified_in_the_narrowest_width_that_holds_it(small, prompts):
    """The verify width of a step is the smallest of 1, 2, 4, ..., W holding the batch's largest tree, and the
    output stays target-only's."""
    from specdec.workers.graphs import DecodeGraphs
    engine = Engine(small.target, draft=NgramDraft(max_trie_depth=4, max_bfs_breadth=2, indexing="sequence"),
                    spec=SpecConfig(3, 2, 11),
                    max_batch=2, max_seq_len=320, preallocate=True)
    assert [engine.worker.width_for(n) for n in (1, 2, 3, 5, 8, 9, 11)] == [1, 2, 4, 8, 8, 11, 11]
    graphs = DecodeGraphs(engine.worker, capture=False)
    engine._decode = graphs.decode_step
    outs = engine.generate(prompts[:2], logprob_params(32))
    ref = Engine(small.target, max_seq_len=320).generate(prompts[:2], logprob_params(32))
    assert_same_as_baseline(outs, ref)
    widths = {key[-2] for key in graphs.entries}
    assert len(widths) > 1 and widths <= {1, 2, 4, 8, 11}  # one set of static buffers per width seen


def test_an_ngram_step_moves_kv_in_its_commit_only_when_a_tree_branches():
    """topk = 1 bounds each anchor's children, but a shorter anchor can still add a sibling: a step skips the commit
    exactly when every verify tree it sent up is a chain in index order (no sibling links, node i's child i + 1),
    and the output stays target-only's."""
    from specdec.models import random_llama
    target = random_llama(vocab_size=6, hidden_size=32, num_hidden_layers=2, seed=7)
    rng = random.Random(0)
    prompts = [[rng.randrange(6) for _ in range(60)] for _ in range(3)]
    engine = Engine(target, draft=NgramDraft(), spec=SpecConfig(4, 1), max_seq_len=128, preallocate=True)
    w = engine.worker
    commits, steps = [], []
    commit = w.cache.commit
    w.cache.commit = lambda *a: (commits.append(1), commit(*a))
    decode = engine._decode

    def recorded():
        commits.clear()
        out = decode()
        nxt, sib = w.state.proposal_next_token, w.state.proposal_next_sibling
        node = torch.arange(nxt.shape[1])
        chain = bool((sib < 0).all() and ((nxt < 0) | (nxt == node + 1)).all())
        steps.append((chain, len(commits)))
        return out

    engine._decode = recorded
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=40))
    ref = Engine(target, max_seq_len=128).generate(prompts, SamplingParams(max_new_tokens=40))
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert set(steps) == {(True, 0), (False, 1)}


def test_ngram_under_penalties_grammars_and_a_ragged_mixed_batch(small, prompts):
    tok = small.tokenizer
    params = [SamplingParams(max_new_tokens=30, frequency_penalty=0.6, presence_penalty=0.3, return_logprob=True),
              SamplingParams(max_new_tokens=20, regex=r"(def|class) [A-Za-z_]+\(", stop_token_ids=[32]),
              SamplingParams(max_new_tokens=25, repetition_penalty=1.3, logit_bias={10: -2.0}),
              SamplingParams(max_new_tokens=12, temperature=0.9, top_k=20)]
    batch = [prompts[0][:120], tok.encode("import os\n\n"), prompts[2][:40], prompts[3]]
    engine = Engine(small.target, draft=NgramDraft(), spec=SpecConfig(4, 3, 10), max_seq_len=320, tokenizer=tok)
    outs = engine.generate(batch, params)
    alone = Engine(small.target, max_seq_len=320, tokenizer=tok)
    for i in range(3):
        assert_same_as_baseline([outs[i]], [alone.generate([batch[i]], params[i])[0]])
    assert tok.decode(outs[1].token_ids) == "class "
    assert len(outs[3].token_ids) == 12


def test_a_grammar_batch_takes_no_round_trip_of_its_own(small, prompts):
    """Under a grammar the matchers advance from the tokens NGRAM's prologue brought down, and the tree's masks are
    filled before the tree goes up: the grammar's own transfer never runs, and the output is target-only's."""
    tok = small.tokenizer
    params = [SamplingParams(max_new_tokens=24, regex=r"(def|class) [a-z_]+\(self\):"),
              SamplingParams(max_new_tokens=24)]
    batch = [tok.encode("class A:\n    def f(self):\n        pass\n    "), prompts[1]]
    engine = Engine(small.target, draft=NgramDraft(), spec=SpecConfig(4, 2, 8), max_seq_len=320, tokenizer=tok)
    calls = []  # each call of the grammar's own transfer: (tensors asked for, pending tokens)
    worker, transfer = engine.worker, engine.worker.advance_grammar_and_fetch
    worker.advance_grammar_and_fetch = lambda *t: (calls.append((len(t), worker.state.grammar_tokens is not None))
                                                   or transfer(*t))
    outs = engine.generate(batch, params)
    alone = Engine(small.target, max_seq_len=320, tokenizer=tok)
    for out, prompt, p in zip(outs, batch, params):
        assert_same_as_baseline([out], [alone.generate([prompt], p)[0]])
    assert calls and not any(n or pending for n, pending in calls)  # only the prefill's, which moves nothing
    assert max(outs[0].accept_lens) > 1


@pytest.mark.parametrize("spec, option", [(SpecConfig(3, 1), "sglang"), (SpecConfig(3, 2, 6), "sglang"),
                                          (SpecConfig(3, 2, 6), "sequence"), (SpecConfig(3, 2, 6), "per-request"),
                                          (SpecConfig(3, 2, 6), "frequency")], ids=str)
def test_ngram_sampling_is_the_exact_distribution(spec, option):
    """A repetitive prompt, so that the index proposes: the joint law of three sampled tokens against enumeration."""
    V, N = 6, 3000
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3)
    prompt = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2]
    exact = target_law(target, prompt, 3, SamplingParams(temperature=0.8))
    engine = Engine(target, draft=NgramDraft(**OPTIONS[option]), spec=spec, max_batch=N, max_seq_len=24)
    outs = engine.generate([prompt] * N, SamplingParams(max_new_tokens=3, temperature=0.8), seed=3)
    assert any(a > 1 for o in outs for a in o.accept_lens)  # drafts were accepted: verify decided the law
    assert chi_square_pvalue(Counter(tuple(o.token_ids) for o in outs), exact) > FALSE_FAILURE_RATE


def test_ngram_through_the_graph_buffers(small, prompts, baseline):
    from specdec.workers.graphs import DecodeGraphs
    engine = Engine(small.target, draft=NgramDraft(), spec=SpecConfig(5, 4, 16), max_batch=4, max_seq_len=320)
    engine._decode = DecodeGraphs(engine.worker, capture=False).decode_step
    outs = engine.generate(prompts[:3], logprob_params(48))  # bucket 4, padded; requests finish at different steps
    assert_same_as_baseline(outs, baseline[:3])


def test_a_tree_the_ngram_draft_cannot_fill_is_a_value_error_and_the_engine_serves_on(small):
    with pytest.raises(ValueError, match="num_draft_tokens=16 cannot be filled by a NgramDraft tree of depth 5 with 1 "
                                         "children per node"):
        Engine(small.target, draft=NgramDraft(max_bfs_breadth=1), spec=SpecConfig(5, 4, 16))
    engine = Engine(small.target, draft=NgramDraft(), spec=SpecConfig(2, 2, 6), max_seq_len=64)
    with pytest.raises(ValueError, match="request 0"):
        engine.generate([[1, 2, 999]], SamplingParams(max_new_tokens=2))
    assert len(engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))[0].token_ids) == 2


def test_ngram_speculates_for_any_target():
    """NGRAM speculates for any target: a random Llama with no trained head."""
    from specdec.models import random_llama
    target = random_llama(vocab_size=50, hidden_size=32, num_hidden_layers=2, seed=3)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    base = Engine(target, max_seq_len=64).generate([prompt], logprob_params(20))
    outs = Engine(target, draft=NgramDraft(), spec=SpecConfig(4, 2, 8), max_seq_len=64).generate(
        [prompt], logprob_params(20))
    assert_same_as_baseline(outs, base)


def test_a_tuned_file_for_the_older_parameters_is_refused_by_name(small):
    """A tuned NGRAM file records its draft's parameters; one that records none (tuned before SGLang 0.5.23's names)
    is refused naming the older ones, one for other values of the same names by its fingerprint."""
    from specdec.tuning import Bucket, Candidate, TunedSpec, fingerprint, parameters_entry
    draft = NgramDraft()
    buckets = {1: Bucket((3, 1, 4), (Candidate((3, 1, 4), 2.0, 1.0),))}
    target = {"fingerprint": fingerprint(small.target)}
    old = TunedSpec(target, {"kind": "ngram", "fingerprint": "b277725787a624a0"}, {}, buckets, path="old.json")
    with pytest.raises(ValueError, match=r"tuned file old.json: tuned for NgramDraft's older parameters "
                                         r"\(min_match_window_size, max_match_window_size, branch_length\), not this "
                                         r"one's \(max_trie_depth, min_bfs_breadth, max_bfs_breadth, "):
        Engine(small.target, draft, old)
    other = NgramDraft(max_trie_depth=12)
    tuned = TunedSpec(target, {"kind": "ngram", "fingerprint": fingerprint(other), **parameters_entry(other)}, {},
                      buckets, path="other.json")
    with pytest.raises(ValueError, match=r"draft\.fingerprint .* is not this draft's"):
        Engine(small.target, draft, tuned)
    assert Engine(small.target, other, tuned, max_seq_len=64).generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))


@pytest.mark.parametrize("option", ["per-request", "sequence", "frequency", "prob"])
def test_every_option_is_lossless_as_the_shape_switches(small, prompts, baseline, option):
    """Each toolkit option (and PROB) under an adaptive tuned spec whose policy runs a tree, no draft, a chain and
    a narrow tree in turn: the output stays target-only's (SGLang's rules: tests/engine/test_tuning.py)."""
    from specdec.ops.contract import NO_DRAFT
    from specdec.tuning import Bucket, Candidate, TunedSpec, fingerprint, parameters_entry
    draft = NgramDraft(**OPTIONS[option])
    cycle = [(5, 4, 16), NO_DRAFT, (3, 1, 4), (8, 2, 8)]
    tuned = TunedSpec({"fingerprint": fingerprint(small.target)},
                      {"kind": "ngram", "fingerprint": fingerprint(draft), **parameters_entry(draft)}, {},
                      {4: Bucket((5, 4, 16), tuple(Candidate(s, 2.0, 1.0) for s in cycle))}, adaptive=True)
    engine = Engine(small.target, draft=draft, spec=tuned, max_batch=4, max_seq_len=320)
    engine.tuned = CyclingSpec(cycle)
    assert_same_as_baseline(engine.generate(prompts, logprob_params(48)), baseline)
    assert set(engine.last_stats.step_shapes) == set(cycle)
