"""`specdec gpu-check --out DIR` (or `python3 -m specdec.gpu_check --out DIR` from a checkout): everything the
fast path needs a GPU to show, in one offline run that fits a short lease of a machine.

It installs nothing and imports the project from the checkout it lives in. Parts run in order, each in its
own process with its own timeout (its budget, or the time left before the global deadline, whichever is
less); a part that fails or times out is recorded and the run goes on; a part whose optional dependency is
missing is skipped with a one-line notice. Every row goes to its CSV under DIR as soon as it is measured,
so a part cut short keeps what it measured. `SUMMARY.md` is written last, whatever happened (a `finally`,
also on SIGTERM / SIGINT): per part ran / failed / timed out / skipped, and its headline figures.

Files under DIR (7 and SUMMARY.md): environment.csv, ceilings.csv, logprob_kernels.csv, tests-junit.xml,
graph_replay.csv, e2e.csv, log.txt (every part's output). The only other write is a scratch directory
for Triton's compile cache and hypothesis' database, removed at exit.

`--smoke` runs every part at tiny sizes on a CPU (Triton's interpreter), writing the same files with the
same columns: what CI runs to keep this command working.

This module is the driver (the parts, their processes and timeouts, SUMMARY.md); the parts themselves and
their row dataclasses are in `specdec.bench.gpu_parts`.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import gpu_parts as parts
from .common import new_run_id

ROOT = parts.ROOT
DEFAULT_DEADLINE_S = 450.0
#: Seconds kept back from the deadline for the summary.
SUMMARY_RESERVE_S = 3.0
#: A part is not started with less time than this left: it could not even import torch.
MIN_PART_S = 4.0


@dataclass
class Part:
    name: str
    budget_s: float
    output: str  # the file it writes under the out dir
    needs: tuple[str, ...]  # importable modules it cannot run without
    needs_cuda: bool
    run: Callable  # run(out_dir, smoke) in the part's own process
    headline: Callable  # headline(out_dir) -> str, read back from its file


PARTS = [
    Part("environment", 5, "environment.csv", (), False, parts.run_environment, parts.environment_headline),
    Part("ceilings", 15, "ceilings.csv", (), True, parts.run_ceilings, parts.ceilings_headline),
    Part("logprob_kernels", 60, "logprob_kernels.csv", ("triton",), True, parts.run_logprob_kernels,
         parts.logprob_headline),
    Part("tests", 90, "tests-junit.xml", ("pytest", "triton"), True, parts.run_tests, parts.tests_headline),
    Part("graph_replay", 60, "graph_replay.csv", ("triton",), True, parts.run_graph_replay, parts.graph_headline),
    Part("e2e", 150, "e2e.csv", ("triton",), True, parts.run_e2e, parts.e2e_headline),
]
LOG_NAME, SUMMARY_NAME = "log.txt", "SUMMARY.md"
#: Every file a run may leave under its out dir.
OUTPUT_FILES = [p.output for p in PARTS] + [LOG_NAME, SUMMARY_NAME]


@dataclass
class PartResult:
    name: str
    status: str  # ran | failed | timed out | interrupted | skipped | not reached
    seconds: float = 0.0
    note: str = ""


# ---- the driver ------------------------------------------------------------------------------------------
def _child_env(scratch: Path, run_id: str) -> dict:
    env = dict(os.environ)
    env[parts.RUN_ID_ENV] = run_id  # one run id in every part's rows
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the checkout
    env.setdefault("TRITON_CACHE_DIR", str(scratch / "triton"))
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(scratch / "hypothesis")
    env["MPLCONFIGDIR"] = str(scratch / "matplotlib")
    return env


def _write_summary(out: Path, results: list[PartResult], started: float, deadline_s: float, smoke: bool) -> None:
    by_name = {r.name: r for r in results}
    lines = [f"# specdec gpu-check{' --smoke' if smoke else ''}", "",
             f"{_dt.datetime.now().isoformat(timespec='seconds')}, {time.monotonic() - started:.0f} s of a "
             f"{deadline_s:.0f} s deadline. Files: {', '.join(OUTPUT_FILES)} "
             "(schemas: `specdec/bench/gpu_parts.py`).", "",
             "| part | status | seconds | headline |", "|---|---|---|---|"]
    for part in PARTS:
        r = by_name.get(part.name, PartResult(part.name, "not reached"))
        try:
            headline = part.headline(out)
        except Exception as e:  # a half-written file must not cost the summary
            headline = f"(unreadable: {type(e).__name__}: {e})"
        text = "; ".join(x for x in (r.note, headline) if x).replace("|", "/").replace("\n", " ")
        lines.append(f"| {part.name} | {r.status} | {r.seconds:.0f} | {text} |")
    (out / SUMMARY_NAME).write_text("\n".join(lines) + "\n")


def run_all(out: Path, deadline_s: float, smoke: bool, only: list[str] | None = None) -> list[PartResult]:
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    results: list[PartResult] = []
    scratch = Path(tempfile.mkdtemp(prefix="specdec-gpu-check-"))
    run_id = new_run_id()
    child = {"proc": None}

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        import torch
        has_cuda = torch.cuda.is_available()
        with (out / LOG_NAME).open("a") as log:
            for part in PARTS:
                if only and part.name not in only:
                    continue
                missing = [m for m in part.needs if importlib.util.find_spec(m) is None]
                left = deadline_s - (time.monotonic() - started) - SUMMARY_RESERVE_S
                note = None
                if missing:
                    note = f"skipped: {', '.join(missing)} not installed"
                elif part.needs_cuda and not smoke and not has_cuda:
                    note = "skipped: no CUDA device (--smoke runs every part on a CPU at tiny sizes)"
                elif left < MIN_PART_S:
                    note = f"skipped: {max(left, 0):.0f} s left before the deadline"
                if note:
                    print(f"{part.name}: {note}", flush=True)
                    results.append(PartResult(part.name, "skipped", 0.0, note.split(": ", 1)[1]))
                    continue
                timeout = min(part.budget_s * (4 if smoke else 1), left)
                cmd = part_command(part, out, smoke)
                log.write(f"\n===== {part.name} (timeout {timeout:.0f} s): {' '.join(cmd)}\n")
                log.flush()
                t0 = time.monotonic()
                proc = child["proc"] = subprocess.Popen(cmd, cwd=ROOT, env=_child_env(scratch, run_id), stdout=log,
                                                        stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    rc = proc.wait(timeout=timeout)
                    status, note = ("ran", "") if rc == 0 else ("failed", f"exit status {rc} (see {LOG_NAME})")
                except subprocess.TimeoutExpired:
                    _kill(proc)
                    status, note = "timed out", f"after {timeout:.0f} s; rows measured before are kept"
                except BaseException:  # SIGTERM / SIGINT to the run: the part in flight is recorded, then stop
                    results.append(PartResult(part.name, "interrupted", time.monotonic() - t0,
                                              "the run was stopped; rows measured before are kept"))
                    raise
                child["proc"] = None
                seconds = time.monotonic() - t0
                log.write(f"===== {part.name}: {status} in {seconds:.1f} s\n")
                log.flush()
                print(f"{part.name}: {status} in {seconds:.1f} s{(' - ' + note) if note else ''}", flush=True)
                results.append(PartResult(part.name, status, seconds, note))
    finally:
        if child["proc"] is not None:
            _kill(child["proc"])
        for s, handler in previous.items():
            signal.signal(s, handler)
        shutil.rmtree(scratch, ignore_errors=True)
        _write_summary(out, results, started, deadline_s, smoke)
    return results


def part_command(part: Part, out: Path, smoke: bool) -> list[str]:
    """The command line that runs one part in its own process."""
    return [sys.executable, "-m", "specdec.bench.gpu_check", "--part", part.name, "--out", str(out)] + \
        (["--smoke"] if smoke else [])


def _kill(proc: subprocess.Popen) -> None:
    """The part's whole process group (pytest-xdist workers included)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _part_names(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",")]
    bad = [n for n in names if n not in {p.name for p in PARTS}]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown part(s) {bad}; expected a comma-separated subset of "
                                         f"{','.join(p.name for p in PARTS)}")
    return names


def build_parser(prog="specdec gpu-check") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Measure and check the fast path on this machine's GPU in one offline run: environment, "
                    "copy and matmul ceilings, the fused logprob kernels, the fast-path tests compiled, "
                    "CUDA-graph replay against eager, and end to end on a random 1.5B Llama. Installs "
                    "nothing; writes only under --out (7 files and SUMMARY.md).")
    parser.add_argument("--out", default=None, help="output directory (default: $OUT)")
    parser.add_argument("--deadline", type=_positive_seconds, default=DEFAULT_DEADLINE_S,
                        help="global deadline in seconds; each part gets its budget or the time left")
    parser.add_argument("--smoke", action="store_true",
                        help="every part at tiny sizes on a CPU (Triton's interpreter): the same files and columns")
    parser.add_argument("--parts", type=_part_names, default=None,
                        help=f"run only these parts (comma-separated, of {','.join(p.name for p in PARTS)})")
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)  # one part, in its own process
    return parser


def main(argv=None, prog="specdec gpu-check") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    out = args.out or os.environ.get("OUT")
    if not out:
        parser.error("give --out DIR or set OUT")
    out = Path(out).resolve()
    if args.part is not None:
        part = {p.name: p for p in PARTS}.get(args.part)
        if part is None:
            parser.error(f"unknown part {args.part!r}")
        if args.smoke:
            import torch
            torch.set_num_threads(1)
        part.run(out, args.smoke)
        return 0
    results = run_all(out, args.deadline, args.smoke, args.parts)
    print(f"wrote {out / SUMMARY_NAME}")
    return 0 if all(r.status in ("ran", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(prog="python3 -m specdec.gpu_check"))
