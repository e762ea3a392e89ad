"""softmax_topk (the draft's proposal): reference against an independent float64 loop, fast against reference."""
from __future__ import annotations

import inspect
import math

import pytest
import torch

from fast.draft import softmax_topk as fast_softmax_topk
from reference.draft import softmax_topk
from tests.equivalence import assert_equivalent, no_host_sync


def _oracle(row: list[float], k: int):
    """float64 Python: ids by (-logit, id), probabilities exp(x - max) / sum."""
    m = max(row)
    z = sum(math.exp(x - m) for x in row)
    ids = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
    return [math.exp(row[i] - m) / z for i in ids], ids


def _rows(seed, N, V, dtype, ties):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, V, generator=gen) * 3
    if ties:
        x = torch.randint(0, 3, (N, V), generator=gen).float()  # many exact ties, the k-th value among them
    return x.to(dtype)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("N,V,k", [(5, 17, 4), (1, 1, 1), (3, 258, 1), (2, 1025, 8), (4, 3000, 3)])
def test_reference_matches_a_float64_loop(N, V, k, ties):
    x = _rows(N * V + k, N, V, torch.float32, ties)
    p, idx = softmax_topk(x, k)
    for r in range(N):
        want_p, want_ids = _oracle(x[r].tolist(), k)
        assert idx[r].tolist() == want_ids
        assert max(abs(a - b) for a, b in zip(p[r].tolist(), want_p)) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("N,V,k", [(5, 17, 4), (1, 1, 1), (3, 258, 1), (2, 1025, 8), (6, 3001, 5)])
def test_fast_equals_reference(N, V, k, ties, dtype):
    x = _rows(N + V + k, N, V, dtype, ties)
    ref = softmax_topk(x, k)
    with no_host_sync():
        out = fast_softmax_topk(x, k)
    assert_equivalent(ref, out, "prob", dtype)


def test_minus_inf_logits_are_never_proposed_before_finite_ones():
    x = torch.tensor([[float("-inf"), 1.0, float("-inf"), 0.5, 2.0]])
    for op in (softmax_topk, fast_softmax_topk):
        p, idx = op(x, 4)
        assert idx.tolist() == [[4, 1, 3, 0]] and p[0, 3].item() == 0.0


def test_large_vocabulary_single_row():
    x = _rows(3, 1, 2 ** 17 + 3, torch.float32, False)
    assert_equivalent(softmax_topk(x, 4), fast_softmax_topk(x, 4), "prob")


@pytest.mark.parametrize("op", [softmax_topk, fast_softmax_topk])
def test_bad_input(op):
    with pytest.raises(ValueError, match="topk=6 exceeds the vocabulary size V=5"):
        op(torch.zeros(2, 5), 6)
    with pytest.raises(ValueError, match="logits must have shape"):
        op(torch.zeros(5), 1)
    with pytest.raises(TypeError, match="logits must have a floating-point dtype"):
        op(torch.zeros(2, 5, dtype=torch.long), 1)
    with pytest.raises(TypeError, match="topk must be an int"):
        op(torch.zeros(2, 5), 1.0)


def test_same_signature():
    assert inspect.signature(fast_softmax_topk) == inspect.signature(softmax_topk)
