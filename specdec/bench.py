"""Benchmarks: one tidy CSV schema for every run, written to results/; plots only read the CSVs.

Each row is one (worker, spec, batch size, temperature) measured against the target-only baseline
of the same run: mean accepted tokens per verify step (bonus included), tokens/s, speedup, and
whether tokens (greedy) and logprobs match the baseline.
"""
from __future__ import annotations

import csv
import datetime as _dt
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from . import Engine, SamplingParams, SpecConfig

COLUMNS = ["run_id", "timestamp", "commit", "device", "torch", "triton", "impl", "dtype", "model", "worker",
           "num_steps", "topk", "num_draft_tokens", "batch_size", "temperature", "num_prompts", "prompt_len",
           "max_new_tokens", "decode_steps", "tokens", "wall_s", "tokens_per_s", "mean_accept_len",
           "speedup_vs_target_only", "same_tokens_as_target_only", "max_logprob_diff"]


@dataclass
class BenchCase:
    worker: str  # "target-only", "eagle", "mtp" (MiMo style) or "mtp_chain" (Step-3.5 style)
    spec: SpecConfig | None


def environment(device) -> dict:
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True,
                                text=True, cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    try:
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


def _measure(engines, batches, params, repeats):
    """Best-of-`repeats` wall time of every engine on every batch, the engines taken round-robin so
    that a drift of the machine's speed lands on all of them alike. -> per engine: (outs, wall, steps,
    tokens, accept_lens)."""
    for engine in engines:  # warm-up
        engine.generate(batches[0][:1], SamplingParams(max_new_tokens=4))
    best = [[None] * len(batches) for _ in engines]
    for _ in range(repeats):
        for e, engine in enumerate(engines):
            for i, batch in enumerate(batches):
                outs = engine.generate(batch, params, seed=0)
                if best[e][i] is None or engine.last_stats.wall_s < best[e][i][1].wall_s:
                    best[e][i] = (outs, engine.last_stats)
    results = []
    for per_batch in best:
        outs = [o for os_, _ in per_batch for o in os_]
        results.append((outs, sum(st.wall_s for _, st in per_batch), sum(st.num_decode_steps for _, st in per_batch),
                        sum(st.num_tokens for _, st in per_batch), [a for o in outs for a in o.accept_lens]))
    return results


def run_benchmark(target, drafts: dict, cases: list[BenchCase], prompts: list[list[int]], batch_sizes, temperatures,
                  max_new_tokens: int, model_name: str, impl="reference", repeats=1, out_dir="results",
                  tag="bench", progress=print) -> Path:
    """Measure every case at every batch size and temperature; write one CSV; return its path.

    `drafts` maps a case's worker name to its draft model; the first case must be target-only (the
    baseline of the speedup column). Prompts are taken in order, B at a time, over all of `prompts`
    (so each batch size decodes the same prompts). Decoding asks for logprobs, as a researcher
    checking losslessness would.
    """
    if not cases or cases[0].worker != "target-only":
        raise ValueError("the first benchmark case must be target-only (the speedup baseline)")
    env = environment(target.device)
    run_id = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    rows = []
    max_len = max(len(p) for p in prompts) + max_new_tokens + 64
    for temperature in temperatures:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, return_logprob=True)
        for B in batch_sizes:
            batches = [prompts[i:i + B] for i in range(0, len(prompts) - B + 1, B)]
            engines = [Engine(target, drafts.get(c.worker) if c.spec else None, c.spec, impl=impl, max_batch=B,
                              max_seq_len=max_len) for c in cases]
            measured = _measure(engines, batches, params, repeats)
            base_outs, base_wall, _, base_tokens, _ = measured[0]
            base_tps = base_tokens / base_wall
            for case, (outs, wall, steps, tokens, acc) in zip(cases, measured):
                tps = tokens / wall
                same = all(a.token_ids == b.token_ids for a, b in zip(outs, base_outs))
                lp = [abs(x - y) for a, b in zip(outs, base_outs) if a.token_ids == b.token_ids
                      for x, y in zip(a.logprobs, b.logprobs)]
                spec = case.spec
                row = dict(run_id=run_id, timestamp=_dt.datetime.now().isoformat(timespec="seconds"), **env, impl=impl,
                           dtype=str(target.dtype).replace("torch.", ""), model=model_name, worker=case.worker,
                           num_steps=spec.num_steps if spec else 0, topk=spec.topk if spec else 0,
                           num_draft_tokens=spec.num_draft_tokens if spec else 1, batch_size=B,
                           temperature=temperature, num_prompts=len(outs),
                           prompt_len=sum(len(p) for b in batches for p in b) / len(outs),
                           max_new_tokens=max_new_tokens, decode_steps=steps, tokens=tokens, wall_s=round(wall, 4),
                           tokens_per_s=round(tps, 2),
                           mean_accept_len=round(sum(acc) / len(acc), 4) if acc else "",
                           speedup_vs_target_only=round(tps / base_tps, 4),
                           same_tokens_as_target_only=same if temperature == 0 else "",
                           max_logprob_diff=f"{max(lp):.2e}" if lp else "")
                rows.append(row)
                shape = f"S={spec.num_steps} K={spec.topk} W={spec.num_draft_tokens}" if spec else ""
                progress(f"T={temperature} B={B} {case.worker:12s} {shape:16s} tok/s {tps:8.1f} "
                         f"accept {row['mean_accept_len'] or 1:.2f} speedup {row['speedup_vs_target_only']:.2f}")
    return write_csv(rows, COLUMNS, out_dir, f"{tag}-{run_id}.csv")


def write_csv(rows: list[dict], columns: list[str], out_dir, name: str) -> Path:
    """One benchmark run's rows -> `out_dir/name` (the directory is created), in `columns` order."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    return path


DEFAULT_CASES = [
    BenchCase("target-only", None),
    BenchCase("eagle", SpecConfig(5, 4, 16)),
    BenchCase("eagle", SpecConfig(3, 1, 4)),
    BenchCase("mtp", SpecConfig(3)),
    BenchCase("mtp_chain", SpecConfig(3)),
]


def main_bench(args) -> int:
    """`specdec bench`: the shipped models on held-out prompts; one CSV + its plot in args.out."""
    from . import zoo
    from .plots import load_results, plot_acceptance_and_speedup
    from .zoo.corpus import heldout_prompts

    if args.threads:
        torch.set_num_threads(args.threads)
    bundle = zoo.load()
    drafts = {"eagle": bundle.eagle, "mtp": bundle.mtp, "mtp_chain": bundle.mtp_chain}
    prompts = heldout_prompts(args.num_prompts, args.prompt_len, seed=0)
    path = run_benchmark(bundle.target, drafts, DEFAULT_CASES, prompts,
                         [int(b) for b in (args.batch_sizes or "1,4").split(",")],
                         [float(t) for t in args.temperatures.split(",")], args.max_new_tokens,
                         model_name=bundle.name, impl=args.impl, repeats=args.repeats, out_dir=args.out,
                         tag="acceptance")
    png = plot_acceptance_and_speedup(load_results(args.out, path.name), path.with_suffix(".png"))
    print(f"wrote {path} and {png}")
    return 0
