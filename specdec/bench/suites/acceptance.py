"""`specdec bench` (the acceptance suite): every worker against the target-only baseline of the same run, with
the transformers peers beside them; one CSV per run (`results/acceptance-<run_id>.csv`) and its plot.

Each row is one (worker, spec, batch size, temperature): mean accepted tokens per verify step (bonus
included), tokens/s, speedup, the cost of one decode step in target-only decode steps, and whether tokens
(greedy) and logprobs match the baseline. The timed passes decode without logprobs, as the transformers peers
do; one more, untimed pass per worker asks for them and gives the logprob column.
"""
from __future__ import annotations

import dataclasses
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import Engine, SamplingParams, SpecConfig
from ...draft_kinds import DRAFT_KINDS
from ..cases import (ASSISTED_CASE, CASES, DSPARK_OPTION_CASES, NGRAM_OPTION_CASES, PEER_CASES, WorkerCase, by_kind,
                     offered_kinds, tuned_cases, with_dspark_thresholds, with_verify_rules)
from ...cli_args import about
from ..common import (ALL_CATEGORIES, DTYPES, Run, RunRow, above_bar, cpu_model, dtype_name, median_of,
                     progress_bar, quantile, target_only_batch_seconds)
from ...workers.base import PhaseTimer
from ..peers import HFGenerate
from ...models.linear import cpu_linear_summary as linear_summary
from ...tuning import names_a_pair, shipped_files, shipped_names, TunedSpec

#: the phases of a decode step that are model forwards (drafting, the draft's extend, the target's verify)
FORWARD_PHASES = ("draft", "draft_extend", "verify_forward")


@dataclass
class AcceptanceRow(RunRow):
    """One (worker, spec, batch size, temperature) of `specdec bench` (results/README.md)."""

    impl: str
    dtype: str
    model: str
    worker: str
    label: str
    shape_policy: str
    num_steps: int
    topk: int
    num_draft_tokens: int
    prompt_lookup_num_tokens: int
    batch_size: int
    temperature: float
    num_prompts: int
    prompt_len: float
    max_new_tokens: int
    repeats: int
    decode_steps: int | str
    tokens: int
    wall_s: float
    tokens_per_s: float
    tokens_per_s_p20: float
    tokens_per_s_p80: float
    cpu_s: float
    cpu_tokens_per_s: float
    cpu_tokens_per_s_by_pass: str
    mean_accept_len: float | str
    step_cost_in_target_only_steps: float | str
    speedup_vs_target_only: float
    cpu_speedup_vs_target_only: float
    cpu_speedup_vs_hf_target_only: float | str
    same_tokens_as_target_only: bool | str
    identical_request_fraction: float | str
    max_logprob_diff: str
    cpu_model: str
    linear_backend: str
    forward_cost_in_target_only_steps: float | str
    speedup_bound: float | str
    draft_ms_per_step: float | str
    # per batch of prompts, in order (at B = 1: per prompt), so that rows can be compared on a subset of the prompts
    tokens_by_batch: str  # of the median pass, ","-separated
    accept_len_by_batch: str  # of the median pass: the batch's tokens per verify step, ","-separated
    verify_steps_by_batch: str  # of the median pass: the batch's requests' verify steps, ","-separated
    cpu_s_by_batch: str  # every pass: ","-separated batches, ";"-separated passes
    top_p: float = 1.0
    verify: str = ""  # the sampled requests' rule (SpecConfig.verify), empty for target-only and the peers
    # the prompts' category the row measures (`ALL_CATEGORIES`: every prompt of the run)
    category: str = ALL_CATEGORIES


def cases_at(cases: list[WorkerCase], temperature: float, batch_size: int) -> list[WorkerCase]:
    """The cases a (temperature, batch size) runs: the transformers peers decode greedily only, some at B = 1 only;
    a case whose verify rule is not target-only runs sampled only (greedy requests take greedy verification)."""
    return [c for c in cases
            if (not c.is_peer or (temperature == 0 and (batch_size == 1 or not c.batch_one_only)))
            and not (temperature == 0 and c.shape_policy == "static" and c.spec is not None
                     and c.spec.draft_sampling == "sample")]


def sampling_settings(temperatures, top_ps=(1.0,)) -> list[tuple[float, float]]:
    """(temperature, top_p) pairs the run decodes at: every top-p at each temperature above 0, top-p 1 when greedy."""
    return [(t, p) for t in temperatures for p in (top_ps if t > 0 else [1.0])]


def category_batches(categories: list[str], B: int) -> list[list[int]]:
    """The prompts (by index) a batch size decodes, B at a time, each batch of one category: the categories in the
    order they first appear, each one's prompts in order; a category's last prompts that fill no batch are left out.
    With one category, the prompts in order, B at a time."""
    out = []
    for category in dict.fromkeys(categories):
        idx = [i for i, c in enumerate(categories) if c == category]
        out += [idx[i:i + B] for i in range(0, len(idx) - B + 1, B)]
    return out


def planned_decodes(cases: list[WorkerCase], num_prompts: int, batch_sizes, temperatures, repeats: int,
                    top_ps=(1.0,), check_prompts: int | None = None, categories: list[str] | None = None) -> dict:
    """Batch size -> how many batches of that size the run decodes: each case's timed passes, and an engine's
    logprob and phase passes over the first `check_prompts` prompts (all when None; warm-ups left out); the batches
    are `category_batches` of `categories` (one per prompt; None: one category). The progress bar's total and the
    estimate's workload."""
    categories = categories or [ALL_CATEGORIES] * num_prompts
    out = {}
    for temperature, _ in sampling_settings(temperatures, top_ps):
        for B in batch_sizes:
            here = cases_at(cases, temperature, B)
            num_batches = len(category_batches(categories, B))
            timed = repeats * len(here) * num_batches
            checks = 2 * sum(not c.is_peer for c in here) * len(check_batches(num_batches, B, check_prompts))
            out[B] = out.get(B, 0) + timed + checks
    return out


def check_batches(num_batches: int, B: int, check_prompts: int | None) -> range:
    """The batches (by index) the logprob and phase passes decode: those holding the first `check_prompts` prompts
    (at least one batch), or all of them when None."""
    return range(num_batches if check_prompts is None else min(num_batches, max(1, -(-check_prompts // B))))


def _forward_pass(runner, batches, params, tick=None):
    """One untimed pass with the phase timer on -> (seconds of model forwards per decode step, seconds of the
    draft phase per decode step), or None for a peer. What a step costs with zero overhead: its draft,
    draft-extend and verify forwards. NGRAM's draft phase is its host work (the index and the tree). Off CUDA the
    phases are timed in process CPU seconds, as the timed passes' ratios are: a single pass timed by the wall clock
    took another process's burst whole (a bound below the measured speedup, in an idle-machine run)."""
    by_batch = _forward_pass_by_batch(runner, batches, params, tick)
    return None if by_batch is None else _per_step(by_batch)


def _forward_pass_by_batch(runner, batches, params, tick=None) -> list[tuple[float, float, int]] | None:
    """`_forward_pass`'s pass -> per batch (seconds of model forwards, seconds of the draft phase, decode steps), or
    None for a peer."""
    if not isinstance(runner, Engine):
        return None
    worker = runner.worker
    worker.timer = PhaseTimer(worker.device, clock=time.process_time)
    out = []
    runner.flush_cache()
    try:
        for batch in batches:
            runner.generate(batch, params, seed=0)
            totals = worker.timer.totals()
            out.append((sum(totals.get(p, 0.0) for p in FORWARD_PHASES), totals.get("draft", 0.0),
                        runner.last_stats.num_decode_steps))
            if tick:
                tick()
    finally:
        worker.timer = None
    return out


def _per_step(by_batch: list[tuple[float, float, int]]) -> tuple[float, float]:
    """Batches' (forward seconds, draft seconds, steps) -> (forward seconds per decode step, draft seconds per step)."""
    steps = max(sum(b[2] for b in by_batch), 1)
    return sum(b[0] for b in by_batch) / steps, sum(b[1] for b in by_batch) / steps


def _logprob_pass(runner, batches, params, tick=None) -> list:
    """One untimed pass with logprobs (None for a peer, which has none)."""
    if not isinstance(runner, Engine):
        return None
    lp_params = dataclasses.replace(params, return_logprob=True)
    runner.flush_cache()
    outs = []
    for batch in batches:
        outs += runner.generate(batch, lp_params, seed=0)
        if tick:
            tick()
    return outs


def _measure(runners, batches, params, repeats, tick=None):
    """Every runner (an Engine or a peer with its `generate`) on every batch, `repeats` passes, the runners taken
    round-robin on each batch of a pass, so that a drift of the machine's speed (another process on a shared core)
    lands on all of them alike, within seconds rather than within a runner's whole pass. Every pass of an Engine
    starts from a flushed draft cache (`Engine.flush_cache`): a shared NGRAM index learns from the pass's earlier
    requests only, never from an earlier pass's outputs of the same prompts.
    -> per runner: the passes, each with wall and process-CPU seconds, tokens, steps and outputs, in all and per
    batch (`_view` restricts a pass to some of its batches)."""
    for runner in runners:  # warm-up, and a draft's work per request (a scripted draft's scripts), untimed
        runner.generate(batches[0][:1], SamplingParams(max_new_tokens=4))
        if isinstance(runner, Engine):
            for batch in batches:
                runner.prepare(batch, params)
    passes = [[] for _ in runners]
    for _ in range(repeats):
        this_pass = [dict(outs=[], wall=0.0, cpu=0.0, steps=0, tokens=0, cpu_by_batch=[], tokens_by_batch=[],
                          accept_by_batch=[], verifies_by_batch=[], outs_by_batch=[], wall_by_batch=[],
                          steps_by_batch=[]) for _ in runners]
        for runner in runners:
            if isinstance(runner, Engine):
                runner.flush_cache()
        for batch in batches:
            for runner, acc in zip(runners, this_pass):
                c0 = time.process_time()
                outs = runner.generate(batch, params, seed=0)
                cpu = time.process_time() - c0
                acc["outs"] += outs
                acc["cpu"] += cpu
                acc["cpu_by_batch"].append(cpu)
                acc["tokens_by_batch"].append(runner.last_stats.num_tokens)
                lens = [a for o in outs for a in o.accept_lens]
                acc["accept_by_batch"].append(sum(lens) / len(lens) if lens else None)
                acc["verifies_by_batch"].append(len(lens))
                acc["outs_by_batch"].append(outs)
                acc["wall_by_batch"].append(runner.last_stats.wall_s)
                acc["steps_by_batch"].append(runner.last_stats.num_decode_steps)
                acc["wall"] += runner.last_stats.wall_s
                acc["steps"] += runner.last_stats.num_decode_steps
                acc["tokens"] += runner.last_stats.num_tokens
                if tick:
                    tick()
        for r, acc in enumerate(this_pass):
            passes[r].append(acc)
    return passes


def _view(p: dict, idx) -> dict:
    """A pass of `_measure` restricted to the batches `idx`: its keys, over those batches only."""
    view = {k: [p[k][i] for i in idx] for k in ("cpu_by_batch", "tokens_by_batch", "accept_by_batch",
                                                 "verifies_by_batch", "outs_by_batch", "wall_by_batch",
                                                 "steps_by_batch")}
    view.update(outs=[o for outs in view["outs_by_batch"] for o in outs], wall=sum(view["wall_by_batch"]),
                cpu=sum(view["cpu_by_batch"]), steps=sum(view["steps_by_batch"]), tokens=sum(view["tokens_by_batch"]))
    return view


def run_benchmark(target, drafts: dict, cases: list[WorkerCase], prompts: list[list[int]], batch_sizes,
                  temperatures, max_new_tokens: int, model_name: str, impl="reference", repeats=1, out_dir="results",
                  tag="bench", progress=print, peer_dir=None, assistant_dir=None, show_progress=True,
                  stop_token_ids=(), top_ps=(1.0,), check_prompts: int | None = None,
                  categories: list[str] | None = None) -> Path:
    """Measure every case at every batch size and temperature; write one CSV; return its path.

    `drafts` maps a case's kind to its draft model; the first case must be target-only (the baseline of the
    speedup columns). Prompts are taken in order, B at a time, each batch of one category (`category_batches`;
    `categories`, one per prompt, None for one), so each batch size decodes the same prompts. Each row is over every
    prompt (category `all`); where the prompts have several categories, a row per category follows, from that
    category's batches of the same passes. Peer cases (transformers, greedy only) load the target from `peer_dir` (and
    assisted generation its draft LM from `assistant_dir`). Each
    row holds the median pass (tokens/s by wall time, with p20 / p80 over the passes) and process CPU time
    (the robust figure on a shared machine, at one thread). show_progress: a tqdm bar over the batches decoded,
    on stderr, with `progress`'s lines above it. stop_token_ids: the ids every request stops at, the engines and
    the peers alike (a real target's EOS ids, as generation stops); none (the shipped pairs): every request decodes
    exactly max_new_tokens. top_ps: each sampled temperature runs at each of them.
    """
    if not cases or cases[0].kind != "target-only":
        raise ValueError("the first benchmark case must be target-only (the speedup baseline)")
    run = Run("acceptance", target.device)
    env_cpu = cpu_model()
    rows = []
    max_len = max(len(p) for p in prompts) + max_new_tokens + 64
    peers = {}
    categories = list(categories) if categories is not None else [ALL_CATEGORIES] * len(prompts)
    if len(categories) != len(prompts):
        raise ValueError(f"got {len(categories)} categories for {len(prompts)} prompts")
    planned = sum(planned_decodes(cases, len(prompts), batch_sizes, temperatures, repeats, top_ps,
                                  check_prompts, categories).values())
    bar = progress_bar(planned, "bench", unit="batch", disable=not show_progress)
    tick, progress = bar.update, above_bar(progress)
    for temperature, top_p in sampling_settings(temperatures, top_ps):
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                stop_token_ids=list(stop_token_ids))
        for B in batch_sizes:
            groups = category_batches(categories, B)
            if not groups:
                raise ValueError(f"batch size {B} exceeds the {len(prompts)} prompts"
                                 + (" of each category" if len(set(categories)) > 1 else ""))
            batches = [[prompts[i] for i in g] for g in groups]
            batch_categories = [categories[g[0]] for g in groups]
            here = cases_at(cases, temperature, B)
            runners = []
            for c in here:
                if c.is_peer:
                    key = (c.kind, c.prompt_lookup)
                    if key not in peers:
                        assistant = assistant_dir if c.kind == "hf-assisted" else None
                        peers[key] = HFGenerate(peer_dir, prompt_lookup=c.prompt_lookup, device=target.device,
                                                assistant_dir=assistant)
                    runners.append(peers[key])
                else:
                    runners.append(Engine(target, c.draft_for(drafts.get(c.kind)) if c.spec else None, c.spec,
                                          impl=impl, max_batch=B, max_seq_len=max_len))
            measured = _measure(runners, batches, params, repeats, tick)
            checked = list(check_batches(len(batches), B, check_prompts))
            lp_outs = [_logprob_pass(r, [batches[i] for i in checked], params, tick) for r in runners]
            lp_by_batch = [None if lps is None else _split(lps, [len(batches[i]) for i in checked]) for lps in lp_outs]
            forward_by_batch = [_forward_pass_by_batch(r, [batches[i] for i in checked], params, tick)
                                for r in runners]
            selections = [(ALL_CATEGORIES, list(range(len(batches))))]
            if len(set(batch_categories)) > 1:
                selections += [(c, [i for i, b in enumerate(batch_categories) if b == c])
                               for c in dict.fromkeys(batch_categories)]
            for category, idx in selections:
                # the checked batches are the first ones, so those of `idx` are its first ones too
                idx_checked = [k for k, i in enumerate(checked) if i in idx]
                lps_here = [None if by is None else [o for k in idx_checked for o in by[k]] for by in lp_by_batch]
                fwd_here = [None if by is None or not idx_checked else _per_step([by[k] for k in idx_checked])
                            for by in forward_by_batch]
                rows += _rows_of(run, here, runners, [[_view(p, idx) for p in ps] for ps in measured], lps_here,
                                 fwd_here, [batches[i] for i in idx], category, B, temperature, top_p,
                                 max_new_tokens, repeats, model_name, target, env_cpu,
                                 progress if category == ALL_CATEGORIES else None)
    bar.close()
    return run.write(rows, out_dir, tag)


def _split(outs: list, sizes: list[int]) -> list[list]:
    """A pass's outputs in batch order -> one list per batch of those sizes."""
    at = [0]
    for n in sizes:
        at.append(at[-1] + n)
    return [outs[a:b] for a, b in zip(at, at[1:])]


def _rows_of(run, here, runners, measured, lp_outs, forward_s, batches, category, B, temperature, top_p,
             max_new_tokens, repeats, model_name, target, env_cpu, progress) -> list[AcceptanceRow]:
    """One (temperature, batch size)'s rows over the batches of one selection (every batch, or one category's):
    per runner the passes restricted to them (`_view`), their logprob pass outputs and forward costs per step (None
    where none ran on them); `progress` (None: silent) gets a line per row."""
    rows = []
    medians = [median_of(ps, key=lambda p: p["tokens"] / p["wall"]) for ps in measured]
    base, base_cpu = medians[0], medians[0]["tokens"] / medians[0]["cpu"]
    base_step_cpu = base["cpu"] / base["steps"]
    hf_cpu = next((m["tokens"] / m["cpu"] for c, m in zip(here, medians) if c.kind == "hf-target-only"), None)
    for case, runner, ps, med, lps, fwd in zip(here, runners, measured, medians, lp_outs, forward_s):
        tps_all = [p["tokens"] / p["wall"] for p in ps]
        tps, cpu_tps = med["tokens"] / med["wall"], med["tokens"] / med["cpu"]
        outs = med["outs"]
        identical = [a.token_ids == b.token_ids for a, b in zip(outs, base["outs"])]
        if lps is not None:  # the checked prompts' logprob pass decodes the same tokens too
            identical = [i and (k >= len(lps) or lps[k].token_ids == lp_outs[0][k].token_ids)
                         for k, i in enumerate(identical)]
        same = all(identical)
        lp = [abs(x - y) for a, b in zip(lps or [], lp_outs[0]) if a.token_ids == b.token_ids
              for x, y in zip(a.logprobs, b.logprobs)]
        acc = [a for o in outs for a in o.accept_lens]
        mean_acc = sum(acc) / len(acc) if acc else 1.0
        base_fwd = forward_s[0][0] if forward_s[0] is not None else 0.0
        fwd_cost = fwd[0] / base_fwd if fwd is not None and base_fwd else None
        spec = case.shape_at(B)
        verifies = all(a is not None for a in med["accept_by_batch"])  # a peer has no verify steps
        row = AcceptanceRow(
            **run.prefix(), impl="transformers" if case.is_peer else runner.impl,
            dtype=dtype_name(target.dtype), model=model_name, worker=case.kind, label=case.label,
            shape_policy=case.shape_policy,
            num_steps=spec.num_steps if spec else 0, topk=spec.topk if spec else 0,
            num_draft_tokens=spec.num_draft_tokens if spec else 1, prompt_lookup_num_tokens=case.prompt_lookup,
            batch_size=B, temperature=temperature, num_prompts=len(outs),
            prompt_len=sum(len(p) for b in batches for p in b) / len(outs), max_new_tokens=max_new_tokens,
            repeats=repeats, decode_steps=med["steps"] if not case.is_peer else "", tokens=med["tokens"],
            wall_s=round(med["wall"], 4), tokens_per_s=round(tps, 2),
            tokens_per_s_p20=round(quantile(tps_all, 0.2), 2),
            tokens_per_s_p80=round(quantile(tps_all, 0.8), 2),
            cpu_s=round(med["cpu"], 4), cpu_tokens_per_s=round(cpu_tps, 2),
            cpu_tokens_per_s_by_pass=";".join(f"{p['tokens'] / p['cpu']:.2f}" for p in ps),
            mean_accept_len=round(sum(acc) / len(acc), 4) if acc else "",
            step_cost_in_target_only_steps=(round(med["cpu"] / med["steps"] / base_step_cpu, 4)
                                            if not case.is_peer else ""),
            speedup_vs_target_only=round(tps / (base["tokens"] / base["wall"]), 4),
            cpu_speedup_vs_target_only=round(cpu_tps / base_cpu, 4),
            cpu_speedup_vs_hf_target_only=round(cpu_tps / hf_cpu, 4) if hf_cpu else "",
            same_tokens_as_target_only=same if temperature == 0 else "",
            identical_request_fraction=round(sum(identical) / len(identical), 4) if temperature == 0 else "",
            max_logprob_diff=f"{max(lp):.2e}" if lp else "", cpu_model=env_cpu,
            linear_backend="" if case.is_peer else linear_summary(),
            forward_cost_in_target_only_steps=round(fwd_cost, 4) if fwd_cost else "",
            speedup_bound=round(mean_acc / fwd_cost, 4) if fwd_cost else "",
            # a no-draft step has a draft phase too (NGRAM's host trie work): reported for every drafting case
            draft_ms_per_step=round(fwd[1] * 1e3, 4) if fwd is not None and case.spec is not None else "",
            tokens_by_batch=",".join(str(t) for t in med["tokens_by_batch"]),
            accept_len_by_batch=",".join(f"{a:.4f}" for a in med["accept_by_batch"]) if verifies else "",
            verify_steps_by_batch=",".join(str(n) for n in med["verifies_by_batch"]) if verifies else "",
            cpu_s_by_batch=";".join(",".join(f"{c:.4f}" for c in p["cpu_by_batch"]) for p in ps),
            top_p=top_p, verify=spec.verify if spec is not None and not case.is_peer else "", category=category)
        rows.append(row)
        if progress is not None:
            progress(f"T={temperature} top-p={top_p} B={B} {case.label:24s} tok/s {tps:8.1f} "
                     f"cpu-tok/s {cpu_tps:8.1f} "
                     f"accept {row.mean_accept_len or 1:.2f} x{row.cpu_speedup_vs_target_only:.2f} "
                     + (f"bound x{row.speedup_bound:.2f} " if row.speedup_bound != "" else "")
                     + f"same={same}")
    return rows


def tuned_paths(values: list[str], pair: str) -> list[Path]:
    """`--tuned` values: a file's path, or the bench's pair name for every tuned file shipped for that pair
    (`specdec.tuning.shipped_files`); a one-line ValueError for another pair's name or a pair with none."""
    out = []
    for value in values:
        if not names_a_pair(value):
            out.append(Path(value))
            continue
        if value != pair:
            raise ValueError(f"--tuned {value!r} names a pair, but the bench runs {pair!r}: give a path or {pair!r}")
        found = [path for (name, _), path in shipped_files().items() if name == pair]
        if not found:
            raise ValueError(f"--tuned {value!r}: no tuned file ships for pair {pair!r}; shipped: {shipped_names()}")
        out += found
    return out


def estimate(target, cases, prompts, batch_sizes, temperatures, max_new_tokens: int, repeats: int,
             impl: str = "reference", top_ps=(1.0,), check_prompts: int | None = None,
             categories: list[str] | None = None) -> str:
    """The line `specdec bench` prints before it starts: the workload and how long it will take, every batch priced
    at what target-only takes for it on this machine, measured now (`target_only_batch_seconds`)."""
    planned = planned_decodes(cases, len(prompts), batch_sizes, temperatures, repeats, top_ps, check_prompts,
                              categories)
    seconds = target_only_batch_seconds(target, prompts, batch_sizes, max_new_tokens, impl=impl)
    total = sum(n * seconds[B] for B, n in planned.items())
    return (f"estimate: {about(total)} for {sum(planned.values())} batch decodes of {max_new_tokens} tokens "
            f"({len(cases)} workers x batch sizes {', '.join(map(str, batch_sizes))} x temperatures "
            f"{', '.join(f'{t:g}' for t in temperatures)} (top-p {', '.join(f'{p:g}' for p in top_ps)} when "
            f"sampled) x {repeats} timed passes, and a logprob and a phase pass per engine"
            f"{'' if check_prompts is None else f' over the first {check_prompts} prompts'}), each priced at "
            f"what target-only takes for it here, measured just now: drafting workers usually run faster, the "
            f"transformers peers slower. --num-prompts, --max-new-tokens, --repeats, --workers and --no-peers "
            f"shorten it")


def main_bench(args) -> int:
    """`specdec bench`: a model (`--model`: a zoo name, a GGUF file or a Hugging Face directory, with `--draft`
    directories) on its prompts (`--prompts FILE`, else its held-out set: `specdec.prompt_sets`); one CSV + its plot in
    args.out.

    A byte pair continues held-out stdlib code (--prompt-len bytes), every request exactly --max-new-tokens long. A
    model with a chat template (the zoo's real target, a user's) answers chat prompts rendered by it and stops at its
    tokenizer's EOS ids, as generation does; the transformers peers stop at the same ids and load the same weights,
    from the directory the target loads from (a GGUF file's: the one it was converted into, `cached_gguf_dir`). Rows
    per category follow the overall ones where the prompts have several categories (`run_benchmark`)."""
    # lazy: the CLI imports this module at start; the zoo, the report (pandas) and transformers load on use
    from ... import zoo
    from ...prompt_sets import load_requests
    from ..report.figures import load_results
    from ..report.plots import plot_acceptance_and_speedup

    dtype = DTYPES[args.dtype]
    bundle = zoo.load_model(zoo.speed_pair() if args.model == "auto" else args.model, device=args.device,
                            dtype=dtype, drafts=args.draft or ())
    drafts = {kind: getattr(bundle, kind) for kind in offered_kinds(bundle, args.workers)}
    requests = load_requests(bundle, args.prompts, args.categories, args.turns, args.num_prompts,
                             prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens)
    prompts, categories = [r.ids for r in requests], [r.category for r in requests]
    stop_token_ids, peer_dir = bundle.stop_token_ids, bundle.target_dir
    shown = sorted(set(categories), key=categories.index)
    print(f"specdec bench: {bundle.name!r} ({bundle.target.config.num_hidden_layers}-layer target) on "
          f"{len(prompts)} {'held-out ' if args.prompts is None else ''}prompts of {min(map(len, prompts))}-"
          f"{max(map(len, prompts))} tokens" + (f" from {args.prompts}" if args.prompts else "")
          + (f" ({len(shown)} categories: {', '.join(shown)})" if len(shown) > 1 else "")
          + (", through its chat template" if bundle.chat else "")
          + (f", stopping at EOS ids {stop_token_ids}" if stop_token_ids else ""))
    cases = [c for c in by_kind(CASES + NGRAM_OPTION_CASES + DSPARK_OPTION_CASES)
             if c.spec is None or c.kind in drafts]
    # a model other than the byte pairs takes longer a step: its kinds' demo shapes only, unless asked
    shapes = args.shapes if args.shapes != "auto" else "all" if bundle.name in zoo.names() else "demo"
    if shapes != "all":  # none of NGRAM's option variants; "first": each kind at its default shape only
        cases = [c for c in cases if c.spec is None or (not c.draft_options and (
            shapes == "demo" or c.spec == DRAFT_KINDS[c.kind].default_spec(drafts[c.kind])))]
    cases = with_dspark_thresholds(cases, args.confidence_thresholds)
    cases = with_verify_rules(cases, args.verify)
    for path in tuned_paths(args.tuned or [], bundle.name):
        tuned = TunedSpec.load(path)
        if tuned.draft["kind"] not in drafts:
            drafts[tuned.draft["kind"]] = getattr(bundle, tuned.draft["kind"])
        cases += tuned_cases(tuned)
    if args.peers and dtype != torch.float32:
        print(f"note: the transformers peers run in float32 only: no peer rows for {args.dtype}")
    elif args.peers and peer_dir is None:
        print(f"note: {bundle.name!r} loads from no Hugging Face directory that transformers reads: no peer rows")
    elif args.peers:
        try:
            import transformers  # noqa: F401
            cases += PEER_CASES
        except ImportError:
            print("note: transformers is not installed (pip install -e '.[bench]'): no peer rows")
    with tempfile.TemporaryDirectory() as assistant_dir:
        if "draft_lm" in drafts and any(c.is_peer for c in cases):
            # transformers loads the same draft LM from what save_pretrained writes
            drafts["draft_lm"].save_pretrained(assistant_dir)
            cases.append(ASSISTED_CASE)
        sizes = args.batch_sizes or [1, 4]
        print(estimate(bundle.target, cases, prompts, sizes, args.temperatures, args.max_new_tokens, args.repeats,
                       args.impl, args.top_ps, args.check_prompts, categories))
        path = run_benchmark(bundle.target, drafts, cases, prompts,
                             sizes, args.temperatures, args.max_new_tokens,
                             model_name=bundle.name, impl=args.impl, repeats=args.repeats, out_dir=args.out,
                             tag="acceptance", peer_dir=peer_dir, assistant_dir=assistant_dir,
                             stop_token_ids=stop_token_ids, top_ps=args.top_ps, check_prompts=args.check_prompts,
                             categories=categories)
    png = plot_acceptance_and_speedup(load_results(args.out, path.name), path.with_suffix(".png"))
    print(f"wrote {path} and {png}")
    return 0


def draft_step_cost(target, eagle_head, prompts, max_new_tokens=32, num_steps=5, repeats=3) -> dict:
    """The cost of one draft forward of `eagle_head` (or of a DFlash drafter's block forward, at its trained block)
    against one target-only decode step, at B = 1, in process
    CPU seconds at the current thread count (median over `repeats`): the draft forwards are those of an
    EAGLE chain of `num_steps` (S - 1 per step inside the draft phase, with their top-K and tree bookkeeping,
    so the figure errs high); the target-only step is the difference of a long and a short decode, so the
    prefill cancels."""
    params = SamplingParams(max_new_tokens=max_new_tokens)
    max_len = max(len(p) for p in prompts) + max_new_tokens + 64
    base = Engine(target, max_batch=1, max_seq_len=max_len, impl="reference")
    # a block drafter (DFlash) drafts its trained block in one forward per step; an EAGLE chain S - 1 forwards
    block = getattr(eagle_head, "block_size", None)
    spec, forwards = (SpecConfig(num_steps, 1), num_steps - 1) if block is None else (SpecConfig(block - 1), 1)
    chain = Engine(target, eagle_head, spec, max_batch=1, max_seq_len=max_len, impl="reference")
    base.generate(prompts[:1], SamplingParams(max_new_tokens=4))
    chain.generate(prompts[:1], SamplingParams(max_new_tokens=4))
    def cpu_and_steps(n_tokens):
        cpu, steps = 0.0, 0
        for p in prompts:
            c0 = time.process_time()
            base.generate([p], SamplingParams(max_new_tokens=n_tokens))
            cpu += time.process_time() - c0
            steps += base.last_stats.num_decode_steps
        return cpu, steps

    target_step, draft_forward = [], []
    for _ in range(repeats):
        (cpu_long, steps_long), (cpu_short, steps_short) = cpu_and_steps(max_new_tokens), cpu_and_steps(2)
        target_step.append((cpu_long - cpu_short) / (steps_long - steps_short))  # the prefill cancels
        chain.worker.timer = PhaseTimer("cpu", clock=time.process_time)
        steps = 0
        for p in prompts:
            chain.generate([p], params)
            steps += chain.last_stats.num_decode_steps
        draft_forward.append(chain.worker.timer.totals().get("draft", 0.0) / steps / forwards)
        chain.worker.timer = None
    t, d = median_of(target_step), median_of(draft_forward)
    return dict(threads=torch.get_num_threads(), target_only_step_ms=round(t * 1e3, 4),
                eagle_draft_forward_ms=round(d * 1e3, 4), draft_forward_in_target_only_steps=round(d / t, 4))
