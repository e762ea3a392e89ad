"""User-facing configuration: per-request sampling parameters and the speculative config.

Field names follow SGLang's (`max_new_tokens`, `stop_token_ids`, `top_logprobs_num`,
`token_ids_logprob`, `speculative_num_steps` ...) so settings carry over one to one.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .checks import check_int, check_real
from .ops.contract import greedy_temperature, max_num_draft_tokens
from .verify_rules import shape_of, verify_rule

@dataclass
class SamplingParams:
    """Per-request decoding parameters.

    temperature 0 means greedy (argmax), and so does any temperature below 1e-6
    (`GREEDY_TEMPERATURE_BELOW`, SGLang's rule); it must be finite. top_k = -1 keeps the whole
    vocabulary; top_p in (0, 1]. Integer fields take Python or numpy integers, never bools.
    Logprobs are the temperature-scaled log-softmax of the logits the token was drawn from (the
    engine's `return_original_logprob=True` asks for the raw log-softmax instead), after the penalties.

    Penalties (SGLang's and the OpenAI API's names): `frequency_penalty` and `presence_penalty` in [-2, 2]
    over the output tokens (`logit -= frequency * count + presence * (count > 0)`); `repetition_penalty` > 0
    (1 off) over prompt and output tokens (a positive logit divided by it, a negative one multiplied);
    `min_new_tokens` holds the stop ids back until that many tokens are out; `logit_bias` maps token ids
    (ints, or their decimal strings as JSON carries them) to a bias added to that logit (-inf bans the token).

    Structured output (SGLang's names, at most one per request, compiled with xgrammar: the `grammar` extra):
    `json_schema` (a JSON string or a dict), `regex`, `ebnf` (xgrammar's EBNF, `root ::= ...`). The logits are
    masked to the tokens the grammar allows after the output so far; once it is complete only its terminators
    (the tokenizer's EOS ids) are, and emitting one ends the request ("stop"). `stop_token_ids` are not grammar
    terminators: they end the request after sampling, as for any request, even where the grammar needs them as
    content. min_new_tokens holds the stop ids and the grammar's terminators back.

    A step whose logits, after the penalties, the logit bias, min_new_tokens and the grammar mask, allow no token
    at all ends the request with finish_reason "error" and an `error` naming what emptied them; the tokens
    before it stand.
    """

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    return_logprob: bool = False
    top_logprobs_num: int = 0
    token_ids_logprob: list[int] | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    logit_bias: dict[int, float] | None = None
    json_schema: str | dict | None = None
    regex: str | None = None
    ebnf: str | None = None

    @property
    def has_grammar(self) -> bool:
        """Whether a JSON schema, a regex or an EBNF grammar constrains this request's output."""
        return self.json_schema is not None or self.regex is not None or self.ebnf is not None

    @property
    def is_greedy(self) -> bool:
        return greedy_temperature(self.temperature)

    @property
    def has_penalties(self) -> bool:
        """Whether any penalty, min_new_tokens or a logit bias changes this request's logits."""
        return (self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0
                or self.min_new_tokens > 0 or bool(self.logit_bias))

    def validated(self, index: int, vocab_size: int) -> "SamplingParams":
        """A checked copy with plain Python values (numpy integers -> int, a temperature below
        GREEDY_TEMPERATURE_BELOW -> 0.0); ValueError naming request `index` and the value otherwise."""
        def bad(what: str) -> ValueError:
            return ValueError(f"request {index}: {what}")

        def checked(check, *args):
            try:
                return check(*args)
            except ValueError as e:  # ArgumentTypeError too: it is a ValueError
                raise type(e)(f"request {index}: {e}") from None

        def integer(name, minimum, maximum=None):
            return checked(check_int, name, getattr(self, name), minimum, maximum)

        def real(name):
            return checked(check_real, name, getattr(self, name))

        def token_list(name, allow_none):
            ids = getattr(self, name)
            if ids is None and allow_none:
                return None
            if not isinstance(ids, (list, tuple)):
                raise bad(f"{name} must be a list of token ids, got {type(ids).__name__} {ids!r}")
            return [checked(check_int, f"{name}[{i}]", t, 0, vocab_size - 1) for i, t in enumerate(ids)]

        max_new_tokens = integer("max_new_tokens", 1)
        temperature = real("temperature")
        if not (0.0 <= temperature < math.inf):  # also rejects NaN
            raise bad(f"temperature must be finite and >= 0, got {self.temperature!r}")
        if greedy_temperature(temperature):
            temperature = 0.0
        top_k = integer("top_k", -1)
        if top_k == 0:
            raise bad("top_k must be -1 (off) or >= 1, got 0")
        top_p = real("top_p")
        if not (0.0 < top_p <= 1.0):
            raise bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.return_logprob, bool):
            raise bad(f"return_logprob must be True or False, got {type(self.return_logprob).__name__} "
                      f"{self.return_logprob!r}")
        top_logprobs_num = integer("top_logprobs_num", 0, vocab_size)

        def finite(name, lo, hi=None):
            v = checked(check_real, name, getattr(self, name), lo, hi)
            if not math.isfinite(v) or (hi is None and v <= lo):
                raise bad(f"{name} must be a finite number {'> ' + str(lo) if hi is None else 'in ' + str([lo, hi])}"
                          f", got {v}")
            return v

        frequency_penalty = finite("frequency_penalty", -2.0, 2.0)
        presence_penalty = finite("presence_penalty", -2.0, 2.0)
        repetition_penalty = finite("repetition_penalty", 0.0)
        min_new_tokens = integer("min_new_tokens", 0, max_new_tokens)
        logit_bias = None
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise bad(f"logit_bias must be a dict of token id -> bias, got {type(self.logit_bias).__name__}")
            logit_bias = {}
            for key, value in self.logit_bias.items():
                token = int(key) if isinstance(key, str) and key.strip().isdigit() else key
                token = checked(check_int, f"logit_bias key {key!r}", token, 0, vocab_size - 1)
                bias = checked(check_real, f"logit_bias[{key!r}]", value)
                if math.isnan(bias) or bias == math.inf:  # -inf bans the token, as a mask would
                    raise bad(f"logit_bias[{key!r}] must be finite or -inf, got {bias}")
                logit_bias[token] = bias
        grammars = [name for name in ("json_schema", "regex", "ebnf") if getattr(self, name) is not None]
        if len(grammars) > 1:
            raise bad(f"at most one of json_schema, regex and ebnf may be set, got {' and '.join(grammars)}")
        for name in grammars:
            value = getattr(self, name)
            if not (isinstance(value, str) or (name == "json_schema" and isinstance(value, dict))):
                kinds = "a JSON string or a dict" if name == "json_schema" else "a string"
                raise bad(f"{name} must be {kinds}, got {type(value).__name__}")
        return dataclasses.replace(self, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                   top_p=top_p, stop_token_ids=token_list("stop_token_ids", False),
                                   top_logprobs_num=top_logprobs_num,
                                   token_ids_logprob=token_list("token_ids_logprob", True),
                                   frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                                   repetition_penalty=repetition_penalty, min_new_tokens=min_new_tokens,
                                   logit_bias=logit_bias)


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding shape: S = num_steps (draft depth), K = topk, W = num_draft_tokens.

    W counts the tree's nodes including the root (the last verified token), so a K = 1 chain has
    W = S + 1. Constraints: K >= 1, S >= 1, 2 <= W <= 1 + K + (S - 1) K^2, and K = 1 forces W = S + 1.
    """

    num_steps: int
    topk: int = 1
    num_draft_tokens: int | None = None
    #: "exact": each tree node's logits penalised along its own path (lossless); "sglang": every node as the
    #: root, SGLang's approximation (lossy under penalties; for measuring what it costs)
    penalty_mode: str = "exact"
    #: the draft's proposals penalised too, along their own paths (a speed choice: what is emitted never
    #: changes); heads whose vocabulary is not the target's (a reduced EAGLE-3 vocabulary) propose unpenalised
    draft_penalties: bool = False
    #: the draft's proposals masked by the request's grammar too, along their own paths (a speed choice: a masked
    #: draft never proposes a token the grammar forbids; what is emitted never changes). A host round trip per
    #: draft step of a grammar batch; heads with a reduced vocabulary (EAGLE-3) propose unmasked
    draft_grammar: bool = False
    #: how the draft proposes for sampled requests: "topk", SGLang's (its K most probable tokens), or "sample"
    #: (K draws from its distribution at the request's temperature / top-k / top-p, without replacement, on a
    #: tree of fixed shape); greedy requests always propose the top-K
    draft_sampling: str = "topk"
    #: how sampled requests are verified, a registered rule (`specdec.verify_rules`): "target_only" (SGLang's),
    #: "rejection" (with the draft's distribution: token-wise on a chain, recursive over siblings on a tree), "block"
    #: (block verification, chains) or "traversal" (Traversal Verification: trees and chains, leaves first); a rule
    #: that reads the draft's distribution (all but the first) needs draft_sampling="sample". Greedy requests always
    #: take greedy verification
    verify: str = "target_only"

    def __post_init__(self):
        S = check_int("num_steps", self.num_steps, 1)
        K = check_int("topk", self.topk, 1)
        if self.num_draft_tokens is None:  # a chain for K = 1; else K nodes per depth, capped by the tree
            W = S + 1 if K == 1 else min(max_num_draft_tokens(K, S), 1 + S * K)
        else:
            W, w_max = check_int("num_draft_tokens", self.num_draft_tokens), max_num_draft_tokens(K, S)
            if not 2 <= W <= w_max:
                raise ValueError(f"num_draft_tokens={W} must be in [2, 1 + topk + (num_steps-1)*topk^2] = "
                                 f"[2, {w_max}] for num_steps={S}, topk={K}")
        for name in ("draft_penalties", "draft_grammar"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.draft_sampling not in ("topk", "sample"):
            raise ValueError(f"draft_sampling must be 'topk' or 'sample', got {self.draft_sampling!r}")
        rule = verify_rule(self.verify)
        if rule.reads_draft and self.draft_sampling != "sample":
            raise ValueError(f"verify={self.verify!r} reads the draft's distribution: it needs "
                             f"draft_sampling='sample', got {self.draft_sampling!r}")
        if not rule.runs_on(K):
            raise ValueError(f"verify={self.verify!r} verifies a {' or a '.join(rule.shapes)}: it cannot verify the "
                             f"{shape_of(K)} of topk={K}")
        if self.penalty_mode not in ("exact", "sglang"):
            raise ValueError(f"penalty_mode must be 'exact' or 'sglang', got {self.penalty_mode!r}")
        for name, v in (("num_steps", S), ("topk", K), ("num_draft_tokens", W)):
            object.__setattr__(self, name, v)  # plain ints, numpy integers included
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

