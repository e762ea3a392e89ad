"""Pure-PyTorch reference of the RMSNorms: ``rms_norm`` and SGLang's ``fused_add_rms_norm`` (the residual add
fused with the norm that follows it).

The arithmetic is the models' `RMSNorm` (specdec/models/layers.py) without an ops module, rounding point for
rounding point, so routing a model's norms through this module changes no number: fp32 input and weight go
through ``torch.rms_norm``; any other dtype is upcast to fp32, normalised, scaled by the fp32 weight and cast
back to the input's dtype once. The residual add is torch's add in the input's dtype (for bf16: the fp32 sum
rounded to bf16), as the models' ``x + attn(...)`` computes it.
"""

from __future__ import annotations

import torch

from specdec.ops.op_checks import check_rms_norm_args

__all__ = ["fused_add_rms_norm", "rms_norm"]


def _normalise(x, weight, eps):
    if x.dtype is torch.float32 and weight.dtype is torch.float32:
        return torch.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * xf).to(x.dtype)


def rms_norm(x, weight, eps):
    """x: (N, H) float; weight: (H,) float, on x's device; eps: float >= 0 -> normed (N, H) in x's dtype.

    normed = x * rsqrt(mean(x^2 over H) + eps) * weight per row, in fp32 (upcast inputs), rounded to x's dtype
    once at the end.
    """
    check_rms_norm_args(x, None, weight, eps)
    return _normalise(x, weight, eps)


def fused_add_rms_norm(x, residual, weight, eps):
    """x: (N, H) float; residual: (N, H) of x's dtype, or None; weight: (H,) float; eps: float >= 0
    -> (normed (N, H), summed (N, H)), both in x's dtype.

    summed = x + residual, rounded to x's dtype as torch's add stores it (summed is x itself when residual is
    None); normed = rms_norm(summed, weight, eps). The decoder layer's residual stream: summed carries on to the
    next add, normed feeds the next block.
    """
    check_rms_norm_args(x, residual, weight, eps)
    summed = x if residual is None else x + residual
    return _normalise(summed, weight, eps), summed
