"""Reference (pure PyTorch) version of the shared speculative-decoding logprob helper.

This is the single definition of a logprob in the toolkit: the EAGLE and multi-layer MTP
workers both call it, the engine slices what it returns, and ``fast.compute_spec_v2_logprobs``
(a fused Triton pass over the vocabulary) must agree with it under the equivalence tests.
"""

from __future__ import annotations

import torch

from specdec.ops.contract import PADDED_LOGPROB, PADDED_TOP_LOGPROB_IDX
from specdec.ops.logprob_packing import (
    accepted_rows,
    request_temperatures,
    requested_token_ids,
    set_logprob_outputs,
)
from specdec.ops.op_checks import check_logprob_args

__all__ = ["PADDED_LOGPROB", "PADDED_TOP_LOGPROB_IDX", "compute_spec_v2_logprobs"]

_FP32_MIN = torch.finfo(torch.float32).min


def compute_spec_v2_logprobs(
    batch,
    logits_output,
    predict,
    accept_index,
    speculative_num_steps,
    *,
    return_original_logprob=False,
):
    """Logprobs of the accepted path of one speculative decode step, filled into ``logits_output``.

    Shape contract (B requests, W nodes per request, S = ``speculative_num_steps``, V vocab,
    R = B*(S+1) output rows, row r = b*(S+1) + j, request-major):

    - ``logits_output.next_token_logits`` [B*W, V], fp32 / bf16 / fp16; request b's node i is
      row b*W + i. W = rows // B with B = ``accept_index.shape[0]``; W = 1, S = 0 is plain
      target-only decoding.
    - ``predict`` [B*W] int: the token chosen at each node.
    - ``accept_index`` [B, S+1] int: flat row indices into ``next_token_logits`` of the
      accepted path, root first, padded with -1. Slot 0 is always valid.
    - ``batch.sampling_info.temperatures`` [B, 1] float (a greedy request carries 1.0);
      ``batch.sampling_info.is_all_greedy`` bool; ``batch.top_logprobs_nums`` list[int] of
      length B; ``batch.token_ids_logprobs`` list of length B of ``list[int]`` or None (either
      list may itself be None: nobody asked). ``batch.seq_lens`` [B] is only length-checked.

    Outputs (set on ``logits_output``, which is also returned):

    - ``next_token_logprobs``: fp32 [B, S+1]; slot (b, j) is the logprob of
      ``predict[accept_index[b, j]]`` in row ``accept_index[b, j]``.
    - ``next_token_top_logprobs_val`` / ``_idx``: lists of length R; entry r is a 1-D view
      (fp32 values in descending order / int64 token ids) of length ``top_logprobs_nums[b]``,
      empty when that is 0. Both are None when every ``top_logprobs_num`` is 0. Tied values
      come in an unspecified order.
    - ``next_token_token_ids_logprobs_val`` / ``_idx``: lists of length R; val entry r is a 1-D
      fp32 tensor with the logprobs of request b's requested ids (in the order requested,
      duplicates allowed), idx entry r is those ids as a new ``list[int]``; empty tensor /
      empty list for a request that asked for none. Both are None when no request asked.

    Definition. The row is read in fp32 and divided by its request's temperature (the request
    is the batch index b of ``accept_index``, never the row's position, so a permuted or
    re-ordered ``accept_index`` still gets the right temperature), unless
    ``batch.sampling_info.is_all_greedy`` or ``return_original_logprob``; a non-positive or
    NaN temperature is treated as 1.0, SGLang's temperature for a greedy request. Then
    log-softmax in fp32, clamped to ``torch.finfo(torch.float32).min``: a masked token (-inf
    logit) gets that minimum, never -inf or NaN, and a row whose every logit is -inf gives that
    minimum for every token. NaN or +inf logits are not sanitised (they yield NaN).

    Padded slots (``accept_index == -1``). SGLang's version reads row -1 there, i.e. the last
    request's last node. Here a padded slot is computed from its own request's slot-0 row
    (row b*W if slot 0 were itself -1), never another request's, and then overwritten with a
    well-defined value that the engine never emits (it slices by ``accept_lens``):
    logprob ``PADDED_LOGPROB`` (0.0), top values 0.0 with idx ``PADDED_TOP_LOGPROB_IDX`` (-1),
    token-id values 0.0 (idx still the requested ids).

    No host sync: tensor values are never read on the host (only ``torch.where`` masks, no
    data-dependent shapes); the requested token ids go host-to-device through pinned memory
    with ``non_blocking=True``. Validation is Python-side only
    (shapes, dtypes, devices, the lists): ``ValueError`` naming the request for a
    ``top_logprobs_num`` outside [0, V] or a token id outside [0, V), ``ValueError`` for shape
    mismatches, ``TypeError`` for wrong types. Values in ``accept_index`` / ``predict`` are
    trusted (an out-of-range index fails in indexing).
    """
    scale = not (bool(batch.sampling_info.is_all_greedy) or return_original_logprob)
    B, S, W, _V, temperatures, top_nums, ids_per_req = check_logprob_args(
        batch, logits_output, predict, accept_index, speculative_num_steps, scale
    )
    logits = logits_output.next_token_logits
    T = S + 1
    R = B * T

    with torch.no_grad():
        rows, valid = accepted_rows(accept_index, W)

        # --- fp32 log-softmax of the gathered rows (divided by the request's temperature)
        x = logits.index_select(0, rows).to(torch.float32)  # [R, V]
        if scale:
            x = x / request_temperatures(temperatures).unsqueeze(1).expand(B, T).reshape(R, 1)
        m = x.amax(dim=-1, keepdim=True)
        m = torch.where(m == float("-inf"), torch.zeros_like(m), m)  # all-masked row: shift by 0
        shifted = x - m
        lse = torch.log(torch.exp(shifted).sum(dim=-1, keepdim=True))
        lse = torch.where(lse == float("-inf"), torch.zeros_like(lse), lse)  # all-masked row: -inf - 0
        logprobs = (shifted - lse).clamp(min=_FP32_MIN)  # [R, V] fp32
        del x, shifted

        pad = torch.full((), PADDED_LOGPROB, dtype=torch.float32, device=logits.device)

        tok = predict.to(torch.long).index_select(0, rows)
        lp = logprobs.gather(1, tok.unsqueeze(1)).squeeze(1)
        lp = torch.where(valid, lp, pad).reshape(B, T)

        top_val = top_idx = None
        k_max = max(top_nums, default=0)
        if k_max > 0:
            top_val, top_idx = torch.topk(logprobs, k_max, dim=-1, largest=True, sorted=True)
            top_val = torch.where(valid.unsqueeze(1), top_val, pad)
            pad_idx = torch.full((), PADDED_TOP_LOGPROB_IDX, dtype=torch.long, device=logits.device)
            top_idx = torch.where(valid.unsqueeze(1), top_idx, pad_idx)

        tid_val = None
        ids = requested_token_ids(ids_per_req, logits.device)  # [B, L]
        if ids is not None:
            L = ids.shape[1]
            tid_val = logprobs.gather(1, ids.unsqueeze(1).expand(B, T, L).reshape(R, L))  # [R, L]
            tid_val = torch.where(valid.unsqueeze(1), tid_val, pad)

    return set_logprob_outputs(logits_output, lp, top_val, top_idx, top_nums, tid_val, ids_per_req)
