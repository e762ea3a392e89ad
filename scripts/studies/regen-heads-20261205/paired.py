"""Usage: python scripts/studies/regen-heads-20261205/paired.py. The four deep-pair heads by greedy tokens per step
on the same 128 held-out prompts (`python -m specdec.bench.suites.heads --num-prompts 128`): the heads shipped before
(results/eagle3-retrain-20261204/heads-128-prompts.json) and the two trained on the target's own text
(results/regen-heads-20261205/, each run with the old EAGLE head beside it: its rows are the same tokens, greedy
decoding being deterministic); the output is results/regen-heads-20261205/paired.jsonl. Prints each pair's ratio
and its paired-bootstrap 95 % interval, shape by shape, as JSON lines."""
import json
from pathlib import Path

from specdec.bench.suites.heads import paired_bootstrap

RESULTS = Path(__file__).resolve().parents[3] / "results"
here = RESULTS / "regen-heads-20261205"
rows = {}
for path, tag in ((RESULTS / "eagle3-retrain-20261204" / "heads-128-prompts.json", "corpus"),
                  (here / "heads-128-prompts-eagle-regen.json", "regen"),
                  (here / "heads-128-prompts-eagle3-regen.json", "regen")):
    for r in json.loads(path.read_text())["rows"]:
        kind, swapped = r["draft"].split("@")[0], "@" in r["draft"]
        name = f"{kind} ({tag if swapped else 'corpus'})"
        shape = (r["num_steps"], r["topk"], r["num_draft_tokens"])
        if (name, shape) in rows:  # the old EAGLE head again: it must be the same decode
            assert rows[name, shape]["tokens_by_prompt"] == r["tokens_by_prompt"], (name, shape)
        rows[name, shape] = r
pairs = [("eagle (corpus)", "eagle (regen)"), ("eagle3 (corpus)", "eagle3 (regen)"),
         ("eagle (corpus)", "eagle3 (regen)"), ("eagle (regen)", "eagle3 (regen)"),
         ("eagle (corpus)", "eagle3 (corpus)")]
for shape in sorted({s for _, s in rows}):
    out = {"shape": "S%d K%d W%d" % shape,
           "tokens_per_step": {n: rows[n, s]["tokens_per_step"] for n, s in sorted(rows) if s == shape},
           "identical": all(rows[n, s]["identical"] for n, s in rows if s == shape)}
    for a, b in pairs:
        ra, rb = rows[a, shape], rows[b, shape]
        out[f"{b} / {a}"] = paired_bootstrap(ra["tokens_by_prompt"], ra["steps_by_prompt"], rb["tokens_by_prompt"],
                                             rb["steps_by_prompt"])
    print(json.dumps(out))
