"""Triton RMSNorms: ``rms_norm`` and SGLang's ``fused_add_rms_norm``, one launch each.

Same names, signatures and contracts as ``reference.norm``. One program per row. A row of up to
``MAX_BLOCK_H`` values is held in registers: read once, summed, normalised, written. A wider row is walked in
blocks twice (the sum of squares, then the writes); the second pass recomputes x + residual from the inputs
rather than reading back ``summed``, so no barrier is needed between another thread's store and this load.

The rounding points are the reference's: the residual add rounded to the input dtype, then fp32 math on the
rounded sum, the product (x * rstd) * weight rounded to the input dtype once. The bf16 roundings are done on
the bits (to nearest, ties to even, as torch's ``c10::BFloat16``), because Triton's CPU interpreter truncates
on a plain cast. So ``summed`` is bit-equal to the reference's. ``normed`` differs only through the order of
the fp32 sum of squares (a tree here, torch's cascade there) and through rsqrt, here 1 / sqrt both correctly
rounded: a few fp32 ulps, which the final rounding to bf16 hides except at a rounding boundary, where the two
are one bf16 ulp apart.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.ops.op_checks import check_rms_norm_args

__all__ = ["fused_add_rms_norm", "rms_norm"]

#: The widest row a program holds in registers (8 warps: 32 fp32 values a thread); wider rows go in blocks.
MAX_BLOCK_H = 8192


@triton.jit
def _bf16_round_to_nearest_even(v):
    """fp32 -> bf16 exactly as torch rounds (c10::BFloat16): to nearest, ties to even, any NaN to 0x7FC0."""
    bits = v.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(v != v, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _to_fp32(v, IS_BF16: tl.constexpr):
    if IS_BF16:  # on the bits: the interpreter's bf16 -> fp32 cast flushes subnormals to zero
        return (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return v.to(tl.float32)


@triton.jit
def _round_to(v, dtype: tl.constexpr, IS_BF16: tl.constexpr):
    if IS_BF16:
        return _bf16_round_to_nearest_even(v)
    else:
        return v.to(dtype)  # fp32: nothing; fp16: round to nearest even, compiled and interpreted alike


@triton.jit
def _load_summed(x_row, residual_row, idx, mask, HAS_RESIDUAL: tl.constexpr, IS_BF16: tl.constexpr):
    """The row's values at idx in the input dtype: x, or x + residual as torch's add rounds it."""
    x = tl.load(x_row + idx, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_row + idx, mask=mask, other=0.0)
        x = _round_to(_to_fp32(x, IS_BF16) + _to_fp32(r, IS_BF16), x_row.dtype.element_ty, IS_BF16)
    return x


@triton.jit
def _write_normed(normed_row, weight_ptr, s, rstd, idx, mask, IS_BF16: tl.constexpr,
                  WEIGHT_BF16: tl.constexpr):
    w = _to_fp32(tl.load(weight_ptr + idx, mask=mask, other=0.0), WEIGHT_BF16)
    # (x * rstd) * weight: the reference's order of the two products
    tl.store(normed_row + idx, _round_to((_to_fp32(s, IS_BF16) * rstd) * w, normed_row.dtype.element_ty, IS_BF16),
             mask=mask)


@triton.jit
def fused_add_rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, normed_ptr, summed_ptr, H, stride_x, stride_residual,
                              eps, HAS_RESIDUAL: tl.constexpr, IS_BF16: tl.constexpr, WEIGHT_BF16: tl.constexpr,
                              BLOCK_H: tl.constexpr, ONE_BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    residual_row = residual_ptr + row * stride_residual
    normed_row = normed_ptr + row * H
    summed_row = summed_ptr + row * H
    offsets = tl.arange(0, BLOCK_H)
    if ONE_BLOCK:
        mask = offsets < H
        s = _load_summed(x_row, residual_row, offsets, mask, HAS_RESIDUAL, IS_BF16)
        if HAS_RESIDUAL:
            tl.store(summed_row + offsets, s, mask=mask)
        sf = _to_fp32(s, IS_BF16)
        sum_sq = tl.sum(sf * sf, axis=0)
    else:
        acc = tl.zeros([BLOCK_H], tl.float32)
        for start in range(0, H, BLOCK_H):
            idx = start + offsets
            mask = idx < H
            s = _load_summed(x_row, residual_row, idx, mask, HAS_RESIDUAL, IS_BF16)
            if HAS_RESIDUAL:
                tl.store(summed_row + idx, s, mask=mask)
            sf = _to_fp32(s, IS_BF16)
            acc += sf * sf
        sum_sq = tl.sum(acc, axis=0)
    # the mean as torch's CPU mean takes it (the sum divided by H), and 1 / sqrt correctly rounded: the
    # compiled default rsqrt and division are approximate
    mean_sq = tl.math.div_rn(sum_sq, H.to(tl.float32))
    rstd = tl.math.div_rn(1.0, tl.math.sqrt_rn(mean_sq + eps))
    if ONE_BLOCK:
        _write_normed(normed_row, weight_ptr, s, rstd, offsets, mask, IS_BF16, WEIGHT_BF16)
    else:
        for start in range(0, H, BLOCK_H):
            idx = start + offsets
            mask = idx < H
            s = _load_summed(x_row, residual_row, idx, mask, HAS_RESIDUAL, IS_BF16)
            _write_normed(normed_row, weight_ptr, s, rstd, idx, mask, IS_BF16, WEIGHT_BF16)


def _launch(x, residual, weight, eps):
    N, H = x.shape
    given_x = x
    if x.stride(1) != 1:
        x = x.contiguous()
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()
    weight = weight.contiguous()
    normed = torch.empty((N, H), dtype=x.dtype, device=x.device)
    summed = given_x if residual is None else torch.empty((N, H), dtype=x.dtype, device=x.device)
    if N == 0:
        return normed, summed
    block_h = min(MAX_BLOCK_H, triton.next_power_of_2(H))
    fused_add_rms_norm_kernel[(N,)](
        x, x if residual is None else residual, weight, normed, summed, H, x.stride(0),
        0 if residual is None else residual.stride(0), float(eps), HAS_RESIDUAL=residual is not None,
        IS_BF16=x.dtype == torch.bfloat16, WEIGHT_BF16=weight.dtype == torch.bfloat16, BLOCK_H=block_h,
        ONE_BLOCK=block_h >= H, num_warps=4 if block_h <= 1024 else 8)
    return normed, summed


def rms_norm(x, weight, eps):
    """x: (N, H) float; weight: (H,) float, on x's device; eps: float >= 0 -> normed (N, H) in x's dtype.

    normed = x * rsqrt(mean(x^2 over H) + eps) * weight per row, in fp32 (upcast inputs), rounded to x's dtype
    once at the end.
    """
    check_rms_norm_args(x, None, weight, eps)
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(x, residual, weight, eps):
    """x: (N, H) float; residual: (N, H) of x's dtype, or None; weight: (H,) float; eps: float >= 0
    -> (normed (N, H), summed (N, H)), both in x's dtype.

    summed = x + residual, rounded to x's dtype as torch's add stores it (summed is x itself when residual is
    None); normed = rms_norm(summed, weight, eps). The decoder layer's residual stream: summed carries on to the
    next add, normed feeds the next block.
    """
    check_rms_norm_args(x, residual, weight, eps)
    return _launch(x, residual, weight, eps)
