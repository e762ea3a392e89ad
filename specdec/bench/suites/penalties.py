"""`specdec bench --suite penalties`: what SGLang's approximation of penalties costs, and what exact ones cost.

For each penalty setting and each worker case, under `penalty_mode` "exact" and "sglang", and exact with the
drafts penalised too (`draft_penalties`): the fraction of requests whose greedy output differs from target-only
decoding with the same penalties, and the mean accepted tokens per verify step. Then the price of exactness:
the process CPU time per decode step with the setting against the same worker without penalties, the two runs
taken in turn (`time_in_turn`). One CSV per run (`results/penalties-<run_id>.csv`); `specdec report` prints
its table.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ... import Engine, SamplingParams, SpecConfig, zoo
from ...models.linear import cpu_linear_backend
from ..cases import CASES, WorkerCase, offered_cases
from ..common import Run, RunRow, cpu_model, median_of, quantile, time_in_turn
from ...zoo.corpus import heldout_prompts

#: name -> the SamplingParams fields of a penalty setting (greedy; "none" is the reference point)
SETTINGS = {
    "none": {},
    "repetition 1.1": dict(repetition_penalty=1.1),
    "repetition 1.5": dict(repetition_penalty=1.5),
    "frequency 0.5": dict(frequency_penalty=0.5),
    "frequency 1.0, presence 0.5": dict(frequency_penalty=1.0, presence_penalty=0.5),
}
#: (penalty_mode, draft_penalties) of the rows of one worker and setting
MODES = (("exact", False), ("sglang", False), ("exact", True))


@dataclass
class PenaltyRow(RunRow):
    """One (worker, penalty setting, penalty mode) of `specdec bench --suite penalties` (results/README.md)."""

    impl: str
    model: str
    worker: str
    label: str
    num_steps: int | str
    topk: int | str
    num_draft_tokens: int | str
    penalty: str
    penalty_mode: str
    draft_penalties: bool
    batch_size: int
    max_new_tokens: int
    decode_steps: int
    tokens: int
    differing_request_fraction: float
    mean_accept_len: float | str
    repeats: int | str
    step_cpu_ms: float | str
    step_cpu_ms_p20: float | str
    step_cpu_ms_p80: float | str
    step_cpu_ms_without_penalties: float | str
    penalty_step_overhead: float | str
    cpu_model: str
    linear_backend: str


def _with_mode(spec: SpecConfig | None, mode: str, draft_penalties: bool) -> SpecConfig | None:
    return None if spec is None else dataclasses.replace(spec, penalty_mode=mode, draft_penalties=draft_penalties)


def _step_cpu(engine: Engine, plain: Engine, prompts, params, plain_params, repeats):
    """Process CPU milliseconds per decode step of `engine` with `params` and of `plain` without penalties,
    taken in turn -> (median, p20, p80, median without)."""
    steps = []
    for e, p in ((engine, params), (plain, plain_params)):
        e.generate(prompts, p)
        steps.append(e.last_stats.num_decode_steps)
    us = time_in_turn([lambda: engine.generate(prompts, params), lambda: plain.generate(prompts, plain_params)],
                      engine.target.device, 2 * repeats)
    with_p = [t / 1e3 / steps[0] for t in us[0::2]]
    without = [t / 1e3 / steps[1] for t in us[1::2]]
    return median_of(with_p), quantile(with_p, 0.2), quantile(with_p, 0.8), median_of(without)


def run_penalties(target, drafts: dict, cases: list[WorkerCase], prompts: list[list[int]], max_new_tokens: int,
                  model_name: str, impl="reference", repeats=3, out_dir="results", progress=print) -> Path:
    """Every case (target-only first) under every setting and mode; one CSV; its path."""
    run = Run("penalties", target.device)
    rows = []
    B = len(prompts)
    for setting, fields in SETTINGS.items():
        params = SamplingParams(max_new_tokens=max_new_tokens, **fields)
        base = Engine(target, impl=impl, max_batch=B).generate(prompts, params)
        for case in cases:
            modes = MODES[:1] if case.spec is None or setting == "none" else MODES
            for mode, draft_penalties in modes:
                engine = Engine(target, drafts.get(case.kind), _with_mode(case.spec, mode, draft_penalties),
                                impl=impl, max_batch=B)
                outs = engine.generate(prompts, params)
                stats = engine.last_stats
                differ = sum(o.token_ids != b.token_ids for o, b in zip(outs, base)) / B
                timing = ("",) * 4
                if mode == "exact" and not draft_penalties and setting != "none":
                    plain = Engine(target, drafts.get(case.kind), case.spec, impl=impl, max_batch=B)
                    timing = tuple(round(t, 4) for t in _step_cpu(engine, plain, prompts, params,
                                                                  SamplingParams(max_new_tokens=max_new_tokens),
                                                                  repeats))
                spec = case.spec
                rows.append(PenaltyRow(
                    **run.prefix(), impl=engine.impl, model=model_name, worker=case.kind, label=case.label,
                    num_steps=spec.num_steps if spec else "", topk=spec.topk if spec else "",
                    num_draft_tokens=spec.num_draft_tokens if spec else "", penalty=setting, penalty_mode=mode,
                    draft_penalties=draft_penalties,
                    batch_size=B, max_new_tokens=max_new_tokens, decode_steps=stats.num_decode_steps,
                    tokens=stats.num_tokens, differing_request_fraction=round(differ, 4),
                    mean_accept_len=round(stats.mean_accept_len, 4) if spec else "",
                    repeats=repeats if timing[0] != "" else "", step_cpu_ms=timing[0], step_cpu_ms_p20=timing[1],
                    step_cpu_ms_p80=timing[2], step_cpu_ms_without_penalties=timing[3],
                    penalty_step_overhead=round(timing[0] / timing[3] - 1, 4) if timing[0] != "" else "",
                    cpu_model=cpu_model(), linear_backend=cpu_linear_backend()))
                progress(f"  {case.label:<24} {setting:<28} {mode + (' +draft' if draft_penalties else ''):<12} "
                         f"differ {differ:5.0%}"
                         + (f"  accept {stats.mean_accept_len:.2f}" if spec else "")
                         + (f"  step +{rows[-1].penalty_step_overhead:.1%}" if timing[0] != "" else ""))
    return run.write(rows, out_dir)


def penalties_table(df) -> str:
    """Markdown: per worker and penalty setting, the fraction of requests that leave target-only's greedy
    output and the accepted tokens per step under each mode, and the exact mode's step cost against none."""
    head = ["worker", "penalty", "differ (exact)", "differ (sglang)", "accepted / step (exact)",
            "accepted / step (sglang)", "accepted / step (exact, drafts penalised)", "step cost vs none (exact)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    df = df[df["penalty"] != "none"]
    for (label, penalty), g in df.groupby(["label", "penalty"], sort=False):
        g = g.assign(mode=[m + (" +draft" if str(d) == "True" else "") for m, d in
                           zip(g["penalty_mode"], g["draft_penalties"])])
        by = g.set_index("mode")

        def cell(mode, col, fmt, by=by):
            value = by.loc[mode, col] if mode in by.index else ""
            return "" if value == "" or value != value else fmt(float(value))

        pct, num = (lambda v: f"{v:.0%}"), (lambda v: f"{v:.2f}")
        lines.append("| " + " | ".join([
            label, penalty, cell("exact", "differing_request_fraction", pct),
            cell("sglang", "differing_request_fraction", pct), cell("exact", "mean_accept_len", num),
            cell("sglang", "mean_accept_len", num), cell("exact +draft", "mean_accept_len", num),
            cell("exact", "penalty_step_overhead", lambda v: f"{v:+.1%}"),
        ]) + " |")
    return "\n".join(lines)


def main_penalties(args) -> int:
    """`specdec bench --suite penalties` on the zoo pair `args.model` (default: the deep pair)."""
    bundle = zoo.load(zoo.speed_pair() if args.model == "auto" else args.model)
    cases = offered_cases(bundle, CASES, args.workers)
    drafts = {c.kind: getattr(bundle, c.kind) for c in cases if c.spec is not None}
    prompts = heldout_prompts(args.num_prompts, args.prompt_len, seed=0)
    print(f"specdec bench --suite penalties: zoo pair {bundle.name!r}, {len(prompts)} prompts x "
          f"{args.max_new_tokens} new tokens, batch of {len(prompts)}")
    path = run_penalties(bundle.target, drafts, cases, prompts, args.max_new_tokens, bundle.name, impl=args.impl,
                         repeats=args.repeats, out_dir=args.out)
    print(f"wrote {path}")
    return 0
