"""`python -m specdec.bench.suites.dflash`: a zoo pair's DFlash drafter beside its EAGLE head, at B = 1.

Prints, on held-out prompts, greedy: how acceptance falls off by block position (the fraction of steps that accept
at least j drafts, j = 1..S), the accepted tokens per step of the DFlash block and of the EAGLE chain S3 and tree
S5 K4 W16 (each checked token-identical to target-only), and one DFlash block forward against one EAGLE draft
forward and one target-only step (`acceptance.draft_step_cost`, process CPU time at the current thread count).
Tokens/s beside the other workers are `specdec bench`'s rows."""
from __future__ import annotations

import argparse
import json

import torch

from ... import Engine, SamplingParams, SpecConfig, zoo
from ...zoo.corpus import heldout_prompts
from .acceptance import draft_step_cost
from .heads import accepted_per_step


def block_acceptance(bundle, prompts, base, max_new_tokens: int, num_steps: int) -> dict:
    """-> per block position j, the fraction of decode steps accepting >= j drafts; the mean tokens per step; and
    whether every output equals `base`, target-only's of the same prompts."""
    params = SamplingParams(max_new_tokens=max_new_tokens)
    engine = Engine(bundle.target, bundle.dflash, SpecConfig(num_steps), max_batch=1, impl="reference")
    outs = [engine.generate([p], params)[0] for p in prompts]
    lens = [a for o in outs for a in o.accept_lens]
    return {"steps": len(lens), "tokens_per_step": round(sum(lens) / len(lens), 4),
            "accept_at_least": {j: round(sum(a > j for a in lens) / len(lens), 4) for j in range(1, num_steps + 1)},
            "identical": all(o.token_ids == b.token_ids for o, b in zip(outs, base))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.suites.dflash", description=__doc__)
    p.add_argument("--model", default=zoo.DEEP_NAME, help="zoo pair (default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=96)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    bundle = zoo.load(a.model)
    prompts = heldout_prompts(a.num_prompts, a.prompt_len, seed=0)
    S = bundle.dflash.block_size - 1
    params = SamplingParams(max_new_tokens=a.max_new_tokens)
    base = [Engine(bundle.target, max_batch=1, impl="reference").generate([p], params)[0] for p in prompts]
    chain, tree = (accepted_per_step(bundle.target, bundle.eagle, spec, prompts, base, a.max_new_tokens)
                   for spec in (SpecConfig(3), SpecConfig(5, 4, 16)))
    res = {"pair": bundle.name, "threads": a.threads, "dflash_block": S + 1,
           "dflash": block_acceptance(bundle, prompts, base, a.max_new_tokens, S),
           "eagle_chain_S3_tokens_per_step": chain["tokens_per_step"],
           "eagle_tree_S5K4W16_tokens_per_step": tree["tokens_per_step"],
           "eagle_identical": chain["identical"] and tree["identical"]}
    cost_prompts = heldout_prompts(4, 64, seed=0)
    eagle, dflash = (draft_step_cost(bundle.target, d, cost_prompts) for d in (bundle.eagle, bundle.dflash))
    res["cost"] = {"target_only_step_ms": eagle["target_only_step_ms"],
                   "eagle_draft_forward_ms": eagle["eagle_draft_forward_ms"],
                   "dflash_block_forward_ms": dflash["eagle_draft_forward_ms"],
                   "dflash_block_in_eagle_forwards": round(dflash["eagle_draft_forward_ms"]
                                                           / eagle["eagle_draft_forward_ms"], 3)}
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
