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
    p.add_argument("--speedup-by-kind", metavar="CSV", default=None,
                   help="instead: one acceptance CSV's speedup by draft kind at its smallest batch size, greedy, "
                        "naming its CSV, commands and machine (the README's figure); written to --out")
    p.add_argument("--out", metavar="PNG", default=None, help="where --speedup-by-kind writes its figure")
    p.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    return p


def check(args) -> str | None:
    if (args.speedup_by_kind is None) != (args.out is None):
        return "--speedup-by-kind CSV and --out PNG go together"
    if args.speedup_by_kind is not None and args.csv:
        return "--speedup-by-kind draws one CSV: give no other CSV"
    return None


def run(args) -> int:
    # lazy: the CLI builds its parser before importing command implementations
    from ..bench.report.plots import plot_all, plot_csv, speedup_figure
    if args.speedup_by_kind is not None:
        print(f"wrote {speedup_figure(args.speedup_by_kind, args.out)}")
        return 0
    written = [plot_csv(c) for c in args.csv] if args.csv else plot_all(args.results)
    for png in filter(None, written):
        print(f"wrote {png}")
    return 0
