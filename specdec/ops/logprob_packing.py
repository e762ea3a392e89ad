"""What ``reference.compute_spec_v2_logprobs`` and ``fast.compute_spec_v2_logprobs`` share besides the checks.

Both paths send the requested token ids to the device the same way and pack their [R, ...] results into
SGLang's per-row lists with the same function. ``accepted_rows`` (which logits row each (request, slot) reads)
and ``request_temperatures`` (greedy requests' temperatures read as 1.0) are the definitions the reference
runs as tensor ops; the fast kernel applies the same two rules in place, to save their launches. This is a leaf
module: it imports neither ``reference`` nor ``fast``. Nothing here reads a tensor's values on the host.

Shapes: B requests, T = S+1 accept slots per request, R = B*T output rows (row r = b*T + j), V vocab.
"""

from __future__ import annotations

import torch

from .contract import greedy_temperature

__all__ = [
    "accepted_rows",
    "request_temperatures",
    "requested_token_ids",
    "set_logprob_outputs",
]



def accepted_rows(accept_index: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``accept_index`` [B, T] int, ``num_nodes`` W -> ``rows`` [R] int64, ``valid`` [R] bool.

    ``rows[b*T + j]`` is the logits row that slot (b, j) reads. A padded slot (-1) gets its own
    request's slot-0 row (``b*W`` if that is padded too), never another request's, so it is always
    a valid index; ``valid`` is False there and the caller overwrites the slot's outputs."""
    B = accept_index.shape[0]
    acc = accept_index.to(torch.long)
    valid = acc >= 0
    own = acc[:, :1]
    own = torch.where(own >= 0, own, torch.arange(B, device=acc.device).unsqueeze(1) * num_nodes)
    return torch.where(valid, acc, own).reshape(-1), valid.reshape(-1)


def request_temperatures(temperatures: torch.Tensor) -> torch.Tensor:
    """``temperatures`` [B, 1] float -> [B] fp32, a greedy request's temperature (`contract.greedy_temperature`:
    below GREEDY_TEMPERATURE_BELOW, or NaN) replaced by 1.0 (SGLang's temperature for a greedy request)."""
    t = temperatures.reshape(-1).to(torch.float32)
    return torch.where(greedy_temperature(t), torch.ones_like(t), t)


def requested_token_ids(ids_per_req: list[list[int]], device: torch.device) -> torch.Tensor | None:
    """``ids_per_req`` B lists of token ids -> [B, L] int64 on ``device`` (L = the longest list, shorter
    lists padded with token 0, whose results are sliced away), or None when no request asked.

    The copy does not wait for the stream: pinned memory and ``non_blocking`` on CUDA (a pageable copy
    would synchronise)."""
    L = max((len(ids) for ids in ids_per_req), default=0)
    if L == 0:
        return None
    ids = torch.tensor([ids + [0] * (L - len(ids)) for ids in ids_per_req], dtype=torch.long)
    if device.type == "cuda":
        return ids.pin_memory().to(device, non_blocking=True)
    return ids.to(device)


def set_logprob_outputs(
    logits_output,
    next_token_logprobs: torch.Tensor,
    top_val: torch.Tensor | None,
    top_idx: torch.Tensor | None,
    top_nums: list[int],
    token_ids_val: torch.Tensor | None,
    ids_per_req: list[list[int]],
):
    """Set the five output fields of ``logits_output`` in SGLang's per-row list layout.

    ``next_token_logprobs`` [B, T] fp32; ``top_val`` / ``top_idx`` [R, k] (any k >= max(top_nums);
    None when every ``top_nums`` is 0); ``token_ids_val`` [R, L] (None when no request asked).
    Entry r of a top list is a 1-D view of row r cut to ``top_nums[b]``; token-id val entry r is a
    view of row r cut to request b's number of ids, idx entry r a new ``list[int]`` of those ids. The
    dense tensors themselves are left in ``top_logprobs_val_rows`` / ``top_logprobs_idx_rows`` /
    ``token_ids_logprobs_val_rows`` (for a caller that wants them in one piece)."""
    B = len(top_nums)
    T = next_token_logprobs.shape[1]
    logits_output.next_token_logprobs = next_token_logprobs
    logits_output.top_logprobs_val_rows = top_val
    logits_output.top_logprobs_idx_rows = top_idx
    logits_output.token_ids_logprobs_val_rows = token_ids_val
    if top_val is None:
        logits_output.next_token_top_logprobs_val = None
        logits_output.next_token_top_logprobs_idx = None
    else:
        k_per_row = [k for k in top_nums for _ in range(T)]
        logits_output.next_token_top_logprobs_val = _row_views(top_val, k_per_row)
        logits_output.next_token_top_logprobs_idx = _row_views(top_idx, k_per_row)
    if token_ids_val is None:
        logits_output.next_token_token_ids_logprobs_val = None
        logits_output.next_token_token_ids_logprobs_idx = None
    else:
        n_per_row = [len(ids_per_req[b]) for b in range(B) for _ in range(T)]
        logits_output.next_token_token_ids_logprobs_val = _row_views(token_ids_val, n_per_row)
        logits_output.next_token_token_ids_logprobs_idx = [list(ids_per_req[b]) for b in range(B) for _ in range(T)]
    return logits_output


def _row_views(t: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """[R, L] -> R 1-D views, row r cut to ``lengths[r]``. One slice and one ``unbind`` per distinct length
    (a batch usually has one or two), not a slice per row: at 256 rows the per-row slices were the op's
    largest host cost."""
    cut = {n: t[:, :n].unbind(0) for n in set(lengths)}
    if len(cut) == 1:
        return list(cut[lengths[0]])
    return [cut[n][r] for r, n in enumerate(lengths)]
