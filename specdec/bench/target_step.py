"""One target-only decode step's process CPU time, side by side for several source trees of specdec (a change and
the commit before it), in one run: `python -m specdec.bench.target_step --trees BEFORE,AFTER`.

Each tree is timed in a fresh process (`PYTHONPATH=<tree>`), the trees alternating round by round so that the
machine's drift falls on both alike. A process decodes held-out prompts of the asked pair at B = 1 on the reference
path and takes a decode step's CPU time as the difference of a long and a short decode over the decode steps they
differ by (the prefill cancels), as `specdec.bench.draft_step_cost` does; the row is the median over its repeats.
With `--transformers`, transformers' greedy `generate` on the pair's target directory is timed the same way in
every round. Writes results/target-step-<run_id>.csv: one row per (tree, round), and prints each tree's median over
rounds (and its speed relative to transformers').
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: what each timed process runs after its setup, which defines `prompts` and `decode(prompt, n) -> decode steps`:
#: a decode step's CPU time as the difference of a long and a 2-token decode (the prefill cancels)
_TIMING = r"""
decode(prompts[0], 4)
def run(n):
    cpu = steps = 0
    for p in prompts:
        c0 = time.process_time()
        steps += decode(p, n)
        cpu += time.process_time() - c0
    return cpu, steps
per_step = []
for _ in range(repeats):
    (cl, sl), (cs, ss) = run(long_n), run(2)
    per_step.append((cl - cs) / (sl - ss))
per_step.sort()
print(json.dumps({"step_ms": 1e3 * per_step[len(per_step) // 2], "steps": sl - ss}))
"""

#: specdec's setup: only the public API, present in every tree
_MEASURE = r"""
import json, sys, time, torch
torch.set_num_threads(1)
from specdec import Engine, SamplingParams, zoo
from specdec.zoo.corpus import heldout_prompts
name, n_prompts, long_n, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
target = zoo.load(name).target
prompts = heldout_prompts(n_prompts, 64, seed=0)
engine = Engine(target, max_batch=1, max_seq_len=64 + long_n + 64, impl="reference")
def decode(p, n):
    engine.generate([p], SamplingParams(max_new_tokens=n))
    return engine.last_stats.num_decode_steps
""" + _TIMING

#: transformers' greedy `generate` on the pair's target directory (its decode steps: one per new token after the
#: first, which the prefill gives)
_MEASURE_TRANSFORMERS = r"""
import json, sys, time, torch
torch.set_num_threads(1)
from transformers import LlamaForCausalLM
from specdec import zoo
from specdec.zoo.corpus import heldout_prompts
name, n_prompts, long_n, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = LlamaForCausalLM.from_pretrained(zoo.load(name).path / "target", dtype=torch.float32).eval()
prompts = heldout_prompts(n_prompts, 64, seed=0)
def decode(p, n):
    with torch.inference_mode():
        model.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return n - 1
""" + _TIMING

#: the label of transformers' row (`--transformers`)
TRANSFORMERS = "transformers"


def measure(tree: str, model: str, prompts: int, tokens: int, repeats: int, script: str = _MEASURE) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", script, model, str(prompts), str(tokens), str(repeats)], env=env,
                         capture_output=True, text=True, check=True, cwd=str(Path(tree).resolve()))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.target_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", required=True, help="comma-separated source trees (each holds specdec/ and reference/)")
    p.add_argument("--labels", default=None, help="comma-separated names of the trees (default: their paths)")
    p.add_argument("--model", default="stdlib-byte-24l")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=48, help="new tokens of the long decode")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="results")
    p.add_argument("--transformers", action="store_true",
                   help="also time transformers' greedy generate on the pair's target, in every round")
    a = p.parse_args(argv)
    trees = a.trees.split(",")
    labels = a.labels.split(",") if a.labels else trees
    scripts = [_MEASURE] * len(trees)
    if a.transformers:  # it loads the zoo through the first tree
        trees, labels, scripts = trees + trees[:1], labels + [TRANSFORMERS], scripts + [_MEASURE_TRANSFORMERS]
    run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    rows = []
    for r in range(a.rounds):
        for tree, label, script in zip(trees, labels, scripts):
            m = measure(tree, a.model, a.prompts, a.tokens, a.repeats, script)
            rows.append({"run_id": run_id, "tree": label, "round": r, "model": a.model, "threads": 1,
                         "target_only_step_ms": round(m["step_ms"], 4),
                         "load_average_1min": round(os.getloadavg()[0], 2)})
            print(json.dumps(rows[-1]), flush=True)
    path = Path(a.out) / f"target-step-{run_id}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    medians = {label: statistics.median(r["target_only_step_ms"] for r in rows if r["tree"] == label)
               for label in labels}
    for label, ms in medians.items():
        versus = f" ({medians[TRANSFORMERS] / ms:.3f}x transformers' speed)" if TRANSFORMERS in medians else ""
        print(f"{label}: median {ms:.4f} ms per target-only decode step{versus}")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
