"""The fast kernels and which of them may spill: shared by the sm_90 compile test and the triton-version check."""
from __future__ import annotations

import inspect

#: (kernel, reason) pairs allowed to spill registers to the stack.
ALLOWED_SPILLS = {"build_tree_kernel_efficient_kernel":
                  "trees of more than 64 nodes hold 128x128 node tiles; W <= 64 does not spill"}
#: A stack frame this small is a few words of local memory, not a spilled tile: triton 3.6's ptxas leaves an
#: 8-16 byte frame in a sampling kernel (measured), which costs nothing measurable. A tile that does not fit
#: in registers spills hundreds of bytes per thread (the tree build's 128x128 tiles: 520).
TOLERATED_STACK_BYTES = 32


def fast_kernels() -> set[str]:
    """The names of every public Triton kernel of `fast`, and gpu-check's read-bandwidth probe (not an op)."""
    import fast
    from specdec.gpu_check import bandwidth

    names = set()
    for module in (fast.activation, fast.argmax, fast.attention, bandwidth, fast.draft, fast.grammar, fast.kv,
                   fast.logprobs, fast.norm, fast.penalties, fast.rejection, fast.sampling, fast.traversal, fast.tree,
                   fast.verify):
        for name, _ in inspect.getmembers(module):
            if name.endswith("_kernel") and not name.startswith("_"):
                names.add(name)
    return names


def spilling_kernels(rows: list[dict]) -> set[str]:
    """The kernels of `gpu_compile_check` rows whose stack frame is larger than a tolerated few words."""
    return {r["kernel"] for r in rows if (r.get("stack_bytes") or 0) > TOLERATED_STACK_BYTES}
