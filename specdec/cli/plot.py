"""`specdec plot`: every CSV of a results directory drawn beside it, and its committed gpu-check runs."""
from __future__ import annotations

import argparse

from ..cli_args import HelpFormatter

NAME = "plot"


def add_parser(subparsers):
    p = subparsers.add_parser(NAME, formatter_class=HelpFormatter,
                              help="draw every CSV of a results directory (each schema its plot, beside the file) and "
                                   "its committed gpu-check runs")
    p.add_argument("csv", nargs="*", help="only these CSVs (default: every CSV of --results)")
    p.add_argument("--results", default="results", help="the results directory")
    p.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    return p


def run(args) -> int:
    # lazy: the CLI builds its parser before importing command implementations
    from ..bench.report.plots import plot_all, plot_csv
    written = [plot_csv(c) for c in args.csv] if args.csv else plot_all(args.results)
    for png in filter(None, written):
        print(f"wrote {png}")
    return 0
