"""SUMMARY.md of a `specdec gpu-check` run, from its files and the parts' progress alone: per part what ran,
what failed, what was never reached and why; per goal met / not met / not measured, with the figure; decode
against the read ceiling and the other engines; the profiled decode step.

Everything here reads files that a killed part may have left half-written: a reader that fails costs its
own line ("unreadable: ..."), never the summary.
"""
from __future__ import annotations

from pathlib import Path

from .rows import E2E, ENVIRONMENT, KERNELS, TESTS, read_rows

GOAL_FRAC_OF_COPY = 0.8
GOAL_OP_SPEEDUP = 5.0
GOAL_E2E_SPEEDUP = {1: 3.0, 32: 2.0}
GOAL_MODEL = "random-llama-1.5b"
GOAL_ROWS, GOAL_VOCAB = 256, 151936
COPY_CEILING_MIN_BYTES = 2 << 30


def _f(x) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _ok(rows):
    return [r for r in rows if r.get("status", "ok") == "ok"]


# ---- per-part headlines ----------------------------------------------------------------------------------
def environment_headline(out: Path) -> str:
    env = {r["key"]: r["value"] for r in read_rows(out / ENVIRONMENT)}
    parts = []
    if env:
        gpu = env.get("gpu", "?")
        where = "no GPU" if gpu == "none" else (f"{gpu}, {env.get('sm_count')} SMs, L2 {env.get('l2_cache_mb')} MB, "
                                                f"driver {env.get('driver', '?')}")
        parts.append(f"{where}; torch {env.get('torch')} (CUDA {env.get('cuda_runtime')}), triton "
                     f"{env.get('triton')}, commit {env.get('commit')}")
    ceilings = {r["op"]: r for r in _ok(read_rows(out / KERNELS)) if r["impl"] == "ceiling"}
    if "device_copy" in ceilings:
        r = ceilings["device_copy"]
        parts.append(f"copy {float(r['gbps']):.0f} GB/s ({int(r['bytes']) / 2 / 2**30:.3g} GiB copied per round)")
    if "device_read" in ceilings:
        r = ceilings["device_read"]
        parts.append(f"read {_rate(float(r['gbps']))} GB/s ({int(r['bytes']) / 2**30:.3g} GiB read per launch"
                     + ("" if r["within_tolerance"] == "True" else ", its sum WRONG") + ")")
    if "matmul" in ceilings:
        r = ceilings["matmul"]
        parts.append(f"{r['dtype']} matmul {r['rows']}^3 {float(r['tflops']):.3g} TFLOP/s")
    return "; ".join(parts)


def logprob_headline(out: Path) -> str:
    rows = [r for r in read_rows(out / KERNELS) if r.get("part") == "logprob_kernels"]
    ok = _ok(rows)
    if not ok:
        return ""
    bad = [r for r in ok if r["within_tolerance"] != "True"]
    lines = [f"{len(ok) - len(bad)} of {len(ok)} rows finite and within 1e-3 of float64"]
    for r in bad[:3]:
        lines.append(f"OFF: {r['impl']} {r['rows']}x{r['vocab_size']} {r['dtype']} T={r['temperature'] or 'drawn'} "
                     f"err {r['max_abs_err_vs_float64']} finite {r['finite']}")
    tiny = [r for r in ok if r["check"] == "tiny_temperature"]
    if tiny:
        lines.append(f"T=0.01: {sum(r['within_tolerance'] == 'True' for r in tiny)} of {len(tiny)} rows finite and "
                     f"within tolerance (largest error {max(_f(r['max_abs_err_vs_float64']) or 0 for r in tiny):.1e})")
    sweep = [r for r in ok if r["check"] == "split_sweep" and r["rows"] == str(GOAL_ROWS)]
    if sweep:
        best = max(sweep, key=lambda r: _f(r["frac_of_copy"]) or 0)
        lines.append(f"forced splits at {GOAL_ROWS} rows: best {best['num_splits']} at "
                     f"{float(best['frac_of_copy']):.0%} of copy")
    return "; ".join(lines)


def ops_headline(out: Path) -> str:
    rows = _ok([r for r in read_rows(out / KERNELS) if r.get("part") == "decode_ops"])
    fast = [r for r in rows if r["impl"] == "fast" and r["speedup_vs_reference"]]
    if not fast:
        return ""
    return "fast / reference (op with host work): " + ", ".join(
        f"{r['op']} B={r['batch_size']} {float(r['speedup_vs_reference']):.2g}x" for r in fast[:12])


def graph_headline(out: Path) -> str:
    rows = _ok([r for r in read_rows(out / E2E) if r.get("part") == "graph_replay"])
    if not rows:
        return ""
    bad = [r for r in rows if r["token_identical"] != "True"]
    kind = "CUDA-graph replay vs fast eager" if rows[0]["cuda_graphs"] == "True" else \
        "static-buffer steps (no capture) vs eager"
    text = f"{kind}: token-identical in {len(rows) - len(bad)} of {len(rows)}"
    for r in bad[:4]:
        text += (f"; {r['label']} B={r['batch_size']} {r['sampling']}: request {r['first_diff_request']} step "
                 f"{r['first_diff_step']} token {r['token_this']} vs {r['token_other']}, gap "
                 f"{r['logit_gap'] or '?'}, padded {r['padded']}")
    return text


def e2e_headline(out: Path) -> str:
    rows = _ok([r for r in read_rows(out / E2E) if r.get("part") == "e2e"])
    if not rows:
        return ""
    lines = []
    for r in rows:
        if r["cuda_graphs"] == "True" and r["speedup_vs_reference"]:
            lines.append(f"{r['label']} B={r['batch_size']}: {float(r['speedup_vs_reference']):.1f}x reference")
    if not lines:
        best = max(rows, key=lambda r: _f(r["tokens_per_s"]) or 0)
        lines.append(f"{len(rows)} rows; fastest {best['label']} {best['impl']} B={best['batch_size']} "
                     f"{float(best['tokens_per_s']):.1f} tok/s")
    same = [r for r in rows if r["token_identical"] in ("True", "False")]
    if same:
        lines.append(f"bf16 graphs token-identical to fast eager in {sum(r['token_identical'] == 'True' for r in same)}"
                     f" of {len(same)}")
    return "; ".join(lines)


def tests_headline(out: Path) -> str:
    rows = read_rows(out / TESTS)
    if not rows:
        return ""
    count = {}
    for r in rows:
        count[r["status"]] = count.get(r["status"], 0) + 1
    failing = [r["nodeid"] for r in rows if r["status"] in ("failed", "error")]
    text = ", ".join(f"{n} {s}" for s, n in sorted(count.items()))
    return text + (f"; failing: {', '.join(failing[:6])}" + (" ..." if len(failing) > 6 else "") if failing else "")


def engines_headline(out: Path) -> str:
    rows = _ok([r for r in read_rows(out / E2E) if r.get("part") == "engines"])
    lines = [f"{ENGINE_NAMES.get(r['impl'], r['impl'])}{' + graphs' if r['cuda_graphs'] == 'True' else ''} "
             f"B={r['batch_size']}: {float(r['tokens_per_s']):.1f} tok/s" + _frac(r) for r in rows]
    total = [r for r in _ok(read_rows(out / KERNELS)) if r.get("part") == "profile" and r["op"] == "(total)"]
    if total:
        r = total[0]
        kernels = sum(1 for k in read_rows(out / KERNELS) if k.get("part") == "profile" and k["op"] != "(total)")
        lines.append(f"profile B={r['batch_size']}: {kernels} kernels, {float(r['calls']):g} launches, "
                     f"{float(r['total_us']):.0f} us of device time in a {float(r['median_us']):.0f} us replay")
    return "; ".join(lines)


HEADLINES = {"environment": environment_headline, "logprob_kernels": logprob_headline, "decode_ops": ops_headline,
             "graph_replay": graph_headline, "e2e": e2e_headline, "tests": tests_headline,
             "engines": engines_headline}
#: How the summary names an engines row's impl.
ENGINE_NAMES = {"transformers_compiled": "transformers static cache + compile",
                "transformers": "transformers static cache, not compiled", "reference_inductor": "reference + Inductor",
                "reference_aot_eager": "reference + aot_eager"}


def _rate(x: float) -> str:
    """A GB/s figure: whole numbers on a GPU, three significant digits for an interpreted kernel's."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _frac(r: dict) -> str:
    frac = _f(r.get("frac_of_read_ceiling"))
    return "" if frac is None else f" ({frac:.0%} of the read ceiling)"


# ---- sections below the parts table ---------------------------------------------------------------------
ROOFLINE_SIZES = ("1", "32")


def roofline_section(out: Path, smoke: bool) -> list[str]:
    """Decode against the read ceiling: at B = 1 and 32 (smoke: every size), target-only on every path and engine,
    each speculative worker with fast + graphs (eager where the run had no graphs)."""
    rows = _ok([r for r in read_rows(out / E2E) if r.get("part") in ("e2e", "engines")])
    if not smoke:
        rows = [r for r in rows if r["batch_size"] in ROOFLINE_SIZES]
    graphs = any(r["cuda_graphs"] == "True" for r in rows if r["part"] == "e2e")
    keep = [r for r in rows if r["part"] == "engines" or r["label"] == "target-only"
            or (r["impl"] == "fast" and (r["cuda_graphs"] == "True") == graphs)]
    if not keep:
        return []
    ceiling = next((r["read_ceiling_gbps"] for r in keep if r["read_ceiling_gbps"]), "")
    head = f"read ceiling {_rate(float(ceiling))} GB/s" if ceiling else "no read ceiling in this run"
    lines = ["## Decode against the read ceiling", "",
             f"Bytes per step: what one decode step must read at least (`roofline.min_step_bytes`: every weight "
             f"a forward touches, once per forward, and the KV cache at the mean context); {head}.", "",
             "| B | worker | engine | tok/s | step us | MB / step | GB/s | of read ceiling |",
             "|---|---|---|---|---|---|---|---|"]
    keep.sort(key=lambda r: (int(r["batch_size"]), r["label"] != "target-only", r["label"], r["part"] == "engines",
                             r["impl"], r["cuda_graphs"]))
    for r in keep:
        engine = ENGINE_NAMES.get(r["impl"], r["impl"]) + (" + graphs" if r["cuda_graphs"] == "True" else "")
        mb, gbps, frac, us = (_f(r[k]) for k in ("bytes_per_step", "read_gbps", "frac_of_read_ceiling", "step_us"))
        lines.append(f"| {r['batch_size']} | {r['label']} | {engine} | {float(r['tokens_per_s']):.1f} | "
                     f"{'' if us is None else f'{us:.0f}'} | {'' if mb is None else f'{mb / 1e6:.1f}'} | "
                     f"{'' if gbps is None else _rate(gbps)} | {'' if frac is None else f'{frac:.0%}'} |")
    notes = [r for r in keep if r["part"] == "engines" and r["note"]]
    if notes:
        lines += [""] + [f"- {ENGINE_NAMES.get(r['impl'], r['impl'])} B={r['batch_size']}: {r['note']}" for r in notes]
    return lines


def profile_section(out: Path, top: int = 30) -> list[str]:
    """The profiled replay's kernels, heaviest first (the first `top`), and the total."""
    rows = _ok([r for r in read_rows(out / KERNELS) if r.get("part") == "profile"])
    total = next((r for r in rows if r["op"] == "(total)"), None)
    kernels = [r for r in rows if r["op"] != "(total)"]
    if total is None or not kernels:
        return []
    device_us = float(total["total_us"])
    cuda = total["timer"] == "cuda_event"
    what = ("one CUDA-graph replay of the fast target-only decode step" if cuda else
            "one eager decode step of the fast target-only path through the graphs' static buffers (CPU: ops' self "
            "CPU time, not kernels)")
    lines = [f"## Profile: {what}, B = {total['batch_size']}", "",
             f"torch.profiler over {total['repeats']} replays, per replay; the replay itself takes "
             f"{float(total['median_us']):.0f} us (median of the timed replays, p20-p80 {float(total['p20_us']):.0f}-"
             f"{float(total['p80_us']):.0f}).", "",
             "| # | kernel | count | total us | share |", "|---|---|---|---|---|"]
    for i, r in enumerate(kernels[:top], 1):
        name = r["op"] if len(r["op"]) <= 90 else r["op"][:87] + "..."
        lines.append(f"| {i} | `{name.replace('|', '/')}` | {float(r['calls']):g} | {float(r['total_us']):.1f} | "
                     f"{float(r['total_us']) / device_us:.1%} |")
    rest = kernels[top:]
    if rest:
        lines.append(f"|  | {len(rest)} more | {sum(float(r['calls']) for r in rest):g} | "
                     f"{sum(float(r['total_us']) for r in rest):.1f} | "
                     f"{sum(float(r['total_us']) for r in rest) / device_us:.1%} |")
    lines.append(f"|  | **total** | {float(total['calls']):g} | {device_us:.1f} | 100% |")
    return lines


# ---- goals -----------------------------------------------------------------------------------------------
def goals(out: Path, smoke: bool) -> list[tuple[str, str, str]]:
    """(goal, met | not met | not measured, figure) for each goal of the run."""
    kernels = read_rows(out / KERNELS)
    copy = [r for r in _ok(kernels) if r["op"] == "device_copy" and r["impl"] == "ceiling"]
    at_goal = [r for r in kernels if r.get("part") == "logprob_kernels" and r["check"] == "headline"
               and r["rows"] == str(GOAL_ROWS) and r["vocab_size"] == str(GOAL_VOCAB) and r["dtype"] == "bfloat16"
               and r["top_logprobs_num"] == "0"]
    where = f"{GOAL_ROWS} x {GOAL_VOCAB:,} bf16"
    out_rows = []

    def by_impl(impl):
        return next((r for r in at_goal if r["impl"] == impl and r["num_splits"] in ("", "auto")), None)

    kern, fast = by_impl("fast_kernels"), by_impl("fast")
    goal = f"fused logprob kernels >= {GOAL_FRAC_OF_COPY:.0%} of a >= 2 GiB copy's bandwidth at {where}"
    if smoke:
        out_rows.append((goal, "not measured", "smoke run (CPU, tiny shapes)"))
    elif kern is None or kern["status"] != "ok":
        out_rows.append((goal, "not measured", _why_missing(kern, "logprob_kernels")))
    elif not copy or int(copy[0]["bytes"]) < 2 * COPY_CEILING_MIN_BYTES:
        out_rows.append((goal, "not measured", "no copy ceiling of >= 2 GiB in this run"))
    else:
        frac = float(kern["frac_of_copy"])
        out_rows.append((goal, "met" if frac >= GOAL_FRAC_OF_COPY else "not met",
                         f"{frac:.0%} of {float(copy[0]['gbps']):.0f} GB/s ({float(kern['gbps']):.0f} GB/s, "
                         f"{kern['splits_used']} splits, {float(kern['programs_per_sm']):.1f} programs per SM)"))
    goal = f"fast logprob op >= {GOAL_OP_SPEEDUP:g}x the reference op (same host work and sync) at {where}"
    if smoke:
        out_rows.append((goal, "not measured", "smoke run (CPU, tiny shapes)"))
    elif fast is None or fast["status"] != "ok" or not fast["speedup_vs_reference"]:
        out_rows.append((goal, "not measured", _why_missing(fast, "logprob_kernels")))
    else:
        x = float(fast["speedup_vs_reference"])
        extra = f"; kernels alone vs the reference op graph-replayed {float(kern['speedup_vs_reference']):.1f}x" \
            if kern is not None and kern["speedup_vs_reference"] else ""
        out_rows.append((goal, "met" if x >= GOAL_OP_SPEEDUP else "not met", f"{x:.1f}x{extra}"))

    e2e = [r for r in read_rows(out / E2E) if r.get("part") == "e2e" and r.get("model") in (GOAL_MODEL, "")]
    for B, x_goal in GOAL_E2E_SPEEDUP.items():
        goal = f"fast + CUDA graphs >= {x_goal:g}x reference at B={B} on the 1.5B model (every worker)"
        if smoke:
            out_rows.append((goal, "not measured", "smoke run (CPU, no CUDA graphs)"))
            continue
        rows = [r for r in e2e if r["batch_size"] == str(B) and r["cuda_graphs"] == "True"]
        measured = [r for r in rows if r["status"] == "ok" and r["speedup_vs_reference"]]
        if not measured:
            out_rows.append((goal, "not measured", _why_missing(rows[0] if rows else None, "e2e")))
            continue
        figure = ", ".join(f"{r['label']} {float(r['speedup_vs_reference']):.1f}x" for r in measured)
        missing = len({r["label"] for r in rows}) - len(measured)
        complete = missing == 0 and len(measured) >= 3
        status = "not met" if any(float(r["speedup_vs_reference"]) < x_goal for r in measured) else \
            ("met" if complete else "not measured")
        out_rows.append((goal, status, figure + ("" if complete else " (not every worker measured)")))

    goal = "CUDA-graph decode token-identical to fast eager in fp32"
    replay = [r for r in read_rows(out / E2E) if r.get("part") == "graph_replay"]
    measured = _ok(replay)
    if smoke:
        n = sum(r["token_identical"] == "True" for r in measured)
        out_rows.append((goal, "not measured", f"smoke run: static-buffer steps vs eager identical in {n} of "
                         f"{len(measured)} (no capture on a CPU)"))
    elif not measured:
        out_rows.append((goal, "not measured", _why_missing(replay[0] if replay else None, "graph_replay")))
    else:
        bad = [r for r in measured if r["token_identical"] != "True"]
        figure = f"identical in {len(measured) - len(bad)} of {len(measured)} cases"
        if bad:
            r = bad[0]
            figure += (f"; first: {r['label']} B={r['batch_size']} {r['sampling']} request {r['first_diff_request']}"
                       f" step {r['first_diff_step']}, {r['token_this']} vs {r['token_other']}, logit gap "
                       f"{r['logit_gap'] or '?'}, padded {r['padded']}")
        errors = len(replay) - len(measured)
        out_rows.append((goal, "not met" if bad else "met", figure + (f"; {errors} cases failed" if errors else "")))
    return out_rows


def _why_missing(row, part) -> str:
    if row is not None and row.get("status") == "error":
        return f"its configuration failed: {row['error']}"
    return f"no row (see the {part} part)"
