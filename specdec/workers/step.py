"""A decode step's types: what `draft()` hands `verify()` (`EagleVerifyInput`) and what a step returns
(`StepOutput`), and the finiteness of the target's rows."""
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
