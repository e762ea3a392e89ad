"""What the drafts share: their config, the link to the target, checkpoints; the heads' forward."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .io import load_strict, read_config, read_state_dict, save_dir
from .layers import AttentionMetadata, hf_named_parameters, rope_cos_sin
from .llama import LlamaConfig, dtype_name
from .outputs import ModelOutput


@dataclass
class DraftConfig(LlamaConfig):
    """A draft's decoder config (Llama fields; num_hidden_layers = its number of draft layers).

    chain_hidden_states is used by MTP drafts only: False = MiMo style (every layer reads the
    target's hidden states), True = Step-3.5 style (layer k reads layer k-1's output)."""

    chain_hidden_states: bool = False
    #: EAGLE heads only. "specdec": this project's (fc without bias, layer 0 with its input norm, a final norm
    #: before the LM head). "eagle": SafeAILab EAGLE-1/2 as SGLang's LlamaForCausalLMEagle runs it (fc with a
    #: bias, layer 0 without its input norm, no final norm).
    eagle_layout: str = "specdec"
    #: MTP drafts only. "specdec" and "deepseek" (DeepSeek NextN: eh_proj over [enorm(embedding);
    #: hnorm(hidden)]) compute the same; "mimo" (MiMo: input_proj over [hidden_layernorm(hidden);
    #: token_layernorm(embedding)], the embedding zeroed at position 0) concatenates the other way round.
    mtp_layout: str = "specdec"

    BOOLEAN = LlamaConfig.BOOLEAN + ("chain_hidden_states",)

    def __post_init__(self):
        super().__post_init__()
        if self.eagle_layout not in ("specdec", "eagle"):
            raise ValueError(f"config field eagle_layout must be 'specdec' or 'eagle', got {self.eagle_layout!r}")
        if self.mtp_layout not in ("specdec", "deepseek", "mimo"):
            raise ValueError(f"config field mtp_layout must be 'specdec', 'deepseek' or 'mimo', "
                             f"got {self.mtp_layout!r}")


class DraftModelBase(nn.Module):
    """A draft that shares the target's token embedding and LM head without owning (or saving) them."""

    architecture = ""

    def __init__(self, config: DraftConfig, target):
        super().__init__()
        for name in ("vocab_size", "hidden_size"):
            t, d = getattr(target.config, name), getattr(config, name)
            if t != d:
                raise ValueError(f"draft {name}={d} does not match the target's {name}={t}")
        self.config = config
        self._target = (target,)  # a tuple, so the target's weights are not registered as ours

    @property
    def target(self):
        return self._target[0]

    @property
    def device(self):
        return self.layers[0].post_attention_layernorm.weight.device  # every draft has decoder layers

    @property
    def dtype(self):
        return self.layers[0].post_attention_layernorm.weight.dtype

    def checkpoint(self) -> tuple[dict, dict]:
        """-> (config.json as a dict, state dict): what save_pretrained writes."""
        d = self.config.to_dict()
        d["architectures"] = [self.architecture]
        d["torch_dtype"] = dtype_name(self.dtype)
        return d, self.state_dict()

    def save_pretrained(self, path) -> None:
        save_dir(path, *self.checkpoint())

    @classmethod
    def from_pretrained(cls, path, target, device=None, dtype: torch.dtype | None = None):
        raw = read_config(path)
        archs = raw.get("architectures") if isinstance(raw, dict) else None
        arch = archs[0] if isinstance(archs, list) and len(archs) == 1 else None
        if arch != cls.architecture:
            raise ValueError(f"{path}: architectures={raw.get('architectures')!r}, expected [{cls.architecture!r}]")
        config = DraftConfig.from_dict(raw, where=f"{path}/config.json")
        model = cls(config, target)
        load_strict(model, read_state_dict(path), path)
        return model.to(device=device or target.device, dtype=dtype or target.dtype).eval()


class DraftHeadBase(DraftModelBase):
    """A one-layer draft head (EAGLE, EAGLE-3). `step` is its computation on rotary tables and one layer's
    explicit (k, v) cache, with no grad mode of its own (the trainer runs it with gradients, attending to keys
    that earlier unrolled passes left in the cache); `forward` runs it from positions and a KVCache."""

    def forward(self, input_ids, hidden_states, positions, cache=None, meta: AttentionMetadata | None = None,
                return_logits=True) -> ModelOutput:
        """input_ids, positions: (B, T) int64; hidden_states: (B, T, H) (an EAGLE-3 head also takes the target's
        features, (B, T, F * H)) -> ModelOutput: logits (B, T, V) in the LM head's dtype over the head's
        vocabulary (None when not return_logits; `compute_logits` of chosen rows of hidden gives them), hidden
        (B, T, H) (what the next draft step reads)."""
        # The cached path is inference only: writing into the cache must not build a graph.
        with torch.set_grad_enabled(cache is None and torch.is_grad_enabled()):
            c = self.config
            cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta, c.rope_scaling,
                                    None if cache is None else cache.max_seq_len)
            hidden = self.step(input_ids, hidden_states, cos, sin, None if cache is None else cache.layer(0), meta)
            return ModelOutput(self.compute_logits(hidden) if return_logits else None, hidden)

    def step(self, input_ids, hidden_states, cos, sin, kv, meta) -> torch.Tensor:
        """The head on (token, hidden) pairs -> its output hidden (B, T, H). cos, sin: (B, T, D) rotary tables;
        kv: one layer's (k, v) cache with `meta`, or None (causal over the T tokens)."""
        raise NotImplementedError

    def compute_logits(self, hidden) -> torch.Tensor:
        """hidden: (..., H), the head's output -> logits (..., V) over the head's vocabulary, in
        its LM head's dtype (see `LlamaForCausalLM.compute_logits`)."""
        raise NotImplementedError


def randomize_(module: nn.Module, seed: int, std: float) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_named_parameters(module):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))


def draft_config_like(target, num_layers: int, chain_hidden_states: bool = False, **overrides) -> DraftConfig:
    c = target.config
    kw = dict(model_type=c.model_type, attention_bias=c.attention_bias, vocab_size=c.vocab_size,
              hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
              num_hidden_layers=num_layers, num_attention_heads=c.num_attention_heads,
              num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
              rope_theta=c.rope_theta, rope_scaling=c.rope_scaling, max_position_embeddings=c.max_position_embeddings,
              torch_dtype=c.torch_dtype, chain_hidden_states=chain_hidden_states)
    kw.update(overrides)
    return DraftConfig(**kw)
