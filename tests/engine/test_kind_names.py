"""A kind's facts live in its record (`specdec.draft_kinds`): no module of the package names a kind by a string
literal, except the places listed here, each with its reason. A new literal fails; an entry that no longer occurs
should be dropped (the list only shrinks)."""
from __future__ import annotations

import ast
from pathlib import Path

from specdec.draft_kinds import DRAFT_KINDS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "specdec"

#: user-facing defaults and names: a command's default or choice, the word a user types
USER_FACING = {
    "specdec/zoo/__init__.py": {"eagle", "draft_lm"},  # a draft directory's kind when its files say no more: a causal
    # LM's layout is a draft LM, else the EAGLE layout (`draft_kind_of_dir`)
    "specdec/cli/tune.py": {"eagle"},  # `specdec tune --kind` default
    "specdec/bench/suites/kernel_count.py": {"eagle"},  # run_kernel_count's default kinds
    "specdec/zoo/train/cli.py": {"eagle", "eagle3"},  # `specdec zoo train`'s per-stage flags (--eagle3-unroll, ...)
    "specdec/zoo/train/for_target.py": {"eagle3", "eagle", "dflash", "draft_lm", "dspark"},  # `train-draft --kind`
}
#: not a kind: "eagle" is also a checkpoint layout (`DraftConfig.eagle_layout`: SafeAILab's EAGLE-1/2)
OTHER_MEANING = {
    "specdec/models/draft_common.py": {"eagle"},
    "specdec/models/eagle.py": {"eagle"},
}
#: a kind's own code naming its own kind: its trainer stage reports under the stage's name
OWN_KIND = {
    "specdec/zoo/train/stages.py": {"eagle", "eagle3", "mtp", "mtp_chain", "draft_lm"},
    "specdec/zoo/train/block_stages.py": {"dflash", "dspark"},
}
#: per-kind facts still outside the record (to move into it: the card's per-kind prose, the benches' special cases)
NOT_YET_IN_RECORD = {
    "specdec/zoo/train/card.py": {"eagle", "eagle3", "draft_lm", "dflash"},
    "specdec/bench/suites/acceptance.py": {"draft_lm"},
    "specdec/bench/cases.py": {"ngram", "dspark"},
    "specdec/bench/suites/dflash.py": {"dflash"},
    "specdec/bench/suites/dflash_scaling.py": {"dflash"},
    "specdec/bench/suites/draft_vocab.py": {"eagle3"},
    "specdec/gpu_check/decode.py": {"eagle", "mtp_chain"},
    "specdec/bench/suites/grammar.py": {"eagle"},
    "specdec/bench/suites/heads.py": {"ngram"},
    "specdec/bench/report/plots.py": {"eagle3"},
    "specdec/bench/report/tables.py": {"draft_lm"},
    "specdec/bench/report/results_page.py": {"eagle3"},
}
ALLOWED = {}
for table in (USER_FACING, OTHER_MEANING, OWN_KIND, NOT_YET_IN_RECORD):
    for path, names in table.items():
        ALLOWED.setdefault(path, set()).update(names)


def kind_literals() -> dict[str, set[str]]:
    """path -> the kind names that occur as a whole string literal in that module (docstrings and prose that merely
    contain a kind's name are longer strings and do not count)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "specdec/draft_kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in DRAFT_KINDS:
                found.setdefault(rel, set()).add(node.value)
    return found


def test_no_kind_name_literal_outside_the_kind_records():
    extra = {path: sorted(names - ALLOWED.get(path, set())) for path, names in kind_literals().items()}
    extra = {path: names for path, names in extra.items() if names}
    assert not extra, (f"kind names as string literals outside specdec/draft_kinds.py: {extra}; read the fact from "
                       f"the kind's record (DraftKind), or list a user-facing default here with its reason")


def test_the_allow_list_names_only_literals_that_occur():
    found = kind_literals()
    stale = {path: sorted(names - found.get(path, set())) for path, names in ALLOWED.items()}
    stale = {path: names for path, names in stale.items() if names}
    assert not stale, f"allow-listed kind literals that no longer occur (drop them): {stale}"
