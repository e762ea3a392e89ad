"""What the checker returns: the engine's law of the first n emitted tokens beside the target's own, and where they
differ most."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LawReport:
    """method: "exact" (every draw and coin enumerated) or "monte-carlo" (sampled through the engine);
    law: {outcome: probability} of the first n tokens the engine emits (monte-carlo: the observed frequencies), an
    outcome the tuple of emitted ids (`specdec.lab.target.ERROR` last when the request ended in error);
    target: the target's own law of the same (`specdec.lab.target_law`, float64);
    max_diff, where: the largest |law - target| over every outcome and the outcome it occurs at;
    paths: exact: the coin paths enumerated (engine requests run); monte-carlo: the samples drawn;
    p_value: monte-carlo: the chi-square goodness-of-fit p-value of the samples against `target` (None for exact);
    seconds: the wall time it took."""

    method: str
    law: dict
    target: dict
    max_diff: float
    where: tuple | None
    paths: int
    p_value: float | None = None
    seconds: float = 0.0

    @classmethod
    def of(cls, method: str, law: dict, target: dict, paths: int, p_value=None, seconds: float = 0.0) -> "LawReport":
        where, largest = None, 0.0
        for outcome in sorted(set(law) | set(target), key=repr):
            diff = abs(law.get(outcome, 0.0) - target.get(outcome, 0.0))
            if diff > largest:
                where, largest = outcome, diff
        return cls(method, law, target, largest, where, paths, p_value, seconds)

    def __str__(self) -> str:
        at = "" if self.where is None else (f" at {self.where} (engine {self.law.get(self.where, 0.0):.6g}, target "
                                            f"{self.target.get(self.where, 0.0):.6g})")
        p = "" if self.p_value is None else f", chi-square p = {self.p_value:.3g}"
        what = "paths" if self.method == "exact" else "samples"
        return (f"{self.method} law over {self.paths} {what}: largest difference {self.max_diff:.3g}{at}{p} "
                f"({self.seconds:.1f} s)")
