"""The parts of `specdec gpu-check` (the driver is `specdec.bench.gpu_check`): each `run_<part>(out, smoke)` runs
in its own process and writes its rows to its file under `out` as they are measured; each `<part>_headline(out)`
reads its figures back from that file for SUMMARY.md.

Files: environment.csv (key, value), ceilings.csv, logprob_kernels.csv, tests-junit.xml, graph_replay.csv,
e2e.csv; every CSV row after environment's starts with the benchmarks' `RunRow` prefix (suite `gpu-check`,
the driver's run id).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .common import RowWriter, Run, RunRow, dtype_name, median_of, quantile, time_calls
from .e2e import E2ECase
from .kernels import KernelRow

ROOT = Path(__file__).resolve().parent.parent.parent
#: |logprob - float64 logprob| a row may show: fp32 sums over up to 152k exponentials, and fp32 division by
#: the temperature, against an all-float64 log-softmax (bf16 logits are exact in both).
LOGPROB_ATOL_VS_FLOAT64 = 1e-3
#: The driver's run id, handed to every part's process (each row's `run_id`).
RUN_ID_ENV = "SPECDEC_GPU_CHECK_RUN_ID"
#: Floats are written with this many significant digits: a ratio of 3e-5 (an interpreted kernel against a copy)
#: must not read as 0.
SIGNIFICANT = 6


# ---- one row dataclass per CSV ---------------------------------------------------------------------------
@dataclass
class EnvironmentRow:
    key: str
    value: str


@dataclass
class CeilingRow(RunRow):
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
class LogprobKernelRow(KernelRow):
    """A kernels-suite row of compute_spec_v2_logprobs (impl reference | fast | fast_kernels) and its checks."""

    num_splits: str  # auto or the forced count (fast_kernels); "" for the ops
    splits_used: int
    speedup_vs_reference: float
    max_abs_err_vs_float64: float
    within_tolerance: bool


@dataclass
class GraphReplayRow(RunRow):
    worker: str
    label: str
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
class GpuE2ERow(E2ECase):
    decode_tokens: int
    decode_s: float
    tokens_per_s: float
    tokens_per_s_min: float
    tokens_per_s_max: float
    mean_accept_len: float
    speedup_vs_reference: float | str
    same_tokens_as_fast_eager: bool | str


def _writer(out: Path, name: str, row_type) -> RowWriter:
    return RowWriter(out / name, row_type, significant=SIGNIFICANT)


def _run(device) -> Run:
    return Run("gpu-check", device, run_id=os.environ.get(RUN_ID_ENV))


def read_rows(path: Path) -> list[dict]:
    import csv
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _device(smoke: bool):
    import torch
    return torch.device("cpu" if smoke else "cuda")


def run_environment(out: Path, smoke: bool) -> None:
    import torch

    w = _writer(out, "environment.csv", EnvironmentRow)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    info = {k: str(v) for k, v in _run(device).prefix().items()}
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


def environment_headline(out: Path) -> str:
    env = {r["key"]: r["value"] for r in read_rows(out / "environment.csv")}
    if not env:
        return ""
    gpu = env.get("gpu", "?")
    if gpu == "none":
        return f"no GPU; torch {env.get('torch')}, triton {env.get('triton')}"
    return (f"{gpu}, {env.get('sm_count')} SMs, L2 {env.get('l2_cache_mb')} MB, driver {env.get('driver')}, "
            f"torch {env.get('torch')} (CUDA {env.get('cuda_runtime')}), triton {env.get('triton')}")


def run_ceilings(out: Path, smoke: bool) -> None:
    import torch

    from .kernels import COPY_CEILING_BYTES, copy_bandwidth, time_rotated

    device = _device(smoke)
    run = _run(device)
    w = _writer(out, "ceilings.csv", CeilingRow)
    nbytes, repeats = (8 << 20, 5) if smoke else (COPY_CEILING_BYTES, 10)
    t0 = time.perf_counter()
    gbps = copy_bandwidth(device, nbytes, repeats)
    moved = 2 * max(nbytes, COPY_CEILING_BYTES if device.type == "cuda" else 0)
    us = (moved if device.type == "cuda" else nbytes) / gbps / 1e3
    w.write(CeilingRow(**run.prefix(), ceiling="device_copy", dtype="float32",
                       size=str(moved if device.type == "cuda" else nbytes), repeats=repeats, median_us=us, p20_us=us,
                       p80_us=us, value=gbps, unit="GB/s"))
    print(f"copy: {gbps:.1f} GB/s [{time.perf_counter() - t0:.1f} s]", flush=True)
    n, dtype = (256, torch.float32) if smoke else (8192, torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(0)
    pairs = [(torch.randn(n, n, generator=gen, device=device).to(dtype),
              torch.randn(n, n, generator=gen, device=device).to(dtype)) for _ in range(2)]
    dst = torch.empty(n, n, device=device, dtype=dtype)
    times = time_rotated([lambda a=a, b=b: torch.mm(a, b, out=dst) for a, b in pairs], device, 3 if smoke else 10)
    med = statistics.median(times)
    w.write(CeilingRow(**run.prefix(), ceiling="matmul", dtype=dtype_name(dtype), size=f"{n}x{n}x{n}",
                       repeats=len(times), median_us=med, p20_us=quantile(times, 0.2), p80_us=quantile(times, 0.8),
                       value=2 * n**3 / med / 1e6, unit="TFLOP/s"))
    print(f"matmul {n}^3: {2 * n**3 / med / 1e6:.1f} TFLOP/s", flush=True)


def ceilings_headline(out: Path) -> str:
    rows = {r["ceiling"]: r for r in read_rows(out / "ceilings.csv")}
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

    from ..logprob_types import LogitsOutput
    from .kernels import copy_bandwidth, logprob_case, rotation_copies, time_rotated

    device = _device(smoke)
    run = _run(device)
    w = _writer(out, "logprob_kernels.csv", LogprobKernelRow)
    ceiling = [float(r["value"]) for r in read_rows(out / "ceilings.csv") if r["ceiling"] == "device_copy"]
    copy_gbps = ceiling[0] if ceiling else copy_bandwidth(device, 8 << 20 if smoke else 2 << 30, 5)
    repeats = 3 if smoke else 20
    gen = torch.Generator(device=device).manual_seed(0)
    shapes, split_counts = _logprob_sweep(smoke)
    for R, V in shapes:
        for dtype in (torch.bfloat16, torch.float32):
            for k in (0, 5):
                t0 = time.perf_counter()
                case = logprob_case(R // 2, 2, V, dtype, k, device, gen)
                x = case.inputs
                logits, predict, accept, batch = x["logits"], x["predict"], x["accept"], x["batch"]
                rows = accept.reshape(-1).long()
                scaled = logits.index_select(0, rows).double() / x["temps"].double().repeat_interleave(2)[:, None]
                want = torch.log_softmax(scaled, -1)
                del scaled
                err = functools.partial(_max_err_vs_float64, want.gather(1, predict[rows].long()[:, None])[:, 0],
                                        want.topk(k, -1).values if k else None)
                del want
                auto = _num_vocab_splits(R, V, _sm_count(device))
                ref_us = None
                for impl, ops in (("reference", reference), ("fast", fast)):
                    lo = LogitsOutput(next_token_logits=logits)
                    ops.compute_spec_v2_logprobs(batch, lo, predict, accept, 1)
                    top = torch.stack(lo.next_token_top_logprobs_val) if k else None
                    e = err(lo.next_token_logprobs, top)
                    times = time_calls(functools.partial(case.run, ops), device, repeats)
                    ref_us = ref_us or statistics.median(times)
                    w.write(_logprob_row(run, case, impl, "cuda_event" if device.type == "cuda" else "process_cpu_time",
                                         times, copy_gbps, ref_us, "", auto, e))
                copies = rotation_copies(device, case.bytes)
                for n in split_counts:
                    calls = case.launches(copies, num_splits=n)
                    lp, top, _, _, _ = calls[0]()
                    e = err(lp, top)
                    times = time_rotated(calls, device, repeats)
                    del calls
                    w.write(_logprob_row(run, case, "fast_kernels", "cuda_graph" if device.type == "cuda"
                                         else "process_cpu_time", times, copy_gbps, ref_us,
                                         "auto" if n is None else str(n), auto if n is None else n, e))
                print(f"logprobs {R} x {V} {dtype} k={k} [{time.perf_counter() - t0:.1f} s]", flush=True)
                del case, x, logits


def _logprob_row(run, case, impl, timer, times, copy_gbps, ref_us, num_splits, splits_used, err) -> LogprobKernelRow:
    med = statistics.median(times)
    gbps = case.bytes / med / 1e3
    return LogprobKernelRow(
        **run.prefix(), timer=timer, op=case.op, impl=impl, dtype=dtype_name(case.dtype), batch_size=case.batch_size,
        num_slots=case.num_slots, num_draft_tokens=case.num_draft_tokens, vocab_size=case.vocab_size,
        top_logprobs_num=case.top_logprobs_num, rows=case.rows, repeats=len(times), median_us=med,
        p20_us=quantile(times, 0.2), p80_us=quantile(times, 0.8), bytes=case.bytes, gbps=gbps, copy_gbps=copy_gbps,
        frac_of_copy=gbps / copy_gbps, num_splits=num_splits, splits_used=splits_used,
        speedup_vs_reference=ref_us / med, max_abs_err_vs_float64=err, within_tolerance=err <= LOGPROB_ATOL_VS_FLOAT64)


def _max_err_vs_float64(want_lp, want_top, lp, top) -> float:
    """Largest |output - float64| over the chosen-token logprobs and, when asked, the top-k values."""
    e = (lp.double().reshape(-1) - want_lp).abs().max().item()
    if want_top is not None:
        e = max(e, (top.double()[:, :want_top.shape[1]] - want_top).abs().max().item())
    return e


def logprob_headline(out: Path) -> str:
    rows = read_rows(out / "logprob_kernels.csv")
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


def tests_headline(out: Path) -> str:
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
    from ..models import random_eagle_head, random_llama, random_mtp
    try:
        from tests.helpers import near_bigram_target, perfect_eagle, perfect_mtp
        target = near_bigram_target(seed=6, mix=0.4).to(device)
        eagle, mtp = perfect_eagle(target), perfect_mtp(target, 3, True)
    except ImportError:
        target = random_llama(seed=6, device=device)
        eagle, mtp = random_eagle_head(target), random_mtp(target, 3, True)
    return target, _cases({"eagle": eagle, "mtp_chain": mtp})


def _cases(drafts: dict) -> list:
    """The shared worker cases (`cases.CASES`, by kind) whose draft kind `drafts` has -> (case, draft) pairs,
    target-only first."""
    from .cases import CASES, by_kind
    return [(c, drafts.get(c.kind)) for c in by_kind(CASES) if c.spec is None or c.kind in drafts]


def _replay_params(mode: str, B: int):
    from ..config import SamplingParams
    sampled = dict(temperature=0.7, top_k=20, top_p=0.9)
    return [SamplingParams(max_new_tokens=10 + 3 * i, return_logprob=True, top_logprobs_num=2,
                           **(sampled if mode == "sampled" or (mode == "mixed" and i % 2) else {}))
            for i in range(B)]


def run_graph_replay(out: Path, smoke: bool) -> None:
    import torch

    from .. import Engine
    from ..workers.graphs import DecodeGraphs, batch_buckets

    device = _device(smoke)
    run = _run(device)
    w = _writer(out, "graph_replay.csv", GraphReplayRow)
    target, workers = _small_models(device)
    max_batch = 8
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(target.config.vocab_size, (3 + i % 4,), generator=gen).tolist() for i in range(8)]
    impl = "reference" if smoke else "fast"  # smoke: the plumbing, eagerly; the interpreter adds nothing here
    sizes, modes = ((1, 5), ("greedy", "mixed")) if smoke else ((1, 5, 8), ("greedy", "sampled", "mixed"))
    for case, draft in workers[:3] if smoke else workers:
        spec = case.spec
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
                w.write(GraphReplayRow(**run.prefix(), worker=case.kind, label=case.label, batch_size=B,
                                       bucket=next(k for k in batch_buckets(max_batch) if k >= B), sampling=mode,
                                       cuda_graphs=not smoke, requests=B, tokens=sum(len(o.token_ids) for o in a),
                                       identical_requests=sum(same), token_identical=all(same), max_logprob_diff=diff,
                                       mean_accept_len=sum(acc) / len(acc) if acc else 1.0,
                                       seconds=time.perf_counter() - t0))
                print(f"{case.label} B={B} {mode}: identical {sum(same)}/{B} [{time.perf_counter() - t0:.1f} s]",
                      flush=True)


def graph_headline(out: Path) -> str:
    rows = read_rows(out / "graph_replay.csv")
    if not rows:
        return ""
    bad = [f"{r['label']} B={r['batch_size']} {r['sampling']}" for r in rows if r["token_identical"] != "True"]
    kind = ("CUDA-graph replay == fast eager" if rows[0]["cuda_graphs"] == "True"
            else "static-buffer steps (no capture) == eager")
    return (f"{kind}, token-identical in {len(rows) - len(bad)} of {len(rows)} cases"
            + (f"; differing: {', '.join(bad)}" if bad else "")
            + f"; largest logprob difference {max(float(r['max_logprob_diff']) for r in rows):.1e}")


def _e2e_models(device, smoke: bool):
    import torch

    from ..models import random_eagle_head, random_llama, random_mtp
    from .e2e import random_1b_target
    if smoke:
        target = random_llama(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, seed=0, device=device)
        label = "random-llama-tiny"
    else:
        # Llama-3.2-1B's shapes with an untied 128,256 x 2,048 head: 1.5B parameters, drawn on the GPU
        target = random_1b_target(device, torch.bfloat16)
        label = "random-llama-1.5b"
    workers = _cases({"eagle": random_eagle_head(target), "mtp": random_mtp(target, 3)})
    return label, target, [(c, d) for c, d in workers if c.kind != "eagle" or c.spec.topk > 1]  # no chain


def run_e2e(out: Path, smoke: bool) -> None:
    import torch

    from .. import Engine, SamplingParams

    device = _device(smoke)
    run = _run(device)
    w = _writer(out, "e2e.csv", GpuE2ERow)
    t0 = time.perf_counter()
    label, target, workers = _e2e_models(device, smoke)
    params_m = sum(p.numel() for p in target.parameters()) / 1e6
    print(f"{label}: {params_m:.0f}M parameters built in {time.perf_counter() - t0:.1f} s", flush=True)
    sizes, new_tokens, repeats, prompt_len = ((1, 2), 4, 1, 8) if smoke else ((1, 8, 32), 64, 3, 64)
    impls = [("reference", False), ("fast", False)] + ([] if smoke else [("fast", True)])
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(target.config.vocab_size, (max(sizes), prompt_len), generator=gen).tolist()
    engines = {}
    for case, draft in workers:
        for impl, graphs in impls:
            engines[case, impl, graphs] = Engine(target, draft, case.spec, impl=impl, max_batch=max(sizes),
                                                 max_seq_len=prompt_len + new_tokens + 32, cuda_graphs=graphs)
    params = SamplingParams(max_new_tokens=new_tokens)  # greedy, no logprobs; phase timers stay off
    for B in sizes:
        for case, _ in workers:
            spec = case.spec
            ref_tps, fast_eager = None, None
            for impl, graphs in impls:
                if smoke and impl == "fast" and B > 1:
                    continue  # interpreted kernels: one batch size shows the row's form
                t1 = time.perf_counter()
                engine = engines[case, impl, graphs]
                # compiles; with graphs the whole run, so that a bucket a request's early exit needs is
                # captured here, not in a timed pass
                engine.generate(prompts[:B], params if graphs else SamplingParams(max_new_tokens=min(new_tokens, 8)))
                passes = [_decode_pass(engine, prompts[:B], params, device) for _ in range(repeats)]
                passes.sort(key=lambda p: p["tps"])
                med = median_of(passes, key=lambda p: p["tps"])
                ref_tps = med["tps"] if impl == "reference" else ref_tps
                tokens = [o.token_ids for o in med["outs"]]
                if impl == "fast" and not graphs:
                    fast_eager = tokens
                acc = [a for o in med["outs"] for a in o.accept_lens]
                w.write(GpuE2ERow(
                    **run.prefix(), model=label, params_m=round(params_m, 1), dtype=dtype_name(target.dtype),
                    worker=case.kind, label=case.label, num_steps=spec.num_steps if spec else 0,
                    topk=spec.topk if spec else 0, num_draft_tokens=spec.num_draft_tokens if spec else 1, impl=impl,
                    cuda_graphs=graphs, batch_size=B,
                    prompt_len=prompt_len, max_new_tokens=new_tokens, repeats=repeats, decode_steps=med["steps"],
                    decode_tokens=med["tokens"], decode_s=med["seconds"], tokens_per_s=med["tps"],
                    tokens_per_s_min=passes[0]["tps"], tokens_per_s_max=passes[-1]["tps"],
                    mean_accept_len=sum(acc) / len(acc) if acc else 1.0,
                    speedup_vs_reference=med["tps"] / ref_tps if ref_tps else "",
                    same_tokens_as_fast_eager=tokens == fast_eager if graphs and fast_eager is not None else ""))
                print(f"{case.label} {impl}{' + graphs' if graphs else ''} B={B}: {med['tps']:.1f} tok/s "
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


def e2e_headline(out: Path) -> str:
    rows = read_rows(out / "e2e.csv")
    if not rows:
        return ""
    lines = []
    for B, goal in (("1", 3.0), ("32", 2.0)):
        for r in rows:
            if r["batch_size"] == B and r["cuda_graphs"] == "True" and r["speedup_vs_reference"]:
                lines.append(f"{r['label']} B={B}: fast + graphs {float(r['tokens_per_s']):.0f} tok/s, "
                             f"{float(r['speedup_vs_reference']):.1f}x reference (goal {goal:g}x)")
    if not lines:  # smoke, or cut short before the graph rows
        best = max(rows, key=lambda r: float(r["tokens_per_s"]))
        lines.append(f"{len(rows)} rows; fastest {best['label']} {best['impl']} B={best['batch_size']} "
                     f"{float(best['tokens_per_s']):.1f} tok/s")
    same = [r for r in rows if r["same_tokens_as_fast_eager"] in ("True", "False")]
    if same:
        identical = sum(r["same_tokens_as_fast_eager"] == "True" for r in same)
        lines.append(f"graphs token-identical to fast eager in {identical} of {len(same)}")
    return "; ".join(lines)

