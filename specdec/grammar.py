"""Structured output: a request's JSON schema, regex or EBNF grammar compiled with xgrammar, and the host
state that turns it into per-node token masks.

xgrammar is optional (the `grammar` extra): everything here imports it on first use, and a grammar request
without it is an ImportError naming the extra. The vocabulary comes from the engine's tokenizer: the zoo's
byte tokenizer (ids 0-255 the bytes, BOS and EOS special) or a `tokenizer.json` one (`specdec.tokenizer`).

A `GrammarBatch` holds one `xgrammar.GrammarMatcher` per request that has a grammar. A matcher advances only
by committed tokens (`advance`); a step's per-node masks are filled from it with `traverse_draft_tree`
(xgrammar walks the verify tree, accepting each root-to-node path and rolling it back), which leaves the
matcher where it was. Masks are xgrammar's packed int32 rows (bit j of word i allows token 32 i + j); a
request without a grammar gets all-ones rows, and a node the grammar rejects (its parent's mask already
forbids it, so it can never be accepted) gets all-ones too, so that no row is all -inf.

A grammar's terminators are the tokenizer's end-of-sequence ids (`grammar_stop_ids`), as in SGLang and
xgrammar, never a request's `stop_token_ids`: a stop id may be a byte the grammar needs as content, and
declaring it a terminator would forbid it there. The request's stop ids end it after sampling, as for any
request; a grammar that accepts its terminator has ended, and the engine stops the request there too.
"""
from __future__ import annotations

import json
import time

import torch

#: What a user runs to get xgrammar.
GRAMMAR_EXTRA = "pip install 'specdec[grammar]' (xgrammar==0.2.9)"

#: SamplingParams' grammar fields, SGLang's names, and the xgrammar compiler method of each.
GRAMMAR_FIELDS = {"json_schema": "compile_json_schema", "regex": "compile_regex", "ebnf": "compile_grammar"}


def require_xgrammar():
    """-> the xgrammar module; ImportError naming the extra when it is not installed."""
    try:
        # lazy: xgrammar is optional (specdec[grammar])
        import xgrammar
    except ImportError:
        raise ImportError(f"structured output (json_schema, regex, ebnf) needs xgrammar: {GRAMMAR_EXTRA}") from None
    return xgrammar


def tokenizer_info(tokenizer, vocab_size: int):
    """The engine's tokenizer -> an xgrammar TokenizerInfo over the model's `vocab_size` ids: a
    `specdec.tokenizer` one builds its own, a TokenizerInfo is taken as is, a transformers tokenizer is read."""
    xgr = require_xgrammar()
    if isinstance(tokenizer, xgr.TokenizerInfo):  # given as is (a custom vocabulary)
        return tokenizer
    if callable(getattr(tokenizer, "xgrammar_info", None)):
        return tokenizer.xgrammar_info(vocab_size)
    if hasattr(tokenizer, "get_vocab") and hasattr(tokenizer, "backend_tokenizer"):  # a transformers tokenizer
        return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    raise ValueError(f"structured output needs a specdec.tokenizer tokenizer (the byte tokenizer or a tokenizer.json "
                     f"one), an xgrammar TokenizerInfo or a transformers tokenizer, got {tokenizer!r}")


def grammar_of(params) -> tuple[str, str] | None:
    """A SamplingParams -> (field, source) of its grammar, or None. A json_schema dict is dumped to JSON."""
    for name in GRAMMAR_FIELDS:
        source = getattr(params, name, None)
        if source is not None:
            return name, json.dumps(source) if isinstance(source, dict) else source
    return None


class GrammarCompiler:
    """Compiles requests' grammars for one tokenizer (xgrammar's compiler caches what it compiled)."""

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._compiler = None

    def compile(self, params, index: int):
        """-> xgrammar CompiledGrammar of the request's grammar, or None without one; ValueError naming
        request `index` when it does not compile, ImportError without xgrammar."""
        found = grammar_of(params)
        if found is None:
            return None
        if self._compiler is None:
            xgr = require_xgrammar()
            self._compiler = xgr.GrammarCompiler(tokenizer_info(self.tokenizer, self.vocab_size))
        name, source = found
        # a schema's JSON is compact (", " and ": ", no free whitespace), as the byte models of the zoo would
        # otherwise pad it with whitespace the grammar allows
        kw = {"any_whitespace": False} if name == "json_schema" else {}
        try:
            return getattr(self._compiler, GRAMMAR_FIELDS[name])(source, **kw)
        except (RuntimeError, ValueError, TypeError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"request {index}: its {name} does not compile: {first}") from None


def grammar_stop_ids(compiled) -> list[int]:
    """A CompiledGrammar -> the token ids that terminate it (its tokenizer's end-of-sequence ids): once the
    grammar is complete they are the only tokens it allows, and emitting one ends the request."""
    return sorted(int(t) for t in compiled.tokenizer_info.stop_token_ids)


class GrammarBatch:
    """Per-request matchers (None for a request without a grammar) and the step's mask filling, on the host.

    compiled: B CompiledGrammar or None, each terminated by its tokenizer's EOS ids (`grammar_stop_ids`).
    `fill_seconds` accumulates the host time spent filling masks."""

    def __init__(self, compiled: list, vocab_size: int):
        xgr = require_xgrammar()
        self.matchers = [None if c is None else xgr.GrammarMatcher(c) for c in compiled]
        self.words = (vocab_size + 31) // 32
        self.fill_seconds = 0.0

    def filter(self, keep: list[int]) -> None:
        self.matchers = [self.matchers[i] for i in keep]

    def advance(self, tokens: list[list[int]], lens: list[int]) -> None:
        """Each matcher accepts its request's first lens[b] tokens of tokens[b] (a step's committed tokens);
        it stops at a token it refuses (one past a stop token: the engine ends such a request there)."""
        for m, row, n in zip(self.matchers, tokens, lens):
            if m is None:
                continue
            for t in row[:n]:
                if m.is_terminated() or not m.accept_token(int(t)):
                    break

    def fill_tree(self, candidates: torch.Tensor, next_token: torch.Tensor, next_sibling: torch.Tensor
                  ) -> torch.Tensor:
        """candidates, next_token, next_sibling: (B, W) int64 on the host (a verify tree; node 0 the root, the
        last committed token) -> (B*W, words) int32: row b*W + i the mask after node i's root-to-node path."""
        t0 = time.perf_counter()
        B, W = candidates.shape
        bitmask = torch.full((B * W, self.words), -1, dtype=torch.int32)
        for b, m in enumerate(self.matchers):
            if m is None or m.is_terminated():
                continue
            rows = bitmask[b * W:(b + 1) * W]
            m.traverse_draft_tree(next_token[b].contiguous(), next_sibling[b].contiguous(),
                                  candidates[b].contiguous(), rows)
            rows[(rows == 0).all(1)] = -1  # rejected nodes: unreachable, but never an all -inf row
        self.fill_seconds += time.perf_counter() - t0
        return bitmask

    def fill_paths(self, tokens: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        """tokens (B, L) int64, paths (B, R, L) bool on the host (row r's path: the tokens j > 0 it marks, in
        order; column 0 is the root, already committed) -> (B*R, words) int32: each row's mask after its path
        (the draft's proposals, masked along their own paths). Accepts and rolls back each path."""
        t0 = time.perf_counter()
        B, R, L = paths.shape
        bitmask = torch.full((B * R, self.words), -1, dtype=torch.int32)
        tok, on = tokens.tolist(), paths.tolist()
        for b, m in enumerate(self.matchers):
            if m is None or m.is_terminated():
                continue
            for r in range(R):
                n = 0
                for j in range(1, L):
                    if on[b][r][j]:
                        if m.is_terminated() or not m.accept_token(tok[b][j]):
                            n = -1 - n
                            break
                        n += 1
                if n >= 0 and not m.is_terminated():
                    m.fill_next_token_bitmask(bitmask, b * R + r)
                m.rollback(n if n >= 0 else -1 - n)
        self.fill_seconds += time.perf_counter() - t0
        return bitmask

    @staticmethod
    def remap(bitmask: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """bitmask (N, ceil(V/32)) int32 over the target's ids, ids (V_d,) int64: the target id of each draft id
        -> (N, ceil(V_d/32)) int32 over the draft's ids (draft id d allowed where target id ids[d] is)."""
        shifts = torch.arange(32, dtype=torch.int32)
        bits = ((bitmask[:, :, None] >> shifts) & 1).flatten(1)[:, ids]  # (N, V_d)
        pad = (-bits.shape[1]) % 32
        bits = torch.nn.functional.pad(bits, (0, pad)).view(bits.shape[0], -1, 32).long()
        words = (bits << shifts.long()).sum(-1)  # unsigned 32-bit words, as int64
        return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)

    def fill_roots(self) -> torch.Tensor:
        """-> (B, words) int32: each request's mask at its committed state (one-token steps)."""
        t0 = time.perf_counter()
        bitmask = torch.full((len(self.matchers), self.words), -1, dtype=torch.int32)
        for b, m in enumerate(self.matchers):
            if m is not None and not m.is_terminated():
                m.fill_next_token_bitmask(bitmask, b)
        self.fill_seconds += time.perf_counter() - t0
        return bitmask
