"""Triton greedy pick: each row's argmax and whether the row is finite, in one read of the row."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.ops.op_checks import check_argmax_finite_args

from .draft import row_counters
from .logprobs import device_sm_count, num_vocab_splits

BLOCK_V = 1024
_NO_ID = tl.constexpr(2 ** 31 - 1)  # above every id: a lane that has seen no column yet


@triton.jit
def _best_of(vals, ids, ok):
    """Lanes' (best value, its first id, all finite) -> the row's (or split's): the largest value, ties to the
    lowest id. A NaN never compares greater, so a row holding NaNs may find no lane equal to its max: its id then
    stays _NO_ID, which the caller replaces by a valid one (the row is flagged not finite anyway)."""
    best = tl.max(vals, axis=0)
    best_id = tl.min(tl.where(vals == best, ids, _NO_ID), axis=0)
    return best, best_id, tl.min(ok, axis=0)


@triton.jit
def argmax_finite_kernel(logits_ptr, stride_row, vocab, split_len, index_ptr, finite_ptr, part_val_ptr, part_id_ptr,
                         part_ok_ptr, done_ptr, BLOCK_V: tl.constexpr, SPLIT: tl.constexpr, SPLITS_P2: tl.constexpr):
    """Grid (N, splits). Program (row, split) scans columns [split * split_len, (split + 1) * split_len) of its
    row in its stored dtype: per lane the largest value and its first column (columns grow along a lane, so a
    strict comparison keeps the first of equal values), and whether every value is finite. With several splits
    each writes its partial and counts itself done in ``done_ptr[row]``; the row's last program merges them (as
    `softmax_topk_kernel` does) and sets the counter back to 0."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    lo = split * split_len
    hi = tl.minimum(lo + split_len, vocab)
    lanes = tl.arange(0, BLOCK_V)
    vals = tl.full([BLOCK_V], float("-inf"), tl.float32)
    ids = tl.full([BLOCK_V], _NO_ID, tl.int32)
    ok = tl.full([BLOCK_V], 1, tl.int32)
    for start in range(lo, hi, BLOCK_V):
        cols = start + lanes
        inside = cols < hi
        x = tl.load(row_ptr + cols, mask=inside, other=float("-inf")).to(tl.float32)
        finite = (x == x) & (tl.abs(x) != float("inf"))
        ok = tl.where(inside & ~finite, 0, ok)
        # the first column a lane sees is taken whatever its value (an all -inf row still names an id)
        take = inside & ((x > vals) | (ids == _NO_ID))
        vals = tl.where(take, x, vals)
        ids = tl.where(take, cols, ids)
    best, best_id, all_ok = _best_of(vals, ids, ok)
    if SPLIT:
        num_splits = tl.num_programs(1)
        part = row * num_splits + split
        tl.store(part_val_ptr + part, best)
        tl.store(part_id_ptr + part, tl.where(best_id == _NO_ID, lo, best_id))
        tl.store(part_ok_ptr + part, all_ok)
        # as in softmax_topk_kernel: every partial store precedes the acq_rel count, so the program that sees
        # num_splits - 1 sees every other program's partial
        tl.debug_barrier()
        if tl.atomic_add(done_ptr + row, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
            tl.store(done_ptr + row, 0)
            s = tl.arange(0, SPLITS_P2)
            real = s < num_splits
            base = row * num_splits
            split_vals = tl.load(part_val_ptr + base + s, mask=real, other=float("-inf"), cache_modifier=".cg")
            split_ids = tl.load(part_id_ptr + base + s, mask=real, other=_NO_ID, cache_modifier=".cg")
            split_oks = tl.load(part_ok_ptr + base + s, mask=real, other=1, cache_modifier=".cg")
            row_best, row_id, row_ok = _best_of(split_vals, split_ids, split_oks)
            tl.store(index_ptr + row, tl.where(row_id == _NO_ID, 0, row_id).to(tl.int64))
            tl.store(finite_ptr + row, row_ok.to(tl.int8))
    else:
        tl.store(index_ptr + row, tl.where(best_id == _NO_ID, 0, best_id).to(tl.int64))
        tl.store(finite_ptr + row, all_ok.to(tl.int8))


def argmax_finite_launch(logits, *, split_len=None):
    """`argmax_finite`, with ``split_len`` (columns per vocabulary split, tests) forcing the split instead of the
    heuristic's (`num_vocab_splits`, as the logprob kernel and `softmax_topk`)."""
    N, V = check_argmax_finite_args(logits)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    device = logits.device
    index = torch.empty(N, dtype=torch.int64, device=device)
    finite = torch.empty(N, dtype=torch.bool, device=device)
    if N == 0:
        return index, finite
    if split_len is None:
        splits = num_vocab_splits(N, V, device_sm_count(device))
        block_v = min(BLOCK_V, max(16, triton.next_power_of_2(triton.cdiv(V, splits))))
        split_len = triton.cdiv(triton.cdiv(V, splits), block_v) * block_v
    else:
        block_v = min(BLOCK_V, max(16, triton.next_power_of_2(split_len)))
    splits = triton.cdiv(V, split_len)
    flags = finite.view(torch.int8)  # bool is one byte: the kernel stores 0 / 1
    args = (logits, logits.stride(0), V, split_len, index, flags)
    if splits == 1:  # unused pointers get a harmless tensor: their accesses are compiled out
        argmax_finite_kernel[(N, 1)](*args, index, index, index, index, BLOCK_V=block_v, SPLIT=False, SPLITS_P2=1,
                                     num_warps=4)
        return index, finite
    part_val = torch.empty(N * splits, dtype=torch.float32, device=device)
    part_id = torch.empty(N * splits, dtype=torch.int32, device=device)
    part_ok = torch.empty(N * splits, dtype=torch.int32, device=device)
    with row_counters(device, N) as counters:
        argmax_finite_kernel[(N, splits)](*args, part_val, part_id, part_ok, counters, BLOCK_V=block_v, SPLIT=True,
                                          SPLITS_P2=triton.next_power_of_2(splits), num_warps=4)
    return index, finite


def argmax_finite(logits):
    """logits: (N, V) fp32/bf16/fp16 -> (argmax (N,) int64, finite (N,) bool).

    Same contract as `reference.argmax_finite`: the index of each row's largest value, ties to the lower token
    id, and whether every value of the row is finite (a row that is not gets some id in [0, V)). One read of the
    row in its stored dtype replaces an argmax, an isfinite and a reduction over it (three launches, and the
    isfinite's (N, V) bool tensor), and no fp32 copy of the logits is made. Split over the vocabulary like
    `softmax_topk` unless the rows alone fill the GPU: one launch either way, no host sync.
    """
    return argmax_finite_launch(logits)
