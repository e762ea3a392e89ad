"""Suffix decoding's trees and proposals (`specdec.models.suffix`): the counts and the chain proposals against a
brute-force count of substrings, arctic's sibling order worked by hand, the global tree's FIFO eviction, the
parameters' checks, and arctic-inference's own suffix cache as the oracle where it is importable."""
import random

import numpy as np
import pytest

from specdec.models.suffix import SuffixCache, SuffixDraft, SuffixTree

F32 = np.float32


def occurrences(seqs, s, depth) -> int:
    """How many times `s` (at most `depth` long) occurs in `seqs`: the count a suffix tree holds for it."""
    n = len(s)
    assert n <= depth
    return sum(1 for seq in seqs for i in range(len(seq) - n + 1) if seq[i:i + n] == s)


def all_counts(tree: SuffixTree) -> dict:
    out, stack = {}, [((), tree.root)]
    while stack:
        path, node = stack.pop()
        for child in node.order:
            out[path + (child.token,)] = child.count
            stack.append((path + (child.token,), child))
    return out


def brute_chain(seqs, context, depth, max_spec_tokens, factor, min_prob):
    """The chain proposal by counting substrings: for each match length m (while the context's last m tokens occur),
    follow the most frequent next token while the path's probability stays at least min_prob, for at most
    min(max_spec_tokens, floor(factor * m)) tokens and as deep as the depth allows; the best score wins, the longer
    match on a tie. -> (tokens, score, match length), or None where two next tokens tie (their order is arctic's
    sibling order, tested by hand below)."""
    context = context[-depth:]
    best = ([], F32(0.0), 0)
    for m in range(1, len(context)):
        s = list(context[len(context) - m:])
        if not occurrences(seqs, s, depth):
            break
        budget = min(max_spec_tokens, int(float(F32(m) * F32(factor)) + 1e-6))
        tokens, prob, score = [], F32(1.0), F32(0.0)
        while len(tokens) < budget and len(s) < depth:
            here = occurrences(seqs, s, depth)
            nxt = {t: occurrences(seqs, s + [t], depth) for t in {x for seq in seqs for x in seq}}
            nxt = {t: c for t, c in nxt.items() if c}
            if not nxt:
                break
            top = max(nxt.values())
            if list(nxt.values()).count(top) > 1:
                return None
            t = max(nxt, key=nxt.get)
            if not (len(nxt) == 1 and top == here):  # along a run of only children arctic multiplies nothing
                prob = F32(prob * F32(F32(top) / F32(here)))
            if prob < F32(min_prob):
                break
            tokens.append(t)
            score = F32(score + prob)
            s.append(t)
        if score >= best[1]:
            best = (tokens, score, m)
    return best


def test_a_tree_counts_every_substring_of_at_most_its_depth():
    rng = random.Random(0)
    for depth in (1, 3, 6):
        seqs = {k: [rng.randrange(3) for _ in range(rng.randrange(1, 25))] for k in range(3)}
        tree = SuffixTree(depth)
        for k, seq in seqs.items():
            for i in range(0, len(seq), 4):  # appended a few tokens at a time, as the worker does
                tree.extend(k, seq[i:i + 4])
        counts = all_counts(tree)
        for path, count in counts.items():
            assert count == occurrences(list(seqs.values()), list(path), depth)
        want = {tuple(seq[i:j]) for seq in seqs.values() for i in range(len(seq))
                for j in range(i + 1, min(len(seq), i + depth) + 1)}
        assert set(counts) == want


def test_chain_proposals_match_a_brute_force_count():
    """Random histories over 3 tokens: each request's own tree (prompt and output) and the global tree of every
    request's output, the proposal the better of the two. Histories whose most frequent continuation ties are
    left to the hand-worked order test (at least 100 compared)."""
    rng = random.Random(1)
    compared = 0
    for trial in range(400):
        depth = rng.choice([4, 8, 24])
        factor, min_prob, max_tokens = rng.choice([1.0, 0.5, 2.0]), rng.choice([0.1, 0.3, 0.0]), rng.randrange(1, 9)
        cache = SuffixCache(depth, 100)
        prompts = {k: [rng.randrange(3) for _ in range(rng.randrange(2, 16))] for k in range(3)}
        outputs = {k: [rng.randrange(3) for _ in range(rng.randrange(1, 10))] for k in range(3)}
        for k in range(3):
            cache.start_request(k, prompts[k])
            cache.add_active_response(k, outputs[k])
        key = rng.randrange(3)
        seq = prompts[key] + outputs[key]
        own = brute_chain([seq], seq, depth, max_tokens, factor, min_prob)
        cached = brute_chain(list(outputs.values()), seq, depth, max_tokens, factor, min_prob)
        if own is None or cached is None:
            continue
        want = own if own[1] >= cached[1] else cached
        got = cache.speculate(key, seq, max_tokens, factor, min_prob)
        assert (got.token_ids, got.score, got.match_len) == want, trial
        assert got.parents == list(range(-1, len(got.token_ids) - 1))  # a chain
        compared += 1
    assert compared >= 100


def test_proposals_grow_with_the_match_and_stop_below_min_token_prob():
    """1 2 3 4 5 seen twice: a match of m tokens proposes at most m (max_spec_factor 1), and never past D - m; the
    context's last m < len(context) tokens are matched (arctic never matches the context whole)."""
    tree = SuffixTree(6)
    tree.extend("a", [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5])
    assert tree.speculate([7, 1], 8, 1.0, 0.1).token_ids == [2]  # m = 1: "1" -> one token
    assert tree.speculate([7, 1, 2], 8, 1.0, 0.1).token_ids == [3, 4]
    assert tree.speculate([0, 1, 2, 3], 8, 1.0, 0.1).token_ids == [4, 5, 9]  # "1 2 3": 3 tokens
    shallow = SuffixTree(4)
    shallow.extend("a", [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5])
    assert shallow.speculate([0, 1, 2, 3], 8, 9.0, 0.1).token_ids == [4, 5, 9]  # "3": D - 1 = 3 tokens at most
    # after "4 5": 9 once and the sequence's end once, 1/2 < 0.6: a higher threshold proposes nothing after it
    assert tree.speculate([3, 4, 5], 8, 2.0, 0.6).token_ids == []
    assert tree.speculate([3, 4, 5], 8, 2.0, 0.5).token_ids == [9, 1, 2, 3]  # m = 2: 4 tokens at most


def test_equal_counts_are_ordered_as_arctics_sibling_lists():
    """arctic moves a child whose count grew in front of the siblings of its new count when it headed its old
    group, behind them when it came from inside it. Children of 0 with counts x=2, y=1, z=1 (listed x, y, z): y
    grows first -> y, x (y to the front); z grows instead -> x, z (z behind x). The chain takes the first."""
    def tree_after(extra):
        tree = SuffixTree(3)
        tree.extend("s", [0, 5, 0, 5, 0, 6, 0, 7] + extra)  # after 0: 5 twice, then 6 and 7 once each
        return tree

    assert [c.token for c in tree_after([]).root.children[0].order] == [5, 6, 7]
    assert [c.token for c in tree_after([0, 6]).root.children[0].order] == [6, 5, 7]
    assert [c.token for c in tree_after([0, 7]).root.children[0].order] == [5, 7, 6]
    assert tree_after([0, 6]).speculate([9, 0], 1, 1.0, 0.0).token_ids == [6]
    assert tree_after([0, 7]).speculate([9, 0], 1, 1.0, 0.0).token_ids == [5]


def test_tree_proposals_take_the_likeliest_nodes_first():
    tree = SuffixTree(8)
    tree.extend("s", [1, 2, 3, 7, 1, 2, 3, 8, 1, 2, 3, 9, 1, 2, 4, 1, 5, 6, 1, 5, 6])
    draft = tree.speculate([0, 1], 4, 4.0, 0.3, tree=True)
    # after "1": 2 (4 of 6), 5 (2 of 6); after "1 2": 3 (3 of 4: 1/2), 4 (1/6 < 0.3); after "1 2 3" each of 7, 8,
    # 9 has 1/6; "1 5" always goes on to 6
    assert draft.token_ids == [2, 3, 5, 6] and draft.parents == [-1, 0, -1, 2]
    assert draft.probs == pytest.approx([2 / 3, 1 / 2, 1 / 3, 1 / 3])


def test_the_global_tree_keeps_the_last_max_cached_requests_outputs():
    """max_cached_requests = 2: starting a third request evicts the first's output (FIFO), and the tree's counts are
    then those of a tree that never held it; a request's own tree goes when it stops."""
    cache = SuffixCache(8, 2)
    outputs = {0: [1, 2, 3, 4], 1: [5, 6, 7, 8], 2: [1, 2, 9, 9]}
    for key in (0, 1):
        cache.start_request(key, [0])
        cache.add_active_response(key, outputs[key])
    assert cache.speculate(0, [3, 1, 2], 4, 1.0, 0.1).token_ids == [3, 4]
    cache.stop_request(0)
    cache.start_request(2, [0])
    cache.add_active_response(2, outputs[2])
    assert list(cache.cached) == [1, 2] and 0 not in cache.local_trees
    assert cache.speculate(2, [3, 1, 2], 4, 1.0, 0.1).token_ids == [9, 9]  # request 0's 3 4 is gone
    assert cache.speculate(2, [0, 5, 6], 4, 1.0, 0.1).token_ids == [7, 8]
    fresh = SuffixTree(8)
    for key in (1, 2):
        fresh.extend(key, outputs[key])
    assert all_counts(cache.global_tree) == all_counts(fresh)
    none = SuffixCache(8, 0)  # no global tree: a request's own tree only
    none.start_request("a", [1, 2, 3])
    none.add_active_response("a", [1, 2])
    assert not none.cached and len(none.global_tree) == 0
    assert none.speculate("a", [1, 2, 3, 1, 2], 4, 1.0, 0.1).token_ids == [3, 1]


@pytest.mark.parametrize("field, value, message", [
    ("max_tree_depth", 0, "max_tree_depth"), ("max_tree_depth", 2.5, "max_tree_depth"),
    ("max_cached_requests", -1, "max_cached_requests"), ("max_cached_requests", 2**31, "max_cached_requests"),
    ("max_spec_factor", -0.5, "max_spec_factor"), ("max_spec_factor", float("nan"), "max_spec_factor"),
    ("min_token_prob", 1.5, "min_token_prob"), ("min_token_prob", -0.1, "min_token_prob")])
def test_a_parameter_out_of_range_is_a_one_line_value_error(field, value, message):
    with pytest.raises(ValueError, match=message) as info:
        SuffixDraft(**{field: value})
    assert "\n" not in str(info.value)


def test_vllms_defaults():
    assert SuffixDraft() == SuffixDraft(max_tree_depth=24, max_cached_requests=10_000, max_spec_factor=1.0,
                                        min_token_prob=0.1)


# ---- arctic-inference's suffix cache as the oracle ----------------------------------------------------------------

try:
    from arctic_inference.suffix_decoding import SuffixDecodingCache
except ImportError:  # the package builds its CUDA ops with a pinned torch: scripts/build_arctic_suffix.sh builds
    SuffixDecodingCache = None  # the suffix tree alone


@pytest.mark.skipif(SuffixDecodingCache is None, reason="arctic_inference.suffix_decoding is not importable: "
                    "arctic-inference needs torch==2.10 and CUDA to build; scripts/build_arctic_suffix.sh builds its "
                    "suffix-tree extension alone")
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_the_same_proposals_as_arctic_inference(tree):
    """Random histories, several running requests, outputs arriving a few tokens a step, requests stopping and the
    global tree evicting: every proposal (tokens, parents, score, match length) is arctic's."""
    compared = 0
    for seed in range(60):
        rng = random.Random(seed)
        V, D, cached = rng.choice([(2, 24, 5), (3, 6, 2), (4, 10, 0), (8, 8, 10_000)])
        theirs, ours = SuffixDecodingCache(max_tree_depth=D, max_cached_requests=cached), SuffixCache(D, cached)
        running = []
        for key in range(6):
            prompt = [rng.randrange(V) for _ in range(rng.randrange(1, 30))]
            theirs.start_request(key, prompt)
            ours.start_request(key, prompt)
            running.append((key, list(prompt)))
            for _ in range(rng.randrange(1, 6)):
                for k, seq in running:
                    new = [rng.randrange(V) for _ in range(rng.randrange(1, 4))]
                    seq += new
                    theirs.add_active_response(k, new)
                    ours.add_active_response(k, new)
                    args = rng.randrange(1, 10), rng.choice([1.0, 0.5, 2.0]), rng.choice([0.0, 0.1, 0.3])
                    want = theirs.speculate(k, seq[-D:], max_spec_tokens=args[0], max_spec_factor=args[1],
                                            min_token_prob=args[2], use_tree_spec=tree)
                    got = ours.speculate(k, seq, *args, tree=tree)
                    assert (got.token_ids, got.parents, float(got.score), got.match_len) == (
                        list(want.token_ids), list(want.parents), want.score, want.match_len)
                    compared += 1
            if rng.random() < 0.5:
                k, _ = running.pop(rng.randrange(len(running)))
                theirs.stop_request(k)
                ours.stop_request(k)
    assert compared > 500
