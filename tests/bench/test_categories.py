"""Rows by prompt category: each batch holds one category's prompts, a category's rows are measured on its own batches
of the same passes (their tokens, CPU seconds and verify steps add up to the run's row), and the report's table and
the older CSVs read with the column."""
import csv

import pandas as pd

from specdec import SpecConfig
from specdec.bench.cases import WorkerCase
from specdec.bench.report.figures import categories_of, overall_rows, read_results
from specdec.bench.report.tables import category_table, results_table
from specdec.bench.suites.acceptance import category_batches, planned_decodes, run_benchmark
from tests.helpers import near_bigram_target, perfect_eagle


def test_each_batch_holds_one_categorys_prompts_in_order():
    cats = ["a", "b", "a", "c", "b", "a"]
    assert category_batches(cats, 1) == [[0], [2], [5], [1], [4], [3]]
    assert category_batches(cats, 2) == [[0, 2], [1, 4]]  # a's third and c's only prompt fill no batch
    assert category_batches(["x"] * 5, 2) == [[0, 1], [2, 3]]  # one category: the prompts in order, B at a time
    cases = [WorkerCase("target-only", None), WorkerCase("eagle", SpecConfig(2, 2, 4))]
    # 2 cases x 2 batches timed, then 2 engines x (logprob + phase pass) x 2 batches
    assert planned_decodes(cases, 6, [2], [0.0], 1, categories=cats) == {2: 2 * 2 + 2 * 2 * 2}


def test_a_categorys_rows_are_its_batches_of_the_same_passes(tmp_path):
    target = near_bigram_target(seed=1, mix=0.2)
    cases = [WorkerCase("target-only", None), WorkerCase("eagle", SpecConfig(2, 2, 4))]
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8]]
    cats = ["x", "y", "x", "y"]
    path = run_benchmark(target, {"eagle": perfect_eagle(target)}, cases, prompts, [1], [0.0], 5, "tiny",
                         out_dir=tmp_path, progress=lambda s: None, repeats=1, show_progress=False, categories=cats)
    rows = list(csv.DictReader(path.open()))
    assert [(r["label"], r["category"]) for r in rows] == [
        ("target-only", "all"), ("EAGLE tree S2 K2 W4", "all"), ("target-only", "x"), ("EAGLE tree S2 K2 W4", "x"),
        ("target-only", "y"), ("EAGLE tree S2 K2 W4", "y")]
    for label in ("target-only", "EAGLE tree S2 K2 W4"):
        all_, x, y = (r for r in rows if r["label"] == label)
        assert int(all_["num_prompts"]) == 4 and int(x["num_prompts"]) == int(y["num_prompts"]) == 2
        assert int(x["tokens"]) + int(y["tokens"]) == int(all_["tokens"])
        assert abs(float(x["cpu_s"]) + float(y["cpu_s"]) - float(all_["cpu_s"])) < 1e-3
        # the batches: x's prompts first (0, 2), then y's
        assert all_["tokens_by_batch"] == x["tokens_by_batch"] + "," + y["tokens_by_batch"]
        steps = [sum(int(n) for n in r["verify_steps_by_batch"].split(",")) for r in (x, y)]
        pooled = (float(x["mean_accept_len"]) * steps[0] + float(y["mean_accept_len"]) * steps[1]) / sum(steps)
        assert abs(pooled - float(all_["mean_accept_len"])) < 1e-3
        assert all(r["same_tokens_as_target_only"] == "True" and r["max_logprob_diff"] != "" for r in (all_, x, y))
    df = read_results(path)
    assert categories_of(df) == ["x", "y"] and len(overall_rows(df)) == 2
    assert results_table(df) == results_table(overall_rows(df))  # the run's tables read its overall rows only


def test_the_category_table_and_old_csvs(tmp_path):
    def row(label, worker, category, acc, speedup, n):
        return dict(label=label, worker=worker, category=category, mean_accept_len=acc,
                    cpu_speedup_vs_target_only=speedup, num_prompts=n, temperature=0.0, batch_size=1)
    df = pd.DataFrame([row("target-only", "target-only", c, 1.0, 1.0, n) for c, n in (("all", 4), ("qa", 1),
                                                                                       ("math", 3))]
                      + [row("EAGLE chain S3", "eagle", "all", 2.5, 1.5, 4), row("EAGLE chain S3", "eagle", "qa", 2.0,
                                                                                 1.25, 1),
                         row("EAGLE chain S3", "eagle", "math", 2.666, 1.6, 3),
                         row("transformers target-only", "hf-target-only", "all", "", 0.8, 4)])
    assert category_table(df).splitlines() == [
        "| worker: accepted / step, CPU tok/s vs specdec's target-only | qa (1 prompts) | math (3 prompts) | "
        "all (4 prompts) |", "|---|---|---|---|",
        "| target-only | 1.00, 1.00x | 1.00, 1.00x | 1.00, 1.00x |",
        "| EAGLE chain S3 | 2.00, 1.25x | 2.67, 1.60x | 2.50, 1.50x |",
        "| transformers target-only |  |  | -, 0.80x |"]
    assert category_table(df[df["category"] == "all"]) == ""  # one category: no table
    old = tmp_path / "acceptance-20260101-000000.csv"
    df[df["category"] == "all"].drop(columns="category").assign(suite="acceptance").to_csv(old, index=False)
    assert set(read_results(old)["category"]) == {"all"}
