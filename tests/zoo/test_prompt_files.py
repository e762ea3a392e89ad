"""Prompt files: MT-Bench / Spec-Bench JSON lines, chat lines and plain text read to the same records; a later
turn follows the model's own answer; bad lines, unknown categories and empty files are one-line errors naming
them."""
import json

import pytest

from specdec.prompt_files import DEFAULT_CATEGORY, read_prompts


def write(tmp_path, lines, name="p.jsonl"):
    path = tmp_path / name
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_three_formats_read_in_order(tmp_path):
    path = write(tmp_path, [
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."], "reference": ["x"]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
        "",
        "What is 2 + 2?",
    ])
    got = read_prompts(path)
    assert [p.category for p in got] == ["writing", DEFAULT_CATEGORY, DEFAULT_CATEGORY]
    assert got[0].question_id == 81 and got[0].turns == ("Write a poem.", "Shorter.")
    assert got[0].extra == {"reference": ["x"]}
    assert got[1].conversation() == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert got[2].turns == ("What is 2 + 2?",) and got[2].question_id == 4  # its line number


def test_a_later_turn_follows_the_models_answer(tmp_path):
    p = read_prompts(write(tmp_path, [{"category": "math", "turns": ["A?", "B?"]}]))[0]
    assert p.num_turns == 2
    assert p.conversation() == [{"role": "user", "content": "A?"}]
    assert p.conversation(["ans"]) == [{"role": "user", "content": "A?"}, {"role": "assistant", "content": "ans"},
                                       {"role": "user", "content": "B?"}]


def test_categories_select_and_unknown_is_refused(tmp_path):
    path = write(tmp_path, [{"category": c, "turns": [c]} for c in ("qa", "rag", "qa", "math")])
    assert [p.turns[0] for p in read_prompts(path, ["qa", "math"])] == ["qa", "qa", "math"]
    with pytest.raises(ValueError, match="no category 'coding'"):
        read_prompts(path, ["qa", "coding"])


@pytest.mark.parametrize("line, why", [
    ('{"category": "qa", "turns": ["a"', "line 2: malformed JSON"),
    ('{"category": "qa"}', "line 2: a JSON object without 'turns' or 'messages'"),
    ('{"turns": []}', "line 2: 'turns' must be a non-empty list"),
    ('{"turns": ["a", 3]}', "line 2: 'turns' must be a non-empty list"),
    ('{"category": 7, "turns": ["a"]}', "line 2: category must be a non-empty string"),
    ('{"messages": [{"role": "user"}]}', "line 2: 'messages' must be"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}', "line 2: the last message must be the user's"),
    ('[1, 2]', "line 2: a JSON list"),
])
def test_a_malformed_line_is_named_by_its_number(tmp_path, line, why):
    path = write(tmp_path, ['{"turns": ["fine"]}', line])
    with pytest.raises(ValueError, match=why) as e:
        read_prompts(path)
    assert "\n" not in str(e.value)


def test_missing_and_empty_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="holds no prompts"):
        read_prompts(write(tmp_path, ["", "  "]))
