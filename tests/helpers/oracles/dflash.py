"""The DFlash drafter's forward written out in float64 from a checkpoint's raw tensors (z-lab's names)."""
from __future__ import annotations

import torch


def dflash_logits_from_tensors(sd: dict, cfg: dict, embed, lm_head, features, block_ids) -> torch.Tensor:
    """z-lab's DFlash forward written out in float64 from a checkpoint's raw tensors (`sd`, names as z-lab's
    safetensors hold them) and config.json (`cfg`), for one request: the context features (Tc, F*H) at positions
    0..Tc-1, the block `block_ids` (bs,) at Tc..Tc+bs-1 -> logits (bs, V) through the target's `lm_head` (V, H)."""
    return block_hidden_from_tensors(sd, cfg, embed, features, block_ids) @ lm_head.double().T


def block_hidden_from_tensors(sd: dict, cfg: dict, embed, features, block_ids) -> torch.Tensor:
    """The block forward DFlash and DSpark share, in float64 -> the block's normed outputs (bs, H). Every block
    query attends to every context key and every block key (non-causal); q and k RMS-normed per head, rotate-half
    RoPE, SwiGLU MLP; the context is hidden_norm(fc(features)), the same for every layer."""
    f64 = {k: v.double() for k, v in sd.items()}
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // Hq

    def rms(x, w):
        return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    def rope(x, pos):  # x: (T, heads, D)
        inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = torch.cat([pos[:, None].double() * inv[None]] * 2, dim=-1)[:, None, :]
        rot = torch.cat([-x[..., D // 2:], x[..., :D // 2]], dim=-1)
        return x * ang.cos() + rot * ang.sin()

    Tc, bs = features.shape[0], len(block_ids)
    pc, pb = torch.arange(Tc), torch.arange(Tc, Tc + bs)
    ctx = rms(features.double() @ f64["fc.weight"].T, f64["hidden_norm.weight"])
    h = embed.double()[torch.as_tensor(block_ids)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        w = {k[len(p):]: v for k, v in f64.items() if k.startswith(p)}
        x = rms(h, w["input_layernorm.weight"])
        q = rms((x @ w["self_attn.q_proj.weight"].T).view(bs, Hq, D), w["self_attn.q_norm.weight"])
        k_all = torch.cat([ctx, x]) @ w["self_attn.k_proj.weight"].T
        v_all = (torch.cat([ctx, x]) @ w["self_attn.v_proj.weight"].T).view(Tc + bs, Hkv, D)
        k_all = rope(rms(k_all.view(Tc + bs, Hkv, D), w["self_attn.k_norm.weight"]), torch.cat([pc, pb]))
        q = rope(q, pb)
        out = torch.zeros(bs, Hq, D, dtype=torch.float64)
        for head in range(Hq):
            kv = head // (Hq // Hkv)
            att = torch.softmax(q[:, head] @ k_all[:, kv].T / D ** 0.5, dim=-1)
            out[:, head] = att @ v_all[:, kv]
        h = h + out.reshape(bs, Hq * D) @ w["self_attn.o_proj.weight"].T
        x = rms(h, w["post_attention_layernorm.weight"])
        gate, up = x @ w["mlp.gate_proj.weight"].T, x @ w["mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(gate) * up) @ w["mlp.down_proj.weight"].T
    return rms(h, f64["norm.weight"])
