"""Triton version of ``reference.penalties.apply_penalties_tree``: the same name, signature and contract.

One program per (logits row, vocabulary block). A program reads its block of the row's logits and of the
request's committed counts, prompt mask, stop mask and bias, adds the row's path (at most W - 1 tokens,
walked from the tree mask's row) to the counts of the tokens in the block, and writes the penalised block
once: one read and one write of the logits, as a copy would.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.ops.op_checks import check_penalty_args

__all__ = ["apply_penalties_tree"]

BLOCK_V = 1024


@triton.jit
def apply_penalties_tree_kernel(logits_ptr, out_ptr, candidates_ptr, tree_mask_ptr, counts_ptr, prompt_ptr,
                                output_lens_ptr, frequency_ptr, presence_ptr, repetition_ptr, min_new_ptr,
                                stop_ptr, bias_ptr, R, W, V, stride_logits, HAS_TREE: tl.constexpr,
                                BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    b = row // R
    idx = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    in_vocab = idx < V
    x = tl.load(logits_ptr + row * stride_logits + idx, mask=in_vocab, other=0.0).to(tl.float32)
    req = b * V + idx
    counts = tl.load(counts_ptr + req, mask=in_vocab, other=0)
    depth = 0
    if HAS_TREE:
        for j in range(1, W):
            on_path = tl.load(tree_mask_ptr + row * W + j).to(tl.int32)  # row = b*R + r: mask[b, r, j]
            token = tl.load(candidates_ptr + b * W + j)
            counts += tl.where(idx == token, on_path, 0)
            depth += on_path
    frequency = tl.load(frequency_ptr + b)
    presence = tl.load(presence_ptr + b)
    present = counts > 0
    x = x - frequency * counts.to(tl.float32) - presence * present.to(tl.float32)
    held = tl.load(output_lens_ptr + b) + depth < tl.load(min_new_ptr + b)
    stop = tl.load(stop_ptr + req, mask=in_vocab, other=0) != 0
    x = tl.where(held & stop, float("-inf"), x)
    rep = tl.load(repetition_ptr + b)
    seen = present | (tl.load(prompt_ptr + req, mask=in_vocab, other=0) != 0)
    # div_rn: torch's fp32 division is correctly rounded, the compiled default is not
    x = tl.where(seen, tl.where(x > 0, tl.math.div_rn(x, rep), x * rep), x)
    x = x + tl.load(bias_ptr + req, mask=in_vocab, other=0.0)
    tl.store(out_ptr + row * V + idx, x, mask=in_vocab)


def _launch_apply_penalties_tree(logits, candidates, tree_mask, output_counts, prompt_mask, output_lens,
                                 frequency_penalties, presence_penalties, repetition_penalties, min_new_tokens,
                                 stop_mask, logit_bias, B, R, W, V):
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    out = torch.empty((B * R, V), dtype=torch.float32, device=logits.device)
    if B * R == 0:
        return out
    has_tree = tree_mask is not None and W > 1
    mask = tree_mask.contiguous() if has_tree else candidates  # an unread placeholder without a tree
    apply_penalties_tree_kernel[(B * R, triton.cdiv(V, BLOCK_V))](
        logits, out, candidates.contiguous(), mask, output_counts.contiguous(), prompt_mask.contiguous(),
        output_lens.contiguous(), frequency_penalties.float().contiguous(), presence_penalties.float().contiguous(),
        repetition_penalties.float().contiguous(), min_new_tokens.contiguous(), stop_mask.contiguous(),
        logit_bias.float().contiguous(), R, W, V, logits.stride(0), HAS_TREE=has_tree, BLOCK_V=BLOCK_V)
    return out


def apply_penalties_tree(logits, candidates, tree_mask, output_counts, prompt_mask, output_lens,
                         frequency_penalties, presence_penalties, repetition_penalties, min_new_tokens,
                         stop_mask, logit_bias):
    """Shape contract: as ``reference.apply_penalties_tree`` (logits (B*R, V) float, candidates (B, W),
    tree_mask (B, R, W) bool or None (R = W), output_counts (B, V) int32, prompt_mask / stop_mask (B, V) bool,
    output_lens / min_new_tokens (B,) int, the three penalties (B,) float32, logit_bias (B, V) float32)
    -> (B*R, V) float32."""
    B, R, W, V = check_penalty_args(logits, candidates, tree_mask, output_counts, prompt_mask, output_lens,
                                 frequency_penalties, presence_penalties, repetition_penalties, min_new_tokens,
                                 stop_mask, logit_bias)
    return _launch_apply_penalties_tree(logits, candidates, tree_mask, output_counts, prompt_mask, output_lens,
                                        frequency_penalties, presence_penalties, repetition_penalties,
                                        min_new_tokens, stop_mask, logit_bias, B, R, W, V)
