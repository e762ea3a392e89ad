"""One engine configuration as the checker runs it: the target, the draft and its SpecConfig, a request's sampling
parameters (penalties and a grammar included), the prompt and the number of tokens whose law is asked."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import SamplingParams, SpecConfig
from ..draft_kinds import kind_of
from ..engine import Engine
from ..grammar import GrammarCompiler, grammar_stop_ids


@dataclass(frozen=True)
class Setup:
    """target: a model (`specdec.lab.table_model` makes one of a logit table); draft: a draft of any registered kind
    (None: target-only decoding); spec: its SpecConfig (the verify rule among it); params: the request's
    SamplingParams (its max_new_tokens is replaced by n); prompt: token ids; n: how many emitted tokens the law is
    over; tokenizer: a grammar's vocabulary (as `Engine(tokenizer=)`); impl: "reference" or "fast"."""

    target: object
    draft: object = None
    spec: SpecConfig | None = None
    params: SamplingParams = dataclasses.field(default_factory=lambda: SamplingParams(temperature=1.0))
    prompt: tuple[int, ...] = (0,)
    n: int = 2
    tokenizer: object = None
    impl: str = "reference"

    def __post_init__(self):
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"n must be an int >= 1 (the tokens the law is over), got {self.n!r}")
        if not isinstance(self.params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(self.params).__name__}")
        prompt = tuple(self.prompt)
        if not prompt:
            raise ValueError("prompt must hold at least one token id")
        object.__setattr__(self, "prompt", prompt)
        object.__setattr__(self, "params", dataclasses.replace(self.params, max_new_tokens=self.n))
        if getattr(self.draft, "shared", False):  # an NgramDraft(shared=True): one trie for every request
            raise ValueError("the checker runs paths side by side as separate requests, which a shared NGRAM trie "
                             "would couple: use NgramDraft(shared=False)")

    def stop_ids(self) -> set[int]:
        """The ids that end the request: its stop ids and its grammar's terminators (which the engine adds)."""
        stops = set(self.params.stop_token_ids)
        if self.params.has_grammar and self.tokenizer is not None:
            compiled = GrammarCompiler(self.tokenizer, self.target.config.vocab_size).compile(self.params, 0)
            stops |= set(grammar_stop_ids(compiled))
        return stops

    def engine(self, max_batch: int) -> Engine:
        """An engine for `max_batch` requests of this setup, its caches allocated once, decoding eagerly (no CUDA
        graphs, nothing enqueued ahead), so that each of its steps is a call the checker can see."""
        margin = 0 if self.draft is None or self.spec is None else kind_of(self.draft).kv_margin(self.spec)
        length = len(self.prompt) + self.n + margin + 1
        return Engine(self.target, self.draft, self.spec, impl=self.impl, max_batch=max_batch, max_seq_len=length,
                      cuda_graphs=False, overlap=False, preallocate=True, tokenizer=self.tokenizer)
