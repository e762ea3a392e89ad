"""The fast kernels under a triton other than the installed one: CI runs it for the GPU runs' triton (3.6.0, with
torch 2.11), beside the pinned one that the test suite uses. Two checks, each in a subprocess with that triton first
on PYTHONPATH:

1. every fast kernel compiles for sm_90 (`tests.helpers.gpu_compile_check`, the same assertions as
   `tests/ops/test_kernels_compile.py`), in bf16 (the GPU run's dtype; every kernel is reached in it; the pinned
   triton's check in the test suite compiles fp32 and fp16 too);
2. the fast ops run under its CPU interpreter (`INTERPRETER_TESTS`: every kernel module at least once, fast
   against the reference) instead of failing inside a kernel.

    python -m tests.helpers.triton_version_check 3.6.0 [--dir DIR]

triton==VERSION is installed with `pip install --no-deps --target DIR` (DIR defaults to a directory under the
system temp dir that is reused, so a second run installs nothing, and pip's cache keeps the wheel), never
into the running environment. Exit status 0 when both checks pass.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Interpreted fast-vs-reference tests, small, that together launch every kernel module of `fast` (about 10 s).
INTERPRETER_TESTS = [
    "tests/ops/test_fast_logprobs.py::test_default_launch_with_an_empty_split_at_a_tiny_temperature",  # split + merge
    "tests/ops/test_fast_logprobs.py::test_tree_at_maximum_size",
    "tests/ops/test_fast_tree_ops.py::test_chains_and_single_request",  # tree build and both verifies
    "tests/ops/test_fast_attention.py::test_fast_equals_reference[decode T=1, MQA-dtype1]",
    "tests/ops/test_fast_attention.py::test_rope_and_kv_write_equal_the_reference[8-2-128-1-5-dtype1]",
    "tests/ops/test_fast_kv.py::test_chain_of_overlapping_moves",
    "tests/ops/test_sampling_ops.py::test_example_from_the_design_top_k_then_top_p_over_the_renormalised_probs[fast]",
    "tests/ops/test_sampling_ops.py::test_fast_equals_reference[bf16-1-1]",
    "tests/ops/test_draft_ops.py::test_large_vocabulary_single_row",  # the heuristic's split + merge
    "tests/ops/test_draft_ops.py::test_a_split_of_only_minus_inf_or_below_exp_range[bf16]",
    "tests/engine/test_penalties.py::test_a_node_is_penalised_by_its_own_path[fast]",
    "tests/engine/test_grammar.py::test_the_op_equals_the_per_token_loop[4-33-fast]",
    "tests/ops/test_fast_rejection.py::test_sample_without_replacement_strict_boundaries",
    "tests/ops/test_fast_rejection.py::test_tree_rejection_exact_rules",
    "tests/ops/test_fast_rejection.py::test_chain_block_exact_rules",
    "tests/ops/test_fast_traversal.py::test_traversal_exact_rules",
    "tests/ops/test_fused_norm.py::test_rows_wider_than_a_block_are_walked_in_blocks[dtype1]",
    "tests/ops/test_silu_and_mul.py::test_rows_wider_than_a_block_are_split_between_programs",
    # gpu-check's read probe
    "tests/gpu_check/test_bandwidth_probe.py::test_a_buffer_of_ones_sums_exactly_and_out_is_reused",
    # greedy pick, split + merge
    "tests/ops/test_argmax_finite.py::test_every_vocabulary_split_gives_the_same_pick[100]",
]


def install(version: str, target: Path) -> None:
    marker = target / f"triton-{version}.dist-info"
    if marker.is_dir():
        return
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
                    "--target", str(target), f"triton=={version}"], check=True)


def _env(target: Path, interpret: bool, cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(target), str(ROOT)])
    env["TRITON_CACHE_DIR"] = str(cache)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


def check_compile(version: str, target: Path, cache: Path) -> list[str]:
    from tests.helpers.kernel_inventory import ALLOWED_SPILLS, fast_kernels, spilling_kernels

    run = subprocess.run([sys.executable, "-m", "tests.helpers.gpu_compile_check", "--dtypes", "bfloat16"], cwd=ROOT,
                         env=_env(target, False, cache), capture_output=True, text=True)
    if run.returncode != 0:
        return [f"the sm_90 compile check failed under triton {version}:\n{run.stderr[-3000:]}"]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    problems = []
    seen = {r["triton"] for r in rows if "triton" in r}
    if seen != {version}:
        problems.append(f"the compile check ran under triton {seen or '?'}, not {version}")
    compiled = {r["kernel"] for r in rows if "kernel" in r}
    if compiled != fast_kernels():
        problems.append(f"kernels compiled and expected differ: {sorted(compiled ^ fast_kernels())}")
    spills = spilling_kernels([r for r in rows if "kernel" in r]) - set(ALLOWED_SPILLS)
    if spills:
        problems.append(f"kernels spilling registers under triton {version}: {sorted(spills)}")
    print(f"triton {version}: {len(compiled)} kernels, {len(rows) - 1} variants compiled for sm_90", flush=True)
    return problems


def check_interpreter(version: str, target: Path, cache: Path) -> list[str]:
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *INTERPRETER_TESTS],
                         cwd=ROOT, env=_env(target, True, cache), capture_output=True, text=True)
    tail = run.stdout.strip().splitlines()[-1:] if run.stdout.strip() else [run.stderr[-500:]]
    print(f"triton {version} interpreter: {tail[0]}", flush=True)
    if run.returncode != 0:
        return [f"fast ops under triton {version}'s interpreter failed:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"]
    return []


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.triton_version_check",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("version", help="the triton version to check, e.g. 3.6.0")
    parser.add_argument("--dir", type=Path, default=None, help="where triton is installed (reused when present)")
    args = parser.parse_args(argv)
    target = args.dir or Path(tempfile.gettempdir()) / f"specdec-triton-{args.version}"
    t0 = time.monotonic()
    install(args.version, target)
    with tempfile.TemporaryDirectory(prefix="specdec-triton-cache-") as cache:
        problems = check_compile(args.version, target, Path(cache)) + \
            check_interpreter(args.version, target, Path(cache))
    print(f"triton {args.version}: {'ok' if not problems else 'FAILED'} in {time.monotonic() - t0:.0f} s", flush=True)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
