"""NGRAM's chain S3 beside suffix decoding's default chain (S24) and target-only on SmolLM2-135M-Instruct, B = 1,
greedy, 12 requests x at most 96 new tokens, 2 timed passes, the logprob and phase passes over 2 requests: the
acceptance suite's CSV. `rep`: the repetitive suite's requests (`specdec.bench.suites.repetitive`, written beside
the CSV); `chat`: the held-out chat prompts `specdec bench` decodes.

Usage, from the repository root: python scripts/studies/suffix-20261207/chains.py rep|chat OUT_DIR
"""
import sys

import torch

from specdec import SpecConfig, zoo
from specdec.bench.cases import WorkerCase
from specdec.bench.suites.acceptance import run_benchmark
from specdec.bench.suites.repetitive import prompt_ids, write_prompt_file
from specdec.prompt_files import read_prompts
from specdec.zoo.chat_prompts import chat_prompt_ids

torch.set_num_threads(1)
which, out = sys.argv[1], sys.argv[2]
b = zoo.load("smollm2-135m-instruct")
if which == "rep":
    prompts = prompt_ids(b.tokenizer, read_prompts(write_prompt_file(f"{out}/repetitive-prompts-n12.jsonl", 12)))
else:
    prompts = chat_prompt_ids(b.tokenizer, "heldout", 12, seed=0)
cases = [WorkerCase("target-only", None), WorkerCase("ngram", SpecConfig(3)), WorkerCase("suffix", SpecConfig(24))]
path = run_benchmark(b.target, {"ngram": b.ngram, "suffix": b.suffix}, cases, prompts, [1], [0.0], 96,
                     model_name=b.name, repeats=2, out_dir=out, tag="repetitive" if which == "rep" else "acceptance",
                     stop_token_ids=list(b.tokenizer.eos_token_ids), check_prompts=2, show_progress=False)
print("wrote", path)
