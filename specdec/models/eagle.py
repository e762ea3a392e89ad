"""EAGLE draft head: fc over [token embedding; target hidden state], one Llama decoder layer."""
from __future__ import annotations

import torch
from torch import nn

from .draft_common import DraftConfig, DraftHeadBase, draft_config_like, randomize_
from .io import load_strict, read_config, read_state_dict
from .linear import Linear
from .layers import LlamaDecoderLayer, RMSNorm


class EagleDraftHead(DraftHeadBase):
    """At position t it reads (h_t, x_{t+1}) and predicts x_{t+2}; its output hidden state (what its
    LM head reads) stands in for the target's h_{t+1} at the next draft step. Embedding and LM head
    are the target's."""

    architecture = "EagleDraftHead"

    def __init__(self, config: DraftConfig, target):
        super().__init__(config, target)
        if config.num_hidden_layers != 1:
            raise ValueError(f"an EAGLE head has one decoder layer, got num_hidden_layers={config.num_hidden_layers}")
        H = config.hidden_size
        eagle = config.eagle_layout == "eagle"
        self.fc = Linear(2 * H, H, bias=eagle)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, input_norm=not eagle)])
        self.norm = nn.Identity() if eagle else RMSNorm(H, config.rms_norm_eps)

    def step(self, input_ids, hidden_states, cos, sin, kv, meta):
        """fc over [token embedding; hidden], the decoder layer, the final norm -> the output hidden (B, T, H).
        `kv` is a layer's (k, v) cache or None (causal over the T tokens)."""
        x = self.fc(torch.cat([self.target.embed(input_ids), hidden_states.to(self.dtype)], dim=-1))
        out = self.layers[0](x, cos, sin, kv, meta)
        return out if isinstance(self.norm, nn.Identity) else self.norm(out, None if meta is None else meta.ops)

    def compute_logits(self, hidden):
        """hidden: (..., H), the head's output -> logits (..., V) in the target LM head's dtype."""
        return self.target.compute_logits(hidden)

    def get_output_embeddings(self):
        """The LM head `compute_logits` applies: the target's."""
        return self.target.lm_head

    #: architectures under which EAGLE-1/2 checkpoints in SafeAILab's layout are published or run by SGLang
    EAGLE_ARCHITECTURES = ("LlamaForCausalLMEagle", "LlamaForCausalLM", "EagleLlamaForCausalLM")

    @classmethod
    def from_pretrained(cls, path, target, device=None, dtype: torch.dtype | None = None):
        """This project's heads (architectures ["EagleDraftHead"]), or an EAGLE-1/2 checkpoint in SafeAILab's
        layout (`fc.weight`, `fc.bias`, `layers.0.*` without `input_layernorm`, optionally under `model.`;
        architectures LlamaForCausalLMEagle / LlamaForCausalLM): its `embed_tokens` and `lm_head`, when present,
        are not loaded, since SGLang runs the head with the target's."""
        raw = read_config(path)
        archs = raw.get("architectures") if isinstance(raw, dict) else None
        arch = archs[0] if isinstance(archs, list) and len(archs) == 1 else None
        if arch not in cls.EAGLE_ARCHITECTURES:
            return super().from_pretrained(path, target, device, dtype)
        config = DraftConfig.from_dict(dict(raw, eagle_layout="eagle"), where=f"{path}/config.json")
        model = cls(config, target)
        sd = {}
        for key, value in read_state_dict(path).items():
            key = key.removeprefix("model.")
            if key not in ("embed_tokens.weight", "lm_head.weight"):
                sd[key] = value
        load_strict(model, sd, path)
        return model.to(device=device or target.device, dtype=dtype or target.dtype).eval()


def random_eagle_head(target, seed=0, std=None, **overrides) -> EagleDraftHead:
    head = EagleDraftHead(draft_config_like(target, 1, **overrides), target)
    randomize_(head, seed, std if std is not None else target.config.hidden_size ** -0.5)
    return head.to(device=target.device, dtype=target.dtype).eval()
