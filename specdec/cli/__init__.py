"""`specdec` console command: `specdec demo`, `generate`, `bench`, `tune`, `report`, `plot`, `token-map`, `gpu-check`,
`zoo list`, `zoo train`.

One module per command, each with `NAME`, `add_parser(subparsers)` and `run(args) -> int`; `COMMANDS` is the table
`main` builds the parser from, in the order `specdec --help` lists them. A command with `OWN_PARSER` (gpu-check, tune,
zoo: each also has an entry point of its own) gets the rest of the command line in `args.argv`; `check(args)`, where
a command has one, returns what its arguments get wrong together.
"""
from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import version

import torch

from ..cli_args import HelpFormatter
from . import bench, demo, generate, gpu_check, plot, report, token_map, tune, zoo

COMMANDS = {c.NAME: c for c in (demo, generate, token_map, gpu_check, tune, zoo, report, plot, bench)}


def _version() -> str:
    try:
        return version("specdec")
    except Exception:  # not installed as a distribution (a source checkout on sys.path)
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="EAGLE-style speculative decoding toolkit",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"specdec {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(subparsers)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    command = COMMANDS[args.command]
    if getattr(command, "OWN_PARSER", False):
        args.argv = rest
        return command.run(args)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    problem = command.check(args) if hasattr(command, "check") else None
    if problem:
        parser.error(problem)
    if args.threads:  # the one place --threads is applied, for every command
        torch.set_num_threads(args.threads)
    try:
        return command.run(args)
    except KeyboardInterrupt:
        print(f"specdec {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line, no traceback (SPECDEC_TRACEBACK=1 shows it)
        if os.environ.get("SPECDEC_TRACEBACK"):
            raise
        print(f"specdec {args.command}: error: {e}" if isinstance(e, ValueError)
              else f"specdec {args.command}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
