"""The `engines` part of `specdec gpu-check`, last in the run: where the GPU's time goes in a fast decode step, and
what the same GPU's other engines make of the same model.

- `profile`: one CUDA-graph replay of the fast path's target-only decode step at B = 1 under torch.profiler
  (CUDA activity; only device intervals are counted): kernels.csv rows of part `profile`, one per kernel name
  (launches and device microseconds per replay, over 5 replays), heaviest first, then `(total)` with the replay's
  own median time from CUDA events; SUMMARY.md shows the top 30. Profiled after the capture and in a process that
  captures nothing after it.
- `transformers`: `generate` of transformers' LlamaForCausalLM built from the e2e target's config and loaded with
  its state dict (the same weights: specdec's keys are transformers' names), greedy, `cache_implementation=
  "static"`, so that generate compiles its decode forward itself (torch.compile, Inductor, "reduce-overhead": CUDA
  graphs); on a CPU transformers does not compile and the row says so.
- `inductor`: specdec's reference target-only path with the target's decode forward under torch.compile
  (Inductor, static shapes) inside specdec's own CUDA graphs (`DecodeGraphs`); when the capture fails, compiled
  without graphs, and the row's note says why. The reference attention's key span follows the host's length bound
  step by step, which would recompile every step and leave a captured graph short of keys: it is held at the
  cache's capacity instead (correct, the longer span masked). Dynamo breaks the graph at every argument check's
  ContextVar read, so the process swaps that ContextVar for a plain flag with the same get / set / reset.

Each configuration runs in a process of its own (`python -m specdec.gpu_check.engines --config KEY`), under the
part's per-configuration timeout: a compile that hangs, crashes or fills the GPU costs its own row, and nothing
compiled or captured in one configuration is found by the next. The part's process never touches CUDA.

Decode time is the difference of two generations, 64 and 192 new tokens (every request decodes them all: no stop
ids, `min_new_tokens` for transformers), over the 128 tokens between: prefill, compilation and capture cancel. One
untimed generation of 192 tokens first (it compiles, captures and sizes the static cache), then `repeats` timed
pairs; tokens/s from the median difference. Every row's first 16 tokens are compared with specdec's reference
eager on the same prompts (in bf16 a near-tie may flip one; in the smoke run's fp32 they must agree).

`--smoke` runs the same configurations on a CPU on the e2e part's tiny model (4 and 12 new tokens, process time):
transformers with its static cache, not compiled (transformers compiles on an accelerator only); the reference path
through Dynamo and AOTAutograd with the `aot_eager` backend (Inductor's C++ build costs about 35 s a shape on a CPU)
and the graphs' static buffers without capture; the profile of the same step run eagerly, with CPU activity.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from .parts import ROOT, error_writer, gpu_device, gpu_run
from .rows import E2E, KERNELS, DecodeRow, GpuKernelRow, writer
from .runner import PROGRESS_ENV, Config, describe_exit, last_line, run_configs
from .decode import e2e_target, blank_decode_fields, first_difference, read_ceiling_or_blank
from .. import Engine, SamplingParams, checks
from ..bench.common import dtype_name, quantile, time_calls
from .roofline import roofline_fields, target_reads
from ..workers.graphs import DecodeGraphs

#: Batch sizes of the transformers and Inductor rows, in the order measured (smoke: 1 and 2).
ENGINE_SIZES, SMOKE_ENGINE_SIZES = (1, 32), (1, 2)
#: The two generation lengths whose difference is timed (smoke: 4 and 12), and the prompt length.
LENGTHS, SMOKE_LENGTHS = (64, 192), (4, 12)
PROMPT_LEN, SMOKE_PROMPT_LEN = 64, 8
#: Timed pairs of generations per row.
REPEATS, SMOKE_REPEATS = 3, 1
#: Tokens per request compared with specdec's reference eager.
COMPARED_TOKENS, SMOKE_COMPARED_TOKENS = 16, 4
#: Replays profiled (the rows are per replay); replays timed for the `(total)` row's median.
PROFILED_REPLAYS, TIMED_REPLAYS = 5, 20
#: Where a configuration's process leaves its exception's last line for the part to put in the row.
CHILD_ERROR_ENV = "SPECDEC_GPU_CHECK_CHILD_ERROR"


class ConfigProcessFailed(RuntimeError):
    """A configuration's own process failed: its exception's last line, or how it died."""


@dataclass(frozen=True)
class EngineConfig:
    engine: str  # profile | transformers | inductor
    batch_size: int

    @property
    def key(self) -> str:
        return {"profile": "profile target-only fast + graphs", "transformers": "transformers static cache + compile",
                "inductor": "reference + inductor"}[self.engine] + f" B={self.batch_size}"


def engines_plan(smoke: bool) -> list[EngineConfig]:
    """The profile first (a few seconds), then per batch size transformers and Inductor (each a compile)."""
    sizes = SMOKE_ENGINE_SIZES if smoke else ENGINE_SIZES
    return [EngineConfig("profile", 1)] + [EngineConfig(e, B) for B in sizes for e in ("transformers", "inductor")]


# ---- the part: each configuration in a process of its own --------------------------------------------------
def run_engines(out: Path, smoke: bool) -> None:
    configs = []
    for c in engines_plan(smoke):
        if c.engine == "profile":
            file, fields = KERNELS, dict(part="profile", check="profile", op="(total)", impl="fast_graph",
                                         batch_size=c.batch_size)
        else:
            file, fields = E2E, dict(part="engines", worker="target-only", label="target-only",
                                     impl=planned_impl(c.engine, smoke), batch_size=c.batch_size)
        configs.append(Config(c.key, functools.partial(_in_own_process, c, out, smoke), file, fields,
                              headline=c.engine == "profile" or c.batch_size == 1))
    run_configs("engines", configs, error_writer(out))


def planned_impl(engine: str, smoke: bool) -> str:
    """An engines row's impl as planned (a row says what ran: `transformers` when generate did not compile)."""
    if engine == "transformers":
        return "transformers" if smoke else "transformers_compiled"
    return "reference_aot_eager" if smoke else "reference_inductor"


def _in_own_process(config: EngineConfig, out: Path, smoke: bool) -> None:
    """Run one configuration as `python -m specdec.gpu_check.engines --config KEY`; ConfigProcessFailed when it
    fails. The runner's timeout (SIGALRM) or the part's SIGINT interrupts the wait; the process is killed then."""
    progress = os.environ.get(PROGRESS_ENV)
    scratch = None if progress else tempfile.TemporaryDirectory(prefix="specdec-engines-")
    error_file = Path(progress).with_suffix(".child-error") if progress else Path(scratch.name) / "child-error"
    error_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "specdec.gpu_check.engines", "--config", config.key, "--out", str(out)] + \
        (["--smoke"] if smoke else [])
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, **{CHILD_ERROR_ENV: str(error_file)}))
    try:
        rc = proc.wait()
        if rc != 0:
            message = error_file.read_text().strip() if error_file.is_file() else ""
            raise ConfigProcessFailed(message or f"its process died ({describe_exit(rc)})")
    finally:
        if proc.poll() is None:
            proc.kill()  # its compile workers see their parent go and exit
            proc.wait()
        error_file.unlink(missing_ok=True)
        if scratch is not None:
            scratch.cleanup()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec.gpu_check.engines",
                                     description="one configuration of gpu-check's engines part, in this process")
    parser.add_argument("--config", required=True, help="its key (engines_plan)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    config = {c.key: c for c in engines_plan(args.smoke)}.get(args.config)
    if config is None:
        parser.error(f"unknown configuration {args.config!r}")
    if args.smoke:
        torch.set_num_threads(1)
    try:
        {"profile": run_profile, "transformers": run_transformers, "inductor": run_inductor}[config.engine](
            Path(args.out), config.batch_size, args.smoke)
    except BaseException as e:  # KeyboardInterrupt too: the part's deadline
        traceback.print_exc()
        path = os.environ.get(CHILD_ERROR_ENV)
        if path:
            Path(path).write_text(last_line(e) + "\n")
        return 1
    return 0


# ---- shared by the configurations --------------------------------------------------------------------------
@dataclass
class _Setup:
    out: Path
    smoke: bool
    device: object
    run: object
    label: str
    target: object
    prompts: list
    prompt_len: int
    lengths: tuple
    repeats: int
    compared: int


def _setup(out: Path, B: int, smoke: bool) -> _Setup:
    device = gpu_device(smoke)
    t0 = time.perf_counter()
    label, target = e2e_target(device, smoke)
    prompt_len = SMOKE_PROMPT_LEN if smoke else PROMPT_LEN
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(target.config.vocab_size, (B, prompt_len), generator=gen).tolist()
    print(f"{label} built in {time.perf_counter() - t0:.1f} s", flush=True)
    return _Setup(out, smoke, device, gpu_run(device), label, target, prompts, prompt_len,
                  SMOKE_LENGTHS if smoke else LENGTHS, SMOKE_REPEATS if smoke else REPEATS,
                  SMOKE_COMPARED_TOKENS if smoke else COMPARED_TOKENS)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_pairs(generate, s: _Setup, warm: bool = True) -> list[float]:
    """generate(n) decodes n new tokens per request; one untimed call at the longer length (unless `warm` is
    False: the caller made it), then `repeats` pairs. -> seconds of the longer less the shorter, per pair."""
    short, long = s.lengths
    if warm:
        generate(long)
    clock = time.perf_counter if s.device.type == "cuda" else time.process_time  # a CPU shared with other jobs
    diffs = []
    for _ in range(s.repeats):
        times = []
        for n in (short, long):
            _sync(s.device)
            t0 = clock()
            generate(n)
            _sync(s.device)
            times.append(clock() - t0)
        diffs.append(times[1] - times[0])
    if min(diffs) <= 0:
        raise RuntimeError(f"{long} new tokens took no longer than {short} ({diffs}): no decode time to report")
    return diffs


@dataclass
class _Tokens:
    """A row of tokens as `first_difference` reads it (one token per step)."""

    token_ids: list
    accept_lens: list
    top_logprobs: list | None = None


def _reference_tokens(s: _Setup) -> list[list[int]]:
    """The first `compared` tokens of each request from specdec's reference eager."""
    engine = Engine(s.target, impl="reference", max_batch=len(s.prompts), max_seq_len=s.prompt_len + s.compared + 8,
                    cuda_graphs=False)
    return [o.token_ids for o in engine.generate(s.prompts, SamplingParams(max_new_tokens=s.compared))]


def _engine_row(s: _Setup, impl: str, graphs: bool, diffs: list[float], tokens: list[list[int]], reads, note: str,
                t0: float) -> DecodeRow:
    B = len(s.prompts)
    short, long = s.lengths
    steps = long - short
    med = statistics.median(diffs)
    want = _reference_tokens(s)
    mine = [_Tokens(t[:s.compared], [1] * s.compared) for t in tokens]
    theirs = [_Tokens(t, [1] * len(t)) for t in want]
    same = [a.token_ids == b.token_ids for a, b in zip(mine, theirs)]
    context = s.prompt_len + (short + long) / 2
    fields = blank_decode_fields()
    fields.update(first_difference(mine, theirs, [B]))
    fields.update(part="engines", model=s.label, params_m=round(sum(p.numel() for p in s.target.parameters()) / 1e6, 1),
                  dtype=dtype_name(s.target.dtype), worker="target-only", label="target-only", num_steps=0, topk=0,
                  num_draft_tokens=1, impl=impl, cuda_graphs=graphs, batch_size=B, prompt_len=s.prompt_len,
                  max_new_tokens=long, repeats=len(diffs), sampling="greedy", bucket="", decode_steps=steps,
                  decode_tokens=B * steps, decode_s=med, tokens_per_s=B * steps / med,
                  tokens_per_s_min=B * steps / max(diffs), tokens_per_s_max=B * steps / min(diffs),
                  mean_accept_len=1.0, compared_with=f"specdec reference eager, first {s.compared} tokens",
                  identical_requests=sum(same), token_identical=all(same), note=note,
                  seconds=time.perf_counter() - t0)
    fields.update(roofline_fields(reads.bytes(B, context), med / steps, read_ceiling_or_blank(s.out, s.device,
                                                                                              s.smoke), context))
    return DecodeRow(**s.run.prefix(), **fields)


# ---- transformers ------------------------------------------------------------------------------------------
def transformers_twin(target):
    """transformers' LlamaForCausalLM with `target`'s config, dtype, device and weights (its state dict, whose keys
    are transformers' names). ValueError for a target whose config transformers' Llama would read otherwise."""
    # lazy: transformers is optional (specdec[bench])
    import transformers

    c = target.config
    if c.model_type != "llama" or c.rope_scaling or c.attention_bias:
        raise ValueError(f"transformers_twin: a plain Llama only, got model_type={c.model_type!r}, rope_scaling="
                         f"{c.rope_scaling!r}, attention_bias={c.attention_bias}")
    cfg = transformers.LlamaConfig(**c.to_dict())  # what save_pretrained writes, transformers' config.json
    default = torch.get_default_dtype()
    torch.set_default_dtype(target.dtype)  # built in the target's dtype on its device: no fp32 copy of 1.5B weights
    try:
        with torch.device(target.device):
            model = transformers.LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    model.load_state_dict(target.state_dict(), strict=True)
    return model.eval()


def run_transformers(out: Path, B: int, smoke: bool) -> None:
    # lazy: transformers is optional (specdec[bench]); torch._dynamo is slow to import
    import torch._dynamo.utils
    import transformers
    from transformers.utils import logging

    logging.disable_progress_bar()
    t0 = time.perf_counter()
    s = _setup(out, B, smoke)
    model = transformers_twin(s.target)
    ids = torch.tensor(s.prompts, device=s.device)
    mask = torch.ones_like(ids)
    last = {}

    def generate(n):
        last["ids"] = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                     cache_implementation="static", pad_token_id=0)

    diffs = _timed_pairs(generate, s)
    compiled = getattr(model, "_compiled_call", None) is not None
    config = getattr(model, "_last_compile_config", None)
    how = ", ".join(f"{k}={getattr(config, k)!r}" for k in ("backend", "mode", "fullgraph", "dynamic")
                    if hasattr(config, k))
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]  # Inductor left its CUDA graphs out
    note = (f"transformers {transformers.__version__} generate, static cache; "
            + (f"its decode forward compiled by generate (torch.compile {how})" if compiled else
               "not compiled: transformers compiles generate's decode forward on an accelerator only")
            + (f"; {skips} CUDA-graph skips" if skips else ""))
    graphs = compiled and getattr(config, "mode", "") in ("reduce-overhead", "max-autotune") and not skips
    tokens = last["ids"][:, s.prompt_len:].tolist()
    row = _engine_row(s, "transformers_compiled" if compiled else "transformers", graphs, diffs, tokens,
                      target_reads(model), note, t0)
    writer(out, E2E).write(row)
    print(f"transformers B={B}: {row.tokens_per_s:.1f} tok/s; {note}", flush=True)


# ---- specdec's reference path under Inductor -----------------------------------------------------------------
class _PlainFlag:
    """`specdec.checks`' trusted-calls ContextVar as a plain object Dynamo traces (this process runs one thread)."""

    def __init__(self):
        self.value = False

    def get(self):
        return self.value

    def set(self, value):
        token, self.value = self.value, value
        return token

    def reset(self, token):
        self.value = token


class _DecodeCompiled:
    """The target as the worker calls it: one-token forwards (the decode step's) through `compiled`, the others (the
    prefill's) eagerly, since a prefill's shapes would cost a compile of their own. `ran`: a compiled call returned
    (so a later failure is the capture's, not the compile's)."""

    def __init__(self, model, compiled, ran: dict):
        self.__dict__.update(model=model, compiled=compiled, ran=ran)

    def __call__(self, input_ids, *args, **kwargs):
        if input_ids.shape[1] != 1:
            return self.model(input_ids, *args, **kwargs)
        out = self.compiled(input_ids, *args, **kwargs)
        self.ran["compiled"] = True
        return out

    def __getattr__(self, name):
        return getattr(self.model, name)


def run_inductor(out: Path, B: int, smoke: bool) -> None:
    # lazy: torch._dynamo is slow to import
    import torch._dynamo.utils
    checks._TRUSTED = _PlainFlag()  # before any check runs: see the module docstring
    t0 = time.perf_counter()
    s = _setup(out, B, smoke)
    # smoke: Dynamo's trace and AOTAutograd as on the GPU, without Inductor's C++ build (slow on a CPU)
    backend = "aot_eager" if smoke else "inductor"
    compiled = torch.compile(s.target.forward, backend=backend, dynamic=False)
    cuda = s.device.type == "cuda"
    ran = {}

    def build(graphs: bool):
        # decoding ahead as the fast rows' engines do by default on CUDA (with their graphs)
        engine = Engine(s.target, impl="reference", max_batch=B, max_seq_len=s.prompt_len + s.lengths[1] + 8,
                        cuda_graphs=False, overlap=graphs, preallocate=True)
        worker = engine.worker
        capacity = worker.cache.max_seq_len
        worker.attn_len = lambda extra: capacity
        worker.target = _DecodeCompiled(s.target, compiled, ran)
        if graphs or not cuda:  # a CPU runs the graphs' static buffers without capture
            engine._decode = DecodeGraphs(worker, capture=graphs).decode_step
        return engine, capacity

    graphs = cuda
    engine, capacity = build(graphs)
    notes = []
    last = {}

    def generate(n):
        last["outs"] = engine.generate(s.prompts, SamplingParams(max_new_tokens=n))

    try:
        generate(s.lengths[1])  # compiles, then captures the bucket's graph around the compiled forward
    except Exception as e:
        if not (graphs and ran):  # the compile itself failed: without graphs it would again
            raise
        _sync(s.device)  # raises when the failed capture left the context unusable: then the row is an error
        notes.append(f"compiled without CUDA graphs: capturing the compiled step failed ({last_line(e)})")
        graphs = False
        engine, capacity = build(False)
        generate(s.lengths[1])
    diffs = _timed_pairs(generate, s, warm=False)
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    where = "inside specdec's CUDA graphs" if graphs else ("without CUDA graphs" if cuda else
                                                          "through the graphs' static buffers, no capture (CPU)")
    notes.insert(0, f"torch.compile(backend={backend!r}, dynamic=False) of the target's decode forward {where}; "
                    f"attention over the cache's {capacity} slots every step (fixed shapes); {breaks} graph breaks")
    tokens = [o.token_ids for o in last["outs"]]
    row = _engine_row(s, f"reference_{backend}", graphs, diffs, tokens, target_reads(s.target), "; ".join(notes),
                      t0)
    writer(out, E2E).write(row)
    print(f"reference + {backend} B={B}: {row.tokens_per_s:.1f} tok/s; {row.note}", flush=True)


# ---- the profile ------------------------------------------------------------------------------------------
def run_profile(out: Path, B: int, smoke: bool) -> None:
    """The fast path's target-only decode step at B, captured as its CUDA graph by a short generate, then replayed:
    timed (CUDA events), then profiled. On a CPU the same static-buffer body, eagerly, with CPU activity."""
    s = _setup(out, B, smoke)
    cuda = s.device.type == "cuda"
    # Each replay advances the state in the graph's buffers (its last nodes copy the new state back): the cache
    # rows hold the generate's tokens and one position per replay (the first, the timed and the profiled ones).
    max_seq_len = s.prompt_len + 16 + 1 + TIMED_REPLAYS + PROFILED_REPLAYS
    engine = Engine(s.target, impl="fast", max_batch=B, max_seq_len=max_seq_len, cuda_graphs=cuda,
                    preallocate=True)
    graphs = engine._decode.__self__ if cuda else DecodeGraphs(engine.worker, capture=False)
    engine._decode = graphs.decode_step
    engine.generate(s.prompts, SamplingParams(max_new_tokens=4))  # compiles the kernels, captures the bucket's graph
    entry = next(e for e in graphs.entries.values() if e.bucket == B)
    replay = entry.graph.replay if cuda else functools.partial(graphs._run_body, entry)
    replay()
    times = time_calls(replay, s.device, 3 if smoke else TIMED_REPLAYS, warmup=False, sync_each=False)
    replays = 2 if smoke else PROFILED_REPLAYS
    kernels = profile_kernels(replay, s.device, replays)
    if not kernels:
        raise RuntimeError("the profiler recorded no device activity in the replays")
    w = writer(out, KERNELS)
    timer = "torch_profiler_cuda" if cuda else "torch_profiler_cpu"
    base = dict(s.run.prefix(), op="", impl="fast_graph" if cuda else "fast", dtype=dtype_name(s.target.dtype),
                batch_size=B, num_slots=1, num_draft_tokens=1, vocab_size=s.target.config.vocab_size,
                top_logprobs_num=0, rows="", repeats=replays, median_us="", p20_us="", p80_us="", bytes="", gbps="",
                copy_gbps="", frac_of_copy="", part="profile", check="profile", temperature="", num_splits="",
                splits_used="", programs_per_sm="", speedup_vs_reference="", speedup_basis="",
                max_abs_err_vs_float64="", finite="", within_tolerance="", tflops="", status="ok", error="")
    for name, calls, us in kernels:
        w.write(GpuKernelRow(**dict(base, timer=timer, op=name, calls=calls, total_us=us)))
    w.write(GpuKernelRow(**dict(base, timer="cuda_event" if cuda else "process_cpu_time", op="(total)",
                                calls=sum(k[1] for k in kernels), total_us=sum(k[2] for k in kernels),
                                median_us=statistics.median(times), p20_us=quantile(times, 0.2),
                                p80_us=quantile(times, 0.8))))
    print(f"profile: {len(kernels)} kernels, {sum(k[1] for k in kernels):g} launches, {sum(k[2] for k in kernels):.0f}"
          f" us of device time in a replay of {statistics.median(times):.0f} us", flush=True)


def profile_kernels(replay, device, replays: int) -> list[tuple[str, float, float]]:
    """`replays` calls of `replay` under torch.profiler -> (kernel name, launches per replay, device microseconds per
    replay), the heaviest first. On a CPU: the ops' self CPU time instead of kernels."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(replays):
            replay()
        _sync(device)
    totals: dict[str, list] = {}
    if cuda:
        for e in prof.events():
            if e.device_type == DeviceType.CUDA:  # kernels, memcpys and memsets, each a device interval
                t = totals.setdefault(e.name, [0, 0.0])
                t[0] += 1
                t[1] += e.time_range.elapsed_us()
    else:
        for a in prof.key_averages():
            if a.self_cpu_time_total > 0:
                totals[a.key] = [a.count, a.self_cpu_time_total]
    return sorted(((name, n / replays, us / replays) for name, (n, us) in totals.items()), key=lambda k: -k[2])


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter teardown: a crash in CUDA's or a compile pool's shutdown after the row is written must not turn
    # a measured configuration into a failed one (its rows are flushed as written)
    os._exit(code)
