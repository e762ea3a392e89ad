"""The trainer's settings: the target's shape, each stage's optimisation settings, the stage names, and the
seeded random windows of the train stream that every stage draws its batches from."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from ...draft_kinds import DRAFT_KINDS
from ...models import LlamaConfig
from .. import trainable_kinds, zoo_kinds
from ...tokenizer import ByteTokenizer


@dataclass
class TargetShape:
    hidden_size: int = 256
    num_hidden_layers: int = 6
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 688
    max_position_embeddings: int = 2048

    def config(self, vocab_size: int = ByteTokenizer.vocab_size) -> LlamaConfig:
        return LlamaConfig(vocab_size=vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
                           num_attention_heads=self.num_attention_heads,
                           num_key_value_heads=self.num_key_value_heads, rope_theta=10000.0,
                           max_position_embeddings=self.max_position_embeddings, tie_word_embeddings=False)


@dataclass
class StageOpts:
    """One stage's optimisation settings (tokens per step = batch_size * seq_len)."""

    steps: int
    batch_size: int = 8
    seq_len: int = 512
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    amp: bool = True
    eval_every: int = 0  # 0: only at the end
    eval_windows: int = 16
    extra: dict = field(default_factory=dict)
    #: a file the loop saves its whole state to every checkpoint_every_s seconds and when it stops ("": none)
    checkpoint: str = ""
    checkpoint_every_s: float = 300.0
    #: continue from `checkpoint` where it exists (the same stage and settings)
    resume: bool = False
    #: time.time() at which the loop saves a checkpoint and stops, its stats saying so (0: none; `--minutes`)
    deadline: float = 0.0


#: the drafts the zoo trains, in `DRAFT_KINDS`' order; each is a stage of its own, trained after the target
DRAFTS = tuple(zoo_kinds())
STAGES = ("target",) + DRAFTS
#: the stages trained only when named (`ZooStage.ships` False): not part of a whole run
EXTRA_STAGES = tuple(k for k in trainable_kinds() if k not in DRAFTS)


def default_opts() -> dict[str, StageOpts]:
    """Each stage's settings, fresh: the target's here, each draft's from its kind (`ZooStage.opts`)."""
    return {"target": StageOpts(steps=2200, warmup=100, lr=2e-3, eval_every=500),
            **{kind: StageOpts(**copy.deepcopy(dict(DRAFT_KINDS[kind].zoo.opts))) for kind in DRAFTS + EXTRA_STAGES}}


class Windows:
    """Seeded random windows of a token stream: `next()` -> (B, length) int64."""

    def __init__(self, stream: np.ndarray, batch_size: int, length: int, seed: int):
        if len(stream) <= length:
            raise ValueError(f"stream of {len(stream)} tokens is too short for windows of {length}")
        self.stream, self.batch_size, self.length = stream, batch_size, length
        self.rng = np.random.default_rng(seed)

    def next(self) -> torch.Tensor:
        starts = self.rng.integers(0, len(self.stream) - self.length, size=self.batch_size)
        idx = starts[:, None] + np.arange(self.length)[None, :]
        return torch.from_numpy(self.stream[idx].astype(np.int64))
