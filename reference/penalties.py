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

from specdec.checks import check_penalty_args

__all__ = ["apply_penalties_tree", "path_token_counts"]


def path_token_counts(candidates: torch.Tensor, tree_mask: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """candidates (B, W) int, tree_mask (B, W, W) bool or None -> (B, W, V) int32: how often each token lies
    on node i's path below the root (the nodes j > 0 with tree_mask[b, i, j]); all zero for None."""
    B, W = candidates.shape
    counts = torch.zeros(B, W, vocab_size, dtype=torch.int32, device=candidates.device)
    if tree_mask is None or W == 1:
        return counts
    below_root = tree_mask[:, :, 1:].to(torch.int32)  # (B, W, W-1)
    ids = candidates[:, None, 1:].long().expand(B, W, W - 1)
    return counts.scatter_add_(2, ids, below_root)


def apply_penalties_tree(logits, candidates, tree_mask, output_counts, prompt_mask, output_lens,
                         frequency_penalties, presence_penalties, repetition_penalties, min_new_tokens,
                         stop_mask, logit_bias):
    """Shape contract: logits (B*W, V) float, request-major (row b*W + i is node i of request b);
    candidates (B, W) int, node 0 the root; tree_mask (B, W, W) bool (row i: i and its ancestors, as
    `build_tree_kernel_efficient` gives it) or None (SGLang's approximation: every node as the root);
    output_counts (B, V) int32, each token's count in the committed output; prompt_mask (B, V) bool, the
    prompt's tokens; output_lens (B,) int, committed output length; frequency_penalties,
    presence_penalties, repetition_penalties (B,) float32; min_new_tokens (B,) int; stop_mask (B, V) bool,
    the tokens min_new_tokens holds back; logit_bias (B, V) float32. Returns (B*W, V) float32.

    At node i of depth d with path counts c = output_counts + (tokens on its path):
    ``l - frequency * c - presence * (c > 0)``; -inf on stop tokens while ``output_lens + d <
    min_new_tokens``; then where the token is in the prompt or c > 0, ``l / repetition`` if ``l > 0`` else
    ``l * repetition``; then ``+ logit_bias``. Computed in float32; no host synchronisation.
    """
    B, W, V = check_penalty_args(logits, candidates, tree_mask, output_counts, prompt_mask, output_lens,
                                 frequency_penalties, presence_penalties, repetition_penalties, min_new_tokens,
                                 stop_mask, logit_bias)
    l = logits.float().view(B, W, V)
    counts = output_counts[:, None, :] + path_token_counts(candidates, tree_mask, V)
    present = counts > 0
    l = l - frequency_penalties[:, None, None] * counts - presence_penalties[:, None, None] * present
    depth = (torch.zeros(B, W, dtype=torch.int64, device=l.device) if tree_mask is None
             else tree_mask.sum(-1) - 1)
    held = (output_lens[:, None] + depth < min_new_tokens[:, None])[:, :, None] & stop_mask[:, None, :]
    l = l.masked_fill(held, float("-inf"))
    rep = repetition_penalties[:, None, None]
    seen = present | prompt_mask[:, None, :]
    l = torch.where(seen, torch.where(l > 0, l / rep, l * rep), l)
    return (l + logit_bias[:, None, :]).view(B * W, V)
