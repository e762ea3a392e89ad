"""The files of a `specdec gpu-check` out directory and their row dataclasses (one per CSV schema).

    environment.csv  EnvironmentRow (key, value): versions, the device, the commit, the driver
    kernels.csv      GpuKernelRow: the copy, read and matmul ceilings, the fused logprob op and kernels, every
                     other op of a decode step, reference vs fast, beside the copy ceiling; a profiled decode step
    e2e.csv          DecodeRow: graph replay against fast eager (identity, fp32), end to end (speed, bf16) and
                     the other engines, each e2e and engines row against the read ceiling
    tests.csv        TestRow: one row per test of the compiled test subset, written as each test finishes
    log.txt          every part's output
    SUMMARY.md       per part and per goal, written last

Every CSV but environment.csv starts with the benchmarks' `RunRow` prefix (suite `gpu-check`, the driver's
run id) and ends with `status` and `error`: a configuration that failed is a row with status `error` and
the exception's last line, so a reader sees what was tried as well as what was measured.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path

from ..bench.common import RowWriter, RunRow
from ..bench.suites.e2e import E2ECase
from ..bench.suites.kernels import KernelRow

#: The driver's run id, handed to every part's process (each row's `run_id`).
RUN_ID_ENV = "SPECDEC_GPU_CHECK_RUN_ID"
#: Floats are written with this many significant digits: a ratio of 3e-5 (an interpreted kernel against a copy)
#: must not read as 0.
SIGNIFICANT = 6
ENVIRONMENT, KERNELS, E2E, TESTS, LOG, SUMMARY = ("environment.csv", "kernels.csv", "e2e.csv", "tests.csv",
                                                  "log.txt", "SUMMARY.md")
#: Every file a run may leave under its out directory (at most 6, flat: few enough for a runner that copies back a
#: handful of files).
OUTPUT_FILES = [ENVIRONMENT, KERNELS, E2E, TESTS, LOG, SUMMARY]


@dataclass
class EnvironmentRow:
    key: str
    value: str


@dataclass
class GpuKernelRow(KernelRow):
    """One op (or ceiling) at one shape and impl. impl: `reference` / `fast` (the op as a worker calls it, host
    work and a sync per call: the like-for-like pair), `reference_graph` / `fast_graph` (the op replayed from a
    CUDA graph over rotated inputs), `fast_kernels` (the fused logprob kernels' launch alone, replayed the same
    way), `ceiling` (op `device_copy`, `device_read` or `matmul`). Part `profile`: a row per kernel of a profiled
    CUDA-graph replay of a decode step (op its name, impl `fast_graph`), the heaviest first, then op `(total)`
    (calls and total_us summed; median_us, p20_us, p80_us: the replay's own time, CUDA events)."""

    part: str
    check: str  # headline | decode | tiny_temperature | split_sweep | sweep | ceiling | profile
    temperature: float | str  # the requests' temperature ('' : drawn in [0.5, 1.5))
    num_splits: str  # auto or the forced count (fast_kernels); '' elsewhere
    splits_used: int | str
    programs_per_sm: float | str  # the logprob kernel's grid over the SMs ('' elsewhere)
    speedup_vs_reference: float | str
    speedup_basis: str  # what it divides: reference/fast | reference_graph/fast_graph | reference_graph/fast_kernels
    max_abs_err_vs_float64: float | str
    finite: bool | str
    within_tolerance: bool | str
    tflops: float | str  # matmul ceiling only
    calls: int | str  # profile rows: launches of the kernel in one replay
    total_us: float | str  # profile rows: its device time in one replay (the mean over `repeats` replays)
    status: str  # ok | error
    error: str


@dataclass
class DecodeRow(E2ECase):
    """One generate configuration: `part` graph_replay (a small fp32 model; are the CUDA-graph steps token-identical
    to fast eager, and where do they first differ), e2e (the 1.5B bf16 model; decode tokens/s) or engines (the same
    model's target-only decode on the GPU's other engines: transformers' `generate` with a static cache and its
    compile, specdec's reference path under Inductor)."""

    part: str
    sampling: str  # greedy | sampled | mixed
    bucket: int | str  # the graph batch bucket of the first decode step
    decode_tokens: int | str
    decode_s: float | str
    tokens_per_s: float | str
    tokens_per_s_min: float | str
    tokens_per_s_max: float | str
    mean_accept_len: float | str
    speedup_vs_reference: float | str
    compared_with: str  # the run the token comparison is against: fast eager ('' : none)
    identical_requests: int | str
    token_identical: bool | str
    first_diff_request: int | str  # the first request (by index) whose tokens differ
    first_diff_step: int | str  # its decode step where they first differ (0: the prefill's token)
    first_diff_token: int | str  # its token index there
    token_this: int | str
    token_other: int | str
    logit_gap: float | str  # the other run's logprob(its token) - logprob(this run's token) there, in its logits
    live_batch: int | str  # requests in the batch at that step
    padded: bool | str  # that step's bucket held more rows than live requests
    max_logprob_diff: float | str  # over the identical requests
    # against the read ceiling (`roofline`): e2e and engines rows
    context_len: float | str  # committed tokens per request, the mean over the measured steps
    step_us: float | str  # decode_s / decode_steps
    bytes_per_step: float | str  # what one step reads at least (`roofline.min_step_bytes`)
    read_gbps: float | str  # bytes_per_step / step time
    read_ceiling_gbps: float | str  # the run's read-only probe (kernels.csv op device_read)
    frac_of_read_ceiling: float | str
    note: str  # how an engines row ran (compiled or not, CUDA graphs or not, and why)
    seconds: float | str
    status: str
    error: str


@dataclass
class TestRow(RunRow):
    """One test of the compiled subset. status: passed | failed | error | skipped | xfailed | xpassed (`error`
    also for a test whose process died or hung: the driver writes that row)."""

    nodeid: str
    index: int  # 1-based, in collection order
    collected: int  # tests in the session
    seconds: float | str
    status: str
    error: str


ROW_TYPES = {ENVIRONMENT: EnvironmentRow, KERNELS: GpuKernelRow, E2E: DecodeRow, TESTS: TestRow}


def writer(out: Path, name: str) -> RowWriter:
    return RowWriter(Path(out) / name, ROW_TYPES[name], significant=SIGNIFICANT)


def read_rows(path: Path) -> list[dict]:
    if not Path(path).is_file():
        return []
    with Path(path).open(newline="") as f:
        return list(csv.DictReader(f))


def driver_prefix(out: Path, run_id: str) -> dict:
    """The RunRow prefix of a row the driver writes itself (a configuration whose process died): the
    environment as the environment part recorded it."""
    env = {r["key"]: r["value"] for r in read_rows(Path(out) / ENVIRONMENT)}
    return dict(suite="gpu-check", run_id=run_id, timestamp=_dt.datetime.now().isoformat(timespec="seconds"),
                commit=env.get("commit", os.environ.get("SPECDEC_COMMIT", "unknown")),
                device=env.get("device", ""), torch=env.get("torch", ""), triton=env.get("triton", ""),
                threads="", load_avg=round(os.getloadavg()[0], 2))


def error_row(row_type, prefix: dict, fields: dict, message: str):
    """A row of `row_type` for a configuration that failed: the prefix, the fields that name it, status
    `error` and the message; every other column empty."""
    names = [f.name for f in dataclasses.fields(row_type)]
    unknown = set(fields) - set(names)
    if unknown:
        raise ValueError(f"{row_type.__name__} has no columns {sorted(unknown)}")
    values = dict.fromkeys(names, "")
    values.update({k: v for k, v in prefix.items() if k in values})
    values.update(fields)
    if "status" in values:
        values.update(status="error", error=message)
    else:  # environment.csv: key, value
        values.update(value=f"error: {message}")
    return row_type(**values)


def write_error_row(out: Path, file: str, prefix: dict, fields: dict, message: str) -> None:
    w = writer(out, file)
    try:
        w.write(error_row(ROW_TYPES[file], prefix, fields, message))
    finally:
        w.close()
