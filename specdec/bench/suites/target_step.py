"""One decode step's process CPU time, side by side for several source trees of specdec (a change and the commit
before it), in one run: `python -m specdec.bench.suites.target_step --trees BEFORE,AFTER`. Target-only by default; with
`--draft eagle --spec 5,2,12` a speculative worker's step (the pair's zoo draft of that name, that shape).

Each tree is timed in a fresh process (`PYTHONPATH=<tree>`), the trees alternating round by round so that the
machine's drift falls on both alike. A process decodes held-out prompts of the asked pair at B = 1 on the reference
path and takes a decode step's CPU time as the difference of a long and a short decode over the decode steps they
differ by (the prefill cancels), as `specdec.bench.draft_step_cost` does; the row is the median over its repeats.
With `--transformers`, transformers' greedy target-only `generate` on the pair's target directory is timed the same
way in every round. Writes results/target-step-<run_id>.csv: one row per (tree, round), and prints each tree's
median over rounds (and its speed relative to transformers': for a speculative worker, per decode step, not per
token).
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

from ...config import SpecConfig

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

#: specdec's setup: only the public API, present in every tree (argv 5 and 6: the draft's bundle name and the
#: shape "S,K,W", or "-" for target-only)
_MEASURE = r"""
import json, sys, time, torch
torch.set_num_threads(1)
from specdec import Engine, SamplingParams, SpecConfig, zoo
from specdec.zoo.corpus import heldout_prompts
name, n_prompts, long_n, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
bundle = zoo.load(name)
draft = None if sys.argv[5] == "-" else getattr(bundle, sys.argv[5])
spec = None if draft is None else SpecConfig(*(int(v) for v in sys.argv[6].split(",")))
prompts = heldout_prompts(n_prompts, 64, seed=0)
engine = Engine(bundle.target, draft=draft, spec=spec, max_batch=1, max_seq_len=64 + long_n + 64, impl="reference")
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


def measure(tree: str, model: str, prompts: int, tokens: int, repeats: int, script: str = _MEASURE,
            draft: str | None = None, spec: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()), OMP_NUM_THREADS="1")
    args = [model, str(prompts), str(tokens), str(repeats), draft or "-", spec or "-"]
    out = subprocess.run([sys.executable, "-c", script, *args], env=env,
                         capture_output=True, text=True, check=True, cwd=str(Path(tree).resolve()))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.suites.target_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", required=True, help="comma-separated source trees (each holds specdec/ and reference/)")
    p.add_argument("--labels", default=None, help="comma-separated names of the trees (default: their paths)")
    p.add_argument("--model", default="stdlib-byte-24l")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=48, help="new tokens of the long decode")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="results")
    p.add_argument("--transformers", action="store_true",
                   help="also time transformers' greedy target-only generate on the pair's target, in every round")
    p.add_argument("--draft", default=None,
                   help="time a speculative worker's step instead: the zoo bundle's draft of this name (eagle, "
                        "eagle3, draft_lm, mtp, ...), with --spec")
    p.add_argument("--spec", default=None, help="the worker's shape as num_steps,topk,num_draft_tokens (with --draft)")
    a = p.parse_args(argv)
    if (a.draft is None) != (a.spec is None):
        p.error("--draft and --spec go together")
    if a.spec is not None:
        try:
            shape = [int(v) for v in a.spec.split(",")]
        except ValueError:
            shape = []
        if len(shape) != 3:
            p.error(f"--spec must be num_steps,topk,num_draft_tokens (three integers), got {a.spec!r}")
        SpecConfig(*shape)  # a bad shape is refused here, before any tree runs
    worker = "target-only" if a.draft is None else f"{a.draft} S{shape[0]} K{shape[1]} W{shape[2]}"
    trees = a.trees.split(",")
    labels = a.labels.split(",") if a.labels else trees
    scripts = [_MEASURE] * len(trees)
    if a.transformers:  # it loads the zoo through the first tree
        trees, labels, scripts = trees + trees[:1], labels + [TRANSFORMERS], scripts + [_MEASURE_TRANSFORMERS]
    run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    rows = []
    for r in range(a.rounds):
        for tree, label, script in zip(trees, labels, scripts):
            spec_worker = script is _MEASURE
            m = measure(tree, a.model, a.prompts, a.tokens, a.repeats, script,
                        a.draft if spec_worker else None, a.spec if spec_worker else None)
            rows.append({"run_id": run_id, "tree": label, "round": r, "model": a.model, "threads": 1,
                         "worker": worker if spec_worker else "target-only",
                         "decode_step_ms": round(m["step_ms"], 4),
                         "load_average_1min": round(os.getloadavg()[0], 2)})
            print(json.dumps(rows[-1]), flush=True)
    path = Path(a.out) / f"target-step-{run_id}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    medians = {label: statistics.median(r["decode_step_ms"] for r in rows if r["tree"] == label)
               for label in labels}
    for label, ms in medians.items():
        versus = f" ({medians[TRANSFORMERS] / ms:.3f}x transformers' speed)" if TRANSFORMERS in medians else ""
        kind = "target-only" if label == TRANSFORMERS else worker
        print(f"{label}: median {ms:.4f} ms per {kind} decode step{versus}")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
