"""The whole run: train the asked stages in order, store each, evaluate the stored weights, write the card."""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from ...draft_kinds import DRAFT_KINDS
from ...models import LlamaForCausalLM
from .. import SMALL_NAME, WEIGHTS_DIR, corpus, load_dir
from ...tokenizer import ByteTokenizer
from .card import read_card, shape_summary, write_card
from .evaluate import evaluate_bundle
from .hparams import DRAFTS, EXTRA_STAGES, STAGES, StageOpts, TargetShape, default_opts
from .loop import freeze, num_params
from .stages import train_target
from .storage import DRAFT_STORAGE, save_stored

def train_all(out=WEIGHTS_DIR, name: str = SMALL_NAME, seed: int = 0, stages=STAGES, shape: TargetShape | None = None,
              opts: dict[str, StageOpts] | None = None, command: str = "", log=print,
              eval_windows: int = 32, eval_len: int = 512) -> dict:


    """Train `stages` in order and write out/name/target/, a directory per draft kind (out/name/eagle/, ...) and
    out/name/card.json. A stage after `target` loads the existing target from out/name/target.
    -> the card (dict)."""
    out = Path(out)
    shape = shape or TargetShape()
    opts = opts or default_opts()
    root = out / name
    card = read_card(out, name)
    card.setdefault("name", name)
    card["tokenizer"] = {"type": "ByteTokenizer", "vocab_size": ByteTokenizer.vocab_size,
                         "bos_token_id": ByteTokenizer.bos_token_id, "eos_token_id": ByteTokenizer.eos_token_id}
    card["corpus"] = corpus.corpus_info()
    card["stored_dtype"] = "target float16; drafts " + DRAFT_STORAGE
    card.setdefault("training", {})
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if set(stages) == set(STAGES) or (stages and "command" not in card):
        # a whole run; a single stage (or a re-evaluation) keeps the record of the run it adds to
        card["seed"] = seed
        card["command"] = command
        card["environment"] = {"python": sys.version.split()[0], "torch": torch.__version__,
                               "machine": platform.machine(), "processor": platform.processor() or platform.machine(),
                               "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
        card["created"] = now
    target = None
    for stage in stages:
        if stage not in STAGES + EXTRA_STAGES:
            raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES + EXTRA_STAGES}")
        o = opts[stage]
        if stage == "target":
            log(f"== target: {asdict(shape)}")
            model, stats = train_target(shape, o, seed, log)
            stats["bytes_on_disk"] = save_stored(model, root / "target", draft=False)
            target = None
        else:
            if target is None:
                target = LlamaForCausalLM.from_pretrained(root / "target", device="cpu", dtype=torch.float32)
            freeze(target)
            model, stats = DRAFT_KINDS[stage].zoo.train(target, o, seed, log)
            stats["bytes_on_disk"] = save_stored(model, root / stage, draft=True)
        stats["parameters"] = num_params(model)
        stats.update(command=command, seed=seed, finished=now, torch_threads=torch.get_num_threads())
        card["training"][stage] = stats
        write_card(out, name, card)
        log(f"== {stage} done in {stats['train_seconds']:.0f}s")
    bundle = load_dir(root, name)
    log("== evaluating the stored weights on held-out windows")
    card["heldout"] = evaluate_bundle(bundle, eval_windows, eval_len)
    card["heldout_eval"] = {"windows": eval_windows, "length": eval_len, "seed": 4321}
    card["models"] = {}
    for key in ("target",) + DRAFTS + EXTRA_STAGES:
        m = getattr(bundle, key)
        if m is not None:
            card["models"][key] = {"parameters": num_params(m), **shape_summary(m.config)}
    card["total_train_seconds"] = round(sum(s.get("train_seconds", 0) for s in card["training"].values()), 1)
    card["total_bytes_on_disk"] = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    write_card(out, name, card)
    log(json.dumps(card["heldout"], indent=1))
    return card
