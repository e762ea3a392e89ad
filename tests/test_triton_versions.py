"""The tritons the project claims: pyproject's bounds, the clear refusal of an older triton, and the interpreter
fix that lets the fast ops run under the GPU runs' triton 3.6 (with torch 2.11) on a CPU
(tests/helpers/triton_version_check.py runs them under 3.6.0 itself, in CI)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import fast
from fast import interpreter

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_bounds_are_the_checked_tritons():
    deps = (ROOT / "pyproject.toml").read_text()
    triton = re.search(r'"triton>=([\d.]+),<([\d.]+);', deps)
    assert triton, "pyproject must bound triton from both sides"
    assert tuple(int(x) for x in triton.group(1).split(".")) == interpreter.MIN_TRITON
    ci = (ROOT / ".ci" / "run").read_text()
    assert "tests.helpers.triton_version_check 3.6.0" in ci  # the lower bound is checked in CI, not only claimed


@pytest.mark.parametrize("version", ["3.6.0", "3.9.0", "3.10.0+git1234"])
def test_a_supported_triton_is_accepted(version):
    interpreter.require_supported_triton(version)


@pytest.mark.parametrize("version", ["3.5.1", "3.1.0", "2.3.1"])
def test_an_older_triton_is_one_clear_error_naming_the_version_needed(version):
    with pytest.raises(ImportError, match=rf"need triton >= 3\.6 \(found triton {re.escape(version)}\)"):
        interpreter.require_supported_triton(version)


@pytest.mark.skipif(not fast.INTERPRETED, reason="the interpreter runs only without CUDA")
def test_interpreted_scalars_convert_to_indices():
    """A scalar of the interpreter is a 1-element array; `range` over runtime bounds needs its __index__."""
    import triton.runtime.interpreter as triton_interpreter
    assert getattr(triton_interpreter._patch_lang_tensor, "_squeezes_scalar_index", False)


def test_the_interpreter_check_names_tests_that_exist():
    """CI's triton-3.6 check runs these by node id; a renamed or removed test would fail only there, late."""
    import subprocess
    import sys

    from tests.helpers.triton_version_check import INTERPRETER_TESTS

    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *INTERPRETER_TESTS], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    collected = [line for line in run.stdout.splitlines() if "::" in line]
    assert len(collected) == len(INTERPRETER_TESTS), collected
