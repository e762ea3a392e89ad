"""Equivalence of the fast Traversal Verification (fast/traversal.py) with the reference (reference/traversal.py).

Integer outputs are compared bit for bit through ``tests.helpers.equivalence.assert_equivalent``. The fast op totals
rows over V in blocks, torch in its own order, so a decision or a draw within rounding of a tie may legitimately differ.
The walk is replayed here in float64, independently of both ops: the final uniform is moved off the
cumulative-mass boundaries of the bonus row (by more than ``BONUS_CDF_EPSILON``), so the bonus must agree
exactly; a request whose accept test lies within rounding of its coin is exempt, and every case asserts that such
requests are rare. Dyadic inputs (every sum and quotient exact in any order) pin the strict comparisons, the
residual updates and the fallbacks exactly. Inputs are built on the CPU; the op runs on the GPU when there is one.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import fast
import fast.traversal as fast_trav
import reference.rejection as ref_rej
import reference.traversal as ref_trav
from fast.verify import BONUS_CDF_EPSILON
from tests.helpers.equivalence import assert_equivalent, no_host_sync, raised
from tests.helpers.oracles import random_prob_rows, tree_links

QUANTITY = "index"  # integer outputs only: bit-equal
# relative margin of an accept test (plus an absolute one for weights near 0, whose m cancels) inside which fp32
# rounding of a total may flip the decision
TIE, TIE_ABS = 1e-4, 1e-6
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CHAIN = [-1, 0, 1, 2, 3]
STAR = [-1, 0, 0, 0, 0]
# depth 3, siblings at every level: root -> 1, 2, 3; 1 -> 4, 5; 2 -> 6; 4 -> 7, 8; 5 -> 9; 6 -> 10, 11
DEEP = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 5, 6, 6]


def _run(args, block_v=None):
    """The fast op (or its launcher with a smaller block) on DEVICE; outputs back on the CPU."""
    moved = [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args]
    if block_v is None:
        out = fast_trav.tree_speculative_sampling_traversal(*moved)
    else:
        B, W = args[0].shape
        out = fast_trav._launch_tree_speculative_sampling_traversal(*moved, B, W, args[6].shape[-1], block_v=block_v)
    return tuple(t.cpu() for t in out)


# --------------------------------------------------------------------------------------------
# the float64 replay
# --------------------------------------------------------------------------------------------


def _normalised64(rows):
    rows = rows.double().clamp(min=0)
    return rows / rows.sum(-1, keepdim=True).clamp(min=1e-30)


def _replay(cand, nt, ns, u, target, draft, steps):
    """The contract's walk in float64 -> ((B,) bool: an accept test near its coin, (B,) accepted lengths,
    [bonus row], rejections, skips)."""
    B, W = cand.shape
    ties, lengths, bonus_rows, rejections, skips = [], [], [], 0, 0
    for b in range(B):
        P0, Q0 = _normalised64(target[b]), _normalised64(draft[b])
        stack = [[0, 1.0, P0[0].clone(), Q0[0].clone(), int(nt[b, 0])]]  # node, w, P, Q, next child
        tie = False
        for _ in range(3 * W):
            node, w, P, Q, child = stack[-1]
            if child >= 0 and len(stack) <= steps:
                x = int(cand[b, child])
                if Q[x] > 0:
                    stack.append([child, min(1.0, w * float(P[x] / Q[x])), P0[child].clone(), Q0[child].clone(),
                                  int(nt[b, child])])
                else:
                    stack[-1][4] = int(ns[b, child])
                    skips += 1
                continue
            coin = float(u[b, node])
            if len(stack) == 1 or coin < w:
                if len(stack) > 1:
                    tie |= abs(coin - w) < TIE * max(coin, w) + TIE_ABS
                break
            tie |= abs(coin - w) < TIE * max(coin, w) + TIE_ABS
            stack.pop()
            parent = stack[-1]
            r = (parent[1] * parent[2] - parent[3]).clamp(min=0)
            m = float(r.sum())
            parent[1] = m / (m + 1.0 - parent[1]) if m > 0 else 0.0
            parent[2] = r / max(m, 1e-30)
            parent[3][int(cand[b, node])] = 0.0
            parent[3] = parent[3] / max(float(parent[3].sum()), 1e-30)
            parent[4] = int(ns[b, node])
            rejections += 1
        ties.append(tie)
        lengths.append(len(stack) - 1)
        P = stack[-1][2]
        bonus_rows.append(P if P.sum() > 0 else P0[stack[-1][0]])
    return torch.tensor(ties), torch.tensor(lengths, dtype=torch.int32), bonus_rows, rejections, skips


def _away_from_boundaries(row, u):
    """``u``, moved by a fixed step (rounded to fp32) until ``u * total`` is more than BONUS_CDF_EPSILON * total
    from every cumulative-mass boundary of the float64 ``row`` strictly inside (0, total)."""
    total = float(row.sum())
    cdf = row.cumsum(0)
    cdf = cdf[(cdf > 0) & (cdf < total)]
    while total > 0 and u != 0.0 and bool(((cdf - u * total).abs() <= BONUS_CDF_EPSILON * total).any()):
        u = float(torch.tensor((u + 0.1234567) % 1.0))
    return u


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------


def _case(parents, B, V, seed, sparse_draft=False, padded=0):
    """A tree drafted as the contract assumes (each node's children drawn without replacement from its draft row,
    in sibling order), target rows leaning towards the draft so that walks go deep. ``sparse_draft``: 2 tokens of
    positive draft mass per row, so a third child is a draw of mass 0 (skipped), and the root's draft row gives
    its first child's token no mass. ``padded``: that many extra nodes outside the tree, retrieve_index -1."""
    gen = torch.Generator().manual_seed(seed)
    W = len(parents) + padded
    first, sibling = tree_links(parents)
    nt = torch.tensor([first + [-1] * padded] * B)
    ns = torch.tensor([sibling + [-1] * padded] * B)
    draft = random_prob_rows(B, W, V, gen, positive=2 if sparse_draft else None)
    target = 0.7 * draft / draft.sum(-1, keepdim=True) + 0.3 * random_prob_rows(B, W, V, gen)
    cand = torch.randint(V, (B, W), generator=gen)
    for b in range(B):
        for n in range(len(parents)):
            kids = [c for c in range(len(parents)) if parents[c] == n]
            if kids:
                drawn = ref_rej.sample_without_replacement(draft[b, n][None], torch.rand(1, len(kids), generator=gen))
                cand[b, kids] = drawn[0]
    if sparse_draft and len(parents) > 1:
        draft[0, 0, cand[0, int(nt[0, 0])]] = 0.0
    # no coins of 0: a leaf whose weight is 0 in float64 may have a tiny positive one in fp32 (a residual total
    # of rounding errors), a genuine tie (the exact cases pin coins of 0 against weights of exactly 0)
    u = torch.rand(B, W, generator=gen)
    ri = torch.arange(B * W).view(B, W)
    ri[:, len(parents):] = -1
    return cand, ri, nt, ns, u, torch.rand(B, generator=gen), target, draft


def _check(case, steps, block_v=None, dtype=torch.float32):
    """fast == reference (and the replay's accepted lengths) on every request not near a tie, which must be rare
    -> (reference outputs, rejections, skips)."""
    cand, ri, nt, ns, u, uf, target, draft = case
    target, draft = target.to(dtype), draft.to(dtype)
    near, lengths, bonus_rows, rejections, skips = _replay(cand, nt, ns, u, target, draft, steps)
    uf = torch.tensor([_away_from_boundaries(row, float(x)) for row, x in zip(bonus_rows, uf)])
    args = (cand, ri, nt, ns, u, uf, target, draft, steps)
    ref = ref_trav.tree_speculative_sampling_traversal(*args)
    fst = _run(args, block_v)
    what = f"steps={steps} block_v={block_v} dtype={dtype}"
    assert [(t.shape, t.dtype) for t in ref] == [(t.shape, t.dtype) for t in fst], what
    B, W = cand.shape
    assert int(near.sum()) <= max(1, B // 10), f"{what}: {int(near.sum())} of {B} requests near a tie"
    keep = ~near
    flat_keep = keep.repeat_interleave(W)
    assert_equivalent((ref[0][flat_keep], ref[1][keep], ref[2][keep]),
                      (fst[0][flat_keep], fst[1][keep], fst[2][keep]), QUANTITY, where=what)
    assert torch.equal(ref[2][keep], lengths[keep]), f"{what}: the float64 replay disagrees"
    return ref, rejections, skips


# --------------------------------------------------------------------------------------------
# fast == reference
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("parents,B,V,steps,block_v", [
    ([-1], 1, 5, 1, None),  # root only: the bonus from the root's target row
    (CHAIN, 3, 9, 4, None),  # block verification
    (CHAIN, 1, 37, 2, 16),  # num_steps below the depth; three vocabulary blocks
    (STAR, 3, 8, 1, None),  # depth 1: recursive rejection; two requests reject all four children
    (DEEP, 3, 37, 3, 16),
    (DEEP, 3, 37, 2, 8),  # num_steps below the depth
    (DEEP, 1, 11, 5, None),  # num_steps above the depth: accept_index padded
    ([-1, 0, 0, 1], 1, 5000, 2, None),  # V > BLOCK_V, not a multiple of it
])
def test_traversal_matches_reference(parents, B, V, steps, block_v):
    _check(_case(parents, B, V, seed=len(parents) * 100 + V + steps), steps, block_v)


def test_traversal_exercises_rejections_at_varied_depths():
    """Many requests on the deep tree: accepted lengths spread over 0..3, many leaves rejected (parents updated,
    siblings tried), each request bit-equal or near a tie."""
    ref, rejections, _ = _check(_case(DEEP, 24, 13, seed=5), 3, block_v=8)
    assert len(set(ref[2].tolist())) >= 3, ref[2]
    assert rejections >= 24, rejections


def test_traversal_sparse_draft_and_zero_mass_children():
    """Draft rows with 2 tokens of positive mass under 3 children (the third child is V-1 of mass 0, skipped), a
    first child the root's draft row gives no mass, bf16 rows; padded nodes outside the tree (retrieve_index -1)
    get -1 at their own predict slots."""
    total_skips, lengths = 0, []
    for seed, dtype in ((11, torch.float32), (12, torch.bfloat16)):
        ref, _, skips = _check(_case(DEEP, 3, 13, seed=seed, sparse_draft=True, padded=2), 3, block_v=8, dtype=dtype)
        total_skips += skips
        lengths += ref[2].tolist()
        assert (ref[0].view(3, -1)[:, -2:] == -1).all()
    assert total_skips >= 3, total_skips
    assert max(lengths) >= 1, lengths


def test_traversal_exact_rules():
    """Dyadic rows on root -> 1 -> 2, root -> 3 (V = 4, S = 2), every decision exact in fp32:

    0: w1 = 1/2 (P_0(0) = 1/4, Q_0(0) = 1/2) but w2 = min(1, 1/2 * 2) = 1: the leaf 2 is accepted at coin 3/4,
       a path whose first token alone has weight 1/2; the bonus from P_2 (uniform) at u = 1/2: token 2.
    1: as 0 with coin 1 at the leaf (strict: rejected). Node 1 then has r = max(0, P_1 / 2 - Q_1) = 0: w1 = 0 and
       it is rejected at coin 0; the root gets P_0 = (0, 0, 0, 1), w0 = 1, Q_0 without token 0; child 3 (token 1,
       P_0(1) = 0) has weight 0 and is rejected; the root is accepted, the bonus token 3.
    2: unnormalised rows with a negative target entry (clamped): child 1's token has no draft mass and is skipped
       whatever its coin; child 3 at weight 1/2 is rejected by a coin of exactly 1/2; P_0 = (1/3, 0, 0, 2/3).
    3: an all-zero target: every weight 0, all rejected, the root's P empty and its full row too: V-1 = 3.
    4: as 0 with P_1 uniform: w2 = 1/2, accepted by a coin 2^-24 below it.
    5: as 4 with a coin of exactly 1/2 (strict: rejected); node 1 then has r = 0 and the walk ends as in 1.
    6: node 1's only child has no draft mass (skipped), so node 1 is a leaf, rejected at coin 1: P_0 = (1/2, 0,
       1/2, 0), Q_0 = (0, 1/3, 0, 2/3) (token 0 removed); child 3 (weight 0) rejected: r = max(0, P_0 - Q_0) keeps
       P_0, the bonus at u = 0.4 is token 0 (a Q_0 that kept token 0 would make it (1/4, 0, 3/4, 0): token 2).
    7: P_0 = Q_0: every residual empties (w = 0 from there on); the root's bonus comes from its full target row
       (0, 1/2, 0, 1/2) at u = 1/4: token 1 (the empty row's draw would be V-1).
    A coin moved across its weight (0 -> 1, 4 -> 5) changes the outputs."""
    cand = torch.tensor([[0, 0, 2, 1]] * 7 + [[0, 1, 2, 3]])
    nt = torch.tensor([[1, 2, -1, -1]] * 8)
    ns = torch.tensor([[-1, 3, -1, -1]] * 8)
    quarter = torch.full((4,), 0.25)
    target = quarter.repeat(8, 4, 1)
    draft = quarter.repeat(8, 4, 1)
    u = torch.zeros(8, 4)
    uf = torch.full((8,), 0.5)
    draft[0, 0] = draft[1, 0] = draft[4, 0] = torch.tensor([0.5, 0.25, 0.25, 0.0])
    target[0, 1] = target[1, 1] = torch.tensor([0.0, 0.0, 0.5, 0.5])
    u[0, 2], u[1, 2], u[4, 2], u[5, 2] = 0.75, 1.0, 0.5 - 2.0 ** -24, 0.5
    target[2, 0] = torch.tensor([1.0, 1.0, -2.0, 2.0])
    draft[2, 0] = torch.tensor([0.0, 1.0, 1.0, 0.0])
    u[2, 3] = 0.5
    target[3] = 0.0
    target[5], draft[5] = target[4], draft[4]
    target[6, 0] = torch.tensor([0.5, 0.25, 0.25, 0.0])
    draft[6, 0] = torch.tensor([0.25, 0.25, 0.0, 0.5])
    draft[6, 1] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    u[6, 1], uf[6] = 1.0, 0.4
    target[7, 0] = draft[7, 0] = torch.tensor([0.0, 0.5, 0.0, 0.5])
    u[7, 2], uf[7] = 1.0, 0.25
    ri = torch.arange(32).view(8, 4)
    args = (cand, ri, nt, ns, u, uf, target, draft, 2)
    ref = ref_trav.tree_speculative_sampling_traversal(*args)
    for block_v in (None, 2):
        assert_equivalent(ref, _run(args, block_v), QUANTITY, where=f"block_v={block_v}")
    assert ref[2].tolist() == [2, 0, 0, 0, 2, 0, 0, 0]
    assert ref[1][:, 1:].tolist() == [[1, 2], [-1, -1], [-1, -1], [-1, -1], [17, 18], [-1, -1], [-1, -1], [-1, -1]]
    assert ref[1][:, 0].tolist() == ri[:, 0].tolist()
    assert ref[0].view(8, 4).tolist() == [[0, 2, 2, -1], [3, -1, -1, -1], [3, -1, -1, -1], [3, -1, -1, -1],
                                          [0, 2, 2, -1], [3, -1, -1, -1], [0, -1, -1, -1], [1, -1, -1, -1]]


# --------------------------------------------------------------------------------------------
# contracts: export, signature, no host sync, bad input
# --------------------------------------------------------------------------------------------


def test_exported_with_the_reference_signature():
    name = "tree_speculative_sampling_traversal"
    op = getattr(fast, name)
    assert name in fast.__all__ and op is getattr(fast_trav, name)
    assert inspect.signature(op) == inspect.signature(getattr(ref_trav, name))
    assert op.__doc__ and "Same semantics" in op.__doc__


def test_fast_op_makes_no_host_sync():
    cand, ri, nt, ns, u, uf, target, draft = (t.to(DEVICE) for t in _case(DEEP, 2, 9, seed=3))
    with no_host_sync():
        fast_trav.tree_speculative_sampling_traversal(cand, ri, nt, ns, u, uf, target, draft, 3)


def test_bad_input_same_error():
    cand, ri, nt, ns, u, uf, target, draft = _case(CHAIN, 2, 6, seed=4)
    for args in [
        (cand, ri, nt, ns, u, uf, target, draft, 0),
        (cand, ri, nt, ns[:1], u, uf, target, draft, 2),
        (cand.float(), ri, nt, ns, u, uf, target, draft, 2),
        (cand, ri, nt, ns, u[:, :3], uf, target, draft, 2),
        (cand, ri, nt, ns, u, uf[:1], target, draft, 2),
        (cand, ri, nt, ns, u, uf, target, draft[..., :4], 2),
        (cand, ri, nt, ns, u, uf, target[..., :0], draft[..., :0], 2),
        (cand, ri, nt, ns, u, uf, target, draft.long(), 2),
    ]:
        assert raised(fast_trav.tree_speculative_sampling_traversal, *args) == \
            raised(ref_trav.tree_speculative_sampling_traversal, *args)
