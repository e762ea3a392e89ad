"""Pure-PyTorch reference of the target distribution's ops: softmax with temperature and SGLang's
(FlashInfer's) sampling filters ``top_k_renorm_prob`` and ``top_p_renorm_prob``.

A sampled request verifies against softmax(logits / T), then top-k, then top-p over the
*renormalised* top-k probabilities (the order of SGLang's verify and of Hugging Face's warpers).
Both filters decide by value, so tied tokens share one decision: a tie at the boundary is kept
whole. Values inside the tensors are trusted (reading them would be a host sync); shapes, dtypes
and devices are checked by ``specdec.ops.op_checks``.
"""

from __future__ import annotations

import torch

from specdec.ops.op_checks import check_renorm_prob_args, check_softmax_with_temperature_args

__all__ = ["softmax_with_temperature", "top_k_renorm_prob", "top_p_renorm_prob"]


def softmax_with_temperature(logits, temperatures):
    """logits: (N, V) fp32/bf16/fp16; temperatures: (N,) float -> probs (N, V) fp32.

    softmax(logits / T) per row, computed in fp32 from the upcast logits. A -inf logit gets
    probability 0; a row that is all -inf is NaN, as in torch.softmax. T > 0 is trusted.
    """
    check_softmax_with_temperature_args(logits, temperatures)
    x = logits.float() / temperatures.float()[:, None]
    # Spelled out rather than torch.softmax: torch's CPU softmax accumulates its sum with a relative
    # error near 1e-5 at V = 2^17, where torch.sum's cascade stays within a few ulps.
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def _renormalise(probs, keep):
    kept = torch.where(keep, probs, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def top_k_renorm_prob(probs, top_ks):
    """probs: (N, V) fp32 >= 0; top_ks: (N,) int -> (N, V) fp32.

    Keeps token v iff fewer than top_k tokens have a probability strictly greater than p(v), that is
    p(v) >= the k-th largest value: every token tied with the k-th largest is kept (Hugging Face's
    TopKLogitsWarper and FlashInfer do the same), so more than top_k tokens may survive. The others
    are zeroed and the row renormalised. top_k is clamped to [1, V]: top_k >= V keeps every token.
    """
    _, V = check_renorm_prob_args(probs, "top_ks", top_ks, integer=True)
    sorted_p = probs.sort(dim=-1, descending=True).values
    k = top_ks.to(device=probs.device, dtype=torch.int64).clamp(1, V)
    kth_largest = sorted_p.gather(1, (k - 1)[:, None])
    return _renormalise(probs, probs >= kth_largest)


def top_p_renorm_prob(probs, top_ps):
    """probs: (N, V) fp32 >= 0, rows summing to 1; top_ps: (N,) float -> (N, V) fp32.

    Keeps token v iff the total mass of the tokens with a probability strictly greater than p(v) is
    <= top_p (without ties, SGLang's "mass before it in descending order <= top_p"; tied tokens
    share one decision, so a tie at the boundary is kept whole). The row's maximum is always kept;
    top_p >= 1 keeps every token, whatever the rounding of the row's total. The others are zeroed
    and the row renormalised. Masses are fp32 sums.
    """
    check_renorm_prob_args(probs, "top_ps", top_ps, integer=False)
    sorted_p = probs.sort(dim=-1, descending=True).values
    # Exclusive prefix sum: at the first token of a tied run it is the mass strictly greater than
    # the run's value, and it never decreases, so the kept runs are a prefix of the sorted row.
    mass_before = torch.cat([torch.zeros_like(sorted_p[:, :1]), sorted_p[:, :-1].cumsum(dim=-1)], dim=-1)
    top_p = top_ps.to(device=probs.device, dtype=torch.float32)[:, None]
    num_kept = (mass_before <= top_p).sum(dim=-1, keepdim=True).clamp_min(1)
    threshold = sorted_p.gather(1, num_kept - 1)
    return _renormalise(probs, (probs >= threshold) | (top_p >= 1.0))
