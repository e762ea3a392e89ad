"""Drafts for any target (`specdec zoo train-draft`): an EAGLE-3 head with a reduced draft vocabulary, an EAGLE head,
a DFlash drafter and a distilled draft LM, trained on the target's own chat answers (`record`), written in the layout
their peers read (SGLang / SafeAILab for EAGLE-3 and EAGLE, z-lab for DFlash, Hugging Face for the draft LM) in float16,
each config.json naming the target it was trained for (`specdec_target_fingerprint`, see
`specdec.zoo.target_fingerprint`), and a card row per draft: data, steps, time, held-out agreement by depth, command.

The zoo's stages train them (`stages.train_eagle3`, ...), reading the recording instead of running the target
(`record.RecordedData`); only their settings differ from the byte pairs' (`target_draft_opts`)."""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
import argparse

import numpy as np
import torch

from ...draft_kinds import DRAFT_KINDS, draft_kind, resolve
from ...models.eagle3 import default_feature_layers
from ...models.io import save_dir
from ...token_map import rank_token_ids
from .. import target_fingerprint
from .card import shape_summary
from .hparams import StageOpts
from .loop import freeze, num_params
from ... import zoo
from ...cli_args import HelpFormatter
from .record import TEACHERS, RecordedData, load_recordings

#: the kinds trained for a given target, in the order `specdec zoo train-draft --kind all` trains them
TARGET_DRAFT_KINDS = ("eagle3", "eagle", "dflash", "draft_lm", "dspark")
#: what a draft for a given target is stored in (drafts only propose: their rounding cannot change a decoded token)
TARGET_DRAFT_DTYPE = torch.float16


def target_draft_opts(target, mask_token_id: int) -> dict[str, StageOpts]:
    """Each kind's default settings for `target` (its `ZooStage.target_opts`): fp32 (bf16 autocast is slower on CPUs
    without AMX), windows of 256 tokens, 8 per step. The EAGLE-3 head reads the target's default features (SGLang's
    low, middle, high) and proposes from the 8,192 most frequent ids, its LM head's rows kept the target's (so that
    the same head runs with any draft vocabulary, `eagle3_with_vocabulary`); the DFlash drafter (one layer, blocks of
    8) reads the same layers, so one recording serves both; the draft LM is 2 layers at hidden 96 with a tied
    embedding that starts as the target's principal directions. Steps: about 30 minutes of one core each (a 2-core
    x86 machine, 2026), within the 60 MB the five ship in."""
    return {kind: DRAFT_KINDS[kind].zoo.opts_for_target(target, mask_token_id) for kind in TARGET_DRAFT_KINDS}


#: the settings every draft for a given target shares
_COMMON = dict(batch_size=8, seq_len=256, lr=1e-3, warmup=50, amp=False, min_lr_ratio=0.1)


def eagle3_target_opts(target, mask_token_id: int) -> StageOpts:
    feats = default_feature_layers(target.config.num_hidden_layers)
    return StageOpts(steps=330, **_COMMON, extra={"unroll": 3, "pass_weight_decay": 0.8, "draft_vocab_size": 8192,
                                                  "feature_layers": feats, "freeze_lm_head": True})


def eagle_target_opts(target, mask_token_id: int) -> StageOpts:
    return StageOpts(steps=190, **_COMMON, extra={"unroll": 3})


def dflash_target_opts(target, mask_token_id: int) -> StageOpts:
    feats = default_feature_layers(target.config.num_hidden_layers)
    return StageOpts(steps=550, **_COMMON, extra={
        "num_layers": 1, "block_size": 8, "target_layer_ids": [i - 1 for i in feats], "mask_token_id": mask_token_id,
        "blocks_per_window": 16, "gamma": 4.0, "norm_from_target": True})


def dspark_target_opts(target, mask_token_id: int) -> StageOpts:
    """DFlash's settings with DeepSpec's block of 7 and heads (a vanilla Markov head, a confidence head reading its
    embedding): the same context layers, so one recording serves the three. The Markov head's rank is 32, not
    DeepSpec's 64: its two (V, r) matrices are most of the drafter on a small target (6.3 MB at SmolLM2's 49,152
    ids), and the five drafts of a target ship within 60 MB."""
    feats = default_feature_layers(target.config.num_hidden_layers)
    return StageOpts(steps=550, **_COMMON, extra={
        "num_layers": 1, "block_size": 7, "target_layer_ids": [i - 1 for i in feats], "mask_token_id": mask_token_id,
        "blocks_per_window": 16, "gamma": 4.0, "markov_rank": 32, "markov_head_type": "vanilla",
        "norm_from_target": True})


def draft_lm_target_opts(target, mask_token_id: int) -> StageOpts:
    return StageOpts(steps=600, **dict(_COMMON, lr=2e-3), extra={
        "num_layers": 2, "hidden_size": 96, "intermediate_size": 256, "num_attention_heads": 2,
        "num_key_value_heads": 1, "tie_word_embeddings": True, "embed_from_target": True})


def unused_token_id(tokenizer, stream: np.ndarray) -> int:
    """The lowest special id of `tokenizer` (else the lowest id) that never occurs in `stream`: the DFlash drafter's
    mask token, which must never be a real token of a window."""
    counts = np.bincount(np.asarray(stream, dtype=np.int64), minlength=tokenizer.vocab_size)
    special = sorted(getattr(tokenizer, "special_token_ids", []) or [])
    for i in special + list(range(tokenizer.vocab_size)):
        if counts[i] == 0:
            return int(i)
    raise ValueError("every id of the vocabulary occurs in the recording: no id is free for DFlash's mask token")


def save_target_draft(model, path: Path, fingerprint: str) -> int:
    """Write `model` in its peers' layout in float16, config.json naming the target's fingerprint -> bytes. Copies
    of the target's own matrices that the layout may leave out (`TARGET_COPIES`) are left out: the loader takes the
    target's."""
    cfg, sd = model.checkpoint()
    sd = {k: v for k, v in sd.items() if k not in getattr(model, "TARGET_COPIES", ())}
    cfg["torch_dtype"] = "float16"
    cfg["specdec_target_fingerprint"] = fingerprint
    save_dir(path, cfg, {k: (v.detach().to(TARGET_DRAFT_DTYPE) if v.is_floating_point() else v.detach()).cpu()
                         for k, v in sd.items()})
    for f in Path(path).iterdir():
        f.chmod(0o644)
    return sum(f.stat().st_size for f in Path(path).iterdir())


def write_token_ranking(out: Path, stream: np.ndarray, vocab_size: int) -> Path:
    """out/token_ranking.npy: every id of the target, most frequent in the recorded answers first (ties: the lower
    id), int32; an EAGLE-3 head's draft vocabulary of any size is a prefix of it (`specdec bench --suite
    draft-vocab`)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "token_ranking.npy"
    np.save(path, rank_token_ids(stream, vocab_size).astype(np.int32))
    return path


def heldout_windows_of(tokens: np.ndarray, n: int, length: int, seed: int = 4321) -> torch.Tensor:
    """(n, length) int64 windows of a held-out recording's tokens at seeded offsets."""
    if len(tokens) <= length:
        raise ValueError(f"a held-out recording of {len(tokens)} tokens is too short for windows of {length}")
    starts = np.random.default_rng(seed).integers(0, len(tokens) - length, size=n)
    return torch.from_numpy(np.stack([tokens[s:s + length] for s in starts]).astype(np.int64))


def train_target_draft(target, kind: str, data, opts: StageOpts, out: Path, heldout: torch.Tensor | None,
                       seed: int = 0, command: str = "", log=print) -> dict:
    """Train `kind` for `target` on `data` (`record.RecordedData`), write it to out/kind/ and its row into
    out/card.json -> that row (training stats, held-out metrics of the stored draft by depth, sizes)."""
    if kind not in TARGET_DRAFT_KINDS:
        raise ValueError(f"kind must be one of {TARGET_DRAFT_KINDS}, got {kind!r}")
    freeze(target)
    stage = DRAFT_KINDS[kind].zoo
    model, stats = resolve(stage.trainer)(target, opts, seed=seed, log=log, data=data)
    if stats.get("complete") is False:  # the time budget ran out: its checkpoint resumes it, nothing is written
        return {"training": stats}
    stats["train_cpu_seconds"] = stats["loop_cpu_seconds"]  # the optimisation loop's, over every run it resumed
    fp = target_fingerprint(target)
    stats["bytes_on_disk"] = save_target_draft(model, out / kind, fp)
    if opts.checkpoint:  # written: a later --resume must not continue this run's mid-way state
        Path(opts.checkpoint).unlink(missing_ok=True)
    stored = draft_kind(kind).load(out / kind, target, device=next(target.parameters()).device,
                                   dtype=torch.float32)
    row = {"training": stats, "parameters": num_params(model), "config": shape_summary(stored.config),
           "command": command, "seed": seed, "torch_threads": torch.get_num_threads(),
           "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if heldout is not None:
        log(f"== {kind}: held-out metrics of the stored draft")
        row["heldout"] = stage.evaluate(target, stored, heldout, seq_len=heldout.shape[1] - 3)
    update_card(out, {"target_fingerprint": fp,
                      "environment": {"python": sys.version.split()[0], "torch": torch.__version__,
                                      "machine": platform.machine(), "cpu_count": os.cpu_count()}}, kind, row)
    return row


def render_target_card(card: dict, name: str) -> str:
    """The drafts directory's README.md (its model card, as a Hugging Face repository has one): one row per draft,
    from card.json."""
    lines = [f"# Drafts for `{name}`", "",
             "Trained by `specdec zoo train-draft` on the target's own answers to training-split chat prompts "
             "(`specdec.zoo.chat_prompts`: instructions about the Python standard library's docstrings, split by "
             "module), recorded with the hidden states it computed while writing them (`python -m "
             "specdec.zoo.train.record`); a row naming a prompt file was recorded from that file instead (`python -m "
             "specdec.zoo.prompts.build`'s training split). Each directory is in the layout its peers read, in "
             "float16, and names the "
             f"target it was trained for (fingerprint `{card.get('target_fingerprint')}`). Generated from "
             "card.json.", "",
             "| draft | parameters | MB | data (recorded tokens) | steps x batch x tokens | CPU minutes | "
             "held-out top-1 agreement by depth | held-out accepted prefix by block position |",
             "|---|---|---|---|---|---|---|---|"]
    for kind, row in card.get("drafts", {}).items():
        t, heldout = row["training"], row.get("heldout", {}).values()
        agree = " / ".join(f"{v['top1_agreement']:.2f}" for v in heldout) or "-"
        prefix = " / ".join(f"{v['accept_prefix']:.2f}" for v in heldout if "accept_prefix" in v)
        size = row.get("reslice", {}).get("bytes_on_disk", t["bytes_on_disk"])
        files = "".join(f", {name}" for name in t["data"].get("prompt_files", ()))
        lines.append(f"| {kind} | {row['parameters'] / 1e6:.1f} M | {size / 1e6:.1f} | "
                     f"{t['data']['tokens']:,} ({t['data']['conversations']:,} answers{files}) | {t['steps']} x "
                     f"{t['batch_size']} x {t['seq_len']} | {t['train_cpu_seconds'] / 60:.0f} | {agree} | {prefix} |")
    if card.get("record_commands"):
        lines += ["", "Recorded with " + " and ".join(f"`{c}`" for c in card["record_commands"]) + "."]
    lines += ["", "Agreement: how often the draft's most likely token at draft depth d (DFlash, DSpark: block "
              "position d) is the target's, on windows of held-out answers (modules no training prompt quoted). A "
              "block drafter's accepted prefix at d: how often positions 1..d all agree, what greedy verification of "
              "its whole block accepts; it compares DFlash with DSpark, whose agreement at d > 1 reads the held-out "
              "tokens before d. Commands:", ""]
    for kind, row in card.get("drafts", {}).items():
        lines.append(f"- {kind}: `{row['command']}`")
        if "reslice" in row:
            r = row["reslice"]
            lines.append(f"  then, trained with {r['from_draft_vocab_size']:,} draft ids, shipped with its "
                         f"{r['draft_vocab_size']:,} most frequent (the same head: its LM head rows are the target's; "
                         f"held-out agreement above is the trained vocabulary's" +
                         (", " + " / ".join(f"{v['top1_agreement']:.2f}" for v in r["heldout"].values()) +
                          " with the shipped one" if r.get("heldout") else "") + f"): `{r['command']}`")
    return "\n".join(lines) + "\n"


def update_card(out: Path, fields: dict, kind: str, row: dict) -> None:
    """out/card.json with `fields` and drafts[kind] = row, under a file lock (drafts train side by side), and the
    README.md rendered from it."""
    # lazy: fcntl is POSIX-only
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    card_file = out / "card.json"
    with open(out / ".card.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        card = json.loads(card_file.read_text()) if card_file.is_file() else {}
        card.update(fields)
        card.setdefault("drafts", {})[kind] = row
        card_file.write_text(json.dumps(card, indent=1) + "\n")
        (out / "README.md").write_text(render_target_card(card, out.name))


def reslice_eagle3(target, out: Path, size: int, command: str = "", heldout: torch.Tensor | None = None) -> dict:
    """Rewrite out/eagle3 with the `size` most frequent recorded ids (out/token_ranking.npy) as its draft vocabulary,
    the same head (`with_draft_vocabulary`), and record it on its card row -> the row's `reslice` entry."""
    path = out / "eagle3"
    head = zoo.load_draft_for("eagle3", path, target)
    ranking = torch.from_numpy(np.load(out / "token_ranking.npy").astype(np.int64))
    trained = head.config.draft_vocab_size
    resliced = head.with_draft_vocabulary(ranking[:size])
    entry = {"draft_vocab_size": size, "from_draft_vocab_size": trained, "command": command,
             "bytes_on_disk": save_target_draft(resliced, path, target_fingerprint(target))}
    if heldout is not None:
        entry["heldout"] = DRAFT_KINDS["eagle3"].zoo.evaluate(target, zoo.load_draft_for("eagle3", path, target),
                                                               heldout, seq_len=heldout.shape[1] - 3)
    card = json.loads((out / "card.json").read_text())
    row = card["drafts"]["eagle3"]
    row["reslice"] = entry
    row["config"] = shape_summary(resliced.config)
    update_card(out, {}, "eagle3", row)
    return entry


def main(argv=None) -> int:
    """`specdec zoo train-draft`."""

    p = argparse.ArgumentParser(
        prog="specdec zoo train-draft", formatter_class=HelpFormatter,
        description="Train a draft for a given target on its own recorded chat answers (record them first with "
                    "`python -m specdec.zoo.train.record`): an EAGLE-3 head with a reduced draft vocabulary, an EAGLE "
                    "head, a DFlash drafter or a distilled draft LM, written in its peers' layout in float16 with a "
                    "card row. Example: specdec zoo train-draft --model smollm2-135m-instruct --recordings "
                    "rec/s0,rec/s1 --heldout rec/h --kind eagle3 --steps 400")
    p.add_argument("--model", "--target", dest="model", required=True,
                   help="the target: a zoo name (`specdec zoo list`), a .gguf file or a Hugging Face directory "
                        "(--target: the same)")
    p.add_argument("--recordings", default=None, help="comma-separated recording directories of the target's "
                                                       "training-split answers")
    p.add_argument("--heldout", default=None, help="a recording of held-out answers, for the card's agreement by depth")
    p.add_argument("--kind", required=True, choices=TARGET_DRAFT_KINDS + ("all",))
    p.add_argument("--out", default=None, help="drafts directory (default: the zoo's weights/<target> for a zoo "
                                               "target; required otherwise)")
    p.add_argument("--steps", type=int, default=None, help="optimiser steps (default: the kind's own)")
    p.add_argument("--batch-size", type=int, default=None, help="windows per step (default: the kind's own)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per window (default: the kind's own)")
    p.add_argument("--draft-vocab", type=int, default=None,
                   help="the EAGLE-3 head's draft vocabulary: this many most frequent recorded ids (default 8192)")
    p.add_argument("--reslice", type=int, default=None, metavar="N",
                   help="train nothing: rewrite the trained EAGLE-3 head (--kind eagle3) with the N most frequent "
                        "recorded ids as its draft vocabulary (`Eagle3DraftHead.with_draft_vocabulary`; its LM head "
                        "rows are the target's, so this is the same head), and record it on the card")
    p.add_argument("--teacher", default="auto", choices=("auto",) + TEACHERS,
                   help="what the drafts learn to match: the target's recorded top-k distribution on the answers' "
                        "rows and its LM head on the prompts' (topk), or its LM head on every row (full); auto: "
                        "topk where the recordings hold the target's top-k")
    p.add_argument("--eval-windows", type=int, default=16, help="held-out windows for the card")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--device", default="cpu", help="where the target and the draft train (cpu, cuda, ...)")
    p.add_argument("--minutes", type=float, default=0,
                   help="a time budget: when it runs out the run saves a checkpoint and stops (0: none)")
    p.add_argument("--resume", action="store_true", help="continue each kind from its checkpoint, where there is one")
    p.add_argument("--checkpoint-dir", default=None,
                   help="where each kind's training state is saved (default: ~/.cache/specdec/train/<target "
                        "fingerprint>)")
    p.add_argument("--checkpoint-every", type=float, default=300, help="seconds between checkpoints (default 300)")
    a = p.parse_args(argv)
    deadline = time.time() + 60 * a.minutes if a.minutes > 0 else 0.0
    torch.set_num_threads(a.threads)
    target, tokenizer, default_out = zoo.load_target(a.model, device=a.device)
    ckpt_dir = Path(a.checkpoint_dir) if a.checkpoint_dir else (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdec" / "train"
        / target_fingerprint(target))
    out = Path(a.out) if a.out else default_out
    if out is None:
        p.error("--out is required for a target outside the zoo")
    V = target.config.vocab_size
    if a.draft_vocab is not None and not 1 <= a.draft_vocab <= V:
        p.error(f"--draft-vocab must be in [1, {V}] (the target's vocabulary), got {a.draft_vocab}")
    command = "specdec zoo train-draft " + " ".join(argv if argv is not None else sys.argv[1:])
    if a.reslice is not None:
        if a.kind != "eagle3" or not 1 <= a.reslice <= V:
            p.error(f"--reslice takes --kind eagle3 and a size in [1, {V}], got --kind {a.kind} --reslice {a.reslice}")
        heldout = None
        if a.heldout:
            heldout = heldout_windows_of(load_recordings(a.heldout).tokens, a.eval_windows, 128 + 3)
        print(json.dumps(reslice_eagle3(target, out, a.reslice, command.strip(), heldout)))
        return 0
    if a.recordings is None:
        p.error("--recordings is required to train")
    data = RecordedData(target, a.recordings, a.teacher)
    opts = target_draft_opts(target, unused_token_id(tokenizer, data.stream))
    heldout = None
    if a.heldout:
        heldout = heldout_windows_of(load_recordings(a.heldout).tokens, a.eval_windows, 128 + 3)
    write_token_ranking(out, data.stream, V)
    for kind in TARGET_DRAFT_KINDS if a.kind == "all" else (a.kind,):
        o = opts[kind]
        o.steps = a.steps or o.steps
        o.batch_size = a.batch_size or o.batch_size
        o.seq_len = a.seq_len or o.seq_len
        o.warmup = min(o.warmup, max(1, o.steps // 10))
        if kind == "eagle3":  # a small vocabulary (a byte-level target) is its own draft vocabulary
            o.extra["draft_vocab_size"] = a.draft_vocab or min(o.extra.get("draft_vocab_size") or V, V)
        o.checkpoint, o.checkpoint_every_s = str(ckpt_dir / f"{kind}.pt"), a.checkpoint_every
        o.resume, o.deadline = a.resume, deadline
        row = train_target_draft(target, kind, data, o, out, heldout, a.seed, command.strip(),
                                 log=lambda s: print(s, file=sys.stderr, flush=True))
        if row["training"].get("complete") is False:
            print(json.dumps({kind: row["training"]}))
            print(f"stopped by --minutes; rerun with --resume to continue ({o.checkpoint})", file=sys.stderr)
            return 3
        print(json.dumps({kind: row.get("heldout", {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
