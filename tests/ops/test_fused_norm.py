"""The RMSNorm ops (`rms_norm`, `fused_add_rms_norm`): the reference against a float64 computation, the fast
kernel against the reference (bit-equal sums, norms within one ulp of the dtype), their argument checks, and
the models' norms routed through an ops module giving the numbers of the plain torch path bit for bit."""
from __future__ import annotations

import pytest
import torch

import fast
import fast.norm
import reference
from specdec.models import random_llama
from specdec.models.layers import RMSNorm
from tests.helpers.equivalence import cached_decode, ops_module

IMPLS = [reference, fast]
#: where the fast kernels run: compiled on a GPU, else under Triton's CPU interpreter (inputs are built on the CPU)
DEVICE = "cpu" if fast.INTERPRETED else "cuda"
SHAPES = [(N, H) for N in (1, 3, 7) for H in (64, 96, 576, 2048)]
DTYPES = [torch.float32, torch.bfloat16]
#: the integer type of each float dtype's bit pattern: ulp distances are differences of the patterns
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def inputs(N, H, dtype, with_residual, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(N, H, generator=g)).to(dtype)
    residual = torch.randn(N, H, generator=g).to(dtype) if with_residual else None
    weight = (1 + 0.1 * torch.randn(H, generator=g)).to(dtype)
    return x, residual, weight


def ulp_distance(a, b):
    """Elementwise distance in representable values between two same-signed float tensors of one dtype."""
    assert a.dtype == b.dtype
    bits = BITS[a.dtype]
    return (a.contiguous().view(bits).long() - b.contiguous().view(bits).long()).abs()


def call(impl, name, *args):
    """`impl.name(*args)` with tensors on the device `impl` runs on; tensor outputs come back to the CPU."""
    if impl is reference:
        return getattr(reference, name)(*args)
    out = getattr(fast, name)(*(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args))
    return tuple(t.cpu() for t in out) if isinstance(out, tuple) else out.cpu()


def float64_norm(summed, weight, eps):
    s = summed.double()
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


# ---- the reference against float64 ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("N, H", [(1, 64), (3, 96), (7, 2048)])
def test_reference_equals_a_float64_computation(N, H, dtype, with_residual):
    x, residual, weight = inputs(N, H, dtype, with_residual)
    normed, summed = reference.fused_add_rms_norm(x, residual, weight, 1e-6)
    want_sum = x if residual is None else (x.double() + residual.double()).to(dtype)
    assert torch.equal(summed, want_sum)
    want = float64_norm(want_sum, weight, 1e-6)
    # fp32: a few fp32 roundings of the sum, the rsqrt and two products; bf16: that, then one rounding to bf16
    # (half an ulp: up to 2^-8 of the value, relatively, with 8 significant bits)
    rtol = 2e-6 if dtype == torch.float32 else 2 ** -8 + 2e-6
    assert ((normed.double() - want).abs() <= rtol * want.abs()).all()
    assert torch.equal(reference.rms_norm(summed, weight, 1e-6), normed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_is_the_models_plain_rmsnorm(dtype):
    """What `RMSNorm.forward` computes without an ops module, bit for bit (its rounding points)."""
    x, residual, weight = inputs(5, 96, dtype, True)
    norm = RMSNorm(96, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    assert torch.equal(reference.rms_norm(x, weight, 1e-5), norm.forward(x))
    assert torch.equal(reference.fused_add_rms_norm(x, residual, weight, 1e-5)[0], norm.forward(x + residual))


# ---- fast against the reference ------------------------------------------------------------------------------

def assert_fast_matches_reference(x, residual, weight, eps):
    ref_normed, ref_summed = reference.fused_add_rms_norm(x, residual, weight, eps)
    normed, summed = call(fast, "fused_add_rms_norm", x, residual, weight, eps)
    assert normed.dtype == summed.dtype == x.dtype and normed.shape == summed.shape == x.shape
    # the add is torch's add in x's dtype, bit for bit
    assert torch.equal(summed, x if residual is None else x + residual)
    assert torch.equal(summed, ref_summed)
    # only the fp32 sum of squares is ordered differently: bf16 rounds that away except at a rounding
    # boundary (one ulp); fp32 keeps a few ulps of it
    distance = ulp_distance(normed, ref_normed)
    assert distance.max() <= (1 if x.dtype == torch.bfloat16 else 4), distance.max()
    if x.dtype == torch.bfloat16:
        assert (distance > 0).float().mean() <= 0.01  # boundary cases, not a systematic shift
    assert torch.equal(call(fast, "rms_norm", summed, weight, eps), normed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("N, H", SHAPES)
def test_fast_matches_the_reference(N, H, dtype, with_residual):
    assert_fast_matches_reference(*inputs(N, H, dtype, with_residual, seed=N * H), eps=1e-6)


@pytest.mark.parametrize("eps", [0.0, 1e-5, 0.5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_matches_the_reference_for_each_eps(eps, dtype):
    x, residual, weight = inputs(3, 96, dtype, True)
    assert_fast_matches_reference(x * 1e-3, residual * 1e-3, weight, eps)  # small rows: eps matters


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_wider_than_a_block_are_walked_in_blocks(dtype, monkeypatch):
    monkeypatch.setattr(fast.norm, "MAX_BLOCK_H", 32)
    for N, H in ((1, 33), (3, 96), (2, 576)):
        for with_residual in (False, True):
            assert_fast_matches_reference(*inputs(N, H, dtype, with_residual, seed=H), eps=1e-6)


def test_strided_rows_and_a_weight_of_another_dtype():
    x, residual, weight = inputs(4, 64, torch.bfloat16, True)
    wide = torch.zeros(4, 160, dtype=torch.bfloat16)
    wide[:, 16:80] = x
    assert_fast_matches_reference(wide[:, 16:80], residual, weight, 1e-6)
    assert_fast_matches_reference(x, residual, weight.float(), 1e-6)  # the reference upcasts the weight


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")  # numpy's, on inf
@pytest.mark.parametrize("impl", IMPLS, ids=["reference", "fast"])
def test_the_bf16_sum_rounds_to_nearest_even_as_torch(impl):
    """Sums at and around a bf16 rounding boundary, subnormals and overflow: a truncating cast, or a rounding
    that breaks ties away from zero, gives a different bit pattern than torch's add for some of them."""
    one_odd = 1 + 2 ** -7  # an odd mantissa: its tie rounds up to even
    x = torch.tensor([[1.0, one_odd, 1.0, -one_odd, 1e-40, 3e38, 256.0, -1.0]], dtype=torch.bfloat16)
    r = torch.tensor([[2 ** -8, 2 ** -8, 3 * 2 ** -9, -2 ** -8, 2e-40, 3e38, 1.0, 2 ** -9]], dtype=torch.bfloat16)
    _, summed = call(impl, "fused_add_rms_norm", x, r, torch.ones(8, dtype=torch.bfloat16), 1e-6)
    want = x + r
    assert want[0, 1] == 1 + 2 ** -6 and want[0, 2] == one_odd  # the test's premise: ties to even, then up
    assert torch.equal(summed.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("impl", IMPLS, ids=["reference", "fast"])
def test_empty_batch_and_a_missing_residual(impl):
    x, _, weight = inputs(0, 64, torch.bfloat16, False)
    normed, summed = call(impl, "fused_add_rms_norm", x, None, weight, 1e-6)
    assert normed.shape == summed.shape == (0, 64)
    device = "cpu" if impl is reference else DEVICE
    x, _, weight = inputs(2, 64, torch.bfloat16, False)
    x, weight = x.to(device), weight.to(device)
    assert impl.fused_add_rms_norm(x, None, weight, 1e-6)[1] is x


# ---- argument checks -----------------------------------------------------------------------------------------

BAD_CALLS = {
    "x 1-D": lambda x, r, w: (x[0], None, w, 1e-6),
    "x integer": lambda x, r, w: (x.long(), None, w, 1e-6),
    "x no columns": lambda x, r, w: (x[:, :0], None, w[:0], 1e-6),
    "residual shape": lambda x, r, w: (x, r[:, :-1], w, 1e-6),
    "residual rows": lambda x, r, w: (x, r[:1], w, 1e-6),
    "residual dtype": lambda x, r, w: (x, r.float(), w, 1e-6),
    "residual integer": lambda x, r, w: (x, r.int(), w, 1e-6),
    "weight length": lambda x, r, w: (x, r, w[:-1], 1e-6),
    "weight 2-D": lambda x, r, w: (x, r, w[None], 1e-6),
    "weight integer": lambda x, r, w: (x, r, w.long(), 1e-6),
    "eps negative": lambda x, r, w: (x, r, w, -1e-6),
    "eps a string": lambda x, r, w: (x, r, w, "1e-6"),
}


@pytest.mark.parametrize("impl", IMPLS, ids=["reference", "fast"])
@pytest.mark.parametrize("bad", sorted(BAD_CALLS))
def test_bad_arguments_raise_one_line_value_errors(impl, bad):
    x, residual, weight = inputs(3, 16, torch.bfloat16, True)
    args = BAD_CALLS[bad](x, residual, weight)
    with pytest.raises(ValueError) as caught:
        call(impl, "fused_add_rms_norm", *args)
    assert "\n" not in str(caught.value)
    if args[1] is None:
        with pytest.raises(ValueError):
            call(impl, "rms_norm", args[0], args[2], args[3])


# ---- the models through an ops module ------------------------------------------------------------------------

NORMS = ("rms_norm", "fused_add_rms_norm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_a_model_through_the_reference_norm_ops_is_bit_equal_to_its_plain_norms(model_type, dtype):
    model = random_llama(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_key_value_heads=2,
                         model_type=model_type, seed=3, dtype=dtype)
    calls = {}
    fused = cached_decode(model, ops_module(reference, calls, counted=NORMS))
    plain = cached_decode(model, ops_module(reference, without=NORMS))
    assert all(torch.equal(a, b) for a, b in zip(fused, plain))
    forwards, layers = 4, 2
    # the residual stream carried between layers: every post-attention norm, every later layer's input norm and the
    # final norm add the sum they read in their own kernel; only the first layer's input norm (and Qwen3's q and k
    # norms) are plain
    assert calls["fused_add_rms_norm"] == forwards * 2 * layers
    assert calls["rms_norm"] == forwards * (1 + (2 * layers if model_type == "qwen3" else 0))
