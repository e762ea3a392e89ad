"""The training prompt set: every task type of the public speculative-decoding benchmarks (MT-Bench's eight chat
categories, translation, summarisation, question answering, maths word problems, answers grounded in a passage),
built from text the machine has (`text`), drawn tasks (`generators`) and the target's own user turns (`magpie`),
never from a benchmark's prompts.

Every prompt has a source; the held-out split is by source (sha256(source) % HELDOUT_BUCKETS == 0), so a draft
never trained on a held-out manual page, module, package, template batch or Magpie batch. The files are JSON lines
in MT-Bench's and Spec-Bench's format plus the source: {"question_id", "category", "turns", "source"}.

`python -m specdec.zoo.prompts.build --out DIR` writes DIR/train.jsonl, DIR/heldout.jsonl and DIR/card.json (counts
per task type and source family, the files' sha256).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections import Counter
from pathlib import Path

from . import text, words
from .generators import Task, generated

HELDOUT_BUCKETS = 5
CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
              "translation", "summarization", "qa", "math_reasoning", "rag", "chat")

SUMMARY_ASKS = ("Summarise the following text in two or three sentences.", "Give a one-paragraph summary of this text.",
                "Write a short summary of the text below for a newcomer.", "What are the main points of this text?",
                "Summarise this in one sentence.")
RAG_ASKS = ("What is {s} used for?", "What does {s} do, according to the passage?",
            "When should someone use {s}?", "What problem does {s} solve?", "Which details about {s} does the "
            "passage give?")
EXTRACT_ASKS = ("List every command-line option mentioned in the text as a JSON array of strings.",
                "Extract the names of all programs, files and functions the text mentions, as a bulleted list.",
                "Extract the key facts of the text as a bulleted list.",
                "Return a JSON object with the fields \"name\" and \"purpose\" describing what the text documents.")
#: prompts per task type in both splits together, before the Magpie turns (`magpie`) join as "chat"
QUOTAS = {"summarization": 2400, "rag": 2400, "extraction": 1800, "translation": 2400, "qa": 1800, "coding": 3000,
          "math_reasoning": 2400, "math": 1500, "reasoning": 1500, "writing": 1800, "roleplay": 1200, "stem": 1500,
          "humanities": 1200}
STDLIB_ASKS = ("Explain what `{s}` does and give a short example.",
               "Write a short Python function that uses `{s}`.",
               "When would I use `{s}` in a Python program?")


def is_heldout_source(source: str) -> bool:
    return int(hashlib.sha256(source.encode("utf-8")).hexdigest(), 16) % HELDOUT_BUCKETS == 0


def passage_tasks(p: text.Passage, rng: random.Random) -> list[Task]:
    """The tasks a passage gives: a summary, a grounded answer, an extraction, a translation of one of its
    sentences (English passages into another language, others into English) and, for documented names, a
    closed-book question or a coding task."""
    quoted = f"\n\n{p.text}"
    out = [Task("summarization", p.source, (rng.choice(SUMMARY_ASKS) + quoted,)),
           Task("rag", p.source, (f"Answer using only the passage below.\n\nPassage:{quoted}\n\nQuestion: "
                                  f"{rng.choice(RAG_ASKS).format(s=p.subject)}",))]
    if p.language == "English":
        ask = EXTRACT_ASKS[0] if p.options else rng.choice(EXTRACT_ASKS[1:])
        out.append(Task("extraction", p.source, (ask + quoted,)))
    sents = text.sentences(p.text)
    if sents:
        s = rng.choice(sents)
        into = rng.choice(words.LANGUAGES) if p.language == "English" else "English"
        out.append(Task("translation", p.source, (f"Translate into {into}:\n\n{s}",)))
    if p.source.startswith("stdlib:"):
        out.append(Task("coding", p.source, (rng.choice(STDLIB_ASKS).format(s=p.subject),)))
    elif p.source.startswith("man:"):
        out.append(Task("qa", p.source, (rng.choice((f"What does the `{p.subject}` command do?",
                                                     f"How do I use `{p.subject}` on Linux?")),)))
    return out


def build(seed: int = 0, man_pages: int = 1500, foreign_pages: int = 60, doc_files: int = 600,
          stdlib_subjects: int = 2500, per_template: int = 300) -> list[dict]:
    """-> the records (question_id, category, turns, source, split), in a seeded order."""
    rng = random.Random(seed)
    passages = text.man_passages(man_pages)
    for lang in text.MAN_LANGUAGES:
        passages += text.man_passages(foreign_pages, lang)
    passages += text.doc_passages(doc_files)
    stdlib = text.stdlib_passages()
    passages += rng.sample(stdlib, min(stdlib_subjects, len(stdlib)))
    tasks = [t for p in passages for t in passage_tasks(p, rng)]
    tasks += generated(random.Random(seed + 1), per_template)
    pools: dict[str, dict[tuple, Task]] = {c: {} for c in QUOTAS}
    for t in tasks:
        pools[t.category].setdefault(t.turns, t)
    records = []
    for category, quota in QUOTAS.items():
        pool = list(pools[category].values())
        for t in rng.sample(pool, min(quota, len(pool))):
            records.append({"category": t.category, "turns": list(t.turns), "source": t.source,
                            "split": "heldout" if is_heldout_source(t.source) else "train"})
    rng.shuffle(records)
    for i, r in enumerate(records):
        r["question_id"] = i
    return records


def family(source: str) -> str:
    """'man-de:ls' -> 'man-de', 'gen:math/shop/3' -> 'gen', 'magpie/2' -> 'magpie'."""
    return source.split(":", 1)[0].split("/", 1)[0]


def card(records: list[dict], files: dict[str, Path]) -> dict:
    by = {}
    for split in ("train", "heldout"):
        rs = [r for r in records if r["split"] == split]
        by[split] = {"prompts": len(rs), "multi_turn": sum(len(r["turns"]) > 1 for r in rs),
                     "sources": len({r["source"] for r in rs}),
                     "by_category": dict(sorted(Counter(r["category"] for r in rs).items())),
                     "by_family": dict(sorted(Counter(family(r["source"]) for r in rs).items()))}
    return {"splits": by, "heldout_rule": f"sha256(source) % {HELDOUT_BUCKETS} == 0",
            "files": {k: {"name": p.name, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                      for k, p in files.items()}}


def card_markdown(card: dict) -> str:
    """The card as a page: prompts per task type and split, prompts per source family and split."""
    sp = card["splits"]
    cats = sorted(set(sp["train"]["by_category"]) | set(sp["heldout"]["by_category"]))
    fams = sorted(set(sp["train"]["by_family"]) | set(sp["heldout"]["by_family"]))
    lines = ["# The training prompt set", "",
             f"Built by `{card['command']}` (`specdec.zoo.prompts.build`); the held-out split is by source "
             f"({card['heldout_rule']}). Files: " + ", ".join(f"`{f['name']}` (sha256 {f['sha256'][:16]})"
                                                           for f in card["files"].values()) + ".", "",
             "| task type | train | held out |", "|---|---|---|"]
    lines += [f"| {c} | {sp['train']['by_category'].get(c, 0):,} | {sp['heldout']['by_category'].get(c, 0):,} |"
              for c in cats]
    lines += [f"| all | {sp['train']['prompts']:,} | {sp['heldout']['prompts']:,} |", "",
              "| source family | train | held out |", "|---|---|---|"]
    lines += [f"| {f} | {sp['train']['by_family'].get(f, 0):,} | {sp['heldout']['by_family'].get(f, 0):,} |"
              for f in fams]
    lines += ["", f"Multi-turn prompts: {sp['train']['multi_turn']:,} train, {sp['heldout']['multi_turn']:,} held "
                  f"out; sources: {sp['train']['sources']:,} train, {sp['heldout']['sources']:,} held out.",
              "Families: `man` manual pages (`man-<lang>` in other languages), `stdlib` the standard library's "
              "docstrings, `doc` /usr/share/doc, `gen` drawn tasks, `magpie` the target's own requests."]
    return "\n".join(lines) + "\n"


def write_jsonl(path: Path, records: list[dict]) -> None:
    keys = ("question_id", "category", "turns", "source")
    path.write_text("".join(json.dumps({k: r[k] for k in keys}, ensure_ascii=False) + "\n" for r in records),
                    encoding="utf-8")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.zoo.prompts.build", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--man-pages", type=int, default=1500, help="English manual pages (default: %(default)s)")
    p.add_argument("--per-template", type=int, default=300, help="prompts per drawn template (default: %(default)s)")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    records = build(a.seed, man_pages=a.man_pages, per_template=a.per_template)
    files = {}
    for split in ("train", "heldout"):
        files[split] = out / f"{split}.jsonl"
        write_jsonl(files[split], [r for r in records if r["split"] == split])
    c = card(records, files)
    c["command"] = "python -m specdec.zoo.prompts.build " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "card.json").write_text(json.dumps(c, indent=1) + "\n")
    (out / "README.md").write_text(card_markdown(c))
    print(json.dumps(c["splits"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
