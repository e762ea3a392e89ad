"""`specdec gpu-check`: the smoke run writes every file with its schema's columns and a SUMMARY.md, never calls
pip and never writes outside its out directory; a part that fails or outlives its budget is recorded and the
run goes on to the next."""
from __future__ import annotations

import csv
import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import specdec.bench.gpu_check as gpu_check
from specdec.bench import gpu_parts

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = {"environment.csv": gpu_parts.EnvironmentRow, "ceilings.csv": gpu_parts.CeilingRow,
           "logprob_kernels.csv": gpu_parts.LogprobKernelRow, "graph_replay.csv": gpu_parts.GraphReplayRow,
           "e2e.csv": gpu_parts.GpuE2ERow}

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
    """The checkout's untracked and ignored paths, bytecode aside (another process may compile the tree)."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--ignored"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return {line[3:] for line in out.splitlines() if line[:2] in ("??", "!!")
            and "__pycache__" not in line and not line.endswith(".pyc")}


def test_smoke_run_writes_every_file_and_nothing_else(tmp_path):
    out, home, tmp, bin_dir, guard = (tmp_path / n for n in ("out", "home", "tmp", "bin", "guard"))
    for d in (home, tmp, bin_dir, guard):
        d.mkdir()
    marker = tmp_path / "pip-called"
    for name in ("pip", "pip3"):
        fake = bin_dir / name
        fake.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {marker}\necho 'gpu-check must not call pip' >&2\nexit 97\n")
        fake.chmod(0o755)
    (guard / "sitecustomize.py").write_text(PIP_GUARD)
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "PYTHONPATH")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", HOME=str(home), TMPDIR=str(tmp), PIP_MARKER=str(marker),
               PYTHONPATH=f"{guard}{os.pathsep}{ROOT}", OUT=str(out), PYTHONDONTWRITEBYTECODE="1")
    before = _untracked_and_ignored()
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    run = subprocess.run([sys.executable, "-m", "specdec.gpu_check", "--smoke"], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert not marker.exists(), marker.read_text()

    assert sorted(p.name for p in out.iterdir()) == sorted(gpu_check.OUTPUT_FILES)
    assert all(p.is_file() for p in out.iterdir())
    for name, row_type in SCHEMAS.items():
        with (out / name).open(newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == [f.name for f in dataclasses.fields(row_type)], name
        assert len(rows) > 1 and all(len(r) == len(rows[0]) for r in rows), name
    run_ids = {r["run_id"] for name in SCHEMAS if name != "environment.csv"
               for r in csv.DictReader((out / name).open())}
    env = {r["key"]: r["value"] for r in csv.DictReader((out / "environment.csv").open())}
    assert run_ids == {env["run_id"]} and env["suite"] == "gpu-check"  # one run, every part's rows
    kernels = list(csv.DictReader((out / "logprob_kernels.csv").open()))
    assert {r["impl"] for r in kernels} == {"reference", "fast", "fast_kernels"}
    assert all(r["within_tolerance"] == "True" for r in kernels)
    assert all(r["token_identical"] == "True" for r in csv.DictReader((out / "graph_replay.csv").open()))
    assert "<testsuite" in (out / "tests-junit.xml").read_text()
    summary = (out / "SUMMARY.md").read_text()
    for part in gpu_check.PARTS:
        assert f"| {part.name} | ran |" in summary, summary
    assert "3 passed" in summary and "token-identical in" in summary

    assert list(home.iterdir()) == [] and list(tmp.iterdir()) == [] and list(cwd.iterdir()) == []
    assert _untracked_and_ignored() == before

    # notebook 02 finds such a directory under results/ and draws its GPU figures from it
    from specdec.bench.plots import gpu_check_dirs, plot_gpu_check_e2e, plot_gpu_check_kernels
    assert gpu_check_dirs(tmp_path) == [out]
    for plot in (plot_gpu_check_kernels, plot_gpu_check_e2e):
        assert plot(out, tmp_path / f"{plot.__name__}.png").stat().st_size > 10_000


def test_a_failing_or_slow_part_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    """Stand-in parts: one writes its file, one exits 3, one sleeps until the global deadline cuts it (its budget
    is larger than the time left), and the last finds no time left. The summary says so for each, with the
    first part's headline, and the run returns normally."""
    def part(name):
        return gpu_check.Part(name, 30, f"{name}.csv", (), False, None,
                              lambda out, name=name: (out / f"{name}.csv").read_text().strip()
                              if (out / f"{name}.csv").exists() else "")

    commands = {"fine": "import sys; open(sys.argv[1] + '/fine.csv', 'w').write('measured 42')",
                "broken": "raise SystemExit(3)", "slow": "import time; time.sleep(60)", "late": "pass"}
    monkeypatch.setattr(gpu_check, "PARTS", [part(n) for n in commands])
    monkeypatch.setattr(gpu_check, "SUMMARY_RESERVE_S", 0.0)
    monkeypatch.setattr(gpu_check, "MIN_PART_S", 1.0)
    monkeypatch.setattr(gpu_check, "part_command",
                        lambda p, out, smoke: [sys.executable, "-c", commands[p.name], str(out)])
    results = gpu_check.run_all(tmp_path, 5.0, smoke=False)
    assert [(r.name, r.status) for r in results] == [("fine", "ran"), ("broken", "failed"), ("slow", "timed out"),
                                                     ("late", "skipped")]
    assert sum(r.seconds for r in results) < 6.0
    summary = (tmp_path / "SUMMARY.md").read_text()
    assert "| fine | ran |" in summary and "measured 42" in summary
    assert "| broken | failed |" in summary and "exit status 3" in summary
    assert "| slow | timed out |" in summary
    assert "| late | skipped |" in summary and "before the deadline" in summary
    assert "===== slow: timed out" in (tmp_path / "log.txt").read_text()
