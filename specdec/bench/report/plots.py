"""Plots drawn only from the benchmark CSVs in results/ (never from a live run): one per schema (`SUITE_PLOTS`), and
`specdec plot` (`plot_csv`, `plot_all`); the shared helpers are in `figures`, gpu-check's figures in `gpu_plots`."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd

from .figures import _pyplot, _save, categories_of, overall_rows, read_results
from .gpu_plots import gpu_check_dirs, plot_gpu_check_e2e, plot_gpu_check_kernels
from ...draft_kinds import DRAFT_KINDS, draft_kind


def plot_acceptance_and_speedup(df: pd.DataFrame, out_png):
    """Per temperature: mean accepted tokens per step and speedup over target-only (one bar group per
    worker configuration, one bar per batch size) and, where the transformers peers ran, CPU tokens/s
    relative to transformers' target-only against the batch size (one line per worker, peers included); where the
    run's prompts have several categories, a last row of the same two by category (`_plot_categories`)."""
    plt = _pyplot()

    categories = categories_of(df)
    by_category = df
    df = overall_rows(df).copy()
    df["case"] = df["label"]
    temps = sorted(df["temperature"].unique())
    peers = "cpu_speedup_vs_hf_target_only" in df and pd.to_numeric(
        df["cpu_speedup_vs_hf_target_only"], errors="coerce").notna().any()
    cols = 3 if peers else 2
    extra = 1 if categories else 0
    # rows (temperatures) share each column's scale, so they compare at a glance
    fig, axes = plt.subplots(len(temps) + extra, cols, figsize=(6.2 * cols, 3.9 * (len(temps) + extra)),
                             squeeze=False)
    for c in range(cols):  # the temperatures' rows share each column's scale; the category row has its own
        for r in range(1, len(temps)):
            axes[r][c].sharex(axes[0][c])
    panels = [("mean_accept_len", "mean accepted tokens / verify step", "tokens per verify step (bonus included)"),
              ("speedup_vs_target_only", "speedup vs specdec target-only", "tokens/s ÷ target-only tokens/s (wall)")]
    for r, temp in enumerate(temps):
        sub = df[(df["temperature"] == temp) & (df["worker"] != "target-only")]
        for c, (col, title, xlabel) in enumerate(panels):
            pivot = sub.pivot_table(index="case", columns="batch_size", values=col, aggfunc="mean")
            pivot.plot.barh(ax=axes[r][c], legend=False)
            axes[r][c].set_title(f"{title}, T={temp}", fontsize="medium")
            axes[r][c].set_ylabel("")
            axes[r][c].set_xlabel(xlabel)
            axes[r][c].xaxis.set_tick_params(labelbottom=True)
            if col == "speedup_vs_target_only":
                axes[r][c].axvline(1.0, color="k", lw=0.8)
        axes[r][0].legend(title="batch size", fontsize="small", ncol=5, loc="upper left", bbox_to_anchor=(0.0, -0.28))
        if peers:
            ax = axes[r][2]
            rel = df[df["temperature"] == temp].assign(
                rel=pd.to_numeric(df["cpu_speedup_vs_hf_target_only"], errors="coerce")).dropna(subset=["rel"])
            for case, g in rel.groupby("case", sort=False):
                g = g.sort_values("batch_size")
                style = dict(ls="--", marker="s") if case.startswith("transformers") else dict(marker="o")
                # spread of the repeats: the p20 / p80 passes' tokens/s relative to the median pass's
                lo = g["rel"] * (1 - g["tokens_per_s_p20"] / g["tokens_per_s"])
                hi = g["rel"] * (g["tokens_per_s_p80"] / g["tokens_per_s"] - 1)
                ax.errorbar(g["batch_size"], g["rel"], yerr=[lo.clip(lower=0), hi.clip(lower=0)], capsize=2,
                            label=case, **style)
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(rel["batch_size"].unique()), [str(b) for b in sorted(rel["batch_size"].unique())])
            ax.set_xlabel("batch size")
            ax.set_ylabel("÷ transformers target-only")
            ax.set_title(f"CPU tokens/s vs transformers target-only, T={temp}", fontsize="medium")
            if rel.empty:  # the peers run greedy only
                ax.text(0.5, 0.5, "no transformers rows at this temperature", ha="center", va="center",
                        transform=ax.transAxes)
            else:
                ax.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    if categories:
        _plot_categories(axes[len(temps)], by_category, categories, cols)
    device = df["device"].iloc[0]
    impls = ", ".join(sorted(set(df["impl"]) - {"transformers"}))
    threads = ", ".join(str(t) for t in sorted(df["threads"].unique())) if "threads" in df else "?"
    dtypes = ", ".join(sorted(set(df["dtype"]))) if "dtype" in df else "?"
    fig.suptitle(f"{df['model'].iloc[0]} ({dtypes}) on {device}, impl={impls}, {threads} thread(s), commit "
                 f"{df['commit'].iloc[0]}\nerror bars: p20-p80 of the repeats", fontsize="medium")
    return _save(fig, out_png)


def _plot_categories(axes, df: pd.DataFrame, categories: list[str], cols: int) -> None:
    """One row of `plot_acceptance_and_speedup`: at the smallest batch size and the lowest temperature, accepted
    tokens per step and CPU tokens/s relative to specdec's target-only on the same prompts, one bar group per
    category, one bar per drafting worker."""
    T, B = df["temperature"].min(), df["batch_size"].min()
    sub = df[(df["temperature"] == T) & (df["batch_size"] == B) & (df["worker"] != "target-only")
             & df["category"].isin(categories)]
    for ax, (col, title) in zip(axes, (("mean_accept_len", "accepted tokens / verify step"),
                                       ("cpu_speedup_vs_target_only", "CPU tokens/s ÷ target-only's"))):
        pivot = sub.assign(value=pd.to_numeric(sub[col], errors="coerce")).pivot_table(
            index="category", columns="label", values="value", aggfunc="mean", sort=False).reindex(categories)
        pivot.plot.bar(ax=ax, legend=False, rot=30)
        ax.set_title(f"{title} by prompt category, T={T}, B={B}", fontsize="medium")
        ax.set_xlabel("")
        if col == "cpu_speedup_vs_target_only":
            ax.axhline(1.0, color="k", lw=0.8)
    axes[0].legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(0.0, -0.3), ncol=2)
    for ax in axes[2:cols]:
        ax.axis("off")


def plot_kernels(df: pd.DataFrame, out_png):
    """compute_spec_v2_logprobs: time against V (one panel per batch size, S+1 = the largest swept) with
    the copy-bandwidth ceiling for the same bytes, and the fraction of that ceiling each impl reaches;
    one line per (impl, dtype). Error bars are the p20-p80 spread of the repeats."""
    plt = _pyplot()

    # lazy: matplotlib is slow to import and only the figures need it
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    lp = df[(df["op"] == "compute_spec_v2_logprobs") & (df["top_logprobs_num"] == df["top_logprobs_num"].max())]
    lp = lp[lp["num_slots"] == lp["num_slots"].max()]
    batch_sizes = sorted(lp["batch_size"].unique())
    vocab = sorted(lp["vocab_size"].unique())
    fig, axes = plt.subplots(2, len(batch_sizes), figsize=(4.6 * len(batch_sizes), 7.8), squeeze=False,
                             sharex=True, sharey="row")
    ceiling_styles = ["--", ":", "-."]
    for c, B in enumerate(batch_sizes):
        sub = lp[lp["batch_size"] == B]
        ax_t, ax_f = axes[0][c], axes[1][c]
        for (impl, dtype), g in sub.groupby(["impl", "dtype"]):
            g = g.sort_values("vocab_size")
            err = [g["median_us"] - g["p20_us"], g["p80_us"] - g["median_us"]]
            ax_t.errorbar(g["vocab_size"], g["median_us"], yerr=err, marker="o", capsize=3, label=f"{impl} {dtype}")
            ax_f.plot(g["vocab_size"], g["frac_of_copy"], marker="o", label=f"{impl} {dtype}")
        for k, (dtype, g) in enumerate(sub.groupby("dtype")):
            g = g.drop_duplicates("vocab_size").sort_values("vocab_size")
            ceiling_us = g["bytes"] / (g["copy_gbps"] * 1e3)
            ax_t.plot(g["vocab_size"], ceiling_us, color="k", ls=ceiling_styles[k % 3], lw=0.9,
                      label=f"copy ceiling {dtype}")
        ax_f.axhline(1.0, color="k", lw=0.8)
        ax_t.set_title(f"B={B}, S+1={int(sub['num_slots'].max())} ({int(sub['rows'].max())} rows)")
        ax_t.set_yscale("log")
        ax_f.set_yscale("log")  # a CPU reaches a few percent of the ceiling, a GPU kernel most of it
        ax_f.set_xlabel("vocabulary size V")
        for ax in (ax_t, ax_f):
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(FixedLocator(vocab))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:.0f}k" if v >= 1000 else f"{v:.0f}"))
            ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("time per call (us, log)")
    axes[1][0].set_ylabel("fraction of copy bandwidth (log; 1 = the ceiling)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize="small", frameon=False)
    first = df.iloc[0]
    fig.suptitle(f"compute_spec_v2_logprobs, top_logprobs_num={int(lp['top_logprobs_num'].max())}\n"
                 f"{first['device']}, {first['timer']}, commit {first['commit']}; error bars: p20-p80 of the "
                 f"repeats", fontsize="medium")
    return _save(fig, out_png, rect=(0, 0.08, 1, 1))


def plot_e2e(df: pd.DataFrame, out_png):
    """Top row, one panel per model: tokens/s against batch size, colour = worker, line style = impl, error
    bars p20-p80 of the repeats. Bottom row: the time of one decode step split into its phases (eager rows
    at the smallest batch size, one bar per worker and impl)."""
    plt = _pyplot()
    # lazy: matplotlib is slow to import and only the figures need it
    from matplotlib.ticker import NullLocator

    df = df.copy()
    df["impl_run"] = df["impl"] + df["cuda_graphs"].map(lambda g: " + graphs" if str(g) == "True" else "")
    models = list(dict.fromkeys(df["model"]))
    workers = list(dict.fromkeys(df["label"]))
    colours = {w: f"C{i}" for i, w in enumerate(workers)}
    styles = {"reference": "-", "fast": "--", "fast + graphs": ":"}
    phases = ["draft_ms", "verify_forward_ms", "verify_ms", "logprobs_ms", "draft_extend_ms"]
    fig, axes = plt.subplots(2, len(models), figsize=(7 * len(models), 9), squeeze=False)
    for c, model in enumerate(models):
        sub = df[df["model"] == model]
        ax = axes[0][c]
        for (worker, impl), g in sub.groupby(["label", "impl_run"], sort=False):
            g = g.sort_values("batch_size")
            err = [g["tokens_per_s"] - g["tokens_per_s_p20"], g["tokens_per_s_p80"] - g["tokens_per_s"]]
            ax.errorbar(g["batch_size"], g["tokens_per_s"], yerr=err, color=colours[worker],
                        linestyle=styles.get(impl, "-"), marker="o", capsize=3, label=f"{worker}, {impl}")
        ax.set_xscale("log", base=2)
        sizes = sorted(sub["batch_size"].unique())
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_yscale("log")
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xlabel("batch size (log)")
        ax.set_ylabel("tokens / s, all requests (log)")
        ax.set_title(f"{model} ({sub['dtype'].iloc[0]}, {sub['params_m'].iloc[0]:.3g}M parameters)")
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
        eager = sub[(sub["cuda_graphs"].astype(str) != "True") & (sub["batch_size"] == sub["batch_size"].min())]
        ax = axes[1][c]
        labels = [f"{w}\n{i}" for w, i in zip(eager["label"], eager["impl_run"])]
        bottom = [0.0] * len(eager)
        for k, phase in enumerate(phases):
            vals = pd.to_numeric(eager[phase], errors="coerce").fillna(0.0).tolist()
            ax.bar(range(len(eager)), vals, bottom=bottom, color=f"C{k}", label=phase.removesuffix("_ms"))
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(eager)), labels, rotation=60, ha="right", fontsize="x-small")
        ax.set_ylabel("ms per decode step")
        ax.set_title(f"phases of one decode step, batch size {eager['batch_size'].min()}")
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    first = df.iloc[0]
    fig.suptitle(f"end to end, greedy, {first['max_new_tokens']} new tokens\n{first['device']}, commit "
                 f"{first['commit']}; error bars: p20-p80 of the repeats", fontsize="medium")
    return _save(fig, out_png)


def plot_penalties(df: pd.DataFrame, out_png):
    """The penalties suite, one row of panels per penalty setting: per worker, how many requests left target-only's
    output (exact penalties against SGLang's approximation), the accepted tokens per step (exact, SGLang's, exact
    with draft penalties), and what exact penalties add to a step's CPU time."""
    plt = _pyplot()

    df = df[df["worker"] != "target-only"].copy()
    df["how"] = df["penalty_mode"] + df["draft_penalties"].map(lambda d: " + draft penalties" if str(d) == "True"
                                                               else "")
    settings = [p for p in dict.fromkeys(df["penalty"]) if p != "none"]
    panels = [("differing_request_fraction", "requests whose output left target-only's", (0, 1.05)),
              ("mean_accept_len", "accepted tokens / verify step", None),
              ("penalty_step_overhead", "exact penalties' share of a step's CPU time", None)]
    fig, axes = plt.subplots(len(settings), len(panels), figsize=(5.2 * len(panels), 2.6 * len(settings) + 0.8),
                             squeeze=False, sharey=True)
    for r, setting in enumerate(settings):
        sub = df[df["penalty"] == setting]
        for c, (col, title, xlim) in enumerate(panels):
            ax = axes[r][c]
            pivot = sub.pivot_table(index="label", columns="how", values=col, aggfunc="mean", sort=False)
            pivot.plot.barh(ax=ax, legend=(r == 0 and c == 0), width=0.8)
            ax.set_title(f"{setting}: {title}", fontsize="small")
            ax.set_ylabel("")
            if xlim:
                ax.set_xlim(*xlim)
            if col == "penalty_step_overhead":
                ax.axvline(0.0, color="k", lw=0.8)
    if settings:
        axes[0][0].legend(fontsize="x-small", loc="lower right")
    first = df.iloc[0]
    fig.suptitle(f"penalties under speculation, {first['model']}, B={first['batch_size']}, {first['device']}, commit "
                 f"{first['commit']}", fontsize="medium")
    return _save(fig, out_png)


def plot_grammar(df: pd.DataFrame, out_png, fill: pd.DataFrame | None = None):
    """The grammar suite: per worker, accepted tokens per step and tokens/s relative to the same worker without a
    grammar, for no grammar, a JSON schema, and the schema with masked drafts; with the suite's fill file, the
    host cost per tree node of each way of filling the per-node masks."""
    plt = _pyplot()

    df = df.copy()
    df["case"] = df["grammar"].map(lambda g: "no grammar" if g == "none" else str(g)) + df["draft_grammar"].map(
        lambda d: ", masked drafts" if str(d) == "True" else "")
    panels = [("mean_accept_len", "accepted tokens / verify step"),
              ("relative_tokens_per_s", "tokens/s ÷ the same worker without a grammar")]
    cols = len(panels) + (fill is not None)
    fig, axes = plt.subplots(1, cols, figsize=(5.6 * cols, 4.4), squeeze=False)
    for ax, (col, title) in zip(axes[0], panels):
        pivot = df.pivot_table(index="label", columns="case", values=col, aggfunc="mean", sort=False)
        pivot.plot.barh(ax=ax, legend=ax is axes[0][0], width=0.8)
        ax.set_title(title, fontsize="medium")
        ax.set_ylabel("")
        if col == "relative_tokens_per_s":
            ax.axvline(1.0, color="k", lw=0.8)
    axes[0][0].legend(fontsize="x-small", loc="lower right")
    if fill is not None:
        ax = axes[0][-1]
        ax.barh(fill["method"], fill["us_per_node"])
        ax.set_xlabel("µs per tree node (host)")
        ax.set_title("filling the per-node masks", fontsize="medium")
    first = df.iloc[0]
    fig.suptitle(f"structured output under speculation, {first['model']}, {first['device']}, commit "
                 f"{first['commit']}", fontsize="medium")
    return _save(fig, out_png)


def _plot_check(ax, ck: pd.DataFrame, B: int, name: str, colours: dict) -> None:
    """One bucket's grid check on one prompt set: the grid by topk against W, the tuned shape, adaptive speculation
    and target-only as horizontal lines."""
    grid = ck[ck["policy"] == "static"]
    for k in sorted(grid["topk"].unique()):
        g = grid[grid["topk"] == k].sort_values("num_draft_tokens")
        ax.plot(g["num_draft_tokens"], g["tokens_per_cpu_s"], "o-", color=colours.get(k, "k"), ms=4, label=f"K{k} grid")
    for policy, style in (("tuned", "-"), ("adaptive", "--"), ("target-only", ":")):
        row = ck[ck["policy"] == policy]
        if len(row):
            ax.axhline(float(row["tokens_per_cpu_s"].iloc[0]), color="k", ls=style, label=str(row["label"].iloc[0]))
    ax.set_title(f"B={B}: {name} prompts, measured side by side", fontsize="small")
    ax.set_xlabel("W (num_draft_tokens)")
    ax.set_ylabel("tokens / CPU s")


#: each CSV schema's plot, by the file's `suite` column (grammar-fill files are drawn with their grammar run)
def plot_tune(df: pd.DataFrame, out_png):
    """`specdec tune`: per batch bucket, tokens per CPU second against the verify width W, one colour per topk: the
    cost model's prediction (open markers) beside the measurements on the tuning prompts (filled), the chosen shape
    starred; with --check-grid, a further row per prompt set: the grid measured on other prompts, the tuned shape,
    adaptive speculation and target-only as lines (a `--check-tuned` file has those rows only)."""
    plt = _pyplot()
    df = df.copy()
    sizes = sorted(df["batch_size"].unique())
    checks = [s for s in dict.fromkeys(df.loc[df["source"] == "check", "prompt_set"])]
    tuning = int(bool((df["prompt_set"] == "tuning").any()))
    fig, axes = plt.subplots(tuning + len(checks), len(sizes),
                             figsize=(5.2 * len(sizes), 3.4 * (tuning + len(checks)) + 0.6), squeeze=False)
    colours = {1: "tab:blue", 2: "tab:orange", 4: "tab:green", 8: "tab:red"}
    for c, B in enumerate(sizes):
        for r, name in enumerate(checks, start=tuning):
            ck = df[(df["batch_size"] == B) & (df["source"] == "check") & (df["prompt_set"] == name)]
            _plot_check(axes[r][c], ck, B, name, colours)
        if not tuning:
            continue
        at = df[(df["batch_size"] == B) & (df["prompt_set"] == "tuning")]
        ax = axes[0][c]
        for k in sorted(k for k in at["topk"].unique() if k > 0):
            of_k = at[at["topk"] == k].sort_values("num_draft_tokens")
            pred = of_k[of_k["predicted_tokens_per_cpu_s"].notna()]
            ax.scatter(pred["num_draft_tokens"], pred["predicted_tokens_per_cpu_s"], facecolors="none",
                       edgecolors=colours.get(k, "k"), label=f"K{k} predicted")
            meas = of_k[of_k["source"].isin(["acceptance", "probe", "confirm"]) & of_k["tokens_per_cpu_s"].notna()]
            meas = meas[meas["batch_size"] == B]
            ax.scatter(meas["num_draft_tokens"], meas["tokens_per_cpu_s"], color=colours.get(k, "k"), s=14,
                       label=f"K{k} measured")
        chosen = at[at["chosen"].astype(str) == "True"]
        ax.scatter(chosen["num_draft_tokens"], chosen["tokens_per_cpu_s"], marker="*", s=220, color="gold",
                   edgecolors="k", zorder=5, label="chosen")
        nd = at[at["label"] == "no draft"]
        if len(nd):
            ax.axhline(float(nd["tokens_per_cpu_s"].iloc[0]), color="grey", ls=":", label="no draft")
        ax.set_title(f"B={B}: tuning prompts", fontsize="small")
        ax.set_xlabel("W (num_draft_tokens)")
        ax.set_ylabel("tokens / CPU s")
    for row in axes:
        row[0].legend(fontsize="x-small")
    first = df.iloc[0]
    fig.suptitle(f"specdec tune: {first['model']} with its {first['kind']} draft, {first['cpu_model']}, "
                 f"{first['threads']} thread(s), commit {first['commit']}", fontsize="medium")
    return _save(fig, out_png)


def plot_draft_vocab(df: pd.DataFrame, out_png):
    """`specdec bench --suite draft-vocab`: per draft and draft vocabulary, tokens per step (left) and CPU tokens/s
    against target-only (right), both against the draft phase's milliseconds per step; one line per draft."""
    plt = _pyplot()
    if "worker" not in df:  # written before the suite ran several drafts: the EAGLE-3 head's
        df = df.assign(worker=["" if n == 0 else "eagle3" for n in df["draft_vocab_size"]])
    heads = df[df["draft_vocab_size"] > 0].sort_values("draft_vocab_size")
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, col, label in ((left, "mean_accept_len", "tokens per verify step"),
                           (right, "cpu_speedup_vs_target_only", "CPU tokens/s vs target-only")):
        for worker, g in heads.groupby("worker", sort=False):
            ax.plot(g["draft_ms_per_step"], g[col], marker="o", label=draft_kind(worker).label)
            for _, r in g.iterrows():
                ax.annotate(f"{int(r['draft_vocab_size']):,}", (r["draft_ms_per_step"], r[col]), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
        ax.set(xlabel="draft phase per step (ms, process CPU)", ylabel=label)
    right.axhline(1.0, color="grey", lw=0.8, ls="--")
    left.legend(fontsize=8)
    info = df.iloc[0]
    fig.suptitle(f"Draft vocabulary sweep, {info['model']}, B = 1, greedy, {info['threads']} thread "
                 f"({info['num_prompts']} prompts x {info['max_new_tokens']} tokens)", fontsize=9)
    return _save(fig, out_png, rect=(0, 0, 1, 0.93))


def plot_speedup_by_kind(df: pd.DataFrame, out_png, source: str, commands: list[str], batch_size: int = 1,
                         temperature: float = 0.0):
    """One acceptance run at one batch size and temperature: each worker's CPU tokens/s relative to transformers'
    target-only (to specdec's target-only for a run without the peers), one bar per worker, best first, coloured by
    draft kind (specdec's target-only dark, the peers grey), each labelled with its accepted tokens per step. Below
    the axes: `source` (the CSV's path), the machine as the CSV records it, and `commands` (what wrote the CSV and
    what drew the figure), so that the picture says where every bar comes from. A run of several prompt categories
    is drawn over every prompt (its `all` rows)."""
    plt = _pyplot()
    rows = overall_rows(df[(df["batch_size"] == batch_size) & (df["temperature"] == temperature)])
    if rows.empty:
        raise ValueError(f"{source}: no rows at batch size {batch_size} and temperature {temperature}")
    peers = "cpu_speedup_vs_hf_target_only" in rows and pd.to_numeric(
        rows["cpu_speedup_vs_hf_target_only"], errors="coerce").notna().any()
    column, baseline = (("cpu_speedup_vs_hf_target_only", "transformers' target-only") if peers
                        else ("cpu_speedup_vs_target_only", "specdec's target-only"))
    rows = rows.assign(ratio=pd.to_numeric(rows[column], errors="coerce")).dropna(subset=["ratio"])
    rows = rows.sort_values("ratio")  # barh draws bottom up: the best on top
    kinds = list(DRAFT_KINDS)
    palette = plt.get_cmap("tab10")

    def colour(worker: str):
        if worker == "target-only":
            return "#333333"
        if worker.startswith("hf-"):
            return "#b0b0b0"
        return palette(kinds.index(worker) % 10) if worker in kinds else "#777777"

    fig, ax = plt.subplots(figsize=(9, 0.34 * len(rows) + 2.8))
    labels = [r["label"] if pd.isna(r["mean_accept_len"]) or r["worker"] == "target-only"
              else f"{r['label']}  ({r['mean_accept_len']:.2f} tokens/step)" for _, r in rows.iterrows()]
    bars = ax.barh(labels, rows["ratio"], color=[colour(str(w)) for w in rows["worker"]])
    for bar, value in zip(bars, rows["ratio"]):
        ax.text(bar.get_width() + 0.02, bar.get_y() + bar.get_height() / 2, f"{value:.2f}x", va="center",
                fontsize=8)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlim(0, rows["ratio"].max() * 1.15)
    ax.set_xlabel(f"CPU tokens/s relative to {baseline} (1.0: the black line)")
    info = rows.iloc[0]
    sampling = "greedy" if temperature == 0 else f"T = {temperature:g}"
    specdec = rows[~rows["worker"].astype(str).str.startswith("hf-")]
    same = specdec["same_tokens_as_target_only"].astype(str).eq("True").all() if temperature == 0 else None
    fig.suptitle(f"{info['model']}: speedup by draft kind\nB = {batch_size}, {sampling}, {int(info['num_prompts'])} "
                 f"prompts x at most {int(info['max_new_tokens'])} new tokens"
                 + {True: "; every output token-identical to target-only", False: "; NOT every output token-identical "
                    "to target-only", None: ""}[same], x=0.01, ha="left", fontsize="medium")
    cpu = info.get("cpu_model")
    device = f"{info['device']}, {cpu}" if isinstance(cpu, str) and cpu and cpu not in str(info["device"]) else \
        str(info["device"])
    notes = [f"{source}: ran on {device}; torch {info['torch']}; {info['impl']} path; commit {info['commit']}; "
             f"{str(info['timestamp'])[:10]}"]
    for command in commands:  # wrapped by hand: a figure's text does not wrap where the page ends
        notes += textwrap.wrap(command, 130, subsequent_indent=" " * 12, break_on_hyphens=False)
    fig.text(0.01, 0.01, "\n".join(notes), fontsize=6.5, family="monospace", va="bottom", ha="left")
    inch = fig.get_size_inches()[1]
    return _save(fig, out_png, rect=(0, (0.15 + 0.11 * len(notes)) / inch, 1, 1))


def speedup_figure(csv_path, out_png) -> Path:
    """`specdec plot --speedup-by-kind CSV --out PNG`: `plot_speedup_by_kind` of an acceptance CSV at its smallest batch
    size, greedy, naming the bench command that wrote it (from the results/current.json beside it, where that
    names the CSV) and this command."""
    path = Path(csv_path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    df = read_results(path)
    if df.empty or str(df["suite"].iloc[0]) != "acceptance":
        raise ValueError(f"{path}: --speedup-by-kind draws an acceptance CSV")
    commands = []
    manifest = path.parent / "current.json"
    if manifest.is_file():
        sections = json.loads(manifest.read_text())["sections"]
        written = [sec["command"] for sec in sections if Path(sec["csv"]).name == path.name]
        commands += [f"written by: {written[0]}"] if written else []
    commands.append(f"drawn by:   specdec plot --speedup-by-kind {path.as_posix()} --out {Path(out_png).as_posix()}")
    return plot_speedup_by_kind(df, out_png, path.as_posix(), commands, batch_size=int(df["batch_size"].min()))


SUITE_PLOTS = {"acceptance": plot_acceptance_and_speedup, "draft-vocab": plot_draft_vocab, "kernels": plot_kernels,
               "e2e": plot_e2e, "penalties": plot_penalties, "grammar": plot_grammar, "tune": plot_tune}
# schemas read as tables (the README quotes them), with no figure
TABLE_SUITES = ("dflash-scaling", "target-step", "kernel-count")


def plot_csv(path) -> Path | None:
    """One results CSV -> its plot beside it (`<name>.png`), by its schema; None for a grammar-fill file (drawn
    with its grammar run), a table with no figure (`TABLE_SUITES`, a gpu-check run's environment.csv and
    tests.csv) or a file with no rows."""
    path = Path(path)
    if path.stem.startswith("grammar-fill-"):
        return None
    if (path.parent / "SUMMARY.md").is_file():  # a gpu-check out directory: its kernels and e2e files have figures
        plot = {"kernels": plot_gpu_check_kernels, "e2e": plot_gpu_check_e2e}.get(path.stem)
        return None if plot is None else plot(path.parent, path.with_suffix(".png"))
    df = read_results(path)
    if df.empty:
        return None
    suite = str(df["suite"].iloc[0])
    if suite in TABLE_SUITES:
        return None
    if suite not in SUITE_PLOTS:
        raise ValueError(f"{path}: no plot for suite {suite!r} (known: {', '.join(SUITE_PLOTS)})")
    if suite == "grammar":
        fill = path.with_name(path.name.replace("grammar-", "grammar-fill-", 1))
        return plot_grammar(df, path.with_suffix(".png"), read_results(fill) if fill.is_file() else None)
    return SUITE_PLOTS[suite](df, path.with_suffix(".png"))


def plot_all(results_dir="results") -> list[Path]:
    """Every CSV of `results_dir` and every committed gpu-check directory under it -> their plots (the one entry
    point `specdec plot` runs)."""
    written = [p for p in map(plot_csv, sorted(Path(results_dir).glob("*.csv"))) if p is not None]
    for out_dir in gpu_check_dirs(results_dir):
        if (out_dir / "kernels.csv").is_file():
            written.append(plot_gpu_check_kernels(out_dir, out_dir / "kernels.png"))
        if (out_dir / "e2e.csv").is_file():
            written.append(plot_gpu_check_e2e(out_dir, out_dir / "e2e.png"))
    return written
