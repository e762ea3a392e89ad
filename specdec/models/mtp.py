"""MTP draft layers in the DeepSeek/MiMo layout: enorm, hnorm, eh_proj, a decoder block, shared head."""
from __future__ import annotations

import torch
from torch import nn

from ..checks import check_int
from .draft_common import DraftConfig, DraftModelBase, draft_config_like, randomize_
from .linear import Linear
from .layers import AttentionMetadata, LlamaDecoderLayer, RMSNorm, rope_cos_sin
from .outputs import ModelOutput
from .io import load_strict, read_config, read_state_dict


class MTPLayer(LlamaDecoderLayer):
    def __init__(self, config: DraftConfig):
        super().__init__(config)
        H = config.hidden_size
        self.enorm = RMSNorm(H, config.rms_norm_eps)
        self.hnorm = RMSNorm(H, config.rms_norm_eps)
        self.eh_proj = Linear(2 * H, H, bias=False)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(H, config.rms_norm_eps)


class MTPDraftModel(DraftModelBase):
    """S MTP layers; layer k at position t reads (hidden_t, x_{t+k+1}) and predicts x_{t+k+2}, where
    hidden_t is the target's h_t (MiMo style) or layer k-1's output at t (Step-3.5 style,
    `config.chain_hidden_states`). The LM head is the target's."""

    architecture = "MTPDraftModel"

    def __init__(self, config: DraftConfig, target):
        super().__init__(config, target)
        self.layers = nn.ModuleList(MTPLayer(config) for _ in range(config.num_hidden_layers))

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def chain_hidden_states(self) -> bool:
        return self.config.chain_hidden_states

    def forward_layer(self, k: int, input_ids, hidden_states, positions, cache=None,
                      meta: AttentionMetadata | None = None, return_logits=True):
        """Layer k. input_ids, positions: (B, T) int64; hidden_states: (B, T, H) -> ModelOutput: logits
        (B, T, V) fp32 (None when not return_logits; `layer_logits(k, rows of hidden)` gives them), hidden
        (B, T, H) (the block's output, read by layer k+1 in Step-3.5 style)."""
        # The cached path is inference only: writing into the cache must not build a graph.
        with torch.set_grad_enabled(cache is None and torch.is_grad_enabled()):
            layer = self.layers[k]
            emb, hidden = layer.enorm(self.target.embed(input_ids)), layer.hnorm(hidden_states.to(self.dtype))
            if self.config.mtp_layout == "mimo":  # MiMo: hidden first, and no token embedding at position 0
                emb = emb.masked_fill((positions == 0)[..., None], 0.0)
                x = layer.eh_proj(torch.cat([hidden, emb], dim=-1))
            else:
                x = layer.eh_proj(torch.cat([emb, hidden], dim=-1))
            c = self.config
            cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta, c.rope_scaling,
                                    None if cache is None else cache.max_seq_len)
            x = LlamaDecoderLayer.forward(layer, x, cos, sin, None if cache is None else cache.layer(k), meta)
            return ModelOutput(self.layer_logits(k, x) if return_logits else None, x)

    def layer_logits(self, k: int, hidden):
        """hidden: (..., H), layer k's output -> its logits (..., V) (shared head norm, target LM head, its dtype)."""
        return self.target.compute_logits(self.layers[k].shared_head.norm(hidden))


#: Where real checkpoints keep their MTP layers, beside the target's weights in the target's directory:
#: DeepSeek NextN at model.layers.{num_hidden_layers + k}.*, MiMo at model.mtp_layers.{k}.* (renamed parts).
_MIMO_NAMES = {"token_layernorm": "enorm", "hidden_layernorm": "hnorm", "input_proj": "eh_proj",
               "final_layernorm": "shared_head.norm"}


def mtp_from_target_dir(path, target, layout: str, num_layers: int | None = None, device=None,
                        dtype: torch.dtype | None = None) -> "MTPDraftModel":
    """The MTP layers stored in a target's checkpoint directory, in DeepSeek NextN ("deepseek") or MiMo ("mimo")
    layout, as an MTPDraftModel on `target`. num_layers: how many (default: the config's
    num_nextn_predict_layers). The decoder block follows the target's family (Qwen2 biases for MiMo...); each
    layer's own embedding and shared_head.head, when present, are not loaded: SGLang runs them with the target's."""
    if layout not in ("deepseek", "mimo"):
        raise ValueError(f"layout must be 'deepseek' or 'mimo', got {layout!r}")
    raw = read_config(path)
    S = num_layers if num_layers is not None else raw.get("num_nextn_predict_layers")
    S = check_int(f"{path}: the number of MTP layers (num_nextn_predict_layers)", S, 1)
    model = MTPDraftModel(draft_config_like(target, S, mtp_layout=layout), target)
    L = target.config.num_hidden_layers
    prefix = {k: f"model.layers.{L + k}." if layout == "deepseek" else f"model.mtp_layers.{k}." for k in range(S)}
    sd = {}
    for key, value in read_state_dict(path).items():
        for k, p in prefix.items():
            if not key.startswith(p):
                continue
            rest = key[len(p):]
            part = rest.split(".", 1)[0]
            if rest in ("embed_tokens.weight", "shared_head.head.weight"):
                break
            if layout == "mimo" and part in _MIMO_NAMES:
                rest = _MIMO_NAMES[part] + rest[len(part):]
            sd[f"layers.{k}.{rest}"] = value
            break
    load_strict(model, sd, path)
    return model.to(device=device or target.device, dtype=dtype or target.dtype).eval()


def random_mtp(target, num_layers, chain_hidden_states=False, seed=0, std=None, **overrides) -> MTPDraftModel:
    model = MTPDraftModel(draft_config_like(target, num_layers, chain_hidden_states, **overrides), target)
    randomize_(model, seed, std if std is not None else target.config.hidden_size ** -0.5)
    return model.to(device=target.device, dtype=target.dtype).eval()
