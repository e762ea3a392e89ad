"""A grammar's token mask on the logits: xgrammar's packed int32 bitmask applied on the device.

The host fills one bitmask row per logits row (a tree node's matcher state after its root-to-node path,
`specdec.grammar`), the rows go up in one transfer, and this op writes -inf wherever a token's bit is 0. The
layout is xgrammar's (and SGLang's): row n holds ceil(V / 32) int32 words, bit j of word i (counted from the
least significant bit) allows token 32 i + j; bits past V are ignored.
"""
from __future__ import annotations

import torch

from specdec.ops.op_checks import check_bitmask_args

__all__ = ["apply_token_bitmask", "unpack_token_bitmask"]


def unpack_token_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bitmask (N, ceil(V/32)) int32 -> (N, V) bool, True where the token is allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1  # arithmetic shift: bit 31 of a negative word still reads 1
    return bits.flatten(1)[:, :vocab_size].bool()


def apply_token_bitmask(logits, bitmask):
    """Shape contract: logits (N, V) float, bitmask (N, ceil(V/32)) int32 on the same device -> (N, V) float32:
    ``logits`` where token v's bit (bit v % 32 of word v // 32) is 1, -inf where it is 0. No host sync."""
    N, V = check_bitmask_args(logits, bitmask)
    return logits.float().masked_fill(~unpack_token_bitmask(bitmask, V), float("-inf"))
