"""What one draft step of a shipped draft costs against one target-only step, written onto its zoo card.

A bench step, not a trainer step: it decodes through the engine, which sits above the zoo's trainer. `specdec zoo
train` runs it after the stages it trained (for the kinds whose card states a cost, `ZooStage.card_cost`); `specdec
bench --suite draft-cost --model NAME` re-measures a pair and rewrites its card and MODEL_CARD.md.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from .acceptance import draft_step_cost
from ... import zoo
from ...draft_kinds import DRAFT_KINDS
from ...zoo.corpus import heldout_prompts
from ...zoo.train.card import MODEL_CARD, read_card, render_model_cards, write_card
from ...zoo import WEIGHTS_DIR, names


def step_cost(target, draft, prompts) -> dict:
    """One draft step of `draft` (an EAGLE-style forward, or a block drafter's block forward) against one target-only
    decode step, measured as the card measures drafts (`draft_step_cost`: B = 1, process CPU time) at one thread,
    with the machine's load (other processes slow both steps alike, so the ratio is what carries)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cost = draft_step_cost(target, draft, prompts)
    finally:
        torch.set_num_threads(threads)
    return {"threads": cost["threads"], "target_only_step_ms": cost["target_only_step_ms"],
            "draft_forward_ms": cost["eagle_draft_forward_ms"],
            "draft_forward_in_target_only_steps": cost["draft_forward_in_target_only_steps"],
            "load_average_1min": round(os.getloadavg()[0], 2), "cpu_count": os.cpu_count()}


def record_step_costs(out, name: str, kinds=None, num_prompts: int = 4, log=print) -> dict[str, dict]:
    """Measure the step cost of each of `kinds` (default: every kind whose stage has `card_cost`) that the pair
    `name` under the weights root `out` has trained, and store it as `card.json`'s training[kind]["step_cost"].
    -> {kind: cost}. Prompts: `num_prompts` held-out prompts of 64 bytes."""
    out = Path(out)
    card = read_card(out, name)
    if not card:
        raise ValueError(f"{out / name}: no card.json (train the pair first)")
    kinds = [k for k, kind in DRAFT_KINDS.items() if kind.zoo is not None and kind.zoo.card_cost] \
        if kinds is None else list(kinds)
    trained = [k for k in kinds if k in card.get("training", {}) and (out / name / k / "config.json").is_file()]
    if not trained:
        return {}
    bundle = zoo.load_dir(out / name, name)
    prompts = heldout_prompts(num_prompts, 64, seed=0)
    costs = {}
    for kind in trained:
        costs[kind] = card["training"][kind]["step_cost"] = step_cost(bundle.target, getattr(bundle, kind), prompts)
        log(f"[{kind}] step cost {costs[kind]}")
    write_card(out, name, card)
    return costs


def record_trained_step_costs(out, name: str, stages, num_prompts: int) -> None:
    """`specdec zoo train`'s step after training: the step costs of the stages just trained whose card states one."""
    kinds = [k for k in stages if k in DRAFT_KINDS and DRAFT_KINDS[k].zoo and DRAFT_KINDS[k].zoo.card_cost]
    if kinds:
        record_step_costs(out, name, kinds, num_prompts)


def main_draft_cost(args) -> int:
    """`specdec bench --suite draft-cost`: re-measure the shipped pairs' card costs (`--model`, auto: every pair) and
    rewrite their cards and MODEL_CARD.md."""
    for name in names() if args.model == "auto" else [args.model]:
        record_step_costs(WEIGHTS_DIR, name, num_prompts=args.num_prompts)
    MODEL_CARD.write_text(render_model_cards([read_card(WEIGHTS_DIR, n) for n in names()]))
    print(f"wrote the cards of {', '.join(names())} and {MODEL_CARD}")
    return 0
