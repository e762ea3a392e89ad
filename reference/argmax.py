"""Pure-PyTorch reference of the greedy pick: each row's argmax and whether the row is finite, the two things a
greedy step reads from the target's logits (the token, and whether the request must stop on a broken row)."""
from __future__ import annotations

import torch

from specdec.ops.op_checks import check_argmax_finite_args

__all__ = ["argmax_finite"]


def argmax_finite(logits):
    """logits: (N, V) fp32/bf16/fp16 -> (argmax (N,) int64, finite (N,) bool).

    argmax: the index of the row's largest value, ties to the lower token id (as `torch.argmax`), compared in the
    stored dtype (upcasting keeps every order). finite: every value of the row is finite. A row that is not finite
    gets some id in [0, V), otherwise unspecified: the engine stops its request there without emitting it."""
    check_argmax_finite_args(logits)
    return logits.argmax(-1), torch.isfinite(logits).all(-1)
