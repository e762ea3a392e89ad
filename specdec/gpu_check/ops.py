"""The `decode_ops` part of `specdec gpu-check`: every op of a decode step besides the fused logprobs (which
`logprob_kernels` times at the same shapes) at decode shapes, reference vs fast, into kernels.csv beside the
copy ceiling.

A decode step of the EAGLE tree (S, K, W) = (5, 4, 16) on a 1.5B Llama (32 query / 8 KV heads of 64) over
Qwen's vocabulary (V = 151,936), bf16, at B = 32 and B = 1 (B = 32 first: the batch where kernels, not
launches, dominate): draft top-K softmax, tree build, tree attention over 1,024 committed tokens, the
penalties over the tree, the grammar bitmask, the sampling filters, both verifies and the KV commit.

Each (op, B) is one configuration: the op as a worker calls it (`reference`, `fast`: host work and a sync per
call, the like-for-like pair) and, on a GPU, the same op replayed from a CUDA graph (`reference_graph`,
`fast_graph`: the device time alone). A capture that fails (an op that syncs) is that row's error, not the
configuration's.
"""
from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path

import torch

from .parts import gpu_device, graph_timer_name, op_timer_name, gpu_run, error_writer, copy_ceiling
from .rows import KERNELS, GpuKernelRow, writer
from .runner import Config, last_line, run_configs
from ..bench.common import DTYPES, time_calls, dtype_name, quantile
from ..bench.suites.kernels import commit_case, penalty_case, sampling_cases, tree_cases, OpCase, time_rotated
import reference

#: (B, S+1 of a chain, V, dtype, attention shape (W, Hq, Hkv, D, committed tokens)) on a GPU and in smoke mode.
GPU_SHAPE = dict(sizes=(32, 1), T=4, V=151936, dtype="bfloat16", attention=(16, 32, 8, 64, 1024))
SMOKE_SHAPE = dict(sizes=(2,), T=2, V=301, dtype="float32", attention=(4, 4, 2, 16, 12))
#: The ops in the order measured: the tree's path first (draft, build, attention, verify), then the rest.
OPS = ("softmax_topk", "build_tree_kernel_efficient", "tree_attention", "apply_penalties_tree",
       "apply_token_bitmask", "softmax_with_temperature", "top_k_renorm_prob", "top_p_renorm_prob",
       "verify_tree_greedy", "tree_speculative_sampling_target_only", "commit_kv_cache")
SMOKE_OPS = ("softmax_topk", "build_tree_kernel_efficient", "tree_attention", "apply_penalties_tree",
             "apply_token_bitmask", "verify_tree_greedy")


def run_decode_ops(out: Path, smoke: bool) -> None:
    device = gpu_device(smoke)
    shape = SMOKE_SHAPE if smoke else GPU_SHAPE
    w = writer(out, KERNELS)
    run = functools.lru_cache(None)(lambda: gpu_run(device))
    copy = functools.lru_cache(None)(lambda: copy_ceiling(out, device, smoke))
    configs = []
    for B in shape["sizes"]:
        for op in SMOKE_OPS if smoke else OPS:
            fields = dict(part="decode_ops", check="decode", op=op, batch_size=B, dtype=shape["dtype"])
            configs.append(Config(f"{op} B={B}", functools.partial(_measure_op, op, B, shape, device, run, copy, w,
                                                                   2 if smoke else 20, not smoke),
                                  KERNELS, fields, headline=B == shape["sizes"][0]))
    run_configs("decode_ops", configs, error_writer(out))


def op_case(op: str, B: int, shape: dict, device, gen):
    """The `kernels.OpCase` of `op` at batch size B."""
    V, T, dtype = shape["V"], shape["T"], DTYPES[shape["dtype"]]
    if op in ("build_tree_kernel_efficient", "verify_tree_greedy", "tree_speculative_sampling_target_only"):
        return next(c for c in tree_cases(B, V, device, gen) if c.op == op)
    if op in ("softmax_with_temperature", "top_k_renorm_prob", "top_p_renorm_prob"):
        return next(c for c in sampling_cases(B, T, V, dtype, device, gen) if c.op == op)
    if op == "apply_penalties_tree":
        return penalty_case(B, T, V, dtype, device, gen)
    if op == "commit_kv_cache":
        small = {} if device.type == "cuda" else dict(layers=2, kv_heads=2, head_dim=16, max_seq=32)
        return commit_case(B, T, dtype, device, gen, **small)
    if op == "apply_token_bitmask":
        return bitmask_case(B * 16, V, dtype, device, gen)
    if op == "tree_attention":
        return attention_case(B, *shape["attention"], dtype, device, gen)
    if op == "softmax_topk":
        return topk_case(B * 4, V, dtype, device, gen)
    raise ValueError(f"unknown op {op!r}; expected one of {', '.join(OPS)}")


def bitmask_case(N: int, V: int, dtype, device, gen):
    """`apply_token_bitmask` on N rows (a tree's nodes): the logits read, the packed mask read, fp32 written."""
    logits = torch.randn(N, V, generator=gen, device=device).to(dtype)
    words = -(-V // 32)
    bitmask = torch.randint(-2**31, 2**31 - 1, (N, words), generator=gen, device=device, dtype=torch.int64)
    bitmask = bitmask.to(torch.int32)
    moved = N * V * (logits.element_size() + 4) + N * words * 4
    return OpCase("apply_token_bitmask", dtype, N // 16, 16, 16, V, 0, N, moved,
                  lambda ops: ops.apply_token_bitmask(logits, bitmask))


def topk_case(N: int, V: int, dtype, device, gen):
    """The draft's `softmax_topk` (K = 4) over N rows: the logits read once."""
    logits = torch.randn(N, V, generator=gen, device=device).to(dtype)
    return OpCase("softmax_topk", dtype, N // 4, 1, 4, V, 0, N, N * V * logits.element_size(),
                  lambda ops: ops.softmax_topk(logits, 4))


def attention_case(B: int, T: int, Hq: int, Hkv: int, D: int, context: int, dtype, device, gen):
    """`tree_attention` of a W = T node tree (causal over the in-flight nodes) after `context` committed
    tokens: every key and value of the request read once, the queries read and the output written."""
    max_seq = context + T + 16
    q = torch.randn(B, T, Hq, D, generator=gen, device=device).to(dtype)
    k_cache = torch.randn(B, max_seq, Hkv, D, generator=gen, device=device).to(dtype)
    v_cache = torch.randn(B, max_seq, Hkv, D, generator=gen, device=device).to(dtype)
    slots = torch.arange(B, device=device)
    start = torch.full((B,), context, dtype=torch.int64, device=device)
    mask = torch.ones(T, T, dtype=torch.bool, device=device).tril().expand(B, T, T).contiguous()
    elt = q.element_size()
    moved = 2 * B * (context + T) * Hkv * D * elt + 2 * B * T * Hq * D * elt
    return OpCase("tree_attention", dtype, B, T, T, 0, 0, B * T, moved,
                  lambda ops: ops.tree_attention(q, k_cache, v_cache, slots, start, 0, mask, context + T, D ** -0.5))


def _measure_op(op: str, B: int, shape: dict, device, run, copy, w, repeats: int, graphs: bool) -> None:
    # lazy: fast imports triton
    import fast


    t0 = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(0)
    case = op_case(op, B, shape, device, gen)
    median = {}
    impls = [("reference", reference, False), ("fast", fast, False)]
    if graphs:
        impls += [("reference_graph", reference, True), ("fast_graph", fast, True)]
    for impl, ops, graphed in impls:
        call = functools.partial(case.run, ops)
        try:
            times = time_rotated([call], device, repeats) if graphed else time_calls(call, device, repeats)
        except Exception as e:  # a capture that fails is this row's error, if the context survived it
            if not graphed:
                raise
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # raises when it did not: the configuration fails, the part restarts
            w.write(_op_row(run(), case, impl, graph_timer_name(device), None, copy(), None, "", last_line(e)))
            continue
        med = statistics.median(times)
        median[impl] = med
        ref = median.get("reference_graph" if graphed else "reference") if impl.startswith("fast") else None
        timer = graph_timer_name(device) if graphed else op_timer_name(device)
        w.write(_op_row(run(), case, impl, timer, times, copy(),
                        ref, f"{'reference_graph/fast_graph' if graphed else 'reference/fast'}" if ref else "", ""))
    print(f"{op} B={B} [{time.perf_counter() - t0:.1f} s]", flush=True)


def _op_row(run, case, impl, timer, times, copy_gbps, ref_us, basis, error) -> GpuKernelRow:
    med = statistics.median(times) if times else ""
    gbps = case.bytes / med / 1e3 if times else ""
    return GpuKernelRow(
        **run.prefix(), timer=timer, op=case.op, impl=impl, dtype=dtype_name(case.dtype), batch_size=case.batch_size,
        num_slots=case.num_slots, num_draft_tokens=case.num_draft_tokens, vocab_size=case.vocab_size,
        top_logprobs_num=case.top_logprobs_num, rows=case.rows, repeats=len(times) if times else 0, median_us=med,
        p20_us=quantile(times, 0.2) if times else "", p80_us=quantile(times, 0.8) if times else "", bytes=case.bytes,
        gbps=gbps, copy_gbps=copy_gbps, frac_of_copy=gbps / copy_gbps if times else "", part="decode_ops",
        check="decode", temperature="", num_splits="", splits_used="", programs_per_sm="",
        speedup_vs_reference=ref_us / med if ref_us and times else "", speedup_basis=basis,
        max_abs_err_vs_float64="", finite="", within_tolerance="", tflops="", calls="", total_us="",
        status="error" if error else "ok", error=error)
