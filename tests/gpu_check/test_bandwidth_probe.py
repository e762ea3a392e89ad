"""The read-bandwidth probe of `specdec gpu-check` (`specdec.gpu_check.bandwidth.read_sum`): one fp32 partial sum
per program, each the sum of its chunk of the buffer, so that together they are the buffer's sum; under Triton's
interpreter on a CPU (CI), compiled on a GPU."""
from __future__ import annotations

import pytest
import torch

from specdec.gpu_check.bandwidth import BLOCK, ITERS, SHAPES, read_sum, read_sum_programs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CHUNK = BLOCK * ITERS


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [1, BLOCK - 3, CHUNK, 2 * CHUNK + BLOCK + 7])
def test_partial_sums_equal_torch_sums_of_their_chunks(n, dtype):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype).to(DEVICE)
    partial = read_sum(x)
    assert partial.shape == (read_sum_programs(n),) and partial.dtype == torch.float32
    want = torch.stack([c.double().sum() for c in x.split(CHUNK)])
    # fp32 sums of up to 64K terms of |x| < 5: a few ulps of the running sum's magnitude
    torch.testing.assert_close(partial.double(), want, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(partial.double().sum(), x.double().sum(), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("block, iters, warps", SHAPES[1:])
def test_every_launch_shape_of_the_ceiling_sums_its_chunks(block, iters, warps):
    n = 2 * block * iters + 5
    x = torch.randn(n, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    partial = read_sum(x, None, block, iters, warps)
    assert partial.shape == (read_sum_programs(n, block, iters),) == (3,)
    torch.testing.assert_close(partial.double(), torch.stack([c.double().sum() for c in x.split(block * iters)]),
                               rtol=1e-5, atol=1e-3)


def test_a_buffer_of_ones_sums_exactly_and_out_is_reused():
    n = 3 * CHUNK - 1
    x = torch.ones(n, dtype=torch.bfloat16, device=DEVICE)
    out = torch.full((read_sum_programs(n),), float("nan"), device=DEVICE)
    assert read_sum(x, out) is out
    assert out.tolist() == [CHUNK, CHUNK, CHUNK - 1] and out.double().sum().item() == n


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="floating-point"):
        read_sum(torch.ones(8, dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        read_sum(torch.ones(8, 8).t())
    with pytest.raises(ValueError, match=r"out must be \(1,\) float32"):
        read_sum(torch.ones(8), torch.empty(2))
    with pytest.raises(ValueError, match="power of two"):
        read_sum(torch.ones(8), None, 3000)
