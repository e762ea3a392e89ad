"""Triton versions of the target distribution's ops: softmax with temperature and SGLang's
(FlashInfer's) sampling filters ``top_k_renorm_prob`` and ``top_p_renorm_prob``.

Same names, signatures and contracts as ``reference.sampling``. One program per row; every kernel
walks the vocabulary in constexpr power-of-two blocks, masked at the ragged end.

The filters never sort. A filter keeps exactly the tokens with p >= t for a threshold t, found by a
radix search over the IEEE bit patterns of the fp32 probabilities: for non-negative floats the
order of the bit patterns (as integers) is the order of the values, so the search runs on integers
in [0, bits(+inf)] (fewer than 2^31 values). Each pass splits the current interval into ``RADIX``
pivots and counts, in one blocked pass over the row, ``#{p >= pivot}`` and ``sum{p : p >= pivot}``
for all of them at once, then keeps the sub-interval where the predicate flips:

* top-k: t is the largest pivot with ``#{p >= t} >= k``, i.e. exactly the k-th largest value;
* top-p: t is the largest pivot with ``sum{p >= t} > top_p``; a token v is then kept iff
  ``sum{p > p(v)} = sum{p >= next_float(p(v))} <= top_p``, the reference's rule.

With RADIX = 16, 8 passes narrow 2^31 bit patterns to one; the last pass has width-one pivots, so
its mass at the chosen pivot is the kept mass and the renormalisation needs no extra pass. A final
pass writes ``p / kept_mass`` or 0: 9 reads and one write of the row in all, as FlashInfer's pivot
search, instead of a sort.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.ops.op_checks import check_renorm_prob_args, check_softmax_with_temperature_args

__all__ = ["softmax_with_temperature", "top_k_renorm_prob", "top_p_renorm_prob"]

BLOCK_V = 1024
FILTER_BLOCK_V = 512
RADIX = 16
# ceil(log_16(bits(+inf) + 1)): after this many passes the search interval holds one bit pattern.
SEARCH_PASSES = 8
FILTER_NUM_WARPS = 8


# --------------------------------------------------------------------------------------------
# softmax with temperature
# --------------------------------------------------------------------------------------------


@triton.jit
def softmax_with_temperature_kernel(logits_ptr, temperatures_ptr, probs_ptr, V, stride_logits,
                                    BLOCK_V: tl.constexpr):
    """One program per row: an online max / sum pass over V, then a pass that writes the row."""
    row = tl.program_id(0).to(tl.int64)
    logits_row = logits_ptr + row * stride_logits
    probs_row = probs_ptr + row * V
    temperature = tl.load(temperatures_ptr + row).to(tl.float32)
    offsets = tl.arange(0, BLOCK_V)

    running_max = tl.full([], float("-inf"), tl.float32)
    running_sum = tl.zeros([], tl.float32)
    for start in range(0, V, BLOCK_V):
        idx = start + offsets
        # div_rn: the compiled default fp32 division is approximate, torch's is correctly rounded
        x = tl.math.div_rn(tl.load(logits_row + idx, mask=idx < V, other=float("-inf")).to(tl.float32),
                           temperature)
        new_max = tl.maximum(running_max, tl.max(x, axis=0))
        # while every logit so far is -inf, subtract 0 instead: exp(-inf - -inf) would be NaN
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        running_sum = running_sum * tl.exp(running_max - shift) + tl.sum(tl.exp(x - shift), axis=0)
        running_max = new_max

    shift = tl.where(running_max == float("-inf"), 0.0, running_max)
    for start in range(0, V, BLOCK_V):
        idx = start + offsets
        mask = idx < V
        x = tl.math.div_rn(tl.load(logits_row + idx, mask=mask, other=float("-inf")).to(tl.float32), temperature)
        tl.store(probs_row + idx, tl.math.div_rn(tl.exp(x - shift), running_sum), mask=mask)


def _launch_softmax_with_temperature(logits, temperatures):
    N, V = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    probs = torch.empty((N, V), dtype=torch.float32, device=logits.device)
    if N > 0:
        softmax_with_temperature_kernel[(N,)](logits, temperatures.contiguous(), probs, V, logits.stride(0),
                                              BLOCK_V=BLOCK_V)
    return probs


def softmax_with_temperature(logits, temperatures):
    """logits: (N, V) fp32/bf16/fp16; temperatures: (N,) float -> probs (N, V) fp32.

    softmax(logits / T) per row, computed in fp32 from the upcast logits. A -inf logit gets
    probability 0; a row that is all -inf is NaN, as in torch.softmax. T > 0 is trusted.
    """
    check_softmax_with_temperature_args(logits, temperatures)
    return _launch_softmax_with_temperature(logits, temperatures)


# --------------------------------------------------------------------------------------------
# the filters: radix search for the threshold, then one renormalising write
# --------------------------------------------------------------------------------------------


@triton.jit
def _search_threshold(probs_row, V, min_count, mass_above, BY_COUNT: tl.constexpr, BLOCK_V: tl.constexpr,
                      RADIX: tl.constexpr, PASSES: tl.constexpr):
    """-> (t, kept_mass): the largest fp32 t >= 0 whose predicate holds (0 when none does) and the
    blocked fp32 sum of the row's p >= t.

    The predicate is #{p >= t} >= min_count (BY_COUNT) or sum{p >= t} > mass_above; both only turn
    false as t grows. Invariant: the predicate holds at `lo` (or lo = 0) and fails at `hi`.
    """
    lanes = tl.arange(0, RADIX)
    offsets = tl.arange(0, BLOCK_V)
    lo = tl.zeros([], tl.int64)
    hi = tl.full([], 0x7F800001, tl.int64)  # one past bits(+inf)
    kept_mass = tl.zeros([], tl.float32)
    for _ in range(PASSES):
        step = (hi - lo + RADIX - 1) // RADIX
        pivot_bits = lo + lanes.to(tl.int64) * step
        in_interval = pivot_bits < hi
        pivots = tl.minimum(pivot_bits, 0x7F800000).to(tl.int32).to(tl.float32, bitcast=True)
        counts = tl.zeros((RADIX,), tl.int32)
        masses = tl.zeros((RADIX,), tl.float32)
        for start in range(0, V, BLOCK_V):
            idx = start + offsets
            # padding reads -1, below every pivot (pivots are >= 0)
            p = tl.load(probs_row + idx, mask=idx < V, other=-1.0)
            at_or_above = p[:, None] >= pivots[None, :]
            counts += tl.sum(at_or_above.to(tl.int32), axis=0)
            masses += tl.sum(tl.where(at_or_above, p[:, None], 0.0), axis=0)
        if BY_COUNT:
            holds = counts >= min_count
        else:
            holds = masses > mass_above
        holds = (holds & in_interval) | (lanes == 0)
        chosen = tl.max(tl.where(holds, lanes, 0), axis=0)
        kept_mass = tl.sum(tl.where(lanes == chosen, masses, 0.0), axis=0)
        new_lo = lo + chosen.to(tl.int64) * step
        hi = tl.minimum(new_lo + step, hi)
        lo = new_lo
    return lo.to(tl.int32).to(tl.float32, bitcast=True), kept_mass


@triton.jit
def _write_renormalised(probs_row, out_row, V, threshold, kept_mass, BLOCK_V: tl.constexpr):
    offsets = tl.arange(0, BLOCK_V)
    for start in range(0, V, BLOCK_V):
        idx = start + offsets
        mask = idx < V
        p = tl.load(probs_row + idx, mask=mask, other=0.0)
        tl.store(out_row + idx, tl.where(p >= threshold, tl.math.div_rn(p, kept_mass), 0.0), mask=mask)


@triton.jit
def top_k_renorm_prob_kernel(probs_ptr, top_ks_ptr, out_ptr, V, stride_probs, BLOCK_V: tl.constexpr,
                             RADIX: tl.constexpr, PASSES: tl.constexpr):
    """One program per row: the k-th largest probability by radix search, then the renormalised row."""
    row = tl.program_id(0).to(tl.int64)
    probs_row = probs_ptr + row * stride_probs
    k = tl.load(top_ks_ptr + row).to(tl.int64)
    k = tl.minimum(tl.maximum(k, 1), V).to(tl.int32)
    threshold, kept_mass = _search_threshold(probs_row, V, k, 0.0, True, BLOCK_V, RADIX, PASSES)
    _write_renormalised(probs_row, out_ptr + row * V, V, threshold, kept_mass, BLOCK_V)


@triton.jit
def top_p_renorm_prob_kernel(probs_ptr, top_ps_ptr, out_ptr, V, stride_probs, BLOCK_V: tl.constexpr,
                             RADIX: tl.constexpr, PASSES: tl.constexpr):
    """One program per row: the top-p threshold by radix search, then the renormalised row."""
    row = tl.program_id(0).to(tl.int64)
    probs_row = probs_ptr + row * stride_probs
    top_p = tl.load(top_ps_ptr + row).to(tl.float32)
    # top_p >= 1 keeps every token: no mass exceeds +inf, so the threshold stays 0 even when the
    # row's total rounds above 1
    mass_above = tl.where(top_p >= 1.0, float("inf"), tl.maximum(top_p, 0.0))
    threshold, kept_mass = _search_threshold(probs_row, V, 0, mass_above, False, BLOCK_V, RADIX, PASSES)
    _write_renormalised(probs_row, out_ptr + row * V, V, threshold, kept_mass, BLOCK_V)


def _launch_filter(kernel, probs, params):
    N, V = probs.shape
    if probs.stride(1) != 1:
        probs = probs.contiguous()
    out = torch.empty((N, V), dtype=torch.float32, device=probs.device)
    if N > 0:
        kernel[(N,)](probs, params.contiguous(), out, V, probs.stride(0), BLOCK_V=FILTER_BLOCK_V, RADIX=RADIX,
                     PASSES=SEARCH_PASSES, num_warps=FILTER_NUM_WARPS)
    return out


def top_k_renorm_prob(probs, top_ks):
    """probs: (N, V) fp32 >= 0; top_ks: (N,) int -> (N, V) fp32.

    Keeps token v iff fewer than top_k tokens have a probability strictly greater than p(v), that is
    p(v) >= the k-th largest value: every token tied with the k-th largest is kept (Hugging Face's
    TopKLogitsWarper and FlashInfer do the same), so more than top_k tokens may survive. The others
    are zeroed and the row renormalised. top_k is clamped to [1, V]: top_k >= V keeps every token.
    """
    check_renorm_prob_args(probs, "top_ks", top_ks, integer=True)
    return _launch_filter(top_k_renorm_prob_kernel, probs, top_ks)


def top_p_renorm_prob(probs, top_ps):
    """probs: (N, V) fp32 >= 0, rows summing to 1; top_ps: (N,) float -> (N, V) fp32.

    Keeps token v iff the total mass of the tokens with a probability strictly greater than p(v) is
    <= top_p (without ties, SGLang's "mass before it in descending order <= top_p"; tied tokens
    share one decision, so a tie at the boundary is kept whole). The row's maximum is always kept;
    top_p >= 1 keeps every token, whatever the rounding of the row's total. The others are zeroed
    and the row renormalised. Masses are blocked fp32 sums, so a decision may differ from the
    reference's only when a mass lies within rounding (about 1e-6) of top_p.
    """
    check_renorm_prob_args(probs, "top_ps", top_ps, integer=False)
    return _launch_filter(top_p_renorm_prob_kernel, probs, top_ps)
