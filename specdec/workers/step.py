"""A decode step's types: what `draft()` hands `verify()` (`EagleVerifyInput`), what a step returns
(`StepOutput`), the finiteness of the target's rows, and how the engine reads a step on the host (`StepTransfer`
brings a `StepOutput` over in one packed copy, `HostStep` is what it unpacks to)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ops.logprob_types import LogitsOutput


@dataclass
class StepOutput:
    """One step's result for B requests.

    predict: (B*W,) tokens chosen at each node; accept_index: (B, S+1) flat node indices of the
    accepted path, -1 padded; accept_lens: (B,) tokens emitted (accepted drafts + the bonus);
    logits_output: with logprobs filled when any request asked (else their fields are None);
    finite: (B,) bool, every target logit the step read for the request is finite (a NaN or an
    infinity there makes the step's tokens meaningless: the engine stops that request);
    empty: (B*W,) int8 like predict, or None when nothing shaped the logits: per node, `EMPTY_BY_PENALTIES`
    or `EMPTY_BY_GRAMMAR` where that stage left no token with a finite logit (the row is then decoded as if
    uniform, and the engine stops the request at that node), else 0.
    emitted: (B, S+1) `emitted_tokens()`, when the step made them already (a decode body does, inside a CUDA
    graph, so the engine's read of the step does not gather them eagerly), else None.
    """

    predict: torch.Tensor
    accept_index: torch.Tensor
    accept_lens: torch.Tensor
    logits_output: LogitsOutput
    finite: torch.Tensor
    empty: torch.Tensor | None = None
    emitted: torch.Tensor | None = None

    def emitted_tokens(self) -> torch.Tensor:
        """(B, S+1) tokens of the accepted path, slot j valid for j < accept_lens[b]."""
        if self.emitted is not None:
            return self.emitted
        return self.predict[self.accept_index.clamp_min(0).long()]

    def emitted_empty(self) -> torch.Tensor | None:
        """(B, S+1) int8: `empty` of the node each accepted slot's token was chosen at, or None."""
        return None if self.empty is None else self.empty[self.accept_index.clamp_min(0).long()]


def finite_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits: (B, ...) -> (B,) bool, True where every value of the request's rows is finite (on the device:
    the engine reads it with the step's other outputs, in its one transfer)."""
    return torch.isfinite(logits).flatten(1).all(1)


@dataclass
class EagleVerifyInput:
    """What `draft()` hands `verify()`: the verify tree of every request, as SGLang's EagleVerifyInput carries it
    (its `draft_token`, `custom_mask`, `positions`, `retrive_index`, `retrive_next_token`, `retrive_next_sibling`).
    Node 0 of each request is the root (its last verified token); W is the tree's width this step."""

    candidates: torch.Tensor  # (B, W) int64: each node's token
    tree_mask: torch.Tensor  # (B, W, W) bool: node i attends node j (its ancestors and itself)
    positions: torch.Tensor  # (B, W) int64: committed length + the node's depth
    retrieve_index: torch.Tensor  # (B, W): node -> its row b*W + i of the verify forward's logits
    retrieve_next_token: torch.Tensor  # (B, W): each node's first child, -1 if none
    retrieve_next_sibling: torch.Tensor  # (B, W): each node's next sibling, -1 if none
    draft_probs: torch.Tensor | None = None  # (B, W, V): the law each node's children were drawn from (sampled)


@dataclass
class HostStep:
    """One step's output on the host, read from the device in a single transfer.

    accept_lens: B ints; finite: B bools (every target logit the step read is finite); tokens: B lists of
    T = S+1 ints (slot j valid for j < accept_lens[b]); empty: B lists of T ints, slot j's code when the logits
    its token was chosen from had nothing left to decode (`StepOutput.empty`), or None when nothing shaped them;
    logprobs: B lists of T floats (None when nobody asked); the top-k and token-id logprobs as dense
    rows (row b*T + j), sliced per request by `top_logprobs` / `token_ids_logprobs`."""

    accept_lens: list[int]
    finite: list[bool]
    tokens: list[list[int]]
    empty: list[list[int]] | None
    logprobs: list[list[float]] | None
    top_val: list[list[float]] | None
    top_idx: list[list[int]] | None
    token_ids_val: list[list[float]] | None
    token_ids_idx: list[list[int]] | None
    width: int

    @staticmethod
    def pack(step) -> torch.Tensor:
        """Every field the engine emits, in one float64 buffer on the step's device (token ids < 2^53 are exact)."""
        lo = step.logits_output
        empty = step.emitted_empty()
        parts = [step.accept_lens, step.finite, step.emitted_tokens()] + ([] if empty is None else [empty])
        fields = [lo.next_token_logprobs, lo.top_logprobs_val_rows, lo.top_logprobs_idx_rows,
                  lo.token_ids_logprobs_val_rows]
        parts += [f for f in fields if f is not None]
        return torch.cat([p.reshape(-1).to(torch.float64) for p in parts])

    @classmethod
    def unpack(cls, step, flat: list[float]) -> "HostStep":
        """`pack`'s buffer, as a list on the host, sliced by the step's shapes (read on the host, not the device)."""
        lo = step.logits_output
        B, T = step.accept_index.shape
        empty = step.empty
        pos = 0

        def take(rows, cols, as_int=False):
            nonlocal pos
            out = [flat[pos + i * cols: pos + (i + 1) * cols] for i in range(rows)]
            pos += rows * cols
            return [[int(x) for x in row] for row in out] if as_int else out

        accept_lens = take(1, B, as_int=True)[0]
        finite = [bool(x) for x in take(1, B)[0]]
        tokens = take(B, T, as_int=True)
        empty = None if empty is None else take(B, T, as_int=True)
        logprobs = take(B, T) if lo.next_token_logprobs is not None else None
        top_val = take(*lo.top_logprobs_val_rows.shape) if lo.top_logprobs_val_rows is not None else None
        top_idx = (take(*lo.top_logprobs_idx_rows.shape, as_int=True) if lo.top_logprobs_idx_rows is not None
                   else None)
        tid = lo.token_ids_logprobs_val_rows
        token_ids_val = take(*tid.shape) if tid is not None else None
        return cls(accept_lens, finite, tokens, empty, logprobs, top_val, top_idx, token_ids_val,
                   lo.next_token_token_ids_logprobs_idx, T)

    def top_logprobs(self, b: int, j: int, k: int) -> list[tuple[float, int]]:
        if self.top_val is None:
            return []
        row = b * self.width + j
        return list(zip(self.top_val[row][:k], self.top_idx[row][:k]))

    def token_ids_logprobs(self, b: int, j: int) -> list[tuple[float, int]]:
        if self.token_ids_val is None:
            return []
        row = b * self.width + j
        ids = self.token_ids_idx[row]
        return list(zip(self.token_ids_val[row][:len(ids)], list(ids)))


class StepTransfer:
    """A step's outputs on their way to the host: `HostStep.pack`ed on the device when made, copied without
    blocking into pinned memory from a CUDA device (an event marks the copy's end), read by `wait`. Packing when
    the step is enqueued is what lets the engine enqueue the next one before reading this one: the pack is
    ordered before the next step on the stream, which may overwrite the step's tensors (a CUDA graph's outputs).
    requests: the request of each row of the step."""

    def __init__(self, step, requests: list[int]):
        self.step, self.requests = step, list(requests)
        flat = HostStep.pack(step)
        self.copied = None
        if flat.is_cuda:
            self.buffer = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            self.buffer.copy_(flat, non_blocking=True)
            self.copied = torch.cuda.Event()
            self.copied.record()
        else:
            self.buffer = flat

    def wait(self) -> HostStep:
        if self.copied is not None:
            self.copied.synchronize()
        return HostStep.unpack(self.step, self.buffer.tolist())
