"""Reference (pure PyTorch) version of the shared speculative-decoding logprob helper.

This is the single definition of a logprob in the toolkit: the EAGLE and multi-layer MTP
workers both call it, the engine slices what it returns, and ``fast.compute_spec_v2_logprobs``
(a fused Triton pass over the vocabulary) must agree with it under the equivalence tests.
"""

from __future__ import annotations

import operator

import torch

__all__ = ["PADDED_LOGPROB", "PADDED_TOP_LOGPROB_IDX", "compute_spec_v2_logprobs"]

#: Value written at a padded accept slot (``accept_index == -1``) in ``next_token_logprobs``,
#: in the top-logprob values and in the token-id logprob values. A real logprob is 0.0 only
#: when a token has probability 1; the engine never emits a padded slot (it slices every
#: step's output by ``accept_lens``), so the value is only ever seen by callers that look past
#: ``accept_lens``, and it is the same whatever the other requests hold.
PADDED_LOGPROB = 0.0
#: Index written in the top-logprob indices of a padded accept slot (never a real token id).
PADDED_TOP_LOGPROB_IDX = -1

_FP32_MIN = torch.finfo(torch.float32).min


def _as_int(value, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}") from None


def _to_device_async(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host-to-device copy that does not wait for the stream (pinned + non_blocking on CUDA;
    a pageable blocking copy would synchronise the stream)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _check_int_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {t.dtype}")


def _validate(batch, logits_output, predict, accept_index, speculative_num_steps, scale):
    """Python-side checks only (shapes, dtypes, devices, list contents): no tensor value is read."""
    S = _as_int(speculative_num_steps, "speculative_num_steps")
    if S < 0:
        raise ValueError(f"speculative_num_steps must be >= 0, got {S}")

    _check_int_tensor(accept_index, "accept_index")
    if accept_index.dim() != 2:
        raise ValueError(
            f"accept_index must be 2-D [B, speculative_num_steps + 1], got shape {tuple(accept_index.shape)}"
        )
    B = accept_index.shape[0]
    if accept_index.shape[1] != S + 1:
        raise ValueError(
            f"accept_index has {accept_index.shape[1]} slots per request but speculative_num_steps + 1 "
            f"= {S + 1} (shape {tuple(accept_index.shape)})"
        )

    logits = logits_output.next_token_logits
    if not isinstance(logits, torch.Tensor):
        raise TypeError(
            f"logits_output.next_token_logits must be a torch.Tensor, got {type(logits).__name__}"
        )
    if not logits.dtype.is_floating_point:
        raise TypeError(f"logits_output.next_token_logits must be floating point, got dtype {logits.dtype}")
    if logits.dim() != 2:
        raise ValueError(f"next_token_logits must be 2-D [B*W, V], got shape {tuple(logits.shape)}")
    N, V = logits.shape
    if V == 0:
        raise ValueError(f"next_token_logits has an empty vocabulary (shape {tuple(logits.shape)})")
    if B == 0:
        if N != 0:
            raise ValueError(f"accept_index has 0 requests but next_token_logits has {N} rows")
        W = 0
    else:
        if N == 0 or N % B != 0:
            raise ValueError(
                f"next_token_logits has {N} rows, not a positive multiple of the batch size B = {B} "
                f"(accept_index shape {tuple(accept_index.shape)})"
            )
        W = N // B

    _check_int_tensor(predict, "predict")
    if predict.dim() != 1 or predict.shape[0] != N:
        raise ValueError(
            f"predict must be 1-D [B*W] = [{N}] (one token per logits row), got shape {tuple(predict.shape)}"
        )
    for name, t in (("accept_index", accept_index), ("predict", predict)):
        if t.device != logits.device:
            raise ValueError(f"{name} is on {t.device} but next_token_logits is on {logits.device}")

    seq_lens = getattr(batch, "seq_lens", None)
    if seq_lens is not None and len(seq_lens) != B:
        raise ValueError(f"batch.seq_lens has {len(seq_lens)} entries but accept_index has B = {B} requests")

    temperatures = None
    if scale:
        temperatures = batch.sampling_info.temperatures
        if not isinstance(temperatures, torch.Tensor):
            raise TypeError(
                f"batch.sampling_info.temperatures must be a torch.Tensor [B, 1], got {type(temperatures).__name__}"
            )
        if not temperatures.dtype.is_floating_point:
            raise TypeError(
                f"batch.sampling_info.temperatures must be floating point, got {temperatures.dtype}"
            )
        if tuple(temperatures.shape) != (B, 1):
            raise ValueError(
                f"batch.sampling_info.temperatures must have shape [B, 1] = [{B}, 1], "
                f"got {tuple(temperatures.shape)}"
            )
        if temperatures.device != logits.device:
            raise ValueError(
                f"batch.sampling_info.temperatures is on {temperatures.device} but next_token_logits is on "
                f"{logits.device}"
            )

    top_nums = getattr(batch, "top_logprobs_nums", None)
    if top_nums is None:
        top_nums = [0] * B
    if len(top_nums) != B:
        raise ValueError(
            f"batch.top_logprobs_nums has {len(top_nums)} entries but the batch has B = {B} requests"
        )
    top_nums = [_as_int(k, f"batch.top_logprobs_nums[{b}]") for b, k in enumerate(top_nums)]
    for b, k in enumerate(top_nums):
        if k < 0 or k > V:
            raise ValueError(f"request {b}: top_logprobs_num = {k} is outside [0, vocab size {V}]")

    token_ids = getattr(batch, "token_ids_logprobs", None)
    if token_ids is None:
        token_ids = [None] * B
    if len(token_ids) != B:
        raise ValueError(
            f"batch.token_ids_logprobs has {len(token_ids)} entries but the batch has B = {B} requests"
        )
    ids_per_req: list[list[int]] = []
    for b, ids in enumerate(token_ids):
        if ids is None:
            ids_per_req.append([])
            continue
        if isinstance(ids, (str, bytes, torch.Tensor)) or not hasattr(ids, "__iter__"):
            raise TypeError(
                f"request {b}: token_ids_logprobs must be a list of ints or None, got {type(ids).__name__}"
            )
        clean = [_as_int(t, f"request {b}: token_ids_logprobs[{i}]") for i, t in enumerate(ids)]
        for i, t in enumerate(clean):
            if t < 0 or t >= V:
                raise ValueError(
                    f"request {b}: token_ids_logprobs[{i}] = {t} is outside the vocabulary [0, {V})"
                )
        ids_per_req.append(clean)

    return B, S, W, V, temperatures, top_nums, ids_per_req


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
    B, S, W, _V, temperatures, top_nums, ids_per_req = _validate(
        batch, logits_output, predict, accept_index, speculative_num_steps, scale
    )
    logits = logits_output.next_token_logits
    device = logits.device
    T = S + 1
    R = B * T

    with torch.no_grad():
        # --- which row each (request, slot) reads: padded slots fall back to the request's own row
        acc = accept_index.to(torch.long)
        valid = acc >= 0  # [B, T]
        own = acc[:, :1]
        own = torch.where(own >= 0, own, torch.arange(B, device=device).unsqueeze(1) * W)
        rows = torch.where(valid, acc, own).reshape(R)
        valid = valid.reshape(R)

        # --- fp32 log-softmax of the gathered rows (divided by the request's temperature)
        x = logits.index_select(0, rows).to(torch.float32)  # [R, V]
        if scale:
            t = temperatures.reshape(B).to(torch.float32)
            t = torch.where(t > 0, t, torch.ones_like(t))  # NaN > 0 is False too
            x = x / t.unsqueeze(1).expand(B, T).reshape(R, 1)
        m = x.amax(dim=-1, keepdim=True)
        m = torch.where(m == float("-inf"), torch.zeros_like(m), m)  # all-masked row: shift by 0
        shifted = x - m
        lse = torch.log(torch.exp(shifted).sum(dim=-1, keepdim=True))
        lse = torch.where(lse == float("-inf"), torch.zeros_like(lse), lse)  # all-masked row: -inf - 0
        logprobs = (shifted - lse).clamp(min=_FP32_MIN)  # [R, V] fp32
        del x, shifted

        zero = torch.zeros((), dtype=torch.float32, device=device)

        # --- logprob of the chosen token
        tok = predict.to(torch.long).index_select(0, rows)
        lp = logprobs.gather(1, tok.unsqueeze(1)).squeeze(1)
        lp = torch.where(valid, lp, zero)
        logits_output.next_token_logprobs = lp.reshape(B, T)

        # --- top logprobs
        k_max = max(top_nums, default=0)
        if k_max > 0:
            top_val, top_idx = torch.topk(logprobs, k_max, dim=-1, largest=True, sorted=True)
            top_val = torch.where(valid.unsqueeze(1), top_val, zero)
            top_idx = torch.where(
                valid.unsqueeze(1),
                top_idx,
                torch.full((), PADDED_TOP_LOGPROB_IDX, dtype=torch.long, device=device),
            )
            vals, idxs = [], []
            for b in range(B):
                k = top_nums[b]
                for j in range(T):
                    r = b * T + j
                    vals.append(top_val[r, :k])
                    idxs.append(top_idx[r, :k])
            logits_output.next_token_top_logprobs_val = vals
            logits_output.next_token_top_logprobs_idx = idxs
        else:
            logits_output.next_token_top_logprobs_val = None
            logits_output.next_token_top_logprobs_idx = None

        # --- logprobs of requested token ids (ragged across requests)
        lens = [len(ids) for ids in ids_per_req]
        L = max(lens, default=0)
        if L > 0:
            padded_ids = [ids + [0] * (L - len(ids)) for ids in ids_per_req]
            ids_t = _to_device_async(torch.tensor(padded_ids, dtype=torch.long), device)
            tid_val = logprobs.gather(1, ids_t.unsqueeze(1).expand(B, T, L).reshape(R, L))  # [R, L]
            tid_val = torch.where(valid.unsqueeze(1), tid_val, zero)
            vals, idxs = [], []
            for b in range(B):
                for j in range(T):
                    vals.append(tid_val[b * T + j, : lens[b]])
                    idxs.append(list(ids_per_req[b]))
            logits_output.next_token_token_ids_logprobs_val = vals
            logits_output.next_token_token_ids_logprobs_idx = idxs
        else:
            logits_output.next_token_token_ids_logprobs_val = None
            logits_output.next_token_token_ids_logprobs_idx = None

    return logits_output
