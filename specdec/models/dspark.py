"""DSpark block drafter (DeepSeek's DeepSpec `Qwen3DSparkModel`, SGLang's DSPARK): a DFlash-style block forward, a
Markov refinement head and a confidence head.

The block forward is DFlash's (`DFlashDraftModel`): the context is the target's features at `target_layer_ids`
projected by `fc` and normed by `hidden_norm` once; the block, the last verified token then mask tokens, runs
through Qwen3 decoder layers whose keys and values are the context's followed by the block's own, non-causal within
the block. Two things differ from DFlash in the block itself:

- every block position proposes: the output at block position j proposes the token j + 1 places after the last
  verified one (DFlash's position 0 proposes nothing), so a block of `block_size` positions proposes `block_size`
  tokens;
- a context id may be -1: the embedding output (the input of target layer 0).

On top of the block's logits `lm_head(h_j)`:

- the Markov head adds a bias that depends on the token proposed just before position j (the last verified token
  for j = 0): "vanilla" `markov_w2(markov_w1[prev])` (a rank-`markov_rank` bigram), "gated" the same with
  `markov_w1[prev]` scaled by `sigmoid(gate_proj([h_j; markov_w1[prev]]))`, "rnn" `markov_w2(tanh(o_j))` where a
  state s of size `markov_rank`, zero before position 0 of every block, runs through the block:
  [g; c; o_j] = `joint_proj([s_{j-1}; markov_w1[prev]; h_j])`, s_j = sigmoid(g) s_{j-1} + (1 - sigmoid(g)) tanh(c),
  so position j's bias reads every token of the block before it. So the block's tokens are chosen one after another,
  each from its refined logits;
- the confidence head, one linear unit, estimates from `[h_j; markov_w1[prev]]` (or `h_j` alone) the probability
  that proposal j is accepted given the ones before it were (with an "rnn" head too it reads the embedding, not the
  state, as DeepSpec's). A block is sent to verification up to its first position whose estimate falls below the
  confidence threshold (DeepSpec's rule; 0 sends the whole block).

The Markov head is one step, `MarkovHead.step(prev_ids, hidden, state) -> (bias, state)`, for every type: the state
is None before a block's position 0 and stays None for the memoryless heads. The worker, choosing the tokens one
after another, carries it through `refine_step`; a teacher-forced block (training, evaluation) goes through
`refine_logits`, which unrolls the steps over the block positions (the memoryless heads' steps are independent, so
they run as one).

Checkpoints in DeepSpec's layout (what its trainer writes and SGLang reads): config.json is the target's Qwen3 config
with `architectures` ["Qwen3DSparkModel"], the draft's `num_hidden_layers`, and top-level `block_size`,
`mask_token_id`, `target_layer_ids`, `num_target_layers`, `num_anchors`, `markov_rank`, `markov_head_type`,
`enable_confidence_head`, `confidence_head_with_markov`; tensors `embed_tokens.weight`, `lm_head.weight` (frozen copies
of the target's), `fc.weight`, `hidden_norm.weight`, `norm.weight`, `layers.{i}.*`, `markov_head.markov_w1.weight`
(V, r), `markov_head.markov_w2.weight` (V, r), `markov_head.gate_proj.{weight,bias}` (gated, (r, H + r)),
`markov_head.joint_proj.{weight,bias}` (rnn, (3r, 2r + H)),
`confidence_head.proj.{weight,bias}` (1, H [+ r]). The drafter runs on the target's embedding and LM head: loading
checks that the checkpoint's copies are the target's (a drafter for another target is refused), saving writes them.
A drafter the zoo trains for its target is written without the two copies (for SmolLM2 they would be 113 MB of a
drafter's 15): the loader then takes the target's own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..checks import check_int, check_real
from .dflash import DFlashConfig, DFlashDraftModel, _decoder_defaults, dflash_config_like
from .draft_common import DraftConfig, randomize_
from .io import load_strict, read_config, read_state_dict
from .linear import Linear

#: the confidence threshold when none is given: the first position whose estimate is below it ends the block
#: (SGLang's and FastLLM's `--speculative-dspark-confidence-threshold` default; DeepSpec's evaluator uses 0, the whole
#: block)
DEFAULT_CONFIDENCE_THRESHOLD = 0.5

#: the Markov heads implemented, by `markov_head_type` (DeepSpec's three)
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")

#: the largest difference, relative to a row's largest magnitude, between the checkpoint's copy of the embedding or
#: LM head and the target's that still counts as the same matrix: bf16 rounds to 2^-8 of a value, the zoo's int8 rows
#: to 1/254 of the row's largest; another target's rows differ by about their own size
SAME_MATRIX_TOLERANCE = 0.02


@dataclass
class DSparkConfig(DFlashConfig):
    """A Qwen3 decoder config plus DeepSpec's DSpark fields (all at the top level of config.json): the block,
    context layers (id -1: the embedding output), mask token and target depth as DFlash's, the Markov head's rank
    (0: none) and type, whether there is a confidence head and whether it reads the Markov embedding, and the
    number of training anchors per sequence (training only; kept so that a checkpoint round-trips)."""

    markov_rank: int = 0
    markov_head_type: str | None = None
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = False
    num_anchors: int = 512

    FIELDS_AT: ClassVar[str] = ""
    LOWEST_LAYER_ID: ClassVar[int] = -1
    SMALLEST_BLOCK: ClassVar[int] = 1
    BOOLEAN = DraftConfig.BOOLEAN + ("enable_confidence_head", "confidence_head_with_markov")

    def __post_init__(self):
        super().__post_init__()
        self.markov_rank = check_int("config field markov_rank", self.markov_rank, 0)
        self.num_anchors = check_int("config field num_anchors", self.num_anchors, 1)
        if self.markov_rank and self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(f"config field markov_head_type={self.markov_head_type!r} is not implemented "
                             f"(implemented: {', '.join(MARKOV_HEAD_TYPES)})")
        if self.confidence_head_with_markov and self.enable_confidence_head and not self.markov_rank:
            raise ValueError("config field confidence_head_with_markov=true needs a Markov head (markov_rank > 0)")


class MarkovHead(nn.Module):
    """The block's token-to-token refinement: a bias on position j's logits from the token before it and, for "rnn",
    a state carried from the positions before (see the module docstring). Names as DeepSpec's: `markov_w1` (V, r) an
    embedding, `markov_w2` (V, r) a linear map back to the vocabulary, `gate_proj` (r, H + r) for the gated head,
    `joint_proj` (3r, 2r + H) for the rnn head."""

    def __init__(self, config: DSparkConfig):
        super().__init__()
        V, H, r = config.vocab_size, config.hidden_size, config.markov_rank
        self.markov_w1 = nn.Embedding(V, r)
        self.markov_w2 = Linear(r, V, bias=False)
        kind = config.markov_head_type
        self.gate_proj = Linear(H + r, r) if kind == "gated" else None
        self.joint_proj = Linear(2 * r + H, 3 * r) if kind == "rnn" else None

    @property
    def recurrent(self) -> bool:
        """Whether a position's bias depends on the block positions before it (the rnn head's state)."""
        return self.joint_proj is not None

    def prev_embedding(self, prev_ids):
        """prev_ids (...) int64 -> (..., r): what the bias and the confidence head read of the previous token."""
        return self.markov_w1(prev_ids)

    def step(self, prev_ids, hidden, state=None):
        """prev_ids (...), hidden (..., H) the block's outputs at the same positions, state (..., r) the rnn head's
        after the position before (None at a block's position 0) -> (bias (..., V), the state after this position;
        None for a memoryless head)."""
        e = self.prev_embedding(prev_ids).to(hidden.dtype)
        if self.gate_proj is not None:
            e = e * torch.sigmoid(self.gate_proj(torch.cat([hidden, e], dim=-1)))
        if self.joint_proj is None:
            return self.markov_w2(e), None
        if state is None:
            state = torch.zeros_like(e)
        gate, candidate, output = self.joint_proj(torch.cat([state, e, hidden], dim=-1)).chunk(3, dim=-1)
        gate = torch.sigmoid(gate)
        state = gate * state + (1 - gate) * torch.tanh(candidate)
        return self.markov_w2(torch.tanh(output)), state


class ConfidenceHead(nn.Module):
    """One linear unit over the block's output (and the Markov embedding of the previous token): the logit of the
    estimated acceptance of the position's proposal given the ones before it (DeepSpec's `proj`)."""

    def __init__(self, in_features: int):
        super().__init__()
        self.proj = Linear(in_features, 1)

    def forward(self, features):
        return self.proj(features).squeeze(-1)


class DSparkDraftModel(DFlashDraftModel):
    """A DSpark drafter on `target` (see the module docstring). `confidence_threshold` is the estimate below which a
    block position and the ones after it are not verified (0: every position is)."""

    architecture = "Qwen3DSparkModel"
    label = "DSpark"

    def __init__(self, config: DSparkConfig, target, confidence_threshold: float = DEFAULT_CONFIDENCE_THRESHOLD):
        super().__init__(config, target)
        self.markov_head = MarkovHead(config) if config.markov_rank else None
        self.confidence_head = None
        if config.enable_confidence_head:
            width = config.hidden_size + (config.markov_rank if config.confidence_head_with_markov else 0)
            self.confidence_head = ConfidenceHead(width)
        self.confidence_threshold = confidence_threshold

    @property
    def confidence_threshold(self) -> float:
        return self._confidence_threshold

    @confidence_threshold.setter
    def confidence_threshold(self, value) -> None:
        v = check_real("confidence_threshold", value)
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"confidence_threshold must be in [0, 1], got {value!r}")
        self._confidence_threshold = v

    # ---- the heads -------------------------------------------------------------------------------------
    def refine_step(self, logits, prev_ids, hidden, state=None):
        """One block position: logits (..., V) the LM head's at outputs hidden (..., H), prev_ids (...) the tokens
        before them, state the Markov head's after the position before (None at position 0) -> (the Markov-refined
        logits, the state to pass with the next position). Without a Markov head: (logits, None)."""
        if self.markov_head is None:
            return logits, None
        bias, state = self.markov_head.step(prev_ids, hidden, state)
        return logits + bias.to(logits.dtype), state

    def refine_logits(self, logits, prev_ids, hidden):
        """A teacher-forced block: logits (..., S, V) the LM head's at a block's positions 0..S-1 (in order on the
        second-to-last axis) whose outputs are hidden (..., S, H), prev_ids (..., S) the tokens before them -> the
        Markov-refined logits (the same tensor without a Markov head)."""
        if self.markov_head is None:
            return logits
        if not self.markov_head.recurrent:
            return self.refine_step(logits, prev_ids, hidden)[0]
        state, rows = None, []
        for j in range(logits.shape[-2]):
            row, state = self.refine_step(logits[..., j, :], prev_ids[..., j], hidden[..., j, :], state)
            rows.append(row)
        return torch.stack(rows, dim=-2)

    def confidence_logits(self, hidden, prev_ids):
        """hidden (..., H), prev_ids (...) -> (...) fp32 logits of the estimated acceptance, or None without a
        confidence head."""
        if self.confidence_head is None:
            return None
        features = hidden
        if self.config.confidence_head_with_markov:
            features = torch.cat([hidden, self.markov_head.prev_embedding(prev_ids).to(hidden.dtype)], dim=-1)
        return self.confidence_head(features).float()

    def confident_length(self, confidence_logits, S: int, threshold: float | None = None):
        """confidence_logits (B, S) fp32 -> (B,) int64: the number of leading positions whose estimated acceptance
        is at least `threshold` (the drafter's `confidence_threshold` when None; S at a threshold of 0 or without a
        confidence head), computed on the device."""
        B = confidence_logits.shape[0]
        threshold = self.confidence_threshold if threshold is None else threshold
        if self.confidence_head is None or threshold <= 0.0:
            return torch.full((B,), S, dtype=torch.int64, device=confidence_logits.device)
        below = torch.sigmoid(confidence_logits) < threshold
        first = below.to(torch.int8).argmax(-1)  # the first True; 0 when there is none
        return torch.where(below.any(-1), first, S)

    # ---- checkpoints (DeepSpec's layout) -----------------------------------------------------------------------
    #: the tensors DeepSpec's checkpoints carry as frozen copies of the target's; a drafter written for its target
    #: (`save_target_draft`) leaves them out, and the loader then takes the target's own
    TARGET_COPIES = ("embed_tokens.weight", "lm_head.weight")

    def checkpoint(self) -> tuple[dict, dict]:
        d, sd = super(DFlashDraftModel, self).checkpoint()
        for name in ("chain_hidden_states", "eagle_layout", "mtp_layout"):
            d.pop(name, None)
        if not self.config.markov_rank:
            d.pop("markov_head_type", None)
        d.update(num_target_layers=self.target.config.num_hidden_layers, tie_word_embeddings=False,
                 layer_types=["full_attention"] * self.config.num_hidden_layers)
        target = self.target
        sd = dict(sd, **{"embed_tokens.weight": target.model.embed_tokens.weight.detach().to(self.dtype),
                         "lm_head.weight": target.lm_head.weight.detach().to(self.dtype)})
        return d, sd

    @classmethod
    def from_pretrained(cls, path, target, device=None, dtype: torch.dtype | None = None,
                        confidence_threshold: float = DEFAULT_CONFIDENCE_THRESHOLD):
        """A DSpark checkpoint directory in DeepSpec's layout (`read_dspark_config`), with or without the copies of
        the target's embedding and LM head (`TARGET_COPIES`). A missing head (the Markov or confidence head the
        config names, one copy without the other), a tensor of a head the config leaves out, a copy that is not
        `target`'s matrix, or a shape, depth or layer id that does not fit `target`: a one-line ValueError naming
        it."""
        config = read_dspark_config(path)
        model = cls(config, target, confidence_threshold)
        sd = {name.removeprefix("model."): t for name, t in read_state_dict(path).items()}
        _check_heads(path, config, sd)
        if any(name in sd for name in cls.TARGET_COPIES):
            for name, theirs in zip(cls.TARGET_COPIES, (target.model.embed_tokens.weight, target.lm_head.weight)):
                _check_same_matrix(path, name, sd.pop(name), theirs)
        load_strict(model, sd, path)
        return model.to(device=device or target.device, dtype=dtype or target.dtype).eval()


#: the tensors each head of a DSpark checkpoint holds (a prefix of their names), and the config field that asks for
#: it
_HEADS = {"Markov head": ("markov_head.", "markov_rank"),
          "confidence head": ("confidence_head.", "enable_confidence_head")}


def _check_heads(path, config: DSparkConfig, sd: dict) -> None:
    held = [name in sd for name in DSparkDraftModel.TARGET_COPIES]
    if any(held) and not all(held):
        what, name = (("embedding", "embed_tokens.weight"), ("LM head", "lm_head.weight"))[held.index(False)]
        raise ValueError(f"{path}: no {name} (the drafter's {what}, a copy of the target's that DeepSpec's "
                         f"checkpoints carry) beside the other copy")
    for head, (prefix, field_name) in _HEADS.items():
        asked, held = bool(getattr(config, field_name)), any(k.startswith(prefix) for k in sd)
        if asked and not held:
            raise ValueError(f"{path}: config.json has {field_name}={getattr(config, field_name)!r} but the "
                             f"checkpoint holds no {prefix}* tensor (its {head} is missing)")
        if held and not asked:
            raise ValueError(f"{path}: the checkpoint holds {prefix}* tensors (a {head}) but config.json has "
                             f"{field_name}={getattr(config, field_name)!r}")


def _check_same_matrix(path, name: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """ValueError unless the checkpoint's copy `ours` of a target matrix is `theirs` up to storage rounding
    (`SAME_MATRIX_TOLERANCE`): a drafter made for another target of the same shape."""
    if ours.shape != theirs.shape:
        raise ValueError(f"{path}: {name} has shape {tuple(ours.shape)}, the target's {tuple(theirs.shape)}: a "
                         f"drafter for another target")
    a, b = ours.detach().float().cpu(), theirs.detach().float().cpu()
    scale = b.abs().amax(-1, keepdim=True).clamp_min(1e-12)
    worst = float(((a - b).abs() / scale).max()) if a.numel() else 0.0
    if worst > SAME_MATRIX_TOLERANCE:
        raise ValueError(f"{path}: {name} differs from the target's by {worst:.2f} of a row's largest value: a "
                         f"drafter for another target (DeepSpec copies the target's into the drafter and freezes it)")


#: the config.json fields a DSpark checkpoint must have (DeepSpec's model asserts the same, block_size aside)
REQUIRED_FIELDS = ("block_size", "mask_token_id", "target_layer_ids", "enable_confidence_head", "markov_rank")


def read_dspark_config(path) -> DSparkConfig:
    """config.json of a DSpark checkpoint -> DSparkConfig; ValueError naming a missing field, another architecture,
    sliding-window layers or a Markov head that is not implemented."""
    where = f"{path}/config.json"
    raw = read_config(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("architectures") != [DSparkDraftModel.architecture]:
        raise ValueError(f"{path}: architectures={raw.get('architectures')!r}, expected "
                         f"[{DSparkDraftModel.architecture!r}]")
    missing = [k for k in REQUIRED_FIELDS if raw.get(k) is None]
    if missing:
        raise ValueError(f"{where}: no {', '.join(missing)} (DeepSpec's DSpark fields, at the top level)")
    if raw["markov_rank"] and raw.get("markov_head_type") is None:
        raise ValueError(f"{where}: markov_rank={raw['markov_rank']} but no markov_head_type")
    if raw["enable_confidence_head"] and raw.get("confidence_head_with_markov") is None:
        raise ValueError(f"{where}: enable_confidence_head=true but no confidence_head_with_markov")
    kinds = raw.get("layer_types") or []
    windowed = [i for i, kind in enumerate(kinds) if kind != "full_attention"]
    if windowed:
        raise ValueError(f"{where}: layer_types marks draft layer(s) {windowed} {kinds[windowed[0]]!r}: only full "
                         f"attention is implemented")
    fields = {k: v for k, v in raw.items() if k not in ("architectures", "sliding_window", "use_sliding_window")}
    fields.update(_decoder_defaults(raw, where))
    fields.update(model_type="qwen3", confidence_head_with_markov=bool(raw.get("confidence_head_with_markov")))
    return DSparkConfig.from_dict(fields, where=where)


def dspark_config_like(target, num_layers: int, block_size: int, target_layer_ids=None, mask_token_id: int = 0,
                       markov_rank: int = 16, markov_head_type: str = "vanilla", confidence_head: bool = True,
                       confidence_head_with_markov: bool = True, **overrides) -> DSparkConfig:
    """A DSpark drafter's config with the target's decoder shape, DFlash's default context layers unless given,
    and DeepSpec's released heads (a vanilla Markov head, a confidence head reading its embedding) unless told."""
    heads = dict(markov_rank=markov_rank, markov_head_type=markov_head_type if markov_rank else None,
                 enable_confidence_head=confidence_head,
                 confidence_head_with_markov=confidence_head and confidence_head_with_markov)
    return dflash_config_like(target, num_layers, block_size, target_layer_ids, mask_token_id,
                              config_class=DSparkConfig, heads=heads, **overrides)


def random_dspark(target, num_layers: int = 1, block_size: int = 4, target_layer_ids=None, mask_token_id: int = 0,
                  seed: int = 0, std=None, confidence_threshold: float = DEFAULT_CONFIDENCE_THRESHOLD,
                  **config) -> DSparkDraftModel:
    """A random DSpark drafter on `target` (tests, the speed runs); `config`: `dspark_config_like`'s head options
    and decoder overrides."""
    model = DSparkDraftModel(dspark_config_like(target, num_layers, block_size, target_layer_ids, mask_token_id,
                                                **config), target, confidence_threshold)
    randomize_(model, seed, std if std is not None else target.config.hidden_size ** -0.5)
    return model.to(device=target.device, dtype=target.dtype).eval()
