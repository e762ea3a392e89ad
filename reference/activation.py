"""Pure-PyTorch reference of SGLang's fused activation ``silu_and_mul``: the Llama MLP's SiLU gate times its up
projection, read from the fused gate_up projection's output.

The arithmetic is the models' `LlamaMLP` (specdec/models/layers.py) without an ops module, rounding point for
rounding point, so routing a model's MLPs through this module changes no number: ``F.silu(gate) * up`` in the
input's dtype. For bf16 and fp16, torch computes the SiLU in fp32 and rounds it to the dtype, then multiplies
in fp32 (the product of two bf16 or fp16 values is exact there) and rounds the product to the dtype: two
roundings. For fp32 both are fp32 operations.
"""

from __future__ import annotations

import torch.nn.functional as F

from specdec.ops.op_checks import check_silu_and_mul_args

__all__ = ["silu_and_mul"]


def silu_and_mul(x):
    """x: (N, 2I) float32, bfloat16 or float16, the gate (columns :I) then the up projection (columns I:), 2I even
    and >= 2 -> out (N, I) in x's dtype.

    out = silu(gate) * up, silu(g) = g / (1 + exp(-g)): the SiLU rounded to x's dtype, then the product rounded
    to x's dtype, as torch's ``F.silu(gate) * up`` computes it.
    """
    _, I = check_silu_and_mul_args(x)  # noqa: E741
    return F.silu(x[:, :I]) * x[:, I:]
