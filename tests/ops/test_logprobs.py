"""Tests of ``reference.compute_spec_v2_logprobs`` and ``fast.logprobs.compute_spec_v2_logprobs`` against an
independent float64 computation (every test that calls the op runs on both, through the
``compute_spec_v2_logprobs`` fixture; the fast op runs under ``TRITON_INTERPRET=1`` on CPU).

The oracle below is written out by hand over Python floats (``math.exp`` / ``math.log``), one
row at a time; it shares no code with the implementation (no ``torch.log_softmax``).

Tolerance. ``ATOL = 1e-5`` for every logits dtype. The oracle reads the *same* logits the
helper reads (bf16/fp16 values are exactly representable in fp32 and in float64), so the only
difference left is the helper's fp32 arithmetic: division by the temperature, the max shift,
the log-sum-exp and the final subtraction each round to half an fp32 ulp of a value of
magnitude at most |logprob|. The random logits are uniform in [-3, 3] and temperatures are
>= 0.1, so every finite logprob has magnitude < 60 + log(V) < 64, where half an ulp is
2**-19 ~ 1.9e-6; a few such roundings stay under 1e-5 (measured: the worst error over every
vocabulary entry of 1500 random cases per dtype is 4.9e-6). (Compared with float64 of the
*unrounded* fp32 logits instead, bf16 would be off by up to ~|logit/T| * 2**-9 ~ 0.1 and fp16
by ~|logit/T| * 2**-12 ~ 0.015: that error is the input's rounding, not the helper's, so it is
not what these tests measure.) Masked tokens give float32's finite minimum exactly on both
sides.
"""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fast.logprobs import compute_spec_v2_logprobs as fast_compute
from reference.logprobs import compute_spec_v2_logprobs as reference_compute
from specdec.ops.logprob_types import LogitsOutput, SamplingInfo, SpecBatch
from tests.helpers.equivalence import no_host_sync
from tests.helpers.oracles import random_logprob_case

ATOL = 1e-5
FMIN = torch.finfo(torch.float32).min  # as a Python float: exactly float32's finite minimum
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NEG_INF = float("-inf")
IMPLS = {"reference": reference_compute, "fast": fast_compute}


@pytest.fixture(params=list(IMPLS))
def compute_spec_v2_logprobs(request):
    """The op under test: each test that asks for it runs on the reference and on the fast op."""
    return IMPLS[request.param]


# ----------------------------------------------------------------------------- the oracle


def oracle_row(row: list[float], temperature: float | None) -> list[float]:
    """float64 log-softmax of one row, by hand. ``temperature`` None = no scaling."""
    if temperature is not None:
        t = temperature if temperature > 0 else 1.0
        xs = [v / t for v in row]
    else:
        xs = list(row)
    finite = [v for v in xs if v != NEG_INF]
    if not finite:
        return [FMIN] * len(xs)
    m = max(finite)
    total = 0.0
    for v in finite:
        total += math.exp(v - m)
    lse = m + math.log(total)
    return [FMIN if v == NEG_INF else max(v - lse, FMIN) for v in xs]


def oracle(batch, logits, predict, accept_index, return_original_logprob=False):
    """Expected outputs as nested Python lists; None where a slot is padded."""
    B, T = len(accept_index), len(accept_index[0])
    scale = not (batch.sampling_info.is_all_greedy or return_original_logprob)
    temps = [float(t) for t in batch.sampling_info.temperatures.reshape(-1).tolist()] if scale else None
    rows_cache: dict[tuple[int, int], list[float]] = {}
    out = []  # out[b][j] = None (padded) or the full logprob row
    for b in range(B):
        per_req = []
        for j in range(T):
            a = accept_index[b][j]
            if a < 0:
                per_req.append(None)
                continue
            key = (a, b)  # the temperature is the request's, whatever row is read
            if key not in rows_cache:
                rows_cache[key] = oracle_row(logits[a], temps[b] if scale else None)
            per_req.append(rows_cache[key])
        out.append(per_req)
    return out


def check_against_oracle(batch, lo, predict, accept_index, *, return_original_logprob=False, atol=ATOL):
    logits = lo.next_token_logits.float().tolist()
    pred = predict.tolist()
    acc = accept_index.tolist()
    exp_rows = oracle(batch, logits, pred, acc, return_original_logprob)
    B, T = accept_index.shape
    R = B * T

    lp = lo.next_token_logprobs
    assert lp.dtype == torch.float32 and tuple(lp.shape) == (B, T)
    assert not torch.isnan(lp).any() and not torch.isinf(lp).any()
    for b in range(B):
        for j in range(T):
            row = exp_rows[b][j]
            want = 0.0 if row is None else row[pred[acc[b][j]]]
            got = lp[b, j].item()
            assert abs(got - want) <= atol, (b, j, got, want)

    top_nums = batch.top_logprobs_nums
    if not any(top_nums):
        assert lo.next_token_top_logprobs_val is None and lo.next_token_top_logprobs_idx is None
    else:
        vals, idxs = lo.next_token_top_logprobs_val, lo.next_token_top_logprobs_idx
        assert len(vals) == R and len(idxs) == R
        for b in range(B):
            k = top_nums[b]
            for j in range(T):
                r = b * T + j
                v, i = vals[r], idxs[r]
                assert v.dtype == torch.float32 and i.dtype == torch.int64
                assert tuple(v.shape) == (k,) and tuple(i.shape) == (k,)
                row = exp_rows[b][j]
                if row is None:
                    assert v.tolist() == [0.0] * k and i.tolist() == [-1] * k
                    continue
                v, i = v.tolist(), i.tolist()
                order = sorted(range(len(row)), key=lambda t: (-row[t], t))
                ref_sorted = [row[t] for t in order]
                assert all(v[p] >= v[p + 1] for p in range(k - 1)), v  # descending
                for p in range(k):
                    assert abs(v[p] - ref_sorted[p]) <= atol, (b, j, p, v[p], ref_sorted[p])
                    assert abs(row[i[p]] - v[p]) <= atol, (b, j, p)  # the index carries its value
                    tied = any(
                        abs(ref_sorted[q] - ref_sorted[p]) <= 10 * atol
                        for q in (p - 1, p + 1)
                        if 0 <= q < len(ref_sorted)
                    )
                    if not tied:
                        assert i[p] == order[p], (b, j, p, i[p], order[p])

    tids = batch.token_ids_logprobs
    if tids is None or not any(tids):
        assert lo.next_token_token_ids_logprobs_val is None
        assert lo.next_token_token_ids_logprobs_idx is None
    else:
        vals, idxs = lo.next_token_token_ids_logprobs_val, lo.next_token_token_ids_logprobs_idx
        assert len(vals) == R and len(idxs) == R
        for b in range(B):
            ids = list(tids[b] or [])
            for j in range(T):
                r = b * T + j
                assert idxs[r] == ids and isinstance(idxs[r], list)
                v = vals[r]
                assert v.dtype == torch.float32 and tuple(v.shape) == (len(ids),)
                row = exp_rows[b][j]
                want = [0.0] * len(ids) if row is None else [row[t] for t in ids]
                for got, w in zip(v.tolist(), want):
                    assert abs(got - w) <= atol, (b, j, got, w)


# ----------------------------------------------------------------------------- random cases


def _random_batch_matches_oracle(op, dtype, seed, original):
    batch, lo, predict, accept_index, S = random_logprob_case(seed, dtype)
    ret = op(batch, lo, predict, accept_index, S, return_original_logprob=original)
    assert ret is lo
    check_against_oracle(batch, lo, predict, accept_index, return_original_logprob=original)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**31 - 1), original=st.booleans())
def test_random_batches_match_float64_oracle(dtype, seed, original):
    _random_batch_matches_oracle(reference_compute, dtype, seed, original)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@settings(max_examples=10, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**31 - 1), original=st.booleans())
def test_random_batches_match_float64_oracle_fast(dtype, seed, original):
    # Fewer examples than the reference's: each costs ~0.3 s under the Triton interpreter.
    _random_batch_matches_oracle(fast_compute, dtype, seed, original)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_fixed_seeds_all_dtypes(compute_spec_v2_logprobs, dtype):
    # Deterministic coverage next to the hypothesis run; also the accuracy measurement
    # behind ATOL: the worst error over these cases stays well under it. (8 seeds for the
    # interpreted fast op, to keep the run short.)
    for seed in range(25 if compute_spec_v2_logprobs is reference_compute else 8):
        batch, lo, predict, accept_index, S = random_logprob_case(seed, dtype)
        compute_spec_v2_logprobs(batch, lo, predict, accept_index, S)
        check_against_oracle(batch, lo, predict, accept_index)


def test_oracle_is_not_trivially_satisfied(compute_spec_v2_logprobs):
    # The comparison must be able to fail: perturb one output and the check catches it.
    batch, lo, predict, accept_index, S = _simple()
    compute_spec_v2_logprobs(batch, lo, predict, accept_index, S)
    check_against_oracle(batch, lo, predict, accept_index)
    lo.next_token_logprobs[0, 0] += 5 * ATOL
    with pytest.raises(AssertionError):
        check_against_oracle(batch, lo, predict, accept_index)


# ----------------------------------------------------------------------------- semantics


def _simple(B=3, S=2, W=3, V=16, temps=(0.5, 1.7, 0.3), greedy=False, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B * W, V, generator=g) * 2).to(dtype)
    acc = torch.tensor([[b * W + j for j in range(S + 1)] for b in range(B)], dtype=torch.int64)
    predict = torch.randint(0, V, (B * W,), generator=g)
    batch = SpecBatch(
        seq_lens=torch.full((B,), 7),
        sampling_info=SamplingInfo(torch.tensor(temps, dtype=torch.float32).reshape(B, 1), greedy),
        top_logprobs_nums=[0] * B,
        token_ids_logprobs=[None] * B,
    )
    return batch, LogitsOutput(logits), predict, acc, S


def test_all_greedy_batch_is_not_temperature_scaled(compute_spec_v2_logprobs):
    batch, lo, predict, acc, S = _simple(greedy=True)  # temperatures deliberately != 1
    compute_spec_v2_logprobs(batch, lo, predict, acc, S)
    want = torch.log_softmax(lo.next_token_logits.double(), -1)[acc.reshape(-1), predict[acc.reshape(-1)]]
    assert torch.allclose(lo.next_token_logprobs.reshape(-1).double(), want, atol=ATOL, rtol=0)
    check_against_oracle(batch, lo, predict, acc)


def test_return_original_logprob_skips_temperature(compute_spec_v2_logprobs):
    batch, lo, predict, acc, S = _simple()
    compute_spec_v2_logprobs(batch, lo, predict, acc, S)
    scaled = lo.next_token_logprobs.clone()
    check_against_oracle(batch, lo, predict, acc)
    compute_spec_v2_logprobs(batch, lo, predict, acc, S, return_original_logprob=True)
    check_against_oracle(batch, lo, predict, acc, return_original_logprob=True)
    assert (scaled - lo.next_token_logprobs).abs().max() > 0.1  # the two really differ here


def test_temperature_follows_request_not_row_position(compute_spec_v2_logprobs):
    # Request b's accepted rows live in block (b+1) % B: a row -> request mapping by
    # row // W would pick another request's temperature.
    B, S, W, V = 3, 2, 4, 16
    batch, lo, predict, _, _ = _simple(B=B, S=S, W=W, V=V, temps=(0.2, 1.0, 1.9))
    acc = torch.tensor([[((b + 1) % B) * W + n for n in (0, 2, 1)] for b in range(B)], dtype=torch.int32)
    compute_spec_v2_logprobs(batch, lo, predict, acc, S)
    check_against_oracle(batch, lo, predict, acc)
    # and the wrong mapping is distinguishable from the right one on this data
    wrong = oracle(
        SimpleNamespace(sampling_info=SamplingInfo(torch.tensor([[1.9], [0.2], [1.0]]), False)),
        lo.next_token_logits.tolist(),
        predict.tolist(),
        acc.tolist(),
    )
    a00 = acc[0, 0].item()
    assert abs(wrong[0][0][predict[a00].item()] - lo.next_token_logprobs[0, 0].item()) > 0.1


def test_nonpositive_temperature_is_treated_as_one(compute_spec_v2_logprobs):
    batch, lo, predict, acc, S = _simple(temps=(0.0, -1.0, 1.0))
    compute_spec_v2_logprobs(batch, lo, predict, acc, S)
    want = torch.log_softmax(lo.next_token_logits.double(), -1)[acc.reshape(-1), predict[acc.reshape(-1)]]
    assert torch.allclose(lo.next_token_logprobs.reshape(-1).double(), want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_masked_tokens_give_float32_min_never_inf_or_nan(compute_spec_v2_logprobs, dtype):
    B, S, W, V = 2, 1, 2, 8
    logits = torch.randn(B * W, V)
    logits[:, 3] = NEG_INF  # masked token in every row
    logits[1] = NEG_INF  # request 0's node 1: every token masked
    logits = logits.to(dtype)
    predict = torch.tensor([3, 5, 0, 3])  # row 0 and row 3 pick the masked token
    acc = torch.tensor([[0, 1], [2, 3]])
    batch = SpecBatch(
        torch.tensor([4, 4]),
        SamplingInfo(torch.tensor([[0.3], [1.5]]), False),
        top_logprobs_nums=[V, 2],
        token_ids_logprobs=[[3, 0], [3]],
    )
    lo = compute_spec_v2_logprobs(batch, LogitsOutput(logits), predict, acc, S)
    lp = lo.next_token_logprobs
    assert lp[0, 0].item() == FMIN and lp[1, 1].item() == FMIN
    assert lp[0, 1].item() == FMIN  # fully masked row: every token gets the minimum
    for t in [lp, *lo.next_token_top_logprobs_val, *lo.next_token_token_ids_logprobs_val]:
        assert torch.isfinite(t).all(), t
    assert lo.next_token_top_logprobs_val[1].tolist() == [FMIN] * V
    assert lo.next_token_top_logprobs_val[0][-1].item() == FMIN  # masked token sorts last
    assert lo.next_token_top_logprobs_idx[0][-1].item() == 3
    assert lo.next_token_token_ids_logprobs_val[2][0].item() == FMIN
    check_against_oracle(batch, lo, predict, acc)


@pytest.mark.parametrize("sentinel", [1e4, float("nan"), float("inf")])
def test_padded_slots_never_read_another_requests_row(compute_spec_v2_logprobs, sentinel):
    # SGLang's version reads row -1 (the last request's last node) at a padded slot.
    B, S, W, V = 3, 3, 4, 12
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(B * W, V, generator=g)
    logits[-1] = 0.0
    logits[-1, 7] = sentinel  # the last request's last row
    predict = torch.full((B * W,), 7)
    acc = torch.tensor([[0, 2, -1, -1], [4, -1, -1, -1], [8, 9, 10, -1]])
    batch = SpecBatch(
        torch.tensor([5, 5, 5]),
        SamplingInfo(torch.tensor([[0.7], [1.0], [1.3]]), False),
        top_logprobs_nums=[3, 0, 2],
        token_ids_logprobs=[[7, 1], None, [7]],
    )
    lo = compute_spec_v2_logprobs(batch, LogitsOutput(logits), predict, acc, S)
    lp = lo.next_token_logprobs
    assert torch.isfinite(lp).all()
    assert lp[0, 2:].tolist() == [0.0, 0.0] and lp[1, 1:].tolist() == [0.0] * 3 and lp[2, 3].item() == 0.0
    T = S + 1
    for b, j in [(0, 2), (0, 3), (2, 3)]:
        assert lo.next_token_top_logprobs_val[b * T + j].tolist() == [0.0] * batch.top_logprobs_nums[b]
        assert lo.next_token_top_logprobs_idx[b * T + j].tolist() == [-1] * batch.top_logprobs_nums[b]
    assert lo.next_token_token_ids_logprobs_val[0 * T + 2].tolist() == [0.0, 0.0]
    assert lo.next_token_token_ids_logprobs_idx[0 * T + 2] == [7, 1]
    for v in lo.next_token_top_logprobs_val + lo.next_token_token_ids_logprobs_val:
        assert torch.isfinite(v).all()
    check_against_oracle(batch, lo, predict, acc)

    # Outputs of requests 0 and 1 do not depend on anything in request 2's rows.
    logits2 = logits.clone()
    logits2[2 * W :] = torch.randn(W, V, generator=g) * 50
    lo2 = compute_spec_v2_logprobs(batch, LogitsOutput(logits2), predict, acc, S)
    assert torch.equal(lo2.next_token_logprobs[:2], lp[:2])
    for r in range(2 * T):
        assert torch.equal(lo2.next_token_top_logprobs_val[r], lo.next_token_top_logprobs_val[r])
        assert torch.equal(lo2.next_token_token_ids_logprobs_val[r], lo.next_token_token_ids_logprobs_val[r])


def test_top_logprobs_num_mix_of_zero_and_positive(compute_spec_v2_logprobs):
    batch, lo, predict, acc, S = _simple(B=4, temps=(1.0, 0.5, 2.0, 0.1))
    batch.top_logprobs_nums = [0, 3, 0, 16]
    compute_spec_v2_logprobs(batch, lo, predict, acc, S)
    T = S + 1
    vals, idxs = lo.next_token_top_logprobs_val, lo.next_token_top_logprobs_idx
    assert [len(v) for v in vals] == [0] * T + [3] * T + [0] * T + [16] * T
    assert [len(i) for i in idxs] == [0] * T + [3] * T + [0] * T + [16] * T
    assert vals[0].dtype == torch.float32 and idxs[0].dtype == torch.int64
    # entries are views of one padded tensor (no per-row allocation, no host sync)
    base = vals[T].untyped_storage().data_ptr()
    assert all(v.untyped_storage().data_ptr() == base for v in vals)
    assert sorted(idxs[3 * T].tolist()) == list(range(16))  # k = V: a permutation of the vocab
    check_against_oracle(batch, lo, predict, acc)


def test_no_request_asks_gives_none_lists(compute_spec_v2_logprobs):
    batch, lo, predict, acc, S = _simple()
    batch.top_logprobs_nums = [0, 0, 0]
    batch.token_ids_logprobs = [None, [], None]
    lo.next_token_top_logprobs_val = ["stale"]
    lo.next_token_token_ids_logprobs_val = ["stale"]
    compute_spec_v2_logprobs(batch, lo, predict, acc, S)
    assert lo.next_token_top_logprobs_val is None and lo.next_token_top_logprobs_idx is None
    assert lo.next_token_token_ids_logprobs_val is None and lo.next_token_token_ids_logprobs_idx is None


def test_token_ids_ragged_duplicates_and_order(compute_spec_v2_logprobs):
    batch, lo, predict, acc, S = _simple(V=16)
    batch.token_ids_logprobs = [[9, 2, 9], None, [15]]
    compute_spec_v2_logprobs(batch, lo, predict, acc, S)
    T = S + 1
    vals, idxs = lo.next_token_token_ids_logprobs_val, lo.next_token_token_ids_logprobs_idx
    assert idxs == [[9, 2, 9]] * T + [[]] * T + [[15]] * T
    assert [tuple(v.shape) for v in vals] == [(3,)] * T + [(0,)] * T + [(1,)] * T
    assert vals[0][0].item() == vals[0][2].item()
    check_against_oracle(batch, lo, predict, acc)
    idxs[0].append(99)  # each row's idx list is its own copy
    assert idxs[1] == [9, 2, 9] and batch.token_ids_logprobs[0] == [9, 2, 9]


def test_target_only_decoding_w1_s0(compute_spec_v2_logprobs):
    batch, lo, predict, acc, S = _simple(B=3, S=0, W=1)
    batch.top_logprobs_nums = [2, 0, 1]
    compute_spec_v2_logprobs(batch, lo, predict, acc, S)
    assert tuple(lo.next_token_logprobs.shape) == (3, 1)
    check_against_oracle(batch, lo, predict, acc)


def test_duck_typed_inputs(compute_spec_v2_logprobs):
    batch, lo, predict, acc, S = _simple()
    ns_batch = SimpleNamespace(
        seq_lens=batch.seq_lens,
        sampling_info=SimpleNamespace(temperatures=batch.sampling_info.temperatures, is_all_greedy=False),
        top_logprobs_nums=[1, 2, 3],
        token_ids_logprobs=[[1], [2], None],
    )
    ns_out = SimpleNamespace(next_token_logits=lo.next_token_logits)
    assert compute_spec_v2_logprobs(ns_batch, ns_out, predict, acc, S) is ns_out
    check_against_oracle(ns_batch, ns_out, predict, acc)


def test_no_host_sync(compute_spec_v2_logprobs):
    batch, lo, predict, acc, S = random_logprob_case(11, torch.float32, B=3, S=3, W=5, V=23)
    batch.top_logprobs_nums = [5, 0, 20]
    batch.token_ids_logprobs = [[1, 2], None, [0]]
    with no_host_sync():
        compute_spec_v2_logprobs(batch, lo, predict, acc, S)
    check_against_oracle(batch, lo, predict, acc)
    with pytest.raises(AssertionError, match="host sync"), no_host_sync():  # the guard itself works
        lo.next_token_logprobs.sum().item()


def test_signature_is_the_shared_contract(compute_spec_v2_logprobs):
    sig = inspect.signature(compute_spec_v2_logprobs)
    assert [(p.name, p.kind) for p in sig.parameters.values()] == [
        ("batch", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("logits_output", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("predict", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("accept_index", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("speculative_num_steps", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("return_original_logprob", inspect.Parameter.KEYWORD_ONLY),
    ]
    assert sig.parameters["return_original_logprob"].default is False
    assert compute_spec_v2_logprobs.__doc__.lstrip().startswith("Logprobs of the accepted path")
    assert "Shape contract" in compute_spec_v2_logprobs.__doc__.split("\n\n")[1]


# ----------------------------------------------------------------------------- bad input


def _run(op, mutate):
    batch, lo, predict, acc, S = _simple(B=3, S=2, W=3, V=16)
    args = {
        "batch": batch,
        "logits_output": lo,
        "predict": predict,
        "accept_index": acc,
        "speculative_num_steps": S,
    }
    mutate(args)
    return op(**args)


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda a: setattr(a["batch"], "top_logprobs_nums", [0, 0, 17]), r"request 2: top_logprobs_num .* got 17"),
        (lambda a: setattr(a["batch"], "top_logprobs_nums", [0, -1, 0]), r"request 1: top_logprobs_num .* got -1"),
        (lambda a: setattr(a["batch"], "top_logprobs_nums", [1, 1]), r"top_logprobs_nums has 2 entries"),
        (
            lambda a: setattr(a["batch"], "token_ids_logprobs", [None, [3, 16], None]),
            r"request 1: token_ids_logprobs\[1\] must be an int in \[0, 15\], got 16",
        ),
        (lambda a: setattr(a["batch"], "token_ids_logprobs", [[-2], None, None]), r"0: token_ids_logprobs\[0\] .* -2"),
        (
            lambda a: setattr(a["batch"], "token_ids_logprobs", [None] * 4),
            r"token_ids_logprobs has 4 entries",
        ),
        (lambda a: a.update(speculative_num_steps=3), r"accept_index .*\(B, speculative_num_steps \+ 1\)"),
        (lambda a: a.update(accept_index=a["accept_index"].reshape(-1)), r"accept_index must have shape \(\*, 3\)"),
        (lambda a: a.update(predict=a["predict"][:-1]), r"predict must have shape \(9,\) .* got \(8,\)"),
        (lambda a: a.update(predict=a["predict"].reshape(3, 3)), r"predict must have shape \(9,\)"),
        (
            lambda a: a.update(logits_output=LogitsOutput(a["logits_output"].next_token_logits[:-1])),
            r"8 rows, not a positive multiple of the batch size B = 3",
        ),
        (
            lambda a: setattr(a["batch"].sampling_info, "temperatures", torch.ones(3)),
            r"batch.sampling_info.temperatures must have shape \(3, 1\), got \(3,\)",
        ),
        (lambda a: setattr(a["batch"], "seq_lens", torch.ones(2)), r"seq_lens has 2 entries"),
        (lambda a: a.update(speculative_num_steps=-1), r"speculative_num_steps must be an int >= 0"),
    ],
)
def test_bad_input_is_a_value_error(compute_spec_v2_logprobs, mutate, pattern):
    with pytest.raises(ValueError, match=pattern):
        _run(compute_spec_v2_logprobs, mutate)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda a: a.update(predict=a["predict"].float()),
        lambda a: a.update(accept_index=a["accept_index"].float()),
        lambda a: a.update(logits_output=LogitsOutput(a["logits_output"].next_token_logits.long())),
        lambda a: setattr(a["batch"], "top_logprobs_nums", [0, 1.5, 0]),
        lambda a: setattr(a["batch"], "top_logprobs_nums", [0, True, 0]),
        lambda a: setattr(a["batch"], "token_ids_logprobs", [None, [1, False], None]),
        lambda a: setattr(a["batch"], "token_ids_logprobs", [None, "ab", None]),
    ],
)
def test_bad_types_are_type_errors(compute_spec_v2_logprobs, mutate):
    with pytest.raises(TypeError):
        _run(compute_spec_v2_logprobs, mutate)


def test_temperatures_not_checked_when_unused(compute_spec_v2_logprobs):
    # all-greedy / original logprobs never read the temperatures
    _run(compute_spec_v2_logprobs, lambda a: setattr(a["batch"], "sampling_info", SamplingInfo(None, True)))
    batch, lo, predict, acc, S = _simple()
    batch.sampling_info.temperatures = None
    compute_spec_v2_logprobs(batch, lo, predict, acc, S, return_original_logprob=True)
    check_against_oracle(batch, lo, predict, acc, return_original_logprob=True)
