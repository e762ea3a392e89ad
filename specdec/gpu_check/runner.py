"""How one part of `specdec gpu-check` runs its configurations inside its process, and how it tells the driver.

A part is a list of configurations (a shape, a worker x path x batch size, a graph case, a test), headline
first. Each is tried on its own: an exception becomes an error row (the exception's last line) and the next
configuration runs. The part reports to the driver through a progress file of JSON lines (its plan, each
configuration's start and end), so that the driver can tell, when the process dies or stops moving, which
configuration it was in, write that configuration's error row itself and start the part again in a fresh
process from the next one (`skip`: the configurations already done or fatal). An error that poisons the CUDA
context (an illegal address, a device-side assert) ends the process for the same reason: nothing after it
in the same process could be trusted.

Timeouts: a configuration gets `config_timeout_s` (SIGALRM, which interrupts Python code; a hang inside a
CUDA call is the driver's to kill), and nothing starts after the part's deadline. `--inject-faults`
(smoke mode only) raises in, hangs in or aborts the process at the N-th configuration of a part, to test all
of this on a CPU.

No torch at module level: the driver imports this module to read progress files and parse fault specs.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
import traceback

PROGRESS_ENV = "SPECDEC_GPU_CHECK_PROGRESS"  # the part's progress file (JSON lines), in the scratch dir
DEADLINE_ENV = "SPECDEC_GPU_CHECK_DEADLINE"  # epoch seconds: no configuration starts after it
CONFIG_TIMEOUT_ENV = "SPECDEC_GPU_CHECK_CONFIG_TIMEOUT"  # seconds one configuration may take
SKIP_ENV = "SPECDEC_GPU_CHECK_SKIP"  # a file: keys of configurations not to run again, one a line
FAULTS_ENV = "SPECDEC_GPU_CHECK_FAULTS"  # the --inject-faults spec
#: Exit status of a part that stopped itself after a context-poisoning error.
POISONED_EXIT = 75
#: A configuration is not started with less time than this before the deadline.
MIN_CONFIG_S = 1.0
#: Substrings of an exception's text that mean the CUDA context can no longer be trusted in this process (CUDA's
#: sticky errors). Not every "CUDA error": a failed graph capture is one, and the context usually survives it;
#: after any error `_context_usable` asks the device itself.
POISON_MARKERS = ("illegal memory access", "device-side assert", "unspecified launch failure", "misaligned address",
                  "illegal instruction", "an illegal", "CUBLAS_STATUS_EXECUTION_FAILED", "launch timed out",
                  "injected abort")
FAULT_KINDS = ("raise", "hang", "abort")


# ---- fault injection -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    part: str
    index: int  # 1-based, in the part's plan order
    kind: str  # raise | hang | abort

    def __str__(self) -> str:
        return f"{self.part}:{self.index}:{self.kind}"


class InjectedFault(RuntimeError):
    """What `PART:N:raise` raises."""


def parse_faults(text: str | None, parts: list[str] | None = None) -> list[Fault]:
    """"PART:N:KIND,..." -> faults. ValueError naming the item for an unknown part or kind or N < 1."""
    faults = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        bits = item.split(":")
        if len(bits) != 3:
            raise ValueError(f"fault {item!r}: expected PART:N:KIND (KIND one of {', '.join(FAULT_KINDS)})")
        part, n, kind = bits
        if parts is not None and part not in parts:
            raise ValueError(f"fault {item!r}: unknown part {part!r}; expected one of {', '.join(parts)}")
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault {item!r}: unknown kind {kind!r}; expected one of {', '.join(FAULT_KINDS)}")
        try:
            index = int(n)
        except ValueError:
            index = 0
        if index < 1:
            raise ValueError(f"fault {item!r}: N must be an integer >= 1 (the N-th configuration), got {n!r}")
        faults.append(Fault(part, index, kind))
    return faults


def inject(fault: Fault) -> None:
    """Do what the fault says, inside the configuration it names."""
    print(f"injecting fault {fault}", flush=True)
    if fault.kind == "raise":
        raise InjectedFault(f"injected fault {fault}")
    if fault.kind == "hang":
        # as a kernel that never returns: no Python signal handler runs (the alarm and SIGINT are blocked),
        # only the driver's SIGKILL ends it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGINT})
        while True:
            time.sleep(3600)
    # abort: the process dies at once, as on a device-side assert; no core file may land in the checkout
    # lazy: resource is POSIX-only
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.stdout.flush()
    os.abort()


# ---- the progress file -----------------------------------------------------------------------------------
class Progress:
    """Appends one JSON object a line to the part's progress file (nothing without one)."""

    def __init__(self, path: str | None):
        self.path = path

    def write(self, event: str, **data) -> None:
        if not self.path:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(dict(event=event, t=time.time(), **data)) + "\n")


@dataclass
class PlanEntry:
    key: str
    file: str  # the CSV its rows go to
    fields: dict  # the row fields that name it (what an error row for it carries)
    headline: bool = False


@dataclass
class PartProgress:
    """A part's progress file read back (every process of the part appends to the same file)."""

    plan: list[PlanEntry] = field(default_factory=list)
    started: dict[str, float] = field(default_factory=dict)  # key -> time of its last start
    ended: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (status, error)
    done: bool = False  # the last process ran to the end of the plan
    stopped: str = ""  # why the last process stopped early (its deadline)
    setup_error: str = ""

    def in_flight(self) -> list[str]:
        """Started and not ended, oldest first."""
        return sorted((k for k in self.started if k not in self.ended), key=self.started.get)

    def by_key(self) -> dict[str, PlanEntry]:
        return {e.key: e for e in self.plan}


def read_progress(path) -> PartProgress:
    state = PartProgress()
    path = Path(path)
    if not path.is_file():
        return state
    for line in path.read_text().splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill
            continue
        kind = ev.get("event")
        if kind == "plan":
            state.plan = [PlanEntry(**e) for e in ev["configs"]]
            state.done, state.stopped = False, ""
        elif kind == "start":
            state.started[ev["key"]] = ev["t"]
        elif kind == "end":
            state.ended[ev["key"]] = (ev["status"], ev.get("error", ""))
        elif kind == "done":
            state.done = True
        elif kind == "stop":
            state.stopped = ev.get("reason", "")
        elif kind == "setup_error":
            state.setup_error = ev.get("error", "")
    return state


# ---- running configurations ------------------------------------------------------------------------------
@dataclass
class Config:
    """One configuration of a part: `run()` measures it and writes its rows."""

    key: str
    run: Callable[[], None]
    file: str
    fields: dict
    headline: bool = False


class ConfigTimeout(Exception):
    """A configuration ran past its time (raised by SIGALRM in the part's main thread)."""


def last_line(e: BaseException) -> str:
    """An exception's type and the last non-empty line of its message (tracebacks are in log.txt)."""
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}".strip().rstrip(":")


def poisons_context(e: BaseException) -> bool:
    """True when `e` (or an exception it chains) says the CUDA context is no longer usable."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if any(m in str(e) for m in POISON_MARKERS):
            return True
        e = e.__cause__ or e.__context__
    return False


def _on_alarm(signum, frame):
    raise ConfigTimeout("the configuration ran past its time")


def run_configs(part: str, configs: list[Config], error_row: Callable[[Config, str], None],
                env: dict | None = None) -> None:
    """Run `configs` in order (those listed in the skip file excepted), each on its own, until the deadline.

    error_row(config, message) writes a failed configuration's row. A context-poisoning error exits the
    process with POISONED_EXIT after its row; SIGINT (the driver at the part's deadline) ends the run after
    the configuration in flight is recorded."""
    env = os.environ if env is None else env
    progress = Progress(env.get(PROGRESS_ENV))
    keys = [c.key for c in configs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{part}: configuration keys must be unique, got {keys}")
    progress.write("plan", configs=[dict(key=c.key, file=c.file, fields=c.fields, headline=c.headline)
                                    for c in configs])
    skip_file = env.get(SKIP_ENV)
    skip = set(Path(skip_file).read_text().splitlines()) if skip_file and Path(skip_file).is_file() else set()
    deadline = float(env.get(DEADLINE_ENV, "inf"))
    timeout = float(env.get(CONFIG_TIMEOUT_ENV, "inf"))
    faults = {f.index: f for f in parse_faults(env.get(FAULTS_ENV)) if f.part == part}
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        for index, config in enumerate(configs, 1):
            if config.key in skip:
                continue
            left = deadline - time.time()
            if left < MIN_CONFIG_S:
                progress.write("stop", reason=f"the part's deadline, before {config.key}")
                print(f"{part}: deadline reached; {config.key} and the rest not started", flush=True)
                return
            progress.write("start", key=config.key)
            t0 = time.perf_counter()
            status, message, poisoned = "ok", "", False
            try:
                signal.setitimer(signal.ITIMER_REAL, max(min(timeout, left), 0.01))
                try:
                    if index in faults:
                        inject(faults[index])
                    config.run()
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:  # the driver's SIGINT at the part's deadline
                message = "interrupted at the part's deadline"
                _record_error(config, message, error_row)
                progress.write("end", key=config.key, status="error", error=message)
                progress.write("stop", reason="interrupted at the part's deadline")
                return
            except Exception as e:
                status, message, poisoned = "error", last_line(e), poisons_context(e) or not _context_usable()
                if isinstance(e, ConfigTimeout):
                    message = (f"ConfigTimeout: still running after {timeout:.0f} s" if timeout <= left else
                               f"ConfigTimeout: stopped at the part's deadline after {left:.0f} s")
                traceback.print_exc()
                _record_error(config, message, error_row)
            progress.write("end", key=config.key, status=status, error=message)
            print(f"{part} [{index}/{len(configs)}] {config.key}: {status}{' - ' + message if message else ''} "
                  f"[{time.perf_counter() - t0:.1f} s]", flush=True)
            if poisoned:
                print(f"{part}: the CUDA context is poisoned by {config.key}; ending this process", flush=True)
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(POISONED_EXIT)  # no CUDA teardown in a poisoned context
        progress.write("done")
    finally:
        signal.signal(signal.SIGALRM, previous)


def _context_usable() -> bool:
    """After an error: False when this process's CUDA context no longer answers (a sticky error that the
    exception's text did not name). True without CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return True
    try:
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


def _record_error(config: Config, message: str, error_row) -> None:
    try:
        error_row(config, message)
    except Exception as e:  # the row is lost, the progress file still says it failed
        print(f"could not write the error row of {config.key}: {last_line(e)}", flush=True)


def setup_failed(message: str, env: dict | None = None) -> None:
    """Record that the part failed before its first configuration (an import, a model build)."""
    Progress((os.environ if env is None else env).get(PROGRESS_ENV)).write("setup_error", error=message)


def lazy(build: Callable):
    """A shared resource built on first use by whichever configuration needs it first; a build that fails
    fails each configuration that needs it (each gets its error row), not the part."""
    box = {}

    def get():
        if "value" not in box:
            box["value"] = build()
        return box["value"]
    return get


def describe_exit(rc: int | None) -> str:
    """A process's exit status in words: `exit status 1`, `signal SIGKILL`."""
    if rc is None:
        return "no exit status"
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"
