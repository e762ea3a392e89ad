"""The one list of worker cases: the demo runs it as it stands, and every suite filters it.

A case is a draft kind and its speculative shape; its label (`specdec.config.worker_label`) names it in the
demo, every CSV (`label` column) and every plot. Peers are Hugging Face transformers' `generate`, beside the
specdec workers in the acceptance suite.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import DRAFT_KINDS, SpecConfig, worker_label

TREE, CHAIN = SpecConfig(5, 4, 16), SpecConfig(3, 1)


@dataclass(frozen=True)
class WorkerCase:
    """kind: "target-only", a draft kind (`DRAFT_KINDS`: "eagle", "eagle3", "mtp" (MiMo style), "mtp_chain"
    (Step-3.5 style)), or a peer from Hugging Face transformers: "hf-target-only" (`generate`) and
    "hf-prompt-lookup" (`generate` with `prompt_lookup_num_tokens=prompt_lookup`; batch size 1 only, as
    transformers allows). e2e: whether the e2e suite runs it."""

    kind: str
    spec: SpecConfig | None
    prompt_lookup: int = 0
    e2e: bool = True

    @property
    def is_peer(self) -> bool:
        return self.kind.startswith("hf-")

    @property
    def label(self) -> str:
        return peer_label(self.kind, self.prompt_lookup) if self.is_peer else worker_label(self.kind, self.spec)


def peer_label(kind: str, prompt_lookup: int) -> str:
    """"hf-prompt-lookup", 3 -> "transformers prompt-lookup 3"."""
    return f"transformers {kind.removeprefix('hf-')}" + (f" {prompt_lookup}" if prompt_lookup else "")


#: In the demo's order: EAGLE and EAGLE-3 side by side at the same S, K, W.
CASES = [
    WorkerCase("target-only", None),
    WorkerCase("eagle", TREE),
    WorkerCase("eagle3", TREE),
    WorkerCase("eagle", CHAIN),
    WorkerCase("eagle3", CHAIN, e2e=False),
    WorkerCase("mtp", SpecConfig(3)),
    WorkerCase("mtp_chain", SpecConfig(3), e2e=False),
]
PEER_CASES = [WorkerCase("hf-target-only", None), WorkerCase("hf-prompt-lookup", None, 3),
              WorkerCase("hf-prompt-lookup", None, 10)]

_KIND_ORDER = ("target-only",) + DRAFT_KINDS


def by_kind(cases: list[WorkerCase]) -> list[WorkerCase]:
    """The cases grouped by kind (target-only first, then `DRAFT_KINDS`' order), each kind's in list order: the
    order of the suites' rows."""
    return sorted(cases, key=lambda c: _KIND_ORDER.index(c.kind))


def kind_of_label(label: str) -> str:
    """A label -> its draft kind (for CSVs written before the `label` column, whose `worker` held the label)."""
    for prefix, kind in (("EAGLE-3 ", "eagle3"), ("EAGLE ", "eagle"), ("MTP MiMo ", "mtp"),
                         ("MTP Step-3.5 ", "mtp_chain")):
        if label.startswith(prefix):
            return kind
    return label
