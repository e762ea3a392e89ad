"""The acceptance suite on a real target (SmolLM2-135M-Instruct from its GGUF file): held-out chat prompts, every
request stopping at the tokenizer's EOS as generation does, the engines' greedy outputs token for token those of
transformers' `generate` on the same weights. Skipped when the model's package is not installed."""
import csv

import pytest

from tests.helpers import installed_gguf
from specdec import zoo
from specdec.bench.suites.acceptance import run_benchmark
from specdec.bench.cases import WorkerCase
from specdec.draft_kinds import DRAFT_KINDS

NAME = "smollm2-135m-instruct"
REAL = zoo.REAL_TARGETS[NAME]



pytestmark = pytest.mark.skipif(installed_gguf() is None, reason=f"SmolLM2 is not installed ({REAL.install_command})")


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_engines_and_transformers_stop_at_eos_with_the_same_tokens(tmp_path):
    pytest.importorskip("transformers")
    import torch

    from specdec.models.gguf import cached_gguf_dir
    from specdec.zoo.chat_prompts import chat_prompt_ids
    torch.set_num_threads(1)
    bundle = zoo.load(NAME)
    tok = bundle.tokenizer
    # the model answers this one in 7 tokens and EOS ("2 + 2 = 4<|im_end|>"); the held-out one runs to the budget
    short = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2? Answer with the number only."}])
    prompts = [short] + chat_prompt_ids(tok, "heldout", 1, seed=0)
    cases = ([WorkerCase("target-only", None)] + [WorkerCase("ngram", spec) for spec in DRAFT_KINDS["ngram"].demo_specs]
             + [WorkerCase("hf-target-only", None), WorkerCase("hf-prompt-lookup", None, 3)])
    path = run_benchmark(bundle.target, {"ngram": bundle.ngram}, cases, prompts, [1], [0.0], 12, model_name=NAME,
                         out_dir=tmp_path, peer_dir=cached_gguf_dir(installed_gguf()), progress=lambda *a: None,
                         show_progress=False, stop_token_ids=tok.eos_token_ids)
    rows = _rows(path)
    assert [r["label"] for r in rows] == [c.label for c in cases]
    assert all(r["same_tokens_as_target_only"] == "True" for r in rows), [r["label"] for r in rows]
    assert all(r["tokens_by_batch"] == "8,12" for r in rows)  # stopped at EOS, then the full budget


@pytest.mark.slow
def test_specdec_bench_on_the_real_target_reads_held_out_chat_prompts(tmp_path):
    transformers = pytest.importorskip("transformers")
    from specdec.cli import main
    from specdec.models.gguf import cached_gguf_dir
    from specdec.prompt_files import read_prompts
    from specdec.zoo.heldout_sets import heldout_set
    assert main(["bench", "--model", NAME, "--num-prompts", "1", "--max-new-tokens", "8", "--repeats", "1",
                 "--workers", "ngram", "--no-peers", "--batch-sizes", "1", "--temperatures", "0",
                 "--out", str(tmp_path)]) == 0
    rows = _rows(next(tmp_path.glob("acceptance-*.csv")))
    hf = transformers.AutoTokenizer.from_pretrained(cached_gguf_dir(installed_gguf()))
    first = read_prompts(heldout_set("chat"))[0].turns[0]  # the shipped held-out chat set's first prompt
    want = hf.apply_chat_template([{"role": "user", "content": first}], add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert rows and all(r["model"] == NAME and r["same_tokens_as_target_only"] == "True" for r in rows)
    assert {float(r["prompt_len"]) for r in rows} == {len(want)}
    assert any(r["worker"] == "ngram" for r in rows)
    assert next(tmp_path.glob("acceptance-*.png"))
