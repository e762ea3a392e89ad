"""Shipped tiny checkpoints trained on real text (the Python standard library), and their trainer.

`specdec.zoo.names()` lists what ships; `specdec.zoo.load(name)` returns a `Bundle` with `.target`
(a byte-level Llama), `.eagle` (EAGLE head), `.eagle3` (EAGLE-3 head), `.mtp` (MiMo-style MTP layers),
`.mtp_chain` (Step-3.5-style), `.tokenizer` (`ByteTokenizer`) and `.card` (sizes, corpus, split, training
time, held-out losses, seed, command). The target is stored in float16, the drafts' matrices in int8 with
per-row scales; everything loads as fp32. Retrain with `specdec zoo train` (see `specdec.zoo.train`); the
card records the exact command.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .tokenizer import ByteTokenizer

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
#: the small pair, what `load()` and the tests use: a 6-layer target whose draft step costs ~1/4 of its step
DEFAULT_NAME = "stdlib-byte-6l"
#: the deep, narrow pair (24 layers at hidden 128) whose draft steps cost what real drafts cost, relative
#: to the target; `specdec demo` and `specdec bench` run it when it ships
DEEP_NAME = "stdlib-byte-24l"

__all__ = ["Bundle", "ByteTokenizer", "DEEP_NAME", "DEFAULT_NAME", "load", "names", "speed_pair"]


@dataclass
class Bundle:
    """A target with its drafts (None where the checkpoint lacks one), tokenizer and card."""

    name: str
    target: object
    eagle: object = None
    eagle3: object = None
    mtp: object = None
    mtp_chain: object = None
    tokenizer: ByteTokenizer = field(default_factory=ByteTokenizer)
    card: dict = field(default_factory=dict)
    path: Path | None = None


def names() -> list[str]:
    """-> sorted names of the shipped checkpoints (directories of weights/ with a target and a card)."""
    if not WEIGHTS_DIR.is_dir():
        return []
    return sorted(d.name for d in WEIGHTS_DIR.iterdir()
                  if (d / "card.json").is_file() and (d / "target" / "config.json").is_file())


def speed_pair() -> str:
    """The pair to measure speed on: the deep pair when it ships with every draft, else the small one."""
    deep = WEIGHTS_DIR / DEEP_NAME
    complete = all((deep / d / "config.json").is_file() for d in ("eagle", "eagle3", "mtp", "mtp_chain"))
    return DEEP_NAME if DEEP_NAME in names() and complete else DEFAULT_NAME


def _load_dir(root, name: str, device="cpu", dtype: torch.dtype = torch.float32) -> Bundle:
    from ..models import EagleDraftHead, LlamaForCausalLM, MTPDraftModel
    from ..models.eagle3 import Eagle3DraftHead

    root = Path(root)
    target = LlamaForCausalLM.from_pretrained(root / "target", device=device, dtype=dtype)
    b = Bundle(name=name, target=target, path=root)
    if (root / "eagle" / "config.json").is_file():
        b.eagle = EagleDraftHead.from_pretrained(root / "eagle", target, device=device, dtype=dtype)
    if (root / "eagle3" / "config.json").is_file():
        b.eagle3 = Eagle3DraftHead.from_pretrained(root / "eagle3", target, device=device, dtype=dtype)
    for key in ("mtp", "mtp_chain"):
        if (root / key / "config.json").is_file():
            setattr(b, key, MTPDraftModel.from_pretrained(root / key, target, device=device, dtype=dtype))
    card = root / "card.json"
    b.card = json.loads(card.read_text()) if card.is_file() else {}
    return b


def load(name: str = DEFAULT_NAME, device="cpu", dtype: torch.dtype = torch.float32) -> Bundle:
    """name: one of names() -> Bundle with every model in eval mode on `device` in `dtype` (fp32 default)."""
    available = names()
    if name not in available:
        raise ValueError(f"unknown zoo checkpoint {name!r}; available: {available}")
    return _load_dir(WEIGHTS_DIR / name, name, device=device, dtype=dtype)
