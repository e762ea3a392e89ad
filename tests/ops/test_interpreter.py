"""The interpreter speed-ups of `fast.interpreter`: a kernel that calls device functions computes what it should,
triton's language is itself again after each launch, and the next launch patches it afresh."""
from __future__ import annotations

import pytest
import torch

import fast

pytestmark = pytest.mark.skipif(not fast.INTERPRETED, reason="the wraps are of Triton's CPU interpreter")

triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def _square(x):
    return x * x


@triton.jit
def _sum_of_squares(x):
    return tl.sum(_square(x), axis=0)


@triton.jit
def _kernel(x_ptr, out_ptr, N: tl.constexpr):
    offsets = tl.arange(0, N)
    x = tl.load(x_ptr + offsets)
    tl.store(out_ptr + offsets, x + _sum_of_squares(x))


def test_nested_device_functions_compute_and_the_language_is_restored_after_each_launch():
    from triton.runtime import interpreter
    assert interpreter._patch_lang._once_per_launch and interpreter._get_np_dtype._memoized
    before = {name: getattr(tl, name) for name in ("sum", "load", "store", "arange", "maximum")}
    tensor_add = tl.core.tensor.__add__
    for values in ([1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]):  # the second launch patches afresh
        x = torch.tensor(values)
        out = torch.empty_like(x)
        _kernel[(1,)](x, out, N=4)
        assert torch.equal(out, x + (x * x).sum())
        assert {name: getattr(tl, name) for name in before} == before and tl.core.tensor.__add__ is tensor_add
