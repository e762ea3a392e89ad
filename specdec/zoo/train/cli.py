"""`specdec zoo train` (and `python -m specdec.zoo.train`): the argparse front end of `train_all`."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from .. import SMALL_NAME, WEIGHTS_DIR, names
from ...tokenizer import ByteTokenizer
from ...cli_args import HelpFormatter, about  # HelpFormatter: each default stated once
from .card import MODEL_CARD, read_card, render_model_card, render_model_cards
from .hparams import EXTRA_STAGES, STAGES, TargetShape, default_opts
from .pipeline import train_all
from .regenerate import load_segments

def main(argv=None, after_training=None) -> int:
    """`specdec zoo train`. after_training(out, name, stages, cost_prompts), when given, runs after the stages
    trained and before the model card is written (`specdec zoo train` measures the drafts' step costs there, a bench
    step the trainer does not import)."""
    d = default_opts()
    p = argparse.ArgumentParser(prog="specdec zoo train", formatter_class=HelpFormatter,
                                description="Train the zoo's checkpoints on the Python standard library (a target, "
                                            "then its drafts: EAGLE and EAGLE-3 heads, MTP layers in two styles, a "
                                            "standalone draft LM, a DFlash drafter). Prints how long the run will "
                                            "take before it starts, and a progress bar per stage. Example: specdec "
                                            "zoo train --out /tmp/zoo --name my-pair --stage eagle")
    p.add_argument("--out", default=None, help="weights root (default: the package's own, specdec/zoo/weights)")
    p.add_argument("--name", default=SMALL_NAME, help="the pair's directory under --out")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights' init and of the training windows")
    p.add_argument("--stage", default="all", choices=("all",) + STAGES + EXTRA_STAGES + ("eval",),
                   help=f"train every stage ({', '.join(EXTRA_STAGES) or 'none'} only when named), one stage (later "
                        "stages read the stored target), or only "


                        "re-measure the held-out metrics of the stored weights and rewrite the card")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--no-amp", action="store_true", help="train in fp32 instead of bf16 autocast")
    for st in STAGES + EXTRA_STAGES:
        p.add_argument(f"--{st.replace('_', '-')}-steps", type=int, default=d[st].steps,
                       help=f"optimiser steps of the {st} stage")
    p.add_argument("--batch-size", type=int, default=None,
                   help="windows per step, every stage run (default: each stage's own; the target's is "
                        f"{d['target'].batch_size})")
    p.add_argument("--seq-len", type=int, default=None,
                   help=f"bytes per window, every stage run (default: each stage's own; the target's is "
                        f"{d['target'].seq_len})")
    p.add_argument("--layers", type=int, default=TargetShape.num_hidden_layers, help="the target's decoder layers")
    p.add_argument("--hidden", type=int, default=TargetShape.hidden_size, help="the target's hidden size")
    p.add_argument("--intermediate", type=int, default=TargetShape.intermediate_size,
                   help="the target's MLP intermediate size")
    p.add_argument("--heads", type=int, default=TargetShape.num_attention_heads, help="the target's attention heads")
    p.add_argument("--kv-heads", type=int, default=TargetShape.num_key_value_heads,
                   help="the target's key-value heads (grouped-query attention)")
    p.add_argument("--eagle-unroll", type=int, default=d["eagle"].extra["unroll"],
                   help="unrolled training-time-test passes of the EAGLE head")
    p.add_argument("--eagle3-unroll", type=int, default=d["eagle3"].extra["unroll"],
                   help="unrolled training-time-test passes of the EAGLE-3 head")
    p.add_argument("--eagle3-vocab", type=int,
                   default=d["eagle3"].extra.get("draft_vocab_size", ByteTokenizer.vocab_size),
                   help="the EAGLE-3 head's draft vocabulary: this many most frequent ids (default: %(default)s, "
                        "the whole vocabulary)")
    p.add_argument("--eagle3-layers", default=None,
                   help="the EAGLE-3 head's feature layers, comma-separated target layer indices whose input it reads "
                        "(the number of target layers: the last layer's output; default: low, middle and high as "
                        "`zoo_feature_layers` picks them)")
    p.add_argument("--eagle3-w-reg", type=float, default=0.0,
                   help="weight of EAGLE's hidden-state regression in the EAGLE-3 loss (0: the paper's cross-entropy "
                        "only)")
    p.add_argument("--eagle3-fc-norm", action="store_true",
                   help="one RMSNorm per feature before the EAGLE-3 head's fc (SGLang's fc_norm; default: the paper's "
                        "raw features)")
    p.add_argument("--regen-data", default=None, metavar="A.npy,B.npy",
                   help="train the EAGLE and EAGLE-3 heads on these files of the target's own continuations "
                        "(`python -m specdec.zoo.train.regenerate`) instead of corpus windows")
    p.add_argument("--cost-prompts", type=int, default=4,
                   help="held-out prompts over which `specdec zoo train` measures, after training, the step cost of "
                        "each trained draft whose card states one (the draft LM, DFlash) against the target's "
                        "(0: not measured; `python -m specdec.zoo.train` never measures: run `specdec bench --suite "
                        "draft-cost`)")
    p.add_argument("--eval-windows", type=int, default=32, help="held-out windows for the card's metrics")
    p.add_argument("--eval-len", type=int, default=512, help="bytes per held-out window")
    p.add_argument("--model-card", default=None,
                   help="also write the Markdown model card here (default: specdec/zoo/MODEL_CARD.md when --out "
                        "is the package's weights directory)")
    a = p.parse_args(argv)
    a.out = a.out or str(WEIGHTS_DIR)
    torch.set_num_threads(a.threads)
    opts = default_opts()
    for st in STAGES + EXTRA_STAGES:
        o = opts[st]
        o.steps = getattr(a, f"{st}_steps")
        o.batch_size = o.batch_size if a.batch_size is None else a.batch_size
        o.seq_len = o.seq_len if a.seq_len is None else a.seq_len
        o.amp = not a.no_amp
        o.warmup = min(o.warmup, max(1, o.steps // 10))
    opts["eagle"].extra["unroll"] = a.eagle_unroll
    opts["eagle3"].extra["unroll"] = a.eagle3_unroll
    if not 1 <= a.eagle3_vocab <= ByteTokenizer.vocab_size:  # checked before hours of earlier stages
        p.error(f"--eagle3-vocab must be in [1, {ByteTokenizer.vocab_size}] (the byte vocabulary), "
                f"got {a.eagle3_vocab}")
    opts["eagle3"].extra["draft_vocab_size"] = a.eagle3_vocab
    if a.eagle3_layers is not None:
        opts["eagle3"].extra["feature_layers"] = _feature_layers(p, a.eagle3_layers)
    if not a.eagle3_w_reg >= 0:
        p.error(f"--eagle3-w-reg must be >= 0, got {a.eagle3_w_reg}")
    opts["eagle3"].extra["w_reg"] = a.eagle3_w_reg
    if a.regen_data is not None:
        try:
            load_segments(a.regen_data)  # checked before hours of earlier stages
        except ValueError as e:
            p.error(f"--regen-data: {e}")
        for st in ("eagle", "eagle3"):
            opts[st].extra["regen_data"] = a.regen_data
    if a.eagle3_fc_norm:
        opts["eagle3"].extra["fc_norm"] = True
    shape = TargetShape(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                        num_key_value_heads=a.kv_heads, intermediate_size=a.intermediate)
    stages = STAGES if a.stage == "all" else () if a.stage == "eval" else (a.stage,)
    print(estimate(stages, opts, shape), file=sys.stderr)
    command = "specdec zoo train " + " ".join(argv if argv is not None else sys.argv[1:])
    card = train_all(a.out, a.name, a.seed, stages, shape, opts, command.strip(),
                     log=lambda s: tqdm.write(s, file=sys.stderr), eval_windows=a.eval_windows,
                     eval_len=a.eval_len)
    if after_training is not None and a.cost_prompts:
        after_training(a.out, a.name, stages, a.cost_prompts)
        card = read_card(Path(a.out), a.name)
    md = a.model_card
    if md is None and Path(a.out).resolve() == WEIGHTS_DIR:
        md = str(MODEL_CARD)
    if md and Path(md).resolve() == MODEL_CARD and Path(a.out).resolve() == WEIGHTS_DIR:
        Path(md).write_text(render_model_cards([read_card(WEIGHTS_DIR, n) for n in names()]))
    elif md:
        Path(md).write_text(render_model_card(card))
    print(json.dumps(card["heldout"], indent=1))
    return 0


def estimate(stages, opts: dict, shape: TargetShape) -> str:
    """The line `specdec zoo train` prints before it starts: how long its stages will take, from the training speed
    (seconds per window byte, each stage its own) recorded on a shipped pair's card, that of the target shape asked
    for or else the nearest in layers x hidden^2 scaled by that product."""
    cards = [read_card(WEIGHTS_DIR, n) for n in names()]
    cards = [c for c in cards if c.get("training") and c.get("models", {}).get("target")]
    if not stages:
        return "estimate: no stage to train; the held-out metrics of the stored weights take a minute or two"
    if not cards:
        return "estimate: none (no shipped card records a training time); each stage's bar shows its own"
    work = shape.num_hidden_layers * shape.hidden_size ** 2

    def card_work(card):
        t = card["models"]["target"]
        return t["num_hidden_layers"] * t["hidden_size"] ** 2

    def same_shape(card):
        t = card["models"]["target"]
        return (t["num_hidden_layers"], t["hidden_size"]) == (shape.num_hidden_layers, shape.hidden_size)

    card = min(cards, key=lambda c: (not same_shape(c), abs(math.log(card_work(c) / work))))
    scale = work / card_work(card)
    per_stage = {}
    for st in stages:
        rec = card["training"].get(st)
        if rec and rec.get("train_seconds") and rec.get("steps"):
            per_byte = rec["train_seconds"] / (rec["steps"] * rec["batch_size"] * rec["seq_len"])
            per_stage[st] = per_byte * scale * opts[st].steps * opts[st].batch_size * opts[st].seq_len
    threads = card["training"].get(stages[0], {}).get("torch_threads") or card.get("environment", {}).get(
        "torch_threads")
    how = (f"from the training speed recorded on {card['name']}'s card" +
           ("" if scale == 1 else f", scaled by the target's layers x hidden^2 ({scale:.2g}x)") +
           ", on the machine that trained it" + (f" at {threads} torch thread{'s' * (threads != 1)}" if threads else "")
           + " with its own precision per stage; each stage's bar shows its own estimate as it goes")
    unknown = [st for st in stages if st not in per_stage]
    return (f"estimate: {about(sum(per_stage.values()))} for {', '.join(stages)} ("
            + ", ".join(f"{st} {about(v).removeprefix('about ')}" for st, v in per_stage.items())
            + (f"; {', '.join(unknown)} not recorded" if unknown else "") + f"), {how}")


def _feature_layers(p: argparse.ArgumentParser, text: str) -> list[int]:
    """--eagle3-layers "2,12,24" -> [2, 12, 24]: distinct ascending indices, else a parser error (their range is
    the trained target's, checked by `train_eagle3`, since a stage may read a stored target of any depth)."""
    try:
        layers = [int(x) for x in text.split(",")]
    except ValueError:
        p.error(f"--eagle3-layers must be comma-separated integers, got {text!r}")
    if not layers or layers != sorted(set(layers)) or layers[0] < 0:
        p.error(f"--eagle3-layers must be distinct ascending layer indices >= 0, got {text!r}")
    return layers
