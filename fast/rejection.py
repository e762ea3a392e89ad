"""Triton versions of verification with the draft's distribution (``reference.rejection``).

Same names, signatures, outputs and argument checks as ``reference.rejection``. Each op is one kernel
launch with one program per request (per row for ``sample_without_replacement``); the program writes
every output slot itself and the launchers read no tensor value on the host.

Unlike the target-only verify (`fast.verify`), these ops change whole distributions as they go: a
rejection replaces the residual r by max(0, r/sum r - g/sum g) and removes the rejected token from the
proposal law g, and each draw without replacement removes a token from its row. The next decision needs
the new row's total, and the bonus needs its cumulative mass, so the changed rows must exist somewhere.
Recomputing them from the node's original rows would replay every earlier rejection on every element
(quadratic in the number of siblings tried); instead each program owns a float32 scratch row (two for
the tree verify: r and g) that the launcher allocates with ``torch.empty``. A program fills it from the
input rows (in fp32, clamped at 0 where the reference clamps) before it first reads it, rewrites it in
place after a rejection or a draw, and computes the new totals in the same streaming pass. The scratch
is the only temporary of size V.

Every pass streams the vocabulary in blocks of ``BLOCK_V``; totals are running fp32 block sums, and an
inverse-CDF draw is a blocked cumulative sum with a running carry that stops at the block holding the
draw. The scratch is shared by the program's warps, which run unsynchronised between reductions, so
CTA barriers order the accesses that are not per-element: one after every pass that writes the scratch
(the next reader may be another warp: a scalar load of r(x), a scan), and one before every pass that
overwrites r and g, so that no warp still about to load this child's r(x), g(x) sees the next values
(the walk's scalars must be the same in every warp). An in-place rewrite loads and stores each block
through the same offsets, the usual in-place pattern. A drawn token's scalar store needs no barrier
before it: the draw is a reduction over the whole block, which every warp has read by then.

Arithmetic follows the reference operation by operation in fp32: divisions are correctly rounded
(``div_rn``, as torch's) and kernels are compiled without FMA contraction (the reference rounds
``w * P`` before subtracting ``Q``). What cannot be bit-identical is a total over V, summed here in
blocks and by torch in its own order, and every value divided by one. A decision or a draw may
therefore differ from the reference's only when it is within rounding of a tie: an accept coin or a stop
coin within a relative ~1e-6 of its threshold for well-separated rows (more where r/sum r - g/sum g
cancels, i.e. where the target and proposal rows nearly agree), or a draw's ``u * total`` within
``BONUS_CDF_EPSILON * total`` of a cumulative-mass boundary (``fast.verify.BONUS_CDF_EPSILON``: its
bound on the scans applies unchanged; the residual's elements add a few ulps of their own).

Notation as in ``reference.rejection``: B batch, W tree size (root included), S ``num_steps``, V vocab.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.ops.op_checks import check_draft_probs_args, check_sample_without_replacement_args, check_tree_args

from .verify import _verify_outputs

__all__ = ["chain_speculative_sampling_block", "sample_without_replacement", "tree_speculative_sampling_rejection"]

#: Vocabulary block streamed per iteration (as `fast.verify`'s sampling kernel).
BLOCK_V = 4096


# --------------------------------------------------------------------------------------------
# shared streaming passes
# --------------------------------------------------------------------------------------------


@triton.jit
def _copy_row(src_ptr, dst_ptr, V, CLAMP: tl.constexpr, BLOCK_V: tl.constexpr):
    """Copies a row into the scratch row ``dst_ptr`` as fp32 (clamped at 0 when CLAMP) -> its total."""
    tl.debug_barrier()  # every warp has done its scalar loads of the row this overwrites
    offs0 = tl.arange(0, BLOCK_V)
    total = tl.zeros([], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + offs0
        x = tl.load(src_ptr + offs, mask=offs < V, other=0.0).to(tl.float32)
        if CLAMP:
            x = tl.maximum(x, 0.0)
        tl.store(dst_ptr + offs, x, mask=offs < V)
        total += tl.sum(x, axis=0)
    tl.debug_barrier()  # the next reader may be another thread (a scalar load, a differently laid-out pass)
    return total


@triton.jit
def _row_total(row_ptr, V, BLOCK_V: tl.constexpr):
    """The total of an fp32 scratch row."""
    offs0 = tl.arange(0, BLOCK_V)
    total = tl.zeros([], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + offs0
        total += tl.sum(tl.load(row_ptr + offs, mask=offs < V, other=0.0), axis=0)
    return total


@triton.jit
def _inverse_cdf(row_ptr, V, total, u, BLOCK_V: tl.constexpr):
    """Inverse-CDF draw from an fp32 scratch row (>= 0) of total ``total``: the first token whose cumulative
    mass is strictly greater than ``u * total``, never one of mass 0; if rounding leaves no such token, the
    last token of positive mass; for an all-zero row, V-1 (the reference's fallbacks)."""
    threshold = u * total
    offs0 = tl.arange(0, BLOCK_V)
    carry = tl.zeros([], dtype=tl.float32)
    token = tl.zeros([], dtype=tl.int64) + V
    start = tl.zeros([], dtype=tl.int64)
    while (start < V) & (token == V):
        offs = start + offs0
        x = tl.load(row_ptr + offs, mask=offs < V, other=0.0)
        cdf = carry + tl.cumsum(x, axis=0)
        # x > 0: a blocked scan may round a zero-mass token's prefix differently from its predecessor's
        token = tl.min(tl.where((cdf > threshold) & (x > 0), offs, V), axis=0).to(tl.int64)
        carry += tl.sum(x, axis=0)
        start += BLOCK_V
    last_positive = tl.full([], -1, dtype=tl.int64)
    for start in range(0, tl.where(token == V, V, 0), BLOCK_V):
        offs = start + offs0
        x = tl.load(row_ptr + offs, mask=offs < V, other=0.0)
        last_positive = tl.maximum(last_positive, tl.max(tl.where(x > 0, offs, -1), axis=0).to(tl.int64))
    return tl.where(token == V, tl.where(last_positive >= 0, last_positive, V - 1), token)


# --------------------------------------------------------------------------------------------
# sampling without replacement
# --------------------------------------------------------------------------------------------


@triton.jit
def sample_without_replacement_kernel(probs_ptr, uniforms_ptr, out_ptr, left_ptr, V, K, BLOCK_V: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    left = left_ptr + n * V
    # no clamp: the reference reads the row as given (its contract: probs >= 0)
    total = _copy_row(probs_ptr + n * V, left, V, False, BLOCK_V)
    for k in range(0, K):
        u = tl.load(uniforms_ptr + n * K + k).to(tl.float32)
        token = _inverse_cdf(left, V, total, u, BLOCK_V)
        tl.store(out_ptr + n * K + k, token)
        tl.store(left + token, 0.0)  # token < V: the drawn token leaves the row
        tl.debug_barrier()
        if k + 1 < K:
            # recomputed, not total - mass: after a few draws the difference would be mostly rounding error
            total = _row_total(left, V, BLOCK_V)


def _launch_sample_without_replacement(probs, uniforms, N, V, K, block_v=BLOCK_V):
    out = torch.empty(N, K, dtype=torch.int64, device=probs.device)
    if N > 0:
        left = torch.empty(N, V, dtype=torch.float32, device=probs.device)
        sample_without_replacement_kernel[(N,)](
            probs.contiguous(), uniforms.contiguous(), out, left, V, K,
            BLOCK_V=min(block_v, triton.next_power_of_2(V)), num_warps=8,
        )
    return out


def sample_without_replacement(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """probs (N, V) float >= 0 (unnormalised is fine), uniforms (N, K) float in [0, 1) -> (N, K) int64.

    Same semantics as ``reference.rejection.sample_without_replacement``: K draws per row without
    replacement, in draw order; draw k is the first token whose cumulative mass, over the row with draws
    0..k-1 removed, is strictly greater than ``uniforms[:, k]`` times that row's total, so a token of zero
    mass is never drawn while mass remains. If rounding leaves no such token the last token of positive
    mass is taken; once the row's mass is used up (fewer than K tokens of positive mass), every further
    draw is V-1, as in the reference (a draw of probability 0, which the verify ops skip).

    Equivalence: a draw may differ from the reference's only when ``u * total`` lies within
    ``BONUS_CDF_EPSILON * total`` of a cumulative-mass boundary of the row left at its turn (and the later
    draws of that row with it); it is never a token of zero mass while mass remains.

    One launch, one program per row: the row is copied once to an fp32 scratch row, then each draw is a
    total pass and a blocked inverse-CDF scan that stops at the block holding the draw, followed by a
    scalar store that zeroes the drawn token.
    """
    N, V, K = check_sample_without_replacement_args(probs, uniforms)
    return _launch_sample_without_replacement(probs, uniforms, N, V, K)


# --------------------------------------------------------------------------------------------
# tree verification by recursive rejection sampling
# --------------------------------------------------------------------------------------------


@triton.jit
def _shrink_after_rejection(r_ptr, g_ptr, token, r_sum, g_sum, V, BLOCK_V: tl.constexpr):
    """In place, after ``token`` was rejected: r <- max(0, r / sum r - g / sum g), g loses ``token``
    -> the new (sum r, sum g)."""
    tl.debug_barrier()  # every warp has loaded the rejected child's r(x), g(x)
    r_div = tl.maximum(r_sum, 1e-30)
    g_div = tl.maximum(g_sum, 1e-30)
    offs0 = tl.arange(0, BLOCK_V)
    new_r_sum = tl.zeros([], dtype=tl.float32)
    new_g_sum = tl.zeros([], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + offs0
        r = tl.load(r_ptr + offs, mask=offs < V, other=0.0)
        g = tl.load(g_ptr + offs, mask=offs < V, other=0.0)
        r = tl.maximum(tl.math.div_rn(r, r_div) - tl.math.div_rn(g, g_div), 0.0)
        g = tl.where(offs == token, 0.0, g)
        tl.store(r_ptr + offs, r, mask=offs < V)
        tl.store(g_ptr + offs, g, mask=offs < V)
        new_r_sum += tl.sum(r, axis=0)
        new_g_sum += tl.sum(g, axis=0)
    tl.debug_barrier()  # the next child's r(x), g(x) are scalar loads, from whichever thread
    return new_r_sum, new_g_sum


@triton.jit
def tree_speculative_sampling_rejection_kernel(
    candidates_ptr,
    retrieve_index_ptr,
    retrieve_next_token_ptr,
    retrieve_next_sibling_ptr,
    uniform_samples_ptr,
    uniform_final_ptr,
    target_probs_ptr,
    draft_probs_ptr,
    scratch_ptr,
    predict_ptr,
    accept_index_ptr,
    accept_length_ptr,
    B,
    W,
    V,
    num_steps,
    BLOCK_W: tl.constexpr,
    BLOCK_S1: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    base = b * W
    node = tl.arange(0, BLOCK_W)
    ri = tl.load(retrieve_index_ptr + base + node, mask=node < W, other=-1).to(tl.int64)
    slot = tl.arange(0, BLOCK_S1)
    accept_index = tl.where(slot == 0, tl.load(retrieve_index_ptr + base).to(tl.int64), -1)
    predict = tl.full([BLOCK_W], -1, dtype=tl.int64)

    # the current node's residual r and proposal law g, in this request's two scratch rows
    r_ptr = scratch_ptr + b * 2 * V
    g_ptr = r_ptr + V
    r_sum = _copy_row(target_probs_ptr + base * V, r_ptr, V, True, BLOCK_V)
    g_sum = _copy_row(draft_probs_ptr + base * V, g_ptr, V, True, BLOCK_V)
    cur = tl.zeros([], dtype=tl.int64)
    child = tl.load(retrieve_next_token_ptr + base).to(tl.int64)
    depth = tl.zeros([], dtype=tl.int64)
    steps = tl.zeros([], dtype=tl.int64)
    # the reference examines one child per round for W-1 rounds; this walk stops at the first round that
    # would change nothing
    while (child >= 0) & (depth < num_steps) & (steps < W - 1):
        in_tree = child < W
        token = tl.load(candidates_ptr + base + child, mask=in_tree, other=-1).to(tl.int64)
        in_vocab = (token >= 0) & (token < V)
        coin = tl.load(uniform_samples_ptr + base + child, mask=in_tree, other=0.0).to(tl.float32)
        r_x = tl.load(r_ptr + token, mask=in_vocab, other=0.0)
        g_x = tl.load(g_ptr + token, mask=in_vocab, other=0.0)
        # g(x) = 0: not a draw from g (its row ran out of mass), skipped; the products in the reference's order
        drawn = g_x > 0
        accept = tl.where(drawn, coin * g_x * r_sum < r_x * g_sum, False)
        if accept:
            predict = tl.where(node == cur, token, predict)
            child_flat = tl.load(retrieve_index_ptr + base + child).to(tl.int64)
            accept_index = tl.where(slot == depth + 1, child_flat, accept_index)
            depth += 1
            cur = child
            r_sum = _copy_row(target_probs_ptr + (base + child) * V, r_ptr, V, True, BLOCK_V)
            g_sum = _copy_row(draft_probs_ptr + (base + child) * V, g_ptr, V, True, BLOCK_V)
            child = tl.load(retrieve_next_token_ptr + base + child).to(tl.int64)
        else:
            if drawn:
                r_sum, g_sum = _shrink_after_rejection(r_ptr, g_ptr, token, r_sum, g_sum, V, BLOCK_V)
            child = tl.load(retrieve_next_sibling_ptr + base + child, mask=in_tree, other=-1).to(tl.int64)
        steps += 1

    # the bonus: from r, or from the node's full target row when rounding emptied r
    if r_sum <= 0:
        r_sum = _copy_row(target_probs_ptr + (base + cur) * V, r_ptr, V, True, BLOCK_V)
    bonus = _inverse_cdf(r_ptr, V, r_sum, tl.load(uniform_final_ptr + b).to(tl.float32), BLOCK_V)
    predict = tl.where(node == cur, bonus, predict)

    ri_valid = (node < W) & (ri >= 0) & (ri < B * W)
    tl.store(predict_ptr + ri, predict.to(tl.int32), mask=ri_valid)
    tl.store(accept_index_ptr + b * (num_steps + 1) + slot, accept_index.to(tl.int32), mask=slot <= num_steps)
    tl.store(accept_length_ptr + b, depth.to(tl.int32))


def _launch_tree_sampler(kernel, scratch_rows, candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling,
                         uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs, num_steps,
                         B, W, V, block_v=BLOCK_V):
    """One launch of a tree verify kernel with the draft's distribution (this module's, `fast.traversal`'s), one
    program per request, each owning `scratch_rows` fp32 scratch rows of V -> (predict, accept_index, accept_length)."""
    device = candidates.device
    predict, accept_index, accept_length = _verify_outputs(B, W, num_steps, device)
    if B > 0:
        scratch = torch.empty(B, scratch_rows, V, dtype=torch.float32, device=device)
        kernel[(B,)](
            candidates.contiguous(),
            retrieve_index.contiguous(),
            retrieve_next_token.contiguous(),
            retrieve_next_sibling.contiguous(),
            uniform_samples.contiguous(),
            uniform_samples_for_final_sampling.contiguous(),
            target_probs.contiguous(),
            draft_probs.contiguous(),
            scratch,
            predict,
            accept_index,
            accept_length,
            B,
            W,
            V,
            num_steps,
            BLOCK_W=triton.next_power_of_2(W),
            BLOCK_S1=triton.next_power_of_2(num_steps + 1),
            BLOCK_V=min(block_v, triton.next_power_of_2(V)),
            num_warps=8,
            enable_fp_fusion=False,
        )
    return predict, accept_index, accept_length


def _launch_tree_speculative_sampling_rejection(*args, block_v=BLOCK_V):
    """args: the op's arguments, then B, W, V. Scratch: r and g."""
    return _launch_tree_sampler(tree_speculative_sampling_rejection_kernel, 2, *args, block_v=block_v)


def tree_speculative_sampling_rejection(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    num_steps: int,
):
    """candidates (B, W), retrieve_index (B, W), retrieve_next_token (B, W), retrieve_next_sibling (B, W),
    uniform_samples (B, W), uniform_samples_for_final_sampling (B,), target_probs (B, W, V), draft_probs (B, W, V).
    Returns ``(predict (B*W,) int32, accept_index (B, S+1) int32, accept_length (B,) int32)``, S = ``num_steps``.

    Same semantics as ``reference.rejection.tree_speculative_sampling_rejection``: at the current node (the
    root first) the residual r starts as p = ``target_probs[b, n]`` and the proposal law g as q =
    ``draft_probs[b, n]`` (clamped at 0); its children are tried in sibling order, child c with token x
    accepted when ``uniform_samples[b, c] * g(x) * sum r < r(x) * sum g`` (strict), and the walk moves to
    c. After a rejection r becomes max(0, r / sum r - g / sum g) and g loses x; a child with g(x) = 0 is
    skipped. When no child is accepted, the node has none, or S tokens were accepted, the bonus is the
    first token whose cumulative mass in r is strictly greater than ``u * sum r`` (``u =
    uniform_samples_for_final_sampling[b]``), from the node's full target row if rounding emptied r, the
    last positive token if ``u * total`` rounds up to the total, V-1 for an all-zero row. Arithmetic in
    float32 whatever the input dtypes.

    Equivalence: every elementwise value is computed as the reference computes it (correctly rounded
    divisions, no FMA), but the totals over V are block sums, not torch's. The outputs equal the
    reference's except where a decision is within rounding of a tie: an accept coin within a relative
    ~1e-6 of its ratio, or the bonus's ``u * total`` within ``BONUS_CDF_EPSILON * total`` of a
    cumulative-mass boundary of the final residual (then the bonus may differ, and is never a token of
    zero mass).

    One launch, one program per request: a scalar walk of the tree with r and g in a (B, 2, V) fp32 scratch
    the launcher allocates uninitialised. Entering a node copies its two rows there (with their totals);
    a rejection rewrites both in place in one pass that also totals them; a skipped child reads two
    scalars. The bonus is a blocked inverse-CDF scan of r. ``predict`` is written at the request's flat
    indices ``retrieve_index[b]`` (a permutation of ``0 .. B*W-1`` from ``build_tree_kernel_efficient``).
    """
    B, W = check_tree_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, num_steps)
    V = check_draft_probs_args(B, W, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                               draft_probs, candidates.device)
    return _launch_tree_speculative_sampling_rejection(
        candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, uniform_samples,
        uniform_samples_for_final_sampling, target_probs, draft_probs, num_steps, B, W, V,
    )


# --------------------------------------------------------------------------------------------
# block verification of a chain
# --------------------------------------------------------------------------------------------


@triton.jit
def _row_totals(p_row, q_row, V, BLOCK_V: tl.constexpr):
    """(total of max(p, 0), total of max(q, 0)) over a target row and a draft row."""
    offs0 = tl.arange(0, BLOCK_V)
    p_sum = tl.zeros([], dtype=tl.float32)
    q_sum = tl.zeros([], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + offs0
        p_sum += tl.sum(tl.maximum(tl.load(p_row + offs, mask=offs < V, other=0.0).to(tl.float32), 0.0), axis=0)
        q_sum += tl.sum(tl.maximum(tl.load(q_row + offs, mask=offs < V, other=0.0).to(tl.float32), 0.0), axis=0)
    return p_sum, q_sum


@triton.jit
def _normalised_block(row_ptr, offs, V, row_div):
    """A block of a row normalised as the reference does: max(x, 0) / max(total, 1e-30), correctly rounded."""
    return tl.math.div_rn(tl.maximum(tl.load(row_ptr + offs, mask=offs < V, other=0.0).to(tl.float32), 0.0),
                          row_div)


@triton.jit
def _excess_mass(p_row, q_row, p_div, q_div, w, V, BLOCK_V: tl.constexpr):
    """m = sum_x max(0, w P(x) - Q(x)) over the normalised rows."""
    offs0 = tl.arange(0, BLOCK_V)
    m = tl.zeros([], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + offs0
        excess = w * _normalised_block(p_row, offs, V, p_div) - _normalised_block(q_row, offs, V, q_div)
        m += tl.sum(tl.maximum(excess, 0.0), axis=0)
    return m


@triton.jit
def _write_block_residual(p_row, q_row, out_ptr, p_div, q_div, w, full_row, V, BLOCK_V: tl.constexpr):
    """Writes the bonus distribution to the scratch row: P when ``full_row``, else max(0, w P - Q)
    -> its total."""
    offs0 = tl.arange(0, BLOCK_V)
    total = tl.zeros([], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + offs0
        p = _normalised_block(p_row, offs, V, p_div)
        x = tl.where(full_row, p, tl.maximum(w * p - _normalised_block(q_row, offs, V, q_div), 0.0))
        tl.store(out_ptr + offs, x, mask=offs < V)
        total += tl.sum(x, axis=0)
    tl.debug_barrier()
    return total


@triton.jit
def chain_speculative_sampling_block_kernel(
    candidates_ptr,
    retrieve_index_ptr,
    uniform_samples_ptr,
    uniform_final_ptr,
    target_probs_ptr,
    draft_probs_ptr,
    scratch_ptr,
    predict_ptr,
    accept_index_ptr,
    accept_length_ptr,
    B,
    W,
    V,
    num_steps,
    BLOCK_W: tl.constexpr,
    BLOCK_S1: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    base = b * W
    L = tl.minimum(num_steps, W - 1)
    # row i-1's totals normalise the ratio at node i and row i's the stop weight at i: each row is totalled
    # once on the way down, and the bonus row once more (the same blocked sum, so the same value)
    p_sum, q_sum = _row_totals(target_probs_ptr + base * V, draft_probs_ptr + base * V, V, BLOCK_V)
    w = tl.full([], 1.0, dtype=tl.float32)
    w_tau = tl.full([], 1.0, dtype=tl.float32)
    tau = tl.zeros([], dtype=tl.int64)
    for i in range(1, L + 1):
        token = tl.load(candidates_ptr + base + i).to(tl.int64)
        in_vocab = (token >= 0) & (token < V)
        prev = base + i - 1
        p_x = tl.maximum(tl.load(target_probs_ptr + prev * V + token, mask=in_vocab, other=0.0).to(tl.float32), 0.0)
        q_x = tl.maximum(tl.load(draft_probs_ptr + prev * V + token, mask=in_vocab, other=0.0).to(tl.float32), 0.0)
        p_x = tl.math.div_rn(p_x, tl.maximum(p_sum, 1e-30))
        q_x = tl.math.div_rn(q_x, tl.maximum(q_sum, 1e-30))
        ratio = tl.where(q_x > 0, tl.math.div_rn(p_x, tl.maximum(q_x, 1e-30)), 0.0)
        w = tl.minimum(w * ratio, 1.0)
        h = w
        if i < L:
            p_row = target_probs_ptr + (base + i) * V
            q_row = draft_probs_ptr + (base + i) * V
            p_sum, q_sum = _row_totals(p_row, q_row, V, BLOCK_V)
            m = _excess_mass(p_row, q_row, tl.maximum(p_sum, 1e-30), tl.maximum(q_sum, 1e-30), w, V, BLOCK_V)
            h = tl.where(m > 0, tl.minimum(tl.math.div_rn(m, tl.maximum(m + (1.0 - w), 1e-30)), 1.0), 0.0)
        stop_here = tl.load(uniform_samples_ptr + base + i).to(tl.float32) < h
        tau = tl.where(stop_here, i, tau)
        w_tau = tl.where(stop_here, w, w_tau)

    # the bonus: from P_L when the whole chain was accepted, else from max(0, w_tau P_tau - Q_tau), falling
    # back to P_tau when rounding emptied that
    p_row = target_probs_ptr + (base + tau) * V
    q_row = draft_probs_ptr + (base + tau) * V
    p_sum, q_sum = _row_totals(p_row, q_row, V, BLOCK_V)
    p_div = tl.maximum(p_sum, 1e-30)
    q_div = tl.maximum(q_sum, 1e-30)
    resid_ptr = scratch_ptr + b * V
    total = _write_block_residual(p_row, q_row, resid_ptr, p_div, q_div, w_tau, tau == L, V, BLOCK_V)
    if total <= 0:
        total = _write_block_residual(p_row, q_row, resid_ptr, p_div, q_div, w_tau, True, V, BLOCK_V)
    bonus = _inverse_cdf(resid_ptr, V, total, tl.load(uniform_final_ptr + b).to(tl.float32), BLOCK_V)

    node = tl.arange(0, BLOCK_W)
    ri = tl.load(retrieve_index_ptr + base + node, mask=node < W, other=-1).to(tl.int64)
    # node i < tau predicts its child's token, node tau the bonus
    child_token = tl.load(candidates_ptr + base + node + 1, mask=node + 1 < W, other=-1).to(tl.int64)
    predict = tl.where(node == tau, bonus, tl.where(node < tau, child_token, -1))
    ri_valid = (node < W) & (ri >= 0) & (ri < B * W)
    tl.store(predict_ptr + ri, predict.to(tl.int32), mask=ri_valid)
    slot = tl.arange(0, BLOCK_S1)
    accept_index = tl.load(retrieve_index_ptr + base + slot, mask=slot <= tau, other=-1)
    tl.store(accept_index_ptr + b * (num_steps + 1) + slot, accept_index.to(tl.int32), mask=slot <= num_steps)
    tl.store(accept_length_ptr + b, tau.to(tl.int32))


def _launch_chain_speculative_sampling_block(candidates, retrieve_index, uniform_samples,
                                             uniform_samples_for_final_sampling, target_probs, draft_probs,
                                             num_steps, B, W, V, block_v=BLOCK_V):
    device = candidates.device
    predict, accept_index, accept_length = _verify_outputs(B, W, num_steps, device)
    if B > 0:
        scratch = torch.empty(B, V, dtype=torch.float32, device=device)
        chain_speculative_sampling_block_kernel[(B,)](
            candidates.contiguous(),
            retrieve_index.contiguous(),
            uniform_samples.contiguous(),
            uniform_samples_for_final_sampling.contiguous(),
            target_probs.contiguous(),
            draft_probs.contiguous(),
            scratch,
            predict,
            accept_index,
            accept_length,
            B,
            W,
            V,
            num_steps,
            BLOCK_W=triton.next_power_of_2(W),
            BLOCK_S1=triton.next_power_of_2(num_steps + 1),
            BLOCK_V=min(block_v, triton.next_power_of_2(V)),
            num_warps=8,
            enable_fp_fusion=False,
        )
    return predict, accept_index, accept_length


def chain_speculative_sampling_block(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    num_steps: int,
):
    """candidates (B, W), retrieve_index (B, W), uniform_samples (B, W), uniform_samples_for_final_sampling (B,),
    target_probs (B, W, V), draft_probs (B, W, V). Returns ``(predict (B*W,) int32, accept_index (B, S+1) int32,
    accept_length (B,) int32)``, S = ``num_steps``.

    Same semantics as ``reference.rejection.chain_speculative_sampling_block`` (block verification, Sun et
    al.): node i's token x_i was drawn from Q_{i-1} = ``draft_probs[b, i-1]``, P_i = ``target_probs[b, i]``,
    both normalised after clamping at 0. With L = min(S, W - 1), w_0 = 1, w_i = min(1, w_{i-1}
    P_{i-1}(x_i) / Q_{i-1}(x_i)) (0 where Q_{i-1}(x_i) = 0), h_i = m_i / (m_i + 1 - w_i) for i < L with
    m_i = sum_x max(0, w_i P_i(x) - Q_i(x)) (0 where m_i = 0), h_L = w_L, the accepted length tau is the
    largest i with ``uniform_samples[b, i] < h_i`` (0 if none). The bonus is the first token whose
    cumulative mass is strictly greater than ``u * total`` (``u = uniform_samples_for_final_sampling[b]``)
    in P_L when tau = L, else in max(0, w_tau P_tau - Q_tau), or in P_tau if rounding emptied that.

    Equivalence: elementwise values as the reference's (correctly rounded divisions, no FMA); the row totals
    are block sums, so the outputs equal the reference's except where ``uniform_samples[b, i]`` is within
    rounding (a relative ~1e-6) of h_i, or the bonus's ``u * total`` within ``BONUS_CDF_EPSILON * total`` of
    a cumulative-mass boundary of its row (then the bonus may differ, never to a token of zero mass).

    One launch, one program per request: a scalar loop over the chain with two streaming passes per node
    (row totals, then m_i), then the bonus row written to a (B, V) fp32 scratch and drawn from by a blocked
    inverse-CDF scan. The caller guarantees the chain layout (node i's child is i+1); ``predict`` is written
    at the request's flat indices ``retrieve_index[b]`` (a permutation of ``0 .. B*W-1``).
    """
    B, W = check_tree_args(candidates, retrieve_index, retrieve_index, retrieve_index, num_steps)
    V = check_draft_probs_args(B, W, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                               draft_probs, candidates.device)
    return _launch_chain_speculative_sampling_block(
        candidates, retrieve_index, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
        num_steps, B, W, V,
    )
