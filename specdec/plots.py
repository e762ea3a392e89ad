"""Plots drawn only from the benchmark CSVs in results/ (never from a live run)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd


def load_results(results_dir="results", pattern="*.csv") -> pd.DataFrame:
    files = sorted(Path(results_dir).glob(pattern))
    if not files:
        raise ValueError(f"no CSV files matching {pattern!r} in {results_dir}")
    return pd.concat([pd.read_csv(f).assign(file=f.name) for f in files], ignore_index=True)


def case_label(row) -> str:
    if row["worker"] == "target-only":
        return "target-only"
    if row["worker"] == "eagle":
        return f"EAGLE S={row['num_steps']} K={row['topk']} W={row['num_draft_tokens']}"
    style = "MiMo" if row["worker"] == "mtp" else "Step-3.5"
    return f"MTP {style} S={row['num_steps']}"


def plot_acceptance_and_speedup(df: pd.DataFrame, out_png):
    """Two panels per (temperature): mean accepted tokens per step, and speedup over target-only,
    one bar group per worker configuration, one bar per batch size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = df.copy()
    df["case"] = df.apply(case_label, axis=1)
    temps = sorted(df["temperature"].unique())
    fig, axes = plt.subplots(len(temps), 2, figsize=(13, 3.6 * len(temps)), squeeze=False)
    for r, temp in enumerate(temps):
        sub = df[(df["temperature"] == temp) & (df["worker"] != "target-only")]
        for c, (col, title) in enumerate([("mean_accept_len", "mean accepted tokens / verify step"),
                                          ("speedup_vs_target_only", "speedup vs target-only (tokens/s)")]):
            pivot = sub.pivot_table(index="case", columns="batch_size", values=col, aggfunc="mean")
            pivot.plot.barh(ax=axes[r][c])
            axes[r][c].set_title(f"{title}, temperature {temp}")
            axes[r][c].set_ylabel("")
            if col == "speedup_vs_target_only":
                axes[r][c].axvline(1.0, color="k", lw=0.8)
            axes[r][c].legend(title="batch size", loc="lower right", fontsize="small")
    device = df["device"].iloc[0]
    fig.suptitle(f"{df['model'].iloc[0]} on {device}, impl={df['impl'].iloc[0]}, commit {df['commit'].iloc[0]}")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
