"""User-facing configuration: per-request sampling parameters and the speculative config.

Field names follow SGLang's (`max_new_tokens`, `stop_token_ids`, `top_logprobs_num`,
`token_ids_logprob`, `speculative_num_steps` ...) so settings carry over one to one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .op_checks import max_num_draft_tokens


@dataclass
class SamplingParams:
    """Per-request decoding parameters.

    temperature 0 means greedy (argmax). top_k = -1 keeps the whole vocabulary; top_p in (0, 1].
    Logprobs are the temperature-scaled log-softmax of the logits the token was drawn from (the
    engine's `return_original_logprob=True` asks for the raw log-softmax instead).
    """

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    return_logprob: bool = False
    top_logprobs_num: int = 0
    token_ids_logprob: list[int] | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, index: int, vocab_size: int) -> None:
        """Raise ValueError naming request `index` and the offending value."""
        def bad(what: str) -> ValueError:
            return ValueError(f"request {index}: {what}")

        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise bad(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not (self.temperature >= 0.0):  # also rejects NaN
            raise bad(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k == 0 or self.top_k < -1:
            raise bad(f"top_k must be -1 (off) or >= 1, got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_logprobs_num, int) or self.top_logprobs_num < 0:
            raise bad(f"top_logprobs_num must be an int >= 0, got {self.top_logprobs_num!r}")
        if self.top_logprobs_num > vocab_size:
            raise bad(f"top_logprobs_num={self.top_logprobs_num} exceeds the vocabulary size {vocab_size}")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or not 0 <= t < vocab_size:
                raise bad(f"stop token id {t!r} outside the vocabulary [0, {vocab_size})")
        for t in self.token_ids_logprob or []:
            if not isinstance(t, int) or not 0 <= t < vocab_size:
                raise bad(f"token_ids_logprob id {t!r} outside the vocabulary [0, {vocab_size})")


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding shape: S = num_steps (draft depth), K = topk, W = num_draft_tokens.

    W counts the tree's nodes including the root (the last verified token), so a K = 1 chain has
    W = S + 1. Constraints: K >= 1, S >= 1, 2 <= W <= 1 + K + (S - 1) K^2, and K = 1 forces W = S + 1.
    """

    num_steps: int
    topk: int = 1
    num_draft_tokens: int | None = None

    def __post_init__(self):
        S, K = self.num_steps, self.topk
        if not isinstance(S, int) or S < 1:
            raise ValueError(f"num_steps must be an int >= 1, got {S!r}")
        if not isinstance(K, int) or K < 1:
            raise ValueError(f"topk must be an int >= 1, got {K!r}")
        if self.num_draft_tokens is None:  # a chain for K = 1; else K nodes per depth, capped by the tree
            default = S + 1 if K == 1 else min(max_num_draft_tokens(K, S), 1 + S * K)
            object.__setattr__(self, "num_draft_tokens", default)
        W = self.num_draft_tokens
        w_max = max_num_draft_tokens(K, S)
        if not isinstance(W, int) or not 2 <= W <= w_max:
            raise ValueError(
                f"num_draft_tokens={W!r} must be in [2, 1 + topk + (num_steps-1)*topk^2] = [2, {w_max}] "
                f"for num_steps={S}, topk={K}")
        if K == 1 and W != S + 1:
            raise ValueError(
                f"topk=1 makes the tree a chain, so num_draft_tokens must equal num_steps + 1 = {S + 1}, got {W}")

    # SGLang's names, for code moved over from the serving engine.
    @property
    def speculative_num_steps(self) -> int:
        return self.num_steps

    @property
    def speculative_eagle_topk(self) -> int:
        return self.topk

    @property
    def speculative_num_draft_tokens(self) -> int:
        return self.num_draft_tokens

    @property
    def kv_margin(self) -> int:
        """Cache slots a decode step may write past the committed length."""
        return max(self.num_draft_tokens, (self.num_steps - 1) * self.topk, self.num_steps + 1)
