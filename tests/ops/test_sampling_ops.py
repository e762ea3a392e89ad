"""The target distribution's ops: softmax_with_temperature, top_k_renorm_prob, top_p_renorm_prob.

Each path against the independent float64 Python oracle (tests/helpers/oracles/; ties, boundaries, V = 1, -inf
logits), fast against reference through the one equivalence helper, no host sync, equal signatures, bad input,
and the engine's composition of the three (order, and filters skipped when nobody asked).
"""
import inspect

import pytest
import torch

import fast.sampling as fast_ops
import reference
from specdec import SamplingParams
from specdec.sampling import SamplingTensors
from tests.helpers.equivalence import assert_equivalent, no_host_sync
from tests.helpers.oracles import oracle_softmax, oracle_top_k, oracle_top_p

OPS = ("softmax_with_temperature", "top_k_renorm_prob", "top_p_renorm_prob")
BOTH = pytest.mark.parametrize("ops", [reference, fast_ops], ids=["reference", "fast"])


def _rows(values):
    return torch.tensor(values, dtype=torch.float32)


def assert_matches_oracle(out, expected):
    """Same kept set exactly, values within fp32 renormalisation rounding."""
    expected = torch.tensor(expected, dtype=torch.float64)
    assert torch.equal(out > 0, expected > 0), (out, expected)
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-7)


# ---- (a) each path against the oracle -----------------------------------------------------------

@BOTH
def test_example_from_the_design_top_k_then_top_p_over_the_renormalised_probs(ops):
    p = _rows([[0.4, 0.3, 0.2, 0.1]])
    filtered = ops.top_p_renorm_prob(ops.top_k_renorm_prob(p, torch.tensor([2])), torch.tensor([0.5]))
    assert filtered.tolist() == [[1.0, 0.0, 0.0, 0.0]]


TOP_K_CASES = [
    ([0.4, 0.3, 0.2, 0.1], 2),
    ([0.3, 0.2, 0.2, 0.2, 0.1], 2),  # ties at the k-th value: all three 0.2 stay
    ([0.3, 0.2, 0.2, 0.2, 0.1], 4),
    ([0.3, 0.3, 0.2, 0.2], 1),  # tied maxima with top_k = 1
    ([0.1, 0.4, 0.2, 0.3], 1),
    ([0.1, 0.4, 0.2, 0.3], 4),  # top_k = V
    ([0.1, 0.4, 0.2, 0.3], 9),  # clamped to V
    ([0.1, 0.4, 0.2, 0.3], 0),  # clamped to 1
    ([1.0], 1),
    ([0.5, 0.0, 0.5, 0.0], 3),  # zeros (from -inf logits) are kept as zeros
]


@BOTH
@pytest.mark.parametrize("p, k", TOP_K_CASES)
def test_top_k_against_the_oracle(ops, p, k):
    assert_matches_oracle(ops.top_k_renorm_prob(_rows([p]), torch.tensor([k]))[0], oracle_top_k(p, k))


def _adjacent_floats(start, n):
    """n consecutive fp32 values from `start` upwards, one ulp apart: the threshold search must end on
    the exact bit pattern."""
    values = [torch.tensor(start, dtype=torch.float32)]
    for _ in range(n - 1):
        values.append(torch.nextafter(values[-1], torch.tensor(1.0)))
    return [v.item() for v in values]


@BOTH
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6])
def test_top_k_separates_values_one_ulp_apart(ops, k):
    p = _adjacent_floats(0.15, 6)[::-1] + [0.1]
    assert_matches_oracle(ops.top_k_renorm_prob(_rows([p]), torch.tensor([k]))[0], oracle_top_k(p, k))


@BOTH
def test_top_p_separates_values_one_ulp_apart(ops):
    p = [0.5] + _adjacent_floats(0.1, 5)[::-1]
    for top_p in (0.55, 0.65, 0.75):
        out = ops.top_p_renorm_prob(_rows([p]), torch.tensor([top_p]))[0]
        assert_matches_oracle(out, oracle_top_p(p, top_p))


# Dyadic probabilities: their fp32 sums are exact, so boundary cases mean what they say.
TOP_P_CASES = [
    ([0.4, 0.3, 0.2, 0.1], 0.5),
    ([0.5, 0.125, 0.125, 0.125, 0.125], 0.6),  # tie at the boundary: the four 0.125 share one decision
    ([0.5, 0.125, 0.125, 0.125, 0.125], 0.5),  # mass strictly above == top_p: kept
    ([0.5, 0.125, 0.125, 0.125, 0.125], 0.49),
    ([0.25, 0.5, 0.125, 0.125], 1e-6),  # tiny top_p: only the maximum
    ([0.375, 0.25, 0.375], 1e-6),  # ... or all tied maxima
    ([0.25, 0.5, 0.125, 0.125], 1.0),
    ([1.0], 0.3),
    ([0.5, 0.0, 0.25, 0.25], 0.9),
]


@BOTH
@pytest.mark.parametrize("p, top_p", TOP_P_CASES)
def test_top_p_against_the_oracle(ops, p, top_p):
    out = ops.top_p_renorm_prob(_rows([p]), torch.tensor([top_p]))[0]
    assert_matches_oracle(out, oracle_top_p(p, top_p))


@BOTH
def test_top_p_one_keeps_the_tail_when_the_total_rounds_above_one(ops):
    p = _rows([[0.6, 0.4000001, 1e-6]])
    assert p[0, :2].sum().item() > 1.0  # the mass above the tail token exceeds top_p = 1
    assert (ops.top_p_renorm_prob(p, torch.tensor([1.0])) > 0).all()


@BOTH
def test_softmax_with_temperature_against_the_oracle(ops):
    inf = float("inf")
    rows = [[0.5, -1.0, 2.0, 2.0, -inf, 0.0, 3.25], [-inf, 1.0, -inf, -inf, -inf, 1.0, 0.0], [4.0] * 7]
    temperatures = [0.7, 1.0, 1.3]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = ops.softmax_with_temperature(torch.tensor(rows, dtype=dtype), torch.tensor(temperatures))
        assert out.dtype == torch.float32
        expected = [oracle_softmax(r, t) for r, t in zip(rows, temperatures)]
        torch.testing.assert_close(out.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=1e-7)
    assert ops.softmax_with_temperature(torch.tensor([[-5.0]]), torch.tensor([0.5])).tolist() == [[1.0]]


@BOTH
def test_rows_with_minus_inf_logits_through_the_whole_pipeline(ops):
    logits = torch.tensor([[0.0, float("-inf"), 1.0, float("-inf"), 1.0, -0.5]])
    p = ops.softmax_with_temperature(logits, torch.tensor([1.0]))
    expected = oracle_top_p(oracle_top_k(oracle_softmax(logits[0].tolist(), 1.0), 3), 0.55)
    out = ops.top_p_renorm_prob(ops.top_k_renorm_prob(p, torch.tensor([3])), torch.tensor([0.55]))
    assert_matches_oracle(out[0], expected)


# ---- (b) fast against reference ------------------------------------------------------------------

TOP_P_MARGIN = 1e-5


def _top_ps_away_from_decisions(probs, generator):
    """One top_p per row such that no token's mass strictly above it (float64) lies within TOP_P_MARGIN
    of top_p: a blocked fp32 sum cannot equal torch's bit for bit, so a decision that close to the
    boundary may legitimately differ between the paths. Drawn uniformly among the gaps between
    consecutive masses that are wide enough, then uniformly inside the gap."""
    top_ps = []
    for row in probs.double():
        values, counts = torch.unique(row, return_counts=True)
        values, counts = values.flip(0), counts.flip(0).double()  # distinct values, descending
        mass_above = torch.cat([torch.zeros(1, dtype=torch.float64), (values * counts).cumsum(0)[:-1]])
        bounds = torch.cat([mass_above, torch.ones(1, dtype=torch.float64)])
        lo, hi = bounds[:-1] + TOP_P_MARGIN, bounds[1:] - TOP_P_MARGIN
        wide = (hi > lo).nonzero()[:, 0]
        gap = wide[torch.randint(len(wide), (1,), generator=generator)].item()
        u = torch.rand(1, generator=generator, dtype=torch.float64).item()
        top_ps.append(lo[gap].item() + u * (hi[gap] - lo[gap]).item())
    return torch.tensor(top_ps)


def _random_logits(N, V, dtype, generator):
    """Half the rows continuous, half on a coarse grid (many exactly tied values, in every dtype),
    with a few -inf."""
    continuous = torch.randn(N, V, generator=generator) * 2.0
    grid = torch.randint(-12, 6, (N, V), generator=generator).float() * 0.5
    logits = torch.where(torch.arange(N)[:, None] % 2 == 1, grid, continuous)
    logits = logits.masked_fill(torch.rand(N, V, generator=generator) < 0.05, float("-inf"))
    logits[:, 0] = 1.0  # no row is all -inf
    return logits.to(dtype)


def _compare_pipelines(logits, generator):
    N, V = logits.shape
    dtype = logits.dtype
    temperatures = torch.rand(N, generator=generator) + 0.5
    top_ks = torch.randint(1, V + 1, (N,), generator=generator)
    top_ks[::4] = V  # top-k off for some rows (the engine's "off")
    p_ref = reference.softmax_with_temperature(logits, temperatures)
    p_fast = fast_ops.softmax_with_temperature(logits, temperatures)
    assert_equivalent(p_ref, p_fast, "prob", dtype, "softmax_with_temperature")
    k_ref = reference.top_k_renorm_prob(p_ref, top_ks)
    k_fast = fast_ops.top_k_renorm_prob(p_fast, top_ks)
    assert_equivalent(k_ref > 0, k_fast > 0, "prob", dtype, "top_k kept set")
    assert_equivalent(k_ref, k_fast, "prob", dtype, "top_k_renorm_prob")
    top_ps = _top_ps_away_from_decisions(k_ref, generator)
    top_ps[::3] = 1.0
    out_ref = reference.top_p_renorm_prob(k_ref, top_ps)
    out_fast = fast_ops.top_p_renorm_prob(k_fast, top_ps)
    assert_equivalent(out_ref > 0, out_fast > 0, "prob", dtype, "top_p kept set")
    assert_equivalent(out_ref, out_fast, "prob", dtype, "top_p_renorm_prob")
    return (out_ref - out_fast).abs().max().item()


_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _pipeline_case(dtype, N, V, slow=False):
    return pytest.param(dtype, N, V, id=f"{_DTYPE_NAMES[dtype]}-{N}-{V}", marks=[pytest.mark.slow] if slow else [])


# the batch of 64 in one dtype in CI (each is about 25 s of interpreted kernels); the other two with -m slow
@pytest.mark.parametrize("dtype, N, V", [_pipeline_case(d, N, V) for d in _DTYPE_NAMES for N, V in ((1, 1), (1, 1500))]
                         + [_pipeline_case(torch.bfloat16, 64, 333), _pipeline_case(torch.float32, 64, 333, True),
                            _pipeline_case(torch.float16, 64, 333, True)])
def test_fast_equals_reference(dtype, N, V):
    _compare_pipelines(_random_logits(N, V, dtype, torch.Generator().manual_seed(N * 1000 + V)),
                       torch.Generator().manual_seed(V))


@pytest.mark.slow  # CI compares the two paths on the shorter rows above
def test_fast_equals_reference_on_a_long_row():
    """V > 2^17 (FlashInfer-sized vocabularies): the filters see fp32 whatever the logits' dtype."""
    V = (1 << 17) + 37
    g = torch.Generator().manual_seed(5)
    _compare_pipelines(_random_logits(2, V, torch.float32, g), g)
    for dtype in (torch.bfloat16, torch.float16):
        logits, temperatures = _random_logits(1, V, dtype, g), torch.tensor([0.8])
        assert_equivalent(reference.softmax_with_temperature(logits, temperatures),
                          fast_ops.softmax_with_temperature(logits, temperatures), "prob", dtype)


# ---- (c) no host sync; (d) signatures; (e) bad input ---------------------------------------------

@BOTH
def test_ops_and_the_engine_composition_make_no_host_sync(ops):
    logits = torch.randn(6, 50)
    params = [SamplingParams(temperature=0.8, top_k=5, top_p=0.9), SamplingParams(temperature=1.2)]
    sampling = SamplingTensors(params, 50, "cpu")
    with no_host_sync():
        p = ops.softmax_with_temperature(logits, torch.full((6,), 0.7))
        ops.top_p_renorm_prob(ops.top_k_renorm_prob(p, torch.full((6,), 4)), torch.full((6,), 0.8))
        sampling.probs(logits, ops, nodes_per_request=3)


def test_signatures_are_equal():
    for name in OPS:
        assert inspect.signature(getattr(reference, name)) == inspect.signature(getattr(fast_ops, name)), name


BAD = [
    ("softmax_with_temperature", lambda: (torch.randn(4), torch.ones(4)), ValueError, "logits"),
    ("softmax_with_temperature", lambda: (torch.randn(2, 0), torch.ones(2)), ValueError, "logits"),
    ("softmax_with_temperature", lambda: (torch.ones(2, 4, dtype=torch.int64), torch.ones(2)), TypeError, "logits"),
    ("softmax_with_temperature", lambda: (torch.randn(2, 4), torch.ones(3)), ValueError, "temperatures"),
    ("softmax_with_temperature", lambda: (torch.randn(2, 4), torch.ones(2, dtype=torch.int32)), TypeError,
     "temperatures"),
    ("softmax_with_temperature", lambda: (torch.randn(2, 4), [1.0, 1.0]), TypeError, "temperatures"),
    ("top_k_renorm_prob", lambda: (torch.rand(2, 4, dtype=torch.float16), torch.ones(2, dtype=torch.int64)),
     TypeError, "probs"),
    ("top_k_renorm_prob", lambda: (torch.rand(2, 4, 1), torch.ones(2, dtype=torch.int64)), ValueError, "probs"),
    ("top_k_renorm_prob", lambda: (torch.rand(2, 4), torch.ones(2)), TypeError, "top_ks"),
    ("top_k_renorm_prob", lambda: (torch.rand(2, 4), torch.ones(3, dtype=torch.int64)), ValueError, "top_ks"),
    ("top_p_renorm_prob", lambda: (torch.rand(2, 4), torch.ones(2, dtype=torch.int64)), TypeError, "top_ps"),
    ("top_p_renorm_prob", lambda: (torch.rand(2, 4), torch.ones(2, 1)), ValueError, "top_ps"),
    ("top_p_renorm_prob", lambda: ("probs", torch.ones(2)), TypeError, "probs"),
]


@BOTH
@pytest.mark.parametrize("name, args, error, argument", BAD)
def test_bad_input_names_the_argument(ops, name, args, error, argument):
    with pytest.raises(error, match=argument):
        getattr(ops, name)(*args())


# ---- the engine's composition ----------------------------------------------------------------------

class RecordingOps:
    """Forwards to the reference ops and records the order of the calls."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def op(*args):
            self.calls.append(name)
            return getattr(reference, name)(*args)
        return op


@pytest.mark.parametrize("params, calls", [
    ([SamplingParams(temperature=0.7)], ["softmax_with_temperature"]),
    ([SamplingParams(temperature=0.7), SamplingParams(top_k=3)], ["softmax_with_temperature"]),  # greedy's filter
    ([SamplingParams(temperature=0.7, top_k=3)], ["softmax_with_temperature", "top_k_renorm_prob"]),
    ([SamplingParams(temperature=0.7, top_p=0.5)], ["softmax_with_temperature", "top_p_renorm_prob"]),
    ([SamplingParams(temperature=1.0, top_p=0.5), SamplingParams(temperature=1.0, top_k=2)],
     ["softmax_with_temperature", "top_k_renorm_prob", "top_p_renorm_prob"]),
])
def test_engine_composes_the_ops_and_skips_filters_nobody_asked_for(params, calls):
    ops = RecordingOps()
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log().repeat(len(params), 1)
    probs = SamplingTensors(params, 4, "cpu").probs(logits, ops)
    assert ops.calls == calls
    if len(calls) == 3:  # request 0: top_p = 0.5 alone keeps two tokens; request 1: top_k = 2 keeps two
        torch.testing.assert_close(probs, torch.tensor([[4 / 7, 3 / 7, 0, 0], [4 / 7, 3 / 7, 0, 0]]))


@BOTH
def test_engine_applies_top_p_after_top_k(ops):
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log().repeat(2, 1)
    sampling = SamplingTensors([SamplingParams(temperature=1.0, top_k=2, top_p=0.5)], 4, "cpu")
    assert sampling.probs(logits, ops, nodes_per_request=2).tolist() == [[1.0, 0.0, 0.0, 0.0]] * 2
