"""Triton version of ``reference.grammar.apply_token_bitmask``: the same name, signature and contract.

One program per (logits row, vocabulary block): it loads the block's logits and the words of the packed
bitmask that cover it, unpacks each token's bit in registers (word v // 32, bit v % 32), and writes the
masked block once: one read and one write of the logits plus V / 8 bytes of mask per row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.ops.op_checks import check_bitmask_args

__all__ = ["apply_token_bitmask"]

BLOCK_V = 1024


@triton.jit
def apply_token_bitmask_kernel(logits_ptr, bitmask_ptr, out_ptr, V, num_words, stride_logits, stride_mask,
                               BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    idx = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    in_vocab = idx < V
    x = tl.load(logits_ptr + row * stride_logits + idx, mask=in_vocab, other=0.0).to(tl.float32)
    word = tl.load(bitmask_ptr + row * stride_mask + idx // 32, mask=in_vocab, other=0)
    allowed = ((word >> (idx % 32)) & 1) != 0
    tl.store(out_ptr + row * V + idx, tl.where(allowed, x, float("-inf")), mask=in_vocab)


def _launch_apply_token_bitmask(logits, bitmask, N, V):
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if bitmask.stride(1) != 1:
        bitmask = bitmask.contiguous()
    out = torch.empty((N, V), dtype=torch.float32, device=logits.device)
    if N == 0:
        return out
    apply_token_bitmask_kernel[(N, triton.cdiv(V, BLOCK_V))](
        logits, bitmask, out, V, bitmask.shape[1], logits.stride(0), bitmask.stride(0), BLOCK_V=BLOCK_V)
    return out


def apply_token_bitmask(logits, bitmask):
    """Shape contract: as ``reference.apply_token_bitmask`` (logits (N, V) float, bitmask (N, ceil(V/32)) int32)
    -> (N, V) float32, -inf where the token's bit is 0."""
    N, V = check_bitmask_args(logits, bitmask)
    return _launch_apply_token_bitmask(logits, bitmask, N, V)
