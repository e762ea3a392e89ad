"""Triton ``silu_and_mul`` (SGLang's fused activation of the Llama MLP), one launch.

Same name, signature and contract as ``reference.activation``. One program per (row, block of ``BLOCK_I``
columns): it reads the gate block and the up block of the row, writes the block of silu(gate) * up. A row
wider than a block is covered by several programs, so a decode step's few rows still fill the device.

The rounding points are the reference's (torch's ``F.silu(gate) * up`` in x's dtype): the SiLU computed in fp32
and rounded to x's dtype, then the product of the rounded SiLU and up computed in fp32 (exact there for bf16 and
fp16 inputs) and rounded to x's dtype. The bf16 roundings are done on the bits (to nearest, ties to even, as
torch's ``c10::BFloat16``; the helpers of `fast.norm`), because Triton's CPU interpreter truncates on a plain
cast. silu(g) = g / (1 + exp(-g)) with torch's division (``div_rn``, correctly rounded). exp is computed here
from IEEE fp32 operations only (Cody-Waite reduction by ln 2, Sleef's degree-6 polynomial, an exact scaling by
2^n), within about one fp32 ulp, where the compiled ``tl.exp`` (ex2.approx of g * log2 e) is off by up to |g|
ulps. Launched without FMA contraction, so compiled and interpreted runs give the same bits. torch's own exp
(Sleef or glibc on a CPU, expf on CUDA) is within an ulp or two as well: the fp32 SiLU is a few ulps from the
reference's at most, which the rounding to bf16 or fp16 hides except at a rounding boundary.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.ops.op_checks import check_silu_and_mul_args

from .norm import _round_to, _to_fp32

__all__ = ["silu_and_mul"]

#: The columns of a row one program writes (4 warps: 8 values a thread, 16-byte loads in bf16).
BLOCK_I = 1024


@triton.jit
def _exp(t):
    """exp(t) in fp32 within about an ulp, from IEEE adds, products and a floor only (see the module docstring).
    Below -32 it returns exp(-32) (1 + it is 1 in fp32, as 1 + exp(t) is); past 88.73 it overflows to inf."""
    t = tl.minimum(tl.maximum(t, -32.0), 100.0)  # NaN: whatever; the SiLU's numerator keeps it NaN
    n = tl.floor(t * 1.4426950408889634 + 0.5)  # t / ln 2, to the nearest integer, in [-46, 144]
    # s = t - n ln 2 with ln 2 in two parts: the first has 15 significant bits, so n times it is exact
    s = (t - n * 0.693145751953125) - n * 1.428606765330187045e-06
    p = 0.000198527617612853646278381
    p = p * s + 0.00139304355252534151077271
    p = p * s + 0.00833336077630519866943359
    p = p * s + 0.0416664853692054748535156
    p = p * s + 0.166666671633720397949219
    p = p * s + 0.5
    e = 1.0 + ((s * s) * p + s)  # exp(s), |s| <= ln 2 / 2
    # times 2^n = 2^h * 2^(n - h), each factor a normal fp32 built from its exponent bits: exact unless it overflows
    ni = n.to(tl.int32)
    h = ni >> 1
    e = e * ((h + 127) << 23).to(tl.float32, bitcast=True)
    return e * ((ni - h + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, I, stride_x, num_col_blocks,  # noqa: E741
                        IS_BF16: tl.constexpr, BLOCK_I: tl.constexpr):
    pid = tl.program_id(0)
    row = (pid // num_col_blocks).to(tl.int64)
    cols = (pid % num_col_blocks) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = cols < I
    x_row = x_ptr + row * stride_x
    dtype = out_ptr.dtype.element_ty
    g = _to_fp32(tl.load(x_row + cols, mask=mask, other=0.0), IS_BF16)
    u = _to_fp32(tl.load(x_row + I + cols, mask=mask, other=0.0), IS_BF16)
    silu = tl.math.div_rn(g, 1.0 + _exp(-g))
    silu = _to_fp32(_round_to(silu, dtype, IS_BF16), IS_BF16)  # torch's F.silu output in x's dtype (fp32: as is)
    tl.store(out_ptr + row * I + cols, _round_to(silu * u, dtype, IS_BF16), mask=mask)


def silu_and_mul(x):
    """x: (N, 2I) float32, bfloat16 or float16, the gate (columns :I) then the up projection (columns I:), 2I even
    and >= 2 -> out (N, I) in x's dtype.

    out = silu(gate) * up, silu(g) = g / (1 + exp(-g)): the SiLU rounded to x's dtype, then the product rounded
    to x's dtype, as torch's ``F.silu(gate) * up`` computes it.
    """
    N, I = check_silu_and_mul_args(x)  # noqa: E741
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty((N, I), dtype=x.dtype, device=x.device)
    if N == 0:
        return out
    block = min(BLOCK_I, triton.next_power_of_2(I))
    num_col_blocks = triton.cdiv(I, block)
    silu_and_mul_kernel[(N * num_col_blocks,)](x, out, I, x.stride(0), num_col_blocks,
                                              IS_BF16=x.dtype == torch.bfloat16, BLOCK_I=block,
                                              num_warps=4 if block >= 512 else 1, enable_fp_fusion=False)
    return out
