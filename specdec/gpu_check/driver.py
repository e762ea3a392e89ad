"""`specdec gpu-check --out DIR` (or `python3 -m specdec.gpu_check --out DIR` from a checkout): everything the
fast path needs a GPU to show, in one offline run with a deadline that loses nothing whatever breaks on the
way.

It installs nothing and imports the project from the checkout it lives in. Parts run in order, each in its own
process (`PARTS`: environment and ceilings, the fused logprob kernels, end to end, graph replay, every op of a
decode step, the compiled tests, the other engines and a profiled step), each a list of configurations tried one at
a time (`runner`; the engines part starts a process per configuration): a configuration that fails is a row
with its error and the next one runs; a process that dies, hangs past a configuration's time or poisons its CUDA
context is started again from the next configuration, and SUMMARY.md says so. Each part gets its budget, plus
whatever the parts before it left unused, less what the parts after it are owed; a part stops itself at its
deadline (pytest included), with SIGINT and then SIGKILL as the backstop. The default deadline (540 s) leaves 60 s
of a 600 s command for copying files back. Rows go to their CSV as they are measured; `SUMMARY.md` is written last
from a `finally` (also on SIGTERM / SIGINT). Files (at most 6, flat): `rows.OUTPUT_FILES`. The only other write
is a scratch directory (Triton's and Inductor's caches, hypothesis' database, the parts' progress files), removed
at exit.

`--smoke` runs every part at tiny sizes on a CPU (Triton's interpreter), writing the same files with the same
columns: what CI runs to keep this command working. `--inject-faults PART:N:raise|hang|abort,...` (smoke only)
breaks the N-th configuration of PART on purpose, to show the above on a CPU.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import compiled_tests, decode, engines, ops, parts, runner, summary
from ..bench.common import COMMIT_ENV, new_run_id
from .rows import (E2E, ENVIRONMENT, KERNELS, LOG, OUTPUT_FILES, RUN_ID_ENV, SUMMARY, TESTS, driver_prefix,
                       write_error_row)
from ..cli_args import HelpFormatter

ROOT = parts.ROOT
#: A 600 s job (a batch queue's or a remote runner's limit) less 60 s for copying the files back.
DEFAULT_DEADLINE_S = 540.0
#: Seconds kept back from the deadline for the summary and the scratch directory's removal.
SUMMARY_RESERVE_S = 5.0
#: A part is not started (or restarted) with less time than this left: it could not even import torch.
MIN_PART_S = 4.0
#: After SIGINT at a part's deadline, the seconds it has to write what it has before SIGKILL.
INTERRUPT_GRACE_S = 5.0
#: A configuration in flight this long past its timeout is hung in code no signal reaches: SIGKILL.
HANG_GRACE_S = 5.0
POLL_S = 0.25


@dataclass
class Part:
    name: str
    budget_s: float  # on a GPU: the H200 run of 2026-12-04 with a margin (docs/design.md)
    smoke_budget_s: float  # smoke mode on a CPU, from measurement
    config_timeout_s: float  # one configuration (one test) on a GPU
    smoke_config_timeout_s: float
    files: tuple[str, ...]  # the files it writes under the out dir
    needs: tuple[str, ...]  # importable modules it cannot run without
    needs_cuda: bool
    run: Callable  # run(out_dir, smoke) in the part's own process
    headline: Callable  # headline(out_dir) -> str, read back from its files
    unavailable: Callable[[], str | None] | None = None  # why it cannot run here (one line), else None

    def budget(self, smoke: bool) -> float:
        return self.smoke_budget_s if smoke else self.budget_s

    def config_timeout(self, smoke: bool) -> float:
        return self.smoke_config_timeout_s if smoke else self.config_timeout_s


#: Headline first: the goal parts (logprob kernels, end to end, graph identity) before the op sweep and the tests
#: (which find Triton's cache warm from the parts before), and the other engines last: their compiles are the run's
#: least predictable seconds, so they take what every other part left. Their budget is an estimate until a GPU run
#: measures it: one compile of the 1.5B model's decode forward (transformers' or Inductor's, cold caches, a 16-core
#: host) per configuration with its process, model and timed generations, and the profile: 200 s for the five
#: configurations, 120 s the most one may take; what the H200 run of 2026-12-04 used of its deadline is in
#: results/gpu-check-20261204/SUMMARY.md.
PARTS = [
    Part("environment", 20, 20, 20, 20, (ENVIRONMENT, KERNELS), (), False, parts.run_environment,
         summary.environment_headline),
    Part("logprob_kernels", 45, 25, 40, 30, (KERNELS,), ("triton",), True, parts.run_logprob_kernels,
         summary.logprob_headline),
    Part("e2e", 245, 30, 60, 40, (E2E,), ("triton",), True, decode.run_e2e, summary.e2e_headline),
    Part("graph_replay", 40, 20, 30, 20, (E2E,), ("triton",), True, decode.run_graph_replay,
         summary.graph_headline),
    Part("decode_ops", 30, 25, 30, 30, (KERNELS,), ("triton",), True, ops.run_decode_ops,
         summary.ops_headline),
    Part("tests", 140, 30, 90, 15, (TESTS,), ("pytest", "triton"), True, compiled_tests.run_tests,
         summary.tests_headline, compiled_tests.unavailable),
    Part("engines", 200, 90, 120, 60, (E2E, KERNELS), ("triton",), True, engines.run_engines,
         summary.engines_headline),
]
PART_NAMES = [p.name for p in PARTS]


@dataclass
class PartResult:
    name: str
    status: str  # ran | stopped at its deadline | timed out | failed | interrupted | skipped | not reached
    seconds: float = 0.0
    timeout: float = 0.0
    note: str = ""
    restarts: list[str] = field(default_factory=list)
    progress: runner.PartProgress | None = None


# ---- one part, restarted as often as it needs --------------------------------------------------------------
class _Run:
    """The state of one driver run: the out dir, scratch, log, run id, and the part process in flight."""

    def __init__(self, out: Path, smoke: bool, faults: str, commit: str | None):
        self.out, self.smoke, self.faults, self.commit = out, smoke, faults, commit
        self.scratch = Path(tempfile.mkdtemp(prefix="specdec-gpu-check-"))
        self.run_id = new_run_id()
        self.proc: subprocess.Popen | None = None

    def env(self, part: Part, deadline: float) -> dict:
        env = dict(os.environ)
        env[RUN_ID_ENV] = self.run_id  # one run id in every part's rows
        if self.commit:
            env[COMMIT_ENV] = self.commit
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                           if p])
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the checkout
        env.setdefault("TRITON_CACHE_DIR", str(self.scratch / "triton"))
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(self.scratch / "inductor"))  # else under $TMPDIR, left behind
        env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(self.scratch / "hypothesis")
        env["MPLCONFIGDIR"] = str(self.scratch / "matplotlib")
        env[runner.PROGRESS_ENV] = str(self.progress_path(part))
        env[runner.SKIP_ENV] = str(self.scratch / f"{part.name}.skip")
        env[runner.DEADLINE_ENV] = repr(deadline)
        env[runner.CONFIG_TIMEOUT_ENV] = repr(part.config_timeout(self.smoke))
        env[runner.FAULTS_ENV] = self.faults
        return env

    def progress_path(self, part: Part) -> Path:
        return self.scratch / f"{part.name}.progress"

    def run_part(self, part: Part, timeout: float, log) -> PartResult:
        t0 = time.monotonic()
        deadline = time.time() + timeout  # the driver's SIGINT
        child_deadline = deadline - INTERRUPT_GRACE_S  # the part's own: nothing starts after it
        result = PartResult(part.name, "", timeout=timeout)
        while True:
            cmd = part_command(part, self.out, self.smoke)
            log.write(f"\n===== {part.name} ({deadline - time.time():.0f} s left of {timeout:.0f} s): "
                      f"{' '.join(cmd)}\n")
            log.flush()
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env(part, child_deadline), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            outcome, rc, hung = self._supervise(part, deadline)
            self.proc = None
            progress = runner.read_progress(self.progress_path(part))
            result.progress = progress
            if progress.done and outcome == "exited":
                result.status = "ran"
                break
            if outcome == "deadline" or progress.stopped:
                result.status = "stopped at its deadline"
                result.note = "rows measured before are kept; the rest never reached"
                if outcome == "deadline":
                    result.status = "timed out"
                    result.note = f"SIGINT at its deadline ({timeout:.0f} s); rows measured before are kept"
                break
            culprit, reason = self._culprit(progress, rc, hung, part)
            if culprit is None:
                result.status = "failed"
                result.note = (f"exit status {rc} outside any configuration"
                               + (f": {progress.setup_error}" if progress.setup_error else f" (see {LOG})"))
                break
            result.restarts.append(f"{culprit}: {reason}")
            left = deadline - time.time()
            if left < MIN_PART_S + INTERRUPT_GRACE_S:
                result.status = "failed"
                result.note = f"{culprit}: {reason}; {max(left, 0):.0f} s left, not restarted"
                break
            done = runner.read_progress(self.progress_path(part)).ended
            (self.scratch / f"{part.name}.skip").write_text("\n".join(done) + "\n")
            log.write(f"===== {part.name}: {reason} in {culprit}; restarting in a fresh process from the next "
                      "configuration\n")
            log.flush()
            print(f"{part.name}: {reason} in {culprit}; restarting from the next configuration", flush=True)
        result.seconds = time.monotonic() - t0
        return result

    def _supervise(self, part: Part, deadline: float) -> tuple[str, int | None, str | None]:
        """Wait for the part's process: ("exited", rc, None), ("deadline", rc, None) after SIGINT then SIGKILL,
        or ("hung", rc, key) when a configuration stayed in flight past its timeout and the grace."""
        proc = self.proc
        limit = part.config_timeout(self.smoke) + HANG_GRACE_S
        last_read = 0.0
        while True:
            try:
                return "exited", proc.wait(timeout=POLL_S), None
            except subprocess.TimeoutExpired:
                pass
            now = time.time()
            if now >= deadline:
                _signal_group(proc, signal.SIGINT)
                try:
                    rc = proc.wait(timeout=INTERRUPT_GRACE_S)
                except subprocess.TimeoutExpired:
                    rc = _kill(proc)
                return "deadline", rc, None
            if now - last_read >= 1.0:
                last_read = now
                progress = runner.read_progress(self.progress_path(part))
                flight = progress.in_flight()
                if flight and now - progress.started[flight[0]] > limit:
                    return "hung", _kill(proc), flight[0]

    def _culprit(self, progress, rc, hung, part: Part) -> tuple[str | None, str]:
        """The configuration that ended the process, and why; its error row is written here when the part
        could not write it."""
        if hung is not None:
            culprit, reason = hung, f"no progress for {part.config_timeout(self.smoke) + HANG_GRACE_S:.0f} s: killed"
        elif progress.in_flight():
            culprit, reason = progress.in_flight()[0], f"the process died ({runner.describe_exit(rc)})"
        elif rc == runner.POISONED_EXIT:
            ended = [k for k in progress.ended if progress.ended[k][0] == "error"]
            if not ended:
                return None, ""
            culprit = ended[-1]
            return culprit, f"the CUDA context was poisoned ({progress.ended[culprit][1]})"
        else:
            return None, ""
        entry = progress.by_key().get(culprit)
        if entry is not None:
            try:
                write_error_row(self.out, entry.file, driver_prefix(self.out, self.run_id), entry.fields, reason)
            except Exception as e:  # the summary still names it
                print(f"could not write the error row of {culprit}: {e}", flush=True)
        runner.Progress(str(self.progress_path(part))).write("end", key=culprit, status="error", error=reason)
        return culprit, reason


def _signal_group(proc: subprocess.Popen, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill(proc: subprocess.Popen) -> int:
    """The part's whole process group (pytest-xdist workers included)."""
    _signal_group(proc, signal.SIGKILL)
    return proc.wait()


# ---- the run -----------------------------------------------------------------------------------------------
def run_all(out: Path, deadline_s: float, smoke: bool, only: list[str] | None = None, faults: str = "",
            commit: str | None = None) -> list[PartResult]:
    started = time.monotonic()
    end_at = time.time() + deadline_s - SUMMARY_RESERVE_S
    out.mkdir(parents=True, exist_ok=True)
    results: list[PartResult] = []
    state = _Run(out, smoke, faults, commit)

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        has_cuda = torch.cuda.is_available()
        wanted = [p for p in PARTS if not only or p.name in only]
        reasons = {}
        for part in wanted:
            missing = [m for m in part.needs if importlib.util.find_spec(m) is None]
            if missing:
                reasons[part.name] = f"{', '.join(missing)} not installed"
            elif part.needs_cuda and not smoke and not has_cuda:
                reasons[part.name] = "no CUDA device (--smoke runs every part on a CPU at tiny sizes)"
            elif part.unavailable is not None and part.unavailable():
                reasons[part.name] = part.unavailable()
        with (out / LOG).open("a") as log:
            for k, part in enumerate(wanted):
                left = end_at - time.time()
                note = reasons.get(part.name) or (f"{max(left, 0):.0f} s left before the deadline"
                                                  if left < MIN_PART_S + INTERRUPT_GRACE_S else None)
                if note:
                    print(f"{part.name}: skipped: {note}", flush=True)
                    results.append(PartResult(part.name, "skipped", note=note))
                    continue
                # its budget, and what the parts before left unused, but not what the parts after are owed
                later = sum(p.budget(smoke) for p in wanted[k + 1:] if p.name not in reasons)
                timeout = max(min(part.budget(smoke), left), left - later)
                try:
                    result = state.run_part(part, timeout, log)
                except BaseException:  # SIGTERM / SIGINT to the run: the part in flight is recorded, then stop
                    if state.proc is not None:
                        _kill(state.proc)
                    results.append(PartResult(part.name, "interrupted", note="the run was stopped; rows measured "
                                              "before are kept", progress=runner.read_progress(
                                                  state.progress_path(part))))
                    raise
                log.write(f"===== {part.name}: {result.status} in {result.seconds:.1f} s\n")
                log.flush()
                print(f"{part.name}: {result.status} in {result.seconds:.1f} s"
                      + (f" - {result.note}" if result.note else "")
                      + (f" ({len(result.restarts)} restarts)" if result.restarts else ""), flush=True)
                results.append(result)
    finally:
        if state.proc is not None:
            _kill(state.proc)
        for s, handler in previous.items():
            signal.signal(s, handler)
        shutil.rmtree(state.scratch, ignore_errors=True)
        write_summary(out, results, started, deadline_s, smoke, faults)
    return results


def part_command(part: Part, out: Path, smoke: bool) -> list[str]:
    """The command line that runs one part in its own process."""
    return [sys.executable, "-m", "specdec.gpu_check", "--part", part.name, "--out", str(out)] + \
        (["--smoke"] if smoke else [])


# ---- SUMMARY.md ------------------------------------------------------------------------------------------
def _counts(progress: runner.PartProgress | None) -> str:
    if progress is None or not progress.plan:
        return ""
    keys = [e.key for e in progress.plan]
    ok = sum(progress.ended.get(k, ("",))[0] == "ok" for k in keys)
    failed = sum(progress.ended.get(k, ("",))[0] == "error" for k in keys)
    return f"{ok} / {failed} / {len(keys) - ok - failed}"


def write_summary(out: Path, results: list[PartResult], started: float, deadline_s: float, smoke: bool,
                  faults: str = "") -> None:
    by_name = {r.name: r for r in results}
    lines = [f"# specdec gpu-check{' --smoke' if smoke else ''}", "",
             f"{_dt.datetime.now().isoformat(timespec='seconds')}, {time.monotonic() - started:.0f} s of a "
             f"{deadline_s:.0f} s deadline. Files: {', '.join(OUTPUT_FILES)} (schemas: `specdec/gpu_check/rows.py`, "
             "results/README.md).", "", "## Goals", "", "| goal | status | figure |", "|---|---|---|"]
    try:
        for goal, status, figure in summary.goals(out, smoke):
            lines.append(f"| {goal} | **{status}** | {_cell(figure)} |")
    except Exception as e:  # a half-written file must not cost the summary
        lines.append(f"| (goals unreadable) | not measured | {type(e).__name__}: {_cell(str(e))} |")
    lines += ["", "## Parts", "",
              "Configurations: measured / failed / never reached (failed: a row with status `error`).", "",
              "| part | status | seconds (of) | configurations | restarts and notes | headline |",
              "|---|---|---|---|---|---|"]
    for part in PARTS:
        r = by_name.get(part.name, PartResult(part.name, "not reached"))
        try:
            headline = part.headline(out)
        except Exception as e:
            headline = f"(unreadable: {type(e).__name__}: {e})"
        notes = "; ".join(x for x in [r.note] + [f"restarted after {x}" for x in r.restarts] if x)
        lines.append(f"| {part.name} | {r.status} | {r.seconds:.0f} ({r.timeout:.0f}) | {_counts(r.progress)} | "
                     f"{_cell(notes)} | {_cell(headline)} |")
    for section in (lambda: summary.roofline_section(out, smoke), lambda: summary.profile_section(out)):
        try:
            more = section()
        except Exception as e:  # as the goals: a half-written file costs its own section only
            more = [f"(a section is unreadable: {type(e).__name__}: {_cell(str(e))})"]
        if more:
            lines += [""] + more
    injected = runner.parse_faults(faults)
    if injected:
        lines += ["", "## Injected faults", ""]
        for fault in injected:
            lines.append(f"- `{fault}`: {_cell(_fault_outcome(fault, by_name.get(fault.part)))}")
    (out / SUMMARY).write_text("\n".join(lines) + "\n")


def _fault_outcome(fault: runner.Fault, result: PartResult | None) -> str:
    if result is None or result.progress is None or not result.progress.plan:
        return "its part did not run"
    plan = result.progress.plan
    if fault.index > len(plan):
        return f"the part has {len(plan)} configurations: nothing injected"
    key = plan[fault.index - 1].key
    status, error = result.progress.ended.get(key, ("never reached", ""))
    restarted = any(x.startswith(f"{key}:") for x in result.restarts)
    return (f"configuration {fault.index} ({key}): {status}{' - ' + error if error else ''}"
            + ("; the part was restarted from the next configuration" if restarted else ""))


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


# ---- the command line ------------------------------------------------------------------------------------
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
    bad = [n for n in names if n not in PART_NAMES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown part(s) {bad}; expected a comma-separated subset of "
                                         f"{','.join(PART_NAMES)}")
    return names


def _faults(text: str) -> str:
    try:
        runner.parse_faults(text, PART_NAMES)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _commit(text: str) -> str:
    if not re.fullmatch(r"[0-9a-fA-F]{7,40}(-dirty)?", text):
        raise argparse.ArgumentTypeError(f"expected a commit SHA (7 to 40 hex digits), got {text!r}")
    return text


def build_parser(prog="specdec gpu-check") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="Measure and check the fast path on this machine's GPU in one offline run: environment and "
                    "ceilings (copy, read, matmul), the fused logprob kernels, end to end on a random 1.5B Llama "
                    "against the read ceiling, CUDA-graph replay against eager, every op of a decode step, the "
                    "fast-path tests compiled, then the same model on transformers (static cache, compiled) and on "
                    "the reference path under Inductor, and a profiled decode step. Installs nothing; writes only "
                    f"under --out (at most {len(OUTPUT_FILES)} files).")
    parser.add_argument("--out", default=None, help="output directory (default: $OUT)")
    parser.add_argument("--deadline", type=_positive_seconds, default=DEFAULT_DEADLINE_S,
                        help="global deadline in seconds (the default leaves 60 s of a 600 s command)")
    parser.add_argument("--smoke", action="store_true",
                        help="every part at tiny sizes on a CPU (Triton's interpreter): the same files and columns")
    parser.add_argument("--parts", type=_part_names, default=None,
                        help=f"run only these parts (comma-separated, of {','.join(PART_NAMES)})")
    parser.add_argument("--commit", type=_commit, default=None,
                        help=f"the commit the rows record (default: ${COMMIT_ENV}, else git describe, else unknown)")
    parser.add_argument("--inject-faults", type=_faults, default="", metavar="SPEC",
                        help="smoke only: PART:N:raise|hang|abort,... breaks the N-th configuration of PART")
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)  # one part, in its own process
    return parser


def main(argv=None, prog="specdec gpu-check") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    out = args.out or os.environ.get("OUT")
    if not out:
        parser.error("give --out DIR or set OUT")
    if args.inject_faults and not args.smoke:
        parser.error("--inject-faults is for --smoke runs only")
    out = Path(out).resolve()
    if args.part is not None:
        part = {p.name: p for p in PARTS}.get(args.part)
        if part is None:
            parser.error(f"unknown part {args.part!r}")
        if args.smoke:
            torch.set_num_threads(1)
        part.run(out, args.smoke)
        return 0
    commit = args.commit or os.environ.get(COMMIT_ENV) or None
    results = run_all(out, args.deadline, args.smoke, args.parts, args.inject_faults, commit)
    print(f"wrote {out / SUMMARY}")
    return 0 if all(r.status in ("ran", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(prog="python3 -m specdec.gpu_check"))
