"""`specdec gpu-check`: the GPU one-shot (`specdec.gpu_check`); its own parser reads the rest of the line."""
from __future__ import annotations

NAME = "gpu-check"
#: The rest of the command line goes to the command's own parser (in args.argv): `python3 -m specdec.gpu_check`
#: shares it.
OWN_PARSER = True


def add_parser(subparsers):
    return subparsers.add_parser(NAME, add_help=False,
                                 help="one offline run that measures and checks the fast path on this machine's GPU, "
                                      "writing CSVs and SUMMARY.md under --out (`specdec gpu-check --help`)")


def run(args) -> int:
    # lazy: the CLI builds its parser before importing command implementations
    from ..gpu_check.driver import main
    return main(args.argv)
