"""Triton versions of the `reference` ops, with the same names and signatures.

Not built yet: the fast path (fused logprobs, bit-mask tree attention, verify and tree kernels,
with equivalence tests against `reference` under TRITON_INTERPRET=1) is its own issue.
`Engine(impl="fast")` says so with a ValueError; `impl="auto"` falls back to `reference`.
"""
