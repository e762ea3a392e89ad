"""One catch-up of the draft after 1, 8 and 32 skipped (no-draft) steps: process CPU ms, the small pair at B = 1.

Usage, from the repository root: python scripts/studies/no-draft-20261204/catchup_cost.py; its printed output is
results/no-draft-20261204/catchup_cost.txt."""
import statistics
import time

import torch

from specdec import Engine, SamplingParams, zoo
from specdec.bench.tune.search import fixed_shape_spec
from specdec.ops.contract import NO_DRAFT
from specdec.zoo.corpus import heldout_prompts

torch.set_num_threads(1)
b = zoo.load("stdlib-byte-6l")
w = Engine(b.target, b.eagle, fixed_shape_spec(b.target, b.eagle, NO_DRAFT, 1), max_batch=1).worker
p = heldout_prompts(1, 96, seed=11)
res = {}
for k in (1, 8, 32):
    times = []
    for _ in range(30):
        w.prefill(p, [SamplingParams(max_new_tokens=64)], seed=0)
        w.use_shape(NO_DRAFT)
        for _ in range(k):
            w.decode_step()
        c0 = time.process_time()
        w.catch_up_draft()
        times.append(time.process_time() - c0)
        w.finish()
    res[k] = statistics.median(times) * 1e3
print({k: round(v, 2) for k, v in res.items()}, "ms per catch-up (median of 30, process CPU, 1 thread)")
