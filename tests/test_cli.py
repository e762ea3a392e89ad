"""The CLI turns every bad invocation into a short message and a non-zero exit, never a traceback."""
import pytest

from specdec import zoo
from specdec.cli import main


@pytest.mark.parametrize("argv, message", [
    (["bench", "--num-prompts", "2", "--batch-sizes", "4"], "--batch-sizes [4] exceed --num-prompts 2"),
    (["bench", "--batch-sizes", "1 4"], "expected an integer >= 1, got '1 4'"),
    (["bench", "--batch-sizes", "1,,4"], "comma-separated integers"),
    (["bench", "--num-prompts", "0"], "expected an integer >= 1, got 0"),
    (["bench", "--max-new-tokens", "0"], "expected an integer >= 1, got 0"),
    (["bench", "--temperatures", "0,hot"], "comma-separated numbers"),
    (["bench", "--temperatures", "-1"], "finite and >= 0"),
    (["bench", "--workers", "eagle,eagle4"], "unknown draft(s) ['eagle4']"),
    (["demo", "--max-new-tokens", "0"], "expected an integer >= 1, got 0"),
    (["demo", "--threads", "-2"], "--threads must be >= 0"),
    (["bench", "--device", "tpu"], "expected auto, cpu, cuda or cuda:N, got 'tpu'"),
])
def test_bad_arguments_are_one_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_errors_inside_a_command_are_one_line(monkeypatch, capsys):
    import specdec.demo

    def failing_demo(**kwargs):
        raise ValueError("impl='fast' needs every op the workers call")

    monkeypatch.setattr(specdec.demo, "run_demo", failing_demo)
    monkeypatch.delenv("SPECDEC_TRACEBACK", raising=False)
    assert main(["demo", "--impl", "fast"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "specdec demo: error: impl='fast' needs every op the workers call"
    monkeypatch.setenv("SPECDEC_TRACEBACK", "1")
    with pytest.raises(ValueError):
        main(["demo"])


def test_version_and_zoo_list(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("specdec ")
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines] == zoo.names()
    assert all(": dflash, draft_lm, eagle, eagle3, mtp, mtp_chain, target (" in line and "ByteTokenizer" in line
               for line in lines)


def test_every_option_says_what_it_is(capsys):
    """Each option of each command has a help text (argparse prints its default beside it)."""
    import re
    for command in ("demo", "generate", "bench", "report"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        options = re.findall(r"^  (--[a-z-]+)", text, flags=re.M)
        assert options or command == "report", command  # report takes only its CSV
        for option in options:
            block = text.split(option, 1)[1].split("\n  -", 1)[0]
            assert len(block.split()) > 1, (command, option)


def test_the_readme_results_tables_are_the_reports_of_their_csvs(capsys):
    """The README quotes no number that its committed CSVs do not give: `specdec report` prints each table."""
    import re
    from pathlib import Path
    readme = Path("README.md").read_text()
    quoted = sorted(set(re.findall(r"`specdec report (results/(?:acceptance|penalties)-[0-9-]+\.csv)`", readme)))
    assert "results/acceptance-20261203-122206.csv" in quoted  # the small pair's table
    for csv in quoted:
        assert main(["report", csv]) == 0
        table = capsys.readouterr().out.split("\n\n", 1)[1].split("\n\nAgainst the goals", 1)[0].strip()
        assert table in readme, csv


def test_bench_penalties_writes_its_csv_and_report(tmp_path, capsys):
    """`specdec bench --suite penalties`: every setting under both modes for a tree worker; the exact mode never
    leaves target-only's output; `specdec report` prints the table from the CSV."""
    import csv
    assert main(["bench", "--suite", "penalties", "--model", "stdlib-byte-6l", "--workers", "eagle", "--num-prompts",
                 "2", "--prompt-len", "32", "--max-new-tokens", "12", "--repeats", "1", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("penalties-*.csv")
    rows = list(csv.DictReader(path.open()))
    assert {r["suite"] for r in rows} == {"penalties"}
    modes = (("exact", "False"), ("sglang", "False"), ("exact", "True"))
    assert {(r["label"], r["penalty_mode"], r["draft_penalties"]) for r in rows if r["penalty"] == "repetition 1.5"} \
        == {("target-only", "exact", "False")} | {(label, *m) for label in ("EAGLE tree S5 K4 W16", "EAGLE chain S3")
                                                  for m in modes}
    assert all(float(r["differing_request_fraction"]) == 0.0 for r in rows if r["penalty_mode"] == "exact")
    assert all(float(r["step_cpu_ms"]) > 0 for r in rows
               if r["penalty_mode"] == "exact" and r["draft_penalties"] == "False" and r["penalty"] != "none")
    capsys.readouterr()
    assert main(["report", str(path)]) == 0
    assert "| EAGLE tree S5 K4 W16 | repetition 1.5 | 0% |" in capsys.readouterr().out


def test_report_of_a_run_without_the_peers(capsys):
    """A bench run with `--no-peers` reports relative to specdec's target-only, with the goals it decides."""
    assert main(["report", "results/acceptance-20261204-151630.csv"]) == 0
    out = capsys.readouterr().out
    assert "relative to specdec's target-only (a run without the peers)" in out
    assert "| target-only | 1.00 | 1.00 | 1.00x | 1.00x | 1.00x |" in out
    assert "| NGRAM tuned / specdec's target-only, B = 2 | 1.74x |" in out


def test_report_errors_are_one_line(capsys):
    assert main(["report", "results/no-such-file.csv"]) == 1
    assert "no such file" in capsys.readouterr().err


def test_the_design_document_covers_every_op():
    """docs/design.md (linked from the README) names every op a worker calls: a new op cannot land undocumented."""
    from pathlib import Path

    from specdec.contract import WORKER_OPS
    design = Path("docs/design.md").read_text()
    assert "docs/design.md" in Path("README.md").read_text()
    assert [op for op in WORKER_OPS if f"`{op}(" not in design] == []


def test_bench_runs_the_asked_drafts_only(tmp_path, capsys):
    """`specdec bench --workers eagle3 --no-peers`: target-only and the EAGLE-3 head at both default specs."""
    import csv
    argv = ["bench", "--workers", "eagle3", "--no-peers", "--batch-sizes", "1", "--num-prompts", "1",
            "--max-new-tokens", "8", "--repeats", "1", "--temperatures", "0", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = list(csv.DictReader(next(tmp_path.glob("acceptance-*.csv")).open()))
    assert [(r["worker"], r["num_steps"], r["topk"]) for r in rows] == [("target-only", "0", "0"),
                                                                         ("eagle3", "5", "4"), ("eagle3", "3", "1")]
    assert all(r["same_tokens_as_target_only"] == "True" for r in rows)
