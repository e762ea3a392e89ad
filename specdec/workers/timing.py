"""Per-phase timing of a decode step, for benchmarks (`WorkerBase.phase`)."""
from __future__ import annotations

import contextlib
import time

import torch


class PhaseTimer:
    """Wall time per phase of a decode step, for benchmarks: CUDA events on a GPU (read once, after the
    run, by `totals`), perf_counter elsewhere. A worker's `timer` is None unless a benchmark sets one."""

    def __init__(self, device, clock=time.perf_counter):
        """clock: the host clock off CUDA (time.process_time measures CPU seconds instead of wall)."""
        self.cuda = torch.device(device).type == "cuda"
        self.clock = clock
        self.marks: list[tuple[str, object, object]] = []

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
        else:
            start = self.clock()
            yield
            end = self.clock()
        self.marks.append((name, start, end))

    def totals(self) -> dict[str, float]:
        """Seconds per phase, summed over everything timed since the last call."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for name, start, end in self.marks:
            out[name] = out.get(name, 0.0) + (start.elapsed_time(end) / 1e3 if self.cuda else end - start)
        self.marks = []
        return out
