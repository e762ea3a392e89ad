"""Usage, from the repository root:
python scripts/studies/adaptive-pricing-20261204/ab.py PAIR TUNED.json SIZES REPEATS SETS
(e.g. stdlib-byte-6l results/adaptive-pricing-20261204/tuned-small.json 16,1 7,3 mixed); its output is
results/adaptive-pricing-20261204/ab-small.jsonl.

Adaptive with each candidate priced by its own confirm run (the file as tuned) against adaptive with the prices
refitted by the linear cost model over the bucket's candidates, side by side with the tuned shape, target-only and
the chains, on the tune check's prompt sets. One thread, process CPU; prints JSON lines."""
import dataclasses
import json
import statistics
import sys

import torch

from specdec import zoo
from specdec.bench.tune.search import Measurer, batches_of, fit_cost_model, held_out_ratio, mixed_prompts, predict_step_ms
from specdec.ops.contract import NO_DRAFT
from specdec.tuning import Bucket, TunedSpec, shape_name
from specdec.zoo.corpus import heldout_prompts, prose_prompts

def candidate_step_ms(confirmed: dict, no_draft_ms: float) -> dict:
    """The tried (and reverted) pricing: each drafting candidate's full-batch step by the linear cost model fitted
    to the bucket's candidates (the tuner's version also took its probes), never below no draft; no draft as is."""
    coef = fit_cost_model({s: ms for s, ms in confirmed.items() if s != NO_DRAFT})
    return {s: no_draft_ms if s == NO_DRAFT else max(predict_step_ms(coef, s), no_draft_ms) for s in confirmed}


torch.set_num_threads(1)
name, path = sys.argv[1], sys.argv[2]
sizes = [int(x) for x in sys.argv[3].split(",")]
repeats = [int(x) for x in sys.argv[4].split(",")]
sets = sys.argv[5].split(",")
b = zoo.load(name)
tuned = TunedSpec.load(path)
refit = {}
for B, bucket in tuned.buckets.items():
    confirmed = {c.shape: c.step_ms for c in bucket.candidates}
    no_draft = confirmed.get(NO_DRAFT, min(confirmed.values()))
    prices = candidate_step_ms(confirmed, no_draft)
    refit[B] = Bucket(bucket.shape, tuple(dataclasses.replace(c, step_ms=round(prices[c.shape], 4))
                                          for c in bucket.candidates))
    print(json.dumps({"bucket": B, "prices": {shape_name(c.shape): [c.step_ms, refit[B].candidates[i].step_ms]
                                               for i, c in enumerate(bucket.candidates)}}), flush=True)
refitted = dataclasses.replace(tuned, buckets=refit, adaptive=True)
adaptive = tuned.with_adaptive(True)
code = heldout_prompts(32, 96, seed=0)
prompt_sets = {"code": code, "mixed": mixed_prompts(code, prose_prompts(32, 96, seed=0))[:32]}
m = Measurer(b.target, b.eagle, max_seq_len=96 + 48 + 64, max_new_tokens=48)
statics = [(5, 1, 6), (4, 1, 5), (3, 1, 4), (2, 1, 3), (5, 4, 16)]
for set_name in sets:
    for B, reps in zip(sizes, repeats):
        keys = [None, *statics, tuned, adaptive, refitted]
        labels = ["target-only"] + [shape_name(s) for s in statics] + [
            f"tuned ({shape_name(tuned.bucket(B).shape)})", "adaptive (as tuned)", "adaptive (refitted)"]
        res = m.decode_in_turn(keys, batches_of(prompt_sets[set_name], B), reps)
        grid = {label: r["passes"] for label, r in zip(labels, res)
                if label != "target-only" and not label.startswith(("tuned", "adaptive"))}
        out = {"set": set_name, "B": B, "passes": reps, "threads": torch.get_num_threads()}
        for label, r in zip(labels, res):
            held = None if label == "target-only" else held_out_ratio(r["passes"], grid)  # None with one pass
            out[label] = {"median": round(statistics.median(r["passes"]), 1),
                          "passes": [round(x, 1) for x in r["passes"]],
                          "vs_best_static_other_passes": None if held is None else round(held, 3)}
        print(json.dumps(out), flush=True)
