"""Triton version of Traversal Verification (``reference.traversal``).

Same name, signature, outputs and argument checks as ``reference.traversal``, and the conventions of
`fast.rejection` (read its module docstring): one kernel launch, one program per request that writes
every output slot itself, the launcher reads no tensor value on the host, float32 scratch rows from
``torch.empty`` streamed in blocks of ``BLOCK_V`` with running fp32 sums, CTA barriers after every pass
that writes the scratch and before every pass that overwrites it, ``div_rn`` divisions, no FMA
contraction. Its streaming helpers and its inverse-CDF draw are reused from there.

What differs: the walk keeps the whole current path, not one node. The program's scratch is a stack of
S + 1 levels, each a pair of rows (the level's residual P and proposal law Q, both normalised as the
reference normalises: clamped at 0, divided by the total clamped at 1e-30); the level's node, weight w
and next child to try are ``next_power_of_two(S+1)``-lane register vectors. Descending into a child
writes the child's two normalised rows to the level above (a totals pass, then a write pass); a rejected
leaf rewrites its parent's rows in place in two passes (the totals m = sum max(0, w P - Q) and sum of Q
without the leaf's token, then the rewrite divided by them). One action per iteration (skip a child,
descend, or test a leaf), at most 3W iterations: the walk the reference's docstring describes, which the
reference itself computes in another order (every node's test weight first). The bonus is drawn from the
accepted level's P (its node's normalised target row when P is empty).

Equivalence: as `fast.rejection`'s. Every elementwise value is the reference's operation for operation;
the totals over V (each row's normaliser, m) are block sums, so an accept coin within rounding (a
relative ~1e-6) of its weight, or the bonus's ``u * total`` within ``BONUS_CDF_EPSILON * total`` of a
cumulative-mass boundary, may decide differently; nothing else does.

Notation as in ``reference.traversal``: B batch, W tree size (root included), S ``num_steps``, V vocab.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.ops.op_checks import check_draft_probs_args, check_tree_args

from .rejection import BLOCK_V, _inverse_cdf, _launch_tree_sampler, _normalised_block, _row_total, _row_totals

__all__ = ["tree_speculative_sampling_traversal"]


@triton.jit
def _lane(vec, slot, i):
    """Lane ``i`` of a register vector, as a scalar (the other lanes add exact zeros)."""
    return tl.sum(tl.where(slot == i, vec, 0), axis=0)


@triton.jit
def _write_level(p_row, q_row, P_ptr, Q_ptr, V, BLOCK_V: tl.constexpr):
    """A node's target and draft rows, normalised, into a level's P and Q scratch rows -> P's total."""
    p_sum, q_sum = _row_totals(p_row, q_row, V, BLOCK_V)
    p_div = tl.maximum(p_sum, 1e-30)
    q_div = tl.maximum(q_sum, 1e-30)
    tl.debug_barrier()  # every warp has done its scalar loads of the rows this overwrites
    offs0 = tl.arange(0, BLOCK_V)
    total = tl.zeros([], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + offs0
        p = _normalised_block(p_row, offs, V, p_div)
        tl.store(P_ptr + offs, p, mask=offs < V)
        tl.store(Q_ptr + offs, _normalised_block(q_row, offs, V, q_div), mask=offs < V)
        total += tl.sum(p, axis=0)
    tl.debug_barrier()  # the next reader may be another thread (a scalar load, a differently laid-out pass)
    return total


@triton.jit
def _reject_into_parent(P_ptr, Q_ptr, w, token, V, BLOCK_V: tl.constexpr):
    """In place at the parent level, after its child with ``token`` was rejected: with r = max(0, w P - Q)
    and m = sum r, P <- r / m and Q loses ``token`` (renormalised) -> the parent's new weight m / (m + 1 - w)
    (0 when m = 0)."""
    tl.debug_barrier()
    offs0 = tl.arange(0, BLOCK_V)
    m = tl.zeros([], dtype=tl.float32)
    q_sum = tl.zeros([], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        offs = start + offs0
        p = tl.load(P_ptr + offs, mask=offs < V, other=0.0)
        q = tl.load(Q_ptr + offs, mask=offs < V, other=0.0)
        m += tl.sum(tl.maximum(w * p - q, 0.0), axis=0)
        q_sum += tl.sum(tl.maximum(tl.where(offs == token, 0.0, q), 0.0), axis=0)
    m_div = tl.maximum(m, 1e-30)
    q_div = tl.maximum(q_sum, 1e-30)
    tl.debug_barrier()  # every warp has read the rows before any of them is overwritten
    for start in range(0, V, BLOCK_V):
        offs = start + offs0
        p = tl.load(P_ptr + offs, mask=offs < V, other=0.0)
        q = tl.load(Q_ptr + offs, mask=offs < V, other=0.0)
        tl.store(P_ptr + offs, tl.math.div_rn(tl.maximum(w * p - q, 0.0), m_div), mask=offs < V)
        q = tl.maximum(tl.where(offs == token, 0.0, q), 0.0)
        tl.store(Q_ptr + offs, tl.math.div_rn(q, q_div), mask=offs < V)
    tl.debug_barrier()  # the next child's P(x), Q(x) are scalar loads, from whichever thread
    return tl.where(m > 0, tl.minimum(tl.math.div_rn(m, tl.maximum(m + (1.0 - w), 1e-30)), 1.0), 0.0)


@triton.jit
def tree_speculative_sampling_traversal_kernel(
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
    # level l's P row at stack + 2 l V, its Q row V further
    stack = scratch_ptr + b * (num_steps + 1) * 2 * V
    slot = tl.arange(0, BLOCK_S1)
    level_node = tl.zeros([BLOCK_S1], dtype=tl.int64)
    level_w = tl.full([BLOCK_S1], 1.0, dtype=tl.float32)
    level_next = tl.where(slot == 0, tl.load(retrieve_next_token_ptr + base).to(tl.int64), -1)
    _write_level(target_probs_ptr + base * V, draft_probs_ptr + base * V, stack, stack + V, V, BLOCK_V)

    depth = tl.zeros([], dtype=tl.int64)
    done = tl.zeros([], dtype=tl.int32)
    steps = tl.zeros([], dtype=tl.int64)
    while (done == 0) & (steps < 3 * W):
        here = _lane(level_node, slot, depth)
        w = _lane(level_w, slot, depth)
        child = _lane(level_next, slot, depth)
        P_ptr = stack + depth * 2 * V
        if (child >= 0) & (depth < num_steps):
            in_tree = child < W
            token = tl.load(candidates_ptr + base + child, mask=in_tree, other=-1).to(tl.int64)
            in_vocab = (token >= 0) & (token < V)
            q_x = tl.load(P_ptr + V + token, mask=in_vocab, other=0.0)
            if q_x > 0:
                # descend: w_c = min(1, w P(x) / Q(x)), the child's rows pushed one level up
                p_x = tl.load(P_ptr + token)
                w_child = tl.minimum(tl.math.div_rn(w * p_x, tl.maximum(q_x, 1e-30)), 1.0)
                depth += 1
                level_node = tl.where(slot == depth, child, level_node)
                level_w = tl.where(slot == depth, w_child, level_w)
                level_next = tl.where(slot == depth, tl.load(retrieve_next_token_ptr + base + child).to(tl.int64),
                                      level_next)
                _write_level(target_probs_ptr + (base + child) * V, draft_probs_ptr + (base + child) * V,
                             P_ptr + 2 * V, P_ptr + 3 * V, V, BLOCK_V)
            else:
                # Q(x) = 0: not a draw (the row ran out of mass), skipped
                sibling = tl.load(retrieve_next_sibling_ptr + base + child, mask=in_tree, other=-1).to(tl.int64)
                level_next = tl.where(slot == depth, sibling, level_next)
        else:
            # a leaf: the path root..here is accepted at the root or when its coin is below w
            coin = tl.load(uniform_samples_ptr + base + here).to(tl.float32)
            accept = (depth == 0) | (coin < w)
            if accept:
                done = accept.to(tl.int32)
            else:
                parent = depth - 1
                token = tl.load(candidates_ptr + base + here).to(tl.int64)
                w_parent = _reject_into_parent(P_ptr - 2 * V, P_ptr - V, _lane(level_w, slot, parent), token, V,
                                               BLOCK_V)
                level_w = tl.where(slot == parent, w_parent, level_w)
                sibling = tl.load(retrieve_next_sibling_ptr + base + here).to(tl.int64)
                level_next = tl.where(slot == parent, sibling, level_next)
                depth = parent
        steps += 1

    # the bonus: from the accepted level's P, or its node's full normalised target row when P is empty
    P_ptr = stack + depth * 2 * V
    last = _lane(level_node, slot, depth)
    total = _row_total(P_ptr, V, BLOCK_V)
    if total <= 0:
        total = _write_level(target_probs_ptr + (base + last) * V, draft_probs_ptr + (base + last) * V, P_ptr,
                             P_ptr + V, V, BLOCK_V)
    bonus = _inverse_cdf(P_ptr, V, total, tl.load(uniform_final_ptr + b).to(tl.float32), BLOCK_V)

    # level l's node predicts level l+1's token, the last one the bonus; every other node -1
    node = tl.arange(0, BLOCK_W)
    predict = tl.full([BLOCK_W], -1, dtype=tl.int64)
    for level in range(0, depth + 1):
        value = bonus
        if level < depth:
            value = tl.load(candidates_ptr + base + _lane(level_node, slot, level + 1)).to(tl.int64)
        predict = tl.where(node == _lane(level_node, slot, level), value, predict)
    on_path = slot <= depth
    accept_index = tl.load(retrieve_index_ptr + base + level_node, mask=on_path, other=-1).to(tl.int64)
    ri = tl.load(retrieve_index_ptr + base + node, mask=node < W, other=-1).to(tl.int64)
    # a padded node (retrieve_index -1) claims no slot: its own, b*W + i, is -1 as in the reference
    tl.store(predict_ptr + base + node, tl.full([BLOCK_W], -1, dtype=tl.int32), mask=(node < W) & (ri < 0))
    tl.debug_barrier()  # a node's flat index may be another padded node's own slot: the store below wins
    ri_valid = (node < W) & (ri >= 0) & (ri < B * W)
    tl.store(predict_ptr + ri, predict.to(tl.int32), mask=ri_valid)
    tl.store(accept_index_ptr + b * (num_steps + 1) + slot, accept_index.to(tl.int32), mask=slot <= num_steps)
    tl.store(accept_length_ptr + b, depth.to(tl.int32))


def _launch_tree_speculative_sampling_traversal(*args, block_v=BLOCK_V):
    """args: the op's arguments, then B, W, V. Scratch: a P and a Q row per level of the path, S + 1 levels."""
    num_steps = args[8]
    return _launch_tree_sampler(tree_speculative_sampling_traversal_kernel, 2 * (num_steps + 1), *args,
                                block_v=block_v)


def tree_speculative_sampling_traversal(
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

    Same semantics as ``reference.traversal.tree_speculative_sampling_traversal`` (Traversal Verification):
    each level of the current path holds a weight w, a residual P and a proposal law Q (the root: w = 1, its
    normalised target and draft rows). The walk goes down in sibling order, at most S deep; entering child c
    with token x sets w_c = min(1, w_y P_y(x) / Q_y(x)), a child with Q_y(x) = 0 is skipped. A leaf c is
    accepted when ``uniform_samples[b, c] < w_c`` (the root always); else its parent y takes r = max(0, w_y P_y
    - Q_y), P_y = r / sum r, w_y = m / (m + 1 - w_y) with m = sum r (0 when m = 0), Q_y loses x (renormalised),
    and the walk goes on at c's next sibling. The bonus is the first token whose cumulative mass in the
    accepted node's P is strictly greater than ``u * total`` (``u = uniform_samples_for_final_sampling[b]``),
    from its full normalised target row if P is empty, with `fast.rejection`'s fallbacks. Float32 arithmetic.

    Equivalence: elementwise values as the reference's (correctly rounded divisions, no FMA); the totals over
    V are block sums, so the outputs equal the reference's except where an accept coin is within rounding (a
    relative ~1e-6) of its weight, or the bonus's ``u * total`` within ``BONUS_CDF_EPSILON * total`` of a
    cumulative-mass boundary of its row (then the bonus may differ, never to a token of zero mass).

    One launch, one program per request: a scalar walk of at most 3W actions over a (B, S+1, 2, V) fp32
    scratch stack the launcher allocates uninitialised (two streaming passes per descent or rejection), then a
    blocked inverse-CDF scan for the bonus. ``predict`` is written at the request's flat indices
    ``retrieve_index[b]`` (a permutation of ``0 .. B*W-1`` from ``build_tree_kernel_efficient``); a padded
    node off the path, ``retrieve_index[b, i] = -1``, gets -1 at its own slot ``b*W + i`` instead.
    """
    B, W = check_tree_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, num_steps)
    V = check_draft_probs_args(B, W, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                               draft_probs, candidates.device)
    return _launch_tree_speculative_sampling_traversal(
        candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, uniform_samples,
        uniform_samples_for_final_sampling, target_probs, draft_probs, num_steps, B, W, V,
    )
