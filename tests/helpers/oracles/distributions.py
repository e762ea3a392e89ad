"""The target distribution in float64 (temperature, top-k, top-p as Python loops over floats) and the exact law of
draws without replacement (Plackett-Luce)."""
from __future__ import annotations

import itertools
import math

NEG_INF = float("-inf")


def oracle_softmax(logits, temperature):
    """float64 Python softmax(logits / temperature); -inf logits get probability 0."""
    xs = [float(x) / temperature for x in logits]
    m = max(xs)
    ex = [math.exp(x - m) for x in xs]
    z = sum(ex)
    return [e / z for e in ex]


def _renormalised(p, keep):
    kept = [q if k else 0.0 for q, k in zip(p, keep)]
    z = sum(kept)
    return [q / z for q in kept]


def oracle_top_k(p, k):
    """Top-k by value, renormalised: v is kept iff fewer than k tokens are strictly more probable (ties share
    one decision); k is clamped to [1, V] as the ops clamp it."""
    k = min(max(k, 1), len(p))
    return _renormalised(p, [sum(r > q for r in p) < k for q in p])


def oracle_top_p(p, top_p):
    """Top-p by value, renormalised: v is kept iff the mass strictly more probable than v is <= top_p (ties
    share one decision; top_p >= 1 keeps all)."""
    if top_p >= 1.0:
        return _renormalised(p, [True] * len(p))
    return _renormalised(p, [sum(r for r in p if r > q) <= top_p for q in p])


def softmax_filtered(logits, temperature=1.0, top_k=-1, top_p=1.0) -> list[float]:
    """The target distribution a request samples from: softmax(logits / T), then top-k (-1: off), then top-p
    over the renormalised top-k probabilities (SGLang's verify order; top_p >= 1: off)."""
    p = oracle_softmax(logits, temperature)
    if top_k != -1:
        p = oracle_top_k(p, top_k)
    if top_p < 1.0:
        p = oracle_top_p(p, top_p)
    return p


def plackett_luce(q: list[float], K: int) -> dict:
    """Exact law of K draws without replacement from q (normalised), in draw order: {(x_1, ..., x_K): probability}."""
    law = {}
    for seq in itertools.permutations(range(len(q)), K):
        p, left = 1.0, 1.0
        for x in seq:
            p *= q[x] / left
            left -= q[x]
        law[seq] = p
    return law
