"""What every model forward returns: one small named tuple, read by name."""
from __future__ import annotations

from typing import NamedTuple

import torch


class ModelOutput(NamedTuple):
    """A forward's results.

    logits: (B, T, V) in the LM head's dtype (the ops that read them upcast) over the model's vocabulary (an EAGLE-3
    head's: its draft vocabulary), or None when the forward was asked for none (`return_logits=False`; the model's
    `compute_logits` of chosen rows gives them).
    hidden: (B, T, H), what the LM head reads (a draft's: what its next step reads).
    features: (B, T, F * H), the target's residual streams entering the asked layers (EAGLE-3's features), or
    None when none were asked for (every draft's forward)."""

    logits: torch.Tensor | None
    hidden: torch.Tensor
    features: torch.Tensor | None = None
