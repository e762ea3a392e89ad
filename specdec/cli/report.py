"""`specdec report`: docs/results.md from the committed CSVs, or one CSV's tables."""
from __future__ import annotations

import argparse

from ..cli_args import HelpFormatter

NAME = "report"


def add_parser(subparsers):
    p = subparsers.add_parser(NAME, formatter_class=HelpFormatter,
                              help="print docs/results.md from the committed CSVs, or one CSV's tables")
    p.add_argument("csv", nargs="?", default=None,
                   help="an acceptance-*.csv or penalties-*.csv of results/; without it, the whole results page "
                        "(`specdec report > docs/results.md` in a checkout)")
    p.add_argument("--root", default=".",
                   help="the checkout whose results/current.json and CSVs the page is printed from (an installed "
                        "package ships no results)")
    p.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    return p


def run(args) -> int:
    if args.csv is None:
        # lazy: the CLI builds its parser before importing command implementations
        from ..bench.report.results_page import render_page
        print(render_page(args.root), end="")
        return 0
    from ..bench.report.tables import print_report
    return print_report(args.csv)
