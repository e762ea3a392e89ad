"""softmax_topk (the draft's proposal): reference against an independent float64 loop, fast against reference."""
from __future__ import annotations

import inspect
import math

import pytest
import torch

import fast
from fast import draft as fast_draft
from fast.draft import softmax_topk as fast_softmax_topk
from fast.draft import softmax_topk_launch
from reference.draft import softmax_topk
from tests.helpers.equivalence import assert_equivalent, no_host_sync


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


# ----------------------------------------------------------------------------- the vocabulary split over programs

SPLIT_DTYPES = [torch.float32, torch.bfloat16]
SPLIT_IDS = ["fp32", "bf16"]
NEG_INF = float("-inf")


def _split(x, k, split_len):
    with no_host_sync():
        return softmax_topk_launch(x, k, split_len=split_len)


@pytest.mark.parametrize("dtype", SPLIT_DTYPES, ids=SPLIT_IDS)
@pytest.mark.parametrize("N", [1, 7])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("V,split_len,k", [(50, 7, 4), (40, 5, 8), (33, 16, 20), (10, 1, 10), (300, 64, 1)])
def test_forced_splits_equal_reference(V, split_len, k, ties, N, dtype):
    # 50 = 7 x 7 + 1 (a last split of one id, each split inside one 8-wide tile); 5-, 16- and 1-wide splits hold
    # fewer ids than K, so the row's top-K comes from several splits; with ties the K-th value spans splits
    x = _rows(V * k + N, N, V, dtype, ties)
    assert_equivalent(softmax_topk(x, k), _split(x, k, split_len), "prob", dtype)


@pytest.mark.parametrize("dtype", SPLIT_DTYPES, ids=SPLIT_IDS)
def test_ties_across_split_boundaries_go_to_the_lower_id(dtype):
    x = torch.zeros(3, 30)
    x[0, [25, 15, 10, 9]] = 5.0  # 9 | 10 is a split boundary; each equal maximum in another split
    x[1, [29, 20, 19, 0]] = -1.0  # ties below the row's zeros: the zeros come first, by id
    x[2] = 2.0  # a whole row tied
    x = x.to(dtype)
    p, idx = _split(x, 6, 10)
    assert idx[0, :4].tolist() == [9, 10, 15, 25]
    assert idx[1].tolist() == [1, 2, 3, 4, 5, 6]
    assert idx[2].tolist() == [0, 1, 2, 3, 4, 5]
    assert_equivalent(softmax_topk(x, 6), (p, idx), "prob", dtype)


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")  # the -inf row's 0 / 0
@pytest.mark.parametrize("dtype", SPLIT_DTYPES, ids=SPLIT_IDS)
def test_a_split_of_only_minus_inf_or_below_exp_range(dtype):
    """Splits that see only -inf merged into rows whose maximum is finite, below -88.7 (exp(-max) overflows
    float32, so rescaling an empty partial from any stand-in shift but its own -inf max gives 0 * inf = NaN), or
    -inf (the reference's NaN probabilities, ids 0..K-1)."""
    x = _rows(11, 4, 40, torch.float32, False)
    x[0, 8:16] = NEG_INF  # one whole split
    x[1, :16] = NEG_INF
    x[1, 24:] = NEG_INF  # only the third split is finite, and K exceeds its 8 ids: -inf ids follow, by id
    x[2] = -100.0 - torch.rand(40, generator=torch.Generator().manual_seed(2))
    x[2, :8] = NEG_INF
    x[3] = NEG_INF
    x = x.to(dtype)
    p, idx = _split(x, 12, 8)
    assert idx[1, 8:].tolist() == [0, 1, 2, 3] and p[1, 8:].tolist() == [0.0] * 4
    assert not p[:3].isnan().any()
    assert_equivalent(softmax_topk(x, 12), (p, idx), "prob", dtype)


def test_the_heuristic_splits_one_row_of_a_large_vocabulary(monkeypatch):
    grids = []
    kernel = fast_draft.softmax_topk_kernel

    class Recording:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(fast_draft, "softmax_topk_kernel", Recording())
    x = _rows(1, 1, 128256, torch.bfloat16, False)
    x[0, -1] = 20.0  # the winner in the last, partial split
    with no_host_sync():
        out = fast_softmax_topk(x, 4)
    assert grids[0][0] == 1 and grids[0][1] > 8
    assert_equivalent(softmax_topk(x, 4), out, "prob", torch.bfloat16)
    x = _rows(2, 2, 9000, torch.float32, False)
    fast_softmax_topk(x, 4)
    fast_softmax_topk(x, 33)
    assert grids[1:] == [(2, 2), (2, 1)]  # K above the cap: one program per row


def test_every_counter_is_back_to_zero_for_the_next_call():
    # the merging program resets its row's counter: calls with other rows, splits and K all merge
    for seed, (N, V, k, split_len) in enumerate([(3, 100, 4, 16), (5, 70, 2, 9), (3, 100, 8, 40), (1, 5, 5, 1)]):
        x = _rows(seed, N, V, torch.float32, seed % 2 == 1)
        assert_equivalent(softmax_topk(x, k), _split(x, k, split_len), "prob")
    assert fast_draft._counters and not any(c.any() for c in fast_draft._counters.values())


@pytest.mark.skipif(not fast.INTERPRETED, reason="counts launches under Triton's CPU interpreter")
def test_a_split_call_is_one_launch_and_nothing_else():
    from specdec.bench.suites.kernel_count import KernelCounter

    x = _rows(0, 2, 9000, torch.bfloat16, False)
    fast_softmax_topk(x, 4)  # the first call on a thread makes its zeroed counters
    with torch.inference_mode(), KernelCounter() as counter:
        fast_softmax_topk(x, 4)
    assert counter.triton == {"softmax_topk_kernel": 1} and counter.kernels == {}
