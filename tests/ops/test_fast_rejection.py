"""Equivalence of the fast verification-with-draft ops (fast/rejection.py) with the reference ones.

Integer outputs are compared bit for bit through ``tests.helpers.equivalence.assert_equivalent``. The fast ops total
rows over V in blocks, torch in its own order, so a decision or a draw within rounding of a tie may legitimately
differ. Each op's definition is replayed here in float64, independently of both ops: every draw's uniform is
moved off the cumulative-mass boundaries of the row it draws from (by more than ``BONUS_CDF_EPSILON``, the
project's bound), so draws must agree exactly; a request whose accept test or stop weight lies within ``TIE``
of its coin is exempt, and every case asserts that such requests are rare, so the comparison keeps its power.
Dyadic inputs (every sum and quotient exact in any order) pin the strict comparisons and the fallbacks
exactly. Inputs are built on the CPU; the fast ops run on the GPU when there is one.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import fast
import fast.rejection as fast_rej
import reference.rejection as ref_rej
from fast.verify import BONUS_CDF_EPSILON
from tests.helpers.equivalence import assert_equivalent, no_host_sync, raised
from tests.helpers.oracles import fixed_tree, random_prob_rows, tree_links

# Every output compared here is an integer tensor: bit-equal, the tolerance table unused.
QUANTITY = "index"
# A relative (accept test) or absolute (stop weight) margin below which fp32 rounding of a total may flip a
# decision; fp32 errors here are ~1e-6 relative, so this only exempts genuine near-ties.
TIE = 1e-4
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
OPS = ("sample_without_replacement", "tree_speculative_sampling_rejection", "chain_speculative_sampling_block")


def _on_device(fn, *args, **kwargs):
    """Runs a fast op (or launcher) on DEVICE with the CPU-built inputs; outputs come back to the CPU."""
    moved = [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args]
    out = fn(*moved, **kwargs)
    return tuple(t.cpu() for t in out) if isinstance(out, tuple) else out.cpu()


# --------------------------------------------------------------------------------------------
# float64 replays: which requests are within rounding of a tie
# --------------------------------------------------------------------------------------------


def _near_cdf_boundary(row: torch.Tensor, u: float) -> bool:
    """``u * total`` within BONUS_CDF_EPSILON * total of a cumulative-mass boundary of a float64 row."""
    total = float(row.sum())
    if not total > 0 or u == 0.0:
        return False  # an all-zero row's draw (V-1) and a threshold of exactly 0 involve no rounding
    cdf = row.cumsum(0)
    # boundaries that round to nothing: a cumulative mass of exactly 0 (leading zero tokens) is 0 on both sides,
    # and u * total near the total itself draws the last positive token on either side of it
    cdf = cdf[(cdf > 0) & (cdf < total)]
    return bool(((cdf - u * total).abs() <= BONUS_CDF_EPSILON * total).any())


def _away_from_boundaries(row: torch.Tensor, u: float) -> float:
    """``u``, moved by a fixed step (and rounded to fp32) until no rounding can change its draw from ``row``."""
    while _near_cdf_boundary(row, u):
        u = float(torch.tensor((u + 0.1234567) % 1.0))
    return u


def _inverse_cdf64(row: torch.Tensor, u: float) -> int:
    """The contract's inverse-CDF draw, in float64."""
    cdf = row.cumsum(0)
    hits = (cdf > u * cdf[-1]).nonzero()
    positive = (row > 0).nonzero()
    last = int(positive[-1]) if len(positive) else row.numel() - 1
    return min(int(hits[0]), last) if len(hits) else last


def _swr_safe_uniforms(probs, uniforms):
    """The uniforms, each moved away from the cumulative-mass boundaries of the row left at its draw."""
    uniforms = uniforms.clone()
    for n in range(probs.shape[0]):
        left = probs[n].double()
        for k in range(uniforms.shape[1]):
            uniforms[n, k] = _away_from_boundaries(left, float(uniforms[n, k]))
            left[_inverse_cdf64(left, float(uniforms[n, k]))] = 0.0
    return uniforms


def _tree_replay(cand, nt, ns, u, target, draft, steps):
    """The rejection walk in float64 -> ((B,) bool: an accept test within TIE of its boundary, [bonus row])."""
    B, W = cand.shape
    ties, bonus_rows = [], []
    for b in range(B):
        p, q = target[b].double().clamp(min=0), draft[b].double().clamp(min=0)
        r, g, cur, child, depth, tie = p[0].clone(), q[0].clone(), 0, int(nt[b, 0]), 0, False
        for _ in range(W - 1):
            if child < 0 or depth >= steps:
                break
            x = int(cand[b, child])
            r_sum, g_sum = float(r.sum()), float(g.sum())
            if g[x] > 0:  # g holds input values, exactly as both ops hold them: the same skips
                lhs, rhs = float(u[b, child]) * float(g[x]) * r_sum, float(r[x]) * g_sum
                tie |= abs(lhs - rhs) < TIE * max(lhs, rhs)
                if lhs < rhs:
                    cur, depth, child = child, depth + 1, int(nt[b, child])
                    r, g = p[cur].clone(), q[cur].clone()
                    continue
                r = (r / max(r_sum, 1e-30) - g / max(g_sum, 1e-30)).clamp(min=0)
                g[x] = 0.0
            child = int(ns[b, child])
        ties.append(tie)
        bonus_rows.append(r if r.sum() > 0 else p[cur])
    return torch.tensor(ties), bonus_rows


def _chain_replay(cand, u, target, draft, steps):
    """Block verification in float64 -> ((B,) bool: a stop weight within TIE of its coin, [bonus row])."""
    B, W = cand.shape
    L = min(steps, W - 1)
    ties, bonus_rows = [], []
    for b in range(B):
        P, Q = target[b].double().clamp(min=0), draft[b].double().clamp(min=0)
        P, Q = P / P.sum(-1, keepdim=True).clamp(min=1e-30), Q / Q.sum(-1, keepdim=True).clamp(min=1e-30)
        w, tau, w_tau, tie = 1.0, 0, 1.0, False
        for i in range(1, L + 1):
            x = int(cand[b, i])
            w = min(1.0, w * float(P[i - 1, x] / Q[i - 1, x])) if Q[i - 1, x] > 0 else 0.0
            h = w
            if i < L:
                m = float((w * P[i] - Q[i]).clamp(min=0).sum())
                h = m / (m + 1.0 - w) if m > 0 else 0.0
            tie |= h != 0.0 and abs(float(u[b, i]) - h) < TIE  # h = 0 exactly is exact in fp32 too
            if float(u[b, i]) < h:
                tau, w_tau = i, w
        resid = P[tau] if tau == L else (w_tau * P[tau] - Q[tau]).clamp(min=0)
        ties.append(tie)
        bonus_rows.append(resid if resid.sum() > 0 else P[tau])
    return torch.tensor(ties), bonus_rows


def _safe_final_uniforms(bonus_rows, uf):
    return torch.tensor([_away_from_boundaries(row, float(x)) for row, x in zip(bonus_rows, uf)])


def _assert_agree(ref, fst, near, W, what):
    """Bit-equal outputs for every request whose decisions are not near a tie; those must be rare."""
    assert [(t.shape, t.dtype) for t in ref] == [(t.shape, t.dtype) for t in fst], what
    B = near.numel()
    assert int(near.sum()) <= max(1, B // 10), f"{what}: {int(near.sum())} of {B} requests near a tie"
    keep = ~near
    flat_keep = keep.repeat_interleave(W)
    assert_equivalent((ref[0][flat_keep], ref[1][keep], ref[2][keep]),
                      (fst[0][flat_keep], fst[1][keep], fst[2][keep]), QUANTITY, where=what)


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------


def _tree_case(parents, B, V, seed, sparse_draft=False, zero_mass_tokens=False):
    """A tree drafted as the verify assumes: each node's children drawn without replacement from its draft row
    (the reference's `sample_without_replacement`), target rows leaning towards the draft so that walks go deep."""
    gen = torch.Generator().manual_seed(seed)
    W = len(parents)
    nt, ns = (torch.tensor([links] * B) for links in tree_links(parents))
    draft = random_prob_rows(B, W, V, gen, positive=2 if sparse_draft else None)
    target = 0.7 * draft / draft.sum(-1, keepdim=True) + 0.3 * random_prob_rows(B, W, V, gen)
    cand = torch.randint(V, (B, W), generator=gen)
    for b in range(B):
        for n in range(W):
            kids = [c for c in range(W) if parents[c] == n]
            if kids:
                drawn = ref_rej.sample_without_replacement(draft[b, n][None], torch.rand(1, len(kids), generator=gen))
                cand[b, kids] = drawn[0]
    if zero_mass_tokens:  # a drafted token the draft row gives no mass: skipped, whatever its coin
        draft[:, 0, cand[0, int(nt[0, 0])]] = 0.0
    u = torch.rand(B, W, generator=gen)
    u[0, 1::2] = 0.0  # coins of 0 accept any child with r(x) > 0 (and none with r(x) = 0)
    ri = torch.arange(B * W).view(B, W)
    return cand, ri, nt, ns, u, torch.rand(B, generator=gen), target, draft


def _check_tree(case, steps, block_v=None, dtype=torch.float32):
    cand, ri, nt, ns, u, uf, target, draft = case
    target, draft = target.to(dtype), draft.to(dtype)
    ties, bonus_rows = _tree_replay(cand, nt, ns, u, target, draft, steps)
    uf = _safe_final_uniforms(bonus_rows, uf)
    args = (cand, ri, nt, ns, u, uf, target, draft, steps)
    ref = ref_rej.tree_speculative_sampling_rejection(*args)
    if block_v is None:
        fst = _on_device(fast_rej.tree_speculative_sampling_rejection, *args)
    else:
        B, W = cand.shape
        fst = _on_device(fast_rej._launch_tree_speculative_sampling_rejection, *args, B, W, target.shape[-1],
                         block_v=block_v)
    _assert_agree(ref, fst, ties, cand.shape[1], f"tree steps={steps} block_v={block_v}")
    return ref


# --------------------------------------------------------------------------------------------
# sample_without_replacement
# --------------------------------------------------------------------------------------------


def _check_swr(probs, uniforms, block_v=None, exact=False):
    """Fast == reference, bit for bit; unless ``exact`` (inputs exact in fp32), with the uniforms moved off the
    cumulative-mass boundaries first."""
    if not exact:
        uniforms = _swr_safe_uniforms(probs, uniforms)
    ref = ref_rej.sample_without_replacement(probs, uniforms)
    if block_v is None:
        fst = _on_device(fast_rej.sample_without_replacement, probs, uniforms)
    else:
        N, V = probs.shape
        fst = _on_device(fast_rej._launch_sample_without_replacement, probs, uniforms, N, V, uniforms.shape[1],
                         block_v=block_v)
    assert_equivalent(ref, fst, QUANTITY, where="draws")
    return fst


@pytest.mark.parametrize("N,V,K,block_v", [(1, 1, 1, None), (3, 37, 6, 16), (4, 16, 16, None), (1, 5000, 3, None)])
def test_sample_without_replacement_matches_reference(N, V, K, block_v):
    """Unnormalised rows with exact zeros, several blocks (the last partial), K = V, V > BLOCK_V."""
    gen = torch.Generator().manual_seed(N * 1000 + V + K)
    probs = random_prob_rows(N, 1, V, gen)[:, 0]
    uniforms = torch.rand(N, K, generator=gen)
    uniforms[0, 0] = 0.0
    _check_swr(probs, uniforms, block_v)


def test_sample_without_replacement_exhaustedrandom_prob_rows():
    """Rows with fewer positive-mass tokens than K (bf16 rows too): the positive tokens first, each once, then
    the reference's V-1 for every draw after the mass is used up; uniforms up to 1 - 2^-24."""
    gen = torch.Generator().manual_seed(1)
    probs = random_prob_rows(3, 1, 12, gen, positive=3)[:, 0]
    probs[2] = 0.0  # an all-zero row: every draw is V-1
    uniforms = torch.rand(3, 6, generator=gen)
    uniforms[1] = 1.0 - 2.0 ** -24
    for dtype in (torch.float32, torch.bfloat16):
        got = _check_swr(probs.to(dtype), uniforms, block_v=8)
        for n in range(2):
            assert set(got[n, :3].tolist()) == set(probs[n].nonzero().flatten().tolist())
            assert got[n, 3:].tolist() == [11, 11, 11]
        assert got[2].tolist() == [11] * 6


def test_sample_without_replacement_strict_boundaries():
    """Dyadic masses (every cumulative sum exact): u * total exactly on a boundary draws the next token of
    positive mass, across a block boundary, both paths bit for bit."""
    row = torch.zeros(19)
    row[[2, 5, 9, 16, 17]] = torch.tensor([0.25, 0.25, 0.125, 0.125, 0.25])
    probs = row.expand(4, 19).contiguous()
    uniforms = torch.tensor([[0.25, 0.0], [0.5, 2 / 3], [0.625, 0.0], [0.0, 0.5]])
    # row 1: 9 drawn, then u * 0.875 = 7/12 lies in 16's interval ([0.5, 0.625) of the row left)
    expected = [[5, 2], [9, 16], [16, 2], [2, 16]]
    for block_v in (None, 8):
        assert _check_swr(probs, uniforms, block_v, exact=True).tolist() == expected


# --------------------------------------------------------------------------------------------
# tree_speculative_sampling_rejection
# --------------------------------------------------------------------------------------------

# several siblings at several depths; a node's children listed in sibling order
BUSHY = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 4, 7, 3, 11]
CHAIN = [-1, 0, 1, 2, 3]


@pytest.mark.parametrize("parents,B,V,steps,block_v", [
    ([-1], 1, 9, 1, None),  # root only: the bonus from the root's target row
    (CHAIN, 3, 9, 4, None),  # token-wise rejection sampling
    (CHAIN, 1, 37, 2, 16),  # num_steps below the depth; three vocabulary blocks
    (BUSHY, 3, 37, 4, 16),
    (BUSHY, 3, 11, 2, None),
    ([-1, 0, 0, 1], 1, 5000, 2, None),  # V > BLOCK_V, not a multiple of it
])
def test_tree_rejection_matches_reference(parents, B, V, steps, block_v):
    case = _tree_case(parents, B, V, seed=len(parents) * 100 + V + steps)
    _check_tree(case, steps, block_v)


def test_tree_rejection_sparse_draft_and_zero_mass_children():
    """Draft rows with 2 tokens of positive mass under 3 children (the third child repeats V-1 with g = 0 and is
    skipped), drafted tokens the root's draft row gives no mass, bf16 rows; walks reach depth > 1."""
    lengths = []
    for seed, dtype in ((11, torch.float32), (12, torch.bfloat16)):
        case = _tree_case(BUSHY, 3, 13, seed=seed, sparse_draft=True, zero_mass_tokens=True)
        lengths += _check_tree(case, 4, block_v=8, dtype=dtype)[2].tolist()
    assert max(lengths) >= 2, lengths  # the inputs do exercise accepted paths


def test_tree_rejection_exact_rules():
    """Dyadic rows on the fixed tree (root -> tokens 1, 3; node1 -> 0, 2; node2 -> 4), V = 5, every quantity
    exact in fp32: the strict accept test (a coin exactly at the ratio rejects), the residual after a
    rejection, a skipped child, the empty residual's fallback to the full row, an all-zero target (V-1), a
    negative entry (clamped at 0), the proposal law losing the rejected token."""
    cand, ri, nt, ns = fixed_tree(6)
    target = torch.full((6, 6, 5), 0.125)
    draft = torch.full((6, 6, 5), 0.125)
    u = torch.zeros(6, 6)
    uf = torch.full((6,), 0.5)
    # 0: p = (1/4, 1/4, 0, 1/2, 0), g = (0, 1/2, 0, 1/2, 0); child 1: 0.5 * 1/2 < 1/4 is false, rejected;
    #    r = (1, 0, 0, 0, 0) after normalising; child 3: r(3) = 0, rejected; the bonus is token 0
    target[0, 0] = torch.tensor([0.25, 0.25, 0.0, 0.5, 0.0])
    draft[0, 0] = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    u[0, 1] = 0.5
    # 1: the same with a coin just below the ratio: child 1 accepted, then node1's children (coin 0) too
    target[1], draft[1], u[1, 1] = target[0], draft[0], 0.5 - 2.0 ** -24
    # 2: p = g on the children's tokens, coins of 1 reject both: r is empty, the bonus comes from the full
    #    row p = (0, 1/2, 0, 1/2, 0) at u = 1/2 (cumulative mass 1/2 is not > 1/2): token 3
    target[2, 0] = draft[2, 0] = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    u[2] = 1.0
    # 3: the root's draft row gives both children's tokens no mass: both skipped although the coins are 0
    #    (and the root's target entry of -1/4 counts as 0)
    draft[3, 0] = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    target[3, 0, 4] = -0.25
    # 4: an all-zero target: nothing is accepted and the bonus is V-1
    target[4] = 0.0
    # 5: p = (1/8, 0, 0, 3/8, 1/2), g = (0, 1/2, 0, 1/4, 1/4): child 1 (r(1) = 0) rejected; r = (1/8, 0, 0, 1/8,
    #    1/4) and g = (0, 0, 0, 1/4, 1/4), so child 3 is accepted iff u < (1/4) / (1/2); u = 3/4 rejects it (a g
    #    that kept token 1 would accept it); r = (1/4, 0, 0, 0, 0) after normalising: the bonus is token 0
    target[5, 0] = torch.tensor([0.125, 0.0, 0.0, 0.375, 0.5])
    draft[5, 0] = torch.tensor([0.0, 0.5, 0.0, 0.25, 0.25])
    u[5, 2] = 0.75
    args = (cand, ri, nt, ns, u, uf, target, draft, 2)
    ref = ref_rej.tree_speculative_sampling_rejection(*args)
    for block_v in (None, 2):
        if block_v is None:
            fst = _on_device(fast_rej.tree_speculative_sampling_rejection, *args)
        else:
            fst = _on_device(fast_rej._launch_tree_speculative_sampling_rejection, *args, 6, 6, 5, block_v=block_v)
        assert_equivalent(ref, fst, QUANTITY, where=f"block_v={block_v}")
    assert fst[2].tolist() == [0, 2, 0, 0, 0, 0]
    # request 1: the root predicts token 1, node1 token 0 (node3's), node3 the bonus from its uniform row; a
    # uniform row of 1/8 at u = 1/2: cumulative 3/8 at token 2 is the first above 5/16 (request 3 too)
    assert fst[0].view(6, 6).tolist() == [[0, -1, -1, -1, -1, -1], [1, 0, -1, 2, -1, -1], [3, -1, -1, -1, -1, -1],
                                          [2, -1, -1, -1, -1, -1], [4, -1, -1, -1, -1, -1], [0, -1, -1, -1, -1, -1]]


# --------------------------------------------------------------------------------------------
# chain_speculative_sampling_block
# --------------------------------------------------------------------------------------------


def _chain_case(B, W, V, seed, sparse=False):
    """A chain whose token i is drawn from the draft row i-1; target rows leaning towards the draft."""
    gen = torch.Generator().manual_seed(seed)
    draft = random_prob_rows(B, W, V, gen, positive=2 if sparse else None)
    target = 0.6 * draft / draft.sum(-1, keepdim=True) + 0.4 * random_prob_rows(B, W, V, gen)
    cand = torch.randint(V, (B, W), generator=gen)
    if W > 1:
        cand[:, 1:] = ref_rej.sample_without_replacement(draft[:, :-1].reshape(-1, V),
                                                         torch.rand(B * (W - 1), 1, generator=gen)).view(B, W - 1)
    if sparse:  # a drafted token without draft mass: weight 0 from there on
        draft[0, 0, cand[0, 1]] = 0.0
    u = torch.rand(B, W, generator=gen)
    return cand, torch.arange(B * W).view(B, W), u, torch.rand(B, generator=gen), target, draft


def _check_chain(case, steps, block_v=None):
    cand, ri, u, uf, target, draft = case
    ties, bonus_rows = _chain_replay(cand, u, target, draft, steps)
    uf = _safe_final_uniforms(bonus_rows, uf)
    args = (cand, ri, u, uf, target, draft, steps)
    ref = ref_rej.chain_speculative_sampling_block(*args)
    if block_v is None:
        fst = _on_device(fast_rej.chain_speculative_sampling_block, *args)
    else:
        B, W = cand.shape
        fst = _on_device(fast_rej._launch_chain_speculative_sampling_block, *args, B, W, target.shape[-1],
                         block_v=block_v)
    _assert_agree(ref, fst, ties, cand.shape[1], f"chain steps={steps} block_v={block_v}")
    return ref


@pytest.mark.parametrize("B,W,V,steps,block_v,sparse", [
    (1, 1, 7, 1, None, False),  # root only: L = 0, the bonus from P_0
    (3, 2, 9, 3, None, False),  # num_steps above W - 1: accept_index padded
    (3, 6, 37, 5, 16, False),
    (3, 6, 37, 3, 16, True),  # num_steps below the chain; zero draft mass at a drafted token
    (1, 4, 5000, 3, None, False),  # V > BLOCK_V
])
def test_chain_block_matches_reference(B, W, V, steps, block_v, sparse):
    _check_chain(_chain_case(B, W, V, seed=B * 100 + W * 10 + V + steps, sparse=sparse), steps, block_v)


def test_chain_block_accepts_at_varied_lengths():
    """Many requests: accepted lengths spread over 0..L, every request either bit-equal or near a tie."""
    ref = _check_chain(_chain_case(24, 5, 11, seed=5), 4, block_v=8)
    assert len(set(ref[2].tolist())) >= 3, ref[2]


def test_chain_block_exact_rules():
    """Exact cases: a draft equal to the target (every weight 1, every m 0, so h_i = 0 below L) accepts the whole
    chain when the last coin is below h_L = 1 and nothing when it is 1 (strict), the bonus then falling back
    from the empty max(0, P_0 - Q_0) to P_0; a first token without draft mass accepts nothing whatever the
    coins and draws from max(0, P_0 - Q_0)."""
    V = 4
    rows = torch.tensor([0.5, 0.25, 0.25, 0.0]).expand(3, 5, V).contiguous()
    cand = torch.tensor([[0, 0, 1, 2, 0]] * 3)
    u = torch.zeros(3, 5)
    u[1, 4] = 1.0
    draft = rows.clone()
    rows[0, :, 3] = -0.5  # clamped at 0: request 0's target stays equal to its draft
    draft[2, 0] = torch.tensor([0.75, 0.0, 0.25, 0.0])  # token 0 of node 1 has mass: make it token 1
    cand[2, 1] = 1
    uf = torch.tensor([0.5, 0.8, 0.5])
    args = (cand, torch.arange(15).view(3, 5), u, uf, rows, draft, 4)
    ref = ref_rej.chain_speculative_sampling_block(*args)
    for block_v in (None, 2):
        if block_v is None:
            fst = _on_device(fast_rej.chain_speculative_sampling_block, *args)
        else:
            fst = _on_device(fast_rej._launch_chain_speculative_sampling_block, *args, 3, 5, V, block_v=block_v)
        assert_equivalent(ref, fst, QUANTITY, where=f"block_v={block_v}")
    assert fst[2].tolist() == [4, 0, 0]
    predict = fst[0].view(3, 5)
    assert predict[0].tolist() == [0, 1, 2, 0, 1]  # the chain's tokens, then the bonus from P_4 at u = 1/2
    # request 1: the bonus from P_0 at u = 0.8 (an empty residual would give V-1 = 3)
    assert predict[1].tolist() == [2, -1, -1, -1, -1]
    # request 2: the residual max(0, P_0 - Q_0) = (0, 1/4, 0, 0): token 1
    assert predict[2].tolist() == [1, -1, -1, -1, -1]


# --------------------------------------------------------------------------------------------
# contracts: exports, signatures, no host sync, bad input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OPS)
def test_exported_with_the_reference_signature(name):
    op = getattr(fast, name)
    assert name in fast.__all__ and op is getattr(fast_rej, name)
    assert inspect.signature(op) == inspect.signature(getattr(ref_rej, name))
    assert op.__doc__ and "Same semantics" in op.__doc__


def test_fast_ops_make_no_host_sync():
    case = _tree_case(BUSHY, 2, 9, seed=3)
    cand, ri, nt, ns, u, uf, target, draft = (t.to(DEVICE) for t in case)
    with no_host_sync():
        fast_rej.sample_without_replacement(target[:, 0], u[:, :3])
        fast_rej.tree_speculative_sampling_rejection(cand, ri, nt, ns, u, uf, target, draft, 3)
        fast_rej.chain_speculative_sampling_block(cand, ri, u, uf, target, draft, 3)


def test_bad_input_same_error():
    cand, ri, nt, ns, u, uf, target, draft = _tree_case(CHAIN, 2, 6, seed=4)
    tree_cases = [
        (cand, ri, nt, ns, u, uf, target, draft, 0),
        (cand, ri, nt, ns[:1], u, uf, target, draft, 2),
        (cand, ri, nt, ns, u[:, :3], uf, target, draft, 2),
        (cand, ri, nt, ns, u, uf, target, draft[..., :4], 2),
        (cand, ri, nt, ns, u, uf, target[..., :0], draft[..., :0], 2),
        (cand, ri, nt, ns, u, uf, target, draft.long(), 2),
    ]
    for args in tree_cases:
        assert raised(fast_rej.tree_speculative_sampling_rejection, *args) == \
            raised(ref_rej.tree_speculative_sampling_rejection, *args)
    chain_cases = [args[:2] + args[4:] for i, args in enumerate(tree_cases) if i != 1]  # the chain has no links
    chain_cases.append((cand, ri[:, :3], u, uf, target, draft, 2))
    for args in chain_cases:
        assert raised(fast_rej.chain_speculative_sampling_block, *args) == \
            raised(ref_rej.chain_speculative_sampling_block, *args)
    for args in ((target[:, 0], u[:, :0]), (target[:, 0], u[:, :4].repeat(1, 3)), (target[0], u[:1]),
                 (target[:, 0, :0], u)):
        assert raised(fast_rej.sample_without_replacement, *args) == \
            raised(ref_rej.sample_without_replacement, *args)
