"""The verify rules side by side, from an acceptance CSV run with `--verify` (`specdec bench --verify
target_only,rejection,block --temperatures 0.7,1 --top-ps 1,0.9`): a table, the goals, a plot. Each reads the CSV
only.

A rule's row is its case's label followed by the rule (`EAGLE chain S3 block`); the row it is compared with is the
same label without it (the same shape verified target-only, from the draft's top-K)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...verify_rules import VERIFY_RULES
from ..report.figures import overall_rows, read_results

#: the goals a `--verify` run decides: (what, the rule's label, the target-only label, temperature, top-p, the goal
#: on accepted tokens per step)
ACCEPT_GOALS = (
    ("EAGLE tree, recursive rejection / target-only", "EAGLE tree S5 K4 W16 rejection", "EAGLE tree S5 K4 W16",
     1.0, 1.0, 1.25),
    ("EAGLE chain S3, block / target-only", "EAGLE chain S3 block", "EAGLE chain S3", 1.0, 1.0, 1.1),
)
#: no rule's decode step may cost more than this over target-only verification's at the same shape
STEP_COST_GOAL = 1.05


def base_label(label: str) -> str:
    """`EAGLE chain S3 block` -> `EAGLE chain S3`: the same shape verified target-only."""
    for rule in [r for r in VERIFY_RULES if r != "target_only"] + ["sampled"]:
        if label.endswith(" " + rule):
            return label[: -len(rule) - 1]
    return label


def rule_of(label: str) -> str:
    base = base_label(label)
    return "target_only" if base == label else label[len(base) + 1:]


def _sampled(df: pd.DataFrame) -> pd.DataFrame:
    """The sampled drafting rows over every prompt of the run, with their base case and rule."""
    df = overall_rows(df)
    df = df[(df["temperature"] > 0) & (df["worker"] != "target-only") & ~df["worker"].astype(str).str.startswith("hf-")]
    return df.assign(base=df["label"].map(base_label), rule=df["label"].map(rule_of))


def settings(df: pd.DataFrame) -> list[tuple[float, float]]:
    """The (temperature, top-p) pairs of the CSV's sampled rows, in order."""
    rows = df[df["temperature"] > 0]
    return list(dict.fromkeys(zip(rows["temperature"], rows["top_p"])))


def verify_rules_table(df: pd.DataFrame) -> str:
    """Markdown: per case and rule, accepted tokens per step at each (T, top-p), then its step cost and CPU tokens/s
    over target-only verification's (same shape, same setting), at the first setting's batch size."""
    df = _sampled(df)
    pairs = settings(df)
    head = ["worker", "rule"] + [f"accepted / step, T={t:g} top-p={p:g}" for t, p in pairs]
    head += [f"step cost / target-only verify, T={t:g} top-p={p:g}" for t, p in pairs[:1]]
    head += [f"CPU tok/s / target-only verify, T={t:g} top-p={p:g}" for t, p in pairs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (base, rule), g in df.groupby(["base", "rule"], sort=False):
        cells = [base, rule]
        by = {(r["temperature"], r["top_p"]): r for _, r in g.iterrows()}
        ref = {(r["temperature"], r["top_p"]): r for _, r in df[(df["base"] == base) & (df["rule"] == "target_only")]
               .iterrows()}
        cells += [f"{by[s]['mean_accept_len']:.2f}" if s in by else "" for s in pairs]
        for s in pairs[:1]:
            cells.append(f"{by[s]['step_cost_in_target_only_steps'] / ref[s]['step_cost_in_target_only_steps']:.3f}"
                         if s in by and s in ref else "")
        cells += [f"{by[s]['cpu_tokens_per_s'] / ref[s]['cpu_tokens_per_s']:.2f}x" if s in by and s in ref else ""
                  for s in pairs]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verify_rules_goals(df: pd.DataFrame) -> str:
    """Markdown: each goal of `ACCEPT_GOALS` the CSV has rows for, and the step-cost goal over every rule's row."""
    df = _sampled(df)
    lines = ["| goal | measured | goal | met |", "|---|---|---|---|"]
    for what, label, base, t, p, goal in ACCEPT_GOALS:
        here = df[(df["temperature"] == t) & (df["top_p"] == p)].set_index("label")
        if label in here.index and base in here.index:
            ratio = here.loc[label, "mean_accept_len"] / here.loc[base, "mean_accept_len"]
            lines.append(f"| {what}, accepted tokens per step, T = {t:g}, top-p {p:g} | {ratio:.2f}x | {goal:.2f}x | "
                         f"{'yes' if ratio >= goal else '**no**'} |")
    costs = []
    for _, r in df[df["rule"] != "target_only"].iterrows():
        ref = df[(df["label"] == r["base"]) & (df["temperature"] == r["temperature"]) & (df["top_p"] == r["top_p"])]
        if len(ref):
            costs.append((r["step_cost_in_target_only_steps"] / ref.iloc[0]["step_cost_in_target_only_steps"],
                          f"{r['label']}, T={r['temperature']:g} top-p={r['top_p']:g}"))
    if costs:
        worst, where = max(costs)
        lines.append(f"| every rule's step cost / target-only verify's (worst: {where}) | {worst:.3f} | "
                     f"<= {STEP_COST_GOAL:.2f} | {'yes' if worst <= STEP_COST_GOAL else '**no**'} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def verify_rules_section(path: Path) -> list[str]:
    """The results page's section of a `--verify` acceptance CSV."""
    df = read_results(path)
    out = [verify_rules_table(df)]
    goals = verify_rules_goals(df)
    if goals:
        out += ["", "Against the goals (accepted tokens per step; a step's cost is its process CPU seconds per decode "
                    "step over target-only decoding's, against the same for the same shape verified target-only):",
                "", goals]
    return out


def plot_verify_rules(df: pd.DataFrame, path) -> Path:
    """Two panels per (T, top-p) setting of a `--verify` CSV: accepted tokens per step and CPU tokens/s per case,
    one bar per rule."""
    # lazy: matplotlib is slow to import and only the figures need it
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    df = _sampled(df)
    pairs = settings(df)
    bases = list(dict.fromkeys(df["base"]))
    rules = [r for r in VERIFY_RULES if r in set(df["rule"])]
    fig, axes = plt.subplots(2, len(pairs), figsize=(4.2 * len(pairs), 7), squeeze=False, sharey="row")
    width = 0.8 / len(rules)
    for j, (t, p) in enumerate(pairs):
        here = df[(df["temperature"] == t) & (df["top_p"] == p)]
        for k, rule in enumerate(rules):
            rows = here[here["rule"] == rule].set_index("base")
            xs = [i + (k - (len(rules) - 1) / 2) * width for i in range(len(bases))]
            for ax, col in zip(axes[:, j], ("mean_accept_len", "cpu_tokens_per_s")):
                ax.bar(xs, [rows.loc[b, col] if b in rows.index else 0 for b in bases], width, label=rule)
        axes[0, j].set_title(f"T = {t:g}, top-p = {p:g}")
        for ax in axes[:, j]:
            ax.set_xticks(range(len(bases)))
            ax.set_xticklabels(bases, rotation=60, ha="right", fontsize=7)
    axes[0, 0].set_ylabel("accepted tokens / step")
    axes[1, 0].set_ylabel("CPU tokens / s")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
