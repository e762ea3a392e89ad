"""NGRAM drafting: the n-gram index and its trees against brute force, and the worker lossless against target-only
decoding (greedy tokens and logprobs, the exact distribution when sampling, penalties, grammars, ragged batches)."""
import random
from collections import Counter

import pytest
import torch

from specdec import Engine, SamplingParams, SpecConfig
from specdec.ngram import NgramDraft, NgramIndex, anchored_tree, continuation_tree, verify_input
from specdec.zoo import corpus
from tests.helpers import (FALSE_FAILURE_RATE, assert_same_as_baseline, chi_square_pvalue, logprob_params,
                           near_bigram_target)
from tests.oracles import exact_joint


def brute_continuations(seq, min_n, max_n, length):
    """The continuations after every earlier occurrence of the longest suffix of seq (min_n..max_n) that occurred
    before, most recent first."""
    for n in range(min(max_n, len(seq)), min_n - 1, -1):
        found = [seq[end:end + length] for end in range(len(seq) - 1, n - 1, -1)
                 if seq[end - n:end] == seq[-n:] and seq[end:end + length]]
        if found:
            return found
    return []


def brute_anchors(seq, min_n, max_n, length):
    """Per suffix length n (max_n down to min_n) that occurred before: the continuations after each earlier
    occurrence of the last n tokens, most recent first."""
    out = []
    for n in range(min(max_n, len(seq)), min_n - 1, -1):
        found = [seq[end:end + length] for end in range(len(seq) - 1, n - 1, -1)
                 if seq[end - n:end] == seq[-n:] and seq[end:end + length]]
        if found:
            out.append(found[:64])
    return out


def test_a_later_anchor_fills_what_the_longest_match_left():
    """Worked by hand. Anchor 1 (the longest match) is one path 1-2-3; anchor 2 has 1-2-4 and 5: its 1 and 2 are
    already in the tree, so it adds 5 under the root, then 4 under 2 (breadth first)."""
    anchors = [[[1, 2, 3]], [[1, 2, 4], [5]]]
    assert anchored_tree(anchors, 10, 5) == [(1, 0), (2, 1), (3, 2), (5, 0), (4, 2)]
    assert anchored_tree(anchors, 4, 5) == [(1, 0), (2, 1), (3, 2), (5, 0)]
    assert anchored_tree(anchors, 3, 5) == continuation_tree(anchors[0], 3, 5)  # full: anchor 2 adds nothing
    # best first: anchor 2's paths all weigh .5, taken in the order offered (1, 5, 1-2, 1-2-4); 1 and 2 are there
    assert anchored_tree(anchors, 10, 5, "PROB") == [(1, 0), (2, 1), (3, 2), (5, 0), (4, 2)]
    assert anchored_tree([[], [[7]]], 10, 5) == [(7, 0)] and anchored_tree([], 10, 5) == []


@pytest.mark.parametrize("seed", range(6))
def test_the_index_finds_what_brute_force_finds(seed):
    """The longest match's continuations, and every anchor's (deepest first), from an index grown in two parts."""
    rng = random.Random(seed)
    seq = [rng.randrange(4) for _ in range(rng.randint(1, 80))]
    min_n, max_n = rng.randint(1, 3), rng.randint(3, 6)
    index = NgramIndex(min_n, max_n)
    split = rng.randint(1, 8)
    sid = index.add(seq[:split])
    index.extend(sid, seq[split:])
    for length in (1, 3, 4):
        assert index.continuations(seq[-max_n:], sid, length) == brute_continuations(seq, min_n, max_n, length)[:64]
        assert list(index.anchored_continuations(seq[-max_n:], sid, length)) == brute_anchors(seq, min_n, max_n,
                                                                                              length)


def test_the_tree_is_breadth_first_by_frequency_and_bounded():
    conts = [[1, 2, 3], [1, 2, 4], [1, 5], [6], [1, 2, 3]]
    # root children: 1 (x4), 6 (x1); then 2 (x3) and 5 under 1; then 3 (x2), 4 under 2
    assert continuation_tree(conts, 10, 5) == [(1, 0), (6, 0), (2, 1), (5, 1), (3, 3), (4, 3)]
    assert continuation_tree(conts, 3, 5) == [(1, 0), (6, 0), (2, 1)]
    assert continuation_tree(conts, 10, 1) == [(1, 0), (2, 1), (3, 2)]
    assert continuation_tree([], 10, 3) == []


def test_the_prob_tree_is_best_first_by_path_probability():
    """SGLang's PROB match type, against probabilities worked out by hand: root children 1 (4 of 5) and 6 (1 of 5);
    under 1: 2 (3 of 4) and 5 (1 of 4); under 1, 2: 3 (2 of 3) and 4 (1 of 3). Path probabilities 1 .8, 1-2 .6,
    1-2-3 .4, 6 .2, 1-2-4 .2, 1-5 .2; equal ones in the order they were reached."""
    conts = [[1, 2, 3], [1, 2, 4], [1, 5], [6], [1, 2, 3]]
    assert continuation_tree(conts, 10, 5, "PROB") == [(1, 0), (2, 1), (3, 2), (6, 0), (5, 1), (4, 2)]
    assert continuation_tree(conts, 3, 5, "PROB") == [(1, 0), (2, 1), (3, 2)]  # deep where the earlier ones agree
    assert continuation_tree(conts, 3, 5) == [(1, 0), (6, 0), (2, 1)]  # BFS: wide
    # breadth 1 renormalises over the one counted child: every path has probability 1, a chain
    assert continuation_tree(conts, 10, 1, "PROB") == [(1, 0), (2, 1), (3, 2)]
    assert continuation_tree([], 10, 3, "PROB") == []


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


def test_shared_index_forgets_idle_sequences_first():
    index = NgramIndex(1, 2, capacity=10)
    a = index.add([1, 2, 3, 4, 5, 6])
    index.active.add(a)
    b = index.add([7, 8, 9])
    assert b in index.seqs
    c = index.add([1, 2, 9, 9])  # 13 tokens > 10: b, the oldest idle one, goes; a is in flight
    assert set(index.seqs) == {a, c} and b not in index.seqs
    assert (7, 8) not in index.ends and index.continuations([1, 2], c, 2) == [[9, 9], [3, 4]]


# ---- the worker ------------------------------------------------------------------------------------------------

SPECS = [SpecConfig(4, 1), SpecConfig(5, 4, 16), SpecConfig(8, 2, 12)]


@pytest.fixture(scope="module")
def prompts():
    return [[int(t) for t in w[:n]] for w, n in zip(corpus.heldout_windows(4, 160, seed=5), (160, 97, 130, 64))]


@pytest.fixture(scope="module")
def baseline(small, prompts):
    return Engine(small.target, max_seq_len=320).generate(prompts, logprob_params(48))


@pytest.mark.parametrize("spec, shared", [(SPECS[0], True), (SPECS[1], False),
                                          pytest.param(SPECS[2], False, marks=pytest.mark.slow),
                                          pytest.param(SPECS[0], False, marks=pytest.mark.slow),
                                          pytest.param(SPECS[1], True, marks=pytest.mark.slow)], ids=str)
def test_ngram_is_greedy_identical_to_target_only(small, prompts, baseline, spec, shared):
    engine = Engine(small.target, draft=NgramDraft(shared=shared), spec=spec, max_seq_len=320)
    outs = engine.generate(prompts, logprob_params(48))
    assert_same_as_baseline(outs, baseline)
    assert engine.last_stats.mean_accept_len > 1.3  # code repeats itself: the index proposes what follows
    if shared:  # the shared index keeps what it saw: a second run accepts at least as much
        first = engine.last_stats.mean_accept_len
        assert_same_as_baseline(engine.generate(prompts, logprob_params(48)), baseline)
        assert engine.last_stats.mean_accept_len >= first


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
    """No proposal: each decode step's target forward reads the root alone, as a target-only step does."""
    widths = []
    hook = small.target.register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[1]))
    try:
        engine = Engine(small.target, draft=NgramDraft(min_match_window_size=4), spec=SpecConfig(5, 4, 16),
                        max_seq_len=64)
        out = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))[0]
    finally:
        hook.remove()
    assert out.accept_lens == [1, 1, 1] and len(out.token_ids) == 4
    assert widths == [3, 1, 1, 1]  # the prefill, then three one-token steps


def test_a_short_proposal_is_verified_in_the_narrowest_width_that_holds_it(small, prompts):
    """The verify width of a step is the smallest of 1, 2, 4, ..., W holding the batch's largest tree, and the
    output stays target-only's."""
    from specdec.workers.graphs import DecodeGraphs
    engine = Engine(small.target, draft=NgramDraft(max_bfs_breadth=2, branch_length=3), spec=SpecConfig(3, 2, 11),
                    max_batch=2, max_seq_len=320)
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
    engine = Engine(target, draft=NgramDraft(), spec=SpecConfig(4, 1), max_seq_len=128)
    w = engine.worker
    commits, steps = [], []
    commit = w.cache.commit
    w.cache.commit = lambda *a: (commits.append(1), commit(*a))
    decode = engine._decode

    def recorded():
        commits.clear()
        out = decode()
        nxt, sib = w.state.ngram_next_token, w.state.ngram_next_sibling
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


@pytest.mark.parametrize("spec", [SpecConfig(3, 1), SpecConfig(3, 2, 6)], ids=str)
def test_ngram_sampling_is_the_exact_distribution(spec):
    """A repetitive prompt, so that the index proposes: the joint law of three sampled tokens against enumeration."""
    V, N = 6, 3000
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3)
    prompt = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2]
    exact = exact_joint(target, prompt, 3, 0.8, -1, 1.0)
    engine = Engine(target, draft=NgramDraft(), spec=spec, max_batch=N, max_seq_len=24)
    outs = engine.generate([prompt] * N, SamplingParams(max_new_tokens=3, temperature=0.8), seed=3)
    assert any(a > 1 for o in outs for a in o.accept_lens)  # drafts were accepted: verify decided the law
    assert chi_square_pvalue(Counter(tuple(o.token_ids) for o in outs), exact) > FALSE_FAILURE_RATE


def test_ngram_through_the_graph_buffers(small, prompts, baseline):
    from specdec.workers.graphs import DecodeGraphs
    engine = Engine(small.target, draft=NgramDraft(), spec=SpecConfig(5, 4, 16), max_batch=4, max_seq_len=320)
    engine._decode = DecodeGraphs(engine.worker, capture=False).decode_step
    outs = engine.generate(prompts[:3], logprob_params(48))  # bucket 4, padded; requests finish at different steps
    assert_same_as_baseline(outs, baseline[:3])


@pytest.mark.parametrize("kw, match", [
    (dict(min_match_window_size=0), r"min_match_window_size must be an int in \[1, inf\)|min_match_window_size"),
    (dict(min_match_window_size=3, max_match_window_size=2), "max_match_window_size"),
    (dict(max_bfs_breadth=0), "max_bfs_breadth"),
    (dict(branch_length=0), "branch_length"),
    (dict(shared=1), "shared must be True or False"),
    (dict(match_type="prob"), r"match_type must be one of \('BFS', 'PROB'\), got 'prob'"),
])
def test_bad_ngram_drafts_are_value_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        NgramDraft(**kw)


def test_a_tree_the_ngram_draft_cannot_fill_is_a_value_error_and_the_engine_serves_on(small):
    with pytest.raises(ValueError, match="num_draft_tokens=16 cannot be filled by an n-gram tree of depth"):
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
