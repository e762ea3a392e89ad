"""Every fast kernel compiles for an sm_90 GPU (H100/H200), checked on any machine: the CPU interpreter
accepts programs that compiled Triton rejects, so interpreted tests alone cannot show this."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.kernel_inventory import ALLOWED_SPILLS, TOLERATED_STACK_BYTES, fast_kernels, spilling_kernels

ROOT = Path(__file__).resolve().parents[2]
@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="on a GPU every kernel is compiled for the real device by the fast tests themselves")
def test_every_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "tests.helpers.gpu_compile_check"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [r for r in (json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")) if "kernel" in r]
    compiled = {r["kernel"] for r in rows}
    assert compiled == fast_kernels(), fast_kernels() ^ compiled
    assert spilling_kernels(rows) <= set(ALLOWED_SPILLS), spilling_kernels(rows)


def test_a_small_stack_frame_is_not_a_spill():
    rows = [dict(kernel="top_k_renorm_prob_kernel", stack_bytes=16), dict(kernel="a_kernel", stack_bytes=0),
            dict(kernel="b_kernel"), dict(kernel="build_tree_kernel_efficient_kernel", stack_bytes=520),
            dict(kernel="c_kernel", stack_bytes=TOLERATED_STACK_BYTES + 8)]
    assert spilling_kernels(rows) == {"build_tree_kernel_efficient_kernel", "c_kernel"}
