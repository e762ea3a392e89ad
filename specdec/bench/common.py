"""What every benchmark suite shares: the run's environment and id, one row dataclass per CSV schema on a
shared prefix (`RunRow`), quantiles, the CSV writer and the one timer.

A row is a dataclass; `dataclasses.asdict` gives its CSV line, its fields the header, so a schema is
written once (documented in results/README.md).
"""
from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import itertools
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from ..workers.base import PhaseTimer
from ..config import SamplingParams
from ..engine import Engine

#: The commit a row records when set (`specdec gpu-check --commit`): a tree copied without .git has no other.
COMMIT_ENV = "SPECDEC_COMMIT"
#: an acceptance row's `category` when it is over every prompt of its run; a run whose prompts have several
#: categories adds a row per category, measured on that category's batches of the same passes
ALL_CATEGORIES = "all"
#: dtype names as the CLI takes them and every CSV writes them
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16"."""
    return str(dtype).replace("torch.", "")


def environment(device) -> dict:
    """commit (SPECDEC_COMMIT when set, for a copied tree without .git; else `git describe --dirty`), device (the
    GPU's name, or the CPU and torch's thread count), torch and triton versions."""
    commit = os.environ.get(COMMIT_ENV, "").strip()
    if not commit:
        try:
            commit = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True,
                                    text=True, cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
        except (OSError, subprocess.SubprocessError):
            commit = "unknown"
    try:
        # lazy: triton is optional here (no triton on some machines) and never imported by specdec
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    dev = torch.device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
    else:
        name = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return dict(commit=commit, device=name, torch=torch.__version__, triton=triton_version)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def new_run_id() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


@dataclass
class RunRow:
    """The columns every benchmark row starts with: the run and the machine it ran on, and the machine's
    state when the row was measured (torch's CPU threads, the 1-minute load average)."""

    suite: str
    run_id: str
    timestamp: str
    commit: str
    device: str
    torch: str
    triton: str
    threads: int
    load_avg: float


class Run:
    """One benchmark run of one suite: its id and environment, read once. `prefix()` is a row's `RunRow`
    columns at the moment it is measured."""

    def __init__(self, suite: str, device, run_id: str | None = None):
        self.suite = suite
        self.run_id = run_id or new_run_id()
        self.env = environment(device)

    def prefix(self) -> dict:
        return dict(suite=self.suite, run_id=self.run_id, timestamp=_dt.datetime.now().isoformat(timespec="seconds"),
                    **self.env, threads=torch.get_num_threads(), load_avg=round(os.getloadavg()[0], 2))

    def write(self, rows: list, out_dir, tag: str | None = None) -> Path:
        """The run's rows -> `out_dir/<tag or suite>-<run_id>.csv`."""
        return write_csv(rows, out_dir, f"{tag or self.suite}-{self.run_id}.csv")


def quantile(values, q: float, key: Callable | None = None):
    """The element at quantile q of `values` sorted (by `key`): the nearest rank, no interpolation."""
    values = sorted(values, key=key)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def median_of(values, key: Callable | None = None):
    """The upper median element of `values` sorted (by `key`): a measured pass, never an average of two."""
    return sorted(values, key=key)[len(values) // 2]


class RowWriter:
    """Rows of one dataclass to a CSV, header first, flushed per row (a killed run keeps its rows).

    significant: floats written with that many significant digits (None: as they are). append: add to an
    existing file (its header is not repeated) instead of replacing it."""

    def __init__(self, path, row_type, significant: int | None = None, append: bool = True):
        self.path, self.row_type, self.significant = Path(path), row_type, significant
        self.columns = [f.name for f in fields(row_type)]
        new = not append or not self.path.exists()
        self.file = self.path.open("a" if append else "w", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=self.columns)
        if new:
            self.writer.writeheader()
            self.file.flush()

    def write(self, row) -> None:
        if not isinstance(row, self.row_type):
            raise ValueError(f"{self.path.name} takes {self.row_type.__name__} rows, got {type(row).__name__}")
        values = dataclasses.asdict(row)
        if self.significant:
            values = {k: float(f"{v:.{self.significant}g}") if isinstance(v, float) else v for k, v in values.items()}
        self.writer.writerow(values)
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def write_csv(rows: list, out_dir, name: str) -> Path:
    """One run's rows (dataclasses of one type) -> `out_dir/name` (the directory is created), or `<stem>-2`, `-3`
    ... where that file exists: two runs started in the same second share a run id, and the one that finished
    second replaced the other's file (two grid checks started side by side)."""
    if not rows:
        raise ValueError(f"{name}: no rows to write")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path, n = out / name, 2
    while path.exists():
        path, n = out / f"{Path(name).stem}-{n}{Path(name).suffix}", n + 1
    writer = RowWriter(path, type(rows[0]), append=False)
    try:
        for row in rows:
            writer.write(row)
    finally:
        writer.close()
    return writer.path


def columns(row_type) -> list[str]:
    """A row dataclass's CSV header."""
    return [f.name for f in fields(row_type)]


def time_calls(fn: Callable, device, repeats: int, warmup: bool = True, sync_each: bool = True) -> list[float]:
    """Microseconds of each of `repeats` calls of `fn` as a caller sees it, host work included, timed by the
    workers' `PhaseTimer`: CUDA events around each synchronised call on a GPU, process CPU time elsewhere
    (robust on a shared machine; at one thread it is the call's own work). warmup: one untimed call first.
    sync_each=False queues the calls back to back on a GPU (events still bracket each): the device's time for the
    work a call launches, without the host's launch gap (a bandwidth probe, a graph replay)."""
    cuda = torch.device(device).type == "cuda"
    if warmup:
        fn()
    if cuda:
        torch.cuda.synchronize()
    timer = PhaseTimer(device, clock=time.process_time)
    for i in range(repeats):
        with timer(str(i)):
            fn()
        if cuda and sync_each:
            torch.cuda.synchronize()
    totals = timer.totals()
    return [totals[str(i)] * 1e6 for i in range(repeats)]


def time_in_turn(calls: list[Callable], device, repeats: int) -> list[float]:
    """`time_calls` over `calls` taken in turn, without a warm-up: call i % len(calls) at repeat i."""
    turn = itertools.cycle(calls)
    return time_calls(lambda: next(turn)(), device, repeats, warmup=False)


def target_only_batch_seconds(target, prompts, batch_sizes, max_new_tokens: int, impl: str = "reference",
                              probe_tokens: int = 8) -> dict[int, float]:
    """Batch size B -> process CPU seconds a batch of B of `prompts` takes to decode `max_new_tokens` target-only,
    measured now (what the long commands' estimates price every decode at): after a warm-up, a decode of one token
    (the prefill) and one of probe_tokens + 1, extrapolated linearly in the tokens."""
    max_len = max(len(p) for p in prompts) + max(max_new_tokens, probe_tokens + 1) + 8
    out = {}
    for B in batch_sizes:
        batch = (list(prompts) * B)[:B]
        engine = Engine(target, impl=impl, max_batch=B, max_seq_len=max_len)
        engine.generate(batch, SamplingParams(max_new_tokens=2))  # warm-up
        cpu = []
        for n in (1, probe_tokens + 1):
            c0 = time.process_time()
            engine.generate(batch, SamplingParams(max_new_tokens=n, min_new_tokens=n))
            cpu.append(time.process_time() - c0)
        step = max(cpu[1] - cpu[0], 0.0) / probe_tokens
        out[B] = cpu[0] + step * (max_new_tokens - 1)
    return out


def progress_bar(total: int, desc: str, unit: str = "decode", disable: bool = False):
    """The long commands' tqdm bar, on stderr (their results go to stdout), refreshed at most every half second; off
    where stderr is no terminal (a log file keeps the results' lines, without the bar's carriage returns)."""
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, mininterval=0.5,
                disable=True if disable else None)


def above_bar(write: Callable = print) -> Callable:
    """`write` (print, a log function) wrapped so that its lines land above the active tqdm bars, not through them."""
    def say(*args, **kwargs):
        with tqdm.external_write_mode():
            write(*args, **kwargs)
    return say
