"""specdec.lab: prove a drafting kind or a verify rule lossless, on the engine's own code.

`exact_law(target, draft, spec, params, prompt, n)` runs `Engine(target, draft, spec)` with every draft draw and
every coin enumerated (each uniform the step consumes partitioned into the intervals on which what it decides is
constant, `coins`), and returns the law of the first n emitted tokens in float64 beside the target's own
(`target_law`, computed without the engine), with the largest difference and where it occurs (`LawReport`).
`monte_carlo_law` samples instead, for shapes too large to enumerate, and adds a chi-square p-value.
`table_model(logits)` makes a model of a (V, V) logit table, as a target or a STANDALONE draft.

Anything registered (`specdec.register_draft_kind`, `specdec.register_verify_rule`) runs through both as the shipped
kinds and rules do.
"""
from .coins import GRID, Cell, partition
from .exact import LabError, exact_law
from .montecarlo import chi_square_pvalue, monte_carlo_law
from .report import LawReport
from .tables import table_model
from .target import ERROR, target_law

__all__ = ["ERROR", "GRID", "Cell", "LabError", "LawReport", "chi_square_pvalue", "exact_law", "monte_carlo_law",
           "partition", "table_model", "target_law"]
