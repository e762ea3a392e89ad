"""Attention over a KV cache with a committed causal prefix and a tree of in-flight tokens."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.ops.op_checks import check_attention_call, check_plan_args, check_rope_kv_call
from specdec.ops.contract import TreeAttentionPlan

_IMPL = "reference"


def plan_tree_attention(slots, cache_start, write_offset, tree_mask, attn_len, num_new, max_seq_len):
    """slots, cache_start: (B,) int64; write_offset, attn_len, num_new (T), max_seq_len: int; tree_mask:
    (B, T, write_offset + T) bool or None -> TreeAttentionPlan, shared by every layer of one forward.

    Holds the (B, 1, T, attn_len) visibility mask of `tree_attention` in the additive form attention takes
    (0 where visible, -inf elsewhere; fp32: a boolean mask would be converted again by every layer's call,
    three ops each, to the same values), and flat cache-row indices
    (row = slot * max_seq_len + position, for caches whose (slot, position) dims merge into one):
    where each new token's key goes, and which row each of the attn_len keys is read from. A key
    past the request's cache_start + write_offset + T is read from the request's last in-flight row
    instead: it is masked out, and reading a finite stand-in keeps whatever a stale slot holds (a NaN
    from an earlier request) out of the output, where 0 x NaN would survive the mask.
    """
    B = check_plan_args(slots, cache_start, write_offset, tree_mask, attn_len, num_new, max_seq_len)
    T, device = num_new, slots.device
    visible = build_attention_mask(cache_start, T, write_offset, tree_mask, attn_len)[:, None]
    bias = torch.where(visible, 0.0, float("-inf"))  # fp32, the default dtype of a where over two Python floats
    row0 = slots * max_seq_len
    last = cache_start + (write_offset + T - 1)  # the request's last in-flight slot
    key_cols = torch.minimum(torch.arange(attn_len, device=device)[None, :], last[:, None])
    key_rows = (row0[:, None] + key_cols).reshape(-1)
    write_rows = (row0 + cache_start)[:, None] + (torch.arange(T, device=device) + write_offset)
    return TreeAttentionPlan(_IMPL, B, T, write_offset, attn_len, max_seq_len,
                             dict(mask_bias=bias, key_rows=key_rows, write_rows=write_rows.reshape(-1)))


def _cache_rows(cache):
    """(max_batch, max_seq_len, H, D) -> a (max_batch * max_seq_len, H, D) view, or None if the layout has none."""
    try:
        return cache.view(-1, *cache.shape[2:])
    except RuntimeError:
        return None


def _rotate_half_fp32(x, cos, sin, plan):
    """x: (B, T, H, D); cos, sin: (B, T, D) fp32 -> x rotated, fp32 (Hugging Face's rotate-half layout).

    x·cos + roll(x, D/2)·sin', with sin' the sine whose first half is negated, is rotate-half's
    x·cos + cat(-x2, x1)·sin bit for bit (a negation is exact) in four ops fewer; sin' and the broadcast
    views are made once per plan (every layer of a forward passes the same cos and sin)."""
    memo = plan.tensors.get("rope_factors")
    if memo is None or memo[0] is not cos or memo[1] is not sin:
        half = sin.shape[-1] // 2
        signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        memo = plan.tensors["rope_factors"] = (cos, sin, cos.unsqueeze(2), signed.unsqueeze(2))
    xf = _cast(x, torch.float32)
    return torch.addcmul(xf * memo[2], xf.roll(x.shape[-1] // 2, -1), memo[3])


def _cast(x, dtype):
    return x if x.dtype == dtype else x.to(dtype)


def apply_rope_and_write_kv(q, k, v, cos, sin, k_cache, v_cache, slots, cache_start, write_offset, plan=None):
    """q: (B, T, Hq, D); k, v: (B, T, Hkv, D); cos, sin: (B, T, D) fp32; k_cache, v_cache: (max_batch,
    max_seq_len, Hkv, D); slots, cache_start: (B,) int64; write_offset: int; plan: this module's
    `plan_tree_attention` for the call, or None -> q rotated (B, T, Hq, D).

    Rotates q and k by their positions' angles (rotate-half layout, fp32, cast back to the input dtype)
    and writes the rotated k and v of token t at cache row slots[b], slot cache_start[b] + write_offset + t.
    """
    B, T, Hq, D = check_rope_kv_call(_IMPL, plan, q, k, v, cos, sin, k_cache, v_cache, slots, cache_start,
                                     write_offset)
    max_seq_len = k_cache.shape[1]
    if plan is None:
        plan = plan_tree_attention(slots, cache_start, write_offset, None, write_offset + T, T, max_seq_len)
    # q and k rotate as one tensor: one pass of the elementwise ops instead of two
    qk = _rotate_half_fp32(torch.cat([q, _cast(k, q.dtype)], dim=2), cos, sin, plan)
    k_rot = _cast(_cast(qk[:, :, Hq:], k.dtype), k_cache.dtype).flatten(0, 1)
    v_new = _cast(v, v_cache.dtype).flatten(0, 1)
    rows = plan.tensors["write_rows"]
    for cache, new in ((k_cache, k_rot), (v_cache, v_new)):
        flat = _cache_rows(cache)
        if flat is not None:
            flat.index_copy_(0, rows, new)
        else:  # a cache whose (slot, position) dims do not merge (a strided view): index both
            cache[rows // max_seq_len, rows % max_seq_len] = new
    return _cast(qk[:, :, :Hq], q.dtype)


def build_attention_mask(cache_start, num_new: int, write_offset: int, tree_mask, attn_len: int):
    """cache_start: (B,) int64, tree_mask: (B, T, write_offset + T) bool or None -> (B, T, attn_len) bool.

    Key slot j of request b is visible to new token t when j < cache_start[b] (committed prefix),
    or j = cache_start[b] + r with 0 <= r < write_offset + T and tree_mask[b, t, r] (in-flight tokens;
    without a tree mask, r <= write_offset + t: causal over the in-flight tokens).
    """
    device = cache_start.device
    rel = torch.arange(attn_len, device=device)[None, None, :] - cache_start[:, None, None]  # (B, 1, L)
    if tree_mask is None:  # causal: every committed slot (rel < 0) also passes rel <= write_offset + t
        return rel <= (torch.arange(num_new, device=device) + write_offset)[None, :, None]
    # committed (rel < 0), in flight (0 <= rel < write_offset + T: the tree mask's column rel) or neither
    idx = rel.clamp(0, write_offset + num_new - 1)
    return torch.where(idx == rel, torch.gather(tree_mask, 2, idx.expand(-1, num_new, -1)), rel < 0)


def tree_attention(q, k_cache, v_cache, slots, cache_start, write_offset, tree_mask, attn_len, scale, plan=None):
    """q: (B, T, Hq, D); k_cache, v_cache: (max_batch, max_seq_len, Hkv, D); slots, cache_start: (B,)
    int64; write_offset, attn_len: int; tree_mask: (B, T, write_offset + T) bool or None; plan: this
    module's `plan_tree_attention` for the call, or None -> (B, T, Hq, D).

    The new tokens' keys and values must already be in the cache at slots
    cache_start + write_offset + t. `attn_len` is a host-side upper bound on cache_start + write_offset + T
    (a Python int, so the step makes no host sync). One gather of the attn_len keys and values per
    request (keys past the request's length replaced by a finite stand-in, see `plan_tree_attention`),
    then scaled_dot_product_attention with the dense visibility mask, in fp32, cast back; grouped-query
    heads share their KV head without a copy.
    """
    B, T, Hq, D = check_attention_call(_IMPL, plan, q, k_cache, v_cache, slots, cache_start, write_offset, tree_mask,
                                       attn_len, scale)
    max_seq_len = k_cache.shape[1]
    if plan is None:
        plan = plan_tree_attention(slots, cache_start, write_offset, tree_mask, attn_len, T, max_seq_len)
    rows = plan.tensors["key_rows"]
    k, v = (_cast(_gather_rows(cache, rows).view(B, attn_len, *cache.shape[2:]).transpose(1, 2), torch.float32)
            for cache in (k_cache, v_cache))
    out = F.scaled_dot_product_attention(_cast(q, torch.float32).transpose(1, 2), k, v,
                                         attn_mask=plan.tensors["mask_bias"], scale=scale, enable_gqa=Hq != k.shape[1])
    return _cast(out.transpose(1, 2), q.dtype)


def _gather_rows(cache, rows):
    flat = _cache_rows(cache)
    return (flat if flat is not None else cache.reshape(-1, *cache.shape[2:])).index_select(0, rows)
