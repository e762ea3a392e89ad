"""The pytest plugin of gpu-check's `tests` part (`pytest -p specdec.gpu_check.pytest_plugin`): what the
part needs from pytest to lose nothing whatever happens.

- One tests.csv row per test as it finishes (pytest's junit XML is written only when the session ends, so a
  killed session would leave none), from the controlling process only (pytest-xdist's workers report to it).
- The part's progress file (`runner`): the plan (the tests in collection order), each test's start and
  end, so that the driver can name a test that hung or killed its process, write its row, and start pytest
  again without it and without the tests already done (the skip file).
- A deadline inside pytest: a test that would start after the part's deadline is skipped at once ("never
  reached"), so the session ends in time and pytest's own summary still runs; the driver's SIGINT, then
  SIGKILL, is only the backstop.
- A per-test timeout without pytest-timeout (SIGALRM in the process that runs the test), and the
  `--inject-faults` of the part.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from .runner import (CONFIG_TIMEOUT_ENV, DEADLINE_ENV, FAULTS_ENV, PROGRESS_ENV, SKIP_ENV, Progress, inject,
                         parse_faults, read_progress)
from .rows import TESTS, writer, RUN_ID_ENV, TestRow
from ..bench.common import Run

OUT_ENV = "SPECDEC_GPU_CHECK_OUT"
DEADLINE_SKIP = "gpu-check: the tests part's deadline passed before this test started"
_state: dict = {}


class TestTimeout(Exception):
    """A test ran past the per-test timeout."""


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config):
    _state.update(config=config, progress=Progress(os.environ.get(PROGRESS_ENV)), index={}, outcome={},
                  written=set(), started=set(), plan=None, deadline=float(os.environ.get(DEADLINE_ENV, "inf")),
                  timeout=float(os.environ.get(CONFIG_TIMEOUT_ENV, "inf")),
                  faults={f.index: f for f in parse_faults(os.environ.get(FAULTS_ENV)) if f.part == "tests"})


# ---- the plan, the skip file -----------------------------------------------------------------------------
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Number the tests in collection order (the first session's numbering, kept across restarts), then drop
    those the skip file lists (done, or fatal to the process before)."""
    _set_plan([item.nodeid for item in items])
    skip_file = os.environ.get(SKIP_ENV)
    skip = set(Path(skip_file).read_text().splitlines()) if skip_file and Path(skip_file).is_file() else set()
    if skip:
        kept = [item for item in items if item.nodeid not in skip]
        dropped = [item for item in items if item.nodeid in skip]
        items[:] = kept
        if dropped:
            config.hook.pytest_deselected(items=dropped)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """The controller under pytest-xdist collects nothing itself: its plan is a worker's collection."""
    _set_plan(list(ids))


def _set_plan(nodeids: list[str]) -> None:
    if _state.get("plan") is not None:
        return
    progress_file = os.environ.get(PROGRESS_ENV)
    earlier = read_progress(progress_file).plan if progress_file else []
    plan = [e.key for e in earlier] or nodeids
    plan += [n for n in nodeids if n not in set(plan)]
    _state["plan"] = plan
    _state["index"] = {n: i for i, n in enumerate(plan, 1)}
    if not earlier and not _is_worker(_state["config"]):
        _state["progress"].write("plan", configs=[dict(key=n, file="tests.csv", fields=dict(
            nodeid=n, index=i, collected=len(plan)), headline=False) for i, n in enumerate(plan, 1)])


# ---- in the process that runs the test: the deadline, the timeout, the faults ---------------------------
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    if time.time() > _state["deadline"]:
        pytest.skip(DEADLINE_SKIP)
    with _alarm():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _alarm():
        fault = _state["faults"].get(_state["index"].get(item.nodeid))
        if fault is not None:
            inject(fault)
        yield


class _alarm:
    """SIGALRM after the per-test timeout, in the main thread only (where Python runs signal handlers)."""

    def __enter__(self):
        self.armed = threading.current_thread() is threading.main_thread() and _state["timeout"] < float("inf")
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, _state["timeout"])

    def _fire(self, signum, frame):
        raise TestTimeout(f"still running after the per-test timeout of {_state['timeout']:.0f} s")

    def __exit__(self, *exc):
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
        return False


# ---- in the controlling process: progress and rows -------------------------------------------------------
def pytest_runtest_logstart(nodeid, location):
    if _is_worker(_state["config"]):
        return
    _state["started"].add(nodeid)
    _state["progress"].write("start", key=nodeid)


def pytest_runtest_logreport(report):
    if _is_worker(_state["config"]):
        return
    status, message = _classify(report)
    seconds = getattr(report, "duration", 0.0) or 0.0
    previous = _state["outcome"].get(report.nodeid)
    rank = ("passed", "skipped", "xfailed", "xpassed", "failed", "error")
    if previous is None or rank.index(status) > rank.index(previous[0]) or (status == previous[0] and message):
        _state["outcome"][report.nodeid] = (status, message, seconds + (previous[2] if previous else 0.0))
    elif previous is not None:
        _state["outcome"][report.nodeid] = (previous[0], previous[1], previous[2] + seconds)
    if report.when not in ("setup", "call", "teardown"):  # pytest-xdist's report for a crashed worker
        _finish(report.nodeid)


def pytest_runtest_logfinish(nodeid, location):
    if not _is_worker(_state["config"]):
        _finish(nodeid)


def _classify(report) -> tuple[str, str]:
    if hasattr(report, "wasxfail"):
        return ("xfailed" if report.skipped else "xpassed"), ""
    if report.passed:
        return "passed", ""
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or "")
        return "skipped", reason.removeprefix("Skipped: ")
    text = getattr(report, "longreprtext", "") or str(report.longrepr or "")
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    # pytest puts "E   <exception line>" lines in the representation: the last one is the error
    errors = [x[1:].strip() for x in lines if x.startswith("E ")]
    message = errors[-1] if errors else (lines[-1] if lines else "")
    return ("failed" if report.when == "call" else "error"), message


def _finish(nodeid: str) -> None:
    if nodeid in _state["written"] or nodeid not in _state["outcome"]:
        return
    _state["written"].add(nodeid)
    status, message, seconds = _state["outcome"][nodeid]
    deadline = status == "skipped" and message == DEADLINE_SKIP
    _state["progress"].write("end", key=nodeid, status="not reached" if deadline else
                             ("ok" if status in ("passed", "skipped", "xfailed", "xpassed") else "error"),
                             error=message)
    if deadline:  # never reached: no row, the summary counts it from the progress file
        return
    _writer().write(_row(nodeid, status, message, seconds))


def _writer():
    if "writer" not in _state:
        _state["writer"] = writer(Path(os.environ[OUT_ENV]), TESTS)
    return _state["writer"]


def _row(nodeid: str, status: str, message: str, seconds: float):
    if "run" not in _state:
        _state["run"] = Run("gpu-check", "cuda" if torch.cuda.is_available() else "cpu",
                            run_id=os.environ.get(RUN_ID_ENV))
    plan = _state["plan"] or []
    return TestRow(**_state["run"].prefix(), nodeid=nodeid, index=_state["index"].get(nodeid, 0),
                   collected=len(plan), seconds=round(seconds, 3), status=status, error=message)


def pytest_sessionfinish(session, exitstatus):
    if _is_worker(session.config):
        return
    for nodeid in list(_state["outcome"]):
        _finish(nodeid)
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    if not _state.get("plan") and not interrupted:
        # a node id that names nothing makes pytest-xdist collect nothing and print nothing: not a run
        _state["progress"].write("setup_error", error=f"pytest collected no tests (exit status {int(exitstatus)}); "
                                 "a test file or node id of the subset names nothing")
    elif interrupted or time.time() > _state["deadline"]:
        _state["progress"].write("stop", reason="the part's deadline")
    else:
        _state["progress"].write("done")
