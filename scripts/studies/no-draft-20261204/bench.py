"""NO_DRAFT steps against target-only, in turn, one thread: tokens per process-CPU second, one JSON line.

Usage, from the repository root: python scripts/studies/no-draft-20261204/bench.py PAIR B LABEL (e.g. stdlib-byte-6l 1
after); its outputs are results/no-draft-20261204/{before,after,after-P32}.jsonl."""
import json
import sys

import torch

from specdec import zoo
from specdec.bench.tune.search import Measurer
from specdec.ops.contract import NO_DRAFT
from specdec.zoo.corpus import heldout_prompts

torch.set_num_threads(1)
name, B, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
b = zoo.load(name)
prompts = heldout_prompts(2 * B, length=96, seed=11)
batches = [prompts[:B], prompts[B:]]
m = Measurer(b.target, b.eagle, max_seq_len=256, max_new_tokens=64)
res = m.decode_in_turn([None, NO_DRAFT], batches, repeats=5)
out = {"label": label, "model": name, "B": B, "threads": torch.get_num_threads()}
for key, r in zip(["target_only", "no_draft"], res):
    out[key] = [round(x, 1) for x in r["passes"]]
out["ratio_by_pass"] = [round(n / t, 3) for n, t in zip(out["no_draft"], out["target_only"])]
print(json.dumps(out))
