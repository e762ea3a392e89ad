"""The Monte-Carlo mode, for shapes too large to enumerate: the engine samples the first n tokens of many requests,
and a chi-square goodness-of-fit test compares their frequencies with the target's exact law."""
from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from ..config import SamplingParams, SpecConfig
from .report import LawReport
from .setup import Setup
from .target import ERROR, target_law


def chi_square_pvalue(counts, probs) -> float:
    """Pearson chi-square goodness-of-fit p-value of observed `counts` against `probs` (an exact distribution). Cells
    with an expected count below 5 are pooled into one, so that the chi-square approximation holds; a cell observed
    with probability 0 gives p = 0.

    Either two sequences, cell by cell, or two mappings outcome -> count and outcome -> probability (an outcome
    missing from `probs` has probability 0, one missing from `counts` was never observed)."""
    if isinstance(counts, Mapping):
        outcomes = list(probs) + [k for k in counts if k not in probs]
        counts, probs = [counts.get(k, 0) for k in outcomes], [probs.get(k, 0.0) for k in outcomes]
    counts = [float(c) for c in counts]
    n = sum(counts)
    probs = [float(p) for p in probs]
    for c, p in zip(counts, probs):
        if p == 0.0 and c > 0:
            return 0.0
    cells, pooled_o, pooled_e = [], 0.0, 0.0
    for c, p in zip(counts, probs):
        e = n * p
        if e == 0.0:
            continue
        if e < 5:
            pooled_o += c
            pooled_e += e
        else:
            cells.append((c, e))
    if pooled_e > 0:
        cells.append((pooled_o, pooled_e))
    dof = len(cells) - 1
    if dof < 1:
        return 1.0
    stat = sum((o - e) ** 2 / e for o, e in cells)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def monte_carlo_law(target, draft=None, spec: SpecConfig | None = None, params: SamplingParams | None = None,
                    prompt=(0,), n: int = 2, tokenizer=None, impl: str = "reference", samples: int = 4000,
                    seed: int = 0, batch: int = 500, target_side: dict | None = None) -> LawReport:
    """The first `n` tokens of `samples` requests that `Engine(target, draft, spec, impl=impl)` decodes after `prompt`
    under `params` (default: temperature 1), in batches of `batch`, each batch with its own seed from `seed`: their
    frequencies beside the target's exact law (`target_law`, or `target_side` when given), the largest difference
    and the chi-square p-value (`chi_square_pvalue`). The accepted lengths are in the engine's `last_stats`."""
    setup = Setup(target, draft, spec, params if params is not None else SamplingParams(temperature=1.0), prompt, n,
                  tokenizer, impl)
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an int >= 1, got {samples!r}")
    t0 = time.perf_counter()
    engine = setup.engine(min(batch, samples))
    counts: dict[tuple, int] = {}
    drawn, calls = 0, 0
    while drawn < samples:
        m = min(batch, samples - drawn)
        for out in engine.generate([list(setup.prompt)] * m, setup.params, seed=seed * 1_000_003 + calls):
            outcome = tuple(out.token_ids) + ((ERROR,) if out.finish_reason == "error" else ())
            counts[outcome] = counts.get(outcome, 0) + 1
        drawn, calls = drawn + m, calls + 1
    exact = target_side if target_side is not None else target_law(target, list(setup.prompt), n, setup.params,
                                                                     tokenizer)
    law = {k: c / drawn for k, c in counts.items()}
    return LawReport.of("monte-carlo", law, exact, drawn, p_value=chi_square_pvalue(counts, exact),
                        seconds=time.perf_counter() - t0)
