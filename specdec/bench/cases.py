"""The one list of worker cases: the demo runs it as it stands, and every suite filters it.

A case is a draft kind and its speculative shape, each kind's shapes from its record (`DraftKind.demo_specs`);
its label (`specdec.draft_kinds.worker_label`) names it in the demo, every CSV (`label` column) and every
plot. Peers are Hugging Face transformers' `generate`, beside the specdec workers in the acceptance suite.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from ..config import SpecConfig
from ..draft_kinds import DRAFT_KINDS, worker_label, draft_kind
from ..tuning import TunedSpec, shape_spec
from ..verify_rules import verify_rule


@dataclass(frozen=True)
class WorkerCase:
    """kind: "target-only", a draft kind (`DRAFT_KINDS`: "eagle", "eagle3", "mtp" (MiMo style), "mtp_chain"
    (Step-3.5 style), ...), or a peer from Hugging Face transformers: "hf-target-only" (`generate`) and
    "hf-prompt-lookup" (`generate` with `prompt_lookup_num_tokens=prompt_lookup`), "hf-assisted" (`generate` with
    `assistant_model=` the pair's draft LM, STANDALONE's peer); both batch size 1 only, as transformers allows.
    e2e: whether the e2e suite runs it. draft_options: (field, value) pairs that replace the kind's draft's own
    (`dataclasses.replace` for a dataclass draft, `NgramDraft`; else attributes set on a shallow copy, which shares
    the weights: `DSparkDraftModel.confidence_threshold`), named in the label ("NGRAM indexing=sequence tree
    S5 K4 W16"). token_map_size: n > 0 runs the draft with a token map of n ids (`Engine(token_map=)`: a
    hot-vocabulary LM head; `token_map_for` picks them), named in the label ("EAGLE tree S5 K4 W16 hot 32768").
    decode_ahead: False runs the engine without decoding ahead (`Engine(overlap=False)`, "target-only read
    first"), to measure what decoding ahead brings beside the same case with it."""

    kind: str
    spec: SpecConfig | None  # or a `specdec.tuning.TunedSpec`: the shapes `specdec tune` chose, tuned or adaptive
    prompt_lookup: int = 0
    e2e: bool = True
    draft_options: tuple = ()
    token_map_size: int = 0
    decode_ahead: bool = True

    def token_map_for(self, target):
        """The token map this case runs with (None without one): the first `token_map_size` ids, as a speed case
        on random weights needs no particular ones."""
        return None if not self.token_map_size else list(range(self.token_map_size))

    def draft_for(self, draft):
        """The draft this case runs: the kind's `draft`, with `draft_options` in place of its own fields."""
        if not self.draft_options or draft is None:
            return draft
        if dataclasses.is_dataclass(draft):
            return dataclasses.replace(draft, **dict(self.draft_options))
        changed = copy.copy(draft)
        for name, value in self.draft_options:
            setattr(changed, name, value)
        return changed

    @property
    def shape_policy(self) -> str:
        """"static" (one SpecConfig, or none), "tuned" or "adaptive" (a tuned file)."""
        if not isinstance(self.spec, TunedSpec):
            return "static"
        return "adaptive" if self.spec.adaptive else "tuned"

    def shape_at(self, batch_size: int):
        """The SpecConfig this case runs at `batch_size` (a tuned file's bucket shape; None without a draft)."""
        if self.shape_policy == "static":
            return self.spec
        return shape_spec(self.spec.bucket(batch_size).shape)

    @property
    def is_peer(self) -> bool:
        return self.kind.startswith("hf-")

    @property
    def batch_one_only(self) -> bool:
        """transformers runs prompt lookup and assisted generation at batch size 1 only."""
        return bool(self.prompt_lookup) or self.kind == "hf-assisted"

    @property
    def label(self) -> str:
        if self.is_peer:
            return peer_label(self.kind, self.prompt_lookup)
        options = " ".join(name if value is True else f"{name}={value}" for name, value in self.draft_options)
        if self.shape_policy != "static":  # "EAGLE tuned", "EAGLE adaptive": the shape moves with the batch
            return " ".join(filter(None, (draft_kind(self.kind).label, options, self.shape_policy)))
        suffix = (f" hot {self.token_map_size}" if self.token_map_size else "") + (
            "" if self.decode_ahead else " read first")
        if options:
            kind = draft_kind(self.kind)
            return f"{kind.label} {options} {kind.shape_label(self.spec)}{suffix}"
        return worker_label(self.kind, self.spec) + suffix


def peer_label(kind: str, prompt_lookup: int) -> str:
    """"hf-prompt-lookup", 3 -> "transformers prompt-lookup 3"."""
    return f"transformers {kind.removeprefix('hf-')}" + (f" {prompt_lookup}" if prompt_lookup else "")


def _draft_cases() -> list[WorkerCase]:
    """Every kind's demo shapes, the cases of one shape side by side (EAGLE and EAGLE-3 at the same S, K, W),
    the shapes in the order the kinds first name them, the kinds in `DRAFT_KINDS`' order within a shape."""
    cases = [WorkerCase(kind.name, spec, e2e=spec in kind.e2e_specs)
             for kind in DRAFT_KINDS.values() for spec in kind.demo_specs]
    shapes = list(dict.fromkeys(c.spec for c in cases))
    return sorted(cases, key=lambda c: shapes.index(c.spec))


#: In the demo's order: target-only, then the kinds' shapes (`_draft_cases`).
CASES = [WorkerCase("target-only", None)] + _draft_cases()
PEER_CASES = [WorkerCase("hf-target-only", None), WorkerCase("hf-prompt-lookup", None, 3),
              WorkerCase("hf-prompt-lookup", None, 10)]
#: STANDALONE's peer, run when the pair ships a draft LM
ASSISTED_CASE = WorkerCase("hf-assisted", None)


#: NGRAM with each of the toolkit's own options in place of SGLang's rule (`NgramDraft`: one trie per request,
#: the whole sequence indexed, BFS children by count), at its demo shapes; the acceptance suite runs them beside
#: SGLang's rules, each pass from an empty trie
NGRAM_OPTION_CASES = [WorkerCase("ngram", spec, e2e=False, draft_options=(option,))
                      for option in (("shared", False), ("indexing", "sequence"), ("child_order", "frequency"))
                      for spec in DRAFT_KINDS["ngram"].demo_specs]
def dspark_threshold_cases(thresholds) -> list[WorkerCase]:
    """DSpark at its demo shapes with each confidence threshold of `thresholds` in place of its drafter's own (0:
    the block verified whole), labelled by it ("DSpark confidence_threshold=0.3 block 7")."""
    return [WorkerCase("dspark", spec, e2e=False, draft_options=(("confidence_threshold", float(t)),))
            for t in thresholds for spec in DRAFT_KINDS["dspark"].demo_specs]


#: DSpark's block verified whole (no confidence cap) beside the capped one, at its demo shapes: what the cap gains
DSPARK_OPTION_CASES = dspark_threshold_cases((0.0,))


def with_dspark_thresholds(cases: list[WorkerCase], thresholds) -> list[WorkerCase]:
    """`cases` with DSpark's cases replaced, where the first of them stood, by one per threshold of `thresholds`
    (`dspark_threshold_cases`); `cases` as they are when `thresholds` is empty or none is DSpark's."""
    first = next((i for i, c in enumerate(cases) if c.kind == "dspark"), None)
    if not thresholds or first is None:
        return cases
    rest = [c for c in cases if c.kind != "dspark"]
    return rest[:first] + dspark_threshold_cases(thresholds) + rest[first:]


def with_verify_rules(cases: list[WorkerCase], rules: list[str]) -> list[WorkerCase]:
    """`cases` with each static drafting case of a kind that has a distribution once per verify rule of `rules`
    (`SpecConfig.verify`, registered rules of `specdec.verify_rules`) that runs on its shape
    (`VerifyRule.benched_on`: block verification on chains only, traversal on trees only, as on a chain it is block
    verification; none that is inexact on a chain the kind's drafted tokens stop, `DraftKind.stops_chains`), after
    it; a rule that reads the draft's distribution drafts by sampling. Without "target_only" in `rules`, those cases
    run the other rules only."""
    out = []
    for c in cases:
        if c.spec is None or c.is_peer or c.shape_policy != "static" or not DRAFT_KINDS[c.kind].samples_drafts:
            out.append(c)
            continue
        for name in rules:
            rule = verify_rule(name)
            if name == "target_only":
                out.append(c)
            elif rule.benched_on(c.spec.topk) and (rule.stopped_chains or not DRAFT_KINDS[c.kind].stops_chains):
                sampling = "sample" if rule.reads_draft else c.spec.draft_sampling
                spec = dataclasses.replace(c.spec, draft_sampling=sampling, verify=name)
                out.append(dataclasses.replace(c, spec=spec, e2e=False))
    return out


def tuned_cases(tuned) -> list[WorkerCase]:
    """A tuned file's two cases (`specdec bench --tuned PATH`): its shapes per bucket, and adaptive speculation."""
    return [WorkerCase(tuned.draft["kind"], tuned.with_adaptive(False), e2e=False),
            WorkerCase(tuned.draft["kind"], tuned.with_adaptive(True), e2e=False)]


def by_kind(cases: list[WorkerCase]) -> list[WorkerCase]:
    """The cases grouped by kind (target-only first, then `DRAFT_KINDS`' order), each kind's in list order: the
    order of the suites' rows."""
    order = ["target-only", *DRAFT_KINDS]
    return sorted(cases, key=lambda c: order.index(c.kind))


def kind_of_label(label: str) -> str:
    """A label -> its draft kind (for CSVs written before the `label` column, whose `worker` held the label)."""
    # the longest label first: "EAGLE-3 ..." is not an "EAGLE ..." case
    for kind in sorted(DRAFT_KINDS.values(), key=lambda k: -len(k.label)):
        if label.startswith(kind.label + " "):
            return kind.name
    return label


def offered_kinds(bundle, requested: list[str] | None = None) -> list[str]:
    """The draft kinds to run on a zoo `bundle`: `requested` (ValueError naming those it does not offer), or, when
    None, every kind it offers (its trained drafts, and the kinds that need no weights)."""
    if requested is None:
        return [k for k in DRAFT_KINDS if getattr(bundle, k) is not None]
    missing = [k for k in requested if getattr(bundle, k) is None]
    if missing:
        raise ValueError(f"zoo checkpoint {bundle.name!r} ships no {missing} draft")
    return list(requested)


def offered_cases(bundle, cases: list[WorkerCase], requested: list[str] | None = None) -> list[WorkerCase]:
    """`cases` without the draft cases whose kind `bundle` does not offer (`offered_kinds`)."""
    kinds = offered_kinds(bundle, requested)
    return [c for c in cases if c.spec is None or c.is_peer or c.kind in kinds]
