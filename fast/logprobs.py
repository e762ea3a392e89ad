"""Triton version of the shared speculative-decoding logprob helper: one fused pass over the vocabulary.

``reference.logprobs.compute_spec_v2_logprobs`` is the definition; this file computes the same outputs
without materialising a [rows, V] log-softmax. The checks and the packing into SGLang's per-row lists are
shared with the reference (``specdec.ops.op_checks``, ``specdec.ops.logprob_packing``); the slot -> row mapping and the
temperature rule, which the reference runs as tensor ops (``accepted_rows``, ``request_temperatures``), run
inside the kernels here, so that the op's host work is little more than its launches.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from specdec.ops.contract import GREEDY_TEMPERATURE_BELOW, PADDED_LOGPROB, PADDED_TOP_LOGPROB_IDX
from specdec.ops.logprob_packing import (
    accepted_rows,
    request_temperatures,
    requested_token_ids,
    set_logprob_outputs,
)
from specdec.ops.op_checks import check_logprob_args

__all__ = ["PADDED_LOGPROB", "PADDED_TOP_LOGPROB_IDX", "TOP_K_CAP", "compute_spec_v2_logprobs"]

#: The largest ``top_logprobs_num`` the kernel keeps a running top-k for. Above it the kernel still
#: computes the max and log-sum-exp, and ``torch.topk`` over the gathered rows' raw logits picks the ids.
TOP_K_CAP = 32
#: Vocabulary tile of one loop iteration: 16 fp32/bf16 values per thread at 4 warps (the H200 sweep's best with
#: per-lane sums, `scan_vocab`).
BLOCK_V = 2048
#: Requested token ids handled per iteration of the ids loop.
BLOCK_IDS = 32
#: A vocabulary split reads at least this many tiles (4,096 columns), so splitting never leaves programs with
#: almost no work.
_MIN_TILES_PER_SPLIT = 2
_MAX_SPLITS = 64
#: Programs the split heuristic aims for per SM. A program streams its split one tile at a time (2 KB of bf16,
#: 4 KB of fp32 in flight), and a memory-bound pass needs tens of KB in flight per SM to reach DRAM bandwidth
#: (bandwidth per SM x latency: 36 GB/s x ~0.7 us on an H200), so an SM needs several resident programs: 8 of
#: 4 warps each is 32 warps, half of what an H100/H200 SM holds, 16 KB (bf16) to 32 KB (fp32) in flight, and
#: the grid's last partial wave stays small. At 256 rows x 151,936 on 132 SMs this gives 5 splits, 1,280
#: programs (9.7 per SM) where one split per row gave 256 (1.9 per SM, one tile in flight on most SMs).
_PROGRAMS_PER_SM = 8
#: SM count the split heuristic assumes when there is no CUDA device (an H100/H200), so that the CPU
#: interpreter runs the same launch shapes as the GPU the toolkit is benchmarked on.
_NOMINAL_SM_COUNT = 132

_FP32_MIN = tl.constexpr(-3.4028234663852886e38)  # torch.finfo(torch.float32).min
#: A top-k key below every real key: an empty slot of the running top-k, or a candidate already taken.
_KEY_NONE = tl.constexpr(-(2**63))
_PAD_VAL = tl.constexpr(PADDED_LOGPROB)
_PAD_IDX = tl.constexpr(PADDED_TOP_LOGPROB_IDX)
_GREEDY_BELOW = tl.constexpr(GREEDY_TEMPERATURE_BELOW)


@triton.jit
def _keys_of(x, cols):
    """fp32 values [N], token ids [N] -> int64 keys [N]: key order = value order, ties to the smaller id.

    One integer max then finds value and id together, and keys are unique within a row. The float's bits
    are made monotone (negative floats flip their magnitude bits), then shifted above the inverted id."""
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (0xFFFFFFFF - cols.to(tl.int64))


@triton.jit
def values_ids_of(keys):
    """Inverse of ``_keys_of``: int64 keys [N] -> (fp32 values [N], int64 token ids [N])."""
    ordered = (keys >> 32).to(tl.int32)
    bits = tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), 0xFFFFFFFF - (keys & 0xFFFFFFFF)


@triton.jit
def _insert_keys(top, top_min, cand):
    """Running top-k ``top`` [K] (smallest ``top_min``) <- the candidates [N] that beat it.

    Usually no candidate of a tile beats the k-th best so far and this costs one max; each winner
    replaces the current smallest entry (at most K per call, so the worst case is K maxima per tile)."""
    best = tl.max(cand, axis=0)
    while best > top_min:
        lanes = tl.arange(0, top.shape[0])
        top = tl.where(lanes == tl.argmin(top, axis=0), best, top)
        top_min = tl.min(top, axis=0)
        cand = tl.where(cand == best, _KEY_NONE, cand)
        best = tl.max(cand, axis=0)
    return top, top_min


@triton.jit
def _logprob_of(x, shift, lse):
    """Scaled logit(s) -> logprob(s), in the reference's order of operations, clamped to float32's minimum
    (a -inf logit gives the minimum; NaN stays NaN, as in ``torch.clamp``)."""
    lp = (x - shift) - lse
    return tl.where(lp < _FP32_MIN, _FP32_MIN, lp)


@triton.jit
def scan_vocab(row_ptr, lo, hi, temp, SCALE: tl.constexpr, BLOCK_V: tl.constexpr, KEYS: tl.constexpr,
                TOP_K: tl.constexpr):
    """Columns [lo, hi) of one row -> (max m, sum of exp(x - shift), running top-k keys [KEYS]); shift is m,
    or 0 while every column so far is -inf.

    The max is reduced over each tile, the sum kept per lane and reduced once at the end: one cross-warp
    reduction per tile instead of two. On the H200 that brought 256 x 151,936 bf16 without scaling closer to the
    copy's bandwidth at 1024-wide tiles, closer still at 2048 (results/gpu-check-20261204/logprob-sweep/sweep.csv);
    a per-lane max too (two exps per value) was slower than either."""
    # Without top-k the scan divides nothing: dividing by a positive temperature is monotone and so is its
    # rounding, so the scaled max is the raw max divided once (exactly torch's max of x / T), and each exponent
    # is (x - max) * (1 / T), whose rounding error is relative to the small difference, not to x / T. An IEEE
    # division per value held the H200 pass far below the copy's bandwidth (measured on the GPU, no CSV kept). The
    # top-k keys need every x / T as torch rounds it, so with top-k each value is divided.
    inv_temp = 1.0
    if SCALE and not TOP_K:
        inv_temp = 1.0 / temp
    m = float("-inf")
    s_lane = tl.zeros([BLOCK_V], tl.float32)
    top = tl.full([KEYS], _KEY_NONE, tl.int64)
    top_min = tl.min(top, axis=0)
    for start in range(lo, hi, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        in_range = cols < hi
        x = tl.load(row_ptr + cols, mask=in_range, other=float("-inf")).to(tl.float32)
        if SCALE and TOP_K:
            x = tl.math.div_rn(x, temp)  # IEEE division, as torch's: equal inputs to the max and the top-k
        m_new = tl.maximum(m, tl.max(x, axis=0))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # all -inf so far: exp(-inf - 0) = 0, not NaN
        if SCALE and not TOP_K:
            s_lane = s_lane * tl.exp((m - shift) * inv_temp) + tl.exp((x - shift) * inv_temp)
        else:
            s_lane = s_lane * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
        if TOP_K:
            keys = tl.where(in_range, _keys_of(x, cols), _KEY_NONE)
            top, top_min = _insert_keys(top, top_min, keys)
    if SCALE and not TOP_K:
        m = tl.math.div_rn(m, temp)
    return m, tl.sum(s_lane, axis=0), top


@triton.jit
def _finish_row(r, row_ptr, valid, m, s, top, temp, tok, ids_ptr, num_ids, lp_ptr, stats_ptr, top_val_ptr,
                top_idx_ptr, tid_val_ptr, SCALE: tl.constexpr, KEYS: tl.constexpr, TOP_K: tl.constexpr,
                HAS_IDS: tl.constexpr, BLOCK_IDS: tl.constexpr):
    """Row r's (m, s, top keys) -> its chosen-token logprob, sorted top-k, requested-id logprobs and (shift, lse).

    The chosen token and the requested ids are single loads from the row, now that the lse is known."""
    shift = tl.where(m == float("-inf"), 0.0, m)
    lse = tl.log(tl.where(s == 0.0, 1.0, s))  # all-masked row: lse 0, every logprob -inf, then clamped
    tl.store(stats_ptr + 2 * r, shift)
    tl.store(stats_ptr + 2 * r + 1, lse)

    x = tl.load(row_ptr + tok, mask=valid, other=0.0).to(tl.float32)
    if SCALE:
        x = tl.math.div_rn(x, temp)
    tl.store(lp_ptr + r, tl.where(valid, _logprob_of(x, shift, lse), _PAD_VAL))

    if TOP_K:
        lanes = tl.arange(0, KEYS)
        ranked = tl.full([KEYS], _KEY_NONE, tl.int64)
        for i in range(KEYS):  # selection sort of K <= TOP_K_CAP keys: descending value, ties by id
            best = tl.max(top, axis=0)
            ranked = tl.where(lanes == i, best, ranked)
            top = tl.where(top == best, _KEY_NONE, top)  # real keys are unique
        vals, ids = values_ids_of(ranked)
        tl.store(top_val_ptr + r * KEYS + lanes, tl.where(valid, _logprob_of(vals, shift, lse), _PAD_VAL))
        tl.store(top_idx_ptr + r * KEYS + lanes, tl.where(valid, ids, _PAD_IDX))

    if HAS_IDS:
        for first in range(0, num_ids, BLOCK_IDS):
            slot = first + tl.arange(0, BLOCK_IDS)
            wanted = slot < num_ids
            readable = slot < tl.where(valid, num_ids, 0)  # a padded slot reads nothing
            tid = tl.load(ids_ptr + slot, mask=readable, other=0)
            x_ids = tl.load(row_ptr + tid, mask=readable, other=0.0).to(tl.float32)
            if SCALE:
                x_ids = tl.math.div_rn(x_ids, temp)
            v = tl.where(valid, _logprob_of(x_ids, shift, lse), _PAD_VAL)
            tl.store(tid_val_ptr + r * num_ids + slot, v, mask=wanted)


@triton.jit
def _accepted_row(accept_ptr, r, slots_per_req, num_nodes):
    """Output row r -> (its request, the logits row it reads (int64), whether its slot is accepted), by
    ``specdec.ops.logprob_packing.accepted_rows``'s rule: a padded slot (-1) reads its own request's slot-0 row,
    or the request's first node's row when that is padded too, so every load stays in bounds."""
    req = r // slots_per_req  # the request owns the temperature, whatever row it accepted
    acc = tl.load(accept_ptr + r).to(tl.int64)
    own = tl.load(accept_ptr + req * slots_per_req).to(tl.int64)
    own = tl.where(own >= 0, own, req.to(tl.int64) * num_nodes)
    return req, tl.where(acc >= 0, acc, own), acc >= 0


@triton.jit
def _request_temperature(temp_ptr, req):
    """Request ``req``'s temperature in fp32, by ``specdec.ops.logprob_packing.request_temperatures``'s rule: one
    below ``GREEDY_TEMPERATURE_BELOW`` or NaN (greedy, ``contract.greedy_temperature``) is 1.0."""
    t = tl.load(temp_ptr + req).to(tl.float32)
    return tl.where(t >= _GREEDY_BELOW, t, 1.0)


@triton.jit
def compute_spec_v2_logprobs_kernel(
    logits_ptr, stride_row, predict_ptr, accept_ptr, num_nodes, temp_ptr, ids_ptr, num_ids, slots_per_req, vocab,
    split_len, lp_ptr, stats_ptr, top_val_ptr, top_idx_ptr, tid_val_ptr, part_m_ptr, part_s_ptr, part_keys_ptr,
    done_ptr, SCALE: tl.constexpr, BLOCK_V: tl.constexpr, KEYS: tl.constexpr, TOP_K: tl.constexpr,
    HAS_IDS: tl.constexpr, BLOCK_IDS: tl.constexpr, SPLIT: tl.constexpr, SPLITS_P2: tl.constexpr,
):
    """Grid (R, splits). Program (r, p) reads columns [p*split_len, (p+1)*split_len) of output row r's logits
    row once. With one split it then finishes the row. With several it writes its partial (max, sum, top-k
    keys) and counts itself done in ``done_ptr[r]`` (zeroed by the caller); the row's last program to finish
    merges the partials and finishes the row, so a split launch is still one launch. A padded slot reads no
    column."""
    r = tl.program_id(0)
    split = tl.program_id(1)
    req, row, valid = _accepted_row(accept_ptr, r, slots_per_req, num_nodes)
    row_ptr = logits_ptr + row * stride_row  # int64: row * stride can pass 2^31
    temp = 1.0
    if SCALE:
        temp = _request_temperature(temp_ptr, req)
    lo = split * split_len
    hi = tl.minimum(lo + split_len, vocab)
    hi = tl.where(valid, hi, lo)
    m, s, top = scan_vocab(row_ptr, lo, hi, temp, SCALE, BLOCK_V, KEYS, TOP_K)
    tok = tl.load(predict_ptr + row, mask=valid, other=0)
    if SPLIT:
        num_splits = tl.num_programs(1)
        part = r * num_splits + split
        tl.store(part_m_ptr + part, m)
        tl.store(part_s_ptr + part, s)
        if TOP_K:
            tl.store(part_keys_ptr + part * KEYS + tl.arange(0, KEYS), top)
        # Every thread's partial stores precede the count (the barrier), and the count is acq_rel at GPU
        # scope: the program that sees num_splits - 1 finished before it sees every partial.
        tl.debug_barrier()
        if tl.atomic_add(done_ptr + r, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
            m, s, top = _merge_partials(r, num_splits, part_m_ptr, part_s_ptr, part_keys_ptr, KEYS, TOP_K,
                                        SPLITS_P2)
            _finish_row(r, row_ptr, valid, m, s, top, temp, tok, ids_ptr + req * num_ids, num_ids, lp_ptr,
                        stats_ptr, top_val_ptr, top_idx_ptr, tid_val_ptr, SCALE, KEYS, TOP_K, HAS_IDS, BLOCK_IDS)
    else:
        _finish_row(r, row_ptr, valid, m, s, top, temp, tok, ids_ptr + req * num_ids, num_ids, lp_ptr, stats_ptr,
                    top_val_ptr, top_idx_ptr, tid_val_ptr, SCALE, KEYS, TOP_K, HAS_IDS, BLOCK_IDS)


@triton.jit
def _merge_partials(r, num_splits, part_m_ptr, part_s_ptr, part_keys_ptr, KEYS: tl.constexpr, TOP_K: tl.constexpr,
                    SPLITS_P2: tl.constexpr):
    """Row r's ``num_splits`` partials -> its (max m, sum of exp(x - shift), top-k keys): online-softmax
    rescale, top-k insertion. The loads bypass L1 (``.cg``): other SMs wrote the partials."""
    splits = tl.arange(0, SPLITS_P2)
    present = splits < num_splits
    part_m = tl.load(part_m_ptr + r * num_splits + splits, mask=present, other=float("-inf"), cache_modifier=".cg")
    part_s = tl.load(part_s_ptr + r * num_splits + splits, mask=present, other=0.0, cache_modifier=".cg")
    m = tl.max(part_m, axis=0)
    shift = tl.where(m == float("-inf"), 0.0, m)
    # Each partial sum was taken at its own max part_m <= m, so the rescale is exp(part_m - shift) <= 1, and
    # an empty or all -inf split (part_m = -inf, sum 0) gets exp(-inf) = 0. Rescaling from the partial's
    # stand-in shift 0 instead would overflow once the row max is below about -88.7 (tiny temperatures):
    # 0 * exp(0 - shift) = 0 * inf = NaN.
    s = tl.sum(part_s * tl.exp(part_m - shift), axis=0)

    top = tl.full([KEYS], _KEY_NONE, tl.int64)
    if TOP_K:
        top_min = tl.min(top, axis=0)
        for p in range(num_splits):
            cand = tl.load(part_keys_ptr + (r * num_splits + p) * KEYS + tl.arange(0, KEYS), cache_modifier=".cg")
            top, top_min = _insert_keys(top, top_min, cand)
    return m, s, top


@functools.lru_cache(maxsize=None)
def device_sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _NOMINAL_SM_COUNT


def num_vocab_splits(num_rows: int, vocab: int, sm_count: int) -> int:
    """Programs per row: enough rows x splits for ``_PROGRAMS_PER_SM`` programs per SM, each split at least
    ``_MIN_TILES_PER_SPLIT`` full tiles, at most ``_MAX_SPLITS``; 1 once the rows alone are that many."""
    wanted = triton.cdiv(_PROGRAMS_PER_SM * sm_count, max(num_rows, 1))
    by_work = max(1, triton.cdiv(vocab, BLOCK_V) // _MIN_TILES_PER_SPLIT)
    return max(1, min(wanted, by_work, _MAX_SPLITS))


def compute_spec_v2_logprobs_launch(logits, predict, accept_index, temperatures, ids, keys, *, _num_splits=None):
    """Launch the fused pass. ``logits`` [N, V] (N = B*W); ``predict`` [N] int; ``accept_index`` [B, T] int
    (padded with -1); ``temperatures`` [B] or [B, 1] float as the batch holds them (greedy ones are read as 1.0),
    or None for no scaling; ``ids`` [B, L] int64 or None; ``keys`` 0 (no top-k) or a power of two <=
    ``TOP_K_CAP``. The slot -> row mapping and the temperature rule run inside the kernels, so the op's host
    work is the checks, the output allocations and the launches.

    Returns ``(logprobs [R] fp32, top_val [R, keys] fp32 | None, top_idx [R, keys] int64 | None,
    token_ids_val [R, L] fp32 | None, stats [R, 2] fp32)`` with ``stats[r] = (shift, lse)``: row r's logprob of
    a scaled logit x is ``(x - shift) - lse``. ``_num_splits`` forces the number of vocabulary splits (tests)."""
    if logits.stride(1) != 1:
        logits = logits.contiguous()  # the tile loads want unit stride along the vocabulary
    # the kernel reads these by position: a strided view (an expanded temperature has stride 0) is copied
    accept_index, predict = accept_index.contiguous(), predict.contiguous()
    if temperatures is not None:
        temperatures = temperatures.reshape(-1).contiguous()
    B, T = accept_index.shape
    R = B * T
    N, V = logits.shape
    device = logits.device
    f32 = dict(dtype=torch.float32, device=device)
    out = torch.empty(3 * R, **f32)  # one allocation: the logprobs, then (shift, lse) per row
    lp, stats = out[:R], out[R:].view(R, 2)
    top_val = torch.empty(R, keys, **f32) if keys else None
    top_idx = torch.empty(R, keys, dtype=torch.long, device=device) if keys else None
    num_ids = ids.shape[1] if ids is not None else 0
    tid_val = torch.empty(R, num_ids, **f32) if ids is not None else None
    if R == 0:
        return lp, top_val, top_idx, tid_val, stats

    if _num_splits is not None:
        splits = _num_splits
    else:
        splits = num_vocab_splits(R, V, device_sm_count(device))
    # The tile shrinks to the split for a small vocabulary (>= 16 lanes: V = 1 still gets a real tile).
    block_v = min(BLOCK_V, max(16, triton.next_power_of_2(triton.cdiv(V, splits))))
    split_len = triton.cdiv(triton.cdiv(V, splits), block_v) * block_v
    keys_alloc = max(keys, 1)  # a [1] placeholder keeps the kernels' signatures when no top-k is wanted
    scale = temperatures is not None
    # Unused pointer arguments get a harmless tensor: their loads and stores are compiled out.
    common = dict(
        logits_ptr=logits, stride_row=logits.stride(0), predict_ptr=predict, accept_ptr=accept_index,
        num_nodes=N // B, temp_ptr=temperatures if scale else lp,
        ids_ptr=ids if ids is not None else accept_index, num_ids=num_ids, slots_per_req=T, lp_ptr=lp,
        stats_ptr=stats, top_val_ptr=top_val if keys else lp, top_idx_ptr=top_idx if keys else accept_index,
        tid_val_ptr=tid_val if ids is not None else lp,
        SCALE=scale, KEYS=keys_alloc, TOP_K=keys > 0, HAS_IDS=ids is not None, BLOCK_IDS=BLOCK_IDS,
    )
    if splits == 1:
        compute_spec_v2_logprobs_kernel[(R, 1)](
            vocab=V, split_len=split_len, part_m_ptr=lp, part_s_ptr=lp, part_keys_ptr=accept_index,
            done_ptr=accept_index, BLOCK_V=block_v, SPLIT=False, SPLITS_P2=1, num_warps=4, **common,
        )
        return lp, top_val, top_idx, tid_val, stats

    part_m, part_s = torch.empty(2, R, splits, **f32)  # one allocation for both partials
    part_keys = torch.empty(R, splits, keys_alloc, dtype=torch.long, device=device) if keys else accept_index
    compute_spec_v2_logprobs_kernel[(R, splits)](
        vocab=V, split_len=split_len, part_m_ptr=part_m, part_s_ptr=part_s, part_keys_ptr=part_keys,
        done_ptr=torch.zeros(R, dtype=torch.int32, device=device), BLOCK_V=block_v, SPLIT=True,
        SPLITS_P2=triton.next_power_of_2(splits), num_warps=4, **common,
    )
    return lp, top_val, top_idx, tid_val, stats


def compute_spec_v2_logprobs(
    batch,
    logits_output,
    predict,
    accept_index,
    speculative_num_steps,
    *,
    return_original_logprob=False,
):
    """Logprobs of the accepted path of one speculative decode step, filled into ``logits_output``.

    Shape contract (B requests, W nodes per request, S = ``speculative_num_steps``, V vocab,
    R = B*(S+1) output rows, row r = b*(S+1) + j, request-major): ``logits_output.next_token_logits``
    [B*W, V] fp32 / bf16 / fp16, ``predict`` [B*W] int, ``accept_index`` [B, S+1] int (padded with -1),
    ``batch.sampling_info.temperatures`` [B, 1]. Outputs: ``next_token_logprobs`` fp32 [B, S+1]; the top and
    token-id logprob lists (length R, entry r a 1-D fp32 / int64 view, or None when nobody asked). The full
    definition (temperature per request, clamping, padded slots, checks) is
    ``reference.logprobs.compute_spec_v2_logprobs``'s docstring; the outputs agree with it within the
    equivalence table, except that tied top-k values may list their ids in another order (here: smaller id
    first).

    How. One program per (output row, vocabulary split) reads its slice of the accepted logits row once, in
    its stored dtype, upcasts each tile to fp32 in registers and keeps an online max (per tile) and sum of
    exponentials (per lane) of the values over the request's temperature (with top-k: each value divided as
    torch divides; without: only the max, each exponent a product with 1 / T) and, when a request asked for
    top logprobs, a running top-k of
    (value, token id) packed into int64 keys (K = ``top_logprobs_num`` rounded up to a power of two, a
    constexpr: a batch without top-k requests compiles a variant with no top-k code). With one split the
    program then finishes the row: lse, the chosen token's and the requested ids' logprobs as single loads,
    the sorted top-k. Unless the rows alone give ``_PROGRAMS_PER_SM`` programs per SM (decode: B*(S+1) can be
    2; even 256 rows are 2 per SM of an H200) the vocabulary is split over several programs per row (enough
    for that many per SM, each split >= 2 tiles of 2,048) and the row's last split to finish merges the
    partials, in the same launch (one launch per call: on an H200 a launch of this kernel costs about 50 us
    of host time, several times the kernel's own time at decode shapes). No [rows, V] intermediate exists. Above
    ``TOP_K_CAP`` the kernel runs without top-k and ``torch.topk`` over the gathered rows' raw logits (same
    order as the logprobs for a positive temperature) gives the ids; their values use the kernel's lse. A padded
    slot reads no vocabulary column and gets the padded values. No host sync: the launch shapes come from
    Python ints and list lengths only.
    """
    scale = not (bool(batch.sampling_info.is_all_greedy) or return_original_logprob)
    B, S, W, _V, temperatures, top_nums, ids_per_req = check_logprob_args(
        batch, logits_output, predict, accept_index, speculative_num_steps, scale
    )
    logits = logits_output.next_token_logits
    T = S + 1
    with torch.no_grad():
        ids = requested_token_ids(ids_per_req, logits.device)
        k_max = max(top_nums, default=0)
        keys = triton.next_power_of_2(k_max) if 0 < k_max <= TOP_K_CAP else 0
        lp, top_val, top_idx, tid_val, stats = compute_spec_v2_logprobs_launch(
            logits, predict, accept_index, temperatures, ids, keys
        )
        if k_max > TOP_K_CAP:
            top_val, top_idx = _top_logprobs_above_cap(logits, accept_index, W, temperatures, stats, k_max)
    return set_logprob_outputs(logits_output, lp.reshape(B, T), top_val, top_idx, top_nums, tid_val, ids_per_req)


def _top_logprobs_above_cap(logits, accept_index, W, temperatures, stats, k):
    """Top-k above ``TOP_K_CAP``: ``torch.topk`` of the gathered raw rows [R, V] (dividing by a positive
    temperature and subtracting a constant keep the order), values finished with the kernel's (shift, lse)."""
    B, T = accept_index.shape
    rows, valid = accepted_rows(accept_index, W)
    top_raw, top_idx = torch.topk(logits.index_select(0, rows), k, dim=-1, largest=True, sorted=True)
    x = top_raw.to(torch.float32)
    if temperatures is not None:
        x = x / request_temperatures(temperatures).unsqueeze(1).expand(B, T).reshape(B * T, 1)
    top_val = ((x - stats[:, :1]) - stats[:, 1:]).clamp(min=torch.finfo(torch.float32).min)
    top_val = torch.where(valid.unsqueeze(1), top_val, torch.full((), PADDED_LOGPROB, dtype=torch.float32,
                                                                  device=top_val.device))
    top_idx = torch.where(valid.unsqueeze(1), top_idx, torch.full((), PADDED_TOP_LOGPROB_IDX, dtype=torch.long,
                                                                  device=top_idx.device))
    return top_val, top_idx
