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
    (vocab size when off); top_ps: (B,) fp32; is_greedy: (B,) bool. When some request has penalties
    (`penalized`), also frequency_penalties, presence_penalties, repetition_penalties (B,) fp32,
    min_new_tokens (B,) int64, stop_mask (B, V) bool (its stop ids) and logit_bias (B, V) fp32 (the
    request's counts are worker state: they change every step).
    """

    BASE_TENSORS = ("temperatures", "top_ks", "top_ps", "is_greedy")
    PENALTY_TENSORS = ("frequency_penalties", "presence_penalties", "repetition_penalties", "min_new_tokens",
                       "stop_mask", "logit_bias")

    def __init__(self, params: list[SamplingParams], vocab_size: int, device):
        self.temperatures = torch.tensor([1.0 if p.is_greedy else p.temperature for p in params],
                                         dtype=torch.float32, device=device)
        self.top_ks = torch.tensor([vocab_size if p.top_k == -1 else min(p.top_k, vocab_size) for p in params],
                                   dtype=torch.int64, device=device)
        self.top_ps = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
        self.is_greedy = torch.tensor([p.is_greedy for p in params], dtype=torch.bool, device=device)
        self._set_flags(params)
        if self.penalized:
            self._set_penalties(params, vocab_size, device)

    def _set_penalties(self, params: list[SamplingParams], vocab_size: int, device) -> None:
        def per_request(name, dtype):
            return torch.tensor([getattr(p, name) for p in params], dtype=dtype, device=device)

        self.frequency_penalties = per_request("frequency_penalty", torch.float32)
        self.presence_penalties = per_request("presence_penalty", torch.float32)
        self.repetition_penalties = per_request("repetition_penalty", torch.float32)
        self.min_new_tokens = per_request("min_new_tokens", torch.int64)
        stop_mask = torch.zeros(len(params), vocab_size, dtype=torch.bool)
        logit_bias = torch.zeros(len(params), vocab_size, dtype=torch.float32)
        for b, p in enumerate(params):
            stop_mask[b, list(p.stop_token_ids)] = True
            for token, bias in (p.logit_bias or {}).items():
                logit_bias[b, token] = bias
        self.stop_mask, self.logit_bias = stop_mask.to(device), logit_bias.to(device)

    #: the batch-wide flags a step branches on (which verify runs, which filters, whether penalties apply): a
    #: CUDA graph is captured per value of `flags`
    FLAGS = ("all_greedy", "any_greedy", "any_top_k", "any_top_p", "penalized")

    @property
    def flags(self) -> tuple[bool, ...]:
        return tuple(getattr(self, name) for name in self.FLAGS)

    def _set_flags(self, params: list[SamplingParams]) -> None:
        self.all_greedy = all(p.is_greedy for p in params)
        self.any_greedy = any(p.is_greedy for p in params)
        sampled = [p for p in params if not p.is_greedy]
        self.any_top_k = any(p.top_k != -1 for p in sampled)
        self.any_top_p = any(p.top_p < 1.0 for p in sampled)
        self.penalized = any(p.has_penalties for p in params)

    @property
    def tensor_names(self) -> tuple[str, ...]:
        """The per-request tensors held now (what a filter or a CUDA graph's static copy must carry)."""
        return self.BASE_TENSORS + (self.PENALTY_TENSORS if self.penalized else ())

    def filter(self, keep: torch.Tensor, params: list[SamplingParams]) -> None:
        for name in self.tensor_names:
            setattr(self, name, getattr(self, name)[keep])
        self._set_flags(params)
        if not self.penalized:
            for name in self.PENALTY_TENSORS:
                self.__dict__.pop(name, None)

    def probs(self, logits, ops, nodes_per_request: int = 1):
        """logits: (B * nodes_per_request, V), request-major -> the target's probabilities (N, V) fp32.

        softmax(logits / T), then top-k, then top-p over the renormalised top-k probabilities (the
        order of SGLang's verify), each through the ops module `ops`. A filter no request asked for
        is skipped: either costs more than the softmax.
        """
        n = nodes_per_request

        def per_row(t):
            return t if n == 1 else t.repeat_interleave(n)

        probs = ops.softmax_with_temperature(logits, per_row(self.temperatures))
        if self.any_top_k:
            probs = ops.top_k_renorm_prob(probs, per_row(self.top_ks))
        if self.any_top_p:
            probs = ops.top_p_renorm_prob(probs, per_row(self.top_ps))
        return probs


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
        """-> (B, n) fp32 in [0, 1) on `device`. Drawn on the host; copied without blocking on CUDA."""
        u = torch.stack([torch.rand(n, generator=g) for g in self.generators])
        device = torch.device(device)
        if device.type == "cuda":
            return u.pin_memory().to(device, non_blocking=True)
        return u.to(device)

    def filter(self, keep: list[int]) -> None:
        self.generators = [self.generators[i] for i in keep]
