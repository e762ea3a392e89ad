"""`specdec gpu-check`: the smoke run writes at most six files with their schemas' columns and a SUMMARY.md, never
calls pip and never writes outside its out directory; every configuration is tried on its own, and a
configuration that raises, hangs or kills its process costs its own row only (the part is restarted from the
next configuration); the run ends inside its deadline and the summary says per part and per goal what was
measured, what failed and what was never reached."""
from __future__ import annotations

import csv
import dataclasses
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import specdec.gpu_check.driver as gpu_check
from specdec.gpu_check import decode as gpu_decode, parts as gpu_parts, rows as gpu_rows
from specdec.gpu_check import runner as gpu_runner, summary as gpu_summary
from specdec.gpu_check.rows import E2E, ENVIRONMENT, KERNELS, TESTS
from tests.helpers import write_gpu_rows

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = {ENVIRONMENT: gpu_rows.EnvironmentRow, KERNELS: gpu_rows.GpuKernelRow, E2E: gpu_rows.DecodeRow,
           TESTS: gpu_rows.TestRow}
FAULTS = "e2e:2:raise,tests:1:hang,logprob_kernels:1:abort"

#: Loaded by every Python process of the run (PYTHONPATH): any subprocess or import of pip is recorded.
PIP_GUARD = textwrap.dedent('''
    import os, sys

    def _guard(event, args):
        if event == "subprocess.Popen":
            argv = [os.path.basename(str(a)) for a in (args[1] if isinstance(args[1], (list, tuple)) else [args[1]])]
            if any(a in ("pip", "pip3") or a.startswith("pip3.") for a in argv):
                open(os.environ["PIP_MARKER"], "a").write(repr(argv) + "\\n")
                raise RuntimeError("gpu-check called pip")
        elif event == "import" and args[0] in ("pip", "ensurepip"):
            open(os.environ["PIP_MARKER"], "a").write("import " + args[0] + "\\n")

    sys.addaudithook(_guard)
''')


def _untracked_and_ignored() -> set[str]:
    """The checkout's untracked and ignored paths, bytecode aside (another process may compile the tree), and the
    caches other tests write beside a parallel run (hypothesis' database, pytest's and pytest-benchmark's)."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--ignored"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return {line[3:] for line in out.splitlines() if line[:2] in ("??", "!!")
            and "__pycache__" not in line and not line.endswith(".pyc")
            and not line[3:].startswith((".hypothesis/", ".pytest_cache/", ".benchmarks/"))}


def _rows(out: Path, name: str) -> list[dict]:
    with (out / name).open(newline="") as f:
        return list(csv.DictReader(f))


def _smoke(tmp_path: Path, *args: str, timeout: float = 400):
    """Run `python3 -m specdec.gpu_check --smoke` as a remote runner would (from elsewhere, OUT set), with pip
    replaced by a recorder and HOME / TMPDIR fresh. Returns (the run, the out dir, seconds, the env)."""
    out, home, tmp, bin_dir, guard = (tmp_path / n for n in ("out", "home", "tmp", "bin", "guard"))
    for d in (home, tmp, bin_dir, guard):
        d.mkdir()
    marker = tmp_path / "pip-called"
    for name in ("pip", "pip3"):
        fake = bin_dir / name
        fake.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {marker}\necho 'gpu-check must not call pip' >&2\nexit 97\n")
        fake.chmod(0o755)
    (guard / "sitecustomize.py").write_text(PIP_GUARD)
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "PYTHONPATH", "SPECDEC_COMMIT")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", HOME=str(home), TMPDIR=str(tmp), PIP_MARKER=str(marker),
               PYTHONPATH=f"{guard}{os.pathsep}{ROOT}", OUT=str(out), PYTHONDONTWRITEBYTECODE="1")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "specdec.gpu_check", "--smoke", *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=timeout)
    seconds = time.monotonic() - t0
    assert not marker.exists(), marker.read_text()
    assert list(home.iterdir()) == [] and list(tmp.iterdir()) == [] and list(cwd.iterdir()) == []
    return run, out, seconds


def _check_files(out: Path) -> None:
    """At most six plain files, no folder, each CSV with its schema's header and rows of its width."""
    assert sorted(p.name for p in out.iterdir()) == sorted(gpu_rows.OUTPUT_FILES)
    assert len(gpu_rows.OUTPUT_FILES) <= 6 and all(p.is_file() for p in out.iterdir())
    for name, row_type in SCHEMAS.items():
        with (out / name).open(newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == [f.name for f in dataclasses.fields(row_type)], name
        assert len(rows) > 1 and all(len(r) == len(rows[0]) for r in rows), name


def _smoke_test_count() -> int:
    """The test functions of the smoke run's tests part (`gpu_tests.SMOKE_TEST_SUBSET`, whole files)."""
    from specdec.gpu_check.compiled_tests import SMOKE_TEST_SUBSET
    return sum((ROOT / path).read_text().count("\ndef test_") for path in SMOKE_TEST_SUBSET)


def test_smoke_run_writes_every_file_and_each_fault_costs_its_own_row_only(tmp_path):
    """One smoke run of every part with the issue's three faults injected: e2e's 2nd configuration raises, the
    first test hangs where no signal reaches it, the logprob part's first configuration kills its process. Each
    costs its own row; the parts go on (restarted in a fresh process after the hang and the abort), every other row
    is measured, the run ends inside its deadline and writes its files and nothing else. (One run for both: a
    smoke run costs a minute of CPU.)"""
    before = _untracked_and_ignored()
    run, out, seconds = _smoke(tmp_path, "--commit", "0123456789abcdef", "--inject-faults", FAULTS)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert seconds < gpu_check.DEFAULT_DEADLINE_S, run.stdout[-3000:]
    _check_files(out)
    env = {r["key"]: r["value"] for r in _rows(out, ENVIRONMENT)}
    measured = {name: [r for r in _rows(out, name) if r["status"] != "error"] for name in (KERNELS, E2E)}
    run_ids = {r["run_id"] for name in (KERNELS, E2E, TESTS) for r in _rows(out, name)}
    assert run_ids == {env["run_id"]} and env["suite"] == "gpu-check"  # one run, every part's rows
    commits = {r["commit"] for name in (KERNELS, E2E, TESTS) for r in _rows(out, name)}
    assert commits == {env["commit"]} == {"0123456789abcdef"}  # --commit, for a tree copied without .git
    for name in (KERNELS, E2E):
        assert {r["status"] for r in measured[name]} == {"ok"}, name

    # the faults: each its own row, the rest of its part measured
    summary = (out / "SUMMARY.md").read_text()
    for fault in FAULTS.split(","):
        assert f"- `{fault}`: configuration" in summary, summary
    kernels = _rows(out, KERNELS)
    logprobs = [r for r in kernels if r["part"] == "logprob_kernels"]
    died = [r for r in logprobs if r["status"] == "error"]
    assert len(died) == 1 and died[0]["check"] == "headline" and "SIGABRT" in died[0]["error"]
    later = {shape.check for shape in gpu_parts.logprob_shapes(smoke=True)[1:]}
    assert {r["check"] for r in logprobs if r["status"] == "ok"} == later  # every configuration after it
    assert "restarted after headline" in summary
    e2e = [r for r in _rows(out, E2E) if r["part"] == "e2e"]
    assert [r["status"] for r in e2e].count("error") == 1 and len(e2e) == len(gpu_decode.e2e_plan(True))
    assert "InjectedFault" in next(r["error"] for r in e2e if r["status"] == "error")
    tests = _rows(out, TESTS)
    assert [r["status"] for r in tests] == ["error"] + ["passed"] * (_smoke_test_count() - 1), tests
    assert "no progress" in tests[0]["error"] and tests[0]["index"] == "1"

    # every other part's rows
    read = [r for r in kernels if r["op"] == "device_read"]  # the read-only probe: its sum exact, beside the copy
    assert len(read) == 1 and read[0]["within_tolerance"] == "True" and float(read[0]["gbps"]) > 0
    assert {r["part"] for r in kernels} == {"environment", "logprob_kernels", "decode_ops", "profile"}
    profile = [r for r in kernels if r["part"] == "profile"]
    assert len(profile) > 5 and profile[-1]["op"] == "(total)" and float(profile[-1]["median_us"]) > 0
    assert {r["impl"] for r in logprobs if r["status"] == "ok"} == {"reference", "fast", "reference_graph",
                                                                    "fast_kernels"}
    assert all(r["within_tolerance"] == "True" for r in logprobs if r["status"] == "ok")
    assert any(r["check"] == "tiny_temperature" and r["temperature"] == "0.01" for r in logprobs)
    ops = {r["op"] for r in kernels if r["part"] == "decode_ops"}
    assert {"apply_penalties_tree", "apply_token_bitmask", "tree_attention", "verify_tree_greedy",
            "build_tree_kernel_efficient"} <= ops
    assert all(r["token_identical"] == "True" for r in measured[E2E] if r["part"] == "graph_replay")
    decode = [r for r in measured[E2E] if r["part"] in ("e2e", "engines")]  # each against the read ceiling
    assert all(float(r["bytes_per_step"]) > 0 and float(r["frac_of_read_ceiling"]) > 0 for r in decode)
    engines = [r for r in decode if r["part"] == "engines"]
    assert sorted((r["impl"], r["batch_size"]) for r in engines) == [
        ("reference_aot_eager", "1"), ("reference_aot_eager", "2"), ("transformers", "1"), ("transformers", "2")]
    assert all(r["token_identical"] == "True" for r in engines)  # fp32: specdec's reference tokens, same weights
    for part in gpu_check.PARTS:
        assert f"| {part.name} | ran |" in summary, summary
    assert f"{_smoke_test_count() - 1} passed" in summary, summary
    assert "## Decode against the read ceiling" in summary and "## Profile: " in summary
    assert _untracked_and_ignored() == before

    # notebook 02 finds such a directory under results/ and draws its GPU figures from it
    from specdec.bench.report.gpu_plots import gpu_check_dirs, plot_gpu_check_e2e, plot_gpu_check_kernels
    assert gpu_check_dirs(tmp_path) == [out]
    for plot in (plot_gpu_check_kernels, plot_gpu_check_e2e):
        assert plot(out, tmp_path / f"{plot.__name__}.png").stat().st_size > 10_000
    # and `specdec plot DIR/kernels.csv` draws one file's figure beside it; the tables have none
    from specdec.bench.report.plots import plot_csv
    assert plot_csv(out / KERNELS) == out / "kernels.png" and (out / "kernels.png").stat().st_size > 10_000
    assert plot_csv(out / ENVIRONMENT) is None and plot_csv(out / TESTS) is None


# ---- the driver with stand-in parts (no torch in the parts: a second or two each) ---------------------------
STAND_IN = textwrap.dedent('''
    import importlib.util, sys, time
    from pathlib import Path

    # gpu_runner alone, without the specdec package (whose import brings torch)
    spec = importlib.util.spec_from_file_location("gpu_runner", sys.argv[4])
    runner = importlib.util.module_from_spec(spec)
    sys.modules["gpu_runner"] = runner
    spec.loader.exec_module(runner)
    Config, run_configs = runner.Config, runner.run_configs

    out, name, slow = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "slow"

    def measure(i):
        if slow and i == 3:
            time.sleep(60)  # an ordinary slow configuration: its timeout interrupts it
        if name == "poisoned" and i == 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        with (out / "environment.csv").open("a") as f:
            f.write(f"{name}.{i},measured\\n")

    configs = [Config(f"c{i}", lambda i=i: measure(i), "environment.csv", dict(key=f"error.{name}.{i}"))
               for i in range(1, 5)]

    def error_row(config, message):
        with (out / "environment.csv").open("a") as f:
            f.write(f"{config.fields['key']},{message}\\n")

    run_configs(name, configs, error_row)
''')


def _stand_in_parts(monkeypatch, tmp_path, names, slow=()):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "environment.csv").write_text("key,value\n")
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)

    def part(name):
        return gpu_check.Part(name, 20, 20, 1.0, 1.0, (ENVIRONMENT,), (), False, None,
                              lambda out, name=name: "")

    monkeypatch.setattr(gpu_check, "PARTS", [part(n) for n in names])
    monkeypatch.setattr(gpu_check, "HANG_GRACE_S", 0.5)
    monkeypatch.setattr(gpu_check, "INTERRUPT_GRACE_S", 1.0)
    monkeypatch.setattr(gpu_check, "MIN_PART_S", 1.0)
    monkeypatch.setattr(gpu_check, "part_command", lambda p, out, smoke: [
        sys.executable, str(script), str(out), p.name, "slow" if p.name in slow else "fast", gpu_runner.__file__])
    return tmp_path / "out"


@pytest.mark.parametrize("kind", gpu_runner.FAULT_KINDS)
def test_each_fault_costs_one_configuration(tmp_path, monkeypatch, kind):
    out = _stand_in_parts(monkeypatch, tmp_path, ["a", "b"])
    t0 = time.monotonic()
    results = gpu_check.run_all(out, 30.0, smoke=True, faults=f"a:2:{kind}")
    assert time.monotonic() - t0 < 30.0
    lines = (out / "environment.csv").read_text().splitlines()[1:]
    measured = [x.split(",")[0] for x in lines if x.endswith(",measured")]
    assert measured == ["a.1", "a.3", "a.4", "b.1", "b.2", "b.3", "b.4"]  # every other configuration's row
    errors = [x for x in lines if x.startswith("error.")]
    assert len(errors) == 1 and errors[0].startswith("error.a.2,")
    assert [(r.name, r.status) for r in results] == [("a", "ran"), ("b", "ran")]
    assert bool(results[0].restarts) == (kind != "raise")  # a dead or hung process is replaced
    summary = (out / "SUMMARY.md").read_text()
    assert f"- `a:2:{kind}`: configuration 2 (c2): error" in summary, summary
    assert "| a | ran |" in summary and "| 3 / 1 / 0 |" in summary


def test_from_a_wheel_the_tests_part_says_in_one_line_what_it_skips_and_the_run_goes_on(tmp_path, monkeypatch,
                                                                                        capsys):
    from specdec.gpu_check import compiled_tests
    assert compiled_tests.unavailable() is None  # a checkout: its tests/ beside the package
    why = compiled_tests.unavailable(tmp_path)  # a wheel's site-packages: no tests/
    assert "\n" not in why and "no tests/" in why and f"{len(compiled_tests.GPU_TEST_SUBSET)} " in why
    out = _stand_in_parts(monkeypatch, tmp_path, ["a", "tests", "b"])
    monkeypatch.setattr(gpu_check.PARTS[1], "unavailable", lambda: why)
    results = gpu_check.run_all(out, 30.0, smoke=True)
    assert [(r.name, r.status) for r in results] == [("a", "ran"), ("tests", "skipped"), ("b", "ran")]
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("tests:")] == [
        f"tests: skipped: {why}"]


def test_a_context_poisoning_error_ends_the_process_and_the_part_goes_on_in_a_fresh_one(tmp_path, monkeypatch):
    out = _stand_in_parts(monkeypatch, tmp_path, ["poisoned"])
    results = gpu_check.run_all(out, 30.0, smoke=True)
    lines = (out / "environment.csv").read_text().splitlines()[1:]
    assert lines == ["poisoned.1,measured", "error.poisoned.2,RuntimeError: CUDA error: an illegal memory access was "
                     "encountered", "poisoned.3,measured", "poisoned.4,measured"]  # its row, written before it ended
    assert results[0].status == "ran" and len(results[0].restarts) == 1
    assert "the CUDA context was poisoned" in results[0].restarts[0]
    assert "restarted after c2: the CUDA context was poisoned" in (out / "SUMMARY.md").read_text()


def test_a_slow_configuration_times_out_and_the_deadline_stops_the_part(tmp_path, monkeypatch):
    """Part a's third configuration sleeps past its timeout (the alarm interrupts it: an error row, no restart);
    part b gets what is left and is stopped at the global deadline: what it measured is kept, the summary
    counts the rest as never reached, and the run ends inside its deadline."""
    out = _stand_in_parts(monkeypatch, tmp_path, ["a", "b"], slow=("a",))
    monkeypatch.setattr(gpu_check, "SUMMARY_RESERVE_S", 0.0)
    t0 = time.monotonic()
    results = gpu_check.run_all(out, 40.0, smoke=True)
    assert time.monotonic() - t0 < 40.0
    text = (out / "environment.csv").read_text()
    assert "error.a.3,ConfigTimeout: still running after 1 s" in text and "a.4,measured" in text
    assert results[0].status == "ran" and not results[0].restarts


def test_the_part_deadline_is_kept_inside_a_configuration(tmp_path, monkeypatch):
    out = _stand_in_parts(monkeypatch, tmp_path, ["a"], slow=("a",))
    monkeypatch.setattr(gpu_check.PARTS[0], "config_timeout_s", 60.0)
    monkeypatch.setattr(gpu_check.PARTS[0], "smoke_config_timeout_s", 60.0)
    monkeypatch.setattr(gpu_check, "SUMMARY_RESERVE_S", 0.0)
    t0 = time.monotonic()
    results = gpu_check.run_all(out, 8.0, smoke=True)
    assert time.monotonic() - t0 < 8.0
    text = (out / "environment.csv").read_text()
    assert "a.1,measured" in text and "a.2,measured" in text and "error.a.3,ConfigTimeout: stopped at the part's" \
        in text
    assert results[0].status == "stopped at its deadline"
    summary = (out / "SUMMARY.md").read_text()
    assert "| a | stopped at its deadline |" in summary and "| 2 / 1 / 1 |" in summary


def test_budgets_pass_unused_time_to_later_parts(tmp_path, monkeypatch):
    out = _stand_in_parts(monkeypatch, tmp_path, ["a", "b", "c"])
    results = gpu_check.run_all(out, 100.0, smoke=True)
    # each is owed 20 s: a gets 100 - 40 (less the reserve), b what a left minus c's 20, c the rest
    assert results[0].timeout < results[1].timeout < results[2].timeout
    assert results[1].timeout > 100.0 - gpu_check.SUMMARY_RESERVE_S - results[0].seconds - 20.0 - 1.0


def test_fault_specs_and_commits_are_checked():
    assert [str(f) for f in gpu_runner.parse_faults(FAULTS, gpu_check.PART_NAMES)] == FAULTS.split(",")
    for bad, words in (("e2e:0:raise", "N must be"), ("e2e:2:explode", "unknown kind"), ("gpu:1:raise", "unknown part"),
                       ("e2e:2", "PART:N:KIND")):
        with pytest.raises(ValueError, match=words):
            gpu_runner.parse_faults(bad, gpu_check.PART_NAMES)
    with pytest.raises(SystemExit):
        gpu_check.main(["--out", "/nonexistent", "--inject-faults", "e2e:1:raise"])  # smoke only
    with pytest.raises(SystemExit):
        gpu_check.main(["--out", "/nonexistent", "--smoke", "--commit", "not a sha"])


def test_context_poisoning_errors_are_recognised():
    assert gpu_runner.poisons_context(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert gpu_runner.poisons_context(RuntimeError("wrapped")) is False
    # a failed capture is not sticky by itself: the runner then asks the device (`_context_usable`)
    assert not gpu_runner.poisons_context(RuntimeError("CUDA error: operation not permitted when stream is capturing"))
    assert gpu_runner._context_usable()  # no CUDA here
    try:
        try:
            raise RuntimeError("CUDA error: device-side assert triggered")
        except RuntimeError as e:
            raise ValueError("while capturing") from e
    except ValueError as e:
        assert gpu_runner.poisons_context(e)
    assert not gpu_runner.poisons_context(MemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert gpu_runner.last_line(RuntimeError("line one\n\nthe last line\n")) == "RuntimeError: the last line"


# ---- where graphs and eager first differ ------------------------------------------------------------------
@dataclasses.dataclass
class _Out:
    token_ids: list
    accept_lens: list
    top_logprobs: list | None = None


def test_the_first_difference_names_request_step_tokens_gap_and_padding():
    assert gpu_decode.token_step([2, 3], 0) == 0 and gpu_decode.token_step([2, 3], 2) == 1
    assert gpu_decode.token_step([2, 3], 3) == 2 and gpu_decode.token_step([2, 3], 5) == 2
    same = _Out([1, 2, 3], [2])
    this = [same, _Out([4, 5, 6, 7, 8], [2, 2], None), _Out([9, 9], [1])]
    other = [same, _Out([4, 5, 6, 0, 8], [2, 2], [[]] * 3 + [[(-0.5, 0), (-0.6, 7)]] + [[]]), _Out([9, 9], [1])]
    d = gpu_decode.first_difference(this, other, [1, 2, 4])
    assert (d["first_diff_request"], d["first_diff_token"], d["first_diff_step"]) == (1, 3, 2)
    assert (d["token_this"], d["token_other"]) == (7, 0) and d["logit_gap"] == pytest.approx(0.1)
    assert d["live_batch"] == 1 and d["padded"] is False  # only request 1 ran a second decode step
    d = gpu_decode.first_difference(this[:2] + [_Out([9, 9, 9], [1, 1])], other[:2] + [_Out([9, 9, 9], [1, 1])],
                                    [1, 2, 4])
    assert d["live_batch"] == 2 and d["padded"] is False
    d = gpu_decode.first_difference(this, other, [1, 4])
    assert d["padded"] is False
    three = [_Out([1, 2], [1]), _Out([1, 2, 3], [2]), _Out([5, 6, 7], [2])]
    d = gpu_decode.first_difference(three, three[:2] + [_Out([5, 6, 0], [2])], [1, 2, 4])
    assert d["live_batch"] == 3 and d["padded"] is True  # three requests in the bucket of 4
    assert gpu_decode.first_difference(three, three, [4])["first_diff_request"] == ""


# ---- the goals, read back from a GPU run's files ----------------------------------------------------------
def test_goals_are_met_not_met_or_not_measured_with_their_figures(tmp_path):
    out = tmp_path
    goal = dict(part="logprob_kernels", check="headline", rows=256, vocab_size=151936, dtype="bfloat16",
                top_logprobs_num=0, op="compute_spec_v2_logprobs")
    write_gpu_rows(out, KERNELS, [
        dict(part="environment", op="device_copy", impl="ceiling", bytes=4 << 30, gbps=4000.0),
        dict(goal, impl="fast_kernels", num_splits="auto", frac_of_copy=0.85, gbps=3400.0, splits_used=5,
             programs_per_sm=9.7, speedup_vs_reference=12.0),
        dict(goal, impl="fast", speedup_vs_reference=4.0)])
    e2e = dict(part="e2e", model="random-llama-1.5b", cuda_graphs=True)
    write_gpu_rows(out, E2E, [dict(e2e, label=w, batch_size=1, speedup_vs_reference=3.5) for w in "abc"]
           + [dict(e2e, label="a", batch_size=32, speedup_vs_reference=2.5),
              dict(e2e, label="b", batch_size=32, status="error", error="RuntimeError: capture failed")]
           + [dict(part="graph_replay", label="a", batch_size=5, sampling="greedy", token_identical=True),
              dict(part="graph_replay", label="b", batch_size=5, sampling="greedy", token_identical=False,
                   first_diff_request=2, first_diff_step=3, token_this=7, token_other=9, logit_gap=0.002,
                   padded=True)])
    got = {g.split(" at ")[0].split(" (")[0]: (s, f) for g, s, f in gpu_summary.goals(out, smoke=False)}
    frac, op, b1, b32, same = got.values()
    assert frac[0] == "met" and "85%" in frac[1] and "5 splits" in frac[1]
    assert op[0] == "not met" and "4.0x" in op[1] and "12.0x" in op[1]  # like for like; kernels alone beside
    assert b1[0] == "met" and b32[0] == "not measured" and "not every worker" in b32[1]
    assert same[0] == "not met" and "request 2 step 3, 7 vs 9, logit gap 0.002, padded True" in same[1]
    assert {s for s, _ in [frac, op, b1, b32, same]} <= {"met", "not met", "not measured"}
    (out / KERNELS).unlink()
    assert all(s == "not measured" for _, s, _ in gpu_summary.goals(out, smoke=False)[:2])


# ---- the tests part's pytest plugin -----------------------------------------------------------------------
PLUGIN_TESTS = textwrap.dedent('''
    import time

    def test_quick():
        pass

    def test_slow():
        time.sleep(60)

    def test_after():
        pass
''')


def _pytest_with_plugin(tmp_path: Path, *args: str, **env_vars) -> tuple[list[dict], gpu_runner.PartProgress]:
    (tmp_path / "test_stand_in.py").write_text(PLUGIN_TESTS)
    out = tmp_path / "out"
    out.mkdir()
    progress = tmp_path / "progress"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(ROOT), SPECDEC_GPU_CHECK_OUT=str(out), **{gpu_runner.PROGRESS_ENV: str(progress)},
               **env_vars)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                    "specdec.gpu_check.pytest_plugin", *(args or ["test_stand_in.py"])], cwd=tmp_path, env=env,
                   capture_output=True, text=True, timeout=120)
    rows = _rows(out, TESTS) if (out / TESTS).exists() else []
    return rows, gpu_runner.read_progress(progress)


def test_the_plugin_writes_a_row_per_test_and_times_out_a_slow_test(tmp_path):
    rows, progress = _pytest_with_plugin(tmp_path, **{gpu_runner.CONFIG_TIMEOUT_ENV: "1"})
    assert [(r["nodeid"].split("::")[1], r["index"], r["status"]) for r in rows] == [
        ("test_quick", "1", "passed"), ("test_slow", "2", "failed"), ("test_after", "3", "passed")]
    assert "TestTimeout: still running after the per-test timeout of 1 s" in rows[1]["error"]
    assert progress.done and len(progress.plan) == 3 and not progress.in_flight()


def test_the_plugin_starts_no_test_after_the_deadline(tmp_path):
    rows, progress = _pytest_with_plugin(tmp_path, **{gpu_runner.DEADLINE_ENV: repr(time.time() - 1)})
    assert rows == [] and progress.stopped and not progress.done  # never reached: no rows, counted as such
    assert {status for status, _ in progress.ended.values()} == {"not reached"}


def test_a_session_that_collects_nothing_is_a_setup_error_not_a_run(tmp_path):
    """A moved test named by node id: pytest-xdist collects nothing, prints no error and exits 5 (the H200 run of
    2026-12-04 reported such a part as "ran")."""
    args = ["-n", "2"] if _has_xdist() else []
    rows, progress = _pytest_with_plugin(tmp_path, *args, "test_stand_in.py::test_moved_away")
    assert rows == [] and not progress.done and progress.plan == []
    assert "pytest collected no tests" in progress.setup_error


def _has_xdist() -> bool:
    import importlib.util
    return importlib.util.find_spec("xdist") is not None


def test_every_entry_of_the_gpu_subset_names_tests_that_collect():
    from specdec.gpu_check import compiled_tests as gpu_tests
    for subset in (gpu_tests.GPU_TEST_SUBSET, gpu_tests.SMOKE_TEST_SUBSET):
        assert gpu_tests.missing_tests(subset) == []
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               *subset], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        collected = [line for line in done.stdout.splitlines() if "::" in line]
        for entry in subset:
            assert any(line.startswith(entry) for line in collected), entry
    assert gpu_tests.missing_tests(["tests/workers/test_workers.py::test_cuda_graph_replay_equals_eager",
                                    "tests/no_such_file.py", "tests/ops/test_cuda_shim.py"]) == [
        "tests/workers/test_workers.py::test_cuda_graph_replay_equals_eager", "tests/no_such_file.py"]


def test_without_xgrammar_the_gpu_tests_leave_the_grammar_tests_out(monkeypatch, tmp_path):
    """The GPU image has no xgrammar: the subset's tests that compile grammars are deselected there by node id,
    and only there; each deselected id names a test of the subset."""
    import importlib.util

    from specdec.gpu_check import compiled_tests as gpu_tests
    real = importlib.util.find_spec
    assert "--deselect" not in gpu_tests.tests_command(tmp_path, smoke=False)  # CI installs xgrammar
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "xgrammar" else real(name, *a))
    cmd = gpu_tests.tests_command(tmp_path, smoke=False)
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--deselect"] == gpu_tests.GRAMMAR_TESTS
    monkeypatch.undo()
    assert gpu_tests.missing_tests(gpu_tests.GRAMMAR_TESTS) == []
    files = {test.split("::")[0] for test in gpu_tests.GRAMMAR_TESTS}
    assert files <= set(gpu_tests.GPU_TEST_SUBSET)
