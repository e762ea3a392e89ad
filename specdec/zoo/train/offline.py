"""Drafts for a target in one command: record its answers to a prompt file, train each kind on them, write the
drafts with their card. Run it again and it continues where it stopped (sealed shards are kept, training resumes
from its checkpoints), so it suits a GPU job that a scheduler may stop as well as a CPU left running: with
`--device cuda` the target records and the drafts train there.

`python -m specdec.zoo.train.offline --model NAME|FILE.gguf|HF_DIR --prompts TRAIN.jsonl --heldout-prompts
HELDOUT.jsonl --kinds eagle3,eagle --device cuda --out DIR` writes DIR/recordings/{train,heldout} and DIR/drafts.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import record
from .for_target import TARGET_DRAFT_KINDS
from .for_target import main as train_draft_main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.zoo.train.offline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the target: a zoo name, a .gguf file or a Hugging Face directory")
    p.add_argument("--prompts", required=True, help="the training prompt file (`specdec.prompt_files`)")
    p.add_argument("--heldout-prompts", default=None, help="a held-out prompt file, for the card's agreement")
    p.add_argument("--heldout-limit", type=int, default=64, help="held-out prompts to record (default 64)")
    p.add_argument("--limit", type=int, default=0, help="the first N training prompts only (0: all)")
    p.add_argument("--kinds", default=",".join(TARGET_DRAFT_KINDS),
                   help="comma-separated (default: every kind trained for a target, %(default)s)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32, help="recording batch size")
    p.add_argument("--steps", type=int, default=None, help="optimiser steps per kind (default: the kind's own)")
    p.add_argument("--train-batch-size", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--minutes", type=float, default=0, help="a time budget for the whole command (0: none)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    bad = [k for k in kinds if k not in TARGET_DRAFT_KINDS]
    if bad or not kinds:
        p.error(f"--kinds takes {', '.join(TARGET_DRAFT_KINDS)}, got {a.kinds!r}")
    t0, out = time.time(), Path(a.out)
    rec = ["--model", a.model, "--device", a.device, "--max-new-tokens", str(a.max_new_tokens),
           "--batch-size", str(a.batch_size)]
    record.main(rec + ["--prompts", a.prompts, "--limit", str(a.limit), "--out", str(out / "recordings" / "train")])
    if a.heldout_prompts:
        record.main(rec + ["--prompts", a.heldout_prompts, "--limit", str(a.heldout_limit),
                           "--out", str(out / "recordings" / "heldout")])
    for kind in kinds:
        if (out / "drafts" / kind / "config.json").is_file():
            print(f"{kind}: already trained in {out / 'drafts' / kind}; remove it to train it again", file=sys.stderr)
            continue
        left = a.minutes - (time.time() - t0) / 60 if a.minutes else 0
        if a.minutes and left <= 0:
            print(f"the time budget ran out before {kind}; run the same command again to continue", file=sys.stderr)
            return 3
        argv_k = ["--model", a.model, "--recordings", str(out / "recordings" / "train"), "--kind", kind,
                  "--out", str(out / "drafts"), "--device", a.device, "--resume",
                  "--checkpoint-dir", str(out / "checkpoints")]
        if a.heldout_prompts:
            argv_k += ["--heldout", str(out / "recordings" / "heldout")]
        for flag, value in (("--steps", a.steps), ("--batch-size", a.train_batch_size), ("--seq-len", a.seq_len),
                            ("--minutes", left or None)):
            if value:
                argv_k += [flag, str(value)]
        rc = train_draft_main(argv_k)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
