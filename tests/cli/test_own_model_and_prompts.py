"""A user's own model and prompts end to end: `specdec bench --model <a GGUF file the test writes> --draft <a draft
directory in train-draft's layout> --prompts <an MT-Bench file of three categories>` writes rows per category, and every
output it timed is the target's own greedy continuation (a plain decoding loop over the prompts rendered by hand
through the file's chat template); the report and the plot show the categories; generate, demo, tune and token-map
take the same model; bad input is one line naming it."""
import csv
import json

import pytest

from tests.helpers.gguf_files import tiny_llama, write_gguf
from tests.helpers.oracles.penalties import penalised_greedy_decode
import specdec.bench.suites.acceptance as acceptance
from specdec import Engine, SamplingParams, zoo
from specdec.cli import main
from specdec.models.gguf import load_gguf_tokenizer
from specdec.zoo.train.for_target import save_target_draft

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

QUESTIONS = [(81, "writing", "Write a line."), (82, "math", "2+2?"), (83, "coding", "def f"),
             (84, "writing", "A poem?"), (85, "math", "3*3?"), (86, "coding", "x = 1")]


@pytest.fixture
def own(tmp_path, monkeypatch):
    """(a GGUF file, its target as a draft LM in train-draft's --out layout, an MT-Bench file); GGUF conversions go to
    the test's own cache."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    model = tiny_llama(max_position_embeddings=256)
    path = write_gguf(tmp_path / "own.gguf", model)
    # the fingerprint train-draft records: of the target as loaded from the file
    save_target_draft(model, tmp_path / "drafts" / "draft_lm", zoo.target_fingerprint(zoo.load_model(str(path)).target))
    prompts = tmp_path / "question.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": q, "category": c, "turns": [t, "Why?"]}) + "\n"
                               for q, c, t in QUESTIONS))
    return path, tmp_path / "drafts", prompts


def _rows(out_dir) -> list[dict]:
    with open(next(out_dir.glob("acceptance-*.csv")), newline="") as f:
        return list(csv.DictReader(f))


def test_bench_on_a_gguf_file_and_a_prompt_file_by_category(own, tmp_path, monkeypatch, capsys):
    path, drafts, prompts = own
    timed = []

    def spy(runners, batches, params, repeats, tick=None):
        passes = real(runners, batches, params, repeats, tick)
        timed.append((batches, params, passes))
        return passes

    real = acceptance._measure
    monkeypatch.setattr(acceptance, "_measure", spy)
    out = tmp_path / "results"
    assert main(["bench", "--model", str(path), "--draft", str(drafts), "--prompts", str(prompts), "--workers",
                 "draft_lm,ngram", "--shapes", "first", "--no-peers", "--repeats", "1", "--batch-sizes", "1",
                 "--temperatures", "0", "--max-new-tokens", "6", "--out", str(out)]) == 0
    rows = _rows(out)
    assert {(r["label"], r["category"]) for r in rows} == {
        (label, c) for label in ("target-only", "STANDALONE tree S5 K4 W16", "NGRAM tree S5 K4 W16")
        for c in ("all", "writing", "math", "coding")}
    for r in rows:
        assert int(r["num_prompts"]) == (6 if r["category"] == "all" else 2)
    assert all(float(r["mean_accept_len"]) > 1.5 for r in rows if r["worker"] == "draft_lm")  # the target itself
    # every timed output: the target's own greedy continuation of its question in the file's chat template
    tok = load_gguf_tokenizer(path)
    target = zoo.load_model(str(path)).target
    want, question_of = {}, {}
    for q, _, text in QUESTIONS:
        ids = tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        want[tuple(ids)] = penalised_greedy_decode(target, ids, SamplingParams(max_new_tokens=6, stop_token_ids=[2]))[0]
        question_of[tuple(ids)] = q
    (batches, params, passes), = timed
    # one category a batch, the categories in the file's order: writing, math, coding
    assert [question_of[tuple(p)] for b in batches for p in b] == [81, 84, 82, 85, 83, 86]
    assert params.stop_token_ids == [2]
    for runner_passes in passes:
        outs = [o for batch in runner_passes[0]["outs_by_batch"] for o in batch]
        assert [o.token_ids for o in outs] == [want[tuple(p)] for b in batches for p in b]
    assert main(["report", str(next(out.glob("acceptance-*.csv")))]) == 0
    report = capsys.readouterr().out
    assert ("| worker: accepted / step, CPU tok/s vs specdec's target-only | writing (2 prompts) | math (2 prompts) | "
            "coding (2 prompts) | all (6 prompts) |") in report
    assert next(out.glob("acceptance-*.png")).stat().st_size > 10_000


def test_every_turn_follows_the_targets_own_answer(own, tmp_path):
    path, _, prompts = own
    out = tmp_path / "results"
    assert main(["bench", "--model", str(path), "--prompts", str(prompts), "--turns", "all", "--categories",
                 "math", "--workers", "ngram", "--shapes", "first", "--no-peers", "--repeats", "1", "--batch-sizes",
                 "1", "--temperatures", "0", "--max-new-tokens", "4", "--out", str(out)]) == 0
    rows = _rows(out)
    assert {r["category"] for r in rows} == {"all"}  # one category: its rows are the run's
    assert all(int(r["num_prompts"]) == 4 and r["same_tokens_as_target_only"] == "True" for r in rows)


def _one_line_error(argv, capsys, *needles):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(n in err for n in needles), err


def test_bad_input_is_one_line_naming_it(own, tmp_path, capsys):
    path, drafts, prompts = own
    bench = ["bench", "--no-peers", "--repeats", "1", "--batch-sizes", "1", "--temperatures", "0",
             "--max-new-tokens", "2", "--workers", "ngram", "--out", str(tmp_path / "results")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(prompts.read_text().splitlines()[0] + "\nplain text is fine\n{\"turns\": [\"x\"\n")
    _one_line_error(bench + ["--model", str(path), "--prompts", str(bad)], capsys, "bad.jsonl", "line 3",
                    "malformed JSON")
    _one_line_error(bench + ["--model", str(path), "--prompts", str(prompts), "--categories", "roleplay"], capsys,
                    "has no category 'roleplay'", "coding", "math", "writing")
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"not a model")
    _one_line_error(bench + ["--model", str(weights)], capsys, f"model '{weights}' is neither",
                    "a .gguf file nor a model directory")
    other = tmp_path / "other"
    save_target_draft(tiny_llama(seed=9, max_position_embeddings=256), other / "draft_lm", "0123456789abcdef")
    _one_line_error(bench + ["--model", str(path), "--draft", str(other)], capsys,
                    "the draft_lm draft in", "was trained for target 0123456789abcdef, not this target")
    with pytest.raises(SystemExit) as exit_:
        main(bench + ["--suite", "penalties", "--prompts", str(prompts)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--prompts: the acceptance suite's, not --suite penalties's" in err


def test_generate_demo_tune_and_token_map_take_the_same_model(own, tmp_path, capsys):
    path, drafts, prompts = own
    assert main(["generate", "--model", str(path), "--draft", str(drafts), "--max-new-tokens", "6", "Hi"]) == 0
    out = capsys.readouterr().out
    assert "draft_lm: LlamaForCausalLM" in out and "identical tokens: yes" in out
    assert main(["demo", "--model", str(path), "--draft", str(drafts), "--prompts", str(prompts), "--categories",
                 "coding", "--max-new-tokens", "4"]) == 0  # exits 1 when a draft's output is not target-only's
    out = capsys.readouterr().out
    assert "2 prompts of" in out and "STANDALONE tree S5 K4 W16" in out and "def f" in out
    tuned = tmp_path / "tuned.json"
    assert main(["tune", "--model", str(path), "--draft", str(drafts), "--kind", "draft_lm", "--prompts", str(prompts),
                 "--batch-sizes", "1", "--num-prompts", "2", "--acceptance-prompts", "1", "--max-new-tokens", "3",
                 "--max-steps", "2", "--confirm", "1", "--results", str(tmp_path), "--out", str(tuned)]) == 0
    # the tuned file names this target and draft: an engine on them takes it, one on another target refuses it
    b = zoo.load_model(str(path), drafts=[drafts])
    Engine(b.target, b.draft_lm, f"tuned:{tuned}")
    small = zoo.load(zoo.SMALL_NAME)
    with pytest.raises(ValueError, match=r"target\.fingerprint .* is not this target's"):
        Engine(small.target, small.draft_lm, f"tuned:{tuned}")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the the the then\n")
    assert main(["token-map", "--model", str(path), "--corpus", str(corpus), "--size", "4",
                 "--out", str(tmp_path / "hot.pt")]) == 0
    assert "the 4 most frequent of 261 ids" in capsys.readouterr().out
