"""A command's prompts: the shipped held-out sets (prompt files in MT-Bench's format), a prompt rendered through the
model's chat template or as its text, MT-Bench's later turns asked after the target's own greedy answer (against a
plain greedy decoding loop), code prompts cut at a line end, and bad input named in one line."""
import json

import pytest

from tests.helpers.oracles.penalties import penalised_greedy_decode
from specdec import SamplingParams, zoo
from specdec.prompt_files import read_prompts
from specdec.prompt_sets import cut_at_line_end, default_set, encode, load_requests, requests_of
from specdec.tokenizer import ByteTokenizer
from specdec.zoo.chat_prompts import TEMPLATE_CATEGORIES, TEMPLATES, is_heldout_source
from specdec.zoo.heldout_sets import SET_SIZE, heldout_set


@pytest.fixture(scope="module")
def small():
    return zoo.load(zoo.SMALL_NAME)


def test_the_shipped_sets_are_prompt_files_of_held_out_text():
    chat = read_prompts(heldout_set("chat"))
    code = read_prompts(heldout_set("code"))
    assert len(chat) == len(code) == SET_SIZE
    assert {p.category for p in chat} == set(TEMPLATE_CATEGORIES) and {p.category for p in code} == {"code"}
    assert [p.category for p in chat[:5]] == list(TEMPLATE_CATEGORIES)  # in turn: the first N cover every one
    # every instruction is about a module of the held-out split, in the words of its category's template
    for p in chat:
        assert is_heldout_source(p.extra["source"]), p.extra["source"]
        opening = TEMPLATES[TEMPLATE_CATEGORIES.index(p.category)].split("`{name}`")[0]
        assert p.turns[0].startswith(opening) and f"`{p.extra['subject']}`" in p.turns[0]
    assert all(p.turns[0].endswith("\n") and len(p.turns[0].encode()) <= 256 for p in code)
    assert len({p.question_id for p in chat + code}) == 2 * SET_SIZE


def test_a_byte_pair_reads_code_and_a_chat_model_the_chat_set(small):
    assert default_set(small) == heldout_set("code") and not small.chat and small.stop_token_ids == []
    requests = load_requests(small, num_prompts=3, prompt_len=40)
    whole = read_prompts(heldout_set("code"))[:3]
    for r, p in zip(requests, whole):
        raw = list(p.turns[0].encode())  # the byte tokenizer's ids are the text's bytes
        assert r.ids == cut_at_line_end(raw, 40, 10) and r.category == "code" and len(r.ids) <= 40


def test_encode_renders_the_chat_template_or_the_text():
    tok = ByteTokenizer()
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "?"}]
    assert encode(tok, conv, chat=True) == list(b"user: hi\nassistant: yo\nuser: ?\nassistant: ")
    assert encode(tok, conv, chat=False) == list(b"hi\nyo\n?")


def test_cut_at_line_end():
    nl = 10
    assert cut_at_line_end([1, 2, nl, 3, 4, nl, 5], 6, nl) == [1, 2, nl, 3, 4, nl]
    assert cut_at_line_end([1, 2, nl, 3, 4, 5, 6, 7, 8], 8, nl) == [1, 2, nl, 3, 4, 5, 6, 7]  # too short a line
    assert cut_at_line_end([1, 2, 3, nl, 5, 6, 7, 8, 9], 8, nl) == [1, 2, 3, nl]  # half of 8 kept: cut there
    assert cut_at_line_end([1, 2, 3], 8, nl) == [1, 2, 3]


def test_a_later_turn_follows_the_targets_own_greedy_answer(small, tmp_path):
    path = tmp_path / "mt.jsonl"
    rows = [{"question_id": 81, "category": "writing", "turns": ["def add(a, b):", "def sub(a, b):"]},
            {"question_id": 82, "category": "coding", "turns": ["import os"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = load_requests(small, path)
    assert [(r.question_id, r.turn, r.category) for r in first] == [(81, 0, "writing"), (82, 0, "coding")]
    every = requests_of(small, read_prompts(path), turns="all", max_new_tokens=6)
    assert [(r.question_id, r.turn) for r in every] == [(81, 0), (81, 1), (82, 0)]
    # the answer by a plain greedy loop (one full forward per token), then the second turn after it
    answer, _ = penalised_greedy_decode(small.target, list(b"def add(a, b):"), SamplingParams(max_new_tokens=6))
    assert every[1].ids == list(b"def add(a, b):\n") + answer + list(b"\ndef sub(a, b):")
    assert every[0].ids == first[0].ids and every[2].ids == first[1].ids


def test_bad_selections_are_one_line(small, tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("one\ntwo\n")
    with pytest.raises(ValueError, match=r"holds 2 prompts, none after the first 2$"):
        load_requests(small, path, skip=2)
    with pytest.raises(ValueError, match=r"has no category 'math'"):
        load_requests(small, path, categories=["math"])
    with pytest.raises(ValueError, match=r"turns must be one of first, all, got 'some'"):
        requests_of(small, read_prompts(path), turns="some")
