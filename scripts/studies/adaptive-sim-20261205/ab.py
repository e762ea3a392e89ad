"""Usage, from the repository root: python scripts/studies/adaptive-sim-20261205/ab.py PAIR TUNED.json B REPEATS SET
(e.g. stdlib-byte-6l specdec/zoo/tuned/stdlib-byte-6l-eagle.json 1 5 mixed); its output is
results/adaptive-sim-20261205/ab-small-B1-mixed.jsonl.

Adaptive speculation with the margin (`AdaptiveShapes`' default) against adaptive without it (margin 0, the policy
before), side by side on a clock with target-only, the tuned shape and every static candidate of bucket B (the
static grid), on the tune check's prompts (32 x 48 tokens), taken in turn batch by batch. As `sim.py`, bucket B alone.
Each policy's figure is `held_out_ratio`: per pass, against the grid's best chosen on the other passes. One thread,
process CPU; one JSON line."""
import dataclasses
import json
import statistics
import sys

import torch

from specdec import zoo
from specdec.bench.tune.search import Measurer, batches_of, held_out_ratio, mixed_prompts
from specdec.tuning import AdaptiveShapes, TunedSpec, shape_name
from specdec.zoo.corpus import heldout_prompts, prose_prompts


def main():
    torch.set_num_threads(1)
    name, path, B, reps, set_name = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    b = zoo.load(name)
    tuned = TunedSpec.load(path)
    tuned = dataclasses.replace(tuned, buckets={B: tuned.bucket(B)})
    margin = tuned.with_adaptive(True)
    before = tuned.with_adaptive(True)
    object.__setattr__(before, "policy", lambda: AdaptiveShapes(before, margin=0.0))
    code = heldout_prompts(32, 96, seed=0)
    prompts = {"code": code, "mixed": mixed_prompts(code, prose_prompts(32, 96, seed=0))[:32]}[set_name]
    statics = [c.shape for c in tuned.bucket(B).candidates]
    keys = [None, *statics, tuned, before, margin]
    labels = ["target-only"] + [shape_name(s) for s in statics] + [
        f"tuned ({shape_name(tuned.bucket(B).shape)})", "adaptive, no margin (before)", "adaptive, margin"]
    m = Measurer(b.target, b.eagle, max_seq_len=96 + 48 + 64, max_new_tokens=48)
    res = m.decode_in_turn(keys, batches_of(prompts, B), reps)
    grid = {label: r["passes"] for label, r in zip(labels, res)
            if label != "target-only" and not label.startswith(("tuned", "adaptive"))}
    out = {"pair": name, "B": B, "set": set_name, "passes": reps, "threads": torch.get_num_threads()}
    for label, r in zip(labels, res):
        held = None if label == "target-only" else held_out_ratio(r["passes"], grid)
        out[label] = {"median": round(statistics.median(r["passes"]), 1), "passes": [round(x, 1) for x in r["passes"]],
                  "vs_best_static_other_passes": None if held is None else round(held, 3)}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
