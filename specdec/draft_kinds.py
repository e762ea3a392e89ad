"""The draft kinds: one record per kind of draft, read by every place whose behaviour depends on the kind.

A kind's name is everywhere the same word: the zoo Bundle's attribute and directory, the trainer's stage, the
`worker` column of every benchmark CSV, an item of `specdec bench --workers`. Its record (`DraftKind`) says
which model class it is and how it loads, which worker runs it, how many cache slots past the committed length
a step of that worker may write, how the demo, the CSVs and the plots name a configuration of it, which shapes
the demo and the benchmarks run, and how the zoo trains, evaluates and describes it (`ZooStage`).

Adding a kind to the package is its model, its worker, its trainer stage, one `register(DraftKind(...))` below and
its tests; from outside (a notebook, another package), `specdec.register_draft_kind(...)` (`register_plugin`), with
the model and worker as classes or import paths. A registered kind cannot be replaced, and a plugin may not claim a
model class another kind names (a subclass of its own is how a plugin reuses one), so no plugin changes which kind
a shipped draft is; `unregister` removes a plugin's kind.

The package's kinds name their model, worker, trainer and evaluator by import path ("package.module:Name"),
imported on use, so this module imports nothing of specdec but the config: the models, the zoo and the trainer read
it without importing the workers, and it sits below all of them.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .config import SpecConfig

#: the demo's and the benchmarks' shapes: a tree, and a chain
TREE, CHAIN = SpecConfig(5, 4, 16), SpecConfig(3, 1)

#: names that are not kinds: the zoo's target directory and stage, the benchmarks' baseline case
RESERVED_NAMES = ("target", "target-only")


def resolve(path):
    """"package.module:Name" -> that object, imported now (once); an object given in place of a path is itself.
    ValueError naming the path if it cannot be imported."""
    return path if not isinstance(path, str) else _import(path)


@functools.cache
def _import(path: str):
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{path!r} cannot be imported: {e}") from None


def tree_kv_margin(spec: SpecConfig) -> int:
    """EagleWorkerV2's step writes the W verify nodes, the (S-1)K in-flight draft nodes and the S+1 of the draft
    extend past the committed length."""
    return max(spec.num_draft_tokens, (spec.num_steps - 1) * spec.topk, spec.num_steps + 1)


def chain_window_kv_margin(spec: SpecConfig) -> int:
    """MultiLayerEagleWorkerV2's draft extend reruns a window of 2S positions from S-1 before the old committed
    length, so it writes up to 2S past it."""
    return 2 * spec.num_steps


def verify_only_kv_margin(spec: SpecConfig) -> int:
    """A worker that drafts without a cache of its own (NGRAM, SUFFIX) writes only the W verify nodes past the committed
    length."""
    return spec.num_draft_tokens


def draft_lm_kv_margin(spec: SpecConfig) -> int:
    """StandaloneWorker's draft LM runs one position ahead of the target (it holds the root): EagleWorkerV2's
    margin plus one."""
    return tree_kv_margin(spec) + 1


def block_kv_margin(spec: SpecConfig) -> int:
    """DFlashWorker writes the block's W = S + 1 slots past the committed length (the drafter's block and the
    target's verify alike); its context write after verify stays below them."""
    return spec.num_draft_tokens


def block_shape_label(spec: SpecConfig) -> str:
    """`block 8`: a DFlash block of the last verified token and S mask tokens."""
    return f"block {spec.num_steps + 1}"


def trained_block(draft) -> SpecConfig:
    """The chain a DFlash drafter runs by default: its trained block (S = block_size - 1)."""
    return SpecConfig(draft.config.block_size - 1)


def dspark_shape_label(spec: SpecConfig) -> str:
    """`block 7`: a DSpark block of S positions, each proposing (the last verified token then S - 1 mask tokens),
    verified up to its confidence cap."""
    return f"block {spec.num_steps}"


def dspark_trained_block(draft) -> SpecConfig:
    """The chain a DSpark drafter runs by default: its trained block, every position proposing (S = block_size)."""
    return SpecConfig(draft.config.block_size)


def tree_shape_label(spec: SpecConfig) -> str:
    """`chain S3` for K = 1, `tree S5 K4 W16` otherwise."""
    if spec.topk == 1:
        return f"chain S{spec.num_steps}"
    return f"tree S{spec.num_steps} K{spec.topk} W{spec.num_draft_tokens}"


def steps_shape_label(spec: SpecConfig) -> str:
    """`S3`: a chain whose depth is all there is to say (one MTP layer per step)."""
    return f"S{spec.num_steps}"


def one_step_per_layer(draft) -> SpecConfig:
    """The chain an MTP draft runs: one step per layer (MultiLayerEagleWorkerV2 needs S = its layer count)."""
    return SpecConfig(draft.num_layers)


def forward_per_step(num_steps: int) -> int:
    """EAGLE, EAGLE-3, STANDALONE: num_steps - 1 drafting forwards and the extend over the accepted path; MTP: each of
    the num_steps layers once."""
    return num_steps


def one_forward(num_steps: int) -> int:
    """DFlash: one forward over the block (its context write reads the K/V projections again: left out)."""
    return 1


def no_forward(num_steps: int) -> int:
    """NGRAM: a host trie, no forward."""
    return 0


@dataclass(frozen=True, eq=False)
class ZooStage:
    """How the zoo trains, evaluates and describes a kind's draft (`specdec.zoo.train`).

    trainer: "module:function" called (target, opts: StageOpts, seed=, log=) -> (the trained draft, its stats);
    evaluator: "module:function" called (target, draft, windows (N, seq_len + 3), seq_len=) -> the card's
    held-out metrics, {step name: {"ce_true_nats", "ce_target_nats", "top1_agreement"}};
    opts: the stage's default settings, `StageOpts` fields;
    card_text: the model card's description of the draft, `{field}` read from its entry of card.json's models;
    card_cost: whether the card states what one of its draft steps costs against a target step (measured after
    training by `specdec.bench.suites.draft_cost.record_step_costs`, a bench step: it decodes through the engine);
    target_opts: "module:function" called (target, mask_token_id) -> the stage's default `StageOpts` for a draft
    trained for a given target (`specdec zoo train-draft`, `for_target.target_draft_opts`), None when the zoo
    trains none of this kind for a given target;
    ships: whether the zoo's pairs ship this kind's draft (its stage is part of a whole run, `specdec zoo train`, and
    a pair is complete only with it); False for a stage trained only when named (`--stage NAME`, `train-draft --kind
    NAME`), whose draft a pair may still ship and load."""

    trainer: str
    evaluator: str
    opts: Mapping[str, object]
    card_text: str
    card_cost: bool = False
    target_opts: str | None = None
    ships: bool = True

    def train(self, target, opts, seed: int, log):
        return resolve(self.trainer)(target, opts, seed=seed, log=log)

    def evaluate(self, target, draft, windows, seq_len: int) -> dict:
        return resolve(self.evaluator)(target, draft, windows, seq_len=seq_len)

    def opts_for_target(self, target, mask_token_id: int):
        """The stage's default settings for a draft trained for `target` (`target_opts`); ValueError when it names
        none."""
        if self.target_opts is None:
            raise ValueError(f"the zoo stage {self.trainer!r} trains no draft for a given target (no target_opts)")
        return resolve(self.target_opts)(target, mask_token_id)


@dataclass(frozen=True, eq=False)
class DraftKind:
    """One kind of draft.

    name: the bundle attribute, zoo directory, trainer stage, CSV `worker` value (a Python identifier);
    label: how the demo, the CSVs and the plots name its configurations, before `shape_label(spec)`;
    model: "module:Class" of its model (or, for a plugin, the class itself), whose
    `from_pretrained(path, target, device=, dtype=)` loads it, or `loader` ("module:function" called the same way)
    when given;
    model_config: config fields that tell apart kinds of one model class (MTP: `chain_hidden_states`);
    worker: "module:Class" of the worker that runs it (or the class), constructed as
    (target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob);
    kv_margin: spec -> cache slots past the committed length that one decode step of that worker may write;
    demo_specs: the shapes the demo and the benchmark suites run (none: not in the demo);
    e2e_specs: those of them the e2e suite runs too (it times every implementation, so it keeps fewer);
    spec_of_model: for a draft whose model fixes its shape (MTP), the shape it runs; otherwise the first
    demo shape is what `specdec generate` runs by default;
    zoo: how the zoo trains, evaluates and describes it (None: the zoo ships none);
    untrained: "module:factory" of a draft that needs no weights (NGRAM), which every zoo bundle then offers;
    random_draft: "module:factory" called as factory(target, **random_draft_config) -> an untrained draft of this
    kind sized for `target` (the speed runs on a random target: the e2e suite, the GPU one-shot);
    samples_drafts: whether the draft has a distribution to sample its proposals from and to verify with
    (`SpecConfig.draft_sampling`, `SpecConfig.verify`); NGRAM's has none;
    token_map: whether its worker takes a token map (`Engine(token_map=)`, a hot-vocabulary LM head: the worker's
    `token_map` argument): drafts whose LM head covers the target's vocabulary (an EAGLE-3 head has its own
    reduced one, `Eagle3DraftHead.with_draft_vocabulary`);
    forwards_per_step: num_steps -> the draft forwards one decode step runs (the GPU roofline's bytes per step,
    `specdec.gpu_check.roofline.step_reads`), None when the kind states no rule;
    layers_per_forward: whether one of those forwards runs every draft layer ("all") or one of them ("one": MTP layer
    k drafts token k);
    gpu_e2e_specs: the shapes the GPU one-shot's e2e part runs (`specdec.gpu_check.decode.e2e_cases`; one per kind:
    the EAGLE tree as the headline, the other kinds' chain or block), among its demo_specs;
    from_text: "module:function" called (target, text) -> a draft of this kind for `target` made from the text after
    its name in `--draft NAME:TEXT` (the scripted draft's rates), None when the kind is not given so;
    gpu_e2e_graphs_only: the GPU one-shot's e2e part runs it on the fast path with CUDA graphs at B = 1 and 32 only
    (the scripted draft: its rows measure what a draft of its agreement gains, not an implementation);
    stops_chains: whether its chains may end where the drafted tokens decide (DSpark's confidence cap): a verify rule
    not exact there (`VerifyRule.stopped_chains` False) is not benchmarked or fuzzed with it."""

    name: str
    label: str
    model: str | type
    worker: str | type
    kv_margin: Callable[[SpecConfig], int]
    shape_label: Callable[[SpecConfig], str]
    model_config: Mapping[str, object] = field(default_factory=dict)
    loader: str | Callable | None = None
    untrained: str | Callable | None = None
    random_draft: str | Callable | None = None
    random_draft_config: Mapping[str, object] = field(default_factory=dict)
    demo_specs: tuple[SpecConfig, ...] = ()
    e2e_specs: tuple[SpecConfig, ...] = ()
    spec_of_model: Callable[[object], SpecConfig] | None = None
    zoo: ZooStage | None = None
    samples_drafts: bool = True
    token_map: bool = False
    forwards_per_step: Callable[[int], int] | None = None
    layers_per_forward: str = "all"
    gpu_e2e_specs: tuple[SpecConfig, ...] = ()
    from_text: str | Callable | None = None
    gpu_e2e_graphs_only: bool = False
    stops_chains: bool = False

    def model_class(self) -> type:
        return self._resolve("model", self.model)

    def worker_class(self) -> type:
        return self._resolve("worker", self.worker)

    def _resolve(self, what: str, path: str):
        try:
            return resolve(path)
        except ValueError as e:
            raise ValueError(f"draft kind {self.name!r}: its {what} {e}") from None

    def load(self, path, target, device=None, dtype=None):
        """The draft stored in directory `path`, on `target` (`loader`'s function, else the model class's
        `from_pretrained(path, target, device=, dtype=)`)."""
        load = self._resolve("loader", self.loader) if self.loader else self.model_class().from_pretrained
        return load(path, target, device=device, dtype=dtype)

    def claims(self, draft) -> bool:
        """Whether `draft` is a model of this kind (its class or a subclass, with `model_config`'s values)."""
        config = getattr(draft, "config", None)
        return isinstance(draft, self.model_class()) and all(
            getattr(config, name, None) == value for name, value in self.model_config.items())

    def default_spec(self, draft) -> SpecConfig:
        """The shape `specdec generate` runs this draft with when none is asked for."""
        if self.spec_of_model is not None:
            return self.spec_of_model(draft)
        if not self.demo_specs:
            raise ValueError(f"draft kind {self.name!r} names no default shape: pass --num-steps")
        return self.demo_specs[0]

    def untrained_draft(self):
        """A fresh draft of this kind that needs no weights, or None when the kind needs trained ones."""
        return self._resolve("untrained", self.untrained)() if self.untrained else None

    def draft_from_text(self, target, text: str):
        """The draft `--draft NAME:TEXT` names (`from_text`); ValueError when the kind is not given so."""
        if self.from_text is None:
            raise ValueError(f"draft kind {self.name!r} is not given as '{self.name}:...' (a draft directory is)")
        return self._resolve("from_text", self.from_text)(target, text)

    def new_random_draft(self, target):
        """An untrained draft of this kind for `target` (random weights; NGRAM's needs none), or None when the kind
        names no factory."""
        if self.random_draft is None:
            return None
        return self._resolve("random_draft", self.random_draft)(target, **self.random_draft_config)

    def worker_label(self, spec: SpecConfig) -> str:
        """`EAGLE tree S5 K4 W16`; a rule other than SGLang's target-only verify follows the shape (`EAGLE chain S3
        block`), and a sampled draft verified target-only says so (`... sampled`)."""
        rule = spec.verify if spec.verify != "target_only" else "sampled" if spec.draft_sampling == "sample" else ""
        return " ".join(filter(None, (self.label, self.shape_label(spec), rule)))


_KINDS: dict[str, DraftKind] = {}
#: every registered kind by name, read-only (`register` adds, `unregister` removes a plugin's), in the order the
#: demo, the CSVs' rows and the model card list them
DRAFT_KINDS = MappingProxyType(_KINDS)
#: the fields of a record the engine cannot run a kind without
ENGINE_FIELDS = ("name", "label", "model", "worker", "kv_margin", "shape_label")


def model_path(model) -> str:
    """A kind's `model` as "module:Name" (a class given in its place by its module and name)."""
    return model if isinstance(model, str) else f"{model.__module__}:{model.__qualname__}"


def register(kind: DraftKind) -> DraftKind:
    """Add `kind` to `DRAFT_KINDS`; ValueError naming the field when its name is taken or reserved, a field the
    engine needs is missing, a path is not "module:Name" (nor the object itself), or another kind already claims
    the same models."""
    if not isinstance(kind, DraftKind):
        raise ValueError(f"register takes a DraftKind, got {type(kind).__name__}")
    if not isinstance(kind.name, str) or not kind.name.isidentifier() or kind.name in RESERVED_NAMES:
        raise ValueError(f"draft kind name must be a Python identifier other than {RESERVED_NAMES}, got "
                         f"{kind.name!r}")
    if kind.name in _KINDS:
        raise ValueError(f"draft kind {kind.name!r} is already registered")
    missing = [what for what in ENGINE_FIELDS if getattr(kind, what) in (None, "")]
    if missing:
        raise ValueError(f"draft kind {kind.name!r} lacks {', '.join(missing)}, which the engine needs")
    for what in ("kv_margin", "shape_label"):
        if not callable(getattr(kind, what)):
            raise ValueError(f"draft kind {kind.name!r}: {what} must be a function of the SpecConfig, got "
                             f"{getattr(kind, what)!r}")
    paths = [("model", kind.model), ("worker", kind.worker)]
    paths += [(what, getattr(kind, what)) for what in ("loader", "untrained", "random_draft", "from_text")
              if getattr(kind, what)]
    if kind.zoo is not None:
        paths += [("zoo.trainer", kind.zoo.trainer), ("zoo.evaluator", kind.zoo.evaluator)]
        paths += [("zoo.target_opts", kind.zoo.target_opts)] if kind.zoo.target_opts else []
    for what, path in paths:
        if what in ("model", "worker") and isinstance(path, type) or what not in ("model", "worker") and (
                callable(path) and not isinstance(path, str)):
            continue  # the object itself, as a plugin passes it
        module, colon, name = path.partition(":") if isinstance(path, str) else ("", "", "")
        if not (colon and name.isidentifier() and all(p.isidentifier() for p in module.split("."))):
            raise ValueError(f"draft kind {kind.name!r}: {what} must be 'package.module:Name' or the "
                             f"{'class' if what in ('model', 'worker') else 'function'} itself, got {path!r}")
    for other in _KINDS.values():
        if (model_path(other.model), dict(other.model_config)) == (model_path(kind.model), dict(kind.model_config)):
            raise ValueError(f"draft kind {kind.name!r} claims the models of {other.name!r} "
                             f"({model_path(kind.model)} with {dict(kind.model_config)}): give it its own model class "
                             f"or model_config")
    for what in ("e2e_specs", "gpu_e2e_specs"):
        if any(spec not in kind.demo_specs for spec in getattr(kind, what)):
            raise ValueError(f"draft kind {kind.name!r}: {what} must be among its demo_specs")
    if kind.layers_per_forward not in ("all", "one"):
        raise ValueError(f"draft kind {kind.name!r}: layers_per_forward must be 'all' or 'one', got "
                         f"{kind.layers_per_forward!r}")
    _KINDS[kind.name] = kind
    return kind


def register_plugin(kind: DraftKind | None = None, **fields) -> DraftKind:
    """A kind from outside the package (`specdec.register_draft_kind`): `kind` a `DraftKind`, or its fields by name
    (`register_draft_kind(name=..., label=..., model=MyHead, worker=MyWorker, kv_margin=..., shape_label=...)`).
    `register`'s checks, and a one-line ValueError when the model class is one another kind names (a plugin
    subclasses it instead, so the shipped drafts keep their kinds) or a field the engine needs is missing."""
    if kind is None:
        missing = [what for what in ENGINE_FIELDS if what not in fields]
        if missing:
            raise ValueError(f"draft kind {fields.get('name', '?')!r} lacks {', '.join(missing)}, which the engine "
                             f"needs")
        try:
            kind = DraftKind(**fields)
        except TypeError as e:
            raise ValueError(f"draft kind {fields.get('name', '?')!r}: {e}") from None
    elif fields:
        raise ValueError("register_draft_kind takes a DraftKind or its fields, not both")
    if isinstance(kind, DraftKind) and kind.name not in _KINDS:
        claimed = {model_path(k.model): k.name for k in _KINDS.values()}
        if isinstance(kind.model, (str, type)) and model_path(kind.model) in claimed:
            raise ValueError(f"draft kind {kind.name!r}: its model {model_path(kind.model)} is the model of "
                             f"{claimed[model_path(kind.model)]!r}; a plugin names a class of its own (a subclass)")
    return register(kind)


def unregister(name: str) -> None:
    """Remove the plugin kind `name`; ValueError for a shipped kind or a name not registered."""
    if name in BUILT_IN:
        raise ValueError(f"draft kind {name!r} ships with the package: it cannot be removed")
    draft_kind(name)
    del _KINDS[name]


def draft_kind(name: str) -> DraftKind:
    """The kind named `name`; ValueError naming the registered kinds otherwise."""
    try:
        return _KINDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown draft kind {name!r}; registered: {', '.join(_KINDS)}") from None


def kind_of(draft) -> DraftKind:
    """The kind of a draft model: of the kinds that claim it, the one whose model class is nearest its own (a
    subclass registered as a kind of its own is that kind); ValueError naming every kind's model otherwise."""
    mro = type(draft).__mro__
    claiming = [k for k in DRAFT_KINDS.values() if k.claims(draft)]
    if not claiming:
        accepted = {}
        for k in DRAFT_KINDS.values():
            accepted.setdefault(model_path(k.model).partition(":")[2], []).append(k.name)
        models = "; ".join(f"{model}: {', '.join(names)}" for model, names in accepted.items())
        raise ValueError(f"draft must be the model of a draft kind ({models}), got {type(draft).__name__}")
    return min(claiming, key=lambda k: mro.index(k.model_class()))


def worker_label(kind: str, spec: SpecConfig | None) -> str:
    """One name per worker configuration, used by the demo, every CSV and every plot: `target-only` (spec None),
    else the kind's label and shape: `EAGLE tree S5 K4 W16`, `EAGLE chain S3`, `EAGLE-3 tree S5 K4 W16`,
    `MTP MiMo S3`, `MTP Step-3.5 S3`."""
    if spec is None:
        return "target-only"
    return draft_kind(kind).worker_label(spec)


_TRAIN = "specdec.zoo.train.stages"
_BLOCK_TRAIN = "specdec.zoo.train.block_stages"
_EVALUATE = "specdec.zoo.train.evaluate"
_FOR_TARGET = "specdec.zoo.train.for_target"

register(DraftKind(
    name="eagle", label="EAGLE", model="specdec.models.eagle:EagleDraftHead",
    worker="specdec.workers.eagle:EagleWorkerV2", kv_margin=tree_kv_margin, shape_label=tree_shape_label,
    demo_specs=(TREE, CHAIN), e2e_specs=(TREE, CHAIN), random_draft="specdec.models.eagle:random_eagle_head",
    token_map=True, forwards_per_step=forward_per_step, gpu_e2e_specs=(TREE,),
    zoo=ZooStage(f"{_TRAIN}:train_eagle", f"{_EVALUATE}:evaluate_eagle",
                 dict(steps=700, warmup=50, lr=2e-3, extra={"unroll": 3, "w_reg": 1.0, "w_cls": 1.0}),
                 "EAGLE head (1 decoder layer, shared embedding/LM head)",
                 target_opts=f"{_FOR_TARGET}:eagle_target_opts")))
register(DraftKind(
    name="eagle3", label="EAGLE-3", model="specdec.models.eagle3:Eagle3DraftHead",
    worker="specdec.workers.eagle:EagleWorkerV2", kv_margin=tree_kv_margin, shape_label=tree_shape_label,
    demo_specs=(TREE, CHAIN), e2e_specs=(TREE,), forwards_per_step=forward_per_step,
    # random: the 32k draft vocabulary of the public Llama-3 EAGLE-3 heads (the whole vocabulary when smaller)
    random_draft="specdec.models.eagle3:random_eagle3_head", random_draft_config={"draft_vocab_size": 32000},
    # the EAGLE head's budget (steps, tokens per step, unrolled passes), so that the two heads compare fairly; the
    # paper's recipe otherwise (SafeAILab's trainer): the whole vocabulary (258 ids need no reduced one), fc on the
    # raw concatenated features, the pre-norm output hidden fed back, pass j's loss weighted 0.8 ** j. The paper
    # unrolls 7 passes (`--eagle3-unroll 7`), which costs more CPU time per step (results/eagle3-retrain-20261202/,
    # train-*.log)
    zoo=ZooStage(f"{_TRAIN}:train_eagle3", f"{_EVALUATE}:evaluate_eagle",
                 dict(steps=700, warmup=50, lr=2e-3, extra={"unroll": 3, "pass_weight_decay": 0.8}),
                 "EAGLE-3 head (features at target layers {feature_layers}: a layer's input, the layer count "
                 "the last layer's output; its own LM head over {draft_vocab_size} of the {vocab_size} ids)",
                 target_opts=f"{_FOR_TARGET}:eagle3_target_opts")))
_MTP = register(DraftKind(
    name="mtp", label="MTP MiMo", model="specdec.models.mtp:MTPDraftModel",
    model_config={"chain_hidden_states": False}, worker="specdec.workers.multi_layer_eagle:MultiLayerEagleWorkerV2",
    kv_margin=chain_window_kv_margin, shape_label=steps_shape_label, demo_specs=(SpecConfig(3),),
    e2e_specs=(SpecConfig(3),), spec_of_model=one_step_per_layer, random_draft="specdec.models.mtp:random_mtp",
    random_draft_config={"num_layers": 3}, forwards_per_step=forward_per_step, layers_per_forward="one",
    gpu_e2e_specs=(SpecConfig(3),),
    zoo=ZooStage(f"{_TRAIN}:train_mtp", f"{_EVALUATE}:evaluate_mtp",
                 dict(steps=750, warmup=50, lr=2e-3, extra={"num_layers": 3}),
                 "{num_hidden_layers} MTP layers, MiMo style")))
# the same layers in Step-3.5 style: layer k reads layer k-1's output hidden
register(dataclasses.replace(
    _MTP, name="mtp_chain", label="MTP Step-3.5", model_config={"chain_hidden_states": True}, e2e_specs=(),
    gpu_e2e_specs=(),
    random_draft_config={"num_layers": 3, "chain_hidden_states": True},
    zoo=dataclasses.replace(_MTP.zoo, trainer=f"{_TRAIN}:train_mtp_chain",
                            card_text="{num_hidden_layers} MTP layers, Step-3.5 style (chained hidden)")))
# no model: a host n-gram trie, one for every request, fed each decode step's last tokens (SGLang's NGRAM)
register(DraftKind(
    name="ngram", label="NGRAM", model="specdec.models.ngram:NgramDraft",
    worker="specdec.workers.host_proposal:HostProposalWorker", kv_margin=verify_only_kv_margin,
    shape_label=tree_shape_label, demo_specs=(TREE, CHAIN), e2e_specs=(CHAIN,),
    untrained="specdec.models.ngram:NgramDraft", random_draft="specdec.models.ngram:ngram_draft_for",
    samples_drafts=False, forwards_per_step=no_forward, gpu_e2e_specs=(CHAIN,)))
# no model: suffix trees over each request's prompt and output and over earlier requests' outputs, proposing the
# most frequent continuation as far as the match is long (vLLM's suffix decoding); first its default shape, a chain
# of up to max_tree_depth = 24 tokens (vLLM's num_speculative_tokens when none is given)
register(DraftKind(
    name="suffix", label="SUFFIX", model="specdec.models.suffix:SuffixDraft",
    worker="specdec.workers.host_proposal:HostProposalWorker", kv_margin=verify_only_kv_margin,
    shape_label=tree_shape_label, demo_specs=(SpecConfig(24), TREE, CHAIN),
    untrained="specdec.models.suffix:SuffixDraft",
    random_draft="specdec.models.suffix:suffix_draft_for", samples_drafts=False, forwards_per_step=no_forward))
# a small causal LM of the target's vocabulary drafting from its own tokens and KV cache (SGLang's STANDALONE)
register(DraftKind(
    name="draft_lm", label="STANDALONE", model="specdec.models.llama:LlamaForCausalLM",
    loader="specdec.models.llama:load_draft_lm", worker="specdec.workers.standalone:StandaloneWorker",
    kv_margin=draft_lm_kv_margin, shape_label=tree_shape_label, demo_specs=(TREE, CHAIN), e2e_specs=(CHAIN,),
    random_draft="specdec.models.llama:random_draft_lm", token_map=True, forwards_per_step=forward_per_step,
    gpu_e2e_specs=(CHAIN,),
    # one decoder layer at hidden 64: on the deep pair a draft step then costs under a tenth of a target step (the
    # shipped card's `training.draft_lm.step_cost`, `specdec.bench.draft_step_cost`). A forward's fixed cost
    # dominates at these widths, so on the small pair no 1-2-layer LM fits a tenth. 2400 steps: the shipped
    # deep-pair LM's, which agrees with the target more than 600 steps' and accepts more tokens per step
    # (results/draft-lm-retrain-20261204/: card.json, heads-32-prompts.json)
    zoo=ZooStage(f"{_TRAIN}:train_draft_lm", f"{_EVALUATE}:evaluate_draft_lm",
                 dict(steps=2400, batch_size=4, warmup=50, lr=3e-3,
                      extra={"num_layers": 1, "hidden_size": 64, "intermediate_size": 172, "num_attention_heads": 2,
                             "num_key_value_heads": 1}),
                 "STANDALONE draft LM (its own embedding and LM head, distilled from the target)", card_cost=True,
                 target_opts=f"{_FOR_TARGET}:draft_lm_target_opts")))
# a block drafter: one forward over [last verified token, mask tokens] attending to the target's features (z-lab's
# DFlash), verified as a chain. Two decoder layers at the target's width, block 8; what one block forward costs on the
# deep pair is on its model card (`training.dflash.step_cost`, `specdec.bench.draft_step_cost`)
register(DraftKind(
    name="dflash", label="DFlash", model="specdec.models.dflash:DFlashDraftModel",
    worker="specdec.workers.dflash:DFlashWorker", kv_margin=block_kv_margin, shape_label=block_shape_label,
    demo_specs=(SpecConfig(7),), e2e_specs=(SpecConfig(7),), spec_of_model=trained_block,
    forwards_per_step=one_forward, gpu_e2e_specs=(SpecConfig(7),),
    # random: two layers at the target's width, block 8 (its cost, not its acceptance)
    random_draft="specdec.models.dflash:random_dflash", random_draft_config={"num_layers": 2, "block_size": 8},
    zoo=ZooStage(f"{_BLOCK_TRAIN}:train_dflash", f"{_EVALUATE}:evaluate_dflash",
                 dict(steps=450, batch_size=8, seq_len=256, warmup=40, lr=3e-3,
                      extra={"num_layers": 2, "num_context_layers": 3, "block_size": 8, "blocks_per_window": 128,
                             "gamma": 4.0, "norm_from_target": True}),
                 "DFlash block drafter ({num_hidden_layers} layers, block {block_size}, context from target layers "
                 "{target_layer_ids})", card_cost=True, target_opts=f"{_FOR_TARGET}:dflash_target_opts")))
# a block drafter with a Markov head that chooses the block token after token and a confidence head that caps how
# much of it is verified (DeepSeek's DSpark, SGLang's DSPARK); the cap is per request and per step, on the device
register(DraftKind(
    name="dspark", label="DSpark", model="specdec.models.dspark:DSparkDraftModel",
    worker="specdec.workers.dspark:DSparkWorker", kv_margin=block_kv_margin, shape_label=dspark_shape_label,
    demo_specs=(SpecConfig(7),), spec_of_model=dspark_trained_block, forwards_per_step=one_forward,
    stops_chains=True,
    # random: DFlash's speed draft (two layers at the target's width) with DeepSpec's block of 7
    random_draft="specdec.models.dspark:random_dspark", random_draft_config={"num_layers": 2, "block_size": 7},
    # DFlash's stage settings with DeepSpec's block of 7, a vanilla Markov head and a confidence head reading its
    # embedding, DeepSpec's loss; trained only when named (an hour of CPU on the deep pair): the deep pair ships one
    # trained with `--stage dspark --dspark-steps 1800`, the small pair none
    zoo=ZooStage(f"{_BLOCK_TRAIN}:train_dspark", f"{_EVALUATE}:evaluate_dspark",
                 dict(steps=450, batch_size=8, seq_len=256, warmup=40, lr=3e-3,
                      extra={"num_layers": 2, "num_context_layers": 3, "block_size": 7, "blocks_per_window": 128,
                             "gamma": 4.0, "markov_rank": 32, "markov_head_type": "vanilla", "norm_from_target": True}),
                 "DSpark block drafter ({num_hidden_layers} layers, block {block_size}, context from target layers "
                 "{target_layer_ids}, Markov rank {markov_rank}, a confidence head)",
                 target_opts=f"{_FOR_TARGET}:dspark_target_opts", ships=False)))

# the lab's draft of set quality: the target's own greedy continuation, departed from at set rates by depth (a
# benchmark device: what a trained draft of that agreement would gain on any target, outputs exact). Its chain is as
# deep as its default rates; no zoo draft, and none offered unasked (`--draft scripted:RATES` gives one)
_SCRIPTED_CHAIN = SpecConfig(5, 1)
register(DraftKind(
    name="scripted", label="SCRIPTED", model="specdec.lab.scripted:ScriptedDraft",
    worker="specdec.workers.host_proposal:HostProposalWorker", kv_margin=verify_only_kv_margin,
    shape_label=tree_shape_label, demo_specs=(_SCRIPTED_CHAIN, TREE), e2e_specs=(_SCRIPTED_CHAIN, TREE),
    random_draft="specdec.lab.scripted:scripted_draft_for", from_text="specdec.lab.scripted:draft_from_text",
    samples_drafts=False, forwards_per_step=no_forward, gpu_e2e_specs=(_SCRIPTED_CHAIN, TREE),
    gpu_e2e_graphs_only=True))
#: the kinds the package ships, registered above; `unregister` refuses them
BUILT_IN: tuple[str, ...] = tuple(_KINDS)
