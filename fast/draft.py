"""Triton draft top-K: the K largest logits of each row and their softmax probabilities, in one pass."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.checks import check_softmax_topk_args

from .logprobs import scan_vocab, values_ids_of

BLOCK_V = 1024


@triton.jit
def softmax_topk_kernel(logits_ptr, stride_row, vocab, topk, p_ptr, index_ptr,
                        BLOCK_V: tl.constexpr, KEYS: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    m, s, top = scan_vocab(row_ptr, 0, vocab, 1.0, False, BLOCK_V, KEYS, True)
    shift = tl.where(m == float("-inf"), 0.0, m)
    lanes = tl.arange(0, KEYS)
    ranked = tl.full([KEYS], -(2**63), tl.int64)
    for i in range(KEYS):  # selection sort of the K kept keys: descending logit, ties by id
        best = tl.max(top, axis=0)
        ranked = tl.where(lanes == i, best, ranked)
        top = tl.where(top == best, -(2**63), top)
    x, ids = values_ids_of(ranked)
    p = tl.exp(x - shift) / s
    keep = lanes < topk
    tl.store(p_ptr + row * topk + lanes, p, mask=keep)
    tl.store(index_ptr + row * topk + lanes, ids, mask=keep)


def softmax_topk(logits, topk):
    """logits: (N, V) float; topk: int in [1, V] -> (topk_p (N, K) fp32, topk_index (N, K) int64).

    Same contract as `reference.softmax_topk`: the K largest logits of each row, best first, ties to the
    lower token id, with their softmax probabilities in fp32. One program per row reads the row once in
    its stored dtype: online max / sum of exponentials and a running top-K of (logit, id) keys (the
    logprob kernel's `scan_vocab`), then p = exp(x - max) / sum for the K winners.
    """
    N, V = check_softmax_topk_args(logits, topk)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    p = torch.empty(N, topk, dtype=torch.float32, device=logits.device)
    index = torch.empty(N, topk, dtype=torch.int64, device=logits.device)
    if N == 0:
        return p, index
    block_v = min(BLOCK_V, max(16, triton.next_power_of_2(V)))
    softmax_topk_kernel[(N,)](logits, logits.stride(0), V, topk, p, index, BLOCK_V=block_v,
                              KEYS=max(2, triton.next_power_of_2(topk)), num_warps=4)
    return p, index
