"""The committed results files: every CSV reads in today's schema, has its plot beside it and names its rows; a run
never replaces another's file."""

import torch


def test_old_csvs_read_in_todays_schema(tmp_path):
    """A committed acceptance CSV from before the `suite` and `label` columns reads with both (the label from
    its draft kind and shape); an e2e CSV whose `worker` held the label reads with `worker` the draft kind."""
    from specdec.bench.report.figures import read_results

    old = read_results("results/acceptance-20261130-010414.csv")
    assert set(old["suite"]) == {"acceptance"}
    assert list(old.columns).index("label") == list(old.columns).index("worker") + 1
    labels = dict(zip(old["worker"], old["label"]))
    assert labels["eagle3"].startswith("EAGLE-3 ") and labels["mtp_chain"] == "MTP Step-3.5 S3"
    assert labels["hf-target-only"] == "transformers target-only"
    (tmp_path / "e2e-1.csv").write_text("suite,worker,num_steps\ne2e,target-only,0\ne2e,EAGLE-3 tree S5 K4 W16,5\n"
                                        "e2e,MTP Step-3.5 S3,3\n")
    e2e = read_results(tmp_path / "e2e-1.csv")
    assert list(e2e["worker"]) == ["target-only", "eagle3", "mtp_chain"]
    (tmp_path / "acceptance-2.csv").write_text("suite,run_id,commit\nacceptance,20261202-161310,43e4079\n")
    assert read_results(tmp_path / "acceptance-2.csv")["commit"].tolist() == ["43e4079"]  # not inf
    assert list(e2e["label"]) == ["target-only", "EAGLE-3 tree S5 K4 W16", "MTP Step-3.5 S3"]
    # the random model of Llama-3.2-1B's shapes, named for 1.2B parameters before its count was fixed
    counts = read_results("results/kernel-count-20261206-200539.csv")
    assert set(counts["model"]) == {"random-llama-1.5b"}


def test_the_random_1b_models_name_states_its_parameter_count():
    """Counted from its shapes on the meta device (nothing allocated): two 128,256 x 2,048 matrices (embedding and
    untied LM head) and 16 layers of 60.8M make 1.5B, which the name in every CSV says."""
    from specdec.bench.suites.e2e import RANDOM_1B_NAME, RANDOM_1B_SHAPES
    from specdec.models.llama import LlamaConfig, LlamaForCausalLM
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**RANDOM_1B_SHAPES))
    billions = sum(p.numel() for p in model.parameters()) / 1e9
    assert RANDOM_1B_NAME == f"random-llama-{billions:.1f}b"


def test_one_plot_entry_point_draws_every_committed_schema(tmp_path):
    """`specdec plot` over the newest committed penalties and grammar CSVs (the acceptance, kernel and e2e plots are
    drawn by the tests above): a PNG beside each (the grammar-fill file drawn with its grammar run), and a CSV of a
    schema with no plot is an error naming it."""
    import shutil
    from pathlib import Path

    from PIL import Image

    from specdec.cli import main
    committed = sorted(Path("results").glob("*.csv"))
    suites = {}
    for f in committed:  # the newest file of each schema
        suites[f.stem.rsplit("-", 2)[0]] = f
    suites = {k: v for k, v in suites.items() if k in ("penalties", "grammar", "grammar-fill")}
    assert len(suites) == 3
    for f in suites.values():
        shutil.copy(f, tmp_path / f.name)
    assert main(["plot", "--results", str(tmp_path)]) == 0
    drawn = {p.stem for p in tmp_path.glob("*.png")}
    assert drawn == {f.stem for f in suites.values() if not f.stem.startswith("grammar-fill-")}
    for png in tmp_path.glob("*.png"):
        with Image.open(png) as im:
            assert im.size[0] > 400 and im.size[1] > 200
    (tmp_path / "odd-1.csv").write_text("suite,x\nodd,1\n")
    assert main(["plot", str(tmp_path / "odd-1.csv")]) == 1  # the CLI's one-line error: no plot for suite 'odd'


def test_a_tune_csv_of_the_grid_check_alone_plots_a_row_per_prompt_set(tmp_path):
    """`specdec tune --check-tuned` writes check rows only: its plot has no empty tuning row, one row of panels per
    prompt set (a row is as tall in both figures, the title strip aside)."""
    from pathlib import Path

    import pandas as pd
    from PIL import Image

    from specdec.bench.report.plots import plot_csv
    tunes = [pd.read_csv(f) for f in sorted(Path("results").glob("tune-*.csv"))]
    df = [t for t in tunes if (t["source"] == "check").any() and (t["prompt_set"] == "tuning").any()][-1]
    sets = df.loc[df["source"] == "check", "prompt_set"].nunique()
    df.to_csv(tmp_path / "tune-full.csv", index=False)
    df[df["source"] == "check"].to_csv(tmp_path / "tune-check.csv", index=False)
    with Image.open(plot_csv(tmp_path / "tune-full.csv")) as a, Image.open(plot_csv(tmp_path / "tune-check.csv")) as b:
        row = a.size[1] - b.size[1]  # the tuning row the check-only figure leaves out
        assert a.size[0] == b.size[0] and row > 200
        assert abs(b.size[1] - sets * row) < row / 2


def test_every_committed_results_csv_has_its_plot_committed_beside_it():
    """What the notebooks and the README show is committed: a CSV written without its PNG would have notebook 02 draw
    it (into a scratch directory) on every run, and the README point at a missing file."""
    from pathlib import Path

    from specdec.bench.report.figures import read_results
    from specdec.bench.report.plots import SUITE_PLOTS, TABLE_SUITES

    csvs = [f for f in sorted(Path("results").glob("*.csv")) if not f.stem.startswith("grammar-fill-")]
    suites = {f: str(read_results(f)["suite"].iloc[0]) for f in csvs}
    assert set(suites.values()) <= set(SUITE_PLOTS) | set(TABLE_SUITES)  # `specdec plot` reads every one
    drawn = [f for f, suite in suites.items() if suite in SUITE_PLOTS]
    assert {"acceptance", "tune"} <= {suites[f] for f in drawn}
    assert [f.name for f in drawn if not f.with_suffix(".png").is_file()] == []


def test_case_label_names_every_row_of_the_committed_acceptance_csvs():
    """Notebook 02 labels every row of results/acceptance-*.csv: a tuned row whose bucket ran no draft (shape
    0, 0, 1) is named by its label, a static row by its shape as `worker_label` names it."""
    from pathlib import Path

    from specdec.bench.report.figures import case_label, load_results
    df = load_results(Path(__file__).resolve().parents[2] / "results", "acceptance-*.csv")
    labels = df.apply(case_label, axis=1)
    tuned = df[(df.get("shape_policy") == "tuned") & (df["num_steps"] == 0)]
    assert len(tuned) > 0 and set(labels[tuned.index]) <= {"NGRAM tuned"}
    static = df[(df["worker"] == "eagle") & (df["num_steps"] == 5) & (df["topk"] == 4) & (df["num_draft_tokens"] == 16)]
    assert set(labels[static.index]) == {"EAGLE tree S5 K4 W16"}


def test_write_csv_never_replaces_another_runs_file(tmp_path):
    """Two runs started in the same second share a run id and so a file name: the second keeps its rows in
    `<stem>-2.csv` and the first's file stays as it was."""
    import dataclasses

    from specdec.bench.common import write_csv

    @dataclasses.dataclass
    class Row:
        model: str

    first = write_csv([Row("deep")], tmp_path, "tune-20261204-120606.csv")
    second = write_csv([Row("small")], tmp_path, "tune-20261204-120606.csv")
    third = write_csv([Row("other")], tmp_path, "tune-20261204-120606.csv")
    assert [first.name, second.name, third.name] == ["tune-20261204-120606.csv", "tune-20261204-120606-2.csv",
                                                     "tune-20261204-120606-3.csv"]
    assert first.read_text().splitlines() == ["model", "deep"] and second.read_text().splitlines()[1] == "small"
