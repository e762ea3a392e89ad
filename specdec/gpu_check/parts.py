"""Two parts of `specdec gpu-check`: `environment` (versions, the device, the commit, then the copy, read and matmul
ceilings) and `logprob_kernels` (the fused logprob op at its goal shape, the decode shapes, a tiny temperature,
then the sweeps). Each `run_<part>(out, smoke)` runs in its own process and measures its configurations one at a
time (`runner.run_configs`), writing rows as they are measured. The other parts: `ops` (every other op of
a decode step), `decode` (graph replay and end to end), `compiled_tests` (the compiled tests), `engines` (the
other engines and a profiled step).

Like for like: `reference` and `fast` rows time the op as a worker calls it (host work, one sync per call, the
same timer), and the >= 5x goal is their ratio; `reference_graph` and `fast_kernels` rows replay the reference
op and the fused kernels' launch alone from CUDA graphs over rotated inputs (no host work, nothing left in L2),
a separate ratio. Every configuration runs one untimed pass first (compilation, allocation).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import numpy

from .rows import (ENVIRONMENT, KERNELS, RUN_ID_ENV, EnvironmentRow, GpuKernelRow, driver_prefix, read_rows, writer,
                   write_error_row)
from .runner import Config, run_configs
from ..bench.common import Run, quantile, time_calls, dtype_name, DTYPES
from ..bench.suites.kernels import COPY_CEILING_BYTES, time_rotated, copy_bandwidth, logprob_case, rotation_copies
from .bandwidth import SHAPES, read_sum, read_sum_programs
import reference
from ..ops.logprob_types import LogitsOutput

ROOT = Path(__file__).resolve().parent.parent.parent
#: |logprob - float64 logprob| a row may show: fp32 sums over up to 152k exponentials, and fp32 division by
#: the temperature, against an all-float64 log-softmax (bf16 logits are exact in both).
LOGPROB_ATOL_VS_FLOAT64 = 1e-3
#: The goal shape of the fused logprob kernels: 256 accepted rows of Qwen's vocabulary.
GOAL_ROWS, GOAL_VOCAB = 256, 151936


def gpu_run(device):
    return Run("gpu-check", device, run_id=os.environ.get(RUN_ID_ENV))


def gpu_device(smoke: bool):
    return torch.device("cpu" if smoke else "cuda")


def graph_timer_name(device) -> str:
    """What `kernels.time_rotated` measures on `device`."""
    return "cuda_graph" if device.type == "cuda" else "process_cpu_time"


def op_timer_name(device) -> str:
    """What `common.time_calls` measures on `device`."""
    return "cuda_event" if device.type == "cuda" else "process_cpu_time"


def error_writer(out: Path):
    """error_row(config, message) for `run_configs`: the configuration's naming fields, status error."""
    def write(config: Config, message: str) -> None:
        write_error_row(out, config.file, driver_prefix(out, os.environ.get(RUN_ID_ENV, "")), config.fields,
                        message)
    return write


# ---- environment (and the ceilings) ----------------------------------------------------------------------
def run_environment(out: Path, smoke: bool) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env_w = writer(out, ENVIRONMENT)

    def put(info: dict) -> None:
        for key, value in info.items():
            env_w.write(EnvironmentRow(key, str(value)))

    def versions():
        info = {k: str(v) for k, v in gpu_run(device).prefix().items()}
        info.update(python=platform.python_version(), platform=platform.platform(), numpy=numpy.__version__,
                    cuda_runtime=str(torch.version.cuda), cpu_count=os.cpu_count(), smoke=smoke)
        for name in ("pytest", "xdist", "pytest_timeout", "hypothesis", "transformers", "xgrammar"):
            info[f"has_{name}"] = importlib.util.find_spec(name) is not None
        put(info)

    def gpu():
        if device.type != "cuda":
            put(dict(gpu="none"))
            return
        props = torch.cuda.get_device_properties(device)
        put(dict(gpu=props.name, sm_count=props.multi_processor_count,
                 l2_cache_mb=round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
                 memory_gib=round(props.total_memory / 2**30, 1), compute_capability=f"{props.major}.{props.minor}"))

    def driver():
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem,power.limit",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=5)
            drv, sm_clock, mem_clock, power = [x.strip() for x in smi.stdout.splitlines()[0].split(",")]
            put(dict(driver=drv, max_sm_clock=sm_clock, max_mem_clock=mem_clock, power_limit=power))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            put(dict(driver="unknown (no nvidia-smi)"))

    kernels_w = writer(out, KERNELS)
    run = functools.lru_cache(None)(lambda: gpu_run(gpu_device(smoke)))
    configs = [Config("versions", versions, ENVIRONMENT, dict(key="error.versions"), headline=True),
               Config("gpu", gpu, ENVIRONMENT, dict(key="error.gpu"), headline=True),
               Config("driver", driver, ENVIRONMENT, dict(key="error.driver")),
               Config("copy_ceiling", lambda: kernels_w.write(_copy_ceiling(run(), smoke)), KERNELS,
                      dict(part="environment", check="ceiling", op="device_copy", impl="ceiling"), headline=True),
               Config("read_ceiling", lambda: kernels_w.write(_read_ceiling(out, run(), smoke)), KERNELS,
                      dict(part="environment", check="ceiling", op="device_read", impl="ceiling"), headline=True),
               Config("matmul_ceiling", lambda: kernels_w.write(_matmul_ceiling(run(), smoke)), KERNELS,
                      dict(part="environment", check="ceiling", op="matmul", impl="ceiling"))]
    run_configs("environment", configs, error_writer(out))


def _ceiling_row(run, timer, op, dtype, times, nbytes, rows=0, **extra) -> GpuKernelRow:
    med = statistics.median(times)
    gbps = nbytes / med / 1e3
    values = dict(timer=timer, op=op, impl="ceiling", dtype=dtype, batch_size=0, num_slots=0,
                  num_draft_tokens=0, vocab_size=0, top_logprobs_num=0, rows=rows, repeats=len(times), median_us=med,
                  p20_us=quantile(times, 0.2), p80_us=quantile(times, 0.8), bytes=nbytes, gbps=gbps, copy_gbps=gbps,
                  frac_of_copy=1.0, part="environment", check="ceiling", temperature="", num_splits="",
                  splits_used="", programs_per_sm="", speedup_vs_reference="", speedup_basis="",
                  max_abs_err_vs_float64="", finite="", within_tolerance="", tflops="", calls="", total_us="",
                  status="ok", error="")
    values.update(extra)
    return GpuKernelRow(**run.prefix(), **values)


def _copy_ceiling(run, smoke: bool) -> GpuKernelRow:
    """The device copy every kernel row divides by: >= 2 GiB of sources copied in turn from one CUDA graph
    (bytes = read + write); on a CPU a small buffer."""
    device = gpu_device(smoke)
    if device.type == "cuda":
        chunks = 4
        n = COPY_CEILING_BYTES // chunks // 4
        pairs = [(torch.empty(n, device=device).fill_(1.0), torch.empty(n, device=device)) for _ in range(chunks)]
        # per round: every chunk copied once (time_rotated gives the time per call)
        times = [t * chunks for t in time_rotated([functools.partial(dst.copy_, src) for src, dst in pairs],
                                                  device, 10)]
        nbytes = 2 * n * 4 * chunks
    else:
        n = (8 << 20) // 2 // 4
        src, dst = torch.randn(n), torch.empty(n)
        times = time_calls(lambda: dst.copy_(src), device, 5)
        nbytes = 2 * n * 4
    row = _ceiling_row(run, graph_timer_name(device), "device_copy", "float32", times, nbytes)
    print(f"copy: {row.gbps:.1f} GB/s, {nbytes / 2 / 2**30:.2f} GiB copied per round", flush=True)
    return row


#: Bytes the read ceiling reads per launch on CUDA: far beyond any L2, as the copy's.
READ_CEILING_BYTES = 2 << 30
SMOKE_READ_CEILING_BYTES = 256 << 10


def _read_ceiling(out: Path, run, smoke: bool) -> GpuKernelRow:
    """What a decode step's reads are held against (`measure_read`): the best launch shape's row. bytes: those read
    per launch; rows: its programs (one partial sum each). Every shape's partial sums must add up to the element
    count exactly (max_abs_err_vs_float64: the largest miss, within_tolerance)."""
    device = gpu_device(smoke)
    shapes, n, timer = measure_read(device, smoke)
    best = max(shapes, key=lambda s: s["gbps"])
    err = max(abs(s["total"] - n) for s in shapes)
    copy = copy_ceiling(out, device, smoke)
    # lazy: fast imports triton
    from fast.logprobs import device_sm_count
    sm = device_sm_count(device) if device.type == "cuda" else 0  # no programs per SM on a CPU
    row = _ceiling_row(run, timer, "device_read", "bfloat16", best["times"], n * 2, rows=best["programs"],
                       copy_gbps=copy, frac_of_copy=best["gbps"] / copy, max_abs_err_vs_float64=err, finite=True,
                       within_tolerance=err == 0, programs_per_sm=best["programs"] / sm if sm else "")
    print(f"read: {best['gbps']:.4g} GB/s ({best['gbps'] / copy:.3g} x the copy), {n * 2 / 2**30:.3g} GiB read per "
          f"launch; by (block, iters, warps): " + ", ".join(f"{s['shape']} {s['gbps']:.4g}" for s in shapes),
          flush=True)
    return row


def measure_read(device, smoke: bool) -> tuple[list[dict], int, str]:
    """`bandwidth.read_sum` over a 2 GiB bf16 buffer of ones (one fp32 partial sum per 128 KiB read, so it
    writes almost nothing) at each launch shape of `bandwidth.SHAPES`: CUDA events around each of 20 launches
    after an untimed one; on a CPU a small buffer under Triton's interpreter, process time. -> (per shape: shape,
    programs, microseconds per launch, median GB/s and the partial sums' total; elements read; the timer's name)."""

    n = (READ_CEILING_BYTES if device.type == "cuda" else SMOKE_READ_CEILING_BYTES) // 2
    x = torch.ones(n, dtype=torch.bfloat16, device=device)
    repeats = 3 if smoke else 20
    results = []
    for block, iters, warps in SHAPES:
        partial = torch.empty(read_sum_programs(n, block, iters), dtype=torch.float32, device=device)
        launch = functools.partial(read_sum, x, partial, block, iters, warps)
        times = time_calls(launch, device, repeats, sync_each=False)  # its warm-up compiles
        timer = "cuda_event" if device.type == "cuda" else "process_cpu_time"
        results.append(dict(shape=(block, iters, warps), programs=partial.numel(), times=times,
                            gbps=n * 2 / statistics.median(times) / 1e3, total=partial.double().sum().item()))
    return results, n, timer


def read_ceiling(out: Path, device, smoke: bool) -> float:
    """GB/s of the run's read ceiling (environment's row), or one measured here when it has none."""
    rows = [r for r in read_rows(Path(out) / KERNELS) if r["op"] == "device_read" and r["status"] == "ok"]
    if rows:
        return float(rows[0]["gbps"])
    return max(s["gbps"] for s in measure_read(device, smoke)[0])


def _matmul_ceiling(run, smoke: bool) -> GpuKernelRow:
    device = gpu_device(smoke)
    n, dtype = (256, torch.float32) if smoke else (8192, torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(0)
    pairs = [(torch.randn(n, n, generator=gen, device=device).to(dtype),
              torch.randn(n, n, generator=gen, device=device).to(dtype)) for _ in range(2)]
    dst = torch.empty(n, n, device=device, dtype=dtype)
    times = time_rotated([lambda a=a, b=b: torch.mm(a, b, out=dst) for a, b in pairs], device, 3 if smoke else 10)
    tflops = 2 * n**3 / statistics.median(times) / 1e6
    print(f"matmul {n}^3: {tflops:.3g} TFLOP/s", flush=True)
    return _ceiling_row(run, graph_timer_name(device), "matmul", dtype_name(dtype), times, 3 * n * n * dtype.itemsize,
                        rows=n, tflops=tflops)


def copy_ceiling(out: Path, device, smoke: bool) -> float:
    """GB/s of the run's copy ceiling (environment's row), or a copy measured here when it has none."""
    rows = [r for r in read_rows(Path(out) / KERNELS) if r["op"] == "device_copy" and r["status"] == "ok"]
    if rows:
        return float(rows[0]["gbps"])
    return copy_bandwidth(device, 8 << 20 if smoke else COPY_CEILING_BYTES, 5)


# ---- the fused logprob op and kernels --------------------------------------------------------------------
@dataclass(frozen=True)
class LogprobShape:
    check: str
    rows: int  # accepted rows R = 2 B (chains of two slots)
    vocab: int
    dtype: str
    top_k: int = 0
    temperature: float | None = None  # None: drawn in [0.5, 1.5)
    impls: tuple = ("reference", "fast", "reference_graph", "fast_kernels")
    splits: tuple = (None,)  # fast_kernels split counts (None: the op's heuristic)

    @property
    def key(self) -> str:
        t = "" if self.temperature is None else f" T={self.temperature:g}"
        s = "" if self.splits == (None,) else " splits " + "/".join("auto" if n is None else str(n)
                                                                      for n in self.splits)
        return f"{self.check} {self.rows}x{self.vocab} {self.dtype} k={self.top_k}{t}{s}"


def logprob_shapes(smoke: bool) -> list[LogprobShape]:
    """Headline first: the goal shape, then the decode shapes (2 and 32 rows, where splitting and empty splits
    matter) and the tiny temperature at V = 151,936, then the sweeps."""
    if smoke:
        return [LogprobShape("headline", 4, 300, "bfloat16"),
                LogprobShape("tiny_temperature", 2, 301, "float32", temperature=0.01,
                             impls=("reference", "fast", "fast_kernels")),
                LogprobShape("decode", 2, 301, "bfloat16"),
                LogprobShape("split_sweep", 4, 300, "float32", top_k=2, impls=("fast_kernels",), splits=(2,))]
    V, goal = GOAL_VOCAB, GOAL_ROWS
    tiny = ("reference", "fast", "fast_kernels")
    return [LogprobShape("headline", goal, V, "bfloat16"),
            LogprobShape("decode", 2, V, "bfloat16"),
            LogprobShape("decode", 32, V, "bfloat16"),
            LogprobShape("tiny_temperature", 2, V, "bfloat16", temperature=0.01, impls=tiny),
            LogprobShape("tiny_temperature", goal, V, "float32", temperature=0.01, impls=tiny),
            LogprobShape("headline", goal, V, "float32"),
            LogprobShape("headline", goal, V, "bfloat16", top_k=5),
            LogprobShape("split_sweep", goal, V, "bfloat16", impls=("fast_kernels",), splits=(1, 2, 4, 8, 16)),
            LogprobShape("split_sweep", 2, V, "bfloat16", impls=("fast_kernels",), splits=(1, 8, 16, 32, 64)),
            LogprobShape("sweep", 2, V, "bfloat16", top_k=5),
            LogprobShape("sweep", 32, V, "float32"),
            LogprobShape("sweep", goal, V + 1, "bfloat16"),
            LogprobShape("sweep", 2, V + 1, "bfloat16")]


def run_logprob_kernels(out: Path, smoke: bool) -> None:
    device = gpu_device(smoke)
    w = writer(out, KERNELS)
    run = functools.lru_cache(None)(lambda: gpu_run(device))
    copy = functools.lru_cache(None)(lambda: copy_ceiling(out, device, smoke))
    repeats = 2 if smoke else 20
    configs = []
    for shape in logprob_shapes(smoke):
        fields = dict(part="logprob_kernels", check=shape.check, op="compute_spec_v2_logprobs", dtype=shape.dtype,
                      rows=shape.rows, vocab_size=shape.vocab, top_logprobs_num=shape.top_k,
                      temperature="" if shape.temperature is None else shape.temperature)
        configs.append(Config(shape.key, functools.partial(_measure_logprobs, shape, device, run, copy, w, repeats),
                              KERNELS, fields, headline=shape.check == "headline"))
    run_configs("logprob_kernels", configs, error_writer(out))


def _measure_logprobs(shape: LogprobShape, device, run, copy, w, repeats: int) -> None:
    # lazy: fast imports triton
    import fast
    from fast.logprobs import device_sm_count, num_vocab_splits


    t0 = time.perf_counter()
    dtype = DTYPES[shape.dtype]
    gen = torch.Generator(device=device).manual_seed(0)
    case = logprob_case(shape.rows // 2, 2, shape.vocab, dtype, shape.top_k, device, gen)
    x = case.inputs
    if shape.temperature is not None:
        # the case that once gave NaN: logits in (-2, -1] put the scaled row maximum near -100..-200
        x["logits"].copy_((-1.0 - torch.rand(x["logits"].shape, generator=gen, device=device)).to(dtype))
        x["temps"].fill_(shape.temperature)
    logits, predict, accept, batch = x["logits"], x["predict"], x["accept"], x["batch"]
    rows = accept.reshape(-1).long()
    scaled = logits.index_select(0, rows).double() / x["temps"].double().repeat_interleave(2)[:, None]
    want = torch.log_softmax(scaled, -1)
    del scaled
    want_lp = want.gather(1, predict[rows].long()[:, None])[:, 0]
    want_top = want.topk(shape.top_k, -1).values if shape.top_k else None
    del want
    sm = device_sm_count(device)
    auto = num_vocab_splits(shape.rows, shape.vocab, sm)
    copies = rotation_copies(device, case.bytes)
    graph_timer, op_timer = graph_timer_name(device), op_timer_name(device)
    median = {}

    def op_calls(ops):
        inputs = [logits] + [logits.clone() for _ in range(copies - 1)]
        return [functools.partial(ops.compute_spec_v2_logprobs, batch, LogitsOutput(next_token_logits=t), predict,
                                  accept, 1) for t in inputs]

    for impl in shape.impls:
        ops = reference if impl.startswith("reference") else fast
        if impl in ("reference", "fast"):
            lo = LogitsOutput(next_token_logits=logits)
            ops.compute_spec_v2_logprobs(batch, lo, predict, accept, 1)  # the untimed pass: compiles
            lp, top = lo.next_token_logprobs, (torch.stack(lo.next_token_top_logprobs_val) if shape.top_k else None)
            times = time_calls(functools.partial(case.run, ops), device, repeats)
            basis, timer, splits = ("" if impl == "reference" else "reference/fast"), op_timer, [None]
        elif impl == "reference_graph":
            lo = LogitsOutput(next_token_logits=logits)
            ops.compute_spec_v2_logprobs(batch, lo, predict, accept, 1)
            lp, top = lo.next_token_logprobs, (torch.stack(lo.next_token_top_logprobs_val) if shape.top_k else None)
            times = time_rotated(op_calls(ops), device, repeats)
            basis, timer, splits = "", graph_timer, [None]
        else:
            basis, timer, splits = "reference_graph/fast_kernels", graph_timer, list(shape.splits)
        for n in splits:
            if impl == "fast_kernels":
                calls = case.launches(copies, num_splits=n)
                lp, top, _, _, _ = calls[0]()
                times = time_rotated(calls, device, repeats)
                del calls
            med = statistics.median(times)
            median[impl] = median.get(impl, med)
            ref = median.get(basis.split("/")[0]) if basis else None
            err = _max_err_vs_float64(want_lp, want_top, lp, top)
            finite = bool(torch.isfinite(lp).all()) and (top is None or bool(torch.isfinite(top).all()))
            used = (auto if n is None else n) if impl.startswith("fast") else ""
            w.write(_logprob_row(run(), case, shape, impl, timer, times, copy(), ref, basis,
                                 "auto" if n is None else str(n), used,
                                 shape.rows * used / sm if used != "" else "", err, finite))
    print(f"logprobs {shape.key} [{time.perf_counter() - t0:.1f} s]", flush=True)


def _logprob_row(run, case, shape, impl, timer, times, copy_gbps, ref_us, basis, num_splits, splits_used,
                 programs_per_sm, err, finite) -> GpuKernelRow:
    med = statistics.median(times)
    gbps = case.bytes / med / 1e3
    return GpuKernelRow(
        **run.prefix(), timer=timer, op=case.op, impl=impl, dtype=dtype_name(case.dtype), batch_size=case.batch_size,
        num_slots=case.num_slots, num_draft_tokens=case.num_draft_tokens, vocab_size=case.vocab_size,
        top_logprobs_num=case.top_logprobs_num, rows=case.rows, repeats=len(times), median_us=med,
        p20_us=quantile(times, 0.2), p80_us=quantile(times, 0.8), bytes=case.bytes, gbps=gbps, copy_gbps=copy_gbps,
        frac_of_copy=gbps / copy_gbps, part="logprob_kernels", check=shape.check,
        temperature="" if shape.temperature is None else shape.temperature,
        num_splits=num_splits if impl == "fast_kernels" else "", splits_used=splits_used,
        programs_per_sm=programs_per_sm, speedup_vs_reference=ref_us / med if ref_us else "", speedup_basis=basis,
        max_abs_err_vs_float64=err, finite=finite, within_tolerance=finite and err <= LOGPROB_ATOL_VS_FLOAT64,
        tflops="", calls="", total_us="", status="ok", error="")


def _max_err_vs_float64(want_lp, want_top, lp, top) -> float:
    """Largest |output - float64| over the chosen-token logprobs and, when asked, the top-k values."""
    e = (lp.double().reshape(-1) - want_lp).abs().max().item()
    if want_top is not None:
        e = max(e, (top.double()[:, :want_top.shape[1]] - want_top).abs().max().item())
    return e
