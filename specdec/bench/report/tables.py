"""`specdec report CSV`: one committed acceptance or penalties CSV's tables, so that no page quotes a number that
no file backs (without a CSV, `specdec report` prints docs/results.md: `specdec.bench.report.results_page`)."""
from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd

from .figures import categories_of, overall_rows, read_results
from ..common import ALL_CATEGORIES
from ... import zoo
from ...draft_kinds import DRAFT_KINDS
from ..suites.penalties import penalties_table


def results_table(df: pd.DataFrame, temperature: float = 0.0) -> str:
    """Markdown: one row per worker (peers last), accepted tokens per step, step cost in target-only steps at the
    smallest batch size (and, where the CSV has it, the speedup over specdec target-only that the step's model
    forwards allow with zero overhead), and CPU tokens/s relative to transformers' target-only at each batch size;
    then the baseline. A run without the peers (`--no-peers`) is relative to specdec's target-only instead. Each
    ratio's header names what it is relative to."""
    df = overall_rows(df[df["temperature"] == temperature]).copy()
    if df.empty:
        raise ValueError(f"no rows at temperature {temperature}")
    peers = has_peers(df)
    speedup = "cpu_speedup_vs_hf_target_only" if peers else "cpu_speedup_vs_target_only"
    baseline = "transformers' target-only" if peers else "specdec's target-only"
    df["case"] = df["label"]
    sizes = sorted(df["batch_size"].unique())
    cases = list(dict.fromkeys(df["case"]))
    cases = [c for c in cases if not c.startswith("transformers")] + [c for c in cases if c.startswith("transformers")
                                                                      and c != "transformers target-only"]
    bound = "speedup_bound" in df and not pd.to_numeric(df["speedup_bound"], errors="coerce").isna().all()
    accepted = ["accepted / step"] if len(sizes) == 1 else [f"accepted / step (B={b})" for b in sizes]
    head = ["worker"] + accepted + [f"step cost in target-only steps (B={sizes[0]})"]
    head += [f"bound vs specdec's target-only (B={sizes[0]})"] if bound else []
    head += [f"CPU tok/s vs {baseline} (B={b})" for b in sizes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in cases:
        rows = df[df["case"] == case].set_index("batch_size")
        first = rows.iloc[0]
        acc = first.get("mean_accept_len")
        cost = first.get("step_cost_in_target_only_steps")
        accs = [acc] if len(sizes) == 1 else [rows.loc[b].get("mean_accept_len") if b in rows.index else float("nan")
                                              for b in sizes]
        cells = [case] + ["" if pd.isna(a) else f"{a:.2f}" for a in accs] + ["" if pd.isna(cost) else f"{cost:.2f}"]
        if bound:
            b1 = pd.to_numeric(pd.Series([first.get("speedup_bound")]), errors="coerce").iloc[0]
            cells.append("" if pd.isna(b1) else f"{b1:.2f}x")
        cells += [f"{rows.loc[b, speedup]:.2f}x" if b in rows.index else "" for b in sizes]
        lines.append("| " + " | ".join(cells) + " |")
    if speedup == "cpu_speedup_vs_target_only":
        return "\n".join(lines)
    hf = df[df["worker"] == "hf-target-only"].set_index("batch_size")["cpu_tokens_per_s"]
    lines.append("")
    lines.append("transformers' target-only `generate`: " + ", ".join(f"{hf[b]:.0f}" for b in sizes if b in hf.index)
                 + " tokens per CPU second at B = " + ", ".join(str(b) for b in sizes if b in hf.index) + ".")
    return "\n".join(lines)


def category_table(df: pd.DataFrame, temperature: float = 0.0, batch_size: int | None = None) -> str:
    """Markdown, the run by prompt category: one row per worker (peers last), one column per category and one over
    every prompt, each cell the accepted tokens per step and CPU tokens/s relative to specdec's target-only on the
    same prompts ("2.31, 1.45x"), at `batch_size` (default: the smallest) and `temperature`. Empty for a run of one
    category."""
    categories = categories_of(df)
    df = df[df["temperature"] == temperature]
    if not categories or df.empty:
        return ""
    B = batch_size if batch_size is not None else int(df["batch_size"].min())
    df = df[df["batch_size"] == B]
    labels = list(dict.fromkeys(df["label"]))
    labels = sorted(labels, key=lambda c: c.startswith("transformers"))  # stable: the peers last
    columns = categories + [ALL_CATEGORIES]
    base = df[df["worker"] == "target-only"].set_index("category")
    head = ["worker: accepted / step, CPU tok/s vs specdec's target-only"]
    head += [f"{c} ({int(base.loc[c, 'num_prompts'])} prompts)" if c in base.index else c for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in labels:
        rows = df[df["label"] == label].set_index("category")
        cells = [label]
        for c in columns:
            if c not in rows.index:
                cells.append("")
                continue
            acc = pd.to_numeric(pd.Series([rows.loc[c, "mean_accept_len"]]), errors="coerce").iloc[0]
            speedup = rows.loc[c, "cpu_speedup_vs_target_only"]
            cells.append(("-" if pd.isna(acc) else f"{acc:.2f}") + f", {speedup:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def has_peers(df: pd.DataFrame) -> bool:
    """Whether the run measured transformers' target-only beside specdec's (not `--no-peers`)."""
    return "cpu_speedup_vs_hf_target_only" in df and not pd.to_numeric(
        df["cpu_speedup_vs_hf_target_only"], errors="coerce").isna().all()


#: the project's speed goals that one acceptance CSV decides: (what, the row, the row it is compared with, batch
#: size or None for every one the CSV has, the goal). "best worker" is the specdec row with the highest ratio.
GOALS = (
    ("best worker / transformers' target-only", "best worker", "transformers target-only", 1, 2.5),
    ("specdec's target-only / transformers'", "target-only", "transformers target-only", None, 1.0),
    ("STANDALONE tuned / assisted generation", "STANDALONE tuned", "transformers assisted", 1, 1.2),
    ("NGRAM tuned / prompt lookup 10", "NGRAM tuned", "transformers prompt-lookup 10", 1, 1.2),
    ("NGRAM tuned / prompt lookup 3", "NGRAM tuned", "transformers prompt-lookup 3", 1, 1.2),
    ("NGRAM tuned / specdec's target-only", "NGRAM tuned", "target-only", None, 1.0),
    ("EAGLE tuned / EAGLE tree S5 K4 W16", "EAGLE tuned", "EAGLE tree S5 K4 W16", 16, 1.1),
)


def _passes(row) -> list[float] | None:
    cell = row.get("cpu_tokens_per_s_by_pass")
    if cell is None or pd.isna(cell) or cell == "":
        return None
    return [float(x) for x in str(cell).split(";")]


def paired_ratio(a, b) -> tuple[float, list[float] | None]:
    """Two rows of one (batch size, temperature) -> (a's CPU tokens/s over b's, the per-pass ratios or None). Pass p
    of both ran in the same minutes, so the median of the per-pass ratios leaves out a drift of the machine's speed
    that the ratio of the two median passes keeps; a CSV without `cpu_tokens_per_s_by_pass` gives that ratio."""
    pa, pb = _passes(a), _passes(b)
    if pa is None or pb is None or len(pa) != len(pb):
        return a["cpu_tokens_per_s"] / b["cpu_tokens_per_s"], None
    ratios = [x / y for x, y in zip(pa, pb)]
    return statistics.median(ratios), ratios


def _pass_cell(ratios: list[float] | None, goal: float) -> str:
    """The per-pass ratios' range and how many met the goal: a median that meets it by less than the machine's
    noise shows here as passes below it."""
    if ratios is None:
        return ""
    met = sum(r >= goal for r in ratios)
    return f"{min(ratios):.2f}-{max(ratios):.2f}, {met} of {len(ratios)}"


#: a real target's goals (its issue's): the best worker against transformers' target-only 2.0x (2.5x the moonshot),
#: STANDALONE at its default shape against assisted generation with the same draft LM, specdec's target-only 1.2x
REAL_TARGET_GOALS = (
    ("best worker / transformers' target-only", "best worker", "transformers target-only", 1, 2.0),
    ("specdec's target-only / transformers'", "target-only", "transformers target-only", None, 1.2),
    ("STANDALONE / assisted generation", "STANDALONE tree S5 K4 W16", "transformers assisted", 1, 1.2),
    ("NGRAM / prompt lookup 10", "NGRAM tree S5 K4 W16", "transformers prompt-lookup 10", 1, 1.2),
)


def goals_for(df: pd.DataFrame) -> tuple:
    """The goals a CSV is held to: a real target's (`REAL_TARGET_GOALS`) or the zoo pairs' (`GOALS`)."""
    models = set(df["model"].astype(str)) if "model" in df else set()
    return REAL_TARGET_GOALS if models & set(zoo.REAL_TARGETS) else GOALS


def goals_table(df: pd.DataFrame, temperature: float = 0.0) -> str:
    """Markdown: each goal of `goals_for(df)` whose two rows the CSV has, the paired ratio per batch size, the per-pass
    ratios' range and how many passes met the goal, and whether the median meets it. Empty when the CSV has
    none."""
    df = overall_rows(df[df["temperature"] == temperature])
    specdec = df[~df["worker"].astype(str).str.startswith("hf-") & (df["worker"] != "target-only")]
    lines = []
    for what, label, base, size, goal in goals_for(df):
        sizes = [size] if size is not None else sorted(df["batch_size"].unique())
        for B in sizes:
            here = df[df["batch_size"] == B].set_index("label")
            if base not in here.index:
                continue
            if label == "best worker":
                rows = specdec[specdec["batch_size"] == B].set_index("label")
                if rows.empty:
                    continue
                found = {name: paired_ratio(r, here.loc[base]) for name, r in rows.iterrows()}
                name = max(found, key=lambda n: found[n][0])
                (ratio, passes), cell = found[name], f" ({name})"
            elif label in here.index:
                (ratio, passes), cell = paired_ratio(here.loc[label], here.loc[base]), ""
            else:
                continue
            mark = "" if passes is not None else " (median passes)"
            lines.append(f"| {what}, B = {B} | {ratio:.2f}x{cell}{mark} | {_pass_cell(passes, goal)} | {goal:.1f}x | "
                         f"{'yes' if ratio >= goal else '**no**'} |")
    if not lines:
        return ""
    return "\n".join(["| goal | measured | passes: range, met | goal | met |", "|---|---|---|---|---|"] + lines)


#: the kind that drafts with a small LM of the target's vocabulary (STANDALONE), and the workers it is measured
#: against: every kind that needs a trained head (not an untrained draft such as NGRAM)
STANDALONE_KIND = "draft_lm"


def _trained_head_kinds() -> list[str]:
    return [name for name, kind in DRAFT_KINDS.items() if name != STANDALONE_KIND and not kind.untrained]


def _by_batch(row):
    """A row's per-batch columns -> (tokens, accepted per step, verify steps, CPU seconds per pass), or None when it
    has none."""
    cells = [row.get(c) for c in ("tokens_by_batch", "accept_len_by_batch", "verify_steps_by_batch",
                                  "cpu_s_by_batch")]
    if any(c is None or (not isinstance(c, str) and pd.isna(c)) or c == "" for c in cells):
        return None
    tokens = [int(x) for x in str(cells[0]).split(",")]
    accept = [float(x) for x in str(cells[1]).split(",")]
    steps = [float(x) for x in str(cells[2]).split(",")]
    cpu = [[float(x) for x in p.split(",")] for p in str(cells[3]).split(";")]
    return tokens, accept, steps, cpu


def where_it_accepts_more(a, b) -> dict | None:
    """Two rows of one (batch size, temperature) with per-batch columns -> on the batches (at B = 1: the prompts)
    where a accepts more tokens per step than b: how many of how many, each row's tokens per step there (pooled over
    their verify steps), and a's CPU tokens/s over b's there, pass by pass (`ratio`, the median; `passes`). None when
    a row lacks the columns; `ratio` None when a accepts more on no batch."""
    ra, rb = _by_batch(a), _by_batch(b)
    if ra is None or rb is None or len(ra[0]) != len(rb[0]) or len(ra[3]) != len(rb[3]):
        return None
    (ta, aa, sa, ca), (tb, ab, sb, cb) = ra, rb
    more = [i for i in range(len(ta)) if aa[i] > ab[i]]
    out = {"more": len(more), "of": len(ta), "ratio": None, "passes": None, "accept_a": None, "accept_b": None}
    if not more:
        return out

    def pooled(accept, steps):
        return sum(accept[i] * steps[i] for i in more) / sum(steps[i] for i in more)

    def rate(tokens, cpu):
        return sum(tokens[i] for i in more) / sum(cpu[i] for i in more)

    passes = [rate(ta, pa) / rate(tb, pb) for pa, pb in zip(ca, cb)]
    out.update(ratio=statistics.median(passes), passes=passes, accept_a=pooled(aa, sa), accept_b=pooled(ab, sb))
    return out


def accepts_more_table(df: pd.DataFrame, batch_size: int = 1, temperature: float = 0.0) -> str:
    """Markdown, "is STANDALONE ahead of every worker that needs a trained head on the prompts where its acceptance
    is higher": for every such row of the CSV at `batch_size`, the tuned STANDALONE row and the STANDALONE row of the
    same shape (where the run has one) on the prompts where STANDALONE accepts more per step
    (`where_it_accepts_more`). Empty when the CSV lacks the rows or the per-batch columns."""
    here = overall_rows(df[(df["batch_size"] == batch_size) & (df["temperature"] == temperature)])
    standalone = here[here["worker"] == STANDALONE_KIND]
    trained = here[here["worker"].isin(_trained_head_kinds())]
    lines = []
    for _, b in trained.iterrows():
        shape = (b["num_steps"], b["topk"], b["num_draft_tokens"])
        for _, a in standalone.iterrows():
            same_shape = a["shape_policy"] == "static" and b["shape_policy"] == "static" and (
                a["num_steps"], a["topk"], a["num_draft_tokens"]) == shape
            if a["shape_policy"] != "tuned" and not same_shape:
                continue
            r = where_it_accepts_more(a, b)
            if r is None:
                continue
            if r["ratio"] is None:
                lines.append(f"| {b['label']} | {a['label']} | 0 of {r['of']} |  |  |  |")
                continue
            lines.append(f"| {b['label']} | {a['label']} | {r['more']} of {r['of']} | {r['accept_a']:.2f} / "
                         f"{r['accept_b']:.2f} | {r['ratio']:.2f}x ({min(r['passes']):.2f}-{max(r['passes']):.2f}) | "
                         f"{'yes' if r['ratio'] >= 1.0 else '**no**'} |")
    if not lines:
        return ""
    return "\n".join(["| worker with a trained head | STANDALONE | prompts where STANDALONE accepts more | "
                      "accepted / step there (STANDALONE / worker) | CPU tokens/s there, STANDALONE / worker "
                      "(passes' range) | ahead |", "|---|---|---|---|---|---|"] + lines)


def print_report(csv_path) -> int:
    """An acceptance or penalties CSV of results/ -> its tables on stdout."""
    path = Path(csv_path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    if path.name.startswith("penalties-"):
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
          f"new tokens, {int(info['repeats'])} repeats (median); CPU tokens/s relative to "
          + ("transformers' target-only" if has_peers(df) else "specdec's target-only (a run without the peers)"))
    print()
    print(results_table(df))
    by_category = category_table(df)
    if by_category:
        print()
        print(f"By prompt category, B = {int(df['batch_size'].min())}, T = 0: accepted tokens per step, CPU tokens/s "
              f"relative to specdec's target-only on the same prompts:")
        print()
        print(by_category)
    goals = goals_table(df)
    if goals:
        print()
        print("Against the project's goals (CPU tokens/s, the median over passes of the per-pass ratio):")
        print()
        print(goals)
    more = accepts_more_table(df)
    if more:
        print()
        print("STANDALONE against the workers with a trained head, B = 1, on the prompts where STANDALONE accepts more "
              "per step (CPU tokens/s there, the median over passes of the per-pass ratio):")
        print()
        print(more)
    return 0
