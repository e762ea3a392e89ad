"""No draft re-run on the tuner's engines and prompts (`Measurer`), beside target-only and two chains, in turn.

Usage, from the repository root:
python scripts/studies/no-draft-20261204/confirm_rerun.py PAIR B [MAX_SKIPPED_STEPS]; its printed output is
results/no-draft-20261204/confirm_rerun.txt."""
import sys

import torch

from specdec import zoo
from specdec.bench.tune.search import Measurer, batches_of
from specdec.ops.contract import NO_DRAFT
from specdec.workers.eagle import EagleWorkerV2
from specdec.zoo.corpus import heldout_prompts

torch.set_num_threads(1)
b = zoo.load(sys.argv[1])
B = int(sys.argv[2])
if len(sys.argv) > 3:
    EagleWorkerV2.max_skipped_steps = int(sys.argv[3])
print("P", EagleWorkerV2.max_skipped_steps)
prompts = heldout_prompts(32, 96, seed=1)
m = Measurer(b.target, b.eagle, 96 + 48 + 64, 48)
keys = [None, NO_DRAFT, (3, 2, 6), (1, 1, 2)]
res = m.decode_in_turn(keys, batches_of(prompts, B), 3)
for k, r in zip(keys, res):
    print(k, [round(x, 1) for x in r["passes"]], "steps", r["steps"], "accept", round(r["accept"], 3), "step_ms",
          round(r["step_ms"], 2))
