"""Prompt files: what `bench`, `tune`, `demo` and the recorder read as a user's own prompts.

Three line formats, one prompt a line (blank lines skipped), told apart per line:
- MT-Bench's and Spec-Bench's JSON lines: {"question_id": ..., "category": str, "turns": [str, ...]} (other keys,
  such as "reference" or "source", are kept aside);
- chat lines: {"messages": [{"role": ..., "content": ...}, ...]} (a "category" key is read where present);
- plain text: the line is one user turn.

`read_prompts(path, categories=None)` -> `Prompt` records. A later turn of MT-Bench's format is asked after the
model's own answer to the turns before it (`Prompt.turns`); chat lines are a fixed conversation (`Prompt.messages`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

#: the category of plain-text lines and of records without one
DEFAULT_CATEGORY = "default"


@dataclass(frozen=True)
class Prompt:
    """One prompt of a file: the user turns (answered one after another) or a fixed chat to answer."""

    question_id: object
    category: str
    turns: tuple[str, ...] = ()
    messages: tuple[dict, ...] = ()
    extra: dict = field(default_factory=dict, compare=False)

    def conversation(self, answers=()) -> list[dict]:
        """The messages to answer next: a chat line's messages, or the first len(answers) + 1 turns with the
        model's own answers between them."""
        if self.messages:
            return [dict(m) for m in self.messages]
        out = []
        for turn, answer in zip(self.turns, answers):
            out += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
        return out + [{"role": "user", "content": self.turns[len(answers)]}]

    @property
    def num_turns(self) -> int:
        return 1 if self.messages else len(self.turns)


def _bad(path, lineno, why) -> ValueError:
    return ValueError(f"prompt file {str(path)!r} line {lineno}: {why}")


def _parse_json(path, lineno, obj) -> Prompt:
    if not isinstance(obj, dict):
        raise _bad(path, lineno, f"a JSON {type(obj).__name__}, not an object with 'turns' or 'messages'")
    category = obj.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category:
        raise _bad(path, lineno, f"category must be a non-empty string, got {category!r}")
    qid = obj.get("question_id", lineno)
    extra = {k: v for k, v in obj.items() if k not in ("question_id", "category", "turns", "messages")}
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise _bad(path, lineno, "'turns' must be a non-empty list of non-empty strings")
        return Prompt(qid, category, tuple(turns), extra=extra)
    if "messages" in obj:
        msgs = obj["messages"]
        ok = isinstance(msgs, list) and msgs and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in msgs)
        if not ok:
            raise _bad(path, lineno, "'messages' must be a non-empty list of {'role': str, 'content': str}")
        if msgs[-1]["role"] != "user":
            raise _bad(path, lineno, f"the last message must be the user's, got {msgs[-1]['role']!r}")
        return Prompt(qid, category, messages=tuple(dict(m) for m in msgs), extra=extra)
    raise _bad(path, lineno, "a JSON object without 'turns' or 'messages'")


def read_prompts(path, categories=None) -> list[Prompt]:
    """-> the file's prompts in order, only those of `categories` (an iterable of names, or None for all); a
    category not in the file, a malformed line or an empty selection is a ValueError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompt file {str(path)!r} does not exist")
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            if line.startswith(("{", "[")):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise _bad(path, lineno, f"malformed JSON ({e.msg} at column {e.colno})") from None
                out.append(_parse_json(path, lineno, obj))
            else:
                out.append(Prompt(lineno, DEFAULT_CATEGORY, (line,)))
    if categories is not None:
        want = list(dict.fromkeys(categories))
        have = {p.category for p in out}
        missing = [c for c in want if c not in have]
        if missing:
            raise ValueError(f"prompt file {str(path)!r} has no category {missing[0]!r} (it has {sorted(have)})")
        out = [p for p in out if p.category in want]
    if not out:
        raise ValueError(f"prompt file {str(path)!r} holds no prompts")
    return out
