"""The target's own law of the first n tokens, in float64, computed without the engine: a full forward of the target
over each prefix, the request's penalties, logit bias, min_new_tokens and grammar applied row by row as plain
decoding applies them (SGLang's order), then temperature, top-k and top-p, each written out here in float64.

A sequence ends at n tokens, at a stop id (the request's, or a grammar's terminators, which the engine adds to
them), or where the shaped row allows no token at all: the engine then ends the request in error, and the outcome is
the tokens before it followed by `ERROR`.
"""
from __future__ import annotations

import math

import torch

from ..config import SamplingParams
from ..grammar import GrammarCompiler, grammar_stop_ids

#: the last item of an outcome whose request ended in error (a row with no token left to decode)
ERROR = "error"


def shaped_row(logits: torch.Tensor, prompt: list[int], output: list[int], params: SamplingParams,
               stop_ids: set[int], allowed: torch.Tensor | None) -> torch.Tensor:
    """One next-token logits row (float64) as plain decoding shapes it having emitted `output` after `prompt`:
    frequency and presence over the output, -inf on the stop ids while fewer than min_new_tokens are out, repetition
    over prompt and output (a positive logit divided, a negative one multiplied), the logit bias, then -inf outside
    the grammar's `allowed` ids ((V,) bool; None: no grammar)."""
    row = logits.to(torch.float64).clone()
    counts: dict[int, int] = {}
    for t in output:
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        row[t] -= params.frequency_penalty * c + params.presence_penalty
    if len(output) < params.min_new_tokens and stop_ids:
        row[sorted(stop_ids)] = -math.inf
    if params.repetition_penalty != 1.0:
        seen = sorted(set(prompt) | set(counts))
        x = row[seen]
        row[seen] = torch.where(x > 0, x / params.repetition_penalty, x * params.repetition_penalty)
    for t, bias in (params.logit_bias or {}).items():
        row[int(t)] += bias
    if allowed is not None:
        row = torch.where(allowed, row, -math.inf)
    return row


def next_token_law(row: torch.Tensor, params: SamplingParams) -> torch.Tensor | None:
    """The law (float64) a request draws its next token from, given its shaped logits row: the argmax (ties to the
    lower id) for a greedy request, else softmax(row / T), then top-k (a token kept when fewer than k are strictly
    more probable), then top-p over the renormalised top-k (kept when the mass strictly more probable is at most
    top_p). None when the row allows no token."""
    if bool((row == -math.inf).all()):
        return None
    if params.is_greedy:
        return torch.nn.functional.one_hot(row.argmax(), row.shape[0]).to(torch.float64)  # argmax: the first maximum
    p = torch.softmax(row / params.temperature, dim=0)
    if params.top_k != -1:
        k = min(max(params.top_k, 1), p.shape[0])
        p = torch.where(p >= p.sort(descending=True).values[k - 1], p, 0.0)
        p = p / p.sum()
    if params.top_p < 1.0:
        ascending = p.sort().values
        at_most = ascending.cumsum(0)[torch.searchsorted(ascending, p, right=True) - 1]  # mass of tokens <= p[v]
        p = torch.where(p.sum() - at_most <= params.top_p, p, 0.0)
        p = p / p.sum()
    return p


def grammar_allowed(compiled, tokens: list[int]) -> torch.Tensor:
    """(V,) bool: the ids a fresh xgrammar matcher of `compiled` allows after accepting `tokens` (none when it refuses
    one or has terminated)."""
    # lazy: xgrammar is the optional `grammar` extra, imported only for a request with a grammar
    import xgrammar as xgr
    V = compiled.tokenizer_info.vocab_size
    m = xgr.GrammarMatcher(compiled)
    for t in tokens:
        if m.is_terminated() or not m.accept_token(int(t)):
            return torch.zeros(V, dtype=torch.bool)
    if m.is_terminated():
        return torch.zeros(V, dtype=torch.bool)
    bitmask = xgr.allocate_token_bitmask(1, V)
    m.fill_next_token_bitmask(bitmask, 0)
    words = bitmask[0].to(torch.int64) & 0xFFFFFFFF
    ids = torch.arange(V)
    return ((words[ids // 32] >> (ids % 32)) & 1).bool()


def _logits_after(target, prompt: list[int], prefixes: list[tuple]) -> torch.Tensor:
    """(P, V) float64: the target's next-token logits after prompt + each prefix (all of one length): one full
    forward over them, no cache."""
    ids = torch.tensor([list(prompt) + list(p) for p in prefixes], device=target.device)
    positions = torch.arange(ids.shape[1], device=target.device).expand_as(ids)
    with torch.inference_mode():
        logits = target(ids, positions).logits[:, -1]
    return logits.double().cpu()


def target_law(target, prompt: list[int], n: int, params: SamplingParams, tokenizer=None, given: tuple = (),
               floor: float = 0.0) -> dict[tuple, float]:
    """The law of the first `n` tokens target-only decoding emits after `prompt` under `params` (its max_new_tokens
    is ignored: n bounds the outcome), in float64: {outcome: probability}, an outcome the tuple of emitted ids
    (shorter than n when a stop id ended it; followed by `ERROR` when a row allowed no token). `tokenizer` gives a
    grammar's vocabulary (as `Engine(tokenizer=)`). `given`: the law conditional on the first tokens emitted being
    these (no stop id among them), each outcome starting with them. `floor`: prefixes less probable than it are
    dropped (the law then sums to less than 1: a large vocabulary's law, its tail left out)."""
    V = target.config.vocab_size
    params = params.validated(0, V)
    compiled = None
    if params.has_grammar:
        if tokenizer is None:
            raise ValueError("a request with a grammar needs the tokenizer its grammar compiles against")
        compiled = GrammarCompiler(tokenizer, V).compile(params, 0)
    stop_ids = set(params.stop_token_ids) | (set(grammar_stop_ids(compiled)) if compiled is not None else set())
    law: dict[tuple, float] = {}
    level = {tuple(given): 1.0}
    for _ in range(n - len(given)):
        if not level:
            break
        prefixes = list(level)
        rows = _logits_after(target, list(prompt), prefixes)
        following: dict[tuple, float] = {}
        for prefix, logits in zip(prefixes, rows):
            allowed = grammar_allowed(compiled, list(prefix)) if compiled is not None else None
            p = next_token_law(shaped_row(logits, list(prompt), list(prefix), params, stop_ids, allowed), params)
            if p is None:
                law[prefix + (ERROR,)] = law.get(prefix + (ERROR,), 0.0) + level[prefix]
                continue
            mass = p * level[prefix]
            for t in torch.nonzero((mass > 0) & (mass >= floor)).flatten().tolist():
                seq = prefix + (t,)
                (law if t in stop_ids else following)[seq] = float(mass[t])
        level = following
    for seq, mass in level.items():
        law[seq] = law.get(seq, 0.0) + mass
    return law
