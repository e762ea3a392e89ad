"""Triton tree attention over a KV cache: a committed causal prefix plus a tree of in-flight tokens.

Same contract as `reference.tree_attention`. Per request the key range is read from device tensors
(`cache_start`), never from the host bound `attn_len`, so the launch grid depends only on the batch
size, the query count and the cache's capacity: it is the same from one decode step to the next.
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from specdec.ops.op_checks import check_attention_call, check_plan_args, check_rope_kv_call
from specdec.ops.contract import TreeAttentionPlan

from .interpreter import INTERPRETED

_IMPL = "fast"

#: Keys per inner iteration (bf16 / fp16 on the tensor cores; IEEE fp32 tiles live in registers, so smaller).
BLOCK_N = 32
BLOCK_N_FP32 = 16
#: Programs a launch aims for before it splits the key range of each (request, KV head) over several
#: programs (flash-decoding); a fixed nominal count, so the split depends on shapes only.
_TARGET_PROGRAMS = 264
#: In-flight mask bits per packed word.
_MASK_WORD_BITS = 32
#: device -> the one-word mask a launch without a tree passes (the kernel never reads it: HAS_TREE is off), made
#: once rather than by a zeros launch per call; kept for good, so a CUDA graph that captured its address stays valid
_NO_TREE_MASK: dict[torch.device, torch.Tensor] = {}


@triton.jit
def tree_attention_kernel(q_ptr, k_ptr, v_ptr, slots_ptr, cache_start_ptr, mask_bits_ptr,
                          part_acc_ptr, part_max_ptr, part_sum_ptr,
                          stride_qb, stride_qt, stride_qh,
                          stride_kb, stride_ks, stride_kh,
                          stride_vb, stride_vs, stride_vh,
                          num_new, write_offset, num_mask_words, split_len, num_splits, scale_log2,
                          HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                          HAS_TREE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_D: tl.constexpr, FP32_DOT: tl.constexpr):
    bh = tl.program_id(0)
    m_tile = tl.program_id(1)
    split = tl.program_id(2)
    b = bh // NUM_KV_HEADS
    kvh = bh % NUM_KV_HEADS

    # query rows of this program: (token t, head g of the KV head's group), t-major
    rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    t = rows // GROUP
    head = kvh * GROUP + rows % GROUP
    row_ok = rows < num_new * GROUP
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    slot = tl.load(slots_ptr + b).to(tl.int64)
    start = tl.load(cache_start_ptr + b).to(tl.int64)
    n_inflight = write_offset + num_new
    total = start + n_inflight
    k_base = k_ptr + slot * stride_kb + kvh * stride_kh
    v_base = v_ptr + slot * stride_vb + kvh * stride_vh

    lo = (split * split_len).to(tl.int64)
    hi = tl.minimum(lo + split_len, total)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        key_ok = pos < hi
        kv_mask = key_ok[:, None] & d_ok[None, :]
        # keys past the request's length are never loaded, so whatever a stale slot holds stays out
        k = tl.load(k_base + pos[:, None] * stride_ks + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + pos[:, None] * stride_vs + d[None, :], mask=kv_mask, other=0.0)
        if FP32_DOT:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        r = pos - start  # in-flight index of the key; < 0 in the committed prefix
        in_flight = (r >= 0) & key_ok
        if HAS_TREE:
            word = tl.where(in_flight, r // 32, 0)
            bits = tl.load(mask_bits_ptr + (b * num_new + t[:, None]).to(tl.int64) * num_mask_words + word[None, :],
                           mask=row_ok[:, None] & in_flight[None, :], other=0)
            tree_ok = ((bits >> (tl.where(in_flight, r % 32, 0))[None, :]) & 1) != 0
        else:
            tree_ok = r[None, :] <= write_offset + t[:, None]
        visible = ((r < 0)[None, :] | (in_flight[None, :] & tree_ok)) & key_ok[None, :] & row_ok[:, None]
        s = tl.where(visible, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if FP32_DOT:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    # partials, laid out (B, Hq, T, splits): the merge kernel combines the splits of one query row
    out_row = ((b * NUM_KV_HEADS * GROUP + head) * num_new + t).to(tl.int64) * num_splits + split
    tl.store(part_max_ptr + out_row, m_i, mask=row_ok)
    tl.store(part_sum_ptr + out_row, l_i, mask=row_ok)
    tl.store(part_acc_ptr + out_row[:, None] * HEAD_DIM + d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def tree_attention_merge_kernel(part_acc_ptr, part_max_ptr, part_sum_ptr, out_ptr,
                                stride_ob, stride_ot, stride_oh, num_heads, num_new, num_splits,
                                HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)  # (b, h, t)
    t = row % num_new
    h = (row // num_new) % num_heads
    b = row // (num_new * num_heads)
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_splits
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    base = row.to(tl.int64) * num_splits
    m = tl.load(part_max_ptr + base + s, mask=s_ok, other=float("-inf"))
    l_part = tl.load(part_sum_ptr + base + s, mask=s_ok, other=0.0)
    acc = tl.load(part_acc_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                  other=0.0)
    m_all = tl.max(m, 0)
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.exp2(m - m_all)
    denom = tl.sum(l_part * w, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(denom > 0, denom, 1.0)
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + t * stride_ot + h * stride_oh + d,
             out.to(out_ptr.dtype.element_ty), mask=d_ok)


def pack_tree_mask(tree_mask: torch.Tensor) -> torch.Tensor:
    """tree_mask: (B, T, L) bool -> (B, T, ceil(L / 32)) int32, bit r % 32 of word r // 32 = tree_mask[..., r]."""
    B, T, L = tree_mask.shape
    words = triton.cdiv(L, _MASK_WORD_BITS)
    padded = torch.zeros(B, T, words * _MASK_WORD_BITS, dtype=torch.int64, device=tree_mask.device)
    padded[:, :, :L] = tree_mask
    weights = torch.ones(_MASK_WORD_BITS, dtype=torch.int64, device=tree_mask.device).cumsum(0).sub(1)
    packed = (padded.view(B, T, words, _MASK_WORD_BITS) << weights).sum(-1)
    # two's complement wrap of bit 31 into int32
    return torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)


def _num_splits(batch_heads: int, m_tiles: int, max_seq_len: int) -> int:
    """Key-range splits per (request, KV head, query tile): enough programs to fill the device, from
    shapes only, each split at least one key block long."""
    programs = batch_heads * m_tiles
    want = triton.cdiv(_TARGET_PROGRAMS, programs)
    return max(1, min(want, triton.cdiv(max_seq_len, 4 * BLOCK_N)))


def plan_tree_attention(slots, cache_start, write_offset, tree_mask, attn_len, num_new, max_seq_len):
    """Same contract as `reference.plan_tree_attention`: the TreeAttentionPlan every layer of one forward
    shares. Here it holds the tree mask packed into 32-bit words (`pack_tree_mask`), once per forward
    instead of once per layer."""
    B = check_plan_args(slots, cache_start, write_offset, tree_mask, attn_len, num_new, max_seq_len)
    bits = None if tree_mask is None else pack_tree_mask(tree_mask)
    return TreeAttentionPlan(_IMPL, B, num_new, write_offset, attn_len, max_seq_len, dict(mask_bits=bits))


def _launch_tree_attention(q, k_cache, v_cache, slots, cache_start, write_offset, tree_mask, scale,
                           num_splits=None, mask_bits=None):
    B, T, Hq, D = q.shape
    _, max_seq, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    # Triton's CPU interpreter multiplies bf16 tiles wrongly (it has no bf16 matmul), so there every tile is
    # upcast to fp32 first; compiled kernels use the tensor cores for bf16 / fp16
    fp32_dot = q.dtype == torch.float32 or INTERPRETED
    block_m = min(32 if fp32_dot and D > 64 else 64, max(16, triton.next_power_of_2(T * group)))
    m_tiles = triton.cdiv(T * group, block_m)
    if num_splits is None:
        num_splits = _num_splits(B * Hkv, m_tiles, max_seq)
    block_n = BLOCK_N_FP32 if fp32_dot else BLOCK_N
    split_len = triton.cdiv(triton.cdiv(max_seq, num_splits), block_n) * block_n
    device = q.device
    part_acc = torch.empty(B * Hq * T * num_splits, D, dtype=torch.float32, device=device)
    part_max = torch.empty(B * Hq * T * num_splits, dtype=torch.float32, device=device)
    part_sum = torch.empty(B * Hq * T * num_splits, dtype=torch.float32, device=device)
    if tree_mask is not None:
        bits = pack_tree_mask(tree_mask) if mask_bits is None else mask_bits
        num_words = bits.shape[-1]
    else:
        bits = _NO_TREE_MASK.get(device)
        if bits is None:
            bits = _NO_TREE_MASK[device] = torch.zeros(1, dtype=torch.int32, device=device)
        num_words = 1
    q = q if q.stride(-1) == 1 else q.contiguous()
    block_d = max(16, triton.next_power_of_2(D))
    tree_attention_kernel[(B * Hkv, m_tiles, num_splits)](
        q, k_cache, v_cache, slots.contiguous(), cache_start.contiguous(), bits, part_acc, part_max, part_sum,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        T, write_offset, num_words, split_len, num_splits, scale * 1.4426950408889634,
        HEAD_DIM=D, GROUP=group, NUM_KV_HEADS=Hkv, HAS_TREE=tree_mask is not None, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_D=block_d, FP32_DOT=fp32_dot,
        # IEEE fp32 products run on the FMA units with whole tiles in registers: 8 warps and 16-key blocks
        # keep them from spilling (tests/helpers/gpu_compile_check.py reports registers and spills for sm_90)
        num_warps=8 if fp32_dot else 4)
    out = torch.empty(B, T, Hq, D, dtype=q.dtype, device=device)
    tree_attention_merge_kernel[(B * Hq * T,)](
        part_acc, part_max, part_sum, out, out.stride(0), out.stride(1), out.stride(2), Hq, T, num_splits,
        HEAD_DIM=D, BLOCK_S=max(2, triton.next_power_of_2(num_splits)), BLOCK_D=block_d)
    return out


def tree_attention(q, k_cache, v_cache, slots, cache_start, write_offset, tree_mask, attn_len, scale, plan=None):
    """q: (B, T, Hq, D); k_cache, v_cache: (max_batch, max_seq_len, Hkv, D); slots, cache_start: (B,)
    int64; write_offset, attn_len: int; tree_mask: (B, T, write_offset + T) bool or None; plan: this
    module's `plan_tree_attention` for the call, or None -> (B, T, Hq, D).

    Same contract as `reference.tree_attention`: request b's new token t sees the committed prefix
    (key slots < cache_start[b]) and the in-flight slots cache_start[b] + r, r < write_offset + T,
    that tree_mask[b, t, r] selects (causal over the in-flight tokens when None). The keys and values
    of the new tokens must already be in the cache.

    One launch over (request x KV head, query tile, key split) plus a small merge launch. A program
    holds all T tokens x Hq/Hkv query heads of one KV head (grouped-query attention reads each key
    block once, without copying heads), streams its share of the request's keys in blocks of 32 with
    an online softmax in fp32 (fp32 inputs multiply in IEEE fp32, bf16/fp16 on the tensor cores with
    fp32 accumulation), and reads the tree mask packed as 32-bit words. The per-request key count
    comes from ``cache_start`` on the device; ``attn_len`` is accepted for the shared signature and
    not read, and the split count depends on B, T and the cache capacity only, so consecutive decode
    steps launch identical grids. Keys past a request's length are never loaded.
    """
    B, T, Hq, D = check_attention_call(_IMPL, plan, q, k_cache, v_cache, slots, cache_start, write_offset, tree_mask,
                                       attn_len, scale)
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.stride(-1) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous, got strides {cache.stride()}")
    if B == 0 or T == 0:
        return torch.empty_like(q)
    bits = None if plan is None else plan.tensors["mask_bits"]
    return _launch_tree_attention(q, k_cache, v_cache, slots, cache_start, write_offset, tree_mask, scale,
                                  mask_bits=bits)


@triton.jit
def apply_rope_and_write_kv_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, q_out_ptr,
                                   slots_ptr, cache_start_ptr,
                                   stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
                                   stride_vb, stride_vt, stride_vh, stride_cb, stride_ct,
                                   stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                                   num_new, write_offset,
                                   NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
                                   BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    token = tl.program_id(0)  # (b, t)
    b = token // num_new
    t = token % num_new
    i = tl.arange(0, BLOCK_HALF)
    i_ok = i < HALF
    h = tl.arange(0, BLOCK_H)
    cs = b.to(tl.int64) * stride_cb + t * stride_ct
    cos1 = tl.load(cos_ptr + cs + i, mask=i_ok, other=0.0)
    cos2 = tl.load(cos_ptr + cs + HALF + i, mask=i_ok, other=0.0)
    sin1 = tl.load(sin_ptr + cs + i, mask=i_ok, other=0.0)
    sin2 = tl.load(sin_ptr + cs + HALF + i, mask=i_ok, other=0.0)

    q_ok = (h < NUM_Q_HEADS)[:, None] & i_ok[None, :]
    q_at = b.to(tl.int64) * stride_qb + t * stride_qt + h[:, None] * stride_qh + i[None, :]
    x1 = tl.load(q_ptr + q_at, mask=q_ok, other=0.0).to(tl.float32)
    x2 = tl.load(q_ptr + q_at + HALF, mask=q_ok, other=0.0).to(tl.float32)
    q_out_at = token.to(tl.int64) * NUM_Q_HEADS * 2 * HALF + h[:, None] * 2 * HALF + i[None, :]
    out_ty = q_out_ptr.dtype.element_ty
    tl.store(q_out_ptr + q_out_at, (x1 * cos1[None, :] - x2 * sin1[None, :]).to(out_ty), mask=q_ok)
    tl.store(q_out_ptr + q_out_at + HALF, (x2 * cos2[None, :] + x1 * sin2[None, :]).to(out_ty), mask=q_ok)

    slot = tl.load(slots_ptr + b).to(tl.int64)
    pos = tl.load(cache_start_ptr + b).to(tl.int64) + write_offset + t
    kv_ok = (h < NUM_KV_HEADS)[:, None] & i_ok[None, :]
    k_at = b.to(tl.int64) * stride_kb + t * stride_kt + h[:, None] * stride_kh + i[None, :]
    k1 = tl.load(k_ptr + k_at, mask=kv_ok, other=0.0).to(tl.float32)
    k2 = tl.load(k_ptr + k_at + HALF, mask=kv_ok, other=0.0).to(tl.float32)
    k_in_ty = k_ptr.dtype.element_ty
    kc_ty = k_cache_ptr.dtype.element_ty
    kc_at = slot * stride_kcb + pos * stride_kcs + h[:, None] * stride_kch + i[None, :]
    # rounded to k's own dtype first, as the reference does, then to the cache's
    tl.store(k_cache_ptr + kc_at, (k1 * cos1[None, :] - k2 * sin1[None, :]).to(k_in_ty).to(kc_ty), mask=kv_ok)
    tl.store(k_cache_ptr + kc_at + HALF, (k2 * cos2[None, :] + k1 * sin2[None, :]).to(k_in_ty).to(kc_ty),
             mask=kv_ok)
    v_at = b.to(tl.int64) * stride_vb + t * stride_vt + h[:, None] * stride_vh + i[None, :]
    vc_at = slot * stride_vcb + pos * stride_vcs + h[:, None] * stride_vch + i[None, :]
    vc_ty = v_cache_ptr.dtype.element_ty
    tl.store(v_cache_ptr + vc_at, tl.load(v_ptr + v_at, mask=kv_ok).to(vc_ty), mask=kv_ok)
    tl.store(v_cache_ptr + vc_at + HALF, tl.load(v_ptr + v_at + HALF, mask=kv_ok).to(vc_ty), mask=kv_ok)


def apply_rope_and_write_kv(q, k, v, cos, sin, k_cache, v_cache, slots, cache_start, write_offset, plan=None):
    """q: (B, T, Hq, D); k, v: (B, T, Hkv, D); cos, sin: (B, T, D) fp32; k_cache, v_cache: (max_batch,
    max_seq_len, Hkv, D); slots, cache_start: (B,) int64; write_offset: int; plan: this module's
    `plan_tree_attention` for the call (checked, not needed), or None -> q rotated (B, T, Hq, D).

    Same contract as `reference.apply_rope_and_write_kv`, fused into one launch: program (b, t) reads
    the token's angles once, rotates its Hq query heads (returned) and Hkv key heads in fp32 (rounded
    to the input dtype, then to the cache's) and writes the keys and values straight into their cache
    slot, read from ``cache_start`` on the device. The last dimension of every tensor must be contiguous.
    """
    B, T, Hq, D = check_rope_kv_call(_IMPL, plan, q, k, v, cos, sin, k_cache, v_cache, slots, cache_start,
                                     write_offset)
    Hkv = k.shape[2]
    for name, x in (("q", q), ("k", k), ("v", v), ("cos", cos), ("sin", sin), ("k_cache", k_cache),
                    ("v_cache", v_cache)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous, got strides {x.stride()}")
    q_out = torch.empty(B, T, Hq, D, dtype=q.dtype, device=q.device)
    if B == 0 or T == 0:
        return q_out
    half = D // 2
    apply_rope_and_write_kv_kernel[(B * T,)](
        q, k, v, cos, sin, k_cache, v_cache, q_out, slots.contiguous(), cache_start.contiguous(),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), cos.stride(0), cos.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), T, write_offset,
        NUM_Q_HEADS=Hq, NUM_KV_HEADS=Hkv, HALF=half, BLOCK_H=triton.next_power_of_2(max(Hq, Hkv)),
        BLOCK_HALF=triton.next_power_of_2(half))
    return q_out
