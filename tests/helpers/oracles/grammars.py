"""Grammar masks and decoding recomputed from scratch by fresh xgrammar matchers."""
from __future__ import annotations


import torch


def grammar_stops(compiled) -> set[int]:
    """The ids that terminate `compiled` (its tokenizer's EOS ids): the only ones a complete grammar allows."""
    return {int(t) for t in compiled.tokenizer_info.stop_token_ids}


def grammar_allowed(compiled, tokens) -> set[int] | None:
    """The token ids a fresh matcher (terminated by its tokenizer's EOS ids, never by a request's stop ids)
    allows after accepting `tokens`, or None when it refuses one of them or has terminated."""
    import xgrammar as xgr
    m = xgr.GrammarMatcher(compiled)
    for t in tokens:
        if m.is_terminated() or not m.accept_token(int(t)):
            return None
    if m.is_terminated():
        return None
    V = compiled.tokenizer_info.vocab_size
    bm = xgr.allocate_token_bitmask(1, V)
    m.fill_next_token_bitmask(bm, 0)
    words = [w & 0xFFFFFFFF for w in bm[0].tolist()]
    return {v for v in range(V) if (words[v // 32] >> (v % 32)) & 1}


def grammar_greedy_decode(target, prompt, compiled, stop_ids, max_new_tokens) -> list[int]:
    """Plain greedy decoding with the grammar: each step a full forward over prompt + output, a fresh matcher
    over the output so far, argmax over the allowed tokens; stops after a request stop id or a grammar
    terminator, or at max_new_tokens."""
    out: list[int] = []
    ends = set(stop_ids) | grammar_stops(compiled)
    while len(out) < max_new_tokens:
        full = prompt + out
        with torch.no_grad():
            logits = target(torch.tensor([full]), torch.arange(len(full))[None]).logits[0, -1].float()
        allowed = grammar_allowed(compiled, out)
        masked = torch.full_like(logits, float("-inf"))
        idx = torch.tensor(sorted(allowed))
        masked[idx] = logits[idx]
        tok = int(masked.argmax())
        out.append(tok)
        if tok in ends:
            break
    return out
