"""Llama-architecture target model with Hugging Face config and state-dict names."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from ..checks import check_int, check_real
from .rope import normalize_rope_scaling
from .io import load_strict, read_config, read_state_dict, save_dir
from .linear import Linear
from .layers import AttentionMetadata, LlamaDecoderLayer, RMSNorm, hf_named_parameters, rope_cos_sin
from .outputs import ModelOutput

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (config.json's torch_dtype)."""
    return str(dtype).removeprefix("torch.")


@dataclass
class LlamaConfig:
    """Hugging Face `LlamaConfig` fields (the subset this architecture uses)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    torch_dtype: str = "float32"
    rope_scaling: dict | None = None  # normalized (specdec.models.rope): {"rope_type": ..., its fields} or None
    model_type: str = "llama"  # one of MODEL_TYPES: the decoder is shared, the differences are the flags below

    REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    BOOLEAN = ("tie_word_embeddings", "attention_bias")

    @property
    def qkv_bias(self) -> bool:
        """q/k/v projections with a bias: Qwen2 always, the others when attention_bias."""
        return self.attention_bias or self.model_type == "qwen2"

    @property
    def o_bias(self) -> bool:
        """o_proj with a bias (Qwen2 never has one)."""
        return self.attention_bias and self.model_type != "qwen2"

    @property
    def qk_norm(self) -> bool:
        """Per-head RMSNorm of q and k before the rotation (Qwen3)."""
        return self.model_type == "qwen3"

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size={self.hidden_size} is not divisible by "
                                 f"num_attention_heads={self.num_attention_heads}")
            self.head_dim = self.hidden_size // self.num_attention_heads
        for name in self.REQUIRED + ("num_key_value_heads", "head_dim", "max_position_embeddings"):
            setattr(self, name, check_int(f"config field {name}", getattr(self, name), 1))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        for name in ("rope_theta", "rms_norm_eps"):
            v = check_real(f"config field {name}", getattr(self, name))
            if not 0 < v < float("inf"):
                raise ValueError(f"config field {name} must be a number > 0, got {v!r}")
        for name in self.BOOLEAN:
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise ValueError(f"config field {name} must be true or false, got {type(v).__name__} {v!r}")
        self.rope_scaling = normalize_rope_scaling(self.rope_scaling, "config")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"config field model_type={self.model_type!r} is not supported "
                             f"(supported: {sorted(MODEL_TYPES)})")
        if self.torch_dtype not in _DTYPES:
            raise ValueError(f"config field torch_dtype must be one of {sorted(_DTYPES)}, got {self.torch_dtype!r}")

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.torch_dtype]

    @classmethod
    def from_dict(cls, d: dict, where="config") -> "LlamaConfig":
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(d).__name__}")
        missing = [k for k in cls.REQUIRED if k not in d]
        if missing:
            raise ValueError(f"{where}: missing required field(s) {missing}")
        d = dict(d)
        _refuse_what_changes_the_math(d, where)
        theta, scaling = _rope_parameters(d, where)
        if theta is not None:
            d["rope_theta"] = theta
        d["rope_scaling"] = scaling
        if d.get("torch_dtype") is None and d.get("dtype") is not None:  # transformers 5.x writes `dtype`
            d["torch_dtype"] = d["dtype"]
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known and not (k == "torch_dtype" and v is None)}
        try:
            return cls(**kw)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(architectures=[MODEL_TYPES[self.model_type]], hidden_act="silu")
        return d


#: Config fields that change the computation, and the value at which they do not. A config that sets one
#: to anything else is refused: this model does not implement it, and ignoring it would decode wrong tokens.
_MATH_FIELDS = {
    "hidden_act": "silu",
    "mlp_bias": False,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "logits_scaling": None,
    "pretraining_tp": 1,
    "partial_rotary_factor": 1.0,
    "use_qk_norm": False,
    "qk_layernorm": False,
    "attention_multiplier": None,
    "embedding_multiplier": None,
    "residual_multiplier": None,
}


#: The decoders this model implements, by Hugging Face model_type, with their architecture name. They share the
#: Llama block; Mistral is Llama when its sliding window is off, Qwen2 adds q/k/v biases, Qwen3 per-head q/k norms.
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM"}


def _refuse_what_changes_the_math(d: dict, where: str) -> None:
    model_type = d.get("model_type", "llama")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{where}: model_type={model_type!r} is not supported (supported: {sorted(MODEL_TYPES)})")
    if any(kind != "full_attention" for kind in d.get("layer_types") or []):
        raise ValueError(f"{where}: layer_types={d['layer_types']!r}: only full attention is implemented")
    for name, neutral in _MATH_FIELDS.items():
        if name in d and d[name] != neutral and not (neutral is None and d[name] is None):
            raise ValueError(f"{where}: {name}={d[name]!r} changes the computation and is not implemented "
                             f"(supported: {neutral!r})")
    if d.get("sliding_window") is not None and d.get("use_sliding_window", True):
        raise ValueError(f"{where}: sliding_window={d['sliding_window']!r} is not implemented (full attention only)")


def _rope_parameters(d: dict, where: str):
    """The rotary base and scaling from either config form: transformers 5.x's `rope_parameters` {rope_type,
    rope_theta, ...} or 4.x's top-level `rope_theta` with `rope_scaling`. -> (theta or None when the config
    leaves it to the default, normalized scaling or None)."""
    params = d.get("rope_parameters")
    if params not in (None, {}) and d.get("rope_scaling") not in (None, {}):
        raise ValueError(f"{where}: both rope_parameters and rope_scaling are set")
    spec = params if params not in (None, {}) else d.get("rope_scaling")
    name = "rope_parameters" if params not in (None, {}) else "rope_scaling"
    scaling = normalize_rope_scaling(spec, f"{where}: {name}")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    if theta is not None and "rope_theta" in d and d["rope_theta"] != theta:
        raise ValueError(f"{where}: rope_theta={d['rope_theta']!r} and rope_parameters.rope_theta={theta!r} differ")
    return theta, scaling


def _is_mtp_key(key: str, num_hidden_layers: int) -> bool:
    """model.mtp_layers.* (MiMo) or model.layers.{i >= num_hidden_layers}.* (DeepSeek NextN)."""
    if key.startswith("model.mtp_layers."):
        return True
    parts = key.split(".")
    return key.startswith("model.layers.") and parts[2].isdigit() and int(parts[2]) >= num_hidden_layers


class LlamaForCausalLM(nn.Module):
    """Llama decoder; `forward` returns a `ModelOutput`: logits (in the LM head's dtype) and the hidden states the
    LM head reads.

    State-dict keys are Hugging Face's (`model.embed_tokens.weight`, `model.layers.0.self_attn.q_proj.weight`,
    `model.norm.weight`, `lm_head.weight`), so a transformers-written Llama directory loads as it is.
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.model.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.model.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def device(self):
        return self.lm_head.weight.device

    @property
    def dtype(self):
        return self.lm_head.weight.dtype

    def embed(self, input_ids):
        return self.model.embed_tokens(input_ids)

    def compute_logits(self, hidden):
        """hidden: (..., H) -> logits (..., V) in the LM head's dtype. Not upcast here: a bf16 model's fp32 copy of
        (tokens, V) would be written and read again by every consumer; each op that reads logits (argmax, the
        sampling and logprob ops, penalties, grammar masks) upcasts as it reads, so its numbers are those of the
        upcast logits."""
        return self.lm_head(hidden)

    def forward(self, input_ids, positions, cache=None, meta: AttentionMetadata | None = None, return_logits=True,
                features: tuple[int, ...] | None = None):
        """input_ids, positions: (B, T) int64; cache: KVCache or None (then causal over the T tokens,
        no cache) -> ModelOutput: logits (B, T, V) in the LM head's dtype (None when not return_logits: a caller
        that reads a few rows applies `compute_logits` to those), hidden (B, T, H) (final-normed: what the LM head
        reads).

        features: layer indices i whose input residual stream (i = num_hidden_layers: the last layer's
        output, before the final norm) is returned too, concatenated: (B, T, len(features) * H) as the
        output's `features`. These are EAGLE-3's target features; without them nothing is kept (None)."""
        # The cached path is inference only: writing into the cache must not build a graph.
        with torch.set_grad_enabled(cache is None and torch.is_grad_enabled()):
            x = self.embed(input_ids)
            c = self.config
            cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta, c.rope_scaling,
                                    None if cache is None else cache.max_seq_len)
            captured = {}
            # with the ops' fused norm, each layer leaves its MLP output for the next norm to add in its kernel
            carry = meta is not None and getattr(meta.ops, "fused_add_rms_norm", None) is not None
            pending = None
            for i, layer in enumerate(self.model.layers):
                if features is not None and i in features:
                    x, pending = x if pending is None else x + pending, None
                    captured[i] = x
                kv = None if cache is None else cache.layer(i)
                if carry:
                    x, pending = layer.forward_carry(x, pending, cos, sin, kv, meta)
                else:
                    x = layer(x, cos, sin, kv, meta)
            if features is not None and pending is not None:
                x, pending = x + pending, None
            if features is not None:
                captured[len(self.model.layers)] = x
            hidden = self._final_norm(x, pending, meta)
            logits = self.compute_logits(hidden) if return_logits else None
            feats = None if features is None else torch.cat([captured[i] for i in features], dim=-1)
            return ModelOutput(logits, hidden, feats)

    def _final_norm(self, x, pending, meta):
        """The final RMSNorm of x (+ pending, the last layer's MLP output, added in the same fused kernel)."""
        norm = self.model.norm
        if pending is None:
            return norm(x, None if meta is None else meta.ops)
        H = x.shape[-1]
        hidden, _ = meta.ops.fused_add_rms_norm(pending.reshape(-1, H), x.reshape(-1, H), norm._parameters["weight"],
                                                norm.eps)
        return hidden.view(x.shape)

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict_for_save(self) -> dict:
        sd = self.state_dict()
        if self.config.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        return sd

    def checkpoint(self) -> tuple[dict, dict]:
        """-> (config.json as a dict, state dict): what save_pretrained writes."""
        return dict(self.config.to_dict(), torch_dtype=dtype_name(self.dtype)), self.state_dict_for_save()

    def save_pretrained(self, path) -> None:
        """Hugging Face layout; config.json's torch_dtype is the weights' dtype as saved."""
        save_dir(path, *self.checkpoint())

    @classmethod
    def from_pretrained(cls, path, device="cpu", dtype: torch.dtype | str = torch.float32) -> "LlamaForCausalLM":
        """Load a Hugging Face Llama directory. dtype: fp32 by default (as `specdec.zoo.load`; the exactness
        claims hold in fp32), or "auto" for the checkpoint's own `torch_dtype`."""
        raw = read_config(path)
        config = LlamaConfig.from_dict(raw, where=f"{path}/config.json")
        model = cls(config)
        sd = read_state_dict(path)
        if config.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
            sd["lm_head.weight"] = sd.get("model.embed_tokens.weight")
            if sd["lm_head.weight"] is None:
                sd.pop("lm_head.weight")
        sd = {k: v for k, v in sd.items() if not k.endswith("rotary_emb.inv_freq")}
        if raw.get("num_nextn_predict_layers"):  # MTP layers stored beside the target's (DeepSeek,
            sd = {k: v for k, v in sd.items() if not _is_mtp_key(k, config.num_hidden_layers)}  # MiMo): not ours
        load_strict(model, sd, path)
        if dtype == "auto":
            dtype = config.dtype
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point torch.dtype or 'auto', got {dtype!r}")
        return model.to(device=device, dtype=dtype).eval()


def load_draft_lm(path, target, device=None, dtype=None) -> LlamaForCausalLM:
    """A causal LM stored in Hugging Face layout at `path`, as a draft for `target` (STANDALONE): on the target's
    device and in its dtype unless given; ValueError naming both sizes when the vocabularies differ."""
    config = LlamaConfig.from_dict(read_config(path), where=f"{path}/config.json")
    if config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft LM {path}: vocab_size={config.vocab_size} does not match the target's "
                         f"vocab_size={target.config.vocab_size}: a draft must share the target's tokenizer")
    return LlamaForCausalLM.from_pretrained(path, device=device or target.device, dtype=dtype or target.dtype)


def random_draft_lm(target, num_hidden_layers: int = 1, seed: int = 0) -> LlamaForCausalLM:
    """A random causal LM to draft for `target` (STANDALONE) in speed runs: the target's vocabulary, rotary base and
    context, `num_hidden_layers` layers at an eighth of its width (at least 64), on its device and in its dtype."""
    c = target.config
    hidden = max(64, c.hidden_size // 8)
    heads = max(1, hidden // 64)
    return random_llama(vocab_size=c.vocab_size, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                        num_hidden_layers=num_hidden_layers, num_attention_heads=heads, num_key_value_heads=heads,
                        rope_theta=c.rope_theta, max_position_embeddings=c.max_position_embeddings, seed=seed,
                        dtype=target.dtype, device=target.device).eval()


def random_llama(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=None, tie_word_embeddings=False, seed=0, dtype=torch.float32, device="cpu",
                 init_std=None, **kw) -> LlamaForCausalLM:
    """Random-weight Llama of any size, seeded (tests and benchmarks)."""
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                      num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                      num_key_value_heads=num_key_value_heads, tie_word_embeddings=tie_word_embeddings, **kw)
    # A CUDA model is built and drawn on its device: a 1.5B model's normals take minutes on one CPU thread.
    # Its values then differ from a CPU build of the same seed (another generator).
    where = torch.device(device) if torch.device(device).type == "cuda" else torch.device("cpu")
    g = torch.Generator(device=where).manual_seed(seed)
    with torch.device(where):
        model = LlamaForCausalLM(cfg)
    std = init_std if init_std is not None else 1.0 / hidden_size ** 0.5
    with torch.no_grad():
        for name, p in hf_named_parameters(model):
            normal = torch.randn(p.shape, generator=g, device=where)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * normal)
            elif name.endswith("embed_tokens.weight"):
                p.copy_(normal)
            else:
                p.copy_(std * normal)
    return model.to(device=device, dtype=dtype).eval()
