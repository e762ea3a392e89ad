"""Tests of the reference tree ops (reference/tree.py, reference/verify.py).

The ladder: each vectorised op equals its per-node naive loop, on random trees drafted through
``select_top_k_tokens`` + ``organize_draft_results`` and on exhaustive small cases. Beside it,
independent checks that do not use the code under test: the test drafts its own trees and tracks
every candidate's token path and fp32 path score itself, and derives the expected selection, parents,
mask, positions, child/sibling links and the greedy accepted path from those paths; the sampling
verify is checked against the exact distribution of sequential target sampling by a chi-square test.
The drafting simulator, the fixed tree and its exact law live in tests/helpers/oracles/ (the fast tests use them too).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given

from reference.naive import build_tree_naive, tree_speculative_sampling_target_only_naive, verify_tree_greedy_naive
from reference.tree import (build_tree_kernel_efficient, max_num_draft_tokens, organize_draft_results,
                            select_top_k_tokens)
from reference.verify import tree_speculative_sampling_target_only, verify_tree_greedy
from tests.helpers import PROPERTY_CI, PROPERTY_SLOW, assert_same_tensors, chi_square_pvalue
from tests.helpers.oracles import (FAST_GRID, FIXED_TARGET, FULL_GRID, DraftedTree, drafted_case, emitted_sequences,
                           exact_fixed_tree_distribution, fixed_tree, sampling_inputs, target_predict_for,
                           tree_shapes, tree_structure)


# --------------------------------------------------------------------------------------------
# the ladder on the case grid
# --------------------------------------------------------------------------------------------


def _run_case(S: int, K: int, W: int, seed: int, mode: str):
    tree, rng = drafted_case(S, K, W, seed, mode)
    B, gen = tree.B, tree.gen

    # organize_draft_results against the test's own selection
    assert tree.top_scores_index.dtype == torch.int64 and tree.draft_tokens.dtype == torch.int64
    assert tree.parent_list.dtype == torch.int64
    assert tree.parent_list.shape == (B, 1 + K * (S - 1) if S > 1 else 0)
    paths_per_b = []
    for b in range(B):
        sel = tree.expected_selection(b)
        assert tree.top_scores_index[b].tolist() == sel
        assert tree.draft_tokens[b].tolist() == [tree.cand_path[b][c][-1] for c in sel]
        paths = tree.node_paths(b)
        assert all(p[:-1] in paths for p in paths[1:])  # a selected node's parent is selected
        paths_per_b.append(paths)

    # build: naive == vectorised == the test's own structure
    out = build_tree_kernel_efficient(*tree.build_args())
    assert_same_tensors(out, build_tree_naive(*tree.build_args()))
    mask, positions, ri, nt, ns, tokens = out
    assert mask.dtype == torch.bool and mask.shape == (B, W, W)
    for t in (positions, ri, nt, ns, tokens):
        assert t.dtype == torch.int64
    for b in range(B):
        paths = paths_per_b[b]
        _parent, depth, first, sibling = tree_structure(paths)
        exp_mask = [[paths[i][: len(paths[j])] == paths[j] for j in range(W)] for i in range(W)]
        assert mask[b].tolist() == exp_mask
        assert positions[b * W : (b + 1) * W].tolist() == [int(tree.seq_lens[b]) + d for d in depth]
        assert ri[b].tolist() == list(range(b * W, (b + 1) * W))
        assert nt[b].tolist() == first
        assert ns[b].tolist() == sibling
        assert tokens[b * W : (b + 1) * W].tolist() == [int(tree.bonus[b])] + [p[-1] for p in paths[1:]]
    cand = tokens.view(B, W)

    # greedy verify: naive == vectorised == brute force longest matching path
    steps_values = sorted({S, max(1, S - 1)})  # also a num_steps below the tree depth
    for p_follow, steps in itertools.product((0.0, 0.6, 1.0), steps_values):
        tp = target_predict_for(tree, paths_per_b, p_follow, gen)
        got = verify_tree_greedy(cand, ri, nt, ns, tp, steps)
        assert_same_tensors(got, verify_tree_greedy_naive(cand, ri, nt, ns, tp, steps))
        check_greedy_brute_force(got, cand, tp, paths_per_b, steps)

    # sampling verify: naive == vectorised (exact), also with thresholds below 1
    for (ts, ta), steps in itertools.product(((1.0, 1.0), (0.5, 0.7)), steps_values):
        probs, u, uf = sampling_inputs(tree, paths_per_b, gen, rng)
        got = tree_speculative_sampling_target_only(cand, ri, nt, ns, u, uf, probs, steps, ts, ta)
        assert_same_tensors(
            got, tree_speculative_sampling_target_only_naive(cand, ri, nt, ns, u, uf, probs, steps, ts, ta)
        )
        check_sampling_output(got, cand, probs, paths_per_b, steps)


def check_greedy_brute_force(got, cand, tp, paths_per_b, S):
    predict, accept_index, accept_length = got
    B, W = cand.shape
    assert predict.dtype == accept_index.dtype == accept_length.dtype == torch.int32
    for b in range(B):
        paths = paths_per_b[b]
        parent, depth, _, _ = tree_structure(paths)

        def matches(n, b=b, parent=parent):  # every edge on the root path of n is predicted
            while n != 0:
                if int(cand[b, n]) != int(tp[b, parent[n]]):
                    return False
                n = parent[n]
            return True

        ok = [n for n in range(W) if depth[n] <= S and matches(n)]
        best = max(ok, key=lambda n: depth[n])  # unique: sibling tokens are distinct
        chain = []
        n = best
        while n != 0:
            chain.append(n)
            n = parent[n]
        chain = [0] + chain[::-1]
        assert int(accept_length[b]) == len(chain) - 1
        assert accept_index[b].tolist() == [b * W + n for n in chain] + [-1] * (S + 1 - len(chain))
        exp_pred = [-1] * W
        for n in chain:
            exp_pred[n] = int(tp[b, n])
        assert predict[b * W : (b + 1) * W].tolist() == exp_pred


def check_sampling_output(got, cand, probs, paths_per_b, S):
    """Structural facts of a sampling verify result: the accepted nodes form a root path, predict
    holds the next accepted token then the bonus, and no zero-probability token is ever emitted."""
    predict, accept_index, accept_length = got
    B, W = cand.shape
    assert predict.dtype == accept_index.dtype == accept_length.dtype == torch.int32
    for b in range(B):
        parent, _, _, _ = tree_structure(paths_per_b[b])
        a = int(accept_length[b])
        assert 0 <= a <= S
        nodes = [int(x) - b * W for x in accept_index[b, : a + 1]]
        assert nodes[0] == 0 and accept_index[b, a + 1 :].tolist() == [-1] * (S - a)
        for x, y in itertools.pairwise(nodes):
            assert parent[y] == x
            assert int(predict[b * W + x]) == int(cand[b, y])
        bonus = int(predict[b * W + nodes[-1]])
        assert 0 <= bonus < probs.shape[-1]
        assert float(probs[b, nodes[-1], bonus]) > 0
        others = set(range(W)) - set(nodes)
        assert all(int(predict[b * W + n]) == -1 for n in others)


@pytest.mark.parametrize("mode", ["random", "ties"])
@pytest.mark.parametrize("S,K,W", FAST_GRID)
def test_ladder_random_trees(S, K, W, mode):
    _run_case(S, K, W, seed=1000 * S + 100 * K + W + (7 if mode == "ties" else 0), mode=mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["random", "ties"])
@pytest.mark.parametrize("S,K,W", FULL_GRID)
def test_ladder_random_trees_full_grid(S, K, W, mode):
    for rep in range(3):
        _run_case(S, K, W, seed=7919 * rep + 1000 * S + 100 * K + W, mode=mode)


def _tree_ops_property(case):
    """select / organize / build / both verifies: the per-node loops, the vectorised reference and the
    test's own brute-force expectations agree (`_run_case`)."""
    _run_case(*case)


@given(tree_shapes())
@PROPERTY_CI
def test_tree_ops_agree_on_random_trees(case):
    _tree_ops_property(case)


@pytest.mark.slow
@given(tree_shapes())
@PROPERTY_SLOW
def test_tree_ops_agree_on_random_trees_many(case):
    _tree_ops_property(case)


# --------------------------------------------------------------------------------------------
# exhaustive small cases
# --------------------------------------------------------------------------------------------


def _chain_tree(B, S, V, seed):
    return DraftedTree(B, 1, S, S + 1, V, seed)


def test_depth_one_tree():
    """S == 1: a star under the root; parent_list is empty."""
    for K in (1, 2, 4):
        for W in range(2, K + 2):
            tree = DraftedTree(3, K, 1, W, 8, seed=K * 10 + W)
            assert tree.parent_list.shape == (3, 0) and tree.parent_list.dtype == torch.int64
            mask, positions, ri, nt, ns, tokens = build_tree_kernel_efficient(*tree.build_args())
            assert_same_tensors((mask, positions, ri, nt, ns, tokens), build_tree_naive(*tree.build_args()))
            eye = torch.eye(W, dtype=torch.bool)
            exp_mask = eye.clone()
            exp_mask[:, 0] = True
            assert torch.equal(mask, exp_mask.expand(3, W, W))
            assert torch.equal(positions.view(3, W), tree.seq_lens.unsqueeze(1) + (torch.arange(W) > 0))
            assert nt[:, 0].tolist() == [1] * 3 and (nt[:, 1:] == -1).all()
            assert ns[:, 0].tolist() == [-1] * 3
            assert ns[:, 1:].tolist() == [list(range(2, W)) + [-1]] * 3


def test_single_chain_all_accepted_and_all_rejected():
    """K == 1: a chain. A target that predicts the chain accepts everything (S tokens + bonus);
    one that never predicts it accepts nothing. Both verifies, naive and vectorised."""
    S, V, B = 4, 16, 3
    tree = _chain_tree(B, S, V, seed=5)
    out = build_tree_kernel_efficient(*tree.build_args())
    assert_same_tensors(out, build_tree_naive(*tree.build_args()))
    mask, positions, ri, nt, ns, tokens = out
    W = S + 1
    assert torch.equal(mask, torch.ones(W, W, dtype=torch.bool).tril().expand(B, W, W))
    assert torch.equal(positions.view(B, W), tree.seq_lens.unsqueeze(1) + torch.arange(W))
    assert torch.equal(nt, torch.tensor([1, 2, 3, 4, -1]).expand(B, W))
    assert (ns == -1).all()
    cand = tokens.view(B, W)

    # all accepted: target predicts the next chain token, and a bonus at the leaf
    tp = torch.cat([cand[:, 1:], torch.full((B, 1), 7)], dim=1)
    for fn in (verify_tree_greedy, verify_tree_greedy_naive):
        predict, acc_idx, acc_len = fn(cand, ri, nt, ns, tp, S)
        assert acc_len.tolist() == [S] * B
        assert torch.equal(acc_idx, ri.to(torch.int32))
        assert torch.equal(predict, tp.flatten().to(torch.int32))
    # num_steps smaller than the chain: stop after num_steps accepted tokens
    for fn in (verify_tree_greedy, verify_tree_greedy_naive):
        predict, acc_idx, acc_len = fn(cand, ri, nt, ns, tp, 2)
        assert acc_len.tolist() == [2] * B
        assert torch.equal(acc_idx, ri[:, :3].to(torch.int32))
        assert torch.equal(predict.view(B, W)[:, :3], tp[:, :3].to(torch.int32))
        assert (predict.view(B, W)[:, 3:] == -1).all()

    # all rejected: target never predicts the draft
    tp_bad = (cand + 1) % V
    tp_bad = torch.cat([tp_bad[:, 1:], tp_bad[:, :1]], dim=1)
    for fn in (verify_tree_greedy, verify_tree_greedy_naive):
        predict, acc_idx, acc_len = fn(cand, ri, nt, ns, tp_bad, S)
        assert acc_len.tolist() == [0] * B
        assert torch.equal(acc_idx[:, 0], ri[:, 0].to(torch.int32)) and (acc_idx[:, 1:] == -1).all()
        exp = torch.full((B, W), -1, dtype=torch.int32)
        exp[:, 0] = tp_bad[:, 0]
        assert torch.equal(predict.view(B, W), exp)

    # sampling: one-hot on the chain accepts everything whatever the coins; zero mass on it rejects all
    u = torch.rand(B, W)
    uf = torch.rand(B)
    hot = torch.nn.functional.one_hot(tp, V).float()
    for fn in (tree_speculative_sampling_target_only, tree_speculative_sampling_target_only_naive):
        predict, acc_idx, acc_len = fn(cand, ri, nt, ns, u, uf, hot, S)
        assert acc_len.tolist() == [S] * B
        assert torch.equal(predict, tp.flatten().to(torch.int32))
    probs = torch.rand(B, W, V)
    probs.scatter_(2, tp.unsqueeze(-1), 0.0)  # zero mass on every draft token
    u0 = torch.zeros(B, W)  # even coins of exactly 0 must reject (strict <)
    for fn in (tree_speculative_sampling_target_only, tree_speculative_sampling_target_only_naive):
        predict, acc_idx, acc_len = fn(cand, ri, nt, ns, u0, uf, probs, S)
        assert acc_len.tolist() == [0] * B
        assert (acc_idx[:, 1:] == -1).all()
        bonus = predict.view(B, W)[:, 0]
        assert all(float(probs[b, 0, int(bonus[b])]) > 0 for b in range(B))
        assert (predict.view(B, W)[:, 1:] == -1).all()


def test_full_fanout_all_accept_paths():
    """W at its maximum: for every node of the tree, a target that predicts exactly the path to it
    accepts exactly that path (greedy; and sampling with one-hot targets)."""
    for K, S in ((2, 3), (4, 2), (3, 2)):
        W = max_num_draft_tokens(K, S)
        tree = DraftedTree(1, K, S, W, 12, seed=K * S)
        out = build_tree_kernel_efficient(*tree.build_args())
        assert_same_tensors(out, build_tree_naive(*tree.build_args()))
        _mask, _positions, ri, nt, ns, tokens = out
        paths = tree.node_paths(0)
        parent, _depth, _, _ = tree_structure(paths)
        # all candidates kept: the root and the K frontier nodes of each of the S-1 later steps have
        # K children each, every other node is a leaf
        n_children = [sum(parent[j] == i for j in range(W)) for i in range(W)]
        assert sorted(n_children, reverse=True) == [K] * (1 + K * (S - 1)) + [0] * (W - 1 - K * (S - 1))
        cand = tokens.view(1, W)
        for target in range(W):
            chain = []
            n = target
            while n != 0:
                chain.append(n)
                n = parent[n]
            chain = [0] + chain[::-1]
            tp = (cand.max() + 1).expand(1, W).clone()  # a token that no node holds
            for x, y in itertools.pairwise(chain):
                tp[0, x] = cand[0, y]
            exp_idx = chain + [-1] * (S + 1 - len(chain))
            for fn in (verify_tree_greedy, verify_tree_greedy_naive):
                predict, acc_idx, acc_len = fn(cand, ri, nt, ns, tp, S)
                assert acc_len.tolist() == [len(chain) - 1]
                assert acc_idx[0].tolist() == exp_idx
            V = int(tp.max()) + 1
            hot = torch.nn.functional.one_hot(tp, V).float()
            for fn in (tree_speculative_sampling_target_only, tree_speculative_sampling_target_only_naive):
                predict_s, acc_idx_s, _acc_len_s = fn(
                    cand, ri, nt, ns, torch.rand(1, W), torch.rand(1), hot, S
                )
                assert acc_idx_s[0].tolist() == exp_idx
                assert torch.equal(predict_s, predict)


# --------------------------------------------------------------------------------------------
# ties
# --------------------------------------------------------------------------------------------


def test_ties_all_probabilities_one():
    """Every draft probability 1.0 (K=1): all scores tie at 1.0; the lower index (the shallower
    node) must win, giving the chain prefix, never a node without its parent."""
    S, B = 4, 2
    for W in range(2, S + 2):
        score_list, token_list, parents_list = [], [], []
        hidden = torch.zeros(B, 2)
        topk_p = torch.ones(B, 1)
        topk_index = torch.full((B, 1), 3)
        _, hidden, scores, info = select_top_k_tokens(0, topk_p, topk_index, hidden, None, 1)
        for x, lst in zip(info, (score_list, token_list, parents_list)):
            lst.append(x)
        for i in range(1, S):
            _, hidden, scores, info = select_top_k_tokens(
                i, torch.ones(B, 1), torch.full((B, 1), 3 + i), hidden, scores, 1
            )
            for x, lst in zip(info, (score_list, token_list, parents_list)):
                lst.append(x)
        parent_list, tsi, dt = organize_draft_results(score_list, token_list, parents_list, W)
        assert tsi.tolist() == [list(range(W - 1))] * B
        assert dt.tolist() == [list(range(3, 3 + W - 1))] * B
        args = (torch.zeros(B, dtype=torch.long), parent_list, tsi, dt, torch.tensor([0, 9]), 1, S, W)
        out = build_tree_kernel_efficient(*args)
        assert_same_tensors(out, build_tree_naive(*args))
        assert torch.equal(out[0], torch.ones(W, W, dtype=torch.bool).tril().expand(B, W, W))


def test_ties_one_hot_and_zero_probabilities():
    """One-hot draft rows (children of probability exactly 1.0 and 0.0) and uniform rows, at every
    tree size: the selection is the test's (score desc, index asc) order and always a valid tree."""
    for K, S in ((2, 3), (4, 3), (2, 5), (1, 5)):
        for W in range(2, max_num_draft_tokens(K, S) + 1, max(1, max_num_draft_tokens(K, S) // 5)):
            for seed in range(2):
                _run_case(S, K, W, seed=seed * 31 + W, mode="ties")


def test_ties_child_equal_to_parent_score_at_the_cut():
    """Hand-made: the root's best child has score 0.5 and its child p=1.0 also scores 0.5; the other
    root child scores 0.5 too. With W-1 = 2, candidates 0 and 1 (index order) are kept, not the
    grandchild (index > 1) whose parent would then be missing."""
    K = 2
    topk_p0 = torch.tensor([[0.5, 0.5]])
    _, h, scores, info0 = select_top_k_tokens(0, topk_p0, torch.tensor([[1, 2]]), torch.zeros(1, 1), None, K)
    _, h, scores, info1 = select_top_k_tokens(
        1, torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([[3, 4], [5, 6]]), h, scores, K
    )
    lists = [[info0[j], info1[j]] for j in range(3)]
    for W, exp in ((2, [0]), (3, [0, 1]), (4, [0, 1, 2]), (5, [0, 1, 2, 4])):
        parent_list, tsi, dt = organize_draft_results(*lists, W)
        assert tsi[0].tolist() == exp
        out = build_tree_kernel_efficient(torch.tensor([0]), parent_list, tsi, dt, torch.tensor([3]), K, 2, W)
        assert_same_tensors(
            out, build_tree_naive(torch.tensor([0]), parent_list, tsi, dt, torch.tensor([3]), K, 2, W)
        )


def test_invalid_tree_detached_node():
    """Malformed input (a node whose parent candidate is not selected, as SGLang can produce):
    the node is unreachable by verify, its mask row is {root, itself}; naive == vectorised."""
    K, S, W = 2, 2, 4
    parent_list = torch.tensor([[-1, 0, 1]])
    # candidates: 0 (root child), 2 (child of cand 0), 4 (child of cand 1, NOT selected)
    tsi = torch.tensor([[0, 2, 4]])
    dt = torch.tensor([[5, 6, 7]])
    args = (torch.tensor([9]), parent_list, tsi, dt, torch.tensor([10]), K, S, W)
    out = build_tree_kernel_efficient(*args)
    assert_same_tensors(out, build_tree_naive(*args))
    mask, positions, _ri, nt, ns, tokens = out
    assert mask[0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]]
    assert positions.tolist() == [10, 11, 12, 11]
    assert nt[0].tolist() == [1, 2, -1, -1]
    assert ns[0].tolist() == [-1, -1, -1, -1]
    assert tokens.tolist() == [9, 5, 6, 7]


# --------------------------------------------------------------------------------------------
# sampling: exact distribution
# --------------------------------------------------------------------------------------------

# Chi-square threshold: under the null (the sampler is exact) a p-value below 1e-6 happens with
# probability 1e-6 per comparison (up to the chi-square approximation, which pooling cells with
# expected count < 5 keeps accurate). The seeds are fixed, so the test is deterministic anyway.
_P_THRESHOLD = 1e-6


#: each path's sampling verify and the sequences drawn to test its law: the interpreted Triton kernel on a CPU
#: draws fewer (the chi-square test keeps its power against the full-row residual at 1200, see below)
SAMPLING_VERIFY = {"reference": (tree_speculative_sampling_target_only, 20000),
                   "fast": ("fast.verify:tree_speculative_sampling_target_only", 1200)}


def _sampling_verify(which: str):
    op, n = SAMPLING_VERIFY[which]
    if isinstance(op, str):
        import importlib
        module, name = op.split(":")
        op = getattr(importlib.import_module(module), name)
    return op, n


@pytest.fixture(params=list(SAMPLING_VERIFY))
def sampling_verify(request):
    """(the op, the number of sequences to draw), for the reference and the fast path."""
    return _sampling_verify(request.param)


@pytest.fixture(params=["reference", pytest.param("fast", marks=pytest.mark.slow)])
def sampling_verify_fast_slow(request):
    """`sampling_verify` whose interpreted fast case (over a minute on a CPU) runs with -m slow: CI keeps the fast
    op's law on the deeper fixed tree (`test_sampling_exact_distribution[fast-2]`)."""
    return _sampling_verify(request.param)


def _observed(out) -> dict:
    observed: dict[tuple, int] = {}
    for s in emitted_sequences(*out):
        observed[s] = observed.get(s, 0) + 1
    return observed


@pytest.mark.parametrize("S", [2])
def test_sampling_exact_distribution(S, sampling_verify):
    op, N = sampling_verify
    _exact_distribution_on_the_fixed_tree(op, N, S)


@pytest.mark.parametrize("S", [1])
def test_sampling_exact_distribution_depth_one(S, sampling_verify_fast_slow):
    op, N = sampling_verify_fast_slow
    _exact_distribution_on_the_fixed_tree(op, N, S)


def _exact_distribution_on_the_fixed_tree(op, N, S):
    gen = torch.Generator().manual_seed(1234 + S)
    cand, ri, nt, ns = fixed_tree(N)
    target = FIXED_TARGET.expand(N, 6, 5).contiguous()
    out = op(cand, ri, nt, ns, torch.rand(N, 6, generator=gen), torch.rand(N, generator=gen), target, S)
    observed = _observed(out)
    exact = exact_fixed_tree_distribution(FIXED_TARGET, S)
    assert set(observed) <= set(exact)  # no impossible sequence (e.g. a zero-probability token)
    p = chi_square_pvalue(observed, exact)
    assert p > _P_THRESHOLD, (p, observed, exact)
    # power: the same samples are clearly NOT distributed as a sampler that ignores the residual
    buggy = exact_fixed_tree_distribution(FIXED_TARGET, S, residual_from_full_row=True)
    assert chi_square_pvalue(observed, buggy) < _P_THRESHOLD


@pytest.mark.parametrize("S", [1, 2])
def test_sampling_verify_is_its_naive_loop_and_batch_independent(S):
    """Identical decisions for identical uniforms in the per-node loop, and a request's decisions do not depend on
    the batch around it."""
    N, n = 2000, 300
    gen = torch.Generator().manual_seed(1234 + S)
    cand, ri, nt, ns = fixed_tree(N)
    target = FIXED_TARGET.expand(N, 6, 5).contiguous()
    u, uf = torch.rand(N, 6, generator=gen), torch.rand(N, generator=gen)
    out = tree_speculative_sampling_target_only(cand, ri, nt, ns, u, uf, target, S)
    ri_small = torch.arange(n * 6).view(n, 6)
    args = (cand[:n], ri_small, nt[:n], ns[:n], u[:n], uf[:n], target[:n], S)
    small = tree_speculative_sampling_target_only(*args)
    assert_same_tensors(small, tree_speculative_sampling_target_only_naive(*args))
    assert_same_tensors(small, (out[0][: n * 6], out[1][:n], out[2][:n]))


def test_sampling_exact_distribution_random_rows(sampling_verify_fast_slow):
    """Random target rows with exact zeros: the emitted sequences follow the exact law; a child token of
    probability 0 at the root is never accepted nor emitted first. (Rows are normalised: the op's accept
    rule reads probabilities, and the exact law below is sequential sampling from them.)"""
    op, N = sampling_verify_fast_slow
    V = 6
    gen = torch.Generator().manual_seed(99)
    rows = torch.softmax(torch.randn(6, V, generator=gen), -1) * (torch.rand(6, V, generator=gen) > 0.2)
    cand, ri, nt, ns = fixed_tree(N)
    cand = cand.clone()
    assert int(cand[0, 1]) == 1  # node1's token
    rows[0, 1] = 0.0  # zero probability at the root: never accepted, never emitted
    rows[:, cand[0, 2:]] += 0.2  # every other node's token is possible, so the walk goes deep
    rows = rows / rows.sum(-1, keepdim=True)
    target = rows.expand(N, 6, V).contiguous()
    out = op(cand, ri, nt, ns, torch.rand(N, 6, generator=gen), torch.rand(N, generator=gen), target, 2)
    observed = _observed(out)
    exact = exact_fixed_tree_distribution(rows, 2)
    assert set(observed) <= set(exact)
    assert not any(s[0] == 1 for s in observed)
    assert int((out[2] > 0).sum()) > N // 10  # draft tokens were accepted: the walk is exercised
    assert chi_square_pvalue(observed, exact) > _P_THRESHOLD


def test_one_hot_target_sampling_equals_greedy():
    """target_probs one-hot at target_predict: tree sampling == greedy verify, whatever the coins
    (including coins of exactly 0 and close to 1), on random trees."""
    for seed, (S, K, W) in enumerate([(3, 2, 9), (4, 4, 20), (2, 4, 21), (5, 1, 6), (1, 4, 5)]):
        tree = DraftedTree(4, K, S, W, 10, seed=seed + 50)
        _mask, _positions, ri, nt, ns, tokens = build_tree_kernel_efficient(*tree.build_args())
        cand = tokens.view(4, W)
        paths_per_b = [tree.node_paths(b) for b in range(4)]
        for p_follow in (0.5, 0.9, 1.0):
            tp = target_predict_for(tree, paths_per_b, p_follow, tree.gen)
            hot = torch.nn.functional.one_hot(tp, 10).float()
            greedy = verify_tree_greedy(cand, ri, nt, ns, tp, S)
            for u in (torch.rand(4, W), torch.zeros(4, W), torch.full((4, W), 0.999999)):
                for uf in (torch.rand(4), torch.zeros(4), torch.full((4,), 0.999999)):
                    assert_same_tensors(
                        tree_speculative_sampling_target_only(cand, ri, nt, ns, u, uf, hot, S), greedy
                    )
                    assert_same_tensors(
                        tree_speculative_sampling_target_only_naive(cand, ri, nt, ns, u, uf, hot, S), greedy
                    )


def test_sampling_rounding_fallbacks():
    """Degenerate residuals: all target mass on rejected children (only possible by rounding) falls
    back to the full row; an all-zero row yields V-1; u = 1.0 takes the last positive token."""
    cand, ri, nt, ns = fixed_tree(3)
    V = 5
    target = torch.zeros(3, 6, V)
    target[:, 0, 1] = 0.5  # node1's token
    target[:, 0, 3] = 0.5  # node2's token
    u = torch.ones(3, 6)  # coin 1.0 rejects both (1.0 < 1.0 is false): residual empty
    uf = torch.tensor([0.0, 0.4, 1.0])
    for fn in (tree_speculative_sampling_target_only, tree_speculative_sampling_target_only_naive):
        predict, _acc_idx, acc_len = fn(cand, ri, nt, ns, u, uf, target, 2)
        assert acc_len.tolist() == [0, 0, 0]
        assert predict.view(3, 6)[:, 0].tolist() == [1, 1, 3]
    zero = torch.zeros(3, 6, V)
    for fn in (tree_speculative_sampling_target_only, tree_speculative_sampling_target_only_naive):
        predict, _, acc_len = fn(cand, ri, nt, ns, torch.rand(3, 6), uf, zero, 2)
        assert acc_len.tolist() == [0, 0, 0] and predict.view(3, 6)[:, 0].tolist() == [V - 1] * 3


def test_thresholds_accept_more():
    """threshold_single: a child whose probability reaches it is accepted whatever the coin;
    threshold_acc: the coin is compared with prob_acc / threshold_acc."""
    cand, ri, nt, ns = fixed_tree(1)
    target = FIXED_TARGET.unsqueeze(0)
    u = torch.full((1, 6), 0.99)
    uf = torch.zeros(1)
    _, _, acc_len = tree_speculative_sampling_target_only(cand, ri, nt, ns, u, uf, target, 2)
    assert acc_len.tolist() == [0]
    # root child tok 1 has p=0.30 >= 0.3; node1's child tok 2 has p=0.40
    _, acc_idx, acc_len = tree_speculative_sampling_target_only(
        cand, ri, nt, ns, u, uf, target, 2, threshold_single=0.3
    )
    assert acc_len.tolist() == [2] and acc_idx[0].tolist() == [0, 1, 4]
    # threshold_acc: the root coin 0.45 < 0.30 / 0.6 accepts node1 (with 1.0 it takes node2, at
    # 0.30 + 0.25); at node1 the coin 0.7 < (0.20 + 0.40) / 0.6 accepts node4 (with 1.0: nothing)
    u = torch.tensor([[0.45, 0.7, 0.9, 0.9, 0.9, 0.9]])
    _, acc_idx, _ = tree_speculative_sampling_target_only(cand, ri, nt, ns, u, uf, target, 2)
    assert acc_idx[0].tolist() == [0, 2, -1]
    for fn in (tree_speculative_sampling_target_only, tree_speculative_sampling_target_only_naive):
        _, acc_idx, acc_len = fn(cand, ri, nt, ns, u, uf, target, 2, threshold_acc=0.6)
        assert acc_idx[0].tolist() == [0, 1, 4] and acc_len.tolist() == [2]
