"""`specdec gpu-check --out DIR` (or `python3 -m specdec.gpu_check --out DIR` from a checkout): everything the
fast path needs a GPU to show, in one offline run that fits a short lease of a machine.

It installs nothing and imports the project from the checkout it lives in. Parts run in order, each in its
own process with its own timeout (its budget, or the time left before the global deadline, whichever is
less); a part that fails or times out is recorded and the run goes on; a part whose optional dependency is
missing is skipped with a one-line notice. Every row goes to its CSV under DIR as soon as it is measured,
so a part cut short keeps what it measured. `SUMMARY.md` is written last, whatever happened (a `finally`,
also on SIGTERM / SIGINT): per part ran / failed / timed out / skipped, and its headline figures.

Files under DIR (7 and SUMMARY.md): environment.csv, ceilings.csv, logprob_kernels.csv, tests-junit.xml,
graph_replay.csv, e2e.csv, log.txt (every part's output). The only other write is a scratch directory
for Triton's compile cache and hypothesis' database, removed at exit.

`--smoke` runs every part at tiny sizes on a CPU (Triton's interpreter), writing the same files with the
same columns: what CI runs to keep this command working.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as _dt
import functools
import importlib.util
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DEADLINE_S = 450.0
#: Seconds kept back from the deadline for the summary.
SUMMARY_RESERVE_S = 3.0
#: A part is not started with less time than this left: it could not even import torch.
MIN_PART_S = 4.0
#: |logprob - float64 logprob| a row may show: fp32 sums over up to 152k exponentials, and fp32 division by
#: the temperature, against an all-float64 log-softmax (bf16 logits are exact in both).
LOGPROB_ATOL_VS_FLOAT64 = 1e-3


# ---- one row dataclass per CSV ---------------------------------------------------------------------------
@dataclass
class EnvironmentRow:
    key: str
    value: str


@dataclass
class CeilingRow:
    device: str
    ceiling: str  # device_copy | matmul
    dtype: str
    size: str  # bytes moved per copy, or M x N x K
    repeats: int
    median_us: float
    p20_us: float
    p80_us: float
    value: float
    unit: str  # GB/s (read + write) | TFLOP/s


@dataclass
class LogprobKernelRow:
    device: str
    dtype: str
    rows: int
    batch_size: int
    num_slots: int
    vocab_size: int
    top_logprobs_num: int
    impl: str  # reference | fast | fast_kernels
    num_splits: str  # auto or the forced count (fast_kernels); "" for the ops
    splits_used: int
    timer: str
    repeats: int
    median_us: float
    p20_us: float
    p80_us: float
    bytes: int
    gbps: float
    copy_gbps: float
    frac_of_copy: float
    speedup_vs_reference: float
    max_abs_err_vs_float64: float
    within_tolerance: bool


@dataclass
class GraphReplayRow:
    device: str
    worker: str
    batch_size: int
    bucket: int
    sampling: str  # greedy | sampled | mixed
    cuda_graphs: bool  # False: the static-buffer plumbing run eagerly (no CUDA)
    requests: int
    tokens: int
    identical_requests: int
    token_identical: bool
    max_logprob_diff: float
    mean_accept_len: float
    seconds: float


@dataclass
class E2ERow:
    device: str
    model: str
    params_m: float
    dtype: str
    worker: str
    impl: str
    cuda_graphs: bool
    batch_size: int
    prompt_len: int
    max_new_tokens: int
    repeats: int
    decode_steps: int
    decode_tokens: int
    decode_s: float
    tokens_per_s: float
    tokens_per_s_min: float
    tokens_per_s_max: float
    mean_accept_len: float
    speedup_vs_reference: float | str
    same_tokens_as_fast_eager: bool | str


class RowWriter:
    """Appends rows of one dataclass to a CSV, header first, flushed per row (a killed part keeps its rows)."""

    def __init__(self, path: Path, row_type):
        self.path, self.columns = Path(path), [f.name for f in fields(row_type)]
        self.row_type = row_type
        new = not self.path.exists()
        self.file = self.path.open("a", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=self.columns)
        if new:
            self.writer.writeheader()
            self.file.flush()

    def write(self, row) -> None:
        if not isinstance(row, self.row_type):
            raise ValueError(f"{self.path.name} takes {self.row_type.__name__} rows, got {type(row).__name__}")
        values = dataclasses.asdict(row)
        # six significant digits: a ratio of 3e-5 (an interpreted kernel against a copy) must not read as 0
        self.writer.writerow({k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in values.items()})
        self.file.flush()


def _read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# ---- parts -----------------------------------------------------------------------------------------------
@dataclass
class Part:
    name: str
    budget_s: float
    output: str  # the file it writes under the out dir
    needs: tuple[str, ...]  # importable modules it cannot run without
    needs_cuda: bool
    run: Callable  # run(out_dir, smoke) in the part's own process
    headline: Callable  # headline(out_dir) -> str, read back from its file


def _device(smoke: bool):
    import torch
    return torch.device("cpu" if smoke else "cuda")


def _device_name(device) -> str:
    import platform

    import torch
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def _quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def run_environment(out: Path, smoke: bool) -> None:
    import platform

    import torch

    from .bench import environment

    w = RowWriter(out / "environment.csv", EnvironmentRow)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    info = dict(environment(device))
    info.update(python=platform.python_version(), platform=platform.platform(), cuda_runtime=str(torch.version.cuda),
                cpu_count=str(os.cpu_count()), smoke=str(smoke))
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, sm_count=str(props.multi_processor_count),
                    l2_cache_mb=str(round(getattr(props, "L2_cache_size", 0) / 2**20, 1)),
                    memory_gib=str(round(props.total_memory / 2**30, 1)),
                    compute_capability=f"{props.major}.{props.minor}")
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem,power.limit",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=3)
            driver, sm_clock, mem_clock, power = [x.strip() for x in smi.stdout.splitlines()[0].split(",")]
            info.update(driver=driver, max_sm_clock=sm_clock, max_mem_clock=mem_clock, power_limit=power)
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            info.update(driver="unknown (no nvidia-smi)")
    else:
        info.update(gpu="none")
    for name in ("numpy", "pandas", "pytest", "xdist", "pytest_timeout", "hypothesis", "transformers"):
        info[f"has_{name}"] = str(importlib.util.find_spec(name) is not None)
    for key, value in info.items():
        w.write(EnvironmentRow(key, value))


def _environment_headline(out: Path) -> str:
    env = {r["key"]: r["value"] for r in _read_rows(out / "environment.csv")}
    if not env:
        return ""
    gpu = env.get("gpu", "?")
    if gpu == "none":
        return f"no GPU; torch {env.get('torch')}, triton {env.get('triton')}"
    return (f"{gpu}, {env.get('sm_count')} SMs, L2 {env.get('l2_cache_mb')} MB, driver {env.get('driver')}, "
            f"torch {env.get('torch')} (CUDA {env.get('cuda_runtime')}), triton {env.get('triton')}")


def run_ceilings(out: Path, smoke: bool) -> None:
    import torch

    from .bench_kernels import COPY_CEILING_BYTES, copy_bandwidth, time_rotated

    device = _device(smoke)
    name = _device_name(device)
    w = RowWriter(out / "ceilings.csv", CeilingRow)
    nbytes, repeats = (8 << 20, 5) if smoke else (COPY_CEILING_BYTES, 10)
    t0 = time.perf_counter()
    gbps = copy_bandwidth(device, nbytes, repeats)
    moved = 2 * max(nbytes, COPY_CEILING_BYTES if device.type == "cuda" else 0)
    us = (moved if device.type == "cuda" else nbytes) / gbps / 1e3
    w.write(CeilingRow(name, "device_copy", "float32", str(moved if device.type == "cuda" else nbytes), repeats,
                       us, us, us, gbps, "GB/s"))
    print(f"copy: {gbps:.1f} GB/s [{time.perf_counter() - t0:.1f} s]", flush=True)
    n, dtype = (256, torch.float32) if smoke else (8192, torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(0)
    pairs = [(torch.randn(n, n, generator=gen, device=device).to(dtype),
              torch.randn(n, n, generator=gen, device=device).to(dtype)) for _ in range(2)]
    dst = torch.empty(n, n, device=device, dtype=dtype)
    times = time_rotated([lambda a=a, b=b: torch.mm(a, b, out=dst) for a, b in pairs], device, 3 if smoke else 10)
    med = statistics.median(times)
    w.write(CeilingRow(name, "matmul", str(dtype).replace("torch.", ""), f"{n}x{n}x{n}", len(times), med,
                       _quantile(times, 0.2), _quantile(times, 0.8), 2 * n**3 / med / 1e6, "TFLOP/s"))
    print(f"matmul {n}^3: {2 * n**3 / med / 1e6:.1f} TFLOP/s", flush=True)


def _ceilings_headline(out: Path) -> str:
    rows = {r["ceiling"]: r for r in _read_rows(out / "ceilings.csv")}
    parts = []
    if "device_copy" in rows:
        r = rows["device_copy"]
        parts.append(f"copy {float(r['value']):.0f} GB/s ({int(r['size']) / 2**30:.2f} GiB per round)")
    if "matmul" in rows:
        r = rows["matmul"]
        parts.append(f"{r['dtype']} matmul {r['size']} {float(r['value']):.3g} TFLOP/s")
    return "; ".join(parts)


def _logprob_sweep(smoke: bool):
    """(rows, V) pairs, headline first: 256 rows of Qwen's aligned and an unaligned vocabulary, then decode
    sizes (2 and 32 rows); chains of two slots, so rows = 2 B."""
    if smoke:
        return [(4, 300), (2, 301)], (None, 2)
    return [(256, 151936), (256, 151937), (2, 151936), (32, 151936), (2, 151937), (32, 151937)], \
        (None, 1, 2, 4, 8, 16)


def run_logprob_kernels(out: Path, smoke: bool) -> None:
    import torch

    import fast
    import reference
    from fast.logprobs import _num_vocab_splits, _sm_count

    from .bench_kernels import _logprob_case, _time, copy_bandwidth, rotation_copies, time_rotated
    from .logprob_types import LogitsOutput

    device = _device(smoke)
    name = _device_name(device)
    w = RowWriter(out / "logprob_kernels.csv", LogprobKernelRow)
    ceiling = [float(r["value"]) for r in _read_rows(out / "ceilings.csv") if r["ceiling"] == "device_copy"]
    copy_gbps = ceiling[0] if ceiling else copy_bandwidth(device, 8 << 20 if smoke else 2 << 30, 5)
    repeats = 3 if smoke else 20
    gen = torch.Generator(device=device).manual_seed(0)
    shapes, split_counts = _logprob_sweep(smoke)
    for R, V in shapes:
        for dtype in (torch.bfloat16, torch.float32):
            for k in (0, 5):
                t0 = time.perf_counter()
                case = _logprob_case(R // 2, 2, V, dtype, k, device, gen)
                x = case.inputs
                logits, predict, accept, batch = x["logits"], x["predict"], x["accept"], x["batch"]
                rows = accept.reshape(-1).long()
                scaled = logits.index_select(0, rows).double() / x["temps"].double().repeat_interleave(2)[:, None]
                want = torch.log_softmax(scaled, -1)
                del scaled
                err = functools.partial(_max_err_vs_float64, want.gather(1, predict[rows].long()[:, None])[:, 0],
                                        want.topk(k, -1).values if k else None)
                del want

                common = dict(device=name, dtype=str(dtype).replace("torch.", ""), rows=R, batch_size=R // 2,
                              num_slots=2, vocab_size=V, top_logprobs_num=k, repeats=repeats, bytes=case.bytes,
                              copy_gbps=copy_gbps)
                auto = _num_vocab_splits(R, V, _sm_count(device))
                ref_us = None
                for impl, ops in (("reference", reference), ("fast", fast)):
                    lo = LogitsOutput(next_token_logits=logits)
                    ops.compute_spec_v2_logprobs(batch, lo, predict, accept, 1)
                    top = torch.stack(lo.next_token_top_logprobs_val) if k else None
                    e = err(lo.next_token_logprobs, top)
                    times = _time(functools.partial(case.run, ops), device, repeats)
                    med = statistics.median(times)
                    ref_us = med if impl == "reference" else ref_us
                    w.write(LogprobKernelRow(
                        **common, impl=impl, num_splits="", splits_used=auto,
                        timer="cuda_event" if device.type == "cuda" else "process_cpu_time", median_us=med,
                        p20_us=_quantile(times, 0.2), p80_us=_quantile(times, 0.8), gbps=case.bytes / med / 1e3,
                        frac_of_copy=case.bytes / med / 1e3 / copy_gbps, speedup_vs_reference=ref_us / med,
                        max_abs_err_vs_float64=e, within_tolerance=e <= LOGPROB_ATOL_VS_FLOAT64))
                copies = rotation_copies(device, case.bytes)
                for n in split_counts:
                    calls = case.launches(copies, num_splits=n)
                    lp, top, _, _, _ = calls[0]()
                    e = err(lp, top)
                    times = time_rotated(calls, device, repeats)
                    del calls
                    med = statistics.median(times)
                    w.write(LogprobKernelRow(
                        **common, impl="fast_kernels", num_splits="auto" if n is None else str(n),
                        splits_used=auto if n is None else n,
                        timer="cuda_graph" if device.type == "cuda" else "process_cpu_time", median_us=med,
                        p20_us=_quantile(times, 0.2), p80_us=_quantile(times, 0.8), gbps=case.bytes / med / 1e3,
                        frac_of_copy=case.bytes / med / 1e3 / copy_gbps, speedup_vs_reference=ref_us / med,
                        max_abs_err_vs_float64=e, within_tolerance=e <= LOGPROB_ATOL_VS_FLOAT64))
                print(f"logprobs {R} x {V} {dtype} k={k} [{time.perf_counter() - t0:.1f} s]", flush=True)
                del case, x, logits


def _max_err_vs_float64(want_lp, want_top, lp, top) -> float:
    """Largest |output - float64| over the chosen-token logprobs and, when asked, the top-k values."""
    e = (lp.double().reshape(-1) - want_lp).abs().max().item()
    if want_top is not None:
        e = max(e, (top.double()[:, :want_top.shape[1]] - want_top).abs().max().item())
    return e


def _logprob_headline(out: Path) -> str:
    rows = _read_rows(out / "logprob_kernels.csv")
    if not rows:
        return ""
    bad = [r for r in rows if r["within_tolerance"] != "True"]
    big = max(int(r["rows"]) for r in rows)
    lines = [f"{len(rows)} rows, {len(rows) - len(bad)} within {LOGPROB_ATOL_VS_FLOAT64:g} of float64"]
    for dtype in ("bfloat16", "float32"):
        at = [r for r in rows if int(r["rows"]) == big and r["dtype"] == dtype and r["vocab_size"].endswith("36")]
        kern = [r for r in at if r["impl"] == "fast_kernels" and r["num_splits"] == "auto"]
        ops = [r for r in at if r["impl"] == "fast"]
        if kern:
            frac = min(float(r["frac_of_copy"]) for r in kern)
            speed = min(float(r["speedup_vs_reference"]) for r in kern)
            best = max((r for r in at if r["impl"] == "fast_kernels"), key=lambda r: float(r["frac_of_copy"]))
            lines.append(f"{big} x {at[0]['vocab_size']} {dtype}: kernels {frac:.0%} of copy (goal 80 %), "
                         f"{speed:.1f}x the reference op (goal 5x); best split {best['num_splits']} "
                         f"{float(best['frac_of_copy']):.0%}"
                         + (f"; the fast op with its host work {min(float(r['frac_of_copy']) for r in ops):.0%}"
                            if ops else ""))
    return "; ".join(lines)


#: The fast-path test files run compiled on a GPU (the CUDA-only ones among them included).
GPU_TEST_SUBSET = ["tests/test_fast_logprobs.py", "tests/test_fast_attention.py", "tests/test_fast_kv.py",
                   "tests/test_fast_tree_ops.py", "tests/test_fast_workers.py", "tests/test_fast_parity.py",
                   "tests/test_sampling_ops.py", "tests/test_decode_graphs.py", "tests/test_cuda_shim.py",
                   "tests/test_workers.py::test_cuda_graph_replay_equals_eager"]
SMOKE_TEST_SUBSET = ["tests/test_cuda_shim.py"]


def run_tests(out: Path, smoke: bool) -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
           f"--junitxml={out / 'tests-junit.xml'}"]
    if importlib.util.find_spec("xdist") is not None and not smoke:
        cmd += ["-n", "8"]
    elif not smoke:
        print("note: pytest-xdist is not installed: the tests run in one process", flush=True)
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd += ["--timeout", "60"]
    else:
        print("note: pytest-timeout is not installed: no per-test timeout", flush=True)
    cmd += SMOKE_TEST_SUBSET if smoke else GPU_TEST_SUBSET
    print(" ".join(cmd), flush=True)
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    if rc not in (0, 1):  # 1: some tests failed, which the junit XML and the summary report
        raise SystemExit(rc)


def _tests_headline(out: Path) -> str:
    import xml.etree.ElementTree as ET

    path = out / "tests-junit.xml"
    if not path.is_file():
        return ""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return "junit XML unreadable"
    suites = [root] if root.tag == "testsuite" else list(root)
    count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{c.get('classname')}::{c.get('name')}" for s in suites for c in s
              if c.find("failure") is not None or c.find("error") is not None]
    text = (f"{count['tests']} tests: {count['tests'] - count['failures'] - count['errors'] - count['skipped']} "
            f"passed, {count['failures']} failed, {count['errors']} errors, {count['skipped']} skipped")
    return text + (f"; failing: {', '.join(failed[:8])}" + (" ..." if len(failed) > 8 else "") if failed else "")


def _small_models(device):
    """A small target and drafts for the replay checks: the tests' bigram-perfect drafts when the checkout's
    tests/ is importable (so steps accept several tokens), random drafts otherwise."""
    from .config import SpecConfig
    from .models import random_eagle_head, random_llama, random_mtp
    try:
        from tests.helpers import near_bigram_target, perfect_eagle, perfect_mtp
        target = near_bigram_target(seed=6, mix=0.4).to(device)
        eagle, mtp = perfect_eagle(target), perfect_mtp(target, 3, True)
    except ImportError:
        target = random_llama(seed=6, device=device)
        eagle, mtp = random_eagle_head(target), random_mtp(target, 3, True)
    return target, [("target-only", None, None), ("EAGLE tree S5 K4 W16", eagle, SpecConfig(5, 4, 16)),
                    ("EAGLE chain S3", eagle, SpecConfig(3, 1)), ("MTP S3", mtp, SpecConfig(3))]


def _replay_params(mode: str, B: int):
    from .config import SamplingParams
    sampled = dict(temperature=0.7, top_k=20, top_p=0.9)
    return [SamplingParams(max_new_tokens=10 + 3 * i, return_logprob=True, top_logprobs_num=2,
                           **(sampled if mode == "sampled" or (mode == "mixed" and i % 2) else {}))
            for i in range(B)]


def run_graph_replay(out: Path, smoke: bool) -> None:
    import torch

    from . import Engine
    from .workers.graphs import DecodeGraphs, batch_buckets

    device = _device(smoke)
    name = _device_name(device)
    w = RowWriter(out / "graph_replay.csv", GraphReplayRow)
    target, workers = _small_models(device)
    max_batch = 8
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(target.config.vocab_size, (3 + i % 4,), generator=gen).tolist() for i in range(8)]
    impl = "reference" if smoke else "fast"  # smoke: the plumbing, eagerly; the interpreter adds nothing here
    sizes, modes = ((1, 5), ("greedy", "mixed")) if smoke else ((1, 5, 8), ("greedy", "sampled", "mixed"))
    for label, draft, spec in workers[:3] if smoke else workers:
        eager = Engine(target, draft, spec, impl=impl, max_batch=max_batch, max_seq_len=96, cuda_graphs=False)
        graphed = Engine(target, draft, spec, impl=impl, max_batch=max_batch, max_seq_len=96,
                         cuda_graphs=not smoke)
        if smoke:
            graphed._decode = DecodeGraphs(graphed.worker, capture=False).decode_step
        for B in sizes:
            for mode in modes:
                t0 = time.perf_counter()
                params = _replay_params(mode, B)
                a = graphed.generate(prompts[:B], params, seed=5)
                b = eager.generate(prompts[:B], params, seed=5)
                same = [x.token_ids == y.token_ids for x, y in zip(a, b)]
                diff = max((abs(p - q) for x, y, s in zip(a, b, same) if s for p, q in zip(x.logprobs, y.logprobs)),
                           default=0.0)
                acc = [n for o in a for n in o.accept_lens]
                w.write(GraphReplayRow(name, label, B, next(k for k in batch_buckets(max_batch) if k >= B), mode,
                                       not smoke, B, sum(len(o.token_ids) for o in a), sum(same), all(same), diff,
                                       sum(acc) / len(acc) if acc else 1.0, time.perf_counter() - t0))
                print(f"{label} B={B} {mode}: identical {sum(same)}/{B} [{time.perf_counter() - t0:.1f} s]",
                      flush=True)


def _graph_headline(out: Path) -> str:
    rows = _read_rows(out / "graph_replay.csv")
    if not rows:
        return ""
    bad = [f"{r['worker']} B={r['batch_size']} {r['sampling']}" for r in rows if r["token_identical"] != "True"]
    kind = ("CUDA-graph replay == fast eager" if rows[0]["cuda_graphs"] == "True"
            else "static-buffer steps (no capture) == eager")
    return (f"{kind}, token-identical in {len(rows) - len(bad)} of {len(rows)} cases"
            + (f"; differing: {', '.join(bad)}" if bad else "")
            + f"; largest logprob difference {max(float(r['max_logprob_diff']) for r in rows):.1e}")


def _e2e_models(device, smoke: bool):
    import torch

    from .config import SpecConfig
    from .models import random_eagle_head, random_llama, random_mtp
    if smoke:
        target = random_llama(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, seed=0, device=device)
        label = "random-llama-tiny"
    else:
        # Llama-3.2-1B's shapes with an untied 128,256 x 2,048 head: 1.5B parameters, drawn on the GPU
        target = random_llama(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                              num_attention_heads=32, num_key_value_heads=8, seed=0, dtype=torch.bfloat16,
                              device=device, max_position_embeddings=4096)
        label = "random-llama-1.5b"
    workers = [("target-only", None, None), ("EAGLE tree S5 K4 W16", random_eagle_head(target), SpecConfig(5, 4, 16)),
               ("MTP S3", random_mtp(target, 3), SpecConfig(3))]
    return label, target, workers


def run_e2e(out: Path, smoke: bool) -> None:
    import torch

    from . import Engine, SamplingParams

    device = _device(smoke)
    name = _device_name(device)
    w = RowWriter(out / "e2e.csv", E2ERow)
    t0 = time.perf_counter()
    label, target, workers = _e2e_models(device, smoke)
    params_m = sum(p.numel() for p in target.parameters()) / 1e6
    print(f"{label}: {params_m:.0f}M parameters built in {time.perf_counter() - t0:.1f} s", flush=True)
    sizes, new_tokens, repeats, prompt_len = ((1, 2), 4, 1, 8) if smoke else ((1, 8, 32), 64, 3, 64)
    impls = [("reference", False), ("fast", False)] + ([] if smoke else [("fast", True)])
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(target.config.vocab_size, (max(sizes), prompt_len), generator=gen).tolist()
    engines = {}
    for label_w, draft, spec in workers:
        for impl, graphs in impls:
            engines[label_w, impl, graphs] = Engine(target, draft, spec, impl=impl, max_batch=max(sizes),
                                                    max_seq_len=prompt_len + new_tokens + 32, cuda_graphs=graphs)
    params = SamplingParams(max_new_tokens=new_tokens)  # greedy, no logprobs; phase timers stay off
    for B in sizes:
        for label_w, _, _ in workers:
            ref_tps, fast_eager = None, None
            for impl, graphs in impls:
                if smoke and impl == "fast" and B > 1:
                    continue  # interpreted kernels: one batch size shows the row's form
                t1 = time.perf_counter()
                engine = engines[label_w, impl, graphs]
                # compiles; with graphs the whole run, so that a bucket a request's early exit needs is
                # captured here, not in a timed pass
                engine.generate(prompts[:B], params if graphs else SamplingParams(max_new_tokens=min(new_tokens, 8)))
                passes = [_decode_pass(engine, prompts[:B], params, device) for _ in range(repeats)]
                passes.sort(key=lambda p: p["tps"])
                med = passes[len(passes) // 2]
                ref_tps = med["tps"] if impl == "reference" else ref_tps
                tokens = [o.token_ids for o in med["outs"]]
                if impl == "fast" and not graphs:
                    fast_eager = tokens
                acc = [a for o in med["outs"] for a in o.accept_lens]
                w.write(E2ERow(name, label, round(params_m, 1), str(target.dtype).replace("torch.", ""), label_w,
                               impl, graphs, B, prompt_len, new_tokens, repeats, med["steps"], med["tokens"],
                               med["seconds"], med["tps"], passes[0]["tps"], passes[-1]["tps"],
                               sum(acc) / len(acc) if acc else 1.0,
                               med["tps"] / ref_tps if ref_tps else "",
                               tokens == fast_eager if graphs and fast_eager is not None else ""))
                print(f"{label_w} {impl}{' + graphs' if graphs else ''} B={B}: {med['tps']:.1f} tok/s "
                      f"[{time.perf_counter() - t1:.1f} s]", flush=True)


def _decode_pass(engine, prompts, params, device) -> dict:
    """One generate, timed from the end of its prefill (the prefill's token excluded) to its last token."""
    import torch

    worker = engine.worker
    prefill = worker.prefill
    marks = []

    def timed_prefill(*a, **k):
        step = prefill(*a, **k)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        marks.append(time.perf_counter())
        return step

    worker.prefill = timed_prefill
    try:
        outs = engine.generate(prompts, params)
    finally:
        del worker.prefill
    seconds = time.perf_counter() - marks[0]
    tokens = sum(len(o.token_ids) for o in outs) - len(prompts)
    return dict(outs=outs, seconds=seconds, tokens=tokens, steps=engine.last_stats.num_decode_steps,
                tps=tokens / seconds)


def _e2e_headline(out: Path) -> str:
    rows = _read_rows(out / "e2e.csv")
    if not rows:
        return ""
    lines = []
    for B, goal in (("1", 3.0), ("32", 2.0)):
        for r in rows:
            if r["batch_size"] == B and r["cuda_graphs"] == "True" and r["speedup_vs_reference"]:
                lines.append(f"{r['worker']} B={B}: fast + graphs {float(r['tokens_per_s']):.0f} tok/s, "
                             f"{float(r['speedup_vs_reference']):.1f}x reference (goal {goal:g}x)")
    if not lines:  # smoke, or cut short before the graph rows
        best = max(rows, key=lambda r: float(r["tokens_per_s"]))
        lines.append(f"{len(rows)} rows; fastest {best['worker']} {best['impl']} B={best['batch_size']} "
                     f"{float(best['tokens_per_s']):.1f} tok/s")
    same = [r for r in rows if r["same_tokens_as_fast_eager"] in ("True", "False")]
    if same:
        identical = sum(r["same_tokens_as_fast_eager"] == "True" for r in same)
        lines.append(f"graphs token-identical to fast eager in {identical} of {len(same)}")
    return "; ".join(lines)


PARTS = [
    Part("environment", 5, "environment.csv", (), False, run_environment, _environment_headline),
    Part("ceilings", 15, "ceilings.csv", (), True, run_ceilings, _ceilings_headline),
    Part("logprob_kernels", 60, "logprob_kernels.csv", ("triton",), True, run_logprob_kernels, _logprob_headline),
    Part("tests", 90, "tests-junit.xml", ("pytest", "triton"), True, run_tests, _tests_headline),
    Part("graph_replay", 60, "graph_replay.csv", ("triton",), True, run_graph_replay, _graph_headline),
    Part("e2e", 150, "e2e.csv", ("triton",), True, run_e2e, _e2e_headline),
]
LOG_NAME, SUMMARY_NAME = "log.txt", "SUMMARY.md"
#: Every file a run may leave under its out dir.
OUTPUT_FILES = [p.output for p in PARTS] + [LOG_NAME, SUMMARY_NAME]


@dataclass
class PartResult:
    name: str
    status: str  # ran | failed | timed out | interrupted | skipped | not reached
    seconds: float = 0.0
    note: str = ""


# ---- the driver ------------------------------------------------------------------------------------------
def _child_env(scratch: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the checkout
    env.setdefault("TRITON_CACHE_DIR", str(scratch / "triton"))
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(scratch / "hypothesis")
    env["MPLCONFIGDIR"] = str(scratch / "matplotlib")
    return env


def _write_summary(out: Path, results: list[PartResult], started: float, deadline_s: float, smoke: bool) -> None:
    by_name = {r.name: r for r in results}
    lines = [f"# specdec gpu-check{' --smoke' if smoke else ''}", "",
             f"{_dt.datetime.now().isoformat(timespec='seconds')}, {time.monotonic() - started:.0f} s of a "
             f"{deadline_s:.0f} s deadline. Files: {', '.join(OUTPUT_FILES)} (schemas: `specdec/gpu_check.py`).", "",
             "| part | status | seconds | headline |", "|---|---|---|---|"]
    for part in PARTS:
        r = by_name.get(part.name, PartResult(part.name, "not reached"))
        try:
            headline = part.headline(out)
        except Exception as e:  # a half-written file must not cost the summary
            headline = f"(unreadable: {type(e).__name__}: {e})"
        text = "; ".join(x for x in (r.note, headline) if x).replace("|", "/").replace("\n", " ")
        lines.append(f"| {part.name} | {r.status} | {r.seconds:.0f} | {text} |")
    (out / SUMMARY_NAME).write_text("\n".join(lines) + "\n")


def run_all(out: Path, deadline_s: float, smoke: bool, only: list[str] | None = None) -> list[PartResult]:
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    results: list[PartResult] = []
    scratch = Path(tempfile.mkdtemp(prefix="specdec-gpu-check-"))
    child = {"proc": None}

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        import torch
        has_cuda = torch.cuda.is_available()
        with (out / LOG_NAME).open("a") as log:
            for part in PARTS:
                if only and part.name not in only:
                    continue
                missing = [m for m in part.needs if importlib.util.find_spec(m) is None]
                left = deadline_s - (time.monotonic() - started) - SUMMARY_RESERVE_S
                note = None
                if missing:
                    note = f"skipped: {', '.join(missing)} not installed"
                elif part.needs_cuda and not smoke and not has_cuda:
                    note = "skipped: no CUDA device (--smoke runs every part on a CPU at tiny sizes)"
                elif left < MIN_PART_S:
                    note = f"skipped: {max(left, 0):.0f} s left before the deadline"
                if note:
                    print(f"{part.name}: {note}", flush=True)
                    results.append(PartResult(part.name, "skipped", 0.0, note.split(": ", 1)[1]))
                    continue
                timeout = min(part.budget_s * (4 if smoke else 1), left)
                cmd = part_command(part, out, smoke)
                log.write(f"\n===== {part.name} (timeout {timeout:.0f} s): {' '.join(cmd)}\n")
                log.flush()
                t0 = time.monotonic()
                proc = child["proc"] = subprocess.Popen(cmd, cwd=ROOT, env=_child_env(scratch), stdout=log,
                                                        stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    rc = proc.wait(timeout=timeout)
                    status, note = ("ran", "") if rc == 0 else ("failed", f"exit status {rc} (see {LOG_NAME})")
                except subprocess.TimeoutExpired:
                    _kill(proc)
                    status, note = "timed out", f"after {timeout:.0f} s; rows measured before are kept"
                except BaseException:  # SIGTERM / SIGINT to the run: the part in flight is recorded, then stop
                    results.append(PartResult(part.name, "interrupted", time.monotonic() - t0,
                                              "the run was stopped; rows measured before are kept"))
                    raise
                child["proc"] = None
                seconds = time.monotonic() - t0
                log.write(f"===== {part.name}: {status} in {seconds:.1f} s\n")
                log.flush()
                print(f"{part.name}: {status} in {seconds:.1f} s{(' - ' + note) if note else ''}", flush=True)
                results.append(PartResult(part.name, status, seconds, note))
    finally:
        if child["proc"] is not None:
            _kill(child["proc"])
        for s, handler in previous.items():
            signal.signal(s, handler)
        shutil.rmtree(scratch, ignore_errors=True)
        _write_summary(out, results, started, deadline_s, smoke)
    return results


def part_command(part: Part, out: Path, smoke: bool) -> list[str]:
    """The command line that runs one part in its own process."""
    return [sys.executable, "-m", "specdec.gpu_check", "--part", part.name, "--out", str(out)] + \
        (["--smoke"] if smoke else [])


def _kill(proc: subprocess.Popen) -> None:
    """The part's whole process group (pytest-xdist workers included)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _part_names(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",")]
    bad = [n for n in names if n not in {p.name for p in PARTS}]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown part(s) {bad}; expected a comma-separated subset of "
                                         f"{','.join(p.name for p in PARTS)}")
    return names


def build_parser(prog="specdec gpu-check") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Measure and check the fast path on this machine's GPU in one offline run: environment, "
                    "copy and matmul ceilings, the fused logprob kernels, the fast-path tests compiled, "
                    "CUDA-graph replay against eager, and end to end on a random 1.5B Llama. Installs "
                    "nothing; writes only under --out (7 files and SUMMARY.md).")
    parser.add_argument("--out", default=None, help="output directory (default: $OUT)")
    parser.add_argument("--deadline", type=_positive_seconds, default=DEFAULT_DEADLINE_S,
                        help="global deadline in seconds; each part gets its budget or the time left")
    parser.add_argument("--smoke", action="store_true",
                        help="every part at tiny sizes on a CPU (Triton's interpreter): the same files and columns")
    parser.add_argument("--parts", type=_part_names, default=None,
                        help=f"run only these parts (comma-separated, of {','.join(p.name for p in PARTS)})")
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)  # one part, in its own process
    return parser


def main(argv=None, prog="specdec gpu-check") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    out = args.out or os.environ.get("OUT")
    if not out:
        parser.error("give --out DIR or set OUT")
    out = Path(out).resolve()
    if args.part is not None:
        part = {p.name: p for p in PARTS}.get(args.part)
        if part is None:
            parser.error(f"unknown part {args.part!r}")
        if args.smoke:
            import torch
            torch.set_num_threads(1)
        part.run(out, args.smoke)
        return 0
    results = run_all(out, args.deadline, args.smoke, args.parts)
    print(f"wrote {out / SUMMARY_NAME}")
    return 0 if all(r.status in ("ran", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(prog="python3 -m specdec.gpu_check"))
