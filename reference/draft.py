"""The draft's top-K: which K tokens a draft proposes from its logits, and their probabilities."""
from __future__ import annotations

import torch

from specdec.ops.op_checks import check_softmax_topk_args


def softmax_topk(logits, topk):
    """logits: (N, V) float; topk: int in [1, V] -> (topk_p (N, K) fp32, topk_index (N, K) int64).

    The K largest logits of each row, best first, ties to the lower token id, and their probabilities
    under softmax(logits) in fp32: EAGLE's draft proposal (K = topk) and the MTP layers' argmax (K = 1).
    Ranking by logits rather than by rounded probabilities makes the choice exact and device-independent.
    """
    check_softmax_topk_args(logits, topk)
    x = logits.float()
    index = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :topk]
    return torch.softmax(x, dim=-1).gather(1, index), index
