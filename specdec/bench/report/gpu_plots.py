"""The figures of the `specdec gpu-check` runs committed under results/ (each out directory's kernels.csv and
e2e.csv), drawn beside them by `specdec plot`."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .figures import _pyplot, _save, read_results


def gpu_check_dirs(results_dir="results") -> list[Path]:
    """The `specdec gpu-check` out directories committed under results/ (each holds a SUMMARY.md), oldest first."""
    return sorted(p.parent for p in Path(results_dir).glob("*/SUMMARY.md"))


def _measured(df: pd.DataFrame, part: str) -> pd.DataFrame:
    """A gpu-check file's rows of one part that measured something (a failed configuration's row is empty)."""
    return df[(df["part"] == part) & (df["status"] == "ok")].copy()


def plot_gpu_check_kernels(out_dir, out_png):
    """A gpu-check run's fused logprob rows (kernels.csv): achieved bandwidth as a fraction of the run's measured
    copy ceiling, per shape (rows x V) and dtype: the reference op and the fast op with their host work, the
    reference op replayed from a CUDA graph, and the kernels' launch alone at the op's own split count, top-k 0
    and 5 side by side."""
    plt = _pyplot()

    df = _measured(read_results(Path(out_dir) / "kernels.csv"), "logprob_kernels")
    df = df[(df["impl"] != "fast_kernels") | (df["num_splits"].astype(str) == "auto")].copy()
    df["vocab_size"] = df["vocab_size"].astype(int)
    df["shape"] = df["rows"].astype(int).astype(str) + " x " + df["vocab_size"].map(lambda v: f"{v / 1000:.1f}k")
    df["what"] = df["impl"].map({"reference": "reference op", "fast": "fast op (with host work)",
                                 "reference_graph": "reference op (CUDA graph)",
                                 "fast_kernels": "kernels alone (CUDA graph)"}) + ", k=" + \
        df["top_logprobs_num"].astype(int).astype(str)
    dtypes = sorted(df["dtype"].unique())
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes), 4.2), squeeze=False, sharey=True)
    for ax, dtype in zip(axes[0], dtypes):
        pivot = df[df["dtype"] == dtype].pivot_table(index="shape", columns="what", values="frac_of_copy",
                                                     aggfunc="median", sort=False)
        pivot = pivot.reindex(columns=list(dict.fromkeys(df["what"])))  # one colour per series in every panel
        pivot.plot.bar(ax=ax, rot=0, legend=ax is axes[0][0], width=0.8)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(0.8, color="k", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("output rows x vocabulary")
        ax.set_ylabel("achieved GB/s ÷ measured copy GB/s")
        ax.set_title(f"compute_spec_v2_logprobs, {dtype} logits ({df['device'].iloc[0]})", fontsize="medium")
    axes[0][0].legend(fontsize="x-small", loc="lower left")
    return _save(fig, out_png)


def plot_gpu_check_e2e(out_dir, out_png):
    """A gpu-check run's end-to-end rows: decode tokens/s against the batch size, one panel per worker, one
    line per implementation (reference, fast, fast + CUDA graphs)."""
    plt = _pyplot()

    df = _measured(read_results(Path(out_dir) / "e2e.csv"), "e2e")
    df["impl_run"] = df["impl"] + df["cuda_graphs"].map(lambda g: " + graphs" if str(g) == "True" else "")
    workers = list(dict.fromkeys(df["label"]))
    fig, axes = plt.subplots(1, len(workers), figsize=(4.6 * len(workers), 3.8), squeeze=False, sharey=True)
    for ax, worker in zip(axes[0], workers):
        for impl, g in df[df["label"] == worker].groupby("impl_run", sort=False):
            g = g.sort_values("batch_size")
            ax.errorbar(g["batch_size"], g["tokens_per_s"],
                        yerr=[(g["tokens_per_s"] - g["tokens_per_s_min"]).clip(lower=0),
                              (g["tokens_per_s_max"] - g["tokens_per_s"]).clip(lower=0)],
                        marker="o", capsize=2, label=impl)
        sizes = sorted(df["batch_size"].unique())
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("batch size")
        ax.set_title(worker, fontsize="medium")
    axes[0][0].set_ylabel("decode tokens/s (prefill excluded)")
    axes[0][0].legend(fontsize="small")
    fig.suptitle(f"{df['model'].iloc[0]} ({df['dtype'].iloc[0]}) on {df['device'].iloc[0]}", fontsize="medium")
    return _save(fig, out_png)
