"""`python -m specdec.bench.suites.dflash_scaling`: what a DFlash drafter's acceptance gains from more training,
more layers, a wider MLP or another block size, measured on a zoo pair.

Each variant is the zoo's DFlash stage (`train_dflash`, the shipped recipe) with one setting changed, trained from
the same seed on the pair's stored (frozen) target, then measured the way the model card measures the shipped
drafter (`evaluate_dflash` on the card's held-out windows): top-1 agreement with the target and `accept_prefix`, the
fraction of blocks whose first j positions all agree, by block position. `expected_tokens_per_step` is
1 + the sum of `accept_prefix` over the block: the accepted length a greedy chain verify would get on that
text, teacher-forced. Its block forward's cost is measured as the card measures it (`draft_cost.step_cost`: process
CPU time at one thread, in target-only steps). One `DFlashScalingRow` per variant, written as it finishes, to
`results/dflash-scaling-<run id>.csv`; nothing is saved to the zoo.
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import zoo
from ...draft_kinds import DRAFT_KINDS
from ...zoo.corpus import heldout_prompts
from ...zoo.train.evaluate import heldout_tensor, evaluate_dflash
from ...zoo.train.hparams import StageOpts
from ...zoo.train.block_stages import train_dflash
from ..common import RowWriter, Run, RunRow
from .draft_cost import step_cost


@dataclass
class DFlashScalingRow(RunRow):
    pair: str
    variant: str
    steps: int
    num_layers: int
    block_size: int
    intermediate_size: int
    tokens_seen: int  # training tokens: steps x batch_size x seq_len
    train_cpu_seconds: float
    final_loss: float
    agreement_by_position: str  # JSON list, block positions 1..bs-1
    accept_prefix_by_position: str  # JSON list: the fraction of blocks whose positions 1..j all agree
    expected_tokens_per_step: float  # 1 + sum(accept_prefix): a greedy chain verify's accepted length, teacher-forced
    block_forward_in_target_steps: float
    block_forward_ms: float


#: name -> the changes to the shipped stage's options (`steps` or keys of `extra`)
VARIANTS = {
    "shipped": {},
    "steps x2": {"steps": 2},
    "steps x4": {"steps": 4},
    "3 layers": {"num_layers": 3},
    "MLP x2": {"intermediate_size": 2},
    "block 4": {"block_size": 4},
}


def variant_opts(base: StageOpts, change: dict, target_intermediate: int) -> StageOpts:
    """The shipped stage's options with one variant's change: `steps` and `intermediate_size` multiply, the rest
    replace."""
    opts = copy.deepcopy(base)
    for key, value in change.items():
        if key == "steps":
            opts.steps = base.steps * value
        elif key == "intermediate_size":
            opts.extra[key] = target_intermediate * value
        else:
            opts.extra[key] = value
    return opts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.suites.dflash_scaling", description=__doc__)
    p.add_argument("--model", default=zoo.DEEP_NAME, help="zoo pair (default: %(default)s)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    p.add_argument("--eval-windows", type=int, default=32, help="held-out windows, as the model card (32)")
    p.add_argument("--eval-len", type=int, default=512)
    p.add_argument("--out", default="results")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-scale", type=float, default=1.0,
                   help="multiply every variant's training steps (a smoke run: 0.01)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="training windows per step, for every variant (default: the shipped stage's; a smoke run: 1)")
    a = p.parse_args(argv)
    names = [v.strip() for v in a.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    if a.batch_size is not None and a.batch_size < 1:
        p.error(f"--batch-size must be at least 1, got {a.batch_size}")
    torch.set_num_threads(1)
    bundle = zoo.load(a.model)
    target = bundle.target
    base = StageOpts(**copy.deepcopy(dict(DRAFT_KINDS["dflash"].zoo.opts)))
    windows = heldout_tensor(a.eval_windows, a.eval_len + 3)
    prompts = heldout_prompts(4, 64, seed=0)
    run = Run("dflash-scaling", "cpu")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    writer = RowWriter(f"{a.out}/dflash-scaling-{run.run_id}.csv", DFlashScalingRow)
    print(f"writing {writer.path}", flush=True)
    for name in names:
        opts = variant_opts(base, VARIANTS[name], target.config.intermediate_size)
        opts.steps = max(1, round(opts.steps * a.step_scale))
        opts.warmup = min(opts.warmup, opts.steps)
        if a.batch_size is not None:
            opts.batch_size = a.batch_size
        t0 = time.time()
        model, stats = train_dflash(target, opts, seed=a.seed, log=lambda *m: None)
        held = evaluate_dflash(target, model, windows, seq_len=a.eval_len)
        cost = step_cost(target, model, prompts)
        agree = [held[k]["top1_agreement"] for k in sorted(held, key=lambda k: int(k[3:]))]
        prefix = [held[k]["accept_prefix"] for k in sorted(held, key=lambda k: int(k[3:]))]
        row = DFlashScalingRow(
            **run.prefix(), pair=bundle.name, variant=name, steps=opts.steps, num_layers=model.config.num_hidden_layers,
            block_size=model.block_size, intermediate_size=model.config.intermediate_size,
            tokens_seen=opts.steps * opts.batch_size * opts.seq_len, train_cpu_seconds=stats["train_cpu_seconds"],
            final_loss=stats["final_train_loss_ema"],
            agreement_by_position=json.dumps(agree), accept_prefix_by_position=json.dumps(prefix),
            expected_tokens_per_step=round(1 + sum(prefix), 4),
            block_forward_in_target_steps=cost["draft_forward_in_target_only_steps"],
            block_forward_ms=cost["draft_forward_ms"])
        writer.write(row)
        print(f"{name:10s} steps={opts.steps} layers={row.num_layers} block={row.block_size} "
              f"inter={row.intermediate_size}: expected {row.expected_tokens_per_step} tokens/step, agreement {agree}, "
              f"block forward {row.block_forward_in_target_steps} target steps, "
              f"{stats['train_cpu_seconds']:.0f} CPU s ({time.time() - t0:.0f} s wall)", flush=True)
    writer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
