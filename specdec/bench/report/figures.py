"""What every figure of `plots` and `gpu_plots` shares: pyplot on Agg, saving, reading the CSVs of results/ in
today's schema, a case's label."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...draft_kinds import DRAFT_KINDS, worker_label
from ..cases import kind_of_label, peer_label
from ..common import ALL_CATEGORIES
from ...config import SpecConfig


def _pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    # lazy: matplotlib is slow to import and only the figures need it
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, out_png, rect=None) -> Path:
    """Lays out, writes and closes `fig` -> its path."""
    # lazy: matplotlib is slow to import and only the figures need it
    import matplotlib.pyplot as plt
    fig.tight_layout(rect=rect)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return Path(out_png)


#: model names that files of results/ wrote before the name was fixed -> today's: the random Llama of Llama-3.2-1B's
#: shapes has 1.5B parameters (`bench.suites.e2e.RANDOM_1B_NAME`)
MODEL_RENAMES = {"random-llama-1.2b": "random-llama-1.5b"}


def load_results(results_dir="results", pattern="*.csv") -> pd.DataFrame:
    """Every CSV of `results_dir` matching `pattern` (`read_results` each), one frame with a `file` column."""
    files = sorted(Path(results_dir).glob(pattern))
    if not files:
        raise ValueError(f"no CSV files matching {pattern!r} in {results_dir}")
    return pd.concat([read_results(f).assign(file=f.name) for f in files], ignore_index=True)


def suite_of_name(path) -> str:
    """`target-step-20261202-150125.csv` -> "target-step": the name less its run id (date-time)."""
    parts = Path(path).stem.split("-")
    if len(parts) >= 3 and parts[-2].isdigit() and parts[-1].isdigit():
        return "-".join(parts[:-2])
    return parts[0]


def read_results(path) -> pd.DataFrame:
    """One benchmark CSV in today's schema, however old the file: a file without a `suite` column takes it
    from its name (`<suite>-<run_id>.csv`); a file without a `label` column gets one, and where its `worker`
    column held the label (e2e and gpu-check files before the `label` column) `worker` becomes the draft
    kind, as in every file since; a model named before its name was fixed reads as today's (`MODEL_RENAMES`); an
    acceptance file without a `category` column has every row over all its prompts (`all`). `commit` and `run_id`
    read as text."""
    path = Path(path)
    # a short commit hash of digits around one "e" (43e4079) would otherwise read as a float: inf
    df = pd.read_csv(path, dtype={"commit": str, "run_id": str})
    if "suite" not in df:
        df.insert(0, "suite", suite_of_name(path))
    if "model" in df:
        df["model"] = df["model"].replace(MODEL_RENAMES)
    if "label" not in df and "worker" in df and len(df):
        kinds = df["worker"].astype(str)
        if kinds.isin(["target-only", *DRAFT_KINDS]).all() or kinds.str.startswith("hf-").any():
            label = df.apply(case_label, axis=1)
        else:
            label, df["worker"] = df["worker"], kinds.map(kind_of_label)
        df.insert(df.columns.get_loc("worker") + 1, "label", label)
    if "shape_policy" not in df and "num_steps" in df and str(df["suite"].iloc[0] if len(df) else "") == "acceptance":
        df.insert(df.columns.get_loc("label") + 1, "shape_policy", "static")  # before tuned files
    if "category" not in df and str(df["suite"].iloc[0] if len(df) else "") == "acceptance":
        df["category"] = ALL_CATEGORIES  # before prompt files had categories
    return df


def overall_rows(df: pd.DataFrame) -> pd.DataFrame:
    """An acceptance CSV's rows over every prompt of the run (category `all`), without the per-category rows."""
    return df[df["category"].astype(str) == ALL_CATEGORIES] if "category" in df else df


def categories_of(df: pd.DataFrame) -> list[str]:
    """An acceptance CSV's prompt categories with rows of their own, in the run's order (none for a run of one
    category)."""
    if "category" not in df:
        return []
    return [c for c in dict.fromkeys(df["category"].astype(str)) if c != ALL_CATEGORIES]


def case_label(row) -> str:
    """A CSV row's worker, named as everywhere else (`WorkerCase.label`: `specdec.draft_kinds.worker_label`;
    peers as `transformers ...`), from its draft kind and shape."""
    if str(row["worker"]).startswith("hf-"):
        return peer_label(row["worker"], int(row.get("prompt_lookup_num_tokens", 0) or 0))
    if row["worker"] == "target-only":
        return "target-only"
    label = row.get("label")
    if isinstance(label, str) and label and row.get("shape_policy", "static") != "static":
        # a tuned or adaptive row's shape is its bucket's (no draft included): its label says how it ran
        return label
    spec = SpecConfig(int(row["num_steps"]), int(row["topk"]), int(row["num_draft_tokens"]))
    return worker_label(row["worker"], spec)
