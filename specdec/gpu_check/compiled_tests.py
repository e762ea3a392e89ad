"""The `tests` part of `specdec gpu-check`: the fast-path tests compiled on the GPU, one tests.csv row per test
as it finishes (`pytest_plugin`). The part's process becomes pytest (exec), so the driver's signals and
deadline reach pytest itself.

Order: the files whose tests guard the goals first (the fused logprobs, fast vs reference, CUDA-graph
replay), then the rest. The statistical losslessness test draws `GPU_LOSSLESS_DRAWS` sequences (the CPU
slow grid's count, whose false-failure rate is the suite's) instead of its GPU default of 5,000.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

from .parts import ROOT
from .pytest_plugin import OUT_ENV
from .runner import setup_failed

#: The fast-path test files run compiled on a GPU (the CUDA-only ones among them included), goal tests first.
GPU_TEST_SUBSET = ["tests/ops/test_fast_logprobs.py", "tests/ops/test_fast_parity.py",
                   "tests/workers/test_decode_graphs.py",
                   "tests/workers/test_worker_contracts.py::test_cuda_graph_replay_equals_eager",
                   "tests/workers/test_dspark.py::test_cuda_graph_replay_equals_eager",
                   "tests/workers/test_fast_workers.py", "tests/ops/test_fast_attention.py",
                   "tests/ops/test_fast_tree_ops.py", "tests/ops/test_sampling_ops.py", "tests/ops/test_fast_kv.py",
                   "tests/ops/test_cuda_shim.py", "tests/workers/test_ngram.py", "tests/workers/test_standalone.py",
                   "tests/engine/test_draft_kinds.py", "tests/gpu_check/test_bandwidth_probe.py"]
SMOKE_TEST_SUBSET = ["tests/ops/test_cuda_shim.py"]
#: The subset's tests that compile grammars: left out without xgrammar (the GPU image has none and installs
#: nothing). By node id: `-k grammar` would also match every parameter id that prints `draft_grammar=False`.
GRAMMAR_TESTS = ["tests/workers/test_ngram.py::test_ngram_under_penalties_grammars_and_a_ragged_mixed_batch",
                 "tests/workers/test_ngram.py::test_a_grammar_batch_takes_no_round_trip_of_its_own",
                 "tests/workers/test_standalone.py::test_penalties_grammars_and_a_ragged_batch"]
LOSSLESS_DRAWS_ENV = "SPECDEC_LOSSLESS_DRAWS"
GPU_LOSSLESS_DRAWS = 2000
#: pytest-xdist workers on a GPU machine (compiles run in parallel; one GPU is shared).
XDIST_WORKERS = 8


def unavailable(root: Path = ROOT) -> str | None:
    """Why the part cannot run here, in one line: the test files are a checkout's (`ROOT/tests`, beside the package);
    a wheel ships the package without them. None where they are."""
    if (root / "tests").is_dir():
        return None
    return (f"no tests/ beside the package at {root} (installed from a wheel, not a checkout): the "
            f"{len(GPU_TEST_SUBSET)} fast-path test files are not run")


def tests_command(out: Path, smoke: bool) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "specdec.gpu_check.pytest_plugin",
           "-rfE"]
    if importlib.util.find_spec("xdist") is not None and not smoke:
        cmd += ["-n", str(XDIST_WORKERS)]
    if importlib.util.find_spec("xgrammar") is None:
        cmd += [arg for test in GRAMMAR_TESTS for arg in ("--deselect", test)]
    return cmd + (SMOKE_TEST_SUBSET if smoke else GPU_TEST_SUBSET)


def missing_tests(subset: list[str], root: Path = ROOT) -> list[str]:
    """The entries of `subset` that name no file, or no test function in their file (pytest-xdist turns one
    such entry into a session that collects nothing and says nothing)."""
    missing = []
    for entry in subset:
        path, _, name = entry.partition("::")
        file = root / path
        function = name.split("::")[-1].split("[")[0]  # a method of a test class, a parametrised id
        if not file.is_file() or (name and not re.search(rf"^\s*def {re.escape(function)}\(", file.read_text(),
                                                          re.M)):
            missing.append(entry)
    return missing


def run_tests(out: Path, smoke: bool) -> None:
    why = unavailable()
    if why:
        print(f"note: {why}", flush=True)
        return
    missing = missing_tests(SMOKE_TEST_SUBSET if smoke else GPU_TEST_SUBSET + GRAMMAR_TESTS)
    if missing:
        message = f"the tests part's subset names tests that do not exist: {', '.join(missing)}"
        setup_failed(message)
        raise SystemExit(message)
    cmd = tests_command(out, smoke)
    if not smoke and importlib.util.find_spec("xdist") is None:
        print("note: pytest-xdist is not installed: the tests run in one process", flush=True)
    if importlib.util.find_spec("xgrammar") is None:
        print(f"note: xgrammar is not installed: {len(GRAMMAR_TESTS)} tests that compile grammars are left out",
              flush=True)
    print(" ".join(cmd), flush=True)
    os.environ[OUT_ENV] = str(out)
    os.environ.setdefault(LOSSLESS_DRAWS_ENV, str(GPU_LOSSLESS_DRAWS))
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir(ROOT)
    os.execv(sys.executable, cmd)
