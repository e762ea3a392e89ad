"""Attention over a KV cache with a committed causal prefix and a tree of in-flight tokens."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.models.layers import apply_rope
from specdec.op_checks import check_attention_args, check_rope_kv_args


def apply_rope_and_write_kv(q, k, v, cos, sin, k_cache, v_cache, slots, cache_start, write_offset):
    """q: (B, T, Hq, D); k, v: (B, T, Hkv, D); cos, sin: (B, T, D) fp32; k_cache, v_cache: (max_batch,
    max_seq_len, Hkv, D); slots, cache_start: (B,) int64; write_offset: int -> q rotated (B, T, Hq, D).

    Rotates q and k by their positions' angles (rotate-half layout, fp32, cast back to the input dtype)
    and writes the rotated k and v of token t at cache row slots[b], slot cache_start[b] + write_offset + t.
    """
    B, T, _, _ = check_rope_kv_args(q, k, v, cos, sin, k_cache, v_cache, slots, cache_start, write_offset)
    cols = cache_start[:, None] + write_offset + torch.arange(T, device=q.device)
    k_cache[slots[:, None], cols] = apply_rope(k, cos, sin).to(k_cache.dtype)
    v_cache[slots[:, None], cols] = v.to(v_cache.dtype)
    return apply_rope(q, cos, sin)


def build_attention_mask(cache_start, num_new: int, write_offset: int, tree_mask, attn_len: int):
    """cache_start: (B,) int64, tree_mask: (B, T, write_offset + T) bool or None -> (B, T, attn_len) bool.

    Key slot j of request b is visible to new token t when j < cache_start[b] (committed prefix),
    or j = cache_start[b] + r with 0 <= r < write_offset + T and tree_mask[b, t, r] (in-flight tokens;
    without a tree mask, r <= write_offset + t: causal over the in-flight tokens).
    """
    device = cache_start.device
    rel = torch.arange(attn_len, device=device)[None, None, :] - cache_start[:, None, None]  # (B,1,L)
    prefix = rel < 0
    n_inflight = write_offset + num_new
    if tree_mask is None:
        t = torch.arange(num_new, device=device)[None, :, None]
        inflight = (rel >= 0) & (rel <= write_offset + t)
    else:
        in_range = (rel >= 0) & (rel < n_inflight)
        idx = rel.clamp(0, n_inflight - 1).expand(-1, num_new, -1)
        inflight = in_range & torch.gather(tree_mask, 2, idx)
    return prefix | inflight


def tree_attention(q, k_cache, v_cache, slots, cache_start, write_offset, tree_mask, attn_len, scale):
    """q: (B, T, Hq, D); k_cache, v_cache: (max_batch, max_seq_len, Hkv, D); slots, cache_start: (B,)
    int64; write_offset, attn_len: int; tree_mask: (B, T, write_offset + T) bool or None -> (B, T, Hq, D).

    The new tokens' keys and values must already be in the cache at slots
    cache_start + write_offset + t. `attn_len` is a host-side upper bound on cache_start + write_offset + T
    (a Python int, so the step makes no host sync). Dense boolean mask + scaled_dot_product_attention,
    computed in fp32 and cast back; grouped-query heads share their KV head without a copy. Cache slots
    past a request's cache_start + write_offset + T are zeroed before use: a stale NaN there would survive
    the mask (0 x NaN) and poison the output.
    """
    B, T, Hq, D = check_attention_args(q, k_cache, v_cache, slots, cache_start, write_offset, tree_mask, attn_len,
                                       scale)
    mask = build_attention_mask(cache_start, T, write_offset, tree_mask, attn_len)
    live = (torch.arange(attn_len, device=q.device) < (cache_start + write_offset + T)[:, None])[:, None, :, None]
    k = torch.where(live, k_cache[slots, :attn_len].float().transpose(1, 2), 0.0)  # (B, Hkv, L, D)
    v = torch.where(live, v_cache[slots, :attn_len].float().transpose(1, 2), 0.0)
    out = F.scaled_dot_product_attention(q.float().transpose(1, 2), k, v, attn_mask=mask[:, None], scale=scale,
                                         enable_gqa=Hq != k.shape[1])
    return out.transpose(1, 2).to(q.dtype)
