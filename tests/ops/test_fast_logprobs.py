"""``fast.logprobs.compute_spec_v2_logprobs`` (fused Triton) against ``reference.logprobs.compute_spec_v2_logprobs``.

Every comparison goes through ``tests.helpers.equivalence.assert_equivalent`` (floats by the "logprob" row of the
table, integers bit-equal), except the top-k ids where values tie: the reference's ``torch.topk`` lists tied
ids in an unspecified order, the kernel smaller id first. There each fast id must carry, in the reference's
own full logprob row, exactly the value the reference lists at that position (which forces the very same id
wherever the value is not tied), and a row's ids must be distinct. The contract tests of
``tests/ops/test_logprobs.py`` (the float64 oracle, padded slots, temperatures by request, target-only rows) run on
both ops through its `compute_spec_v2_logprobs` fixture; this file keeps what only the kernels have (vocabulary
splits, the top-k cap, the ids loop, the launch heuristics). Under ``TRITON_INTERPRET=1`` the kernels run on CPU.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math

import pytest
import torch

import fast.logprobs as fast_logprobs
from reference.logprobs import compute_spec_v2_logprobs as reference_op
from specdec.ops.logprob_types import LogitsOutput, SamplingInfo, SpecBatch
from tests.helpers.equivalence import assert_equivalent, no_host_sync, tolerance
from tests.helpers.oracles import random_logprob_case

fast_op = fast_logprobs.compute_spec_v2_logprobs
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]
FMIN = torch.finfo(torch.float32).min
NEG_INF = float("-inf")

#: Worst |fast - reference| seen per logits dtype over this module's comparisons (reported by the last test).
MAX_ERR: dict[torch.dtype, float] = {}


def _record_err(ref, fast, dtype):
    ref_t = [ref] if isinstance(ref, torch.Tensor) else list(ref or [])
    fast_t = [fast] if isinstance(fast, torch.Tensor) else list(fast or [])
    for r, f in zip(ref_t, fast_t):
        if r.numel():
            both_min = (r == FMIN) & (f == FMIN)
            err = torch.where(both_min, 0.0, (r.double() - f.double()).abs()).max().item()
            MAX_ERR[dtype] = max(MAX_ERR.get(dtype, 0.0), err)


def _full_reference_rows(batch, logits, predict, accept_index, S, original):
    """The reference's logprob of every token of every output row, [R, V] (ids asked for all of V)."""
    V = logits.shape[1]
    everything = copy.copy(batch)
    everything.top_logprobs_nums = [0] * accept_index.shape[0]
    everything.token_ids_logprobs = [list(range(V))] * accept_index.shape[0]
    out = reference_op(everything, LogitsOutput(logits), predict, accept_index, S, return_original_logprob=original)
    return torch.stack(out.next_token_token_ids_logprobs_val)


def _assert_top_ids_match(ref_vals, ref_idxs, fast_idxs, full_rows):
    """Tie-aware id comparison (see the module docstring)."""
    assert len(ref_idxs) == len(fast_idxs)
    for r, (rv, ri, fi) in enumerate(zip(ref_vals, ref_idxs, fast_idxs)):
        assert fi.dtype == ri.dtype == torch.int64 and fi.shape == ri.shape, (r, fi, ri)
        if ri.numel() == 0:
            continue
        if (ri < 0).all():  # padded slot: the padded index everywhere, in both
            assert_equivalent(ri, fi, "logprob", where=f"top_idx[{r}]")
            continue
        assert (fi >= 0).all() and fi.unique().numel() == fi.numel(), (r, fi)
        carried = full_rows[r][fi]
        assert torch.equal(carried, rv), f"row {r}: fast ids {fi.tolist()} carry {carried.tolist()}, want {rv.tolist()}"


def compare(batch, logits, predict, accept_index, S, *, original=False, dtype=None, ids_bit_equal=False):
    """Run both ops on the same inputs and assert equivalence of every output field."""
    dtype = dtype or logits.dtype
    ref = reference_op(batch, LogitsOutput(logits), predict, accept_index, S, return_original_logprob=original)
    out = LogitsOutput(logits)
    assert fast_op(batch, out, predict, accept_index, S, return_original_logprob=original) is out

    assert_equivalent(ref.next_token_logprobs, out.next_token_logprobs, "logprob", dtype, "next_token_logprobs")
    _record_err(ref.next_token_logprobs, out.next_token_logprobs, dtype)
    fields = ("next_token_top_logprobs_val", "next_token_token_ids_logprobs_val", "next_token_token_ids_logprobs_idx")
    for name in fields:
        assert_equivalent(getattr(ref, name), getattr(out, name), "logprob", dtype, name)
    _record_err(ref.next_token_top_logprobs_val, out.next_token_top_logprobs_val, dtype)
    _record_err(ref.next_token_token_ids_logprobs_val, out.next_token_token_ids_logprobs_val, dtype)
    if ref.next_token_top_logprobs_idx is None:
        assert out.next_token_top_logprobs_idx is None
    elif ids_bit_equal:
        assert_equivalent(ref.next_token_top_logprobs_idx, out.next_token_top_logprobs_idx, "logprob", dtype)
    else:
        full = _full_reference_rows(batch, logits, predict, accept_index, S, original)
        _assert_top_ids_match(ref.next_token_top_logprobs_val, ref.next_token_top_logprobs_idx,
                              out.next_token_top_logprobs_idx, full)
    return ref, out


@pytest.fixture
def force_splits(monkeypatch):
    """``force_splits(n)``: from now on the public op launches with n vocabulary splits."""
    launch = fast_logprobs.compute_spec_v2_logprobs_launch

    def force(n):
        monkeypatch.setattr(fast_logprobs, "compute_spec_v2_logprobs_launch", functools.partial(launch, _num_splits=n))

    return force


def _batch(temps, top_nums, token_ids, greedy=False, seq_len=5):
    B = len(temps)
    return SpecBatch(
        seq_lens=torch.full((B,), seq_len),
        sampling_info=SamplingInfo(torch.tensor(temps, dtype=torch.float32).reshape(B, 1), greedy),
        top_logprobs_nums=list(top_nums),
        token_ids_logprobs=list(token_ids),
    )


def _chain_case(B, S, W, V, seed=0, dtype=torch.float32, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B * W, V, generator=g) * scale).to(dtype)
    acc = torch.tensor([[b * W + j for j in range(S + 1)] for b in range(B)], dtype=torch.int32)
    predict = torch.randint(0, V, (B * W,), generator=g, dtype=torch.int32)
    return logits, predict, acc


# ----------------------------------------------------------------------------- random and awkward inputs


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_random_batches_match_reference(dtype):
    # random_logprob_case mixes greedy and sampled requests, padded and permuted accept rows, -inf tokens and fully
    # masked rows, top_logprobs_num in {0, 1, 5, 20} and ragged / None / duplicate token id lists.
    for seed in range(6):
        batch, lo, predict, acc, S = random_logprob_case(seed, dtype)
        compare(batch, lo.next_token_logits, predict, acc, S, original=seed % 3 == 2)


@pytest.mark.parametrize("splits", [1, 2, 3, 5])
def test_forced_vocabulary_splits_match_reference(force_splits, splits):
    # V = 45 over 3 splits is 16 + 16 + 13 columns; 5 splits leave the last two programs without a column.
    force_splits(splits)
    logits, predict, acc = _chain_case(B=2, S=2, W=3, V=45, seed=splits)
    logits[1, :20] = NEG_INF  # a split that sees only -inf
    logits[4] = NEG_INF  # a fully masked row
    acc[1, 2] = -1
    batch = _batch([0.7, 1.3], [5, 1], [[44, 0, 44], None])
    compare(batch, logits, predict, acc, 2)


def test_more_splits_than_tiles_with_full_top_k(force_splits):
    force_splits(7)  # V = 20: one 16-wide tile per split, so splits 2..6 are empty
    logits, predict, acc = _chain_case(B=1, S=1, W=2, V=20, seed=3)
    compare(_batch([0.5], [20], [[3]]), logits, predict, acc, 1)


def test_distinct_values_give_bit_equal_ids(force_splits):
    force_splits(3)
    logits, predict, acc = _chain_case(B=3, S=1, W=2, V=200, seed=4)  # continuous fp32: no ties
    batch = _batch([0.4, 1.0, 2.5], [20, 3, 1], [None, None, None])
    compare(batch, logits, predict, acc, 1, ids_bit_equal=True)


def test_vocabulary_of_one():
    logits, predict, acc = _chain_case(B=2, S=1, W=2, V=1)
    logits[3, 0] = NEG_INF
    compare(_batch([0.5, 2.0], [1, 0], [[0, 0], None]), logits, predict, acc, 1)


@pytest.mark.parametrize("splits", [None, 1])
def test_large_vocabulary(force_splits, splits):
    # V > 2^17 on two rows: the default heuristic splits the row over 32 programs; 1 forces a single pass.
    if splits is not None:
        force_splits(splits)
    V = 2**17 + 37
    logits, predict, acc = _chain_case(B=1, S=1, W=2, V=V, seed=5, dtype=torch.bfloat16, scale=4.0)
    logits[0, V - 1] = 30.0  # the winner in the last, partial tile
    compare(_batch([0.8], [5], [[V - 1, 0, 77777]]), logits, predict, acc, 1)


def _float64_chosen_logprobs(logits, predict, acc, temperature):
    """The accepted rows' chosen-token logprobs, float64 log-softmax of logits / temperature (None: unscaled)."""
    x = logits.double() if temperature is None else logits.double() / temperature
    rows = acc.reshape(-1).long()
    return torch.log_softmax(x, -1)[rows, predict[rows].long()].reshape(acc.shape)


@pytest.mark.parametrize("temperature", [0.01, None], ids=["temperature-0.01", "greedy"])
def test_empty_split_beside_a_row_max_below_exp_range(force_splits, temperature):
    """An empty vocabulary split (V = 40 over 4 splits of 16: the last one reads no column) merged into a row
    whose scaled maximum is below -88.7, where exp(-max) overflows float32: its zero partial sum must add 0,
    not 0 * inf = NaN. Logits in (-2, -1] at temperature 0.01 reach -100..-200; unscaled (greedy), logits
    near -100 do."""
    force_splits(4)
    g = torch.Generator().manual_seed(12)
    logits = -1.0 - torch.rand(2, 40, generator=g) if temperature else -100.0 - torch.rand(2, 40, generator=g)
    predict = torch.tensor([7, 39])
    acc = torch.tensor([[0, 1]])
    batch = _batch([temperature or 1.0], [3], [[0, 39]], greedy=temperature is None)
    ref, out = compare(batch, logits, predict, acc, 1)
    assert torch.isfinite(out.next_token_logprobs).all(), out.next_token_logprobs
    want = _float64_chosen_logprobs(logits, predict, acc, temperature)
    torch.testing.assert_close(out.next_token_logprobs.double(), want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("splits", [1, 3])
def test_scaled_rows_without_top_k_divide_only_the_max(force_splits, splits):
    """Without top-k the scan divides nothing but each row's raw max: the row's shift must still be torch's
    max of logits / T bit for bit (division by a positive T and its rounding are monotone), and the
    logprobs as close to float64 as the reference's at a temperature where x / T reaches the thousands
    (one fp32 ulp there is 1.2e-4)."""
    force_splits(splits)
    g = torch.Generator().manual_seed(21)
    V, T = 3001, 0.013
    logits = (torch.randn(3, V, generator=g) * 6).to(torch.bfloat16).float()
    predict = torch.randint(0, V, (3,), generator=g)
    rows = torch.arange(3)
    temps = torch.full((3,), T)
    accept = rows.reshape(3, 1)  # three requests of one accepted slot each
    lp, _, _, _, stats = fast_logprobs.compute_spec_v2_logprobs_launch(logits, predict, accept, temps, None, 0)
    assert torch.equal(stats[:, 0], (logits / temps[:, None]).max(dim=1).values)
    want = torch.log_softmax(logits.double() / T, -1)[rows, predict]
    ref = torch.log_softmax(logits / T, -1)[rows, predict].double()
    assert (lp.double() - want).abs().max() <= max(2 * (ref - want).abs().max(), 1e-5)


def test_default_launch_with_an_empty_split_at_a_tiny_temperature():
    """Through the public op's own split heuristic: two accepted rows of V = 24,577 get 6 splits of 6,144
    columns (whole tiles), the last two empty (as 2 rows of V = 151,936 get 37, some empty); temperature 0.01
    puts the row maximum near -100."""
    V = 24577
    splits = fast_logprobs.num_vocab_splits(2, V, fast_logprobs._NOMINAL_SM_COUNT)
    tile = fast_logprobs.BLOCK_V
    split_len = math.ceil(math.ceil(V / splits) / tile) * tile  # whole tiles, as the launcher's
    assert (splits - 1) * split_len >= V
    g = torch.Generator().manual_seed(13)
    logits = -1.0 - torch.rand(2, V, generator=g)
    predict = torch.tensor([5, V - 1])
    acc = torch.tensor([[0, 1]])
    ref, out = compare(_batch([0.01], [0], [None]), logits, predict, acc, 1)
    assert torch.isfinite(out.next_token_logprobs).all(), out.next_token_logprobs
    want = _float64_chosen_logprobs(logits, predict, acc, 0.01)
    torch.testing.assert_close(out.next_token_logprobs.double(), want, rtol=0, atol=1e-3)


def test_split_heuristic():
    split = fast_logprobs.num_vocab_splits
    assert split(2, 151936, 132) > 8  # decode: two rows, a large vocabulary
    per_split = fast_logprobs._MIN_TILES_PER_SPLIT * fast_logprobs.BLOCK_V
    assert split(2, 151936, 132) * per_split <= 151936 + per_split
    # 256 rows of Qwen's vocabulary (the fused pass's goal shape) on an H200's 132 SMs: one program per row
    # would be 2 per SM with one tile in flight each; several resident programs per SM keep several in flight
    goal = split(256, 151936, 132)
    assert 256 * goal >= 4 * 132 and goal * per_split <= 151936
    assert split(8 * 132, 151936, 132) == 1  # the rows alone fill the GPU
    assert split(2, 48, 132) == 1  # nothing worth splitting
    assert 1 <= split(1, 2**18, 132) <= fast_logprobs._MAX_SPLITS


def test_tree_at_maximum_size():
    # topk 4, 3 steps: W = 1 + K + (S-1)K^2 = 37 nodes per request; accepted nodes anywhere in the tree.
    B, S, W, V = 2, 3, 37, 64
    logits, predict, _ = _chain_case(B=B, S=S, W=W, V=V, seed=6)
    acc = torch.tensor([[0, 4, 17, 36], [W + 0, W + 36, -1, -1]], dtype=torch.int64)
    compare(_batch([0.6, 1.4], [3, 8], [[63], [1, 2, 3]]), logits, predict, acc, S)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_masked_tokens_and_fully_masked_rows(dtype):
    B, S, W, V = 2, 1, 2, 8
    logits = torch.randn(B * W, V)
    logits[:, 3] = NEG_INF
    logits[1] = NEG_INF
    logits = logits.to(dtype)
    predict = torch.tensor([3, 5, 0, 3])
    acc = torch.tensor([[0, 1], [2, 3]])
    ref, out = compare(_batch([0.3, 1.5], [V, 2], [[3, 0], [3]]), logits, predict, acc, S)
    assert out.next_token_logprobs[0, 1].item() == FMIN  # every token of a fully masked row
    assert out.next_token_top_logprobs_val[1].tolist() == [FMIN] * V
    assert out.next_token_top_logprobs_idx[0][-1].item() == 3  # the masked token sorts last


@pytest.mark.parametrize("splits", [1, 3])
def test_ties_in_top_k(force_splits, splits):
    # Integer-valued logits over V = 48: each value is shared by about ten tokens, ties straddle every cut.
    force_splits(splits)
    g = torch.Generator().manual_seed(7)
    logits = torch.randint(-2, 3, (6, 48), generator=g).float()
    logits[5, :] = 1.0  # one row entirely tied
    predict = torch.randint(0, 48, (6,), generator=g)
    acc = torch.tensor([[0, 1, 2], [3, 4, 5]])
    compare(_batch([1.0, 0.5], [20, 7], [[0], None]), logits, predict, acc, 2)


@pytest.mark.parametrize("top_nums", [[0, 0], [1, 1], [20, 0], [33, 5], [64, 0]], ids=str)
def test_top_logprobs_num_around_the_cap(top_nums):
    # <= TOP_K_CAP (32): the kernel's running top-k; above it: torch.topk over the raw rows + the kernel's lse.
    logits, predict, acc = _chain_case(B=2, S=1, W=3, V=64, seed=8)
    logits[2, ::3] = NEG_INF
    acc[1, 1] = -1
    compare(_batch([0.7, 1.9], top_nums, [None, [5]]), logits, predict, acc, 1)
    assert fast_logprobs.TOP_K_CAP >= 20


def test_token_ids_ragged_none_and_duplicates():
    logits, predict, acc = _chain_case(B=4, S=1, W=2, V=70, seed=9)
    ids = [[69, 2, 69, 0], None, [], [5] * 40]  # 40 ids: more than one block of the ids loop
    ref, out = compare(_batch([1.0, 0.2, 3.0, 0.7], [0, 0, 0, 0], ids), logits, predict, acc, 1)
    assert out.next_token_token_ids_logprobs_idx == [[69, 2, 69, 0]] * 2 + [[]] * 4 + [[5] * 40] * 2
    out.next_token_token_ids_logprobs_idx[0].append(1)  # a fresh list per row
    assert out.next_token_token_ids_logprobs_idx[1] == [69, 2, 69, 0]


def test_slot_zero_padded_reads_own_request_only():
    logits, predict, acc = _chain_case(B=2, S=1, W=2, V=16, seed=10)
    acc[1] = torch.tensor([-1, -1])
    logits[2:] = float("nan")  # the request's own rows: never emitted, never leak into request 0
    ref, out = compare(_batch([0.5, 1.0], [2, 2], [[1], [1]]), logits, predict, acc, 1)
    assert out.next_token_logprobs[1].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("mode", ["all_greedy", "original", "nonpositive_temperature"])
def test_unscaled_modes(mode):
    logits, predict, acc = _chain_case(B=3, S=1, W=2, V=40, seed=12)
    temps = [0.0, -1.0, float("nan")] if mode == "nonpositive_temperature" else [0.3, 2.0, 0.5]
    batch = _batch(temps, [4, 0, 2], [[1, 39], None, [0]], greedy=mode == "all_greedy")
    ref, out = compare(batch, logits, predict, acc, 1, original=mode == "original")
    rows = acc.reshape(-1).long()
    want = torch.log_softmax(logits.double(), -1)[rows, predict.long()[rows]]
    atol, _ = tolerance("logprob", torch.float32)
    assert torch.allclose(out.next_token_logprobs.reshape(-1).double(), want, atol=atol, rtol=0)


def test_empty_batch():
    lo = LogitsOutput(torch.zeros(0, 10))
    batch = _batch([], [], [])
    fast_op(batch, lo, torch.zeros(0, dtype=torch.long), torch.zeros(0, 3, dtype=torch.long), 2)
    assert tuple(lo.next_token_logprobs.shape) == (0, 3)
    assert lo.next_token_top_logprobs_val is None and lo.next_token_token_ids_logprobs_val is None


def test_non_contiguous_logits():
    base = torch.randn(6, 50)
    logits = base[:, :37]  # row stride 50
    predict = torch.randint(0, 37, (6,))
    acc = torch.tensor([[0, 1, 2], [3, 5, -1]])
    compare(_batch([0.5, 1.5], [3, 3], [[36], None]), logits, predict, acc, 2)


def test_strided_predict_accept_index_and_temperatures():
    """The kernel reads predict, accept_index and the temperatures by position: a strided view of each (an
    expanded temperature has stride 0) must give what the reference gives."""
    logits, predict, acc = _chain_case(B=3, S=2, W=4, V=41, seed=5)
    acc[1, 2] = -1
    strided_predict = torch.stack([predict, torch.zeros_like(predict)], 1)[:, 0]  # stride 2
    strided_acc = acc.t().contiguous().t()  # strides (1, B)
    batch = _batch([0.7] * 3, [2, 0, 1], [None, [3], None])
    batch.sampling_info.temperatures = torch.tensor([[0.7]]).expand(3, 1)  # strides (0, 1)
    assert strided_predict.stride() == (2,) and not strided_acc.is_contiguous()
    compare(batch, logits, strided_predict, strided_acc, 2)
    batch.sampling_info.temperatures = torch.tensor([[0.7], [1.9], [0.3]])
    compare(batch, logits, strided_predict, strided_acc, 2)


# ----------------------------------------------------------------------------- contract and the checks themselves


def test_no_host_sync(force_splits):
    batch, lo, predict, acc, S = random_logprob_case(11, torch.float32, B=3, S=3, W=5, V=23)
    batch.top_logprobs_nums = [5, 0, 20]
    batch.token_ids_logprobs = [[1, 2], None, [0]]
    with no_host_sync():
        fast_op(batch, lo, predict, acc, S)
    force_splits(2)
    batch.top_logprobs_nums = [23, 0, 0]  # above the cap: the torch.topk fallback
    with no_host_sync():
        fast_op(batch, LogitsOutput(lo.next_token_logits), predict, acc, S)
    with pytest.raises(AssertionError, match="host sync"), no_host_sync():  # the guard itself works
        lo.next_token_logprobs.sum().item()


def test_signature_and_docstring_match_the_reference():
    assert inspect.signature(fast_op) == inspect.signature(reference_op)
    doc = fast_op.__doc__
    assert doc.lstrip().startswith("Logprobs of the accepted path")
    assert "Shape contract" in doc.split("\n\n")[1]


def test_comparison_can_fail():
    logits, predict, acc = _chain_case(B=2, S=1, W=2, V=30, seed=13)
    batch = _batch([0.5, 1.5], [4, 4], [[1], None])
    ref, out = compare(batch, logits, predict, acc, 1)
    atol, _ = tolerance("logprob", torch.float32)
    bumped = out.next_token_logprobs.clone()
    bumped[1, 0] += 2 * atol
    with pytest.raises(AssertionError):
        assert_equivalent(ref.next_token_logprobs, bumped, "logprob", torch.float32)
    full = _full_reference_rows(batch, logits, predict, acc, 1, False)
    swapped = [i.clone() for i in out.next_token_top_logprobs_idx]
    swapped[0][[0, 1]] = swapped[0][[1, 0]]
    with pytest.raises(AssertionError):
        _assert_top_ids_match(ref.next_token_top_logprobs_val, ref.next_token_top_logprobs_idx, swapped, full)


def test_measured_error_is_within_the_table():
    # Runs last in this module: every comparison above recorded its worst |fast - reference|.
    for dtype, err in MAX_ERR.items():
        atol, _ = tolerance("logprob", dtype)
        assert err <= atol, (dtype, err)
    print("max |fast - reference| per logits dtype:", {str(d): f"{e:.2e}" for d, e in MAX_ERR.items()})
