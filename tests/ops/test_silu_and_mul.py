"""The fused MLP activation `silu_and_mul`: the reference is the models' torch arithmetic rounding point for
rounding point, the fast kernel matches the reference (fp32 within a few ulps, bf16 and fp16 within one ulp and
almost always equal), one launch, the shared argument checks, and the models' MLPs routed through an ops module
giving the numbers of the plain torch path bit for bit."""
from __future__ import annotations

import os
import types

import pytest
import torch
import torch.nn.functional as F

import fast
import fast.activation
import reference
from specdec.kv_cache import KVCache
from specdec.models import AttentionMetadata, random_eagle3_head, random_llama
from specdec.models.layers import LlamaMLP
from tests.helpers.equivalence import NO_LAUNCH, TorchCalls, cached_decode, ops_module, record_triton_launches

IMPLS = [reference, fast]
#: where the fast kernels run: compiled on a GPU, else under Triton's CPU interpreter (inputs are built on the CPU)
DEVICE = "cpu" if fast.INTERPRETED else "cuda"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
#: the integer type of each float dtype's bit pattern
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
#: fp32: both sides compute silu(g) = g / (1 + exp(-g)) with their own exp (the kernel's within about an ulp,
#: torch's Sleef, glibc or CUDA expf within one or two), each measured within 2 ulps of the correctly rounded
#: SiLU over [-80, 80]; 4 ulps is that, and far below what a wrong formula or operand gives (thousands of ulps).
#: bf16 and fp16: the fp32 difference is rounded away except when it straddles a rounding boundary of the
#: SiLU (about one element in 2^14): one ulp there, and no more than MAX_DIFFERING of the elements differ at all.
MAX_ULPS = {torch.float32: 4, torch.bfloat16: 1, torch.float16: 1}
MAX_DIFFERING = 0.01


def inputs(N, I, dtype, seed=0, scale=3.0):  # noqa: E741
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(N, 2 * I, generator=g)).to(dtype)


def ordered(t):
    """The bit patterns of a float tensor as integers in the order of the values (-0.0 and 0.0 both 0)."""
    bits = t.contiguous().view(BITS[t.dtype]).long()
    magnitude = bits & (2 ** (8 * t.element_size() - 1) - 1)
    return torch.where(bits < 0, -magnitude, magnitude)


def ulp_distance(a, b):
    """Elementwise distance in representable values between two tensors of one float dtype."""
    assert a.dtype == b.dtype and a.shape == b.shape
    return (ordered(a) - ordered(b)).abs()


def call(impl, *args):
    """`impl.silu_and_mul(*args)` with tensors on the device `impl` runs on; the output comes back to the CPU."""
    if impl is reference:
        return reference.silu_and_mul(*args)
    return fast.silu_and_mul(*(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)).cpu()


def mismatch(got, want):
    """Why `got` is not `want` within the tolerance of its dtype, or None."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{got.dtype} {tuple(got.shape)} against {want.dtype} {tuple(want.shape)}"
    if got.numel() == 0:
        return None
    distance = ulp_distance(got, want)
    if distance.max() > MAX_ULPS[got.dtype]:
        return f"{distance.max().item()} ulps apart (at most {MAX_ULPS[got.dtype]})"
    differing = (distance > 0).float().mean().item()
    if got.dtype != torch.float32 and differing > MAX_DIFFERING:
        return f"{differing:.1%} of the elements differ (at most {MAX_DIFFERING:.0%}: boundary cases only)"
    return None


def assert_fast_matches_reference(x):
    problem = mismatch(call(fast, x), reference.silu_and_mul(x))
    assert problem is None, problem


# ---- the reference ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_is_the_models_plain_mlp_activation(dtype):
    """What `LlamaMLP.forward` computes without an ops module, bit for bit, and with the reference as its ops."""
    x = inputs(5, 48, dtype)
    assert torch.equal(reference.silu_and_mul(x), F.silu(x[:, :48]) * x[:, 48:])
    cfg = types.SimpleNamespace(hidden_size=16, intermediate_size=48)
    mlp = LlamaMLP(cfg).to(dtype)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
        h = inputs(2, 8, dtype, seed=2).view(2, 1, 16)  # (B, T, hidden)
        assert torch.equal(mlp.forward(h, reference), mlp.forward(h))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_rounds_the_silu_before_the_product(dtype):
    """The rounding points the kernel emulates: the fp32 SiLU rounded to the dtype, the (exact) fp32 product
    rounded again. One rounding at the end gives other bits for many elements."""
    x = inputs(64, 256, dtype, seed=5)
    g, u = x[:, :256].float(), x[:, 256:].float()
    two_roundings = (F.silu(g).to(dtype).float() * u).to(dtype)
    assert torch.equal(reference.silu_and_mul(x), two_roundings)
    one_rounding = (F.silu(g) * u).to(dtype)
    assert (one_rounding != two_roundings).float().mean() > 0.05
    assert mismatch(one_rounding, two_roundings) is not None  # the tolerance below tells them apart


# ---- fast against the reference --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [0, 1, 7])
@pytest.mark.parametrize("I", [1, 5, 96, 1000, 1100])  # 1000, 1100: not a multiple of any block; 1100 > BLOCK_I
def test_fast_matches_the_reference(N, I, dtype):  # noqa: E741
    assert_fast_matches_reference(inputs(N, I, dtype, seed=N * I + 1))


def test_rows_wider_than_a_block_are_split_between_programs(monkeypatch):
    monkeypatch.setattr(fast.activation, "BLOCK_I", 32)
    for dtype in (torch.float32, torch.bfloat16):
        for N, I in ((1, 33), (3, 96), (2, 200)):  # noqa: E741
            assert_fast_matches_reference(inputs(N, I, dtype, seed=I))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_tolerance_catches_a_swapped_gate_and_up(dtype):
    """A kernel that read up as the gate (the bug a planted swap makes) fails the comparison above."""
    x = inputs(3, 96, dtype)
    swapped = torch.cat([x[:, 96:], x[:, :96]], dim=1)
    assert mismatch(reference.silu_and_mul(swapped), reference.silu_and_mul(x)) is not None


def test_strided_rows_and_columns():
    x = inputs(4, 64, torch.bfloat16)
    wide = torch.zeros(4, 200, dtype=torch.bfloat16)
    wide[:, 16:144] = x
    assert_fast_matches_reference(wide[:, 16:144])  # a row stride beyond 2I
    spread = torch.zeros(4, 256, dtype=torch.bfloat16)
    spread[:, ::2] = x
    assert_fast_matches_reference(spread[:, ::2])  # a column stride of 2
    assert torch.equal(call(fast, wide[:, 16:144]), call(fast, x))


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")  # numpy's, on inf
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values_equal_the_reference(dtype):
    """NaN, infinities, an exp(-g) that overflows (g < -88.72: silu = -0.0), one that is below fp32's ulp of 1
    (silu = g), zeros, subnormals: the same values as torch's, bit for bit."""
    nan, inf = float("nan"), float("inf")
    gate = [nan, inf, -inf, -100.0, -88.8, -88.7, -60.0, -20.0, 40.0, 100.0, 0.0, -0.0, 1e-40, -1e-40, 3.0, -3.0]
    up = [1.0, 2.0, 1.0, 1.0, -1.0, 1.0, 3.0, -2.0, 0.5, -1.0, -1.0, 1.0, 1.0, 1.0, inf, 0.0]
    x = torch.tensor([gate + up]).to(dtype)
    got, want = call(fast, x), reference.silu_and_mul(x)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num().view(BITS[dtype]), want.nan_to_num().view(BITS[dtype]))


@pytest.mark.parametrize("impl", IMPLS, ids=["reference", "fast"])
def test_empty_batch(impl):
    out = call(impl, inputs(0, 64, torch.bfloat16))
    assert out.shape == (0, 64) and out.dtype == torch.bfloat16


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="counts launches through Triton's interpreter; compiled kernels never enter it")
def test_fast_is_one_launch_and_nothing_beside_it(monkeypatch):

    launches = record_triton_launches(monkeypatch)
    monkeypatch.setattr(fast.activation, "BLOCK_I", 32)  # a grid of several programs is still one launch
    x = inputs(3, 100, torch.bfloat16)
    with TorchCalls() as calls:
        fast.silu_and_mul(x)
    assert launches == ["silu_and_mul_kernel"]
    assert calls.names <= NO_LAUNCH, calls.names - NO_LAUNCH


# ---- argument checks -------------------------------------------------------------------------------------------

BAD_INPUTS = {
    "1-D": lambda x: x[0],
    "3-D": lambda x: x[None],
    "odd last dimension": lambda x: x[:, :-1],
    "no columns": lambda x: x[:, :0],
    "integer": lambda x: x.long(),
    "bool": lambda x: x > 0,
    "float64": lambda x: x.double(),
    "not a tensor": lambda x: x.tolist(),
}


@pytest.mark.parametrize("impl", IMPLS, ids=["reference", "fast"])
@pytest.mark.parametrize("bad", sorted(BAD_INPUTS))
def test_bad_arguments_raise_one_line_value_errors(impl, bad):
    x = BAD_INPUTS[bad](inputs(3, 8, torch.bfloat16))
    with pytest.raises(ValueError) as caught:
        impl.silu_and_mul(x)
    assert "\n" not in str(caught.value) and "x " in str(caught.value)


# ---- the models through an ops module ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_a_model_through_the_reference_activation_is_bit_equal_to_its_plain_mlps(model_type, dtype):
    model = random_llama(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_key_value_heads=2, model_type=model_type, seed=3, dtype=dtype)
    calls = {}
    routed = cached_decode(model, ops_module(reference, calls, counted=["silu_and_mul"]))
    torch_mlps = cached_decode(model, ops_module(reference, without=["silu_and_mul"]))  # the fused norms, torch MLPs
    unfused = cached_decode(model, ops_module(reference, without=["silu_and_mul", "rms_norm", "fused_add_rms_norm"]))
    assert all(torch.equal(a, b) for a, b in zip(routed, torch_mlps))
    assert all(torch.equal(a, b) for a, b in zip(routed, unfused))
    forwards, layers = 4, 2
    assert calls["silu_and_mul"] == forwards * layers  # every layer's MLP, on the fused path


def test_a_model_through_the_fast_activation_keeps_the_references_numbers():
    """The fast kernel in a bf16 model: the hidden states and logits the reference gives, to a bf16 ulp or so."""
    model = random_llama(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_key_value_heads=2, seed=3, dtype=torch.bfloat16)
    with_fast = ops_module(reference)
    with_fast.silu_and_mul = lambda x: call(fast, x)
    for a, b in zip(cached_decode(model, with_fast, steps=1), cached_decode(model, reference, steps=1)):
        torch.testing.assert_close(a, b, rtol=2 ** -6, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_eagle3_midlayer_routes_its_mlp_through_the_ops(dtype):
    target = random_llama(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                          num_key_value_heads=2, seed=3, dtype=dtype)
    head = random_eagle3_head(target, seed=1)
    F_ = len(head.config.feature_layers)
    g = torch.Generator().manual_seed(4)
    B, T = 2, 3
    ids = torch.randint(0, 64, (B, T), generator=g)
    features = torch.randn(B, T, F_ * 32, generator=g).to(head.dtype)
    positions = torch.arange(T).expand(B, T)

    def run(ops):
        cache = KVCache.for_model(head.config, 1, B, 8, head.dtype, "cpu")
        meta = AttentionMetadata(torch.arange(B), torch.zeros(B, dtype=torch.long), attn_len=T, ops=ops)
        with torch.inference_mode():
            out = head(ids, features, positions, cache, meta)
        return out.logits, out.hidden

    calls = {}
    routed = run(ops_module(reference, calls, counted=["silu_and_mul"]))
    plain = run(ops_module(reference, without=["silu_and_mul"]))
    assert calls == {"silu_and_mul": 1}
    assert all(torch.equal(a, b) for a, b in zip(routed, plain))
