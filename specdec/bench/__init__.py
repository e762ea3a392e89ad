"""Benchmarks: one CSV per run (schemas in results/README.md), plots and the report drawn only from the CSVs.

- `common`: the run's environment and id, the row prefix every schema shares (`RunRow`), quantiles, the CSV
  writer, the one timer.
- `cases`: the one list of worker cases, which the demo runs and every suite filters.
- one module per suite: `acceptance` (`specdec bench`), `e2e`, `kernels`, `linear` (the CPU matmul backends).
  `specdec gpu-check` is a package of its own above these (`specdec.gpu_check`).
- `peers` (transformers' `generate` behind the Engine's interface), `plots`, `report`.

Submodules are imported where they are used; only `draft_step_cost` is named here, as the model card cites it.
"""
from .suites.acceptance import draft_step_cost

__all__ = ["draft_step_cost"]
