"""What the documents show from results/: the results page's sections (`specdec.bench.report.results_page`) and the
README's figure (`plots.speedup_figure`). The kernel-count section quotes its CSV's counts and, at B = 1, each earlier
run's, read here with the csv module; an acceptance CSV of sampled requests only is tabled at its temperature, one of
several temperatures and no greedy rows is refused in one line; the figure's bars are the CSV's ratios."""
import csv
from pathlib import Path

import pytest

from specdec.bench.report.results_page import acceptance_section, kernel_count_section

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "results" / "kernel-count-20261206-200539.csv"
EARLIER = [ROOT / "results" / "kernel-count-20261206-020926.csv", ROOT / "results" / "kernel-count-20261206-074213.csv"]


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _table(lines, first_cell):
    """The markdown rows of the table whose header starts with `first_cell` -> lists of cells."""
    lines = "\n".join(lines).splitlines()  # a section's items may be several lines each
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_cell} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_kernel_count_section_quotes_every_row_and_the_earlier_runs():
    lines = kernel_count_section(KERNELS, [{"csv": p.relative_to(ROOT).as_posix(), "before": f"change {i}", "path": p}
                                           for i, p in enumerate(EARLIER)])
    want = [[r["label"], r["batch_size"], r["total_kernels"], r["body_kernels"], r["eager_ops"], r["aten_kernels"],
             r["triton_launches"], r["host_reads"], r["budget"].removesuffix(".0")] for r in _rows(KERNELS)]
    assert _table(lines, "worker") == want
    history = _table(lines, "worker, B = 1")
    header = next(line for line in lines if line.startswith("| worker, B = 1 |"))
    assert "before change 0 (`results/kernel-count-20261206-020926.csv`)" in header
    runs = [_rows(p) for p in EARLIER] + [_rows(KERNELS)]
    labels = list(dict.fromkeys(r["label"] for r in _rows(KERNELS)))
    assert history == [[label] + [next((r["total_kernels"] for r in run
                                        if r["label"] == label and r["batch_size"] == "1"), "") for run in runs]
                       for label in labels]


def _acceptance_csv(path, temperatures):
    """A copy of a committed acceptance CSV with its rows' temperatures replaced, one copy of the rows per
    temperature."""
    rows = _rows(ROOT / "results" / "acceptance-20261206-070203.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for t in temperatures:
            w.writerows(dict(r, temperature=t) for r in rows)
    return path


def test_an_acceptance_csv_of_sampled_requests_only_is_tabled_at_its_temperature(tmp_path):
    lines = acceptance_section(_acceptance_csv(tmp_path / "acceptance-1.csv", ["0.7"]))
    rows = {r["label"]: r for r in _rows(ROOT / "results" / "acceptance-20261206-070203.csv")}
    table = _table(lines, "worker")
    assert [r[0] for r in table] == list(rows)
    assert all(r[-1] == f"{float(rows[r[0]]['cpu_speedup_vs_target_only']):.2f}x" for r in table)
    with pytest.raises(ValueError, match=r"no greedy rows and several temperatures \[0\.7, 1\.0\]") as e:
        acceptance_section(_acceptance_csv(tmp_path / "acceptance-2.csv", ["0.7", "1.0"]))
    assert "\n" not in str(e.value)


def test_the_speedup_figure_draws_each_rows_ratio_and_names_its_sources(tmp_path, monkeypatch):
    """The README's figure: one bar per row of the CSV at B = 1, T = 0, its width the row's CPU tokens/s over
    transformers' target-only as the CSV holds it (read here with the csv module), best on top; the figure's text
    names the CSV, the bench command results/current.json records for it and the command that drew it."""
    from specdec.bench.report import plots
    drawn = {}

    def keep(fig, out_png, rect=None):
        drawn["fig"] = fig
        return Path(out_png)

    monkeypatch.setattr(plots, "_save", keep)
    source = ROOT / "results" / "acceptance-20261206-070202.csv"
    plots.speedup_figure(source, tmp_path / "speedup.png")
    fig = drawn["fig"]
    ax = fig.axes[0]
    want = sorted(float(r["cpu_speedup_vs_hf_target_only"]) for r in _rows(source)
                  if r["batch_size"] == "1" and float(r["temperature"]) == 0)
    assert [round(p.get_width(), 6) for p in ax.patches] == [round(w, 6) for w in want]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[-1].startswith("NGRAM chain S3") and "(1.63 tokens/step)" in labels[-1]
    text = "\n".join(t.get_text() for t in fig.texts)
    assert source.as_posix() in text.replace("\n", "")
    assert "--workers eagle3,eagle,dflash,draft_lm,ngram" in text and "AMD EPYC" in text
    assert f"specdec plot --speedup-by-kind {source.as_posix()}" in " ".join(text.split())
    with pytest.raises(ValueError, match="draws an acceptance CSV"):
        plots.speedup_figure(KERNELS, tmp_path / "kernels.png")
