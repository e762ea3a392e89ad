"""Equivalence of the fast tree ops (fast/tree.py, fast/verify.py) with the reference ones.

Integer outputs are compared bit for bit through ``tests.helpers.equivalence.assert_equivalent``, on the random
drafted trees of tests/helpers/oracles/ (the reference ladder's), malformed trees, chains and single requests. The
sampling verify's accept decisions are compared exactly; its bonus token is compared exactly except when the
final uniform lies within ``BONUS_CDF_EPSILON`` of a CDF boundary of the residual (decided here, in
float64, independently of both ops), and the fast op's own law is tested exactly with the reference
tests' chi-square machinery (the fixed tree's exact law in tests/helpers/oracles/, the chi-square test in
tests/helpers/).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import fast.tree as fast_tree
import fast.verify as fast_verify
import reference.tree as ref_tree
import reference.verify as ref_verify
from reference.naive import build_tree_naive
from fast.verify import BONUS_CDF_EPSILON
from tests.helpers.equivalence import assert_equivalent, no_host_sync, raised
from tests.helpers import FALSE_FAILURE_RATE, chi_square_pvalue
from tests.helpers.oracles import (FAST_GRID, FIXED_TARGET, FULL_GRID, DraftedTree, drafted_case, emitted_sequences,
                           exact_fixed_tree_distribution, fixed_tree, sampling_inputs, target_predict_for, tree_shapes,
                           valid_build_args, valid_verify_inputs)

# Every output compared here is an integer or boolean tensor: bit-equal, the tolerance table unused.
QUANTITY = "index"

TREE_OPS = (
    "select_top_k_tokens",
    "organize_draft_results",
    "build_tree_kernel_efficient",
    "verify_tree_greedy",
    "tree_speculative_sampling_target_only",
)


def _module_of(name: str, fast: bool):
    if name in ("verify_tree_greedy", "tree_speculative_sampling_target_only"):
        return fast_verify if fast else ref_verify
    return fast_tree if fast else ref_tree


# --------------------------------------------------------------------------------------------
# sampling: the agreement check
# --------------------------------------------------------------------------------------------


def _near_cdf_boundary(cand, nt, ns, target_probs, uf, accept_index, accept_length, num_steps):
    """(B,) bool: the final uniform of the request lies within BONUS_CDF_EPSILON of a CDF boundary of
    its residual, in float64 and independently of both ops. The final node and its rejected
    children follow from the (identical) accept decisions: when fewer than num_steps tokens were
    accepted, every child of the final node was tried and rejected."""
    B, W = cand.shape
    V = target_probs.shape[-1]
    near = []
    for b in range(B):
        a = int(accept_length[b])
        cur = int(accept_index[b, a]) - b * W
        row = target_probs[b, cur].float().double().clamp(min=0)
        resid = row.clone()
        if a < num_steps:
            c = int(nt[b, cur])
            while c != -1:
                tok = int(cand[b, c])
                if 0 <= tok < V:
                    resid[tok] = 0.0
                c = int(ns[b, c])
        if not resid.sum() > 0:
            resid = row
        cdf = resid.cumsum(0)
        total = cdf[-1]
        threshold = float(uf[b].float()) * total
        near.append(bool(((cdf - threshold).abs() <= BONUS_CDF_EPSILON * total).any()))
    return torch.tensor(near)


def _sampling_agreement(cand, ri, nt, ns, u, uf, probs, steps, ts=1.0, ta=1.0, block_v=None):
    """Runs both sampling verifies; asserts identical decisions, and an identical bonus wherever the
    final uniform is not within the epsilon of a CDF boundary. Returns (requests, identical).

    The reference runs on the device the fast op runs on (on a GPU the conftest shim moves the fast op's
    inputs there): torch divides by threshold_acc on a CPU and multiplies by its reciprocal on CUDA, and the
    fast op follows the torch of its own device."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref = tuple(t.cpu() for t in ref_verify.tree_speculative_sampling_target_only(
        *(t.to(device) for t in (cand, ri, nt, ns, u, uf, probs)), steps, ts, ta))
    if block_v is None:
        fast = fast_verify.tree_speculative_sampling_target_only(cand, ri, nt, ns, u, uf, probs, steps, ts, ta)
    else:
        B, W = cand.shape
        fast = fast_verify._launch_tree_speculative_sampling(
            cand, ri, nt, ns, u, uf, probs, steps, ts, ta, B, W, probs.shape[-1], block_v=block_v
        )
    assert_equivalent(ref[1:], fast[1:], QUANTITY, where="(accept_index, accept_length)")
    B, W = cand.shape
    _, accept_index, accept_length = ref
    final_slot = accept_index[torch.arange(B), accept_length.long()].long()  # flat index of the bonus
    draft_slots = torch.ones(B * W, dtype=torch.bool)
    draft_slots[final_slot] = False
    assert_equivalent(ref[0][draft_slots], fast[0][draft_slots], QUANTITY, where="predict (draft tokens)")
    same = ref[0][final_slot] == fast[0][final_slot]
    near = _near_cdf_boundary(cand, nt, ns, probs, uf, accept_index, accept_length, steps)
    differ = (~same & ~near).nonzero().flatten().tolist()
    assert not differ, f"bonus differs away from a CDF boundary in requests {differ}"
    bonus = fast[0][final_slot].long()
    rows = probs.float()[torch.arange(B), final_slot - torch.arange(B) * W]
    positive = rows.gather(1, bonus.unsqueeze(1)).squeeze(1) > 0
    assert bool((positive | (rows.clamp(min=0).sum(-1) == 0)).all()), "a zero-probability bonus token"
    return B, int(same.sum())


# --------------------------------------------------------------------------------------------
# the random-tree ladder: build, greedy, sampling
# --------------------------------------------------------------------------------------------


def _run_case(S: int, K: int, W: int, seed: int, mode: str) -> None:
    tree, rng = drafted_case(S, K, W, seed, mode)
    B, gen = tree.B, tree.gen
    ref = ref_tree.build_tree_kernel_efficient(*tree.build_args())
    assert_equivalent(ref, fast_tree.build_tree_kernel_efficient(*tree.build_args()), QUANTITY, where="build")
    _mask, _positions, ri, nt, ns, tokens = ref
    cand = tokens.view(B, W)
    paths_per_b = [tree.node_paths(b) for b in range(B)]
    below = max(1, S - 1)  # also a num_steps below the tree depth
    for p_follow, steps in ((0.0, S), (0.6, below), (1.0, S)):
        tp = target_predict_for(tree, paths_per_b, p_follow, gen)
        assert_equivalent(
            ref_verify.verify_tree_greedy(cand, ri, nt, ns, tp, steps),
            fast_verify.verify_tree_greedy(cand, ri, nt, ns, tp, steps),
            QUANTITY,
            where=f"greedy p_follow={p_follow} steps={steps}",
        )
    for (ts, ta), steps in (((1.0, 1.0), S), ((0.5, 0.7), below)):
        probs, u, uf = sampling_inputs(tree, paths_per_b, gen, rng)
        _sampling_agreement(cand, ri, nt, ns, u, uf, probs, steps, ts, ta)


@pytest.mark.parametrize("mode", ["random", "ties"])
@pytest.mark.parametrize("S,K,W", FAST_GRID)
def test_fast_equals_reference_random_trees(S, K, W, mode):
    _run_case(S, K, W, seed=5000 + 1000 * S + 100 * K + W + (7 if mode == "ties" else 0), mode=mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["random", "ties"])
@pytest.mark.parametrize("S,K,W", FULL_GRID)
def test_fast_equals_reference_random_trees_full_grid(S, K, W, mode):
    for rep in range(3):
        _run_case(S, K, W, seed=104729 * rep + 1000 * S + 100 * K + W, mode=mode)


def _fast_tree_ops_property(case):
    """The reference ladder's random cases through the Triton kernels: fast == reference (`_run_case`)."""
    _run_case(*case)


@given(tree_shapes())
@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_fast_tree_ops_agree_on_random_trees(case):
    _fast_tree_ops_property(case)


# --------------------------------------------------------------------------------------------
# malformed trees, chains, single requests
# --------------------------------------------------------------------------------------------


def test_detached_node():
    """The hand-made malformed tree of the reference tests: node 3's parent candidate is missing."""
    args = (
        torch.tensor([9]),
        torch.tensor([[-1, 0, 1]]),
        torch.tensor([[0, 2, 4]]),
        torch.tensor([[5, 6, 7]]),
        torch.tensor([10]),
        2,
        2,
        4,
    )
    fast = fast_tree.build_tree_kernel_efficient(*args)
    assert_equivalent(ref_tree.build_tree_kernel_efficient(*args), fast, QUANTITY)
    mask, positions, _ri, nt, ns, _tokens = fast
    assert mask[0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]]
    assert positions.tolist() == [10, 11, 12, 11]
    assert nt[0].tolist() == [1, 2, -1, -1] and ns[0].tolist() == [-1, -1, -1, -1]


@pytest.mark.parametrize("seed", range(6))
def test_malformed_trees(seed):
    """Corrupted parent lists and selections (detached nodes, parents that are later nodes, nodes that
    are their own parent): build equals the reference, and so do both verifies on the result."""
    gen = torch.Generator().manual_seed(seed)
    K, S = (2, 3) if seed % 2 else (4, 3)
    W = 1 + K + (S - 1) * K * K - seed
    B, V = 3, 12
    tree = DraftedTree(B, K, S, W, V, seed=seed)
    num_cands = K + (S - 1) * K * K
    parent_list = tree.parent_list.clone()
    corrupt = torch.rand(parent_list.shape, generator=gen) < 0.4
    parent_list[corrupt] = torch.randint(num_cands, parent_list.shape, generator=gen)[corrupt]
    tsi = tree.top_scores_index.clone()
    if seed >= 3:  # a selection that is not sorted, with repeats
        tsi = torch.randint(num_cands, tsi.shape, generator=gen)
    args = (tree.bonus, parent_list, tsi, tree.draft_tokens, tree.seq_lens, K, S, W)
    ref = ref_tree.build_tree_kernel_efficient(*args)
    assert_equivalent(ref, fast_tree.build_tree_kernel_efficient(*args), QUANTITY, where="build")
    _mask, _positions, ri, nt, ns, tokens = ref
    cand = tokens.view(B, W)
    tp = torch.randint(V, (B, W), generator=gen)
    tp[:, 0] = cand[:, 1]
    assert_equivalent(
        ref_verify.verify_tree_greedy(cand, ri, nt, ns, tp, S),
        fast_verify.verify_tree_greedy(cand, ri, nt, ns, tp, S),
        QUANTITY,
    )
    probs = torch.softmax(torch.randn(B, W, V, generator=gen) * 3, -1)
    _sampling_agreement(cand, ri, nt, ns, torch.rand(B, W, generator=gen), torch.rand(B, generator=gen), probs, S)


def test_chains_and_single_request():
    """K = 1: a target that predicts the chain accepts it all (greedy, and sampling with one-hot
    targets); one that never does accepts nothing. B = 1 and B = 3."""
    for B, S in ((1, 4), (3, 5), (1, 1)):
        tree = DraftedTree(B, 1, S, S + 1, 16, seed=S)
        ref = ref_tree.build_tree_kernel_efficient(*tree.build_args())
        assert_equivalent(ref, fast_tree.build_tree_kernel_efficient(*tree.build_args()), QUANTITY)
        _mask, _positions, ri, nt, ns, tokens = ref
        cand = tokens.view(B, S + 1)
        follow = torch.cat([cand[:, 1:], torch.full((B, 1), 7)], dim=1)
        never = (follow + 1) % 16
        for tp, accepted in ((follow, S), (never, 0)):
            got = fast_verify.verify_tree_greedy(cand, ri, nt, ns, tp, S)
            assert_equivalent(ref_verify.verify_tree_greedy(cand, ri, nt, ns, tp, S), got, QUANTITY)
            assert got[2].tolist() == [accepted] * B
            hot = torch.nn.functional.one_hot(tp, 16).float()
            sampled = fast_verify.tree_speculative_sampling_target_only(
                cand, ri, nt, ns, torch.rand(B, S + 1), torch.rand(B), hot, S
            )
            assert_equivalent(got, sampled, QUANTITY, where="one-hot sampling vs greedy")


# --------------------------------------------------------------------------------------------
# sampling: agreement over many inputs, and the fallbacks
# --------------------------------------------------------------------------------------------


def _random_rows(B, W, V, gen, dtype=torch.float32):
    """(B, W, V) target rows, unnormalised, with exact zeros and some one-hot rows."""
    rows = torch.softmax(torch.randn(B, W, V, generator=gen) * 2.5, -1)
    rows = rows * (torch.rand(B, W, V, generator=gen) > 0.2)
    hot = torch.nn.functional.one_hot(torch.randint(V, (B, W), generator=gen), V).float()
    rows = torch.where((torch.rand(B, W, 1, generator=gen) < 0.05), hot, rows)
    rows[..., 0] += (rows.sum(-1) == 0).float()  # never an all-zero row here
    return rows.to(dtype)


@pytest.mark.slow  # CI tests the fast op's law exactly (test_tree_ops' sampling_verify cases)
def test_sampling_agreement_rate():
    """Identical uniforms: accept_index and accept_length always identical; the bonus identical in
    >= 99.9 % of requests, and in every request whose final uniform is not within BONUS_CDF_EPSILON
    of a CDF boundary. Covers several vocabulary blocks (V not a multiple of the block), fp32 / bf16 /
    fp16 targets, thresholds below 1 and coins of exactly 0."""
    gen = torch.Generator().manual_seed(2024)
    requests = identical = 0
    cases = [
        # (B, V, dtype, thresholds, block_v)
        (500, 5, torch.float32, (1.0, 1.0), None),
        (300, 37, torch.float32, (1.0, 1.0), 16),  # 3 blocks, the last one partial
        (200, 37, torch.bfloat16, (1.0, 1.0), 8),
        (200, 37, torch.float16, (0.5, 0.7), None),
        (200, 100, torch.float32, (0.3, 0.9), 32),
        (100, 5000, torch.float32, (1.0, 1.0), None),  # two blocks of the default BLOCK_V
    ]
    for B, V, dtype, (ts, ta), block_v in cases:
        cand, ri, nt, ns = fixed_tree(B)
        cand = torch.randint(V, cand.shape, generator=gen)
        for b in range(B):  # siblings keep distinct tokens
            cand[b, 2] = (cand[b, 1] + 1 + int(torch.randint(V - 1, (1,), generator=gen))) % V
            cand[b, 4] = (cand[b, 3] + 1 + int(torch.randint(V - 1, (1,), generator=gen))) % V
        probs = _random_rows(B, 6, V, gen, dtype)
        u = torch.rand(B, 6, generator=gen)
        u[: B // 10] = 0.0
        uf = torch.rand(B, generator=gen)
        n, same = _sampling_agreement(cand, ri, nt, ns, u, uf, probs, 2, ts, ta, block_v=block_v)
        requests += n
        identical += same
    assert requests >= 1500
    assert identical >= 0.999 * requests, (identical, requests)


def test_sampling_large_vocab_and_v_one():
    """V > 2^17 (one request, many blocks, the bonus deep in the vocabulary) and V = 1."""
    gen = torch.Generator().manual_seed(7)
    V = 2**17 + 4099
    cand, ri, nt, ns = fixed_tree(1)
    probs = torch.rand(1, 6, V, generator=gen)
    for uf in (torch.tensor([0.0]), torch.tensor([0.61]), torch.tensor([0.999999])):
        _sampling_agreement(cand, ri, nt, ns, torch.rand(1, 6, generator=gen), uf, probs, 2)
    tree = DraftedTree(2, 1, 3, 4, 1, seed=1)
    _mask, _positions, ri, nt, ns, tokens = ref_tree.build_tree_kernel_efficient(*tree.build_args())
    cand = tokens.view(2, 4)
    for probs in (torch.ones(2, 4, 1), torch.full((2, 4, 1), 0.3), torch.zeros(2, 4, 1)):
        _sampling_agreement(cand, ri, nt, ns, torch.rand(2, 4, generator=gen), torch.rand(2, generator=gen), probs, 3)


def test_sampling_fallbacks_bit_equal():
    """Degenerate residuals give the reference's token exactly: all target mass on the rejected
    children (empty residual: the full row), an all-zero row (V-1), u = 1.0 (the last positive)."""
    cand, ri, nt, ns = fixed_tree(3)
    V = 5
    target = torch.zeros(3, 6, V)
    target[:, 0, 1] = 0.5  # node1's token
    target[:, 0, 3] = 0.5  # node2's token
    uf = torch.tensor([0.0, 0.4, 1.0])
    for probs in (target, torch.zeros(3, 6, V), FIXED_TARGET.expand(3, 6, V).contiguous()):
        args = (cand, ri, nt, ns, torch.ones(3, 6), uf, probs, 2)
        assert_equivalent(
            ref_verify.tree_speculative_sampling_target_only(*args),
            fast_verify.tree_speculative_sampling_target_only(*args),
            QUANTITY,
        )


def test_bonus_is_strict_inverse_cdf():
    """Dyadic rows (every partial sum exact in any order, so both paths must agree bit for bit): the
    bonus is the first token whose cumulative mass is STRICTLY greater than u * total, never a token
    of mass 0, across a block boundary too."""
    cand, ri, nt, ns = fixed_tree(5)
    V = 19
    row = torch.zeros(V)
    row[[2, 5, 9, 16, 17]] = torch.tensor([0.25, 0.25, 0.125, 0.125, 0.25])
    probs = row.expand(5, 6, V).contiguous()
    uf = torch.tensor([0.25, 0.5, 0.625, 0.75, 0.0])
    expected = [5, 9, 16, 17, 2]  # u * total lands exactly on the cumulative mass of 2, 5, 9, 16
    args = (cand, ri, nt, ns, torch.ones(5, 6), uf, probs, 2)  # coins of 1 reject the root children (mass 0)
    for block_v in (None, 8):
        if block_v is None:
            fast = fast_verify.tree_speculative_sampling_target_only(*args)
        else:
            fast = fast_verify._launch_tree_speculative_sampling(*args, 1.0, 1.0, 5, 6, V, block_v=block_v)
        assert_equivalent(ref_verify.tree_speculative_sampling_target_only(*args), fast, QUANTITY)
        assert fast[0].view(5, 6)[:, 0].tolist() == expected


def test_zero_probability_children_never_accepted():
    """Coins of exactly 0 (and thresholds below 1): a child of probability 0 is never accepted."""
    gen = torch.Generator().manual_seed(3)
    B, V = 8, 7
    cand, ri, nt, ns = fixed_tree(B)
    probs = torch.rand(B, 6, V, generator=gen)
    probs.scatter_(2, cand.unsqueeze(1).expand(B, 6, 6), 0.0)  # every draft token has mass 0
    for ts, ta in ((1.0, 1.0), (0.5, 0.3)):
        out = fast_verify.tree_speculative_sampling_target_only(
            cand, ri, nt, ns, torch.zeros(B, 6), torch.rand(B, generator=gen), probs, 2, ts, ta
        )
        assert out[2].tolist() == [0] * B
        _sampling_agreement(cand, ri, nt, ns, torch.zeros(B, 6), torch.rand(B, generator=gen), probs, 2, ts, ta)


def test_accept_rule_rounding_edges():
    """Decisions at the exact rounding edges of the accept rule, where only the reference's own fp32
    operations give the reference's decision: a coin equal to prob_acc / threshold_acc where a true
    division and a product with the fp32 reciprocal round differently (torch divides on CPU and
    multiplies on CUDA), and a probability equal to fp32(threshold_single) < threshold_single."""
    ta = 0.7
    p = torch.rand(100000, generator=torch.Generator().manual_seed(0)) * 0.6
    by_division = p / ta
    by_reciprocal = p * (torch.tensor(1.0) / torch.tensor(ta))
    k = int((by_division != by_reciprocal).nonzero()[0])
    cand, ri, nt, ns = fixed_tree(2)
    probs = torch.zeros(2, 6, 5)
    probs[:, :, 4] = 1.0 - p[k]
    probs[:, 0, 1] = p[k]  # node1's token at the root; node2's (token 3) has mass 0
    u = torch.full((2, 6), 0.5)
    u[0, 0], u[1, 0] = by_division[k], by_reciprocal[k]
    _sampling_agreement(cand, ri, nt, ns, u, torch.rand(2), probs, 2, 1.0, ta)
    ts = 0.7
    assert float(torch.tensor(ts)) < ts
    probs = torch.zeros(2, 6, 5)
    probs[:, :, 4] = 0.3
    probs[:, 0, 1] = torch.tensor(ts)
    u = torch.full((2, 6), 0.99)
    _sampling_agreement(cand, ri, nt, ns, u, torch.rand(2), probs, 2, ts, 1.0)
    _, _, accept_length = fast_verify.tree_speculative_sampling_target_only(
        cand, ri, nt, ns, u, torch.rand(2), probs, 2, ts, 1.0
    )
    assert accept_length.tolist() == [1, 1]  # fp32(p) >= fp32(threshold_single)


def test_one_hot_target_sampling_equals_greedy():
    """target_probs one-hot at target_predict: the fast sampling verify equals greedy verify (both
    paths), whatever the coins."""
    for seed, (S, K, W) in enumerate([(3, 2, 9), (4, 4, 20), (5, 1, 6), (1, 4, 5)]):
        tree = DraftedTree(3, K, S, W, 10, seed=seed + 50)
        _mask, _positions, ri, nt, ns, tokens = ref_tree.build_tree_kernel_efficient(*tree.build_args())
        cand = tokens.view(3, W)
        paths_per_b = [tree.node_paths(b) for b in range(3)]
        tp = target_predict_for(tree, paths_per_b, 0.8, tree.gen)
        hot = torch.nn.functional.one_hot(tp, 10).to(torch.bfloat16)
        greedy = ref_verify.verify_tree_greedy(cand, ri, nt, ns, tp, S)
        assert_equivalent(greedy, fast_verify.verify_tree_greedy(cand, ri, nt, ns, tp, S), QUANTITY)
        for u in (torch.rand(3, W), torch.zeros(3, W), torch.full((3, W), 0.999999)):
            got = fast_verify.tree_speculative_sampling_target_only(cand, ri, nt, ns, u, torch.rand(3), hot, S)
            assert_equivalent(greedy, got, QUANTITY)


# --------------------------------------------------------------------------------------------
# sampling: the fast op's exact distribution
# --------------------------------------------------------------------------------------------


def _fast_law_pvalues(target: torch.Tensor, S: int, N: int, seed: int):
    """p-values of the fast op's emitted sequences against the exact law and against a buggy
    sampler that draws the bonus from the full row instead of the residual."""
    gen = torch.Generator().manual_seed(seed)
    cand, ri, nt, ns = fixed_tree(N)
    probs = target.expand(N, 6, target.shape[-1]).contiguous()
    out = fast_verify.tree_speculative_sampling_target_only(
        cand, ri, nt, ns, torch.rand(N, 6, generator=gen), torch.rand(N, generator=gen), probs, S
    )
    observed: dict[tuple, int] = {}
    for s in emitted_sequences(*out):
        observed[s] = observed.get(s, 0) + 1
    exact = exact_fixed_tree_distribution(target, S)
    assert set(observed) <= set(exact)  # no impossible sequence
    buggy = exact_fixed_tree_distribution(target, S, residual_from_full_row=True)
    return chi_square_pvalue(observed, exact), chi_square_pvalue(observed, buggy)


# The fast op's law at 1200 sequences (the fixed tree, random rows with zeros) is tested beside the reference's, by
# the same bodies over test_tree_ops' `sampling_verify` fixture; here only its large run.


@pytest.mark.slow
@pytest.mark.parametrize("S", [1, 2])
def test_fast_sampling_exact_distribution_large(S):
    p, p_buggy = _fast_law_pvalues(FIXED_TARGET, S, N=20000, seed=99 + S)
    assert p > FALSE_FAILURE_RATE and p_buggy < FALSE_FAILURE_RATE, (p, p_buggy)


# --------------------------------------------------------------------------------------------
# contracts: no host sync, signatures, bad input
# --------------------------------------------------------------------------------------------


def test_fast_ops_make_no_host_sync():
    B, K, S, V = 2, 2, 3, 11
    W = 8
    tree = DraftedTree(B, K, S, W, V, seed=11)
    with no_host_sync():
        ids, hidden, scores, info = fast_tree.select_top_k_tokens(
            0, torch.rand(B, K), torch.randint(V, (B, K)), torch.rand(B, 4), None, K
        )
        lists = [[x] for x in info]
        for i in range(1, S):
            ids, hidden, scores, info = fast_tree.select_top_k_tokens(
                i, torch.rand(B * K, K), torch.randint(V, (B * K, K)), hidden, scores, K
            )
            for lst, x in zip(lists, info):
                lst.append(x)
        fast_tree.organize_draft_results(*lists, W)
        _mask, _positions, ri, nt, ns, tokens = fast_tree.build_tree_kernel_efficient(*tree.build_args())
        cand = tokens.view(B, W)
        fast_verify.verify_tree_greedy(cand, ri, nt, ns, torch.randint(V, (B, W)), S)
        fast_verify.tree_speculative_sampling_target_only(
            cand, ri, nt, ns, torch.rand(B, W), torch.rand(B), torch.rand(B, W, V), S
        )
    with pytest.raises(AssertionError, match="host sync"), no_host_sync():  # the guard works
        build_tree_naive(*tree.build_args())


@pytest.mark.parametrize("name", TREE_OPS)
def test_signatures_equal(name):
    ref, fast = getattr(_module_of(name, False), name), getattr(_module_of(name, True), name)
    assert inspect.signature(ref) == inspect.signature(fast)
    assert fast.__doc__
    if name in ("select_top_k_tokens", "organize_draft_results"):
        assert fast is ref and "Fast path:" in ref.__doc__  # shared torch ops


@pytest.mark.parametrize(
    "index,value",
    [
        (5, 0),
        (6, 0),
        (6, 2.0),
        (7, 1),
        (7, 12),
        (0, torch.zeros(3, dtype=torch.long)),
        (1, torch.zeros(2, 4, dtype=torch.long)),
        (2, torch.zeros(2, 6, dtype=torch.long)),
        (2, torch.zeros(2, 7)),
        (3, torch.zeros(2, 8, dtype=torch.long)),
        (4, torch.zeros(2, 1, dtype=torch.long)),
    ],
)
def test_build_tree_bad_input_same_error(index, value):
    args = valid_build_args()
    args[index] = value
    assert raised(fast_tree.build_tree_kernel_efficient, *args) == raised(
        ref_tree.build_tree_kernel_efficient, *args
    )


def test_verify_bad_input_same_error():
    cand, ri, nt, ns, tp, u, uf, probs = valid_verify_inputs()
    greedy_cases = [
        (cand, ri, nt, ns, tp, 0),
        (cand, ri, nt, ns, tp, 2.0),
        (cand, ri, nt, ns, tp[:, :5], 2),
        (cand, ri, nt, ns[:1], tp, 2),
        (cand.flatten(), ri, nt, ns, tp, 2),
        (cand, ri, nt, ns, tp.float(), 2),
    ]
    for args in greedy_cases:
        assert raised(fast_verify.verify_tree_greedy, *args) == raised(ref_verify.verify_tree_greedy, *args)
    sampling_cases = [
        ((cand, ri, nt, ns, u[:, :5], uf, probs, 2), {}),
        ((cand, ri, nt, ns, u, uf[:1], probs, 2), {}),
        ((cand, ri, nt, ns, u, uf, probs[:, :5], 2), {}),
        ((cand, ri, nt, ns, u, uf, probs, 2), {"threshold_single": 1.5}),
        ((cand, ri, nt, ns, u, uf, probs, 2), {"threshold_acc": -0.5}),
        ((cand, ri, nt, ns, u, uf, probs, 2), {"threshold_acc": True}),
        ((cand, ri, nt, ns, u, uf, probs, 0), {}),
        ((cand, ri, nt, ns, u, uf, probs.long(), 2), {}),
        ((cand, ri, nt, ns, u.long(), uf, probs, 2), {}),
    ]
    for args, kwargs in sampling_cases:
        assert raised(fast_verify.tree_speculative_sampling_target_only, *args, **kwargs) == raised(
            ref_verify.tree_speculative_sampling_target_only, *args, **kwargs
        )
