"""`specdec bench --suite kernels`: every op of the decode step, reference / fast / reference under
`torch.compile`, against the bandwidth of a plain device-to-device copy measured in the same run.

One tidy CSV per run (`results/kernels-<run_id>.csv`, schema in results/README.md) and its plot.
On a machine without CUDA only the reference and compiled rows are speed: the fast kernels run
under Triton's interpreter there, so their rows are skipped (with a printed note), never recorded.
"""
from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ...ops.logprob_types import LogitsOutput, SamplingInfo, SpecBatch
from ..common import Run, RunRow, dtype_name, quantile, time_calls, time_in_turn
import reference
from ..report.figures import load_results
from ..report.plots import plot_kernels


@dataclass
class KernelRow(RunRow):
    """One (op, impl, dtype, shape) of `specdec bench --suite kernels` (results/README.md)."""

    timer: str
    op: str
    impl: str
    dtype: str
    batch_size: int
    num_slots: int
    num_draft_tokens: int
    vocab_size: int
    top_logprobs_num: int
    rows: int
    repeats: int
    median_us: float
    p20_us: float
    p80_us: float
    bytes: int
    gbps: float
    copy_gbps: float
    frac_of_copy: float


#: The sweep the issue asks for on a GPU (B, S+1, V); `--quick` (the default on CPU) takes a corner of it.
GPU_SWEEP = dict(batch_sizes=(1, 8, 32, 128), num_slots=(2, 4, 8), vocab_sizes=(32000, 128256, 151936, 151937))
CPU_SWEEP = dict(batch_sizes=(1, 8), num_slots=(2, 4), vocab_sizes=(32000, 151937))


@dataclass
class OpCase:
    """One op at one shape: `run(ops)` calls the op of module `ops` on inputs built once; `bytes` is
    what the op must move at the least (its inputs read once, its outputs written once)."""

    op: str
    dtype: torch.dtype
    batch_size: int
    num_slots: int
    num_draft_tokens: int
    vocab_size: int
    top_logprobs_num: int
    rows: int
    bytes: int
    run: Callable
    #: The fast kernels' launch alone, without the op's checks and host packing: `launches(copies)` -> one
    #: call per rotated copy of the inputs (None for an op without a separate launcher).
    launches: Callable | None = None
    #: The tensors and batch `run` reads, by name (for checks of the outputs against an oracle).
    inputs: dict = field(default_factory=dict)


def logprob_case(B, T, V, dtype, top_k, device, gen) -> OpCase:
    """A chain step (W = S + 1) where every node is accepted: B*T rows of V logits are read."""
    W = T
    logits = torch.randn(B * W, V, generator=gen, device=device).to(dtype)
    predict = torch.randint(V, (B * W,), generator=gen, device=device)
    accept = (torch.arange(B)[:, None] * W + torch.arange(T)).to(device=device, dtype=torch.int32)
    temps = 0.5 + torch.rand(B, 1, generator=gen, device=device)
    batch = SpecBatch(seq_lens=torch.full((B,), 100, device=device), sampling_info=SamplingInfo(temps, False),
                      top_logprobs_nums=[top_k] * B, token_ids_logprobs=None)

    def run(ops):
        ops.compute_spec_v2_logprobs(batch, LogitsOutput(next_token_logits=logits), predict, accept, T - 1)

    moved = B * T * V * logits.element_size() + B * T * (4 + 8 * top_k)
    return OpCase("compute_spec_v2_logprobs", dtype, B, T, W, V, top_k, B * T, moved, run,
                  functools.partial(logprob_launches, logits, predict, accept, temps, top_k),
                  dict(batch=batch, logits=logits, predict=predict, accept=accept, temps=temps))


def logprob_launches(logits, predict, accept, temps, top_k, copies: int, num_splits=None) -> list[Callable]:
    """The fused logprob kernels' launches (`fast.logprobs.compute_spec_v2_logprobs_launch`) over `copies`
    copies of the logits (the first is `logits` itself), with the launch arguments the op passes; `num_splits`
    forces the vocabulary split count (None: the op's heuristic)."""
    # lazy: fast imports triton
    import triton

    from fast.logprobs import compute_spec_v2_logprobs_launch

    keys = triton.next_power_of_2(top_k) if top_k else 0
    inputs = [logits] + [logits.clone() for _ in range(copies - 1)]
    return [functools.partial(compute_spec_v2_logprobs_launch, x, predict, accept, temps, None, keys,
                              _num_splits=num_splits) for x in inputs]


def sampling_cases(B, T, V, dtype, device, gen) -> list[OpCase]:
    """The target distribution of a verify: softmax(logits / T), then the top-k and top-p filters."""
    N = B * T
    logits = torch.randn(N, V, generator=gen, device=device).to(dtype) * 3
    temps = 0.5 + torch.rand(N, generator=gen, device=device)
    probs = torch.softmax(logits.float(), -1)
    top_ks = torch.randint(1, 64, (N,), generator=gen, device=device)
    top_ps = 0.5 + 0.5 * torch.rand(N, generator=gen, device=device)
    elt = logits.element_size()
    return [
        OpCase("softmax_with_temperature", dtype, B, T, T, V, 0, N, N * V * (elt + 4),
               lambda ops: ops.softmax_with_temperature(logits, temps)),
        OpCase("top_k_renorm_prob", torch.float32, B, T, T, V, 0, N, N * V * 8,
               lambda ops: ops.top_k_renorm_prob(probs, top_ks)),
        OpCase("top_p_renorm_prob", torch.float32, B, T, T, V, 0, N, N * V * 8,
               lambda ops: ops.top_p_renorm_prob(probs, top_ps)),
    ]


def tree_cases(B, V, device, gen) -> list[OpCase]:
    """Tree build and both verifies for the EAGLE tree (S, K, W) = (5, 4, 16), drafted by the reference."""
    S, K, W = 5, 4, 16
    score_list, token_list, parents_list = [], [], []
    topk_p = torch.rand(B, K, generator=gen, device=device).sort(-1, descending=True).values
    topk_index = torch.randint(V, (B, K), generator=gen, device=device)
    hidden = torch.zeros(B, 8, device=device)
    scores = None
    for i in range(S):
        _, hidden, scores, info = reference.select_top_k_tokens(i, topk_p, topk_index, hidden, scores, K)
        for lst, x in zip((score_list, token_list, parents_list), info):
            lst.append(x)
        topk_p = torch.rand(B * K, K, generator=gen, device=device).sort(-1, descending=True).values
        topk_index = torch.randint(V, (B * K, K), generator=gen, device=device)
    parent_list, tsi, draft_tokens = reference.organize_draft_results(score_list, token_list, parents_list, W)
    bonus = torch.randint(V, (B,), generator=gen, device=device)
    seq_lens = torch.full((B,), 100, dtype=torch.int64, device=device)
    build_args = (bonus, parent_list, tsi, draft_tokens, seq_lens, K, S, W)
    _, _, ri, nt, ns, flat = reference.build_tree_kernel_efficient(*build_args)
    cand = flat.view(B, W)
    target_predict = torch.where(torch.rand(B, W, generator=gen, device=device) < 0.7, cand, 0)
    probs = torch.softmax(torch.randn(B, W, V, generator=gen, device=device) * 3, -1)
    u = torch.rand(B, W, generator=gen, device=device)
    u_final = torch.rand(B, generator=gen, device=device)
    tree_bytes = B * W * (W // 8 + 5 * 8)
    return [
        OpCase("build_tree_kernel_efficient", torch.int64, B, S + 1, W, 0, 0, B, tree_bytes,
               lambda ops: ops.build_tree_kernel_efficient(*build_args)),
        OpCase("verify_tree_greedy", torch.int64, B, S + 1, W, 0, 0, B, B * W * 5 * 8,
               lambda ops: ops.verify_tree_greedy(cand, ri, nt, ns, target_predict, S)),
        # at the least, the residual row of each request's last accepted node is read whole
        OpCase("tree_speculative_sampling_target_only", torch.float32, B, S + 1, W, V, 0, B, B * V * 4,
               lambda ops: ops.tree_speculative_sampling_target_only(cand, ri, nt, ns, u, u_final, probs, S)),
    ]


def penalty_case(B, T, V, dtype, device, gen) -> OpCase:
    """`apply_penalties_tree` on a chain of T nodes per request, every penalty on: the logits are read and the
    penalised fp32 rows written once, each request's counts, masks and bias read once."""
    logits = torch.randn(B * T, V, generator=gen, device=device).to(dtype)
    candidates = torch.randint(V, (B, T), generator=gen, device=device)
    tree_mask = torch.ones(T, T, dtype=torch.bool, device=device).tril().expand(B, T, T)
    per_request = dict(
        output_counts=torch.randint(0, 2, (B, V), generator=gen, device=device, dtype=torch.int32),
        prompt_mask=torch.rand(B, V, generator=gen, device=device) < 0.01,
        output_lens=torch.full((B,), 50, device=device), frequency_penalties=torch.full((B,), 0.5, device=device),
        presence_penalties=torch.full((B,), 0.5, device=device),
        repetition_penalties=torch.full((B,), 1.1, device=device), min_new_tokens=torch.zeros(B, dtype=torch.int64,
                                                                                               device=device),
        stop_mask=torch.zeros(B, V, dtype=torch.bool, device=device), logit_bias=torch.zeros(B, V, device=device))
    moved = B * T * V * (logits.element_size() + 4) + B * V * (4 + 1 + 1 + 4)
    return OpCase("apply_penalties_tree", dtype, B, T, T, V, 0, B * T, moved,
                  lambda ops: ops.apply_penalties_tree(logits, candidates, tree_mask, **per_request))


def commit_case(B, T, dtype, device, gen, layers=32, kv_heads=8, head_dim=128, max_seq=512) -> OpCase:
    """A Llama-8B-shaped cache (32 layers, 8 KV heads of 128): every accepted node but the root moves."""
    W = 2 * T
    kv = torch.zeros(2 * layers, B, max_seq, kv_heads, head_dim, dtype=dtype, device=device)
    slots = torch.arange(B, device=device)
    seq_lens = torch.full((B,), 100, device=device)
    nodes = torch.cat([torch.zeros(1, dtype=torch.int64), torch.arange(2, 2 * T, 2)[:T - 1]])
    accept = (torch.arange(B)[:, None] * W + nodes).to(device=device, dtype=torch.int32)
    moved = 2 * (2 * layers) * B * (T - 1) * kv_heads * head_dim * kv.element_size()
    return OpCase("commit_kv_cache", dtype, B, T, W, 0, 0, B * T, moved,
                  lambda ops: ops.commit_kv_cache(kv, slots, seq_lens, accept, W))


def time_rotated(calls: list[Callable], device, repeats: int) -> list[float]:
    """Per-call microseconds of `calls` (the same work, each on its own copy of the inputs) run back to back.

    On CUDA: warmed up on a side stream (compiles), captured once as one CUDA graph of every call, replayed
    `repeats` times with events around each replay and divided by the calls. No host work is timed, and
    each call reads inputs the previous one did not leave in L2 (given enough copies). On a CPU: process
    time of each call in turn."""
    device = torch.device(device)
    if device.type != "cuda":
        return time_in_turn(calls, device, repeats)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize(device)
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / len(calls))
    return out


def rotation_copies(device, nbytes: int, most: int = 256) -> int:
    """Copies of a case's inputs that together exceed twice the device's L2 (1 on a CPU): rotating through
    them, no call finds its inputs left in L2 by the one before."""
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
    return max(1, min(most, -(-2 * l2 // max(nbytes, 1))))


#: Bytes the copy ceiling moves per measured round on CUDA: far beyond any L2, so it is DRAM bandwidth.
COPY_CEILING_BYTES = 2 << 30


def copy_bandwidth(device, nbytes: int = COPY_CEILING_BYTES, repeats: int = 10, chunks: int = 4) -> float:
    """GB/s of device-to-device copies (read + write counted once each, like the ops' bytes).

    On CUDA: `chunks` source buffers of together `max(nbytes, 2 GiB)` copied in turn into as many
    destinations, all the copies in one CUDA graph (`time_rotated`), so neither the host nor L2 is measured.
    On a CPU: `nbytes` (at least 512 KiB) in one buffer, process time per copy."""
    device = torch.device(device)
    if device.type == "cuda":
        n = max(nbytes, COPY_CEILING_BYTES) // chunks // 4
        pairs = [(torch.empty(n, device=device).fill_(1.0), torch.empty(n, device=device)) for _ in range(chunks)]
        us = statistics.median(time_rotated([functools.partial(dst.copy_, src) for src, dst in pairs], device,
                                            repeats))
        return 2 * n * 4 / us / 1e3
    n = max(nbytes // 2 // 4, 1 << 16)
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    us = statistics.median(time_calls(lambda: dst.copy_(src), device, repeats))
    return 2 * n * 4 / us / 1e3


def run_kernel_benchmark(device="cuda", impls=("reference", "fast", "compiled"), batch_sizes=None, num_slots=None,
                         vocab_sizes=None, dtypes=(torch.bfloat16, torch.float32), top_logprobs_nums=(0, 5),
                         repeats=20, out_dir="results", progress=print) -> Path:
    """Measure every op at every shape of the sweep; write one CSV; return its path."""
    device = torch.device(device)
    sweep = GPU_SWEEP if device.type == "cuda" else CPU_SWEEP
    batch_sizes = batch_sizes or sweep["batch_sizes"]
    num_slots = num_slots or sweep["num_slots"]
    vocab_sizes = vocab_sizes or sweep["vocab_sizes"]
    modules = {"reference": reference}
    if "fast" in impls:
        if device.type != "cuda":
            progress("note: no CUDA device, so the fast kernels would run under Triton's interpreter: "
                     "their rows are skipped (interpreted time is not speed)")
        else:
            # lazy: fast imports triton; torch._dynamo is slow to import
            import fast
            modules["fast"] = fast
    compiled = {}
    if "compiled" in impls:
        # each shape, list of top-k counts and step count is a new guard: without room for them dynamo
        # stops compiling after 8 variants and silently runs the rest eagerly
        import torch._dynamo.config as dynamo_config
        for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                     "accumulated_cache_size_limit"):
            if hasattr(dynamo_config, knob):
                setattr(dynamo_config, knob, 4096)
    run = Run("kernels", device)
    gen = torch.Generator(device=device).manual_seed(0)  # inputs drawn on the device, one case at a time

    def cases():
        for dtype in dtypes:
            for B in batch_sizes:
                for T in num_slots:
                    for V in vocab_sizes:
                        for k in top_logprobs_nums:
                            yield logprob_case(B, T, V, dtype, k, device, gen)
        for B in batch_sizes:
            for T in num_slots[:1]:
                for V in vocab_sizes[-1:]:
                    for dtype in dtypes:
                        yield from sampling_cases(B, T, V, dtype, device, gen)
            for T in num_slots:
                yield penalty_case(B, T, vocab_sizes[-1], dtypes[0], device, gen)
            yield from tree_cases(B, vocab_sizes[-1], device, gen)
            for T in num_slots:
                yield commit_case(B, T, dtypes[0], device, gen)

    # on CUDA one ceiling for the run, far past L2; on a CPU the copy of each case's own bytes
    copy_gbps = {None: copy_bandwidth(device)} if device.type == "cuda" else {}
    rows = []
    for case in cases():
        key = None if device.type == "cuda" else case.bytes
        if key not in copy_gbps:
            copy_gbps[key] = copy_bandwidth(device, case.bytes, repeats)
        timed = list(impls) + (["fast_kernels"] if "fast" in modules and case.launches is not None else [])
        for impl in timed:
            timer = "cuda_event" if device.type == "cuda" else "process_cpu_time"
            if impl == "fast_kernels":
                t0 = time.perf_counter()
                times = time_rotated(case.launches(rotation_copies(device, case.bytes)), device, repeats)
                timer = "cuda_graph"
            elif impl == "compiled":
                fn = compiled.setdefault(case.op, torch.compile(getattr(reference, case.op), dynamic=True))
                t0 = time.perf_counter()
                times = time_calls(functools.partial(case.run, _Namespace(**{case.op: fn})), device, repeats)
            elif impl in modules and hasattr(modules[impl], case.op):
                t0 = time.perf_counter()
                times = time_calls(functools.partial(case.run, modules[impl]), device, repeats)
            else:
                continue
            med = statistics.median(times)
            gbps = case.bytes / med / 1e3
            rows.append(KernelRow(**run.prefix(), timer=timer, op=case.op, impl=impl, dtype=dtype_name(case.dtype),
                                  batch_size=case.batch_size, num_slots=case.num_slots,
                                  num_draft_tokens=case.num_draft_tokens, vocab_size=case.vocab_size,
                                  top_logprobs_num=case.top_logprobs_num, rows=case.rows, repeats=repeats,
                                  median_us=round(med, 2), p20_us=round(quantile(times, 0.2), 2),
                                  p80_us=round(quantile(times, 0.8), 2), bytes=case.bytes, gbps=round(gbps, 3),
                                  copy_gbps=round(copy_gbps[key], 3), frac_of_copy=round(gbps / copy_gbps[key], 4)))
            progress(f"{case.op:38s} {impl:9s} {rows[-1].dtype:8s} B={case.batch_size:<4d} S+1={case.num_slots} "
                     f"V={case.vocab_size:<6d} k={case.top_logprobs_num:<2d} {med:10.1f} us  "
                     f"{gbps:7.1f} GB/s ({rows[-1].frac_of_copy:.0%} of copy)  [{time.perf_counter() - t0:.1f} s]")
    return run.write(rows, out_dir)


class _Namespace:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def main_kernels(args) -> int:
    """`specdec bench --suite kernels`: the sweep on this machine's device; one CSV + its plot in args.out."""
    device = args.device
    path = run_kernel_benchmark(device, repeats=args.repeats if device == "cuda" else max(args.repeats, 5),
                                out_dir=args.out)
    png = plot_kernels(load_results(args.out, path.name), path.with_suffix(".png"))
    print(f"wrote {path} and {png}")
    return 0
