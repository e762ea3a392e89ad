"""Penalties, min_new_tokens and logit bias on the logits of every tree node, each node by its own path.

The rule that keeps speculative decoding lossless under penalties: the logits at node n are processed as
plain decoding would process them after emitting the committed output and then the tokens on the path from
the root to n (n's own token included; the root's token is the last committed one, already counted).
SGLang instead repeats each request's penalties over every node alike (exact at the root only): passing
``tree_mask=None`` computes that approximation, so its cost can be measured.

The order is SGLang's sampler's (`SamplingBatchInfo.apply_logits_bias`, spec v2's path): the additive
penalties (frequency, presence, and -inf on the stop tokens while fewer than ``min_new_tokens`` are out),
then the repetition scaling, then the logit bias. Temperature, top-k and top-p come after, in the sampler.
"""
from __future__ import annotations

import torch

from specdec.ops.op_checks import check_penalty_args

__all__ = ["apply_penalties_tree", "path_token_counts"]


def path_token_counts(candidates: torch.Tensor, tree_mask: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """candidates (B, W) int, tree_mask (B, R, W) bool or None -> (B, R, V) int32: how often each token lies
    on row r's path below the root (the candidates j > 0 with tree_mask[b, r, j]); all zero for None (R = W)."""
    B, W = candidates.shape
    R = W if tree_mask is None else tree_mask.shape[1]
    counts = torch.zeros(B, R, vocab_size, dtype=torch.int32, device=candidates.device)
    if tree_mask is None or W == 1:
        return counts
    below_root = tree_mask[:, :, 1:].to(torch.int32)  # (B, R, W-1)
    ids = candidates[:, None, 1:].long().expand(B, R, W - 1)
    return counts.scatter_add_(2, ids, below_root)


def apply_penalties_tree(logits, candidates, tree_mask, output_counts, prompt_mask, output_lens,
                         frequency_penalties, presence_penalties, repetition_penalties, min_new_tokens,
                         stop_mask, logit_bias):
    """Shape contract: logits (B*R, V) float, request-major (row b*R + r is row r of request b);
    candidates (B, W) int, node 0 the root; tree_mask (B, R, W) bool, row r's path over the candidates (in a
    verify R = W and row i is node i and its ancestors, as `build_tree_kernel_efficient` gives it; a draft step
    passes its frontier's rows) or None (R = W, SGLang's approximation: every node as the root);
    output_counts (B, V) int32, each token's count in the committed output; prompt_mask (B, V) bool, the
    prompt's tokens; output_lens (B,) int, committed output length; frequency_penalties,
    presence_penalties, repetition_penalties (B,) float32; min_new_tokens (B,) int; stop_mask (B, V) bool,
    the tokens min_new_tokens holds back; logit_bias (B, V) float32. Returns (B*R, V) float32.

    At row r of depth d (the candidates j > 0 on its path) with path counts c = output_counts + those tokens:
    ``x - frequency * c - presence * (c > 0)``; -inf on stop tokens while ``output_lens + d <
    min_new_tokens``; then where the token is in the prompt or c > 0, ``x / repetition`` if ``x > 0`` else
    ``x * repetition``; then ``+ logit_bias``. Computed in float32; no host synchronisation.
    """
    B, R, W, V = check_penalty_args(logits, candidates, tree_mask, output_counts, prompt_mask, output_lens,
                                 frequency_penalties, presence_penalties, repetition_penalties, min_new_tokens,
                                 stop_mask, logit_bias)
    x = logits.float().view(B, R, V)
    counts = output_counts[:, None, :] + path_token_counts(candidates, tree_mask, V)
    present = counts > 0
    x = x - frequency_penalties[:, None, None] * counts - presence_penalties[:, None, None] * present
    depth = (torch.zeros(B, R, dtype=torch.int64, device=x.device) if tree_mask is None
             else tree_mask[:, :, 1:].sum(-1))
    held = (output_lens[:, None] + depth < min_new_tokens[:, None])[:, :, None] & stop_mask[:, None, :]
    x = x.masked_fill(held, float("-inf"))
    rep = repetition_penalties[:, None, None]
    seen = present | prompt_mask[:, None, :]
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    return (x + logit_bias[:, None, :]).view(B * R, V)
