"""The repetitive workload suite (`specdec bench --suite repetitive`): its requests, the prompt file it writes, and
a small run on the shipped small pair."""
import csv
import json

from specdec.bench.suites.repetitive import CATEGORIES, TOOL_SCHEMA, write_prompt_file
from specdec.cli import main
from specdec.prompt_files import read_prompts


def test_the_prompt_file_holds_each_category_in_turn(tmp_path):
    """Chat lines that `read_prompts` reads: a tool call whose format the system turn shows, a function's source to
    edit, a conversation to quote; the same seed writes the same file."""
    path = write_prompt_file(tmp_path / "p.jsonl", 6, seed=3)
    prompts = read_prompts(path)
    assert [p.category for p in prompts] == list(CATEGORIES) * 2
    tool, edit, quote = prompts[:3]
    system = tool.messages[0]["content"]
    example = json.loads(system.rsplit("\n", 1)[1])  # the format the answer is to follow, as JSON
    assert example["name"] == TOOL_SCHEMA["name"] and json.dumps(TOOL_SCHEMA, indent=2) in system
    assert tool.messages[1]["content"].startswith("Call `")
    code = edit.messages[0]["content"].split("```python\n", 1)[1].split("\n```", 1)[0]
    assert code.startswith("def ") and "Rename its parameter" in edit.messages[0]["content"]
    assert [m["role"] for m in quote.messages] == ["user", "assistant", "user"]
    assert "word for word" in quote.messages[2]["content"]
    assert write_prompt_file(tmp_path / "q.jsonl", 6, seed=3).read_text() == path.read_text()


def test_a_small_run_writes_its_csv_beside_its_prompts(tmp_path, capsys):
    argv = ["bench", "--suite", "repetitive", "--model", "stdlib-byte-6l", "--num-prompts", "3", "--max-new-tokens",
            "8", "--repeats", "1", "--temperatures", "0", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = list(csv.DictReader(next(tmp_path.glob("repetitive-2*.csv")).open()))
    assert [r["label"] for r in rows] == ["target-only", "NGRAM tree S5 K4 W16", "SUFFIX chain S24"]
    assert all(r["same_tokens_as_target_only"] == "True" for r in rows)
    assert len(read_prompts(tmp_path / "repetitive-prompts-n3.jsonl")) == 3
