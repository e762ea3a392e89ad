"""Building blocks shared by the target, the EAGLE head and the MTP layers (Llama architecture)."""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class AttentionMetadata:
    """How one forward's new tokens meet the KV cache (shared by every layer of the forward).

    slots: (B,) int64 cache rows; cache_start: (B,) int64 committed length; the T new tokens are
    written at cache_start + write_offset + t and see the committed prefix plus the in-flight slots
    selected by tree_mask (B, T, write_offset + T) (causal when None). attn_len: host-side upper
    bound on cache_start + write_offset + T. ops: the ops module (`reference` or `fast`) whose
    `apply_rope_and_write_kv` and `tree_attention` every layer calls; there is no default, so a
    forgotten argument is an error, never a silent reference path.
    """

    slots: torch.Tensor
    cache_start: torch.Tensor
    attn_len: int
    ops: ModuleType
    write_offset: int = 0
    tree_mask: torch.Tensor | None = None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)


def rope_cos_sin(positions, head_dim: int, theta: float):
    """positions: (B, T) int64 -> cos, sin: (B, T, head_dim) fp32 (Hugging Face's rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    """x: (B, T, H, D); cos, sin: (B, T, D) -> (B, T, H, D)."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, :, None] + rotated * sin[:, :, None]).to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=cfg.attention_bias)

    def forward(self, x, cos, sin, kv_cache=None, meta: AttentionMetadata | None = None):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim)
        scale = self.head_dim ** -0.5
        if kv_cache is None:
            # Training / cache-free path: plain causal attention over the T tokens.
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            rep = self.num_heads // self.num_kv_heads
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.repeat_interleave(rep, 2).transpose(1, 2),
                v.repeat_interleave(rep, 2).transpose(1, 2), is_causal=True, scale=scale).transpose(1, 2)
        else:
            k_cache, v_cache = kv_cache
            q = meta.ops.apply_rope_and_write_kv(q, k, v, cos, sin, k_cache, v_cache, meta.slots, meta.cache_start,
                                                 meta.write_offset)
            out = meta.ops.tree_attention(q, k_cache, v_cache, meta.slots, meta.cache_start, meta.write_offset,
                                          meta.tree_mask, meta.attn_len, scale)
        return self.o_proj(out.reshape(B, T, -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x, cos, sin, kv_cache=None, meta=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))
