"""A draft seen through a hot-vocabulary LM head (`specdec.token_map`): what EagleWorkerV2 calls when a token map
is given, for the drafts whose LM head covers the target's vocabulary (an EAGLE head's is the target's, a draft LM's
its own)."""
from __future__ import annotations

import torch

from ..models.linear import Linear


class HotVocabDraft:
    """`draft` (the worker's calling convention: `draft(ids, hidden, positions, cache, meta, return_logits=)`,
    `compute_logits`, `get_output_embeddings`) with logits over `hot_ids` only: draft id d is target id hot_ids[d].

    The LM head is a copy of the n rows (SGLang's `--speculative-token-map` copies them too): a draft step's logits
    then read n x H weights instead of V x H, and the rows stay contiguous for the matmul."""

    def __init__(self, draft, hot_ids: torch.Tensor):
        self.draft = draft
        self.config = draft.config
        full = draft.get_output_embeddings().weight
        self.hot_ids = hot_ids.to(device=full.device, dtype=torch.int64)
        self.draft_vocab_size = self.hot_ids.numel()
        self.lm_head = Linear(full.shape[1], self.draft_vocab_size, bias=False, device=full.device, dtype=full.dtype)
        with torch.no_grad():
            self.lm_head.weight.copy_(full[self.hot_ids])
        self.lm_head.requires_grad_(False)

    @property
    def dtype(self):
        return self.draft.dtype

    def __call__(self, ids, hidden, positions, cache, meta, return_logits=True):
        out = self.draft(ids, hidden, positions, cache, meta, return_logits=False)
        return out._replace(logits=self.compute_logits(out.hidden)) if return_logits else out

    def compute_logits(self, hidden):
        """hidden: (..., H), what the draft's LM head reads -> logits (..., n) over the hot ids, in the
        head's dtype (read by ops that upcast, as the target's `compute_logits`)."""
        return self.lm_head(hidden)

    def draft_to_target(self, draft_ids):
        """Draft ids -> target ids (hot_ids[d])."""
        return self.hot_ids[draft_ids]
