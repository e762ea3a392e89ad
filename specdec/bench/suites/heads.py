"""`python -m specdec.bench.suites.heads`: a pair's draft heads side by side by greedy accepted tokens per step, B = 1.

For each kind asked (default: the EAGLE and EAGLE-3 heads) and each shape (default: the chain S3, the chain S7 and
the tree S5 K4 W16), the mean accepted tokens per decode step over held-out prompts, and whether every output is
token-identical to target-only's. The pair is a shipped one (`--model`) or a directory `specdec zoo train --out`
wrote (`--dir`), so a retrained head is compared before it replaces the shipped one; `--swap KIND=DIR` takes one
kind's weights from another pair's directory (the retrain's) and names it `KIND@DIR` in the output. Acceptance
under greedy decoding is deterministic, so this needs no repeats; tokens/s are `specdec bench`'s rows.

What varies is the prompts: two heads a fraction of a percent apart on 16 prompts may swap places on the next 16.
So each row also keeps its per-prompt tokens and steps, and `paired` compares every draft with the first one asked,
shape by shape: the ratio of their tokens per step and its 95 % interval from a paired bootstrap over the prompts
(`paired_bootstrap`)."""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from ... import Engine, SamplingParams, SpecConfig, zoo
from ...draft_kinds import draft_kind
from ...models.ngram import NgramDraft
from ...zoo.corpus import heldout_prompts

DEFAULT_SHAPES = ("3", "7", "5,4,16")


def parse_shape(text: str) -> SpecConfig:
    """"S" (a chain) or "S,K,W" (a tree) -> SpecConfig, else ValueError naming the text."""
    try:
        nums = [int(x) for x in text.split(",")]
    except ValueError:
        nums = []
    if len(nums) not in (1, 3):
        raise ValueError(f"a shape is S or S,K,W (integers), got {text!r}")
    return SpecConfig(*nums)


def accepted_per_step(target, draft, spec: SpecConfig, prompts, base, max_new_tokens: int) -> dict:
    """-> mean accepted tokens per decode step over `prompts` (B = 1, greedy, reference ops) and whether every
    output equals `base`, target-only's outputs of the same prompts (None when no `base` is given)."""
    engine = Engine(target, draft, spec, max_batch=1, impl="reference")
    params = SamplingParams(max_new_tokens=max_new_tokens)
    outs = [engine.generate([p], params)[0] for p in prompts]
    lens = [a for o in outs for a in o.accept_lens]
    return {"tokens_per_step": round(sum(lens) / len(lens), 4), "steps": len(lens),
            "identical": None if base is None else all(o.token_ids == b.token_ids for o, b in zip(outs, base)),
            "tokens_by_prompt": [sum(o.accept_lens) for o in outs],
            "steps_by_prompt": [len(o.accept_lens) for o in outs]}


def paired_bootstrap(tokens_a, steps_a, tokens_b, steps_b, resamples: int = 2000, seed: int = 0) -> dict:
    """Per-prompt tokens and decode steps of drafts a and b on the same prompts -> b's tokens per step over a's
    (each pooled over the prompts) and its 95 % interval: the 2.5th and 97.5th percentiles of the same ratio over
    `resamples` bootstrap draws of the prompts, each draw taking both drafts' counts of the prompts it drew (paired,
    so what one prompt makes easy for both cancels)."""
    n = len(steps_a)
    if not n or any(len(x) != n for x in (tokens_a, tokens_b, steps_b)):
        raise ValueError(f"paired_bootstrap needs the same prompts (at least one) for both drafts, got "
                         f"{[len(x) for x in (tokens_a, steps_a, tokens_b, steps_b)]} counts")

    def ratio(idx):
        return (sum(tokens_b[i] for i in idx) / sum(steps_b[i] for i in idx)) / (
            sum(tokens_a[i] for i in idx) / sum(steps_a[i] for i in idx))

    rng = random.Random(seed)
    draws = sorted(ratio([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    return {"ratio": round(ratio(range(n)), 4), "low": round(draws[int(0.025 * (resamples - 1))], 4),
            "high": round(draws[int(0.975 * (resamples - 1))], 4)}


def paired_rows(rows: list[dict]) -> list[dict]:
    """`accepted_per_step` rows (with "draft" and the shape's fields) -> for every shape and every draft after the
    first one listed, `paired_bootstrap` against the first."""
    out = []
    first = rows[0]["draft"]
    for a in (r for r in rows if r["draft"] == first):
        shape = (a["num_steps"], a["topk"], a["num_draft_tokens"])
        for b in rows:
            if b["draft"] != first and (b["num_steps"], b["topk"], b["num_draft_tokens"]) == shape:
                out.append({"draft": b["draft"], "against": first, "num_steps": shape[0], "topk": shape[1],
                            "num_draft_tokens": shape[2],
                            **paired_bootstrap(a["tokens_by_prompt"], a["steps_by_prompt"], b["tokens_by_prompt"],
                                               b["steps_by_prompt"])})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.suites.heads", description=__doc__)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default=zoo.DEEP_NAME, help="zoo pair (default: %(default)s)")
    src.add_argument("--dir", default=None, help="a pair's directory (`specdec zoo train --out OUT --name N`: OUT/N)")
    p.add_argument("--kinds", default="eagle,eagle3",
                   help="comma-separated draft kinds of the pair, or ngram (ngram:PROB: its PROB match type) "
                        "(default: %(default)s)")
    p.add_argument("--swap", action="append", default=[], metavar="KIND=DIR",
                   help="also run KIND with the weights in DIR/KIND (another pair directory of the same target)")
    p.add_argument("--shapes", default=";".join(DEFAULT_SHAPES),
                   help="semicolon-separated shapes, S or S,K,W (default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=96)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    try:
        shapes = [parse_shape(s) for s in a.shapes.split(";")]
        swaps = [tuple(s.split("=", 1)) for s in a.swap]
        if any(len(s) != 2 or not s[1] for s in swaps):
            raise ValueError(f"--swap takes KIND=DIR, got {a.swap}")
    except ValueError as e:
        p.error(str(e))
    torch.set_num_threads(a.threads)
    bundle = zoo.load(a.model) if a.dir is None else zoo.load_dir(a.dir, Path(a.dir).name)
    drafts = {}
    for kind in a.kinds.split(","):
        if kind.split(":")[0] == "ngram":  # no weights: SGLang's default parameters, "ngram:PROB" its match type
            try:
                drafts[kind] = NgramDraft(match_type=kind.split(":", 1)[1] if ":" in kind else "BFS")
            except ValueError as e:
                p.error(str(e))
            continue
        if kind not in bundle.drafts:
            p.error(f"the pair {bundle.name} has no {kind!r} draft (it has {sorted(bundle.drafts)})")
        drafts[kind] = bundle.drafts[kind]
    for kind, d in swaps:
        if not (Path(d) / kind / "config.json").is_file():
            p.error(f"--swap {kind}={d}: no {Path(d) / kind / 'config.json'}")
        drafts[f"{kind}@{d}"] = draft_kind(kind).load(Path(d) / kind, bundle.target)
    prompts = heldout_prompts(a.num_prompts, a.prompt_len, seed=0)
    params = SamplingParams(max_new_tokens=a.max_new_tokens)
    base = [Engine(bundle.target, max_batch=1, impl="reference").generate([q], params)[0] for q in prompts]
    rows = [{"draft": name, "num_steps": s.num_steps, "topk": s.topk, "num_draft_tokens": s.num_draft_tokens,
             **accepted_per_step(bundle.target, d, s, prompts, base, a.max_new_tokens)}
            for name, d in drafts.items() for s in shapes]
    print(json.dumps({"pair": bundle.name, "threads": a.threads, "num_prompts": a.num_prompts,
                      "paired": paired_rows(rows), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
