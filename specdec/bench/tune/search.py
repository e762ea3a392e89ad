"""`specdec tune`: the best speculative shape (num_steps, topk, num_draft_tokens) for a target + draft on this machine,
per batch bucket, written to the JSON the engine loads (`specdec.tuning`: `Engine(..., spec="tuned:PATH")` or
`"adaptive:PATH"`).

1. Acceptance by shape: every candidate shape (`candidate_shapes`) decodes the tuning prompts greedily at B = 1 (a
   request's greedy acceptance does not depend on its batch); each run's process CPU per step is also the B = 1 cost.
2. The cost model per bucket B: a full batch's step CPU time, linear in (1, S - 1, (S - 1) K, W) (the draft
   forwards, their frontier nodes, the verify width), fitted by least squares to measured steps: the acceptance runs
   at B = 1, `probe_shapes` decoded at batch B elsewhere, each decode's emptying taken out (`full_batch_step_ms`: a
   step of b requests costs linearly between the one-request step and the full one); and no draft at all
   (`NO_DRAFT`) measured at every bucket.
3. Prediction and confirmation: tokens per CPU second for every candidate from how the acceptance run's requests
   finished (`predicted_tokens_per_cpu_s`: batches of B such requests decode until their slowest is done, a step
   priced by how many requests it still holds, so a shape whose requests finish unevenly pays for its stragglers);
   the `--confirm` best predicted, the best predicted of each topk and of each num_steps, every chain, and NO_DRAFT
   are decoded at batch B in turn, and the best measured is the bucket's shape: no draft where no shape beat it (the
   batch then decodes target-only, as vLLM's `speculative_disable_by_batch_size` does by hand). Those measured
   shapes are the bucket's candidates for adaptive speculation.
4. `--check-grid` (or `--check-tuned PATH`, the check alone of a file tuned earlier): on other prompts than the
   tuning's (`--check-sets`: held-out code; that code alternating with English prose no model saw; that code with
   every other request sampled at temperature 1), the tuned shape, adaptive speculation and `CHECK_GRID`'s 12 shapes
   (the fixed S5 K4 W16 tree among them) decode side by side at every bucket, with target-only as the baseline whose
   tokens each greedy request must repeat: the goal's figures (the tuned shape within 3 % of the best of the grid;
   adaptive at least the best static shape where drafts succeed for some requests and fail for others).

Writes the JSON (`--out`, default results/tuned-<pair>-<kind>.json; the files that ship with the zoo's pairs,
which `spec="tuned:<pair>"` loads, are specdec/zoo/tuned/<pair>-<kind>.json) and results/tune-<run_id>.csv
(`TuneRow`: one row per measured or predicted (bucket, shape)); prints the choice, the predicted and the measured
figures side by side. Timing is process CPU time: run it at one thread (`--threads 1`, the default) on a shared machine.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ... import Engine, SamplingParams, SpecConfig
from ...ops.contract import NO_DRAFT, max_num_draft_tokens
from ...tuning import Bucket, Candidate, TunedSpec, fingerprint, parameters_entry, shape_name
from ..common import Run, RunRow, cpu_model, dtype_name, median_of
from ...draft_kinds import kind_of

#: the 12 shapes the goal compares the tuned one with: chains, narrow and wide trees
CHECK_GRID = ((2, 1, 3), (3, 1, 4), (4, 1, 5), (5, 1, 6), (3, 2, 6), (4, 2, 8), (5, 2, 12), (3, 4, 8), (4, 4, 12),
              (5, 4, 16), (5, 4, 24), (6, 4, 32))
FIXED_TREE = (5, 4, 16)
#: the grid check's prompt sets (`--check-sets`)
CHECK_SETS = ("code", "mixed", "sampled")


@dataclass
class TuneRow(RunRow):
    """One (bucket, shape, measurement) of `specdec tune`. source: "acceptance" (B = 1, every candidate), "probe" (a
    cost-model probe), "predicted" (the model only: no measured columns), "confirm" (a best predicted, measured),
    "check" (--check-grid, on the evaluation prompts; `policy` "static", "tuned", "adaptive" or "target-only").
    prompt_set: "tuning" (held-out code, seed 1), "code" (held-out code, seed 0), "mixed" (that code alternating
    with English prose no model saw, `specdec.zoo.corpus.prose_prompts`) or "sampled" (that code, every other request
    sampled at temperature 1: `sampled_prompts`; same_tokens_as_target_only then judges the greedy ones). step_ms:
    the measured decode's CPU per decode step (its batches' emptying included); predicted_step_ms: the cost model's
    step of a full batch."""

    model: str
    kind: str
    impl: str
    dtype: str
    cpu_model: str
    batch_size: int
    source: str
    prompt_set: str
    policy: str
    label: str
    num_steps: int
    topk: int
    num_draft_tokens: int
    num_prompts: int
    max_new_tokens: int
    mean_accept_len: float | str
    step_ms: float | str
    predicted_step_ms: float | str
    predicted_tokens_per_cpu_s: float | str
    tokens_per_cpu_s: float | str
    tokens_per_cpu_s_by_pass: str
    speedup_vs_target_only: float | str
    same_tokens_as_target_only: bool | str
    chosen: bool


def candidate_shapes(max_steps: int = 6, topks=(1, 2, 4), widths=(4, 6, 8, 12, 16, 24, 32)) -> list:
    """Chains S = 1..max_steps, and for each topk > 1 and S >= 2 every width in `widths` that the tree can hold
    and that reaches its depth (W > S)."""
    shapes = [(s, 1, s + 1) for s in range(1, max_steps + 1)]
    for k in topks:
        if k == 1:
            continue
        for s in range(2, max_steps + 1):
            shapes += [(s, k, w) for w in widths if s < w <= max_num_draft_tokens(k, s)]
    return shapes


def probe_shapes(shapes) -> list:
    """The cost model's probes at a batch size above 1 (B = 1 fits on every candidate's acceptance run): per topk,
    its shallowest-narrowest, deepest-widest and middle shape, so that every feature of the model varies."""
    out = []
    for k in sorted({s[1] for s in shapes}):
        of_k = sorted((s for s in shapes if s[1] == k), key=lambda s: (s[0], s[2]))
        out += [of_k[0], of_k[len(of_k) // 2], of_k[-1]]
    return list(dict.fromkeys(out))


def fixed_shape_spec(target, draft, shape, batch_size: int) -> TunedSpec:
    """An in-memory tuned spec that runs `shape` at every step (NO_DRAFT included), for measuring it."""
    drafting = shape if shape != NO_DRAFT else (1, 1, 2)
    bucket = Bucket(drafting, (Candidate(shape, 1.0, 1.0),))
    return TunedSpec({"fingerprint": fingerprint(target)}, {"kind": kind_of(draft).name,
                                                             "fingerprint": fingerprint(draft)},
                     {}, {batch_size: bucket}, adaptive=True, path="<fixed shape>")


class Measurer:
    """Decodes batches with one engine per (shape or policy, batch size), kept for the whole run. bar: a tqdm bar
    that counts the batches decoded (None: no bar)."""

    def __init__(self, target, draft, max_seq_len: int, max_new_tokens: int, bar=None):
        self.target, self.draft = target, draft
        self.max_seq_len, self.params = max_seq_len, SamplingParams(max_new_tokens=max_new_tokens)
        self.engines: dict = {}
        self.bar = bar

    def phase(self, name: str) -> None:
        """Names what the bar counts now."""
        if self.bar is not None:
            self.bar.set_description(name)

    def engine(self, key, batch_size: int) -> Engine:
        """key: a shape, None (target-only), or a TunedSpec (tuned / adaptive)."""
        k = (key if not isinstance(key, TunedSpec) else (id(key), key.adaptive), batch_size)
        if k not in self.engines:
            if key is None:
                spec, draft = None, None
            elif isinstance(key, TunedSpec):
                spec, draft = key, self.draft
            elif key == NO_DRAFT:
                spec, draft = fixed_shape_spec(self.target, self.draft, key, batch_size), self.draft
            else:
                spec, draft = SpecConfig(*key), self.draft
            e = Engine(self.target, draft, spec, impl="reference", max_batch=batch_size, max_seq_len=self.max_seq_len)
            e.generate([[1, 2, 3]] * batch_size, SamplingParams(max_new_tokens=4))  # warm-up
            self.engines[k] = e
        return self.engines[k]

    def requests(self, batch) -> tuple[list, list]:
        """A batch: prompts, each decoded with the measurer's params, or (prompt, SamplingParams) pairs ->
        (prompts, one SamplingParams per prompt)."""
        prompts = [item[0] if isinstance(item, tuple) else item for item in batch]
        return prompts, [item[1] if isinstance(item, tuple) else self.params for item in batch]

    def decode(self, key, batches, fresh: bool = True) -> dict:
        """-> tokens, decode steps, process CPU seconds, mean accepted length, the outputs. fresh: from a flushed
        draft cache (`Engine.flush_cache`), so that a shared NGRAM trie holds none of the outputs an earlier decode
        of the same prompts left in it (a pass of `decode_in_turn` flushes once, at its start)."""
        e = self.engine(key, len(batches[0]))
        if fresh:
            e.flush_cache()
        parts = []
        for batch in batches:
            prompts, params = self.requests(batch)
            c0 = time.process_time()
            out = e.generate(prompts, params, seed=0)
            parts.append(dict(tokens=e.last_stats.num_tokens, steps=e.last_stats.num_decode_steps,
                              cpu=time.process_time() - c0, outs=out))
            if self.bar is not None:
                self.bar.update()
        return combine_decodes(parts)

    def decode_in_turn(self, keys: list, batches, repeats: int, desc: str = "") -> list[dict]:
        """Each of `keys` decoding `batches`, `repeats` passes: the keys take turns on every batch and each pass
        starts at another key, so that a drift of the machine's speed lands on all of them alike -> per key its
        median pass by tokens per CPU second (a `decode` result), with "passes": every pass's tokens per CPU second
        in pass order (pass r of every key ran in the same stretch). desc: the bar's phase."""
        if desc:
            self.phase(desc)
        passes = [[] for _ in keys]
        for r in range(repeats):
            order = [(j + r * len(keys) // repeats) % len(keys) for j in range(len(keys))]
            parts = {i: [] for i in order}
            for i in order:
                self.engine(keys[i], len(batches[0])).flush_cache()
            for batch in batches:
                for i in order:
                    parts[i].append(self.decode(keys[i], [batch], fresh=False))
            for i in order:
                passes[i].append(combine_decodes(parts[i]))
        return [dict(median_of(p, key=lambda res: res["tokens_per_cpu_s"]),
                     passes=[res["tokens_per_cpu_s"] for res in p]) for p in passes]


def by_pass(res: dict | None) -> str:
    """A measured result's tokens per CPU second of every pass, `;`-separated (the CSV's by-pass column): one value
    where `decode_in_turn` took one pass; "" for a single `decode` (no passes)."""
    return ";".join(f"{x:.2f}" for x in res["passes"]) if res and "passes" in res else ""


def held_out_ratio(candidate: list[float], grid: dict) -> float | None:
    """A candidate's tokens/s against the best of a grid, the best chosen on other passes than the one compared.

    candidate: its tokens/s in each pass; grid: shape -> its tokens/s in the same passes (pass r of all taken in
    turn). For each pass r the grid's best is the shape with the highest median over the other passes, and the
    pass's ratio is candidate[r] over that shape's tokens/s in pass r; -> the median of those ratios (None with
    fewer than two passes). The best of twelve noisy medians, picked and compared on the same passes, is biased
    high by the noise itself (its largest error wins), which this estimate is not."""
    n = len(candidate)
    if n < 2 or any(len(v) != n for v in grid.values()):
        return None
    ratios = []
    for r in range(n):
        best = max(grid, key=lambda k: statistics.median(v for j, v in enumerate(grid[k]) if j != r))
        ratios.append(candidate[r] / grid[best][r])
    return statistics.median(ratios)


def combine_decodes(parts: list[dict]) -> dict:
    """Decodes of consecutive batches (each with tokens, steps, cpu, outs) -> one `Measurer.decode` result."""
    tokens, steps, cpu = (sum(p[k] for p in parts) for k in ("tokens", "steps", "cpu"))
    outs = [o for p in parts for o in p["outs"]]
    accepted = [a for o in outs for a in o.accept_lens]
    return dict(tokens=tokens, steps=steps, cpu=cpu, outs=outs,
                accept=sum(accepted) / len(accepted) if accepted else 1.0,
                step_ms=1e3 * cpu / max(steps, 1), tokens_per_cpu_s=tokens / cpu if cpu else float("nan"))


def cost_features(shape) -> list[float]:
    s, k, w = shape
    return [1.0, s - 1.0, (s - 1.0) * k, float(w)]


def fit_cost_model(observed: dict) -> torch.Tensor:
    """observed: drafting shape -> measured step ms -> the linear model's coefficients (least squares)."""
    shapes = list(observed)
    x = torch.tensor([cost_features(s) for s in shapes], dtype=torch.float64)
    y = torch.tensor([observed[s] for s in shapes], dtype=torch.float64)[:, None]
    return torch.linalg.lstsq(x, y).solution[:, 0]


def predict_step_ms(coef: torch.Tensor, shape) -> float:
    return float(torch.tensor(cost_features(shape), dtype=torch.float64) @ coef)


def request_steps(res: dict) -> list[int]:
    """A `Measurer.decode` result -> each request's decode steps."""
    return [len(o.accept_lens) for o in res["outs"]]


def full_batch_step_ms(res: dict, one_ms: float, B: int) -> float:
    """A decode at batch B -> the cost of a step of the full batch, the batch's emptying taken out. A step of b
    requests is taken to cost one_ms + (b - 1) / (B - 1) (full - one_ms), linear between a one-request step (one_ms,
    measured at B = 1) and a full one, so the decode's CPU is one_ms T + (full - one_ms) (R - T) / (B - 1), T its
    batches' steps and R its requests' steps summed (R = B T when every request takes as many steps). Never below
    the decode's average step, which its emptying can only have lowered (a noisy one_ms could say otherwise)."""
    T, R = res["steps"], sum(request_steps(res))
    if B == 1 or R <= T:
        return res["step_ms"]
    return max(res["step_ms"], one_ms + (1e3 * res["cpu"] - one_ms * T) * (B - 1) / (R - T))


def predicted_tokens_per_cpu_s(steps: list[int], tokens: list[int], one_ms: float, full_ms: float, B: int) -> float:
    """Tokens per CPU second of batches of B requests that take the steps and emit the tokens the sample's requests
    did at B = 1 (a request's greedy acceptance does not depend on its batch): the sample repeated until it fills a
    batch, cut into batches of B, each decoding until its slowest request is done, a step priced by how many requests
    it still holds (`full_batch_step_ms`'s linear cost). This is what the batch's emptying costs: its last steps
    serve a few slow requests at nearly a full step's price."""
    virtual = list(zip(steps, tokens)) * -(-B // len(steps))
    cost_ms = emitted = 0.0
    for i in range(0, len(virtual) - B + 1, B):
        batch = virtual[i:i + B]
        T, R = max(n for n, _ in batch), sum(n for n, _ in batch)
        cost_ms += R * one_ms if B == 1 else T * one_ms + (full_ms - one_ms) * (R - T) / (B - 1)
        emitted += sum(k for _, k in batch)
    return emitted / (cost_ms / 1e3)


def batches_of(prompts, batch_size: int) -> list:
    n = len(prompts) - len(prompts) % batch_size
    if n == 0:
        raise ValueError(f"batch size {batch_size} exceeds the {len(prompts)} prompts")
    return [prompts[i:i + batch_size] for i in range(0, n, batch_size)]


def confirm_candidates(ranked: list, confirm: int) -> list:
    """Shapes ranked by predicted tokens/s (NO_DRAFT among them) -> the ones the confirm step measures, in that
    order: the `confirm` best predicted, the best of each topk and of each depth, every chain, and NO_DRAFT.

    Adaptive speculation's candidates should differ in cost, down to the shallow chains a request whose drafts
    mostly fail is best served by. The chains are all measured because the cost model ranks them worst against the
    trees of their depth where the verify is dearest: on the deep pair at B = 16 it put the K4 tree of depth 3 ahead
    of the chain S3, which the grid check then found best. No draft is measured in turn with them:
    where no shape beats it at this batch size, the bucket does not draft."""
    drafting = [s for s in ranked if s != NO_DRAFT]
    best_of = [next(s for s in drafting if s[i] == v) for i in (1, 0) for v in sorted({s[i] for s in drafting})]
    return list(dict.fromkeys(ranked[:confirm] + best_of + [s for s in drafting if s[1] == 1] + [NO_DRAFT]))


def max_confirmed(shapes, confirm: int) -> int:
    """The most shapes `confirm_candidates` can return for these candidates (NO_DRAFT included), whatever the
    ranking: the planned work of a confirm step before its ranking is known."""
    drafting = list(shapes)
    best_of = len({s[1] for s in drafting}) + len({s[0] for s in drafting})
    return min(len(drafting) + 1, confirm + best_of + sum(1 for s in drafting if s[1] == 1) + 1)


def planned_decodes(shapes, batch_sizes, num_prompts: int, acceptance_prompts: int | None, confirm: int,
                    repeats: int, check_repeats=(), check_sets: int = 0) -> dict:
    """Batch size -> the batches of that size a `specdec tune` run decodes (warm-ups left out; each confirm step
    counted at `max_confirmed`, which the bar's total drops to the step's own count once it is known): the progress
    bar's total and the estimate's workload. check_repeats: the grid check's passes per bucket (none: no check)."""
    shapes = list(shapes)
    out = {1: (len(shapes) + 1) * min(acceptance_prompts or num_prompts, num_prompts)} if shapes else {}
    for B in batch_sizes:
        batches = num_prompts // B
        probes = len(probe_shapes(shapes)) if B > 1 and shapes else 0
        tuning = (probes + 1 + max_confirmed(shapes, confirm) * repeats) * batches if shapes else 0
        out[B] = out.get(B, 0) + tuning
    for B, passes in zip(batch_sizes, check_repeats):
        out[B] = out.get(B, 0) + check_sets * (len(CHECK_GRID) + 3) * passes * (num_prompts // B)
    return out


def tune(target, draft, tune_prompts, batch_sizes, max_new_tokens: int, shapes=None, confirm: int = 3,
         repeats: int = 1, model_name: str = "", progress=print, run: Run | None = None,
         acceptance_prompts: int | None = None, bar=None):
    """-> (the TunedSpec, the TuneRows, the Measurer with its engines). Acceptance is measured on the first
    `acceptance_prompts` of `tune_prompts` (all by default), costs at batch B on all of them. Every figure is process
    CPU time at the current thread count. bar: a tqdm bar counting the batches decoded (`planned_decodes`)."""
    shapes = list(shapes or candidate_shapes())
    kind = kind_of(draft).name
    run = run or Run("tune", target.device)
    max_len = max(len(p) for p in tune_prompts) + max_new_tokens + 64
    m = Measurer(target, draft, max_len, max_new_tokens, bar=bar)
    rows = []

    def row(B, source, shape, res=None, pred_ms="", pred_tps="", chosen=False, policy="static", base=None,
            label=None, n=None):
        s, k, w = shape if shape is not None else (0, 0, 1)
        same = "" if base is None or res is None else all(
            a.token_ids == b.token_ids for a, b in zip(res["outs"], base["outs"]))
        rows.append(TuneRow(
            **run.prefix(), model=model_name, kind=kind, impl="reference", dtype=dtype_name(target.dtype),
            cpu_model=cpu_model(), batch_size=B, source=source, prompt_set="tuning", policy=policy,
            label=label or (shape_name(shape) if shape is not None else "target-only"), num_steps=s, topk=k,
            num_draft_tokens=w, num_prompts=n or len(tune_prompts), max_new_tokens=max_new_tokens,
            mean_accept_len=round(res["accept"], 4) if res else "", step_ms=round(res["step_ms"], 4) if res else "",
            predicted_step_ms=round(pred_ms, 4) if pred_ms != "" else "",
            predicted_tokens_per_cpu_s=round(pred_tps, 2) if pred_tps != "" else "",
            tokens_per_cpu_s=round(res["tokens_per_cpu_s"], 2) if res else "",
            tokens_per_cpu_s_by_pass=by_pass(res),
            speedup_vs_target_only=round(res["tokens_per_cpu_s"] / base["tokens_per_cpu_s"], 4)
            if res and base else "", same_tokens_as_target_only=same, chosen=chosen))

    one = batches_of(tune_prompts[:acceptance_prompts or len(tune_prompts)], 1)
    # per shape at B = 1: acceptance, a step's cost, and each request's steps and tokens (how a batch empties)
    accept, cost_at_one, drain = {}, {}, {}
    m.phase("acceptance by shape (B=1)")
    for shape in shapes + [NO_DRAFT]:
        res = m.decode(shape, one)
        accept[shape], cost_at_one[shape] = res["accept"], res["step_ms"]
        drain[shape] = (request_steps(res), [len(o.token_ids) for o in res["outs"]])
        row(1, "acceptance", shape, res, n=len(one))
    buckets = {}
    for B in batch_sizes:
        batches = batches_of(tune_prompts, B)
        # the cost model prices a full batch's step: each measured decode's emptying is taken out
        if B == 1:
            observed = {s: cost_at_one[s] for s in shapes}
        else:
            observed = {}
            m.phase(f"cost probes (B={B})")
            for shape in probe_shapes(shapes):
                res = m.decode(shape, batches)
                observed[shape] = full_batch_step_ms(res, cost_at_one[shape], B)
                row(B, "probe", shape, res)
        coef = fit_cost_model(observed)
        no_draft = m.decode(NO_DRAFT, batches)
        row(B, "probe", NO_DRAFT, no_draft, label="no draft")
        no_draft_ms = full_batch_step_ms(no_draft, cost_at_one[NO_DRAFT], B)
        # a linear model can extrapolate below what no step costs: no drafting step is cheaper than no draft
        predicted = {s: max(predict_step_ms(coef, s), no_draft_ms) for s in shapes}
        predicted[NO_DRAFT] = no_draft_ms
        tps = {s: predicted_tokens_per_cpu_s(*drain[s], cost_at_one[s] if B > 1 else predicted[s], predicted[s], B)
               for s in predicted}
        ranked = sorted(predicted, key=lambda s: -tps[s])
        to_confirm = confirm_candidates(ranked, confirm)
        if bar is not None:  # the plan counted the most a confirm step can measure
            bar.total -= (max_confirmed(shapes, confirm) - len(to_confirm)) * repeats * len(batches)
            bar.refresh()
        measured = dict(zip(to_confirm, m.decode_in_turn(to_confirm, batches, repeats, desc=f"confirm (B={B})")))
        best = max(measured, key=lambda s: measured[s]["tokens_per_cpu_s"])
        for shape in ranked:
            if shape in measured:
                row(B, "confirm", shape, measured[shape], predicted[shape], tps[shape], chosen=shape == best)
            else:
                row(B, "predicted", shape, None, predicted[shape], tps[shape])
        # adaptive speculation prices one step of the batch in hand: a full batch's step, not the emptying average
        cands = [Candidate(s, round(measured[s]["accept"], 4),
                           round(full_batch_step_ms(measured[s], cost_at_one[s], B), 4)) for s in measured]
        buckets[B] = Bucket(best, tuple(cands))
        progress(f"B={B:<3d} chose {shape_name(best):12s} predicted {tps[best]:8.1f} tok/cpu-s, measured "
                 f"{measured[best]['tokens_per_cpu_s']:8.1f} (accept {measured[best]['accept']:.2f}, a full batch's "
                 f"step {full_batch_step_ms(measured[best], cost_at_one[best], B):.2f} ms; predicted "
                 f"{predicted[best]:.2f} ms); no draft {no_draft_ms:.2f} ms per full step")
        for shape in to_confirm:
            if shape != best:
                progress(f"        also measured {shape_name(shape):12s} predicted {tps[shape]:8.1f}, measured "
                         f"{measured[shape]['tokens_per_cpu_s']:8.1f} tok/cpu-s")
    tuned = TunedSpec({"name": model_name, "fingerprint": fingerprint(target)},
                      {"kind": kind, "fingerprint": fingerprint(draft), **parameters_entry(draft)},
                      {"device": str(target.device), "cpu_model": cpu_model(), "threads": torch.get_num_threads(),
                       "impl": "reference", "dtype": dtype_name(target.dtype)},
                      buckets, extra={"tuned_at": run.run_id, "num_prompts": len(tune_prompts),
                                      "max_new_tokens": max_new_tokens, "shapes_tried": len(shapes)})
    return tuned, rows, m
