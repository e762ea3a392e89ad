"""Two parts of `specdec gpu-check` that generate: `graph_replay` (are CUDA-graph decode steps token-identical to
fast eager, judged in fp32 on small models, and where and why do they first differ) and `e2e` (decode
tokens/s of reference, fast and fast + CUDA graphs on a random 1.5B Llama in bf16, each row with the bytes a
step reads and the fraction of the read ceiling it reaches: `roofline`). Both write DecodeRow rows
to e2e.csv, one configuration (a worker x path x batch size, a graph case) at a time.

Why identity is judged in fp32: graphs pad a batch to its bucket, which changes the M of every GEMM and so
possibly cuBLAS's kernel and its summation order, and a bf16 near-tie then flips a token without any bug. A
difference is recorded with the request, its first divergent step and token, both tokens, the logit gap
between them in fast eager's logits and whether that step's batch was padded, so a reader can tell a
near-tie from a bug.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path

import torch

from ..draft_kinds import DRAFT_KINDS
from .parts import gpu_device, gpu_run, error_writer, read_ceiling
from .rows import E2E, DecodeRow, writer
from .runner import Config, lazy, run_configs
from .roofline import blank_roofline, roofline_fields, step_reads
from ..models.bigram import near_bigram_target, perfect_eagle, perfect_mtp
from ..bench.cases import CASES, by_kind
from .. import Engine, SamplingParams
from ..workers.graphs import DecodeGraphs, batch_buckets
from ..models import random_llama
from ..bench.suites.e2e import RANDOM_1B_NAME, random_1b_target
from ..bench.common import dtype_name, median_of

#: e2e batch sizes in the order measured: the goal rows (B = 32 and B = 1) before B = 8.
E2E_SIZES = (32, 1, 8)
SMOKE_E2E_SIZES = (2, 1)
#: graph_replay batch sizes: a padded one (5 in the bucket of 8) first.
REPLAY_SIZES = (5, 8, 1)
SMOKE_REPLAY_SIZES = (5, 1)
#: Top logprobs each graph-replay request asks for: the logit gap of a divergence is read from them.
REPLAY_TOP_LOGPROBS = 5


# ---- where two runs first differ -------------------------------------------------------------------------
def token_step(accept_lens: list[int], i: int) -> int:
    """The decode step that produced token i of a request (0: the prefill's token; step k made the
    accept_lens[k - 1] tokens after those of the steps before it)."""
    if i < 1:
        return 0
    end = 1
    for step, n in enumerate(accept_lens, 1):
        end += n
        if i < end:
            return step
    return len(accept_lens)


def first_difference(this: list, other: list, buckets: list[int]) -> dict:
    """Two runs' GenerateOutputs (same requests) -> the DecodeRow fields of their first difference: the first
    request whose tokens differ, its first divergent token and decode step, both tokens, the logit gap in the
    other run's logits (when it asked for top logprobs holding both tokens), the requests live at that step and
    whether its bucket padded them. All '' when every request is identical."""
    for r, (x, y) in enumerate(zip(this, other)):
        if x.token_ids == y.token_ids:
            continue
        n = min(len(x.token_ids), len(y.token_ids))
        i = next((j for j in range(n) if x.token_ids[j] != y.token_ids[j]), n)
        step = token_step(x.accept_lens, i)
        live = len(this) if step == 0 else sum(len(o.accept_lens) >= step for o in this)
        bucket = next((b for b in buckets if b >= live), live)
        mine = x.token_ids[i] if i < len(x.token_ids) else ""
        theirs = y.token_ids[i] if i < len(y.token_ids) else ""
        gap = ""
        if y.top_logprobs and i < len(y.top_logprobs):
            lp = {tok: value for value, tok in y.top_logprobs[i]}
            if mine in lp and theirs in lp:
                gap = lp[theirs] - lp[mine]
        return dict(first_diff_request=r, first_diff_step=step, first_diff_token=i, token_this=mine,
                    token_other=theirs, logit_gap=gap, live_batch=live, padded=step > 0 and bucket > live)
    return dict(first_diff_request="", first_diff_step="", first_diff_token="", token_this="", token_other="",
                logit_gap="", live_batch="", padded="")


def blank_decode_fields() -> dict:
    """Every DecodeRow column past the shared E2ECase ones, empty (status ok)."""
    return dict(**first_difference([], [], []), decode_steps="", decode_tokens="", decode_s="", tokens_per_s="",
                tokens_per_s_min="", tokens_per_s_max="", speedup_vs_reference="", compared_with="",
                identical_requests="", token_identical="", max_logprob_diff="", **blank_roofline(), note="",
                status="ok", error="")


# ---- graph_replay ----------------------------------------------------------------------------------------
def _small_models(device):
    """A small fp32 near-bigram target and its bigram-perfect drafts (`specdec.models.bigram`): steps accept
    several tokens, and often not all of them."""
    target = near_bigram_target(seed=6, mix=0.4).to(device)
    return target, {"eagle": perfect_eagle(target), "mtp_chain": perfect_mtp(target, 3, True)}


def _cases(kinds) -> list:
    """The shared worker cases (`cases.CASES`, by kind) of target-only and the given draft kinds."""
    return [c for c in by_kind(CASES) if c.spec is None or c.kind in kinds]


def _replay_params(mode: str, B: int):
    sampled = dict(temperature=0.7, top_k=20, top_p=0.9)
    return [SamplingParams(max_new_tokens=10 + 3 * i, return_logprob=True, top_logprobs_num=REPLAY_TOP_LOGPROBS,
                           **(sampled if mode == "sampled" or (mode == "mixed" and i % 2) else {}))
            for i in range(B)]


def run_graph_replay(out: Path, smoke: bool) -> None:
    device = gpu_device(smoke)
    w = writer(out, E2E)
    run = functools.lru_cache(None)(lambda: gpu_run(device))
    models = lazy(lambda: _small_models(device))
    engines = {}
    # smoke: mixed batches only (greedy and sampled requests side by side)
    sizes, modes = (SMOKE_REPLAY_SIZES, ("mixed",)) if smoke else (REPLAY_SIZES, ("greedy", "sampled", "mixed"))
    cases = _cases({"eagle", "mtp_chain"})[:3] if smoke else _cases({"eagle", "mtp_chain"})
    configs = []
    for B in sizes:
        for case in cases:
            for mode in modes:
                fields = dict(part="graph_replay", model="near-bigram-fp32", worker=case.kind, label=case.label,
                              batch_size=B, sampling=mode, cuda_graphs=not smoke)
                configs.append(Config(f"{case.label} B={B} {mode}",
                                      functools.partial(_replay_case, case, B, mode, smoke, device, models, engines,
                                                        run, w), E2E, fields, headline=True))
    run_configs("graph_replay", configs, error_writer(out))


def _replay_case(case, B, mode, smoke, device, models, engines, run, w) -> None:

    t0 = time.perf_counter()
    target, drafts = models()
    max_batch = 8
    impl = "reference" if smoke else "fast"  # smoke: the static-buffer plumbing, eagerly
    if case.label not in engines:
        draft = drafts.get(case.kind)
        eager = Engine(target, draft, case.spec, impl=impl, max_batch=max_batch, max_seq_len=96, cuda_graphs=False,
                       preallocate=True)
        graphed = Engine(target, draft, case.spec, impl=impl, max_batch=max_batch, max_seq_len=96,
                         cuda_graphs=not smoke, preallocate=True)
        if smoke:
            graphed._decode = DecodeGraphs(graphed.worker, capture=False).decode_step
        engines[case.label] = eager, graphed
    eager, graphed = engines[case.label]
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(target.config.vocab_size, (3 + i % 4,), generator=gen).tolist() for i in range(B)]
    params = _replay_params(mode, B)
    a = graphed.generate(prompts, params, seed=5)
    b = eager.generate(prompts, params, seed=5)
    same = [x.token_ids == y.token_ids for x, y in zip(a, b)]
    diff = max((abs(p - q) for x, y, s in zip(a, b, same) if s for p, q in zip(x.logprobs, y.logprobs)), default=0.0)
    acc = [n for o in a for n in o.accept_lens]
    buckets = batch_buckets(max_batch)
    spec = case.spec
    fields = blank_decode_fields()
    fields.update(first_difference(a, b, buckets))
    fields.update(part="graph_replay", model="near-bigram-fp32", params_m=round(
        sum(p.numel() for p in target.parameters()) / 1e6, 3), dtype="float32", worker=case.kind, label=case.label,
        num_steps=spec.num_steps if spec else 0, topk=spec.topk if spec else 0,
        num_draft_tokens=spec.num_draft_tokens if spec else 1, impl=impl, cuda_graphs=not smoke, batch_size=B,
        prompt_len="", max_new_tokens=max(p.max_new_tokens for p in params), repeats=1, sampling=mode,
        bucket=next(k for k in buckets if k >= B), decode_steps=graphed.last_stats.num_decode_steps,
        decode_tokens=sum(len(o.token_ids) for o in a), mean_accept_len=sum(acc) / len(acc) if acc else 1.0,
        compared_with=f"{impl} eager", identical_requests=sum(same), token_identical=all(same),
        max_logprob_diff=diff, seconds=time.perf_counter() - t0)
    w.write(DecodeRow(**run().prefix(), **fields))


# ---- e2e -------------------------------------------------------------------------------------------------
def e2e_target(device, smoke: bool):
    """-> (label, target): the e2e part's target, the same weights in every process of the run (drawn from one
    seed on the device)."""
    if smoke:
        return "random-llama-tiny", random_llama(vocab_size=256, hidden_size=64, intermediate_size=128,
                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                 seed=0, device=device)
    # Llama-3.2-1B's shapes with an untied 128,256 x 2,048 head: 1.5B parameters, drawn on the GPU
    return RANDOM_1B_NAME, random_1b_target(device, torch.bfloat16)


def _e2e_models(device, smoke: bool):
    t0 = time.perf_counter()
    label, target = e2e_target(device, smoke)
    drafts = {kind: DRAFT_KINDS[kind].new_random_draft(target) for kind in E2E_KINDS}
    params_m = sum(p.numel() for p in target.parameters()) / 1e6
    print(f"{label}: {params_m:.0f}M parameters built in {time.perf_counter() - t0:.1f} s", flush=True)
    return label, target, drafts, params_m


#: the draft kinds of the e2e part (`DraftKind.gpu_e2e_specs`), each with a random draft (`DraftKind.random_draft`)
E2E_KINDS = tuple(k.name for k in DRAFT_KINDS.values() if k.gpu_e2e_specs)
#: the token map size of the e2e part's hot-vocabulary EAGLE tree (FR-Spec's and EAGLE-3's 32k; smoke: the random
#: tiny target's vocabulary is smaller, so its map is capped there)
HOT_VOCAB = 32768


def e2e_cases() -> list:
    """target-only, the EAGLE tree, MTP MiMo, the DFlash block, and the NGRAM and STANDALONE chains (one shape per
    kind: the tree is the EAGLE headline, the chain the kinds' `e2e_specs`)."""
    cases = [c for c in _cases(set(E2E_KINDS)) if c.spec is None or c.spec in DRAFT_KINDS[c.kind].gpu_e2e_specs]
    # the EAGLE tree again with a hot-vocabulary head: its draft reads HOT_VOCAB rows of the LM head, not 128,256
    tree = next(c for c in cases if c.kind == "eagle")
    return cases + [dataclasses.replace(tree, token_map_size=HOT_VOCAB)]


def read_first_case():
    """target-only with each step read before the next is enqueued: beside the default (decoding ahead) at B = 1
    and 32 with graphs, it measures what decoding ahead brings."""
    return dataclasses.replace(next(c for c in e2e_cases() if c.spec is None), decode_ahead=False)


def e2e_plan(smoke: bool) -> list[tuple]:
    """(B, case, impl, graphs) in the order measured: per batch size (the goal sizes first), per worker, the
    reference, fast eager and fast + graphs. Smoke: the reference at two sizes, fast target-only at B = 1."""
    plan = []
    for B in SMOKE_E2E_SIZES if smoke else E2E_SIZES:
        for case in e2e_cases():
            if (case.token_map_size or DRAFT_KINDS.get(case.kind) and DRAFT_KINDS[case.kind].gpu_e2e_graphs_only) \
                    and not smoke:
                # the hot-vocabulary tree's goal is the fast path's step, and the scripted draft's rows are what a
                # draft of its agreement gains there: graphs only, B = 1 and 32
                plan += [(B, case, "fast", True)] if B != 8 else []
                continue
            plan.append((B, case, "reference", False))
            if smoke:
                if B == 1 and case.spec is None:
                    plan.append((B, case, "fast", False))
                continue
            plan += [(B, case, "fast", False), (B, case, "fast", True)]
        if not smoke and B != 8:
            plan.append((B, read_first_case(), "fast", True))
        elif smoke and B == 1:  # the plumbing of the case, on the reference (which reads first on a CPU anyway)
            plan.append((B, read_first_case(), "reference", False))
    return plan


def run_e2e(out: Path, smoke: bool) -> None:
    device = gpu_device(smoke)
    w = writer(out, E2E)
    run = functools.lru_cache(None)(lambda: gpu_run(device))
    models = lazy(lambda: _e2e_models(device, smoke))
    ceiling = lazy(lambda: read_ceiling_or_blank(out, device, smoke))
    state = dict(engines={}, reference={}, fast_eager={}, ceiling=ceiling)
    configs = []
    for B, case, impl, graphs in e2e_plan(smoke):
        fields = dict(part="e2e", worker=case.kind, label=case.label, impl=impl, cuda_graphs=graphs, batch_size=B)
        configs.append(Config(f"{case.label} {impl}{' + graphs' if graphs else ''} B={B}",
                              functools.partial(_e2e_case, B, case, impl, graphs, smoke, device, models, state, run,
                                                w), E2E, fields, headline=B != 8 and (impl == "reference" or graphs)))
    run_configs("e2e", configs, error_writer(out))


def _e2e_case(B, case, impl, graphs, smoke, device, models, state, run, w) -> None:

    t0 = time.perf_counter()
    label, target, drafts, params_m = models()
    new_tokens, repeats, prompt_len = (4, 1, 8) if smoke else (64, 3, 64)
    max_batch = max(SMOKE_E2E_SIZES if smoke else E2E_SIZES)
    key = (case.label, impl, graphs)
    if key not in state["engines"]:
        token_map = case.token_map_for(target)
        if token_map is not None:
            token_map = token_map[:target.config.vocab_size // 2]
        state["engines"][key] = Engine(target, drafts.get(case.kind), case.spec, impl=impl, max_batch=max_batch,
                                       max_seq_len=prompt_len + new_tokens + 32, cuda_graphs=graphs,
                                       token_map=token_map, overlap=graphs and case.decode_ahead, preallocate=True)
    engine = state["engines"][key]
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(target.config.vocab_size, (B, prompt_len), generator=gen).tolist()
    params = SamplingParams(max_new_tokens=new_tokens)  # greedy, no logprobs; phase timers stay off
    # the untimed pass compiles; with graphs the whole run, so that every bucket an early exit needs is
    # captured here, not in a timed pass. A scripted draft's scripts are made untimed too (`Engine.prepare`)
    engine.prepare(prompts, params)
    engine.generate(prompts, params if graphs else SamplingParams(max_new_tokens=2 if smoke else 8))
    passes = sorted((_decode_pass(engine, prompts, params, device) for _ in range(repeats)), key=lambda p: p["tps"])
    med = median_of(passes, key=lambda p: p["tps"])
    if impl == "reference":
        state["reference"][case.label, B] = med["tps"]
    if impl == "fast" and not graphs:
        state["fast_eager"][case.label, B] = med["outs"]
    ref = state["reference"].get((case.label, B))
    other = state["fast_eager"].get((case.label, B)) if graphs else None
    acc = [a for o in med["outs"] for a in o.accept_lens]
    spec = case.spec
    fields = blank_decode_fields()
    if other is not None:
        same = [x.token_ids == y.token_ids for x, y in zip(med["outs"], other)]
        fields.update(first_difference(med["outs"], other, batch_buckets(max_batch)))
        fields.update(compared_with="fast eager", identical_requests=sum(same), token_identical=all(same))
    fields.update(part="e2e", model=label, params_m=round(params_m, 1), dtype=dtype_name(target.dtype),
                  worker=case.kind, label=case.label, num_steps=spec.num_steps if spec else 0,
                  topk=spec.topk if spec else 0, num_draft_tokens=spec.num_draft_tokens if spec else 1, impl=impl,
                  cuda_graphs=graphs, batch_size=B, prompt_len=prompt_len, max_new_tokens=new_tokens,
                  repeats=repeats, sampling="greedy", bucket=next(b for b in batch_buckets(max_batch) if b >= B),
                  decode_steps=med["steps"], decode_tokens=med["tokens"], decode_s=med["seconds"],
                  tokens_per_s=med["tps"], tokens_per_s_min=passes[0]["tps"], tokens_per_s_max=passes[-1]["tps"],
                  mean_accept_len=sum(acc) / len(acc) if acc else 1.0,
                  speedup_vs_reference=med["tps"] / ref if ref else "", seconds=time.perf_counter() - t0)
    fields.update(_roofline(engine, B, prompt_len + med["tokens"] / B / 2, med["seconds"] / med["steps"],
                            state["ceiling"]()))
    w.write(DecodeRow(**run().prefix(), **fields))
    print(f"{case.label} {impl}{' + graphs' if graphs else ''} B={B}: {med['tps']:.1f} tok/s"
          + (f", {fields['frac_of_read_ceiling']:.0%} of the read ceiling" if fields["frac_of_read_ceiling"] != ""
             else ""), flush=True)


def _roofline(engine, B: int, context_len: float, step_s: float, ceiling) -> dict:
    """The row's columns against the read ceiling; empty ones (and a line in the log) where the step's bytes have
    no rule, rather than costing the row."""
    try:
        nbytes = step_reads(engine.worker).bytes(B, context_len)
    except Exception as e:
        print(f"no bytes per step: {type(e).__name__}: {e}", flush=True)
        nbytes = ""
    return roofline_fields(nbytes, step_s, ceiling, context_len)


def read_ceiling_or_blank(out: Path, device, smoke: bool):
    """The run's read ceiling in GB/s, or '' when it cannot be had (no triton): the rows keep their other columns."""
    try:
        return read_ceiling(out, device, smoke)
    except Exception as e:
        print(f"no read ceiling: {type(e).__name__}: {e}", flush=True)
        return ""


def _decode_pass(engine, prompts, params, device) -> dict:
    """One generate, timed from the end of its prefill (the prefill's token excluded) to its last token."""
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
