"""Building blocks shared by the target, the EAGLE head and the MTP layers (Llama architecture).

The q/k/v projections are one fused matrix (`qkv_proj`) and so are gate/up (`gate_up_proj`): one
matmul instead of three (two) per layer. State dicts keep Hugging Face's separate names in both
directions (`load_state_dict` fuses, `state_dict` splits), so checkpoints are unchanged.

Inside a layer, submodules are run through `.forward`, not called: `nn.Module.__call__` costs about 3 us, and a
decode layer of a small model on a CPU makes eight such calls in about 300 us. Hooks on a submodule of a layer do
not fire; hooks on the layers and the model do.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from .linear import Linear
from .rope import rope_cos_sin  # noqa: F401  (the models' import point)


@dataclass
class AttentionMetadata:
    """How one forward's new tokens meet the KV cache (shared by every layer of the forward).

    slots: (B,) int64 cache rows; cache_start: (B,) int64 committed length; the T new tokens are
    written at cache_start + write_offset + t and see the committed prefix plus the in-flight slots
    selected by tree_mask (B, T, write_offset + T) (causal when None). attn_len: host-side upper
    bound on cache_start + write_offset + T. ops: the ops module (`reference` or `fast`) whose
    `plan_tree_attention`, `apply_rope_and_write_kv` and `tree_attention` every layer calls; there is
    no default, so a forgotten argument is an error, never a silent reference path.

    The ops' plan (masks and indices every layer shares) is built once, by the forward's first layer.
    """

    slots: torch.Tensor
    cache_start: torch.Tensor
    attn_len: int
    ops: ModuleType
    write_offset: int = 0
    tree_mask: torch.Tensor | None = None
    _plans: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def plan(self, num_new: int, max_seq_len: int):
        """The ops' attention plan for T = num_new new tokens over a cache of max_seq_len slots."""
        key = (num_new, max_seq_len)
        if key not in self._plans:
            self._plans[key] = self.ops.plan_tree_attention(self.slots, self.cache_start, self.write_offset,
                                                            self.tree_mask, self.attn_len, num_new, max_seq_len)
        return self._plans[key]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.normalized_shape = (dim,)

    def forward(self, x, ops: ModuleType | None = None):
        """x: (..., dim) -> (..., dim) in x's dtype. ops: the forward's ops module (`meta.ops`), whose `rms_norm`
        (one kernel) then runs it; without one (a caller with no metadata: the draft heads, the final norm, the
        cache-free path that training differentiates) the torch ops below, which `reference.rms_norm` repeats."""
        weight = self._parameters["weight"]  # not nn.Module's attribute lookup: see Linear.forward
        rms_norm = getattr(ops, "rms_norm", None)
        if rms_norm is not None:
            return rms_norm(x.reshape(-1, x.shape[-1]), weight, self.eps).view(x.shape)
        if x.dtype is torch.float32 and weight.dtype is torch.float32:
            return torch.rms_norm(x, self.normalized_shape, weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (weight.float() * xf).to(x.dtype)


def apply_rope(x, cos, sin):
    """x: (B, T, H, D); cos, sin: (B, T, D) -> (B, T, H, D)."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, :, None] + rotated * sin[:, :, None]).to(x.dtype)


def _fuse_on_load(module: nn.Module, parts: dict[str, tuple[str, ...]]) -> None:
    """Let `module` load Hugging Face's separate projections into its fused ones, and save them split.

    parts: fused linear name -> the separate linear names it stacks (output rows, in that order)."""
    sizes = {name: [getattr(module, name).out_features_of[p] for p in ps] for name, ps in parts.items()}

    def load_hook(state_dict, prefix, *args):
        for fused, ps in parts.items():
            for suffix in ("weight", "bias"):
                keys = [f"{prefix}{p}.{suffix}" for p in ps]
                if all(k in state_dict for k in keys):
                    state_dict[f"{prefix}{fused}.{suffix}"] = torch.cat([state_dict.pop(k) for k in keys])

    def save_hook(mod, state_dict, prefix, *args):
        for fused, ps in parts.items():
            for suffix in ("weight", "bias"):
                key = f"{prefix}{fused}.{suffix}"
                if key in state_dict:
                    for p, t in zip(ps, state_dict.pop(key).split(sizes[fused])):
                        state_dict[f"{prefix}{p}.{suffix}"] = t
        return state_dict

    module._register_load_state_dict_pre_hook(load_hook)
    module._register_state_dict_hook(save_hook)


class FusedLinear(Linear):
    """nn.Linear whose output rows stack several Hugging Face projections (`out_features_of` names them)."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool):
        super().__init__(in_features, sum(parts.values()), bias=bias)
        self.out_features_of = dict(parts)


def hf_named_parameters(module: nn.Module):
    """(Hugging Face name, tensor) for every parameter of `module`, fused ones split into views of their
    parts (writing a view writes the fused parameter): initialisers iterate the same tensors, in the same
    order, as on the unfused layout."""
    fused = {name: m for name, m in module.named_modules() if isinstance(m, FusedLinear)}
    for name, p in module.named_parameters():
        owner, _, suffix = name.rpartition(".")
        if owner in fused:
            parent = owner.rpartition(".")[0]
            m = fused[owner]
            for part, t in zip(m.out_features_of, p.split(list(m.out_features_of.values()))):
                yield (f"{parent}.{part}.{suffix}" if parent else f"{part}.{suffix}"), t
        else:
            yield name, p


class LlamaAttention(nn.Module):
    def __init__(self, cfg, in_features: int | None = None):
        """in_features: the width q/k/v read (hidden_size unless given: EAGLE-3's midlayer reads 2H)."""
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        D = self.head_dim
        self.qkv_proj = FusedLinear(in_features or cfg.hidden_size,
                                    {"q_proj": self.num_heads * D, "k_proj": self.num_kv_heads * D,
                                     "v_proj": self.num_kv_heads * D}, bias=cfg.qkv_bias)
        self.o_proj = Linear(self.num_heads * D, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:  # Qwen3: each head's q and k RMS-normalised before the rotation
            self.q_norm = RMSNorm(D, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.has_qk_norm = cfg.qk_norm
        _fuse_on_load(self, {"qkv_proj": ("q_proj", "k_proj", "v_proj")})

    def forward(self, x, cos, sin, kv_cache=None, meta: AttentionMetadata | None = None):
        B, T, _ = x.shape
        Hq, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = self.qkv_proj.forward(x).view(B, T, Hq + 2 * Hkv, D).split([Hq, Hkv, Hkv], dim=2)
        if self.has_qk_norm:
            ops = None if meta is None else meta.ops
            q, k = self.q_norm.forward(q, ops), self.k_norm.forward(k, ops)
        scale = D ** -0.5
        if kv_cache is None:
            # Training / cache-free path: plain causal attention over the T tokens.
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True, scale=scale, enable_gqa=Hq != Hkv).transpose(1, 2)
        else:
            k_cache, v_cache = kv_cache
            plan = meta.plan(T, k_cache.shape[1])
            q = meta.ops.apply_rope_and_write_kv(q, k, v, cos, sin, k_cache, v_cache, meta.slots, meta.cache_start,
                                                 meta.write_offset, plan=plan)
            out = meta.ops.tree_attention(q, k_cache, v_cache, meta.slots, meta.cache_start, meta.write_offset,
                                          meta.tree_mask, meta.attn_len, scale, plan=plan)
        return self.o_proj.forward(out.reshape(B, T, -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        I = cfg.intermediate_size  # noqa: E741
        self.gate_up_proj = FusedLinear(cfg.hidden_size, {"gate_proj": I, "up_proj": I}, bias=False)
        self.down_proj = Linear(I, cfg.hidden_size, bias=False)
        _fuse_on_load(self, {"gate_up_proj": ("gate_proj", "up_proj")})

    def forward(self, x, ops: ModuleType | None = None):
        """x: (..., hidden) -> (..., hidden) in x's dtype. ops: the forward's ops module (`meta.ops`), whose
        `silu_and_mul` (one kernel) then computes the activation; without one (a caller with no metadata, the
        unfused decoder layer, the cache-free path that training differentiates) the torch ops below, which
        `reference.silu_and_mul` repeats."""
        gate_up = self.gate_up_proj.forward(x)
        I = gate_up.shape[-1] // 2  # noqa: E741
        silu_and_mul = getattr(ops, "silu_and_mul", None)
        if silu_and_mul is not None:
            return self.down_proj.forward(silu_and_mul(gate_up.reshape(-1, 2 * I)).view(*gate_up.shape[:-1], I))
        return self.down_proj.forward(F.silu(gate_up[..., :I]) * gate_up[..., I:])


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg, input_norm: bool = True):
        """input_norm=False: no RMSNorm before attention (SafeAILab EAGLE's first draft layer)."""
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if input_norm else nn.Identity()
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x, cos, sin, kv_cache=None, meta=None):
        fused_add_rms_norm = None if meta is None else getattr(meta.ops, "fused_add_rms_norm", None)
        if fused_add_rms_norm is None:
            x = x + self.self_attn.forward(self.input_layernorm.forward(x), cos, sin, kv_cache, meta)
            return x + self.mlp.forward(self.post_attention_layernorm.forward(x))
        # The ops' kernels: the residual add after attention fused with the norm that reads its sum (SGLang's
        # fused_add_rmsnorm), each norm one launch. x + a and a + x are the same IEEE sum, so the reference ops
        # give the unfused path's numbers bit for bit.
        x, mlp_out = self.forward_carry(x, None, cos, sin, kv_cache, meta)
        return x + mlp_out

    def forward_carry(self, x, pending, cos, sin, kv_cache, meta):
        """The fused path with the residual stream carried between layers (SGLang's decoder layers return the
        residual beside their output): x (B, T, H) the stream, pending (B, T, H) or None an MLP output not yet
        added to it, which this layer's input norm adds in its fused kernel. meta.ops must have
        `fused_add_rms_norm`. -> (x, mlp_out): the stream after this layer's attention add, and this layer's MLP
        output, left for the next layer's input norm (or the final norm) to add."""
        fused_add_rms_norm, H = meta.ops.fused_add_rms_norm, x.shape[-1]
        norm_in = self.input_layernorm
        if isinstance(norm_in, nn.Identity):
            attn_in = x = x if pending is None else x + pending
        elif pending is None:
            attn_in = norm_in.forward(x, meta.ops)
        else:
            attn_in, x = fused_add_rms_norm(pending.reshape(-1, H), x.reshape(-1, H), norm_in._parameters["weight"],
                                            norm_in.eps)
            attn_in, x = attn_in.view(pending.shape), x.view(pending.shape)
        attn_out = self.self_attn.forward(attn_in, cos, sin, kv_cache, meta)
        norm_post = self.post_attention_layernorm
        normed, x_new = fused_add_rms_norm(attn_out.reshape(-1, H), x.reshape(-1, H),
                                           norm_post._parameters["weight"], norm_post.eps)
        return x_new.view(x.shape), self.mlp.forward(normed.view(x.shape), meta.ops)
