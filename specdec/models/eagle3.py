"""EAGLE-3 draft head: target features from several layers, a 2H-wide midlayer, a reduced draft vocabulary.

Layout and names as SGLang's `LlamaForCausalLMEagle3` loads them (`fc.weight`, `midlayer.*` with
`hidden_norm`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`):

- `fc` projects the target's features (the residual streams entering `feature_layers`, concatenated, 3H)
  to H; it applies only to target features: draft steps feed back the head's own H-wide output. Options
  (config fields, as SGLang reads them): `norm_before_fc` applies one RMSNorm (`input_norm`) to the
  concatenation first, `fc_norm` one RMSNorm per feature (`fc_norm.i`).
- the midlayer's q/k/v read cat(input_layernorm(token embedding), hidden_norm(hidden)), 2H wide; the
  residual stream is the hidden state; then the usual post-attention norm and MLP.
- `norm` and `lm_head` give logits over `draft_vocab_size` ids; a draft id d is target id d + d2t[d].
  The hidden state the head returns (and the next step reads) is the pre-norm sum, or with `norm_output`
  the normed one (then the LM head reads it as it is).
"""
from __future__ import annotations

import dataclasses

from dataclasses import dataclass, field

import torch
from torch import nn

from ..checks import check_int
from .draft_common import DraftConfig, DraftHeadBase, draft_config_like, randomize_
from .io import load_strict, read_config, read_state_dict
from .layers import LlamaAttention, LlamaMLP, RMSNorm
from .linear import Linear


@dataclass
class Eagle3Config(DraftConfig):
    """A DraftConfig plus the draft vocabulary size and the target layers whose inputs are the features."""

    draft_vocab_size: int | None = None
    feature_layers: list = field(default_factory=list)
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False

    BOOLEAN = DraftConfig.BOOLEAN + ("norm_before_fc", "fc_norm", "norm_output")

    def __post_init__(self):
        super().__post_init__()
        if self.draft_vocab_size is None:
            self.draft_vocab_size = self.vocab_size
        self.draft_vocab_size = check_int("config field draft_vocab_size", self.draft_vocab_size, 1, self.vocab_size)
        if not isinstance(self.feature_layers, (list, tuple)) or not self.feature_layers:
            raise ValueError(f"config field feature_layers must be a non-empty list of layer indices, got "
                             f"{self.feature_layers!r}")
        self.feature_layers = [check_int(f"config field feature_layers[{j}]", i, 0)
                               for j, i in enumerate(self.feature_layers)]
        repeated = sorted({i for i in self.feature_layers if list(self.feature_layers).count(i) > 1})
        if repeated:
            raise ValueError(f"config field feature_layers lists layer(s) {repeated} more than once "
                             f"({self.feature_layers!r}): each target layer is captured once")
        # Every peer (SafeAILab EAGLE, SGLang, vLLM) appends features while walking the layers, so a head's
        # fc reads them in layer order whatever order its checkpoint lists them in.
        self.feature_layers = sorted(self.feature_layers)


def default_feature_layers(num_target_layers: int) -> list[int]:
    """Default capture points for an L-layer target: the inputs of three distinct layers, low, middle and
    high, ascending.

    L >= 7: SafeAILab's and SGLang's [2, L // 2, L - 3]. For 3 <= L <= 6 that rule repeats a layer (L = 6
    gives [2, 3, 3]), so the points are the inputs of layers 1, L // 2 and L - 1 instead ([1, 2, 3] at
    L = 4, [1, 2, 4] at 5, [1, 3, 5] at 6); L = 3 has only two layer inputs past the embeddings and takes
    the last layer's output as its third, [1, 2, 3]. A target of fewer than 3 layers
    gives every layer's output once ([1] or [1, 2])."""
    L = check_int("num_target_layers", num_target_layers, 1)
    if L < 3:
        return list(range(1, L + 1))
    if L >= 7:
        return [2, L // 2, L - 3]
    if L == 3:
        return [1, 2, 3]
    return [1, L // 2, L - 1]


class Eagle3MidLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H = cfg.hidden_size
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, in_features=2 * H)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, embeds, hidden, cos, sin, kv_cache=None, meta=None):
        # submodules through .forward, as LlamaDecoderLayer's (specdec/models/layers.py says why); the norms, the
        # residual add and the MLP through the forward's ops when it has them, as the target's layers
        ops = None if meta is None else meta.ops
        x = torch.cat([self.input_layernorm.forward(embeds, ops), self.hidden_norm.forward(hidden, ops)], dim=-1)
        attn_out = self.self_attn.forward(x, cos, sin, kv_cache, meta)
        fused_add_rms_norm = getattr(ops, "fused_add_rms_norm", None)
        if fused_add_rms_norm is None:
            h = hidden + attn_out
            return h + self.mlp.forward(self.post_attention_layernorm.forward(h), ops)
        H, norm = hidden.shape[-1], self.post_attention_layernorm
        normed, h = fused_add_rms_norm(attn_out.reshape(-1, H), hidden.reshape(-1, H), norm._parameters["weight"],
                                       norm.eps)
        return h.view(hidden.shape) + self.mlp.forward(normed.view(hidden.shape), ops)


class Eagle3DraftHead(DraftHeadBase):
    """An EAGLE-3 head on `target` (see the module docstring). `feature_layers` is what the worker asks the
    target's forward for; `d2t` (draft_vocab_size,) int64 maps draft ids to target ids."""

    architecture = "LlamaForCausalLMEagle3"

    def __init__(self, config: Eagle3Config, target):
        super().__init__(config, target)
        if config.num_hidden_layers != 1:
            raise ValueError(f"an EAGLE-3 head here has one midlayer, got num_hidden_layers={config.num_hidden_layers}")
        L = target.config.num_hidden_layers
        bad = [i for i in config.feature_layers if i > L]
        if bad:
            raise ValueError(f"feature_layers {bad} exceed the target's {L} layers")
        H, F = config.hidden_size, len(config.feature_layers)
        if config.norm_before_fc:
            self.input_norm = RMSNorm(F * H, config.rms_norm_eps)
        if config.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(H, config.rms_norm_eps) for _ in range(F))
        self.fc = Linear(F * H, H, bias=False)
        self.midlayer = Eagle3MidLayer(config)
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.lm_head = Linear(H, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))

    @property
    def layers(self):  # the draft cache and dtype helpers look for decoder layers
        return [self.midlayer]

    @property
    def draft_vocab_size(self) -> int:
        return self.config.draft_vocab_size

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return tuple(self.config.feature_layers)

    def project_features(self, features):
        """features: (..., F * H) the target's -> (..., H), what the midlayer's residual stream starts from."""
        h = features.to(self.dtype)
        if self.config.norm_before_fc:
            h = self.input_norm(h)
        if self.config.fc_norm:
            h = torch.cat([norm(c) for norm, c in zip(self.fc_norm, h.chunk(len(self.fc_norm), dim=-1))], dim=-1)
        return self.fc(h)

    def step(self, input_ids, hidden_states, cos, sin, kv, meta):
        """The midlayer on (token, hidden) pairs, target features (B, T, F * H) projected first -> the output
        hidden (B, T, H): pre-norm, or normed with norm_output. `kv` is a layer's (k, v) cache or None (causal
        over the T tokens). Its logits, over the draft vocabulary, are `compute_logits` of it."""
        h = hidden_states.to(self.dtype)
        if h.shape[-1] != self.config.hidden_size:
            h = self.project_features(h)
        out = self.midlayer(self.target.embed(input_ids), h, cos, sin, kv, meta)
        return self.norm(out) if self.config.norm_output else out

    def compute_logits(self, hidden):
        """hidden: (..., H), the head's output -> logits (..., draft_vocab_size) in the LM head's dtype (read by
        ops that upcast, as the target's `compute_logits`)."""
        return self.lm_head(hidden if self.config.norm_output else self.norm(hidden))

    def draft_to_target(self, draft_ids):
        """Draft ids -> target ids (d + d2t[d])."""
        return draft_ids + self.d2t[draft_ids]

    @torch.no_grad()
    def set_draft_vocabulary(self, target_ids) -> None:
        """target_ids: (draft_vocab_size,) ascending target ids; draft id d becomes target id target_ids[d]
        (d2t and t2d as SGLang's checkpoints store them)."""
        target_ids = torch.as_tensor(target_ids, device=self.d2t.device)
        if target_ids.shape != self.d2t.shape:
            raise ValueError(f"target_ids has shape {tuple(target_ids.shape)}, expected {tuple(self.d2t.shape)}")
        self.d2t.copy_(target_ids - torch.arange(len(target_ids), device=target_ids.device))
        self.t2d.zero_()
        self.t2d[target_ids] = True

    @torch.no_grad()
    def with_draft_vocabulary(self, target_ids) -> "Eagle3DraftHead":
        """The same head proposing from another draft vocabulary: target_ids (n,) distinct target ids (any order;
        the whole vocabulary for n = vocab_size) -> a new head sharing every weight but the LM head, whose rows are
        the target's rows of those ids. Only a head whose LM head rows are the target's (trained with them frozen,
        as `specdec zoo train-draft` trains a real target's) keeps its meaning; another is a ValueError."""
        V = self.config.vocab_size
        ids = torch.as_tensor(target_ids, dtype=torch.int64, device=self.d2t.device).unique()  # ascending
        if ids.numel() != len(target_ids) or not 1 <= ids.numel() <= V or int(ids[0]) < 0 or int(ids[-1]) >= V:
            raise ValueError(f"target_ids must be 1..{V} distinct ids in [0, {V}), got {len(target_ids)} ids")
        target_rows = self.target.lm_head.weight
        own = self.draft_to_target(torch.arange(self.config.draft_vocab_size, device=self.d2t.device))
        if not torch.allclose(self.lm_head.weight.float(), target_rows[own].float(), rtol=2e-3, atol=1e-4):
            raise ValueError("this EAGLE-3 head's LM head rows are not the target's (it was trained with its LM head "
                             "free): another draft vocabulary would change what it means")
        head = Eagle3DraftHead(dataclasses.replace(self.config, draft_vocab_size=ids.numel()), self.target)
        head.load_state_dict({k: v for k, v in self.state_dict().items()
                              if not k.startswith(("lm_head.", "d2t", "t2d"))}, strict=False)
        head.lm_head.weight.copy_(target_rows[ids])
        head.set_draft_vocabulary(ids)
        return head.to(device=self.d2t.device, dtype=self.dtype).eval()

    # ---- checkpoints -------------------------------------------------------------------------
    def checkpoint(self) -> tuple[dict, dict]:
        """-> (config.json in SGLang's layout, state dict): what save_pretrained writes."""
        if min(self.config.feature_layers) < 1:
            raise ValueError("SGLang's config names layer outputs: a feature taken at layer 0's input (the "
                             "embeddings) cannot be saved in its format")
        d, sd = super().checkpoint()
        d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in self.config.feature_layers]}
        d.pop("feature_layers")
        return d, sd

    @classmethod
    def from_pretrained(cls, path, target, device=None, dtype: torch.dtype | None = None):
        """An EAGLE-3 checkpoint directory in SGLang's layout (architectures ["LlamaForCausalLMEagle3"]). Its
        feature layers come from `eagle_config.eagle_aux_hidden_state_layer_ids` when set (each id's output,
        i.e. the input of layer id + 1, as SGLang captures them; concatenated in layer order whatever order
        the list has, and a repeated id is a ValueError), else `default_feature_layers`. A checkpoint whose
        draft vocabulary is the target's may omit `d2t` and `t2d` (SafeAILab's do): the identity map."""
        raw = read_config(path)
        archs = raw.get("architectures")
        if archs != [cls.architecture]:
            raise ValueError(f"{path}: architectures={archs!r}, expected [{cls.architecture!r}]")
        ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        layers = [i + 1 for i in ids] if ids else default_feature_layers(target.config.num_hidden_layers)
        if raw.get("norm_before_residual"):
            raise ValueError(f"{path}/config.json: norm_before_residual=True (the midlayer's residual taken after "
                             f"hidden_norm) changes the computation and is not implemented")
        fields = {k: v for k, v in raw.items() if k not in ("eagle_config", "architectures")}
        config = Eagle3Config.from_dict(dict(fields, feature_layers=layers), where=f"{path}/config.json")
        model = cls(config, target)
        sd = {k.removeprefix("model."): v for k, v in read_state_dict(path).items()
              if k.removeprefix("model.") != "embed_tokens.weight"}
        if "d2t" not in sd and config.draft_vocab_size == config.vocab_size:
            # SafeAILab drops both maps when the draft vocabulary is the target's, and SGLang then maps no ids
            sd["d2t"] = torch.zeros(config.vocab_size, dtype=torch.int64)
        if "t2d" not in sd and "d2t" in sd:  # SGLang does not read it: rebuild it from d2t
            t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
            t2d[torch.arange(len(sd["d2t"])) + sd["d2t"].long()] = True
            sd["t2d"] = t2d
        for name, want in (("d2t", (config.draft_vocab_size,)), ("t2d", (config.vocab_size,))):
            if name not in sd:
                raise ValueError(f"{path}: the checkpoint has no {name!r} (draft-to-target id map)")
            if tuple(sd[name].shape) != want:
                raise ValueError(f"{path}: {name!r} has shape {tuple(sd[name].shape)}, expected {want}")
        sd["d2t"] = sd["d2t"].long()
        sd["t2d"] = sd["t2d"].bool()
        load_strict(model, sd, path)
        return model.to(device=device or target.device, dtype=dtype or target.dtype).eval()


def eagle3_config_like(target, draft_vocab_size: int | None = None, feature_layers=None, norm_before_fc=False,
                       fc_norm=False, norm_output=False, **overrides) -> Eagle3Config:
    """An EAGLE-3 head's config with the target's decoder shape (`draft_config_like`), SGLang's default
    features unless given, and the whole vocabulary unless `draft_vocab_size` is."""
    base = draft_config_like(target, 1, **overrides)
    return Eagle3Config(**{f: getattr(base, f) for f in DraftConfig.__dataclass_fields__},
                        draft_vocab_size=draft_vocab_size or target.config.vocab_size,
                        feature_layers=list(feature_layers or default_feature_layers(target.config.num_hidden_layers)),
                        norm_before_fc=norm_before_fc, fc_norm=fc_norm, norm_output=norm_output)


def random_eagle3_head(target, draft_vocab_size: int | None = None, feature_layers=None, seed=0, std=None,
                       **config) -> Eagle3DraftHead:
    """A random EAGLE-3 head (`config`: eagle3_config_like's norms and overrides); its draft vocabulary is a
    seeded random subset of the target's, of draft_vocab_size ids (at most the target's vocabulary)."""
    if draft_vocab_size is not None:
        draft_vocab_size = min(draft_vocab_size, target.config.vocab_size)
    head = Eagle3DraftHead(eagle3_config_like(target, draft_vocab_size, feature_layers, **config), target)
    randomize_(head, seed, std if std is not None else target.config.hidden_size ** -0.5)
    g = torch.Generator().manual_seed(seed + 1)
    vocab = torch.randperm(target.config.vocab_size, generator=g)[:head.config.draft_vocab_size].sort().values
    head.set_draft_vocabulary(vocab)
    return head.to(device=target.device, dtype=target.dtype).eval()
