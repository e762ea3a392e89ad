"""`specdec zoo list | train | train-draft`: the shipped checkpoints, and training them (`specdec.zoo.train`, whose
own parsers read the rest of the line)."""
from __future__ import annotations

import sys

NAME = "zoo"
OWN_PARSER = True

ZOO_HELP = """usage: specdec zoo list | specdec zoo train [options] | specdec zoo train-draft [options]

  list         each shipped pair: its models, their size on disk, its tokenizer and directory
  train        train a pair on the Python standard library (`specdec zoo train --help`)
  train-draft  train a draft for a given target on its recorded answers (`specdec zoo train-draft --help`)"""


def add_parser(subparsers):
    return subparsers.add_parser(NAME, add_help=False,
                                 help="the shipped checkpoints: `specdec zoo list`, `specdec zoo train --help`")


def run(args) -> int:
    rest = args.argv
    if rest[:1] == ["list"]:
        return zoo_list()
    if rest[:1] in (["-h"], ["--help"]):
        print(ZOO_HELP)
        return 0
    if rest[:1] == ["train-draft"]:
        # lazy: the CLI builds its parser before importing command implementations
        from ..zoo.train.for_target import main as train_draft_main
        return train_draft_main(rest[1:]) or 0
    if rest[:1] != ["train"]:
        print(ZOO_HELP, file=sys.stderr)
        return 2
    from ..bench.suites.draft_cost import record_trained_step_costs
    from ..zoo.train import main as train_main
    return train_main(rest[1:], after_training=record_trained_step_costs) or 0


def zoo_list() -> int:
    """`specdec zoo list`: each shipped pair, its models and their sizes; each real target, where its weights come
    from (an installed package, never a model hub) and the drafts trained for it."""
    # lazy: the CLI builds its parser before importing command implementations (the zoo)
    from .. import zoo
    for e in zoo.entries():
        if e["kind"] == "pair":
            print(f"{e['name']}: {', '.join(e['models'])} ({e['size_mib']:.1f} MiB on disk, {e['tokenizer']}); "
                  f"directory {e['directory']}")
            continue
        where = f"GGUF {e['source']}" if e["source"] else f"not installed: {e['install']}"
        print(f"{e['name']}: {e['description']}, {e['license']}; {where}; "
              f"drafts: {', '.join(e['drafts']) or 'none yet'}")
    return 0
