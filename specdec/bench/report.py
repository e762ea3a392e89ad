"""`specdec report results/<acceptance CSV>`: the README's results table, printed from a committed CSV, so the
README never quotes a number that no file backs."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .plots import read_results


def results_table(df: pd.DataFrame, temperature: float = 0.0) -> str:
    """Markdown: one row per worker (peers last), accepted tokens per step, step cost at the smallest batch
    size (and, where the CSV has it, the speedup over specdec target-only that the step's model forwards
    allow with zero overhead), and CPU tokens/s relative to transformers' target-only at each batch size;
    then the baseline."""
    df = df[df["temperature"] == temperature].copy()
    if df.empty:
        raise ValueError(f"no rows at temperature {temperature}")
    if "cpu_speedup_vs_hf_target_only" not in df or df["cpu_speedup_vs_hf_target_only"].isna().all():
        raise ValueError("this CSV has no transformers peer rows (run `specdec bench` with transformers installed)")
    df["case"] = df["label"]
    sizes = sorted(df["batch_size"].unique())
    cases = list(dict.fromkeys(df["case"]))
    cases = [c for c in cases if not c.startswith("transformers")] + [c for c in cases if c.startswith("transformers")
                                                                      and c != "transformers target-only"]
    bound = "speedup_bound" in df and not pd.to_numeric(df["speedup_bound"], errors="coerce").isna().all()
    head = ["worker", "accepted / step", f"step cost (B={sizes[0]})"] + ([f"bound (B={sizes[0]})"] if bound else [])
    head += [f"B={b}" for b in sizes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in cases:
        rows = df[df["case"] == case].set_index("batch_size")
        first = rows.iloc[0]
        acc = first.get("mean_accept_len")
        cost = first.get("step_cost_in_target_only_steps")
        cells = [case, "" if pd.isna(acc) else f"{acc:.2f}", "" if pd.isna(cost) else f"{cost:.2f}"]
        if bound:
            b1 = pd.to_numeric(pd.Series([first.get("speedup_bound")]), errors="coerce").iloc[0]
            cells.append("" if pd.isna(b1) else f"{b1:.2f}x")
        cells += [f"{rows.loc[b, 'cpu_speedup_vs_hf_target_only']:.2f}x" if b in rows.index else "" for b in sizes]
        lines.append("| " + " | ".join(cells) + " |")
    hf = df[df["worker"] == "hf-target-only"].set_index("batch_size")["cpu_tokens_per_s"]
    lines.append("")
    lines.append("transformers' target-only `generate`: " + ", ".join(f"{hf[b]:.0f}" for b in sizes if b in hf.index)
                 + " tokens per CPU second at B = " + ", ".join(str(b) for b in sizes if b in hf.index) + ".")
    return "\n".join(lines)


def print_report(csv_path) -> int:
    path = Path(csv_path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    if path.name.startswith("penalties-"):
        from .penalties import penalties_table
        df = pd.read_csv(path, keep_default_na=False, dtype={"commit": str, "run_id": str})
        info = df.iloc[0]
        repeats = next((r for r in df["repeats"] if r != ""), "?")
        print(f"{path.name}: {info['model']} on {info['device']}, impl={info['impl']}, commit {info['commit']}, "
              f"{int(info['threads'])} thread(s), {int(info['batch_size'])} prompts x {int(info['max_new_tokens'])} "
              f"new tokens, greedy; step cost: process CPU time per decode step against the same worker without "
              f"penalties, median of {repeats} runs of each in turn")
        print()
        print(penalties_table(df))
        return 0
    df = read_results(path)
    info = df.iloc[0]
    print(f"{path.name}: {info['model']} on {info['device']}, impl={info['impl']}, commit {info['commit']}, "
          f"{int(info['threads'])} thread(s), {int(info['num_prompts'])} prompts x {int(info['max_new_tokens'])} "
          f"new tokens, {int(info['repeats'])} repeats (median); CPU tokens/s relative to transformers' target-only")
    print()
    print(results_table(df))
    return 0
