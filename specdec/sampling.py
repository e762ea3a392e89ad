"""Target probabilities (temperature, top-k, top-p) and inverse-CDF sampling from given uniforms.

Randomness never originates inside an op: uniforms are drawn on the host from one seeded
generator per request, so a request's stream does not depend on its batch or on the device.
"""
from __future__ import annotations

import torch

from .config import SamplingParams


class SamplingTensors:
    """Per-request sampling parameters as device tensors (leading dim B).

    temperatures: (B,) fp32 (1.0 for greedy requests, as SGLang stores them); top_ks: (B,) int64
    (vocab size when off); top_ps: (B,) fp32; is_greedy: (B,) bool.
    """

    def __init__(self, params: list[SamplingParams], vocab_size: int, device):
        self.temperatures = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params],
                                         dtype=torch.float32, device=device)
        self.top_ks = torch.tensor([vocab_size if p.top_k == -1 else min(p.top_k, vocab_size) for p in params],
                                   dtype=torch.int64, device=device)
        self.top_ps = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
        self.is_greedy = torch.tensor([p.is_greedy for p in params], dtype=torch.bool, device=device)
        self._set_flags(params)

    def _set_flags(self, params: list[SamplingParams]) -> None:
        self.all_greedy = all(p.is_greedy for p in params)
        self.any_greedy = any(p.is_greedy for p in params)
        self.any_filter = any(p.top_k != -1 or p.top_p < 1.0 for p in params if not p.is_greedy)

    def filter(self, keep: torch.Tensor, params: list[SamplingParams]) -> None:
        for name in ("temperatures", "top_ks", "top_ps", "is_greedy"):
            setattr(self, name, getattr(self, name)[keep])
        self._set_flags(params)

    def probs(self, logits, nodes_per_request: int = 1):
        """logits: (B * nodes_per_request, V), request-major -> the target's probabilities (fp32)."""
        n = nodes_per_request
        temperatures = self.temperatures if n == 1 else self.temperatures.repeat_interleave(n)
        if not self.any_filter:  # the sort of the top-k / top-p filter costs more than the softmax
            return torch.softmax(logits.float() / temperatures[:, None], dim=-1)
        top_ks = self.top_ks if n == 1 else self.top_ks.repeat_interleave(n)
        top_ps = self.top_ps if n == 1 else self.top_ps.repeat_interleave(n)
        return target_probs(logits, temperatures, top_ks, top_ps)


def target_probs(logits, temperatures, top_ks, top_ps):
    """logits: (N, V); temperatures, top_ps: (N,) fp32; top_ks: (N,) int64 -> probs (N, V) fp32.

    softmax(logits / T), then SGLang's top-k / top-p filter on the sorted probabilities (a token is
    kept when its rank < top_k and the mass strictly before it is <= top_p), renormalised.
    """
    probs = torch.softmax(logits.float() / temperatures[:, None], dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    mass_before = sorted_p.cumsum(-1) - sorted_p
    rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    drop = (rank >= top_ks[:, None]) | (mass_before > top_ps[:, None])
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    filtered = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return filtered / filtered.sum(-1, keepdim=True)


def sample_from_probs(probs, uniforms):
    """probs: (N, V) non-negative (unnormalised is fine); uniforms: (N,) in [0, 1) -> (N,) int64.

    Inverse CDF: the first token whose cumulative mass exceeds u * total (strictly, so a token of
    zero mass is never drawn).
    """
    cdf = probs.float().cumsum(-1)
    threshold = uniforms.float()[:, None] * cdf[:, -1:]
    return (cdf <= threshold).sum(-1).clamp_max(probs.shape[-1] - 1)


class RequestRNG:
    """One seeded CPU generator per request: request i of a call with `seed` draws the same stream
    whatever batch it is in."""

    def __init__(self, seed: int, num_requests: int):
        self.generators = [torch.Generator().manual_seed((seed * 1_000_003 + i) % (2 ** 63))
                           for i in range(num_requests)]

    def uniforms(self, n: int, device) -> torch.Tensor:
        """-> (B, n) fp32 in [0, 1). Drawn on the host; copied without blocking on CUDA."""
        u = torch.stack([torch.rand(n, generator=g) for g in self.generators])
        if torch.device(device).type == "cuda":
            return u.pin_memory().to(device, non_blocking=True)
        return u

    def filter(self, keep: list[int]) -> None:
        self.generators = [self.generators[i] for i in keep]
