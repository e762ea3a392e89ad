"""The training prompt set: every task type, split by source (no source in both splits), drawn tasks distinct and
reproducible, passage tasks that quote their passage, and files in the prompt-file format."""
import json
import random

from specdec.prompt_files import read_prompts
from specdec.zoo.prompts import build, text
from specdec.zoo.prompts.generators import TEMPLATES, generated

PASSAGE = text.Passage("man:frob", "frob", "The frob program frobnicates files. It reads each file in turn and "
                       "writes the frobnicated text to standard output. Options change the frobnication level.",
                       options=("--level", "-q"))


def test_generated_tasks_are_distinct_reproducible_and_cover_their_categories():
    a, b = generated(random.Random(3), 20), generated(random.Random(3), 20)
    assert a == b
    assert len({t.turns for t in a}) == len(a)
    assert {t.category for t in a} == {c for c, _, _ in TEMPLATES}
    assert any(len(t.turns) == 2 for t in a)  # follow-up turns
    assert all(t.source.startswith(f"gen:{t.category}/") for t in a)


def test_passage_tasks_quote_the_passage_and_keep_its_source():
    tasks = build.passage_tasks(PASSAGE, random.Random(0))
    cats = {t.category for t in tasks}
    assert {"summarization", "rag", "extraction", "translation", "qa"} <= cats
    assert all(t.source == "man:frob" for t in tasks)
    for t in tasks:
        if t.category in ("summarization", "rag", "extraction"):
            assert PASSAGE.text in t.turns[0]
    extraction = next(t for t in tasks if t.category == "extraction")
    assert "option" in extraction.turns[0]  # a page with options asks for them
    foreign = build.passage_tasks(text.Passage("man-de:frob", "frob", "Das Programm liest jede Datei der Reihe "
                                               "nach. Es schreibt den Text in die Standardausgabe zurück.",
                                               "German"), random.Random(0))
    assert any(t.turns[0].startswith("Translate into English") for t in foreign)


def test_sentences_split_at_sentence_ends():
    assert text.sentences("First sentence is here and long enough. Second one is also long enough to count.",
                          lo=10) == ["First sentence is here and long enough.",
                                     "Second one is also long enough to count."]


def test_split_is_by_source_and_files_are_prompt_files(tmp_path, monkeypatch):
    monkeypatch.setattr(text, "man_passages", lambda limit, language=None, workers=4: [PASSAGE] * (language is None))
    monkeypatch.setattr(text, "doc_passages", lambda limit: [])
    monkeypatch.setattr(text, "stdlib_passages", lambda: [text.Passage(f"stdlib:m{i}", f"m{i}.f", "Return the "
                                                                       f"frobnication of x number {i}. " * 8)
                                                          for i in range(40)])
    records = build.build(seed=0, per_template=8)
    train = {r["source"] for r in records if r["split"] == "train"}
    held = {r["source"] for r in records if r["split"] == "heldout"}
    assert train and held and not train & held
    assert all(build.is_heldout_source(s) for s in held)
    assert len({tuple(r["turns"]) for r in records}) == len(records)
    path = tmp_path / "train.jsonl"
    build.write_jsonl(path, [r for r in records if r["split"] == "train"])
    got = read_prompts(path)
    assert len(got) == len(train and [r for r in records if r["split"] == "train"])
    assert all(p.extra["source"] in train for p in got)
    card = build.card(records, {"train": path})
    assert sum(card["splits"]["train"]["by_category"].values()) == len(got)
    assert json.loads(json.dumps(card)) == card
    card["command"] = "build"
    page = build.card_markdown(card)
    for category, n in card["splits"]["train"]["by_category"].items():
        assert f"| {category} | {n:,} |" in page


def test_magpie_header_is_the_template_up_to_the_users_message():
    from specdec.tokenizer import ByteTokenizer
    from specdec.zoo.prompts.magpie import user_header_ids

    tok = ByteTokenizer()
    header = user_header_ids(tok)
    assert tok.decode(header) == "user: "
    full = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)
    assert full[:len(header)] == header and tok.decode(full[len(header):]).startswith("hello")
