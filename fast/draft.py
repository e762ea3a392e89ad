"""Triton draft top-K: the K largest logits of each row and their softmax probabilities, in one pass."""
from __future__ import annotations

import contextlib
import threading

import torch
import triton
import triton.language as tl

from specdec.ops.op_checks import check_softmax_topk_args

from .logprobs import _KEY_NONE, _merge_partials, device_sm_count, num_vocab_splits, scan_vocab, values_ids_of

BLOCK_V = 1024
#: The largest K (rounded up to a power of two) whose rows are split over the vocabulary. The merging program
#: holds every split's K keys at once: up to 64 splits x 32 keys is 16 int64 per thread at 4 warps (71 registers
#: for sm_90, no spill); a larger K keeps one program per row.
SPLIT_KEYS_CAP = 32
#: Rows of a cached counter buffer: more than the heuristic ever splits (it stops splitting once the rows alone
#: give 8 programs per SM, 1,056 on 132 SMs), so the buffer is made once; a call with more rows grows it.
_MIN_COUNTERS = 2048
_counters: dict = {}


@triton.jit
def softmax_topk_kernel(logits_ptr, stride_row, vocab, topk, split_len, p_ptr, index_ptr, part_ptr, part_keys_ptr,
                        done_ptr, BLOCK_V: tl.constexpr, KEYS: tl.constexpr, SPLIT: tl.constexpr,
                        SPLITS_P2: tl.constexpr):
    """Grid (N, splits). Program (row, split) scans columns [split * split_len, (split + 1) * split_len) of its
    row: online max, sum of exponentials and top-K keys. With one split it writes the row's answer. With several
    it writes its partial and counts itself done in ``done_ptr[row]``; the row's last program to finish merges
    the partials, writes the answer and sets the counter back to 0 for the next launch."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    lo = split * split_len
    hi = tl.minimum(lo + split_len, vocab)
    m, s, top = scan_vocab(row_ptr, lo, hi, 1.0, False, BLOCK_V, KEYS, True)
    if SPLIT:
        num_splits = tl.num_programs(1)
        part = row * num_splits + split
        part_s_ptr = part_ptr + tl.num_programs(0) * num_splits  # the sums follow the N x splits maxima
        tl.store(part_ptr + part, m)
        tl.store(part_s_ptr + part, s)
        tl.store(part_keys_ptr + part * KEYS + tl.arange(0, KEYS), top)
        # Every thread's partial stores precede the count (the barrier), and the count is acq_rel at GPU scope:
        # the program that sees num_splits - 1 sees every other program's partial.
        tl.debug_barrier()
        if tl.atomic_add(done_ptr + row, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
            # every program of the row has counted, so nothing of this launch touches the counter again
            tl.store(done_ptr + row, 0)
            m, s, _ = _merge_partials(row, num_splits, part_ptr, part_s_ptr, part_keys_ptr, KEYS, False, SPLITS_P2)
            # the splits' keys side by side: one K-step selection merges and sorts them (an insertion per split
            # would cost up to K maxima per split)
            lanes = tl.arange(0, SPLITS_P2 * KEYS)
            cand = tl.load(part_keys_ptr + row * num_splits * KEYS + lanes, mask=lanes < num_splits * KEYS,
                           other=_KEY_NONE, cache_modifier=".cg")  # .cg: other SMs wrote them
            _store_top(row, m, s, cand, topk, p_ptr, index_ptr, KEYS)
    else:
        _store_top(row, m, s, top, topk, p_ptr, index_ptr, KEYS)


@triton.jit
def _store_top(row, m, s, cand, topk, p_ptr, index_ptr, KEYS: tl.constexpr):
    """Row max m, sum s of exp(x - shift) and candidate keys (any number, holding the row's K best) -> the K
    best ids, best first (keys order ties by id), and their probabilities exp(x - shift) / s."""
    shift = tl.where(m == float("-inf"), 0.0, m)
    lanes = tl.arange(0, KEYS)
    ranked = tl.full([KEYS], _KEY_NONE, tl.int64)
    for i in range(KEYS):  # selection sort: descending logit, ties by id (real keys are unique)
        best = tl.max(cand, axis=0)
        ranked = tl.where(lanes == i, best, ranked)
        cand = tl.where(cand == best, _KEY_NONE, cand)
    x, ids = values_ids_of(ranked)
    p = tl.exp(x - shift) / s
    keep = lanes < topk
    tl.store(p_ptr + row * topk + lanes, p, mask=keep)
    tl.store(index_ptr + row * topk + lanes, ids, mask=keep)


def _row_counters(device: torch.device, rows: int) -> torch.Tensor:
    """int32 [>= rows] of zeros for the split launch's per-row counters, made without a kernel on most calls.

    Eager calls share one buffer per (device, stream): each launch leaves every counter it used at 0 (the
    merging program resets it) and launches on one stream run in order, so the next launch finds zeros; a
    second stream gets its own buffer, so concurrent launches never share a counter (on CPU, where the
    interpreter has no stream, a thread is the unit of concurrency). Under CUDA graph capture nothing runs
    while the buffer is made, so a cached buffer made then would never have been zeroed, and a cached eager
    buffer would be shared by the graph's replays, launched later on any stream: a capture takes a fresh
    zeroed buffer from the graph's pool instead, one memset node per call that costs no host time at replay."""
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros(rows, dtype=torch.int32, device=device)
        key = (device, torch.cuda.current_stream(device).cuda_stream)
    else:
        key = (device, threading.get_ident())
    counters = _counters.get(key)
    if counters is None or counters.numel() < rows:
        counters = _counters[key] = torch.zeros(max(rows, _MIN_COUNTERS), dtype=torch.int32, device=device)
    return counters


@contextlib.contextmanager
def row_counters(device: torch.device, rows: int):
    """`_row_counters` for one split launch (a kernel whose last program per row merges and resets the counter).
    A launch that stopped part-way (an interpreted kernel interrupted) can leave counters above 0, and the next
    launch would never merge: the buffer is then dropped, and the next call makes a zeroed one."""
    counters = _row_counters(device, rows)
    try:
        yield counters
    except BaseException:
        for key in [k for k, v in _counters.items() if v is counters]:
            del _counters[key]
        raise


def softmax_topk_launch(logits, topk, *, split_len=None):
    """`softmax_topk`, with ``split_len`` (columns per vocabulary split, tests) forcing the split instead of the
    heuristic's; a split is then read in tiles of ``split_len`` rounded up to a power of two, so neither V nor
    the tiles need to be multiples of it."""
    N, V = check_softmax_topk_args(logits, topk)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    device = logits.device
    p = torch.empty(N, topk, dtype=torch.float32, device=device)
    index = torch.empty(N, topk, dtype=torch.int64, device=device)
    if N == 0:
        return p, index
    keys = max(2, triton.next_power_of_2(topk))
    if split_len is None:
        splits = num_vocab_splits(N, V, device_sm_count(device)) if keys <= SPLIT_KEYS_CAP else 1
        # The tile shrinks to the split for a small vocabulary (>= 16 lanes: V = 1 still gets a real tile), and
        # a split is a whole number of tiles.
        block_v = min(BLOCK_V, max(16, triton.next_power_of_2(triton.cdiv(V, splits))))
        split_len = triton.cdiv(triton.cdiv(V, splits), block_v) * block_v
    else:
        block_v = min(BLOCK_V, max(16, triton.next_power_of_2(split_len)))
    splits = triton.cdiv(V, split_len)  # rounding the split up to whole tiles can leave fewer, none empty
    args = (logits, logits.stride(0), V, topk, split_len, p, index)
    if splits == 1:  # unused pointers get a harmless tensor: their accesses are compiled out
        softmax_topk_kernel[(N, 1)](*args, p, index, index, BLOCK_V=block_v, KEYS=keys, SPLIT=False, SPLITS_P2=1,
                                    num_warps=4)
        return p, index
    part = torch.empty(2 * N * splits, dtype=torch.float32, device=device)  # maxima, then sums
    part_keys = torch.empty(N * splits * keys, dtype=torch.int64, device=device)
    with row_counters(device, N) as counters:
        softmax_topk_kernel[(N, splits)](*args, part, part_keys, counters, BLOCK_V=block_v, KEYS=keys, SPLIT=True,
                                         SPLITS_P2=triton.next_power_of_2(splits), num_warps=4)
    return p, index


def softmax_topk(logits, topk):
    """logits: (N, V) float; topk: int in [1, V] -> (topk_p (N, K) fp32, topk_index (N, K) int64).

    Same contract as `reference.softmax_topk`: the K largest logits of each row, best first, ties to the
    lower token id, with their softmax probabilities in fp32. Each row is read once in its stored dtype: online
    max / sum of exponentials and a running top-K of (logit, id) keys (the logprob kernel's `scan_vocab`), then
    p = exp(x - max) / sum for the K winners. Unless the rows alone fill the GPU (decode: N is B x K, a few to a
    few dozen rows over V ~ 10^5), the vocabulary is split over several programs per row, by the logprob kernel's
    rule (`num_vocab_splits`: several programs per SM, each split >= 4,096 ids, at most 64), each writing a
    partial max, sum and top-K; the row's last program to finish merges them as an online softmax does (the sums
    rescaled to the largest max) and picks the K best of the splits' keys, in the same launch: one launch per call
    either way. No host sync: the launch shape comes from N, V and K only.
    """
    return softmax_topk_launch(logits, topk)
