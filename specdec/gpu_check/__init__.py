"""`specdec gpu-check` (`python3 -m specdec.gpu_check`): the GPU one-shot, a closed subsystem on top of the bench
suites, the engine and the workers (nothing below it imports it).

- `driver`: the parts, their budgets and restarts, SUMMARY.md; `__main__` runs it.
- `runner`: how a part runs its configurations in its own process (the progress file, faults).
- `rows`: its files and row dataclasses; `summary`: SUMMARY.md's goals and sections.
- the parts: `parts` (environment and ceilings, logprob kernels), `ops` (every other op of a decode step), `decode`
  (graph replay, end to end), `compiled_tests` (the fast-path tests compiled, with `pytest_plugin`), `engines`
  (transformers and Inductor beside ours, a profiled step); `roofline` (the bytes a step must read) and
  `bandwidth` (the read-ceiling kernel: a probe, not an op).

Nothing is imported here: `runner` must import without torch.
"""
