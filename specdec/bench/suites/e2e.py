"""`specdec bench --suite e2e`: every worker end to end, reference / fast / fast + CUDA graphs, with the
time of one decode step split into its phases.

One tidy CSV per run (`results/e2e-<run_id>.csv`, schema in results/README.md). Models: the shipped
`stdlib-byte-6l` (trained drafts) and, on a GPU, a random-weight Llama of Llama-3.2-1B's shapes with an untied LM
head (`random-llama-1.5b`: 1.5B parameters, V = 128,256, bf16; random drafts, so about one token per step: the rows
measure each path's cost, not acceptance). Greedy decoding; every impl's tokens are checked against the reference's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import Engine, SamplingParams, zoo
from ...workers.base import PhaseTimer
from ..cases import CASES, by_kind
from ..common import Run, RunRow, dtype_name, quantile
from ...zoo.corpus import heldout_prompts
from ...models import random_llama
from ...draft_kinds import DRAFT_KINDS
from ..report.figures import load_results
from ..report.plots import plot_e2e

PHASES = ("draft", "verify_forward", "verify", "logprobs", "draft_extend")
#: (impl, cuda_graphs) in the order measured; graphs only where there is CUDA.
IMPLS = (("reference", False), ("fast", False), ("fast", True))


@dataclass
class E2ECase(RunRow):
    """The columns that say what an end-to-end row measured: the model, the worker, the implementation, the
    workload. `E2ERow` here and gpu-check's e2e rows go on from them."""

    model: str
    params_m: float
    dtype: str
    worker: str
    label: str
    num_steps: int
    topk: int
    num_draft_tokens: int
    impl: str
    cuda_graphs: bool
    batch_size: int
    prompt_len: int
    max_new_tokens: int
    repeats: int
    decode_steps: int


@dataclass
class E2ERow(E2ECase):
    """One (model, worker, impl, CUDA graphs, batch size) of `specdec bench --suite e2e` (results/README.md)."""

    tokens: int
    tokens_per_s: float
    tokens_per_s_p20: float
    tokens_per_s_p80: float
    mean_accept_len: float | str
    speedup_vs_reference: float
    same_tokens_as_reference: bool
    step_ms: float | str
    draft_ms: float | str
    verify_forward_ms: float | str
    verify_ms: float | str
    logprobs_ms: float | str
    draft_extend_ms: float | str


@dataclass
class E2EModel:
    name: str
    target: object
    drafts: dict  # worker kind -> draft model
    prompts: list[list[int]]


def shipped_model(num_prompts: int, prompt_len: int, device, dtype=torch.float32) -> E2EModel:
    b = zoo.load(zoo.SMALL_NAME)
    cast = dict(device=device, dtype=dtype)
    drafts = {kind: draft.to(**cast) for kind, draft in b.drafts.items()}
    return E2EModel(b.name, b.target.to(**cast), drafts, heldout_prompts(num_prompts, prompt_len, seed=0))


#: Llama-3.2-1B's shapes (hidden 2048, 16 layers, 32 heads / 8 KV heads, MLP 8192, V 128,256) with an untied LM head
RANDOM_1B_SHAPES = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                        num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False,
                        max_position_embeddings=4096)
#: `random_1b_target`'s name in every CSV: 1.5B parameters, since its 128,256 x 2,048 embedding and LM head are two
#: matrices; files written before the name was fixed call it random-llama-1.2b (`figures.MODEL_RENAMES`)
RANDOM_1B_NAME = "random-llama-1.5b"


def random_1b_target(device, dtype=torch.bfloat16):
    """A random Llama of `RANDOM_1B_SHAPES` (`RANDOM_1B_NAME`), drawn on `device`."""
    return random_llama(**RANDOM_1B_SHAPES, seed=0, dtype=dtype, device=device)


def random_1b_model(num_prompts: int, prompt_len: int, device, dtype=torch.bfloat16) -> E2EModel:
    """`random_1b_target` with a random draft of every kind that runs in the e2e suite (`DraftKind.random_draft`)."""
    target = random_1b_target(device, dtype)
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(128256, (num_prompts, prompt_len), generator=gen).tolist()
    drafts = {kind.name: kind.new_random_draft(target) for kind in DRAFT_KINDS.values()
              if kind.e2e_specs and kind.random_draft}
    return E2EModel(RANDOM_1B_NAME, target, drafts, prompts)


def _measure(engine: Engine, batches, params, repeats: int, phases: bool):
    """Over `repeats` passes over all batches (after a warm-up pass): the median tokens/s, p20 and p80, and
    from the median pass its outputs, decode steps, tokens, wall time and phase times."""
    engine.generate(batches[0], params)  # warm-up: Triton compiles, graphs are captured
    for batch in batches:  # a draft's work per request (a scripted draft's scripts), untimed
        engine.prepare(batch, params)
    worker = engine.worker
    passes = []
    for _ in range(repeats):
        worker.timer = PhaseTimer(worker.device) if phases else None
        outs, steps, tokens, wall = [], 0, 0, 0.0
        for batch in batches:
            t0 = time.perf_counter()
            outs += engine.generate(batch, params)
            wall += time.perf_counter() - t0
            steps += engine.last_stats.num_decode_steps
            tokens += engine.last_stats.num_tokens
        passes.append(dict(tps=tokens / wall, outs=outs, steps=steps, tokens=tokens, wall=wall,
                           phase_s=worker.timer.totals() if phases else {}))
    worker.timer = None
    tps = lambda p: p["tps"]  # noqa: E731
    return quantile(passes, 0.5, tps), quantile(passes, 0.2, tps)["tps"], quantile(passes, 0.8, tps)["tps"]


def run_e2e_benchmark(device="cuda", models=None, batch_sizes=(1, 8, 32), max_new_tokens=64, prompt_len=96,
                      repeats=3, out_dir="results", progress=print) -> Path:
    """Measure every worker x impl x batch size on every model; write one CSV; return its path."""
    device = torch.device(device)
    on_cuda = device.type == "cuda"
    if models is None:
        models = ["shipped"] + (["random-1b"] if on_cuda else [])
    if not on_cuda:
        progress("note: no CUDA device: only the reference rows are measured (the fast kernels would run "
                 "under Triton's interpreter, which is not speed), and the 1.5B model is skipped")
    run = Run("e2e", device)
    rows = []
    for model_name in models:
        n_prompts = max(batch_sizes)
        m = (shipped_model(n_prompts, prompt_len, device) if model_name == "shipped"
             else random_1b_model(n_prompts, prompt_len, device))
        params_m = sum(p.numel() for p in m.target.parameters()) / 1e6
        sp = SamplingParams(max_new_tokens=max_new_tokens, return_logprob=True)
        for case in (c for c in by_kind(CASES) if c.e2e):
            kind, spec = case.kind, case.spec
            if spec is not None and kind not in m.drafts:
                continue  # a model without this draft
            for B in batch_sizes:
                batches = [m.prompts[:B]]
                ref_tps, ref_outs = None, None
                for impl, graphs in IMPLS:
                    if impl == "fast" and not on_cuda:
                        continue
                    engine = Engine(m.target, m.drafts.get(kind) if spec else None, spec, impl=impl, max_batch=B,
                                    max_seq_len=prompt_len + max_new_tokens + 64, cuda_graphs=graphs,
                                    preallocate=True)
                    median, p20, p80 = _measure(engine, batches, sp, repeats, phases=not graphs)
                    tps, outs, steps, tokens = median["tps"], median["outs"], median["steps"], median["tokens"]
                    phase_s = median["phase_s"]
                    if impl == "reference":
                        ref_tps, ref_outs = tps, outs
                    same = all(a.token_ids == b.token_ids for a, b in zip(outs, ref_outs))
                    acc = [a for o in outs for a in o.accept_lens]
                    per_step = {k: round(v / steps * 1e3, 4) if steps else "" for k, v in phase_s.items()}
                    row = E2ERow(**run.prefix(), model=m.name, params_m=round(params_m, 1),
                                 dtype=dtype_name(m.target.dtype), worker=kind, label=case.label,
                                 num_steps=spec.num_steps if spec else 0, topk=spec.topk if spec else 0,
                                 num_draft_tokens=spec.num_draft_tokens if spec else 1, impl=impl,
                                 cuda_graphs=graphs, batch_size=B, prompt_len=prompt_len,
                                 max_new_tokens=max_new_tokens, repeats=repeats, decode_steps=steps, tokens=tokens,
                                 tokens_per_s=round(tps, 2), tokens_per_s_p20=round(p20, 2),
                                 tokens_per_s_p80=round(p80, 2),
                                 mean_accept_len=round(sum(acc) / len(acc), 4) if acc else "",
                                 speedup_vs_reference=round(tps / ref_tps, 4), same_tokens_as_reference=same,
                                 step_ms=round(median["wall"] / steps * 1e3, 4) if steps else "",
                                 **{f"{k}_ms": per_step.get(k, "") for k in PHASES})
                    rows.append(row)
                    progress(f"{m.name} {case.label:22s} {impl:9s} graphs={graphs!s:5s} B={B:<3d} "
                             f"{tps:9.1f} tok/s ({p20:.1f}-{p80:.1f}) x{row.speedup_vs_reference:.2f} "
                             f"accept {row.mean_accept_len or 1:.2f} same={same}")
    return run.write(rows, out_dir)


def main_e2e(args) -> int:
    """`specdec bench --suite e2e`."""
    device = args.device
    sizes = tuple(args.batch_sizes) if args.batch_sizes else (1, 8, 32)
    path = run_e2e_benchmark(device, batch_sizes=sizes, max_new_tokens=args.max_new_tokens,
                             repeats=args.repeats, out_dir=args.out)
    png = plot_e2e(load_results(args.out, path.name), path.with_suffix(".png"))
    print(f"wrote {path} and {png}")
    return 0
