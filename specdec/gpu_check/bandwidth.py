"""A read-bandwidth probe for `specdec gpu-check`, not an op of the decode step: one launch that reads a buffer once
and writes one fp32 partial sum per program.

A decode step mostly reads (weights, the KV cache) and writes little, so its ceiling is a read's bandwidth, not a
copy's (a copy's writes share the memory bus with its reads). Each program sums `block * iters` consecutive
elements in fp32 and stores that one value, so a launch over n elements writes n / (block * iters) floats: about
32 KiB per GiB of bf16 read. The partial sums add up to the buffer's sum, which is what keeps the loads from being
optimised away and what the tests check. How many bytes each thread keeps in flight decides whether a launch
saturates the memory system, and that is the device's business: `SHAPES` are the launch shapes a ceiling is the
best of.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["read_sum", "read_sum_programs", "SHAPES"]

#: Elements one program loads per iteration (8 warps: 16 bf16 a thread, two 16-byte loads).
BLOCK = 4096
#: Iterations per program: 64K elements (128 KiB of bf16) a program, so a 2 GiB buffer is 16K programs.
ITERS = 16
#: (block, iters, num_warps) launch shapes, 64K elements a program each: 16 or 32 bf16 a thread per iteration.
SHAPES = ((BLOCK, ITERS, 8), (8192, 8, 8), (8192, 8, 16))


@triton.jit
def read_sum_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * (BLOCK * ITERS)  # int64: a buffer of 2^31 elements or more stays addressable
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ITERS):
        idx = base + i * BLOCK + offs
        acc += tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
    tl.store(partial_ptr + pid, tl.sum(acc, axis=0))


def read_sum_programs(n: int, block: int = BLOCK, iters: int = ITERS) -> int:
    """Programs (and partial sums) of a `read_sum` over n elements."""
    return max(1, triton.cdiv(n, block * iters))


def read_sum(x: torch.Tensor, out: torch.Tensor | None = None, block: int = BLOCK, iters: int = ITERS,
             num_warps: int = 8) -> torch.Tensor:
    """x: a contiguous floating-point tensor (any shape) -> (read_sum_programs(x.numel(), block, iters),) fp32
    partial sums, program p's the sum of elements [p * block * iters, (p + 1) * block * iters) in fp32, so that
    together they are x's sum. out: that tensor, preallocated (the probe's timed launches allocate nothing).
    block: a power of two; block, iters, num_warps: the launch shape (`SHAPES`)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"read_sum: x must be a floating-point tensor, got {type(x).__name__} "
                         f"{getattr(x, 'dtype', '')}")
    if not x.is_contiguous():
        raise ValueError("read_sum: x must be contiguous (the probe reads it in one pass)")
    if block < 16 or block & (block - 1) or iters < 1:
        raise ValueError(f"read_sum: block must be a power of two >= 16 and iters >= 1, got {block}, {iters}")
    n = x.numel()
    programs = read_sum_programs(n, block, iters)
    if out is None:
        out = torch.empty(programs, dtype=torch.float32, device=x.device)
    elif out.shape != (programs,) or out.dtype != torch.float32 or out.device != x.device:
        raise ValueError(f"read_sum: out must be ({programs},) float32 on {x.device}, got {tuple(out.shape)} "
                         f"{out.dtype} on {out.device}")
    read_sum_kernel[(programs,)](x.reshape(-1), out, n, BLOCK=block, ITERS=iters, num_warps=num_warps)
    return out
