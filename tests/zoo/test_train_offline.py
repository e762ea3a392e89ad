"""Drafts in one command (`specdec.zoo.train.offline`): a prompt file is recorded, each kind trained and written with
its card row, on the small byte pair; the same command again records and trains nothing more."""
import json

from specdec import zoo
from specdec.zoo.train.offline import main


def test_record_train_write_then_continue(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"category": "coding", "turns": [t]}) + "\n" for t in
                               ("def parse(self, text):", "import os", "class A:", "x = [1, 2,", "while True:")))
    argv = ["--model", zoo.SMALL_NAME, "--prompts", str(prompts), "--heldout-prompts", str(prompts),
            "--kinds", "eagle,eagle3", "--max-new-tokens", "40", "--batch-size", "3", "--steps", "2",
            "--train-batch-size", "2", "--seq-len", "16", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    card = json.loads((tmp_path / "out" / "drafts" / "card.json").read_text())
    assert sorted(card["drafts"]) == ["eagle", "eagle3"]
    assert card["drafts"]["eagle"]["training"]["data"]["prompt_files"] == ["p.jsonl"]
    assert "depth1" in card["drafts"]["eagle3"]["heldout"]
    b = zoo.load(zoo.SMALL_NAME)
    for kind in ("eagle", "eagle3"):
        zoo.load_draft_for(kind, tmp_path / "out" / "drafts" / kind, b.target)
    sealed = sorted(p.name for p in (tmp_path / "out" / "recordings" / "train").iterdir())
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "eagle: already trained" in err and "eagle3: already trained" in err
    assert sorted(p.name for p in (tmp_path / "out" / "recordings" / "train").iterdir()) == sealed
