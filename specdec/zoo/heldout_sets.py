"""The toolkit's own held-out prompt sets, shipped as prompt files (`specdec.prompt_files`' MT-Bench format) in
specdec/zoo/heldout/, so that every machine decodes the same prompts whatever its interpreter's standard library:

- `chat.jsonl`: instructions about documented subjects of held-out standard-library modules (`chat_prompts`: the
  modules no training prompt quoted), each categorised by its template's task (`TEMPLATE_CATEGORIES`); what a model
  with a chat template answers by default (`specdec bench`, `demo`, `tune`).
- `code.jsonl`: windows of held-out standard-library files (`corpus.heldout_prompts`: files no byte pair trained
  on), each from a line start to a line end, category `code`; what the byte pairs continue by default, cut to a
  command's `--prompt-len` (`specdec.prompt_sets.cut_at_line_end`).

`python -m specdec.zoo.heldout_sets` writes them (`--out DIR`, default the package's directory): the same
interpreter writes the same files.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .chat_prompts import TEMPLATE_CATEGORIES, drawn_instructions
from .corpus import heldout_prompts

#: where the sets ship
HELDOUT_DIR = Path(__file__).resolve().parent / "heldout"
#: the shipped sets, by name
SETS = ("chat", "code")
#: prompts a set holds: enough for a command's evaluation prompts and, after them, `specdec tune`'s tuning prompts
SET_SIZE = 128
#: the longest code window, in bytes (`--prompt-len` cuts a shorter one out of it)
CODE_WINDOW = 256


def heldout_set(name: str) -> Path:
    """A shipped set's file; an unknown name is a ValueError naming the sets."""
    if name not in SETS:
        raise ValueError(f"unknown held-out prompt set {name!r}; the sets are {', '.join(SETS)}")
    return HELDOUT_DIR / f"{name}.jsonl"


def chat_records(n: int = SET_SIZE, seed: int = 0, root=None) -> list[dict]:
    """The chat set's lines: n instructions about held-out subjects (`drawn_instructions`), MT-Bench's fields, and the
    subject's module and name beside them; the categories taken in turn (each one's prompts in drawn order), so that
    a command's first N prompts cover every category about evenly."""
    drawn = drawn_instructions("heldout", n, seed, root)
    by_category = [[d for d in drawn if d[1] == k] for k in range(len(TEMPLATE_CATEGORIES))]
    in_turn = [row[j] for j in range(max(map(len, by_category))) for row in by_category if j < len(row)]
    return [{"question_id": f"chat-{i}", "category": TEMPLATE_CATEGORIES[k], "turns": [text],
             "source": subject.source, "subject": subject.name}
            for i, (subject, k, text) in enumerate(in_turn)]


def code_records(n: int = SET_SIZE, seed: int = 0, root=None) -> list[dict]:
    """The code set's lines: n windows of held-out files of at most `CODE_WINDOW` bytes, each from a line start to a
    line end (`heldout_prompts`, seeded), those that are UTF-8 text, category `code`."""
    out, draw = [], 0
    while len(out) < n:
        for window in heldout_prompts(n, CODE_WINDOW, seed=seed * 1000 + draw, root=root):
            try:
                text = bytes(window).decode("utf-8")
            except UnicodeDecodeError:  # a window cut inside a multi-byte character
                continue
            if len(out) < n and text not in {r["turns"][0] for r in out}:
                out.append({"question_id": f"code-{len(out)}", "category": "code", "turns": [text]})
        draw += 1
    return out


def write_sets(out=HELDOUT_DIR, n: int = SET_SIZE) -> list[Path]:
    """Both sets into `out` -> their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, records in (("chat", chat_records(n)), ("code", code_records(n))):
        path = out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        written.append(path)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.zoo.heldout_sets", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(HELDOUT_DIR), help="directory to write (default: the package's)")
    p.add_argument("--size", type=int, default=SET_SIZE, help="prompts per set (default: %(default)s)")
    a = p.parse_args(argv)
    for path in write_sets(a.out, a.size):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
