"""Shared test utilities: one tolerance table, one statistical test, model constructions."""
from __future__ import annotations

import math

import torch

from specdec.models import random_eagle_head, random_llama, random_mtp

# Max abs difference allowed between two computations of the same logprob (fp32 logits).
LOGPROB_ATOL = 1e-4

# Every statistical test in the suite uses this false-failure rate per test.
FALSE_FAILURE_RATE = 1e-6


def chi_square_pvalue(counts, probs) -> float:
    """Pearson chi-square goodness-of-fit p-value of observed `counts` against `probs` (exact
    distribution). Cells with expected count < 5 are pooled into one so the chi-square
    approximation holds. A cell observed with probability 0 gives p = 0."""
    counts = [float(c) for c in counts]
    n = sum(counts)
    probs = [float(p) for p in probs]
    for c, p in zip(counts, probs):
        if p == 0.0 and c > 0:
            return 0.0
    cells, pooled_o, pooled_e = [], 0.0, 0.0
    for c, p in zip(counts, probs):
        e = n * p
        if e == 0.0:
            continue
        if e < 5:
            pooled_o += c
            pooled_e += e
        else:
            cells.append((c, e))
    if pooled_e > 0:
        cells.append((pooled_o, pooled_e))
    dof = len(cells) - 1
    if dof < 1:
        return 1.0
    stat = sum((o - e) ** 2 / e for o, e in cells)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def softmax_filtered(logits, temperature=1.0, top_k=-1, top_p=1.0) -> list[float]:
    """Independent float64 Python: softmax(logits / T), then top-k, then top-p over the renormalised
    top-k probabilities (SGLang's verify order). Both filters decide by value, so ties share one
    decision: top-k keeps v iff fewer than top_k tokens are strictly more probable; top-p keeps v iff
    the mass strictly more probable than v is <= top_p (top_p >= 1 keeps all)."""
    xs = [float(x) / temperature for x in logits]
    m = max(xs)
    ex = [math.exp(x - m) for x in xs]
    z = sum(ex)
    p = [e / z for e in ex]
    if top_k != -1:
        p = [q if sum(r > q for r in p) < top_k else 0.0 for q in p]
        z = sum(p)
        p = [q / z for q in p]
    if top_p < 1.0:
        p = [q if sum(r for r in p if r > q) <= top_p else 0.0 for q in p]
        z = sum(p)
        p = [q / z for q in p]
    return p


def bigram_target(seed=0, vocab_size=64, hidden_size=32, num_hidden_layers=2, **kw):
    """A Llama whose attention and MLP outputs are zeroed: its next-token distribution depends only
    on the current token, so a draft can be made to predict it exactly."""
    t = random_llama(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                     seed=seed, **kw)
    with torch.no_grad():
        for layer in t.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return t


def perfect_eagle(target, seed=0):
    """An EAGLE head that predicts exactly what a `bigram_target` will: fc passes the token
    embedding through, the decoder layer adds nothing, the norm is the target's final norm.
    Only right if the draft is fed the right token at the right step (tests the plumbing)."""
    d = random_eagle_head(target, seed=seed)
    H = target.config.hidden_size
    with torch.no_grad():
        d.fc.weight.zero_()
        d.fc.weight[:, :H] = torch.eye(H)
        d.layers[0].self_attn.o_proj.weight.zero_()
        d.layers[0].mlp.down_proj.weight.zero_()
        d.norm.weight.copy_(target.model.norm.weight)
    return d


def perfect_mtp(target, num_layers, chain_hidden_states, seed=0):
    """MTP layers that predict exactly what a `bigram_target` will (see perfect_eagle)."""
    d = random_mtp(target, num_layers, chain_hidden_states, seed=seed)
    H = target.config.hidden_size
    with torch.no_grad():
        for layer in d.layers:
            layer.eh_proj.weight.zero_()
            layer.eh_proj.weight[:, :H] = torch.eye(H)
            layer.enorm.weight.fill_(1.0)
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
            layer.shared_head.norm.weight.copy_(target.model.norm.weight)
    return d


def _ban_argmax(compute_logits):
    """Wrap a draft's logits function so that its best guess gets -inf: every proposal then differs from
    what a perfect draft (hence the bigram target's greedy choice) would say."""
    def banned(*args, **kw):
        logits = compute_logits(*args, **kw)
        return logits.scatter(-1, logits.argmax(-1, keepdim=True), float("-inf"))

    return banned


def always_wrong_eagle(target, seed=0):
    """A perfect_eagle whose best guess is banned, through the same plumbing."""
    d = perfect_eagle(target, seed)
    d.compute_logits = _ban_argmax(d.compute_logits)
    return d


def always_wrong_mtp(target, num_layers, chain_hidden_states, seed=0):
    d = perfect_mtp(target, num_layers, chain_hidden_states, seed)
    d.layer_logits = _ban_argmax(d.layer_logits)
    return d


def near_bigram_target(seed=0, mix=0.3, vocab_size=64, hidden_size=32, num_hidden_layers=2, **kw):
    """A random Llama whose attention and MLP outputs are scaled by `mix`: mostly bigram, so a
    bigram-perfect draft is often but not always right, and the target still reads its context."""
    t = random_llama(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                     seed=seed, **kw)
    with torch.no_grad():
        for layer in t.model.layers:
            layer.self_attn.o_proj.weight.mul_(mix)
            layer.mlp.down_proj.weight.mul_(mix)
    return t
