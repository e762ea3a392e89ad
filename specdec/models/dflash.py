"""DFlash block drafter (z-lab's `DFlashDraftModel`): one forward drafts a whole block.

Layout and names as z-lab's checkpoints store them (config.json: a Qwen3 decoder config with `block_size`,
`num_target_layers` and `dflash_config` = {`target_layer_ids`, `mask_token_id`}; tensors `fc.weight`,
`hidden_norm.weight`, `norm.weight`, `layers.{i}.*` of Qwen3 decoder layers, q/k norms included; no embedding,
no LM head: the target's are shared):

- the context is the target's features: the outputs of `target_layer_ids` (id i is the residual stream entering
  target layer i + 1, as EAGLE-3 reads it), concatenated in the listed order (a repeated id adds its layer's
  features again, as z-lab's `extract_context_feature` does), projected by `fc` and normed by `hidden_norm` once,
  the same for every layer;
- the block is the last verified token then mask tokens (`mask_token_id`), embedded with the target's embedding;
  its hidden states run through the decoder layers. Each layer's queries are the block's; its keys and values are
  the context's (`k_proj`/`v_proj` of the projected features, k normed, rotated at the context positions)
  followed by the block's own; attention is non-causal within the block;
- `norm` then the target's LM head turn the block's outputs into proposals: the output at block position j >= 1
  proposes the token at that position.

`read_dflash_config` reads every config layout z-lab publishes (block_size at the top level or in dflash_config, no
target_layer_ids, no head_dim / num_key_value_heads); `from_pretrained` ignores tensors the drafter does not use.

At inference the context's keys and values live in a KV cache (`write_context`), the block is written past them as
in-flight slots and attends to all of them (`forward` with a tree mask of ones). `forward_dense` is the same
computation with an explicit mask over [context; blocks], what the trainer runs.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_int
from .draft_common import DraftConfig, DraftModelBase, draft_config_like, randomize_
from .io import load_strict, read_config, read_state_dict
from .layers import AttentionMetadata, LlamaDecoderLayer, RMSNorm, apply_rope, rope_cos_sin
from .linear import Linear
from .outputs import ModelOutput


@dataclass
class DFlashConfig(DraftConfig):
    """A Qwen3 decoder config plus z-lab's DFlash fields: the trained block size, the target layers whose outputs
    are the context features (z-lab's ids: id i is the output of target layer i; an id listed twice is that
    layer's features twice, as z-lab concatenates them), the mask token, and the number of target layers the
    drafter was trained on (None: not recorded)."""

    block_size: int = 16
    target_layer_ids: list = field(default_factory=list)
    mask_token_id: int = 0
    num_target_layers: int | None = None

    #: where config.json holds the drafter's own fields (z-lab's: in `dflash_config`), for the error messages
    FIELDS_AT: ClassVar[str] = "dflash_config."
    #: the smallest context layer id (z-lab's: 0, the output of target layer 0)
    LOWEST_LAYER_ID: ClassVar[int] = 0
    #: the smallest block (z-lab's: the last verified token and at least one mask token)
    SMALLEST_BLOCK: ClassVar[int] = 2

    def __post_init__(self):
        super().__post_init__()
        at = self.FIELDS_AT
        self.block_size = check_int("config field block_size", self.block_size, self.SMALLEST_BLOCK)
        if not isinstance(self.target_layer_ids, (list, tuple)) or not self.target_layer_ids:
            raise ValueError(f"config field {at}target_layer_ids must be a non-empty list of layer ids, "
                             f"got {self.target_layer_ids!r}")
        self.target_layer_ids = [check_int(f"config field {at}target_layer_ids[{j}]", i, self.LOWEST_LAYER_ID)
                                 for j, i in enumerate(self.target_layer_ids)]
        self.mask_token_id = check_int(f"config field {at}mask_token_id", self.mask_token_id, 0, self.vocab_size - 1)
        if self.num_target_layers is not None:
            self.num_target_layers = check_int("config field num_target_layers", self.num_target_layers, 1)
        if self.model_type != "qwen3":
            raise ValueError(f"config field model_type={self.model_type!r}: a block drafter's layers are Qwen3's "
                             f"(q and k norms)")


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default context layers: the middle layer for a one-layer drafter, else `num_draft_layers` ids spread
    evenly from 1 to L - 3 (rounded; a shallow target repeats ids: L = 4 gives [1, 1] for two layers)."""
    L = check_int("num_target_layers", num_target_layers, 1)
    n = check_int("num_draft_layers", num_draft_layers, 1)
    if n == 1:
        return [L // 2]
    span = (L - 3) - 1
    return [int(round(1 + i * span / (n - 1))) for i in range(n)]


def _qkv(attn, x):
    """A layer's attention projections of x (B, T, H) -> q (B, T, Hq, D), k, v (B, T, Hkv, D), q and k normed."""
    B, T, _ = x.shape
    Hq, Hkv, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q, k, v = attn.qkv_proj(x).view(B, T, Hq + 2 * Hkv, D).split([Hq, Hkv, Hkv], dim=2)
    return attn.q_norm(q), attn.k_norm(k), v


class DFlashDraftModel(DraftModelBase):
    """A DFlash drafter on `target` (see the module docstring). `feature_layers` is what the worker asks the
    target's forward for (the inputs of layers id + 1); `block_size` the trained block; `mask_token_id` the token
    that fills the block after the last verified one."""

    architecture = "DFlashDraftModel"
    #: how the error messages name the drafter
    label = "DFlash"

    def __init__(self, config: DFlashConfig, target):
        super().__init__(config, target)
        L = target.config.num_hidden_layers
        if config.num_target_layers is not None and config.num_target_layers != L:
            raise ValueError(f"{self.label} drafter num_target_layers={config.num_target_layers} does not match the "
                             f"target's num_hidden_layers={L}")
        bad = [i for i in config.target_layer_ids if i > L - 2]
        if bad:
            raise ValueError(f"{self.label} drafter target_layer_ids {bad} do not fit the target's {L} layers: ids "
                             f"{config.LOWEST_LAYER_ID}..{L - 2} (the last layer's output is read normed by "
                             f"transformers and is not implemented)")
        H, nf = config.hidden_size, len(config.target_layer_ids)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.fc = Linear(nf * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, config.rms_norm_eps)
        self.norm = RMSNorm(H, config.rms_norm_eps)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target layers whose input residual streams are the features, in the checkpoint's order."""
        return tuple(i + 1 for i in self.config.target_layer_ids)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    def _rope(self, positions, cache=None):
        """cos, sin at positions: looked up in the rope table of the cache's length when there is a cache."""
        c = self.config
        return rope_cos_sin(positions, c.head_dim, c.rope_theta, c.rope_scaling,
                            None if cache is None else cache.max_seq_len)

    def project_context(self, features):
        """features: (..., F * H), the target's -> (..., H): hidden_norm(fc(features)), what every layer's
        context keys and values are projected from."""
        return self.hidden_norm(self.fc(features.to(self.dtype)))

    def embed(self, input_ids):
        """input_ids (B, T) -> the block's input embeddings (B, T, H) in the drafter's dtype: the target's
        embedding."""
        return self.target.embed(input_ids).to(self.dtype)

    def compute_logits(self, hidden):
        """hidden: (..., H), the drafter's (normed) output -> logits (..., V) through the target's LM head, in its
        dtype."""
        return self.target.compute_logits(hidden)

    # ---- inference: a KV cache of the context, the block as in-flight slots -----------------------------
    @torch.no_grad()
    def write_context(self, features, positions, cache, meta: AttentionMetadata) -> None:
        """features: (B, T, F * H) the target's at `positions` (B, T) int64 -> every layer's context keys and
        values written at cache slots meta.cache_start + t (meta.write_offset + t); no attention runs."""
        ctx = self.project_context(features)
        cos, sin = self._rope(positions, cache)
        for i, layer in enumerate(self.layers):
            q, k, v = _qkv(layer.self_attn, ctx)
            k_cache, v_cache = cache.layer(i)
            plan = meta.plan(ctx.shape[1], k_cache.shape[1])
            meta.ops.apply_rope_and_write_kv(q, k, v, cos, sin, k_cache, v_cache, meta.slots, meta.cache_start,
                                             meta.write_offset, plan=plan)

    @torch.no_grad()
    def forward(self, input_ids, positions, cache, meta: AttentionMetadata, return_logits=True) -> ModelOutput:
        """The block. input_ids, positions: (B, T) int64 (the last verified token then mask tokens); meta: the
        block's slots past the committed context, its tree mask all ones (non-causal) -> ModelOutput: logits
        (B, T, V) fp32 (None unless return_logits), hidden (B, T, H) normed (what the LM head reads)."""
        x = self.embed(input_ids)
        cos, sin = self._rope(positions, cache)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.layer(i), meta)
        hidden = self.norm(x)
        return ModelOutput(self.compute_logits(hidden) if return_logits else None, hidden)

    # ---- training: the same computation with an explicit mask -------------------------------------------
    def forward_dense(self, features, ctx_positions, input_ids, positions, mask):
        """features: (B, Tc, F * H) at ctx_positions (B, Tc); input_ids, positions: (B, Tb) (any number of
        blocks side by side); mask: (B or 1, Tb, Tc + Tb) bool, which context and block keys each block query
        sees -> hidden (B, Tb, H) normed. Gradients flow (the trainer's path)."""
        ctx = self.project_context(features)
        x = self.embed(input_ids)
        cos_c, sin_c = self._rope(ctx_positions)
        cos_b, sin_b = self._rope(positions)
        for layer in self.layers:
            attn = layer.self_attn
            q, kb, vb = _qkv(attn, layer.input_layernorm(x))
            _, kc, vc = _qkv(attn, ctx)
            q, kb, kc = apply_rope(q, cos_b, sin_b), apply_rope(kb, cos_b, sin_b), apply_rope(kc, cos_c, sin_c)
            k, v = torch.cat([kc, kb], dim=1), torch.cat([vc, vb], dim=1)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 attn_mask=mask[:, None], scale=attn.head_dim ** -0.5,
                                                 enable_gqa=attn.num_heads != attn.num_kv_heads).transpose(1, 2)
            x = x + attn.o_proj(out.reshape(*x.shape[:2], -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)

    # ---- checkpoints (z-lab's layout) ---------------------------------------------------------------------
    def checkpoint(self) -> tuple[dict, dict]:
        d, sd = super().checkpoint()
        d["dflash_config"] = {"target_layer_ids": list(d.pop("target_layer_ids")),
                              "mask_token_id": d.pop("mask_token_id")}
        d["num_target_layers"] = self.target.config.num_hidden_layers
        return d, sd

    @classmethod
    def from_pretrained(cls, path, target, device=None, dtype: torch.dtype | None = None):
        """A DFlash checkpoint directory in z-lab's layout (architectures ["DFlashDraftModel"]), read as z-lab's
        code and SGLang read it (`read_dflash_config`). Tensors the drafter does not use (an `lm_head.weight`,
        say) are ignored with a warning naming them; a tensor of a layer the config does not have, a missing
        tensor, a hidden size, vocabulary or layer ids that do not fit `target`, or sliding-window layers: a
        ValueError naming it."""
        config = read_dflash_config(path, target.config.num_hidden_layers)
        model = cls(config, target)
        own = model.state_dict()
        sd, unused = {}, []
        for name, tensor in read_state_dict(path).items():
            key = name.removeprefix("model.")
            if key in own:
                sd[key] = tensor
                continue
            layer = _layer_index(key)
            if layer is not None and layer >= config.num_hidden_layers:
                # weights of a layer the config leaves out: a checkpoint cut or configured wrongly, never an extra
                raise ValueError(f"{path}: tensor {name} is of layer {layer}, but config.json has "
                                 f"num_hidden_layers={config.num_hidden_layers}")
            unused.append(name)
        if unused:  # transformers and SGLang skip them too; the drafter shares the target's embedding and head
            unused.sort()
            warnings.warn(f"{path}: ignoring {len(unused)} tensor(s) the DFlash drafter does not use: "
                          f"{unused[:5]}{' ...' if len(unused) > 5 else ''}", stacklevel=2)
        load_strict(model, sd, path)
        return model.to(device=device or target.device, dtype=dtype or target.dtype).eval()


def _layer_index(key: str) -> int | None:
    """`layers.3.mlp.up_proj.weight` -> 3; None for a tensor outside the decoder layers."""
    parts = key.split(".")
    if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit():
        return int(parts[1])
    return None


def _dflash_field(raw: dict, dflash: dict, name: str, where: str):
    """A DFlash field where SGLang looks for it: `dflash_config` first, then the top level (where z-lab's model
    reads block_size and num_target_layers); both present and different is a ValueError (None: neither)."""
    inner, outer = dflash.get(name), raw.get(name)
    if inner is not None and outer is not None and inner != outer:
        raise ValueError(f"{where}: {name}={outer!r} and dflash_config.{name}={inner!r} differ")
    return inner if inner is not None else outer


def _decoder_defaults(raw: dict, where: str) -> dict:
    """head_dim and num_key_value_heads when config.json leaves them out: the defaults of transformers' config
    class for its model_type (what z-lab's drafter, a transformers model, is built from: Qwen3Config gives
    head_dim 128 and 32 KV heads, LlamaConfig hidden_size // num_attention_heads and num_attention_heads)."""
    missing = [k for k in ("head_dim", "num_key_value_heads") if raw.get(k) is None]
    if not missing:
        return {}
    model_type = raw.get("model_type") or "qwen3"
    try:
        # lazy: transformers is optional
        from transformers import AutoConfig
    except ImportError:
        raise ValueError(f"{where}: no {missing[0]} (its default is transformers' {model_type} config's; "
                         f"install transformers or write {missing[0]} into config.json)") from None
    shape = {k: raw[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                 "num_hidden_layers") if raw.get(k) is not None}
    try:
        hf = AutoConfig.for_model(model_type, **shape)
    except (ValueError, KeyError, TypeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{where}: no {missing[0]}, and transformers has no default for model_type="
                         f"{model_type!r} ({first})") from None
    return {k: getattr(hf, k) for k in missing}


def read_dflash_config(path, num_target_layers: int) -> DFlashConfig:
    """config.json of a DFlash checkpoint -> DFlashConfig, every layout z-lab publishes:

    - block_size, num_target_layers, target_layer_ids, mask_token_id in `dflash_config` or at the top level
      (`_dflash_field`: SGLang's order; z-lab's model reads the first two at the top level, the others inside);
    - no target_layer_ids: z-lab's `build_target_layer_ids(num_target_layers, num_hidden_layers)`, duplicates
      included, num_target_layers the config's or else the target's (`num_target_layers`);
    - no head_dim / num_key_value_heads: transformers' defaults for the model_type (`_decoder_defaults`);
    - the decoder is Qwen3's whatever model_type says (z-lab's layers always norm q and k);
    - sliding-window layers are refused: z-lab's code ignores the window outside flash attention, SGLang
      applies it, and this drafter attends to the whole context. `layer_types` says which layers are windowed
      (both read it); without it an active `sliding_window` is refused whatever `max_window_layers` says."""
    where = f"{path}/config.json"
    raw = read_config(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    archs = raw.get("architectures")
    if archs != [DFlashDraftModel.architecture]:
        raise ValueError(f"{path}: architectures={archs!r}, expected [{DFlashDraftModel.architecture!r}]")
    dflash = raw.get("dflash_config") or {}
    if not isinstance(dflash, dict):
        raise ValueError(f"{where}: dflash_config must be an object, got {dflash!r}")
    block_size = _dflash_field(raw, dflash, "block_size", where)
    if block_size is None:
        raise ValueError(f"{where}: no block_size, at the top level or in dflash_config (the block the drafter "
                         f"was trained on)")
    mask_token_id = _dflash_field(raw, dflash, "mask_token_id", where)
    if mask_token_id is None:
        raise ValueError(f"{where}: no mask_token_id, in dflash_config or at the top level")
    trained_on = _dflash_field(raw, dflash, "num_target_layers", where)
    layers = _dflash_field(raw, dflash, "target_layer_ids", where)
    if layers is None:
        layers = build_target_layer_ids(trained_on if trained_on is not None else num_target_layers,
                                        raw.get("num_hidden_layers", 1))
    fields = {k: v for k, v in raw.items() if k not in ("dflash_config", "architectures")}
    kinds = raw.get("layer_types")
    if kinds is not None:  # z-lab and SGLang window exactly the layers marked sliding_attention
        if not isinstance(kinds, list):
            raise ValueError(f"{where}: layer_types must be a list of attention kinds, got {kinds!r}")
        windowed = [i for i, kind in enumerate(kinds) if kind != "full_attention"]
        if windowed:
            raise ValueError(f"{where}: layer_types marks draft layer(s) {windowed} {kinds[windowed[0]]!r}: only "
                             f"full attention is implemented (SGLang applies the window; z-lab's code ignores it "
                             f"outside flash attention)")
        fields.pop("sliding_window", None)  # it applies to no layer
        fields.pop("use_sliding_window", None)
    fields.update(_decoder_defaults(raw, where))
    fields.update(model_type="qwen3", block_size=block_size, target_layer_ids=layers, mask_token_id=mask_token_id,
                  num_target_layers=trained_on)
    return DFlashConfig.from_dict(fields, where=where)


def dflash_config_like(target, num_layers: int, block_size: int, target_layer_ids=None, mask_token_id: int = 0,
                       config_class=None, heads=None, **overrides) -> DFlashConfig:
    """A DFlash drafter's config with the target's decoder shape (`draft_config_like`, `overrides` on top),
    z-lab's default context layers (`build_target_layer_ids`, clipped to 0..L-2) unless given. config_class: a
    subclass of DFlashConfig to build instead (DSpark's), with its own fields `heads` (a dict)."""
    base = draft_config_like(target, num_layers, **overrides)
    kw = {f: getattr(base, f) for f in DraftConfig.__dataclass_fields__}
    kw["model_type"] = "qwen3"
    L = target.config.num_hidden_layers
    if target_layer_ids is None:  # z-lab's rule, clipped to the layers a shallow target has
        target_layer_ids = sorted({min(max(i, 0), max(L - 2, 0)) for i in build_target_layer_ids(L, num_layers)})
    return (config_class or DFlashConfig)(**kw, block_size=block_size, mask_token_id=mask_token_id,
                                          num_target_layers=L, target_layer_ids=list(target_layer_ids),
                                          **(heads or {}))


def random_dflash(target, num_layers: int = 1, block_size: int = 4, target_layer_ids=None, mask_token_id: int = 0,
                  seed: int = 0, std=None, **overrides) -> DFlashDraftModel:
    """A random DFlash drafter on `target` (tests, the GPU one-shot)."""
    model = DFlashDraftModel(dflash_config_like(target, num_layers, block_size, target_layer_ids, mask_token_id,
                                                **overrides), target)
    randomize_(model, seed, std if std is not None else target.config.hidden_size ** -0.5)
    return model.to(device=target.device, dtype=target.dtype).eval()
