"""Light containers for the logprob helper's inputs and outputs, with SGLang's field names.

``compute_spec_v2_logprobs`` (in ``reference`` and ``fast``) is duck-typed: any object with
these attribute names works, including SGLang's own ``ScheduleBatch`` /
``LogitsProcessorOutput``. These dataclasses are what the toolkit's workers and tests pass.

Shapes: B requests, W nodes per request in ``next_token_logits`` (row of request b's node i
is ``b*W + i``), S = ``speculative_num_steps``, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["LogitsOutput", "SamplingInfo", "SpecBatch"]


@dataclass
class SamplingInfo:
    """``temperatures`` [B, 1] fp32, one per request; ``is_all_greedy`` bool.

    As in SGLang, a greedy request carries temperature 1.0, so a batch mixing greedy and
    sampled requests simply uses each request's temperature. When ``is_all_greedy`` is True
    the logprob helper does not scale by temperature at all.
    """

    temperatures: torch.Tensor
    is_all_greedy: bool = False


@dataclass
class SpecBatch:
    """``seq_lens`` [B]; ``sampling_info``; ``top_logprobs_nums`` list[int] of length B
    (0 = the request wants no top logprobs); ``token_ids_logprobs`` list of length B whose
    entries are a list of token ids (logprobs wanted for exactly these, in this order,
    duplicates allowed) or None."""

    seq_lens: torch.Tensor
    sampling_info: SamplingInfo
    top_logprobs_nums: list[int] = field(default_factory=list)
    token_ids_logprobs: list[list[int] | None] = field(default_factory=list)


@dataclass
class LogitsOutput:
    """``next_token_logits`` [B*W, V] (fp32, bf16 or fp16); ``hidden_states`` [B*W, H] or None.

    Filled by ``compute_spec_v2_logprobs`` (R = B*(S+1) rows, row r = b*(S+1) + j):

    - ``next_token_logprobs``: fp32 tensor [B, S+1].
    - ``next_token_top_logprobs_val`` / ``_idx``: lists of length R of 1-D tensors (fp32
      descending / int64) with request b's ``top_logprobs_num`` entries; None when no request
      asked for top logprobs.
    - ``next_token_token_ids_logprobs_val`` / ``_idx``: lists of length R; val entries are
      1-D fp32 tensors, idx entries the requested ids as ``list[int]`` (empty for a request
      that asked for none); None when no request asked.

    Beside SGLang's per-row lists, the helper leaves the dense tensors those lists are views of
    (``top_logprobs_val_rows`` / ``_idx_rows`` [R, k >= every top_logprobs_num], and
    ``token_ids_logprobs_val_rows`` [R, L]; None when nobody asked): the engine copies them to the
    host in one transfer instead of one per row.
    """

    next_token_logits: torch.Tensor
    hidden_states: torch.Tensor | None = None
    next_token_logprobs: torch.Tensor | None = None
    next_token_top_logprobs_val: list | None = None
    next_token_top_logprobs_idx: list | None = None
    next_token_token_ids_logprobs_val: list | None = None
    next_token_token_ids_logprobs_idx: list | None = None
    top_logprobs_val_rows: torch.Tensor | None = None
    top_logprobs_idx_rows: torch.Tensor | None = None
    token_ids_logprobs_val_rows: torch.Tensor | None = None
