"""specdec: EAGLE-style speculative decoding, reference (PyTorch) and fast (Triton) paths.

The plugin points: `register_draft_kind` (a kind of draft: its model, its worker; `specdec.draft_kinds`) and
`register_verify_rule` (a rule by which sampled requests are verified: its op; `specdec.verify_rules`). What is
registered runs through `Engine`, the benchmarks and the exact-law checker `specdec.lab` as the shipped kinds and
rules do.
"""
from .config import SamplingParams, SpecConfig
from .draft_kinds import DraftKind
from .draft_kinds import register_plugin as register_draft_kind
from .engine import Engine, GenerateOutput, GenerateStats
from .models.ngram import NgramDraft
from .models.suffix import SuffixDraft
from .verify_rules import VerifyRule
from .verify_rules import register_plugin as register_verify_rule

__all__ = ["DraftKind", "Engine", "GenerateOutput", "GenerateStats", "NgramDraft", "SamplingParams", "SpecConfig",
           "SuffixDraft", "VerifyRule", "register_draft_kind", "register_verify_rule"]
__version__ = "0.1.0"
