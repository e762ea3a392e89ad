"""`argmax_finite` (the greedy pick and the finiteness flag in one read), reference and fast, against a per-row loop
over Python floats: the first index of the largest value, and whether every value is finite. Awkward shapes, ties,
bf16 / fp16 / fp32, strided rows, every vocabulary split the fast kernel can take, and rows holding NaN or +-inf
(flagged, with some id in range)."""
from __future__ import annotations

import math

import pytest
import torch

import fast
import reference
from fast.argmax import argmax_finite_launch

OPS = {"reference": reference.argmax_finite, "fast": fast.argmax_finite}


def per_row(logits: torch.Tensor) -> tuple[list[int], list[bool]]:
    ids, finite = [], []
    for row in logits.float().tolist():
        best = max(range(len(row)), key=lambda j: (row[j], -j))  # the largest, the first of equals
        ids.append(best)
        finite.append(all(math.isfinite(x) for x in row))
    return ids, finite


def tied_rows(N: int, V: int, dtype, seed: int) -> torch.Tensor:
    """Integer-valued logits in a small range: most rows hold their maximum more than once."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-6, 7, (N, V), generator=g).to(dtype)


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("N, V", [(1, 1), (3, 2), (5, 37), (2, 1025), (4, 4099)])
def test_first_largest_and_finite_per_row(impl, dtype, N, V):
    logits = tied_rows(N, V, dtype, seed=N * V)
    index, finite = OPS[impl](logits)
    ids, flags = per_row(logits)
    assert index.dtype == torch.int64 and finite.dtype == torch.bool
    assert index.tolist() == ids and finite.tolist() == flags


@pytest.mark.parametrize("split_len", [16, 64, 100, 1000, 5000])
def test_every_vocabulary_split_gives_the_same_pick(split_len):
    """Splits of any length (not dividing V, one split, more splits than tiles), the maximum placed in each split
    in turn, and ties across splits (the lower id wins)."""
    V = 3001
    logits = tied_rows(6, V, torch.bfloat16, seed=7)
    for r, col in enumerate([0, 15, 16, 999, 1500, V - 1]):
        logits[r, col] = 9.0
    logits[5, 40] = 9.0  # tied with the later column V - 1 of the same row
    index, finite = argmax_finite_launch(logits, split_len=split_len)
    ids, flags = per_row(logits)
    assert index.tolist() == ids and finite.tolist() == flags
    assert index[5] == 40


@pytest.mark.parametrize("impl, split_len", [("reference", None), ("fast", None), ("fast", 32), ("fast", 300)])
def test_non_finite_rows_are_flagged_with_an_id_in_range(impl, split_len):
    V = 700
    logits = tied_rows(6, V, torch.float32, seed=3)
    logits[0, 350] = float("nan")
    logits[1, V - 1] = float("-inf")
    logits[2, 5] = float("inf")
    logits[3] = float("-inf")
    logits[4] = float("nan")
    op = OPS[impl] if split_len is None else (lambda x: argmax_finite_launch(x, split_len=split_len))
    index, finite = op(logits)
    ids, flags = per_row(logits)
    assert finite.tolist() == flags == [False, False, False, False, False, True]
    assert ((index >= 0) & (index < V)).all()
    assert index[5] == ids[5]
    assert index[2] == 5 and index[1] == ids[1]  # +inf is the largest; a -inf elsewhere does not move the pick


def test_strided_rows_read_in_place():
    base = tied_rows(4, 300, torch.bfloat16, seed=11)
    rows = base[:, 20:280]  # stride(0) = 300, stride(1) = 1
    index, finite = fast.argmax_finite(rows)
    assert (index.tolist(), finite.tolist()) == per_row(rows)
    cols = tied_rows(300, 4, torch.float32, seed=12).t()  # stride(1) != 1: copied first
    assert fast.argmax_finite(cols)[0].tolist() == per_row(cols)[0]


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_bad_logits_are_one_line_errors(impl):
    op = OPS[impl]
    for bad, words in [(torch.zeros(3, dtype=torch.int64), "logits"), (torch.zeros(2, 0), "V >= 1"),
                       (torch.zeros(2, 3, dtype=torch.int32), "logits"), ([[1.0, 2.0]], "logits")]:
        with pytest.raises(ValueError, match=words) as e:
            op(bad)
        assert "\n" not in str(e.value)
    index, finite = op(torch.zeros(0, 5))
    assert index.shape == (0,) and finite.shape == (0,)
