"""KV commit of an accepted path."""
from __future__ import annotations

import torch

from specdec.ops.op_checks import check_commit_kv_args


def commit_kv_cache(kv, slots, seq_lens, accept_index, num_draft_tokens):
    """kv: (N, max_batch, max_seq_len, Hkv, D), N caches (e.g. every layer's k and v) updated in place;
    slots, seq_lens: (B,) int; accept_index: (B, S+1) int (flat node indices b*W + i, -1 padded);
    num_draft_tokens: W (int).

    Moves the KV of accepted node j (written at slot seq_len + i_j during verify) to slot seq_len + j.
    All sources are read before any destination is written, so overlapping moves are safe. A padded
    slot j copies slot seq_len + j onto itself (a no-op), keeping the step's shape fixed. Shapes, dtypes
    and devices are checked (ValueError / TypeError); index values are trusted.
    """
    B, S1 = check_commit_kv_args(kv, slots, seq_lens, accept_index, num_draft_tokens)
    j = torch.arange(S1, device=kv.device)[None, :]
    local = accept_index.long() - torch.arange(B, device=kv.device)[:, None] * num_draft_tokens
    local = torch.where(accept_index >= 0, local, j)
    rows = slots.long()[:, None].expand(B, S1)
    src = kv[:, rows, seq_lens.long()[:, None] + local]
    kv[:, rows, seq_lens.long()[:, None] + j] = src
