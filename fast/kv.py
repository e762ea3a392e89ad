"""Triton KV commit of an accepted path (same contract as `reference.commit_kv_cache`)."""
from __future__ import annotations

import triton
import triton.language as tl

from specdec.ops.op_checks import check_commit_kv_args

#: Elements of one (head, dim) row block copied per program and iteration.
BLOCK_ROW = 1024


@triton.jit
def commit_kv_cache_kernel(kv_ptr, slots_ptr, seq_lens_ptr, accept_index_ptr,
                           stride_n, stride_batch, stride_seq, row_numel, num_slots, num_draft_tokens,
                           BLOCK_ROW: tl.constexpr):
    b = tl.program_id(0)
    n = tl.program_id(1)
    chunk = tl.program_id(2)
    offs = chunk * BLOCK_ROW + tl.arange(0, BLOCK_ROW)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int64)
    base = kv_ptr + n.to(tl.int64) * stride_n + slot * stride_batch
    # Ascending j: accepted node j sits at node index i_j >= j, so a destination seq_len + j is never
    # the source of a later j' (its source seq_len + i_j' > seq_len + j): each move reads before
    # anything it depends on is overwritten.
    for j in range(num_slots):
        node = tl.load(accept_index_ptr + b * num_slots + j).to(tl.int64)
        local = node - b.to(tl.int64) * num_draft_tokens
        move = (node >= 0) & (local != j)
        # the row's length, or 0 when nothing moves: one vector mask (no scalar-and-vector mask)
        in_row = offs < tl.where(move, row_numel, 0)
        src = base + (seq_len + local) * stride_seq
        dst = base + (seq_len + j) * stride_seq
        values = tl.load(src + offs, mask=in_row)
        tl.store(dst + offs, values, mask=in_row)


def _launch_commit_kv_cache(kv, slots, seq_lens, accept_index, num_draft_tokens):
    N, _, _, Hkv, D = kv.shape
    B, S1 = accept_index.shape
    row_numel = Hkv * D
    block = min(BLOCK_ROW, triton.next_power_of_2(row_numel))
    grid = (B, N, triton.cdiv(row_numel, block))
    commit_kv_cache_kernel[grid](kv, slots.contiguous(), seq_lens.contiguous(), accept_index.contiguous(),
                                 kv.stride(0), kv.stride(1),
                                 kv.stride(2), row_numel, S1, num_draft_tokens, BLOCK_ROW=block)


def commit_kv_cache(kv, slots, seq_lens, accept_index, num_draft_tokens):
    """kv: (N, max_batch, max_seq_len, Hkv, D), N caches (e.g. every layer's k and v) updated in place;
    slots, seq_lens: (B,) int; accept_index: (B, S+1) int (flat node indices b*W + i, -1 padded);
    num_draft_tokens: W (int).

    Moves the KV of accepted node j (written at slot seq_len + i_j during verify) to slot seq_len + j,
    as `reference.commit_kv_cache`. One launch; program (b, n, chunk) moves one chunk of the (Hkv, D)
    rows of request b in cache n for j = 0..S in ascending order, which is what makes overlapping
    moves safe. Padded slots and nodes already in place move nothing. The (Hkv, D) block of each
    cache row must be contiguous (a `KVCache` buffer is).
    """
    B, _ = check_commit_kv_args(kv, slots, seq_lens, accept_index, num_draft_tokens)
    if kv.stride(-1) != 1 or kv.stride(-2) != kv.shape[-1]:
        raise ValueError(f"kv's (Hkv, D) block must be contiguous, got strides {kv.stride()}")
    if B == 0 or kv.numel() == 0:
        return
    _launch_commit_kv_cache(kv, slots, seq_lens, accept_index, num_draft_tokens)
