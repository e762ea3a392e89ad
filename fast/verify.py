"""Triton versions of EAGLE's tree verification (greedy and lossless tree sampling).

Same names, signatures, outputs and semantics as ``reference.verify``. Each op is one kernel launch
with one program per request; the program writes every output slot itself (no fill launches beside
it) and the launchers read no tensor value on the host.

A program walks the request's tree with scalar loop state, reading each examined child's token,
links, flat index and coin (and one target probability) with scalar loads: the walk touches a few
cache lines per depth. Outputs indexed by node or by accepted slot are built in registers (vectors of
``next_power_of_two(W)`` and ``next_power_of_two(S+1)`` lanes) and stored once. The sampling kernel
then streams the final node's target row through the vocabulary in blocks of ``BLOCK_V`` (a blocked
cumulative sum with a running carry) to total the residual and draw the bonus token; nothing of size
V is ever stored.

Notation as in ``reference.verify``: B batch, W tree size (root included), S ``num_steps``, V vocab.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from specdec.ops.op_checks import check_sampling_args, check_tree_args, check_verify_greedy_args

__all__ = [
    "BONUS_CDF_EPSILON",
    "tree_speculative_sampling_target_only",
    "verify_tree_greedy",
]

#: Vocabulary block streamed per iteration by the sampling kernel.
BLOCK_V = 4096

#: The bonus token may differ from the reference's only when ``u * total`` lies within
#: ``BONUS_CDF_EPSILON * total`` of a cumulative-mass boundary of the residual (``total``: its mass).
#: First-order worst case, with e = 2^-24 and non-negative terms (error <= depth * e * total): the
#: compiled scan's cumulative mass at a token has depth <= V/BLOCK_V (running carry) + 12 (block
#: sum) + ~29 (tl.cumsum: 16 elements per thread, a warp, 8 warps) + 1; the threshold ``u * total``
#: carries the total's error and one rounding; torch's cumsum adds a few e (CPU: double
#: accumulation; CUDA: an fp32 scan of depth ~log V). For V <= 2^19 that is <= ~320 e = 1.9e-5,
#: under 3e-5 (V <= 2^18, every current vocabulary: ~190 e). Under TRITON_INTERPRET the in-block
#: scan is numpy's sequential one, deeper in the worst case; the errors actually observed (random
#: signs) are orders of magnitude below the bound either way.
BONUS_CDF_EPSILON = 3e-5


@triton.jit
def verify_tree_greedy_kernel(
    candidates_ptr,
    retrieve_index_ptr,
    retrieve_next_token_ptr,
    retrieve_next_sibling_ptr,
    target_predict_ptr,
    predict_ptr,
    accept_index_ptr,
    accept_length_ptr,
    B,
    W,
    num_steps,
    BLOCK_W: tl.constexpr,
    BLOCK_S1: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    base = b * W
    node = tl.arange(0, BLOCK_W)
    ri = tl.load(retrieve_index_ptr + base + node, mask=node < W, other=-1).to(tl.int64)
    ri_valid = (node < W) & (ri >= 0) & (ri < B * W)
    # the target's token at every node, read at the node's flat index like the reference
    target = tl.load(target_predict_ptr + ri, mask=ri_valid, other=0).to(tl.int64)

    slot = tl.arange(0, BLOCK_S1)
    cur_flat = tl.load(retrieve_index_ptr + base).to(tl.int64)
    accept_index = tl.where(slot == 0, cur_flat, -1)
    accepted = node == 0
    child = tl.load(retrieve_next_token_ptr + base).to(tl.int64)
    depth = tl.zeros([], dtype=tl.int64)
    steps = tl.zeros([], dtype=tl.int64)
    # the reference examines one child per round for W-1 rounds; this walk stops at the first round
    # that would change nothing
    while (child >= 0) & (depth < num_steps) & (steps < W - 1):
        in_tree = child < W
        token = tl.load(candidates_ptr + base + child, mask=in_tree, other=0).to(tl.int64)
        child_flat = tl.load(retrieve_index_ptr + base + child, mask=in_tree, other=-1).to(tl.int64)
        wanted = tl.load(
            target_predict_ptr + cur_flat, mask=(cur_flat >= 0) & (cur_flat < B * W), other=0
        ).to(tl.int64)
        match = token == wanted
        accept_index = tl.where(tl.where(match, slot == depth + 1, False), child_flat, accept_index)
        accepted = accepted | tl.where(match, node == child, False)
        depth += match.to(tl.int64)
        cur_flat = tl.where(match, child_flat, cur_flat)
        child = tl.where(
            match,
            tl.load(retrieve_next_token_ptr + base + child, mask=in_tree, other=-1).to(tl.int64),
            tl.load(retrieve_next_sibling_ptr + base + child, mask=in_tree, other=-1).to(tl.int64),
        )
        steps += 1

    # every accepted node predicts the target's token; the last one's is the bonus
    tl.store(predict_ptr + ri, tl.where(accepted, target, -1).to(tl.int32), mask=ri_valid)
    tl.store(accept_index_ptr + b * (num_steps + 1) + slot, accept_index.to(tl.int32), mask=slot <= num_steps)
    tl.store(accept_length_ptr + b, depth.to(tl.int32))


def _verify_outputs(B, W, num_steps, device):
    """Both verifies' outputs, allocated uninitialised: their kernels write every entry."""
    return (torch.empty(B * W, dtype=torch.int32, device=device),
            torch.empty(B, num_steps + 1, dtype=torch.int32, device=device),
            torch.empty(B, dtype=torch.int32, device=device))


def _launch_verify_tree_greedy(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling,
                               target_predict, num_steps, B, W):
    device = candidates.device
    predict, accept_index, accept_length = _verify_outputs(B, W, num_steps, device)
    if B > 0:
        verify_tree_greedy_kernel[(B,)](
            candidates.contiguous(),
            retrieve_index.contiguous(),
            retrieve_next_token.contiguous(),
            retrieve_next_sibling.contiguous(),
            target_predict.contiguous(),
            predict,
            accept_index,
            accept_length,
            B,
            W,
            num_steps,
            BLOCK_W=triton.next_power_of_2(W),
            BLOCK_S1=triton.next_power_of_2(num_steps + 1),
            num_warps=1,
        )
    return predict, accept_index, accept_length


def verify_tree_greedy(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    num_steps: int,
):
    """candidates (B, W), retrieve_index (B, W), retrieve_next_token (B, W), retrieve_next_sibling
    (B, W), target_predict (B, W). Returns ``(predict (B*W,) int32, accept_index (B, S+1) int32,
    accept_length (B,) int32)`` with S = ``num_steps``.

    Same semantics as ``reference.verify.verify_tree_greedy``: from the root, at each depth accept
    the first child (in sibling order) whose token equals ``target_predict`` at the current node
    (read at its flat index ``retrieve_index``); stop at the first depth with no match, at a node
    without children, or after S accepted tokens. ``predict`` holds ``target_predict`` at every
    accepted node and -1 elsewhere.

    One launch, one program per request (a single warp: the walk is scalar). The program writes
    ``predict`` at the request's flat indices ``retrieve_index[b]``, so every slot is written once when
    ``retrieve_index`` is a permutation of ``0 .. B*W-1`` (``build_tree_kernel_efficient`` makes it
    ``b*W + i``).
    """
    B, W = check_verify_greedy_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling,
                                    target_predict, num_steps)
    return _launch_verify_tree_greedy(
        candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, target_predict, num_steps, B, W
    )


# --------------------------------------------------------------------------------------------
# tree speculative sampling (target only: deterministic draft)
# --------------------------------------------------------------------------------------------


@triton.jit
def _residual_block(row_ptr, offs, V, candidates_ptr, retrieve_next_sibling_ptr, base, W, first_rejected,
                    num_rejected):
    """The final node's residual over the vocabulary block ``offs``: its target row in fp32, clamped
    at 0, with the tokens of the first ``num_rejected`` children of the sibling chain that starts at
    node ``first_rejected`` zeroed (scalar loads: the chain is short and stays in cache)."""
    x = tl.maximum(tl.load(row_ptr + offs, mask=offs < V, other=0.0).to(tl.float32), 0.0)
    c = first_rejected
    for _ in range(num_rejected):
        token = tl.load(candidates_ptr + base + c, mask=(c >= 0) & (c < W), other=-1).to(tl.int64)
        x = tl.where(offs == token, 0.0, x)
        c = tl.load(retrieve_next_sibling_ptr + base + c, mask=(c >= 0) & (c < W), other=-1).to(tl.int64)
    return x


@triton.jit
def tree_speculative_sampling_target_only_kernel(
    candidates_ptr,
    retrieve_index_ptr,
    retrieve_next_token_ptr,
    retrieve_next_sibling_ptr,
    uniform_samples_ptr,
    uniform_final_ptr,
    target_probs_ptr,
    predict_ptr,
    accept_index_ptr,
    accept_length_ptr,
    B,
    W,
    V,
    num_steps,
    threshold_single,
    threshold_acc,
    inv_threshold_acc,
    BLOCK_W: tl.constexpr,
    BLOCK_S1: tl.constexpr,
    BLOCK_V: tl.constexpr,
    DIVIDE_BY_RECIPROCAL: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    base = b * W
    node = tl.arange(0, BLOCK_W)
    ri = tl.load(retrieve_index_ptr + base + node, mask=node < W, other=-1).to(tl.int64)

    slot = tl.arange(0, BLOCK_S1)
    accept_index = tl.where(slot == 0, tl.load(retrieve_index_ptr + base).to(tl.int64), -1)
    predict = tl.full([BLOCK_W], -1, dtype=tl.int64)
    cur = tl.zeros([], dtype=tl.int64)
    child = tl.load(retrieve_next_token_ptr + base).to(tl.int64)
    depth = tl.zeros([], dtype=tl.int64)
    steps = tl.zeros([], dtype=tl.int64)
    prob_acc = tl.zeros([], dtype=tl.float32)
    coin = tl.load(uniform_samples_ptr + base).to(tl.float32)
    # the children rejected at the current node: the first num_rejected of its sibling chain
    first_rejected = child
    num_rejected = tl.zeros([], dtype=tl.int64)
    while (child >= 0) & (depth < num_steps) & (steps < W - 1):
        in_tree = child < W
        token = tl.load(candidates_ptr + base + child, mask=in_tree, other=-1).to(tl.int64)
        p = tl.load(
            target_probs_ptr + (base + cur) * V + token, mask=(token >= 0) & (token < V), other=0.0
        ).to(tl.float32)
        # the reference's fp32 operations in the reference's order: bit-identical decisions
        prob_acc = prob_acc + p
        if DIVIDE_BY_RECIPROCAL:
            # torch on CUDA divides by a Python scalar as a product with its fp32 reciprocal
            bound = prob_acc * inv_threshold_acc
        else:
            bound = tl.math.div_rn(prob_acc, threshold_acc)
        accept = (coin < bound) | (p >= threshold_single)
        # vector conditions under a scalar one are written as tl.where: Triton's interpreter cannot
        # broadcast a scalar from a float comparison through `&`
        predict = tl.where(tl.where(accept, node == cur, False), token, predict)
        child_flat = tl.load(retrieve_index_ptr + base + child, mask=in_tree, other=-1).to(tl.int64)
        accept_index = tl.where(tl.where(accept, slot == depth + 1, False), child_flat, accept_index)
        depth += accept.to(tl.int64)
        next_child = tl.where(
            accept,
            tl.load(retrieve_next_token_ptr + base + child, mask=in_tree, other=-1).to(tl.int64),
            tl.load(retrieve_next_sibling_ptr + base + child, mask=in_tree, other=-1).to(tl.int64),
        )
        coin = tl.where(
            accept, tl.load(uniform_samples_ptr + base + child, mask=in_tree, other=0.0).to(tl.float32), coin
        )
        cur = tl.where(accept, child, cur)
        prob_acc = tl.where(accept, 0.0, prob_acc)
        first_rejected = tl.where(accept, next_child, first_rejected)
        num_rejected = tl.where(accept, 0, num_rejected + 1)
        child = next_child
        steps += 1

    # bonus, pass 1: the residual's total; an empty residual (all the mass on rejected children, by
    # rounding) falls back to the full row, whose total a second loop computes only in that case
    row_ptr = target_probs_ptr + (base + cur) * V
    offs0 = tl.arange(0, BLOCK_V)
    total = tl.zeros([], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        x = _residual_block(row_ptr, start + offs0, V, candidates_ptr, retrieve_next_sibling_ptr, base, W,
                            first_rejected, num_rejected)
        total += tl.sum(x, axis=0)
    from_row = total <= 0
    num_rejected = tl.where(from_row, 0, num_rejected)
    for start in range(0, tl.where(from_row, V, 0), BLOCK_V):
        x = _residual_block(row_ptr, start + offs0, V, candidates_ptr, retrieve_next_sibling_ptr, base, W,
                            first_rejected, num_rejected)
        total += tl.sum(x, axis=0)

    # pass 2: inverse CDF, the first positive token whose cumulative mass exceeds u * total (a blocked
    # scan with a running carry, stopping at the block that holds it)
    threshold = tl.load(uniform_final_ptr + b).to(tl.float32) * total
    carry = tl.zeros([], dtype=tl.float32)
    bonus = tl.zeros([], dtype=tl.int64) + V
    start = tl.zeros([], dtype=tl.int64)
    while (start < V) & (bonus == V):
        offs = start + offs0
        x = _residual_block(row_ptr, offs, V, candidates_ptr, retrieve_next_sibling_ptr, base, W,
                            first_rejected, num_rejected)
        cdf = carry + tl.cumsum(x, axis=0)
        bonus = tl.min(tl.where((cdf > threshold) & (x > 0), offs, V), axis=0).to(tl.int64)
        carry += tl.sum(x, axis=0)
        start += BLOCK_V
    # u * total rounding up to the total: the last positive token; an all-zero row: V-1
    last_positive = tl.full([], -1, dtype=tl.int64)
    for start in range(0, tl.where(bonus == V, V, 0), BLOCK_V):
        offs = start + offs0
        x = _residual_block(row_ptr, offs, V, candidates_ptr, retrieve_next_sibling_ptr, base, W,
                            first_rejected, num_rejected)
        last_positive = tl.maximum(last_positive, tl.max(tl.where(x > 0, offs, -1), axis=0).to(tl.int64))
    bonus = tl.where(bonus == V, tl.where(last_positive >= 0, last_positive, V - 1), bonus)
    predict = tl.where(node == cur, bonus, predict)

    ri_valid = (node < W) & (ri >= 0) & (ri < B * W)
    tl.store(predict_ptr + ri, predict.to(tl.int32), mask=ri_valid)
    tl.store(accept_index_ptr + b * (num_steps + 1) + slot, accept_index.to(tl.int32), mask=slot <= num_steps)
    tl.store(accept_length_ptr + b, depth.to(tl.int32))


def _launch_tree_speculative_sampling(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling,
                                      uniform_samples, uniform_samples_for_final_sampling, target_probs,
                                      num_steps, threshold_single, threshold_acc, B, W, V, block_v=BLOCK_V):
    device = candidates.device
    predict, accept_index, accept_length = _verify_outputs(B, W, num_steps, device)
    if B > 0:
        tree_speculative_sampling_target_only_kernel[(B,)](
            candidates.contiguous(),
            retrieve_index.contiguous(),
            retrieve_next_token.contiguous(),
            retrieve_next_sibling.contiguous(),
            uniform_samples.contiguous(),
            uniform_samples_for_final_sampling.contiguous(),
            target_probs.contiguous(),
            predict,
            accept_index,
            accept_length,
            B,
            W,
            V,
            num_steps,
            float(threshold_single),
            float(threshold_acc),
            float(np.float32(1.0) / np.float32(threshold_acc)) if threshold_acc > 0 else float("inf"),
            BLOCK_W=triton.next_power_of_2(W),
            BLOCK_S1=triton.next_power_of_2(num_steps + 1),
            BLOCK_V=min(block_v, triton.next_power_of_2(V)),
            DIVIDE_BY_RECIPROCAL=device.type == "cuda",
            num_warps=8,
            enable_fp_fusion=False,
        )
    return predict, accept_index, accept_length


def tree_speculative_sampling_target_only(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    num_steps: int,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
):
    """candidates (B, W), retrieve_index (B, W), retrieve_next_token (B, W), retrieve_next_sibling
    (B, W), uniform_samples (B, W), uniform_samples_for_final_sampling (B,), target_probs (B, W, V).
    Returns ``(predict (B*W,) int32, accept_index (B, S+1) int32, accept_length (B,) int32)`` with
    S = ``num_steps``.

    Same semantics as ``reference.verify.tree_speculative_sampling_target_only``: the walk tries the
    children in sibling order, accepting child x when ``coin < prob_acc / threshold_acc`` (strict) or
    ``p(x) >= threshold_single``; the rejected children's mass is removed from the current node's
    residual; the bonus is the first token whose cumulative residual mass is strictly greater than
    ``u * total`` (``u = uniform_samples_for_final_sampling[b]``), with the reference's fallbacks: an
    empty residual samples the full row, ``u * total`` rounding up to the total takes the last
    positive token, an all-zero row gives V-1. Arithmetic in float32 whatever the input dtypes.

    Equivalence: ``accept_index`` and ``accept_length`` (and every predicted draft token) are
    bit-identical to the reference's, because an accept decision depends only on a few
    probabilities added in the reference's order (on CUDA the division by ``threshold_acc`` is, like
    torch's, a multiplication by its fp32 reciprocal). The bonus token is drawn by a blocked fp32
    scan, which cannot equal ``torch.cumsum`` bit for bit: it may differ from the reference's only
    when ``u * total`` lies within ``BONUS_CDF_EPSILON * total`` of a cumulative-mass boundary of
    the residual (``BONUS_CDF_EPSILON = 3e-5``, a worst-case bound for V <= 2^19); it is never a
    token of zero residual mass.

    One launch, one program per request: a scalar walk of the tree, then two streaming passes over
    the final node's target row in blocks of ``BLOCK_V`` (the residual's total; then the cumulative
    sum with a running carry, stopping at the block that holds the bonus). No temporary of size V:
    the rejected children are remembered as (first child tried at the current node, count) and their
    tokens re-read along the sibling chain. That equals the reference's record of rejections whenever
    the walk never re-enters a node it left, i.e. for any links derived from parent pointers (every
    output of ``build_tree_kernel_efficient``, malformed input included); hand-made cyclic links may
    change the bonus. ``predict`` is written at the request's flat indices ``retrieve_index[b]`` (a
    permutation of ``0 .. B*W-1`` from ``build_tree_kernel_efficient``).
    """
    B, W = check_tree_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, num_steps)
    V = check_sampling_args(
        B,
        W,
        uniform_samples,
        uniform_samples_for_final_sampling,
        target_probs,
        threshold_single,
        threshold_acc,
        device=candidates.device,
    )
    return _launch_tree_speculative_sampling(
        candidates,
        retrieve_index,
        retrieve_next_token,
        retrieve_next_sibling,
        uniform_samples,
        uniform_samples_for_final_sampling,
        target_probs,
        num_steps,
        threshold_single,
        threshold_acc,
        B,
        W,
        V,
    )
