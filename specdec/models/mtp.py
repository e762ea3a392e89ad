"""MTP draft layers in the DeepSeek/MiMo layout: enorm, hnorm, eh_proj, a decoder block, shared head."""
from __future__ import annotations

import torch
from torch import nn

from .draft_common import DraftConfig, DraftModelBase, draft_config_like, randomize_
from .linear import Linear
from .layers import AttentionMetadata, LlamaDecoderLayer, RMSNorm, rope_cos_sin


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
        """Layer k. input_ids, positions: (B, T) int64; hidden_states: (B, T, H) -> logits (B, T, V) fp32
        (None when not return_logits; `layer_logits(k, rows of hidden)` gives them), hidden (B, T, H)
        (the block's output, read by layer k+1 in Step-3.5 style)."""
        # The cached path is inference only: writing into the cache must not build a graph.
        with torch.set_grad_enabled(cache is None and torch.is_grad_enabled()):
            layer = self.layers[k]
            x = layer.eh_proj(torch.cat([layer.enorm(self.target.embed(input_ids)),
                                         layer.hnorm(hidden_states.to(self.dtype))], dim=-1))
            cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta,
                                    self.config.rope_scaling)
            x = LlamaDecoderLayer.forward(layer, x, cos, sin, None if cache is None else cache.layer(k), meta)
            return (self.layer_logits(k, x) if return_logits else None), x

    def layer_logits(self, k: int, hidden):
        """hidden: (..., H), layer k's output -> its logits (..., V) fp32 (shared head norm, target LM head)."""
        return self.target.compute_logits(self.layers[k].shared_head.norm(hidden))


def random_mtp(target, num_layers, chain_hidden_states=False, seed=0, std=None, **overrides) -> MTPDraftModel:
    model = MTPDraftModel(draft_config_like(target, num_layers, chain_hidden_states, **overrides), target)
    randomize_(model, seed, std if std is not None else target.config.hidden_size ** -0.5)
    return model.to(device=target.device, dtype=target.dtype).eval()
