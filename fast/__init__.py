"""Triton versions of the `reference` ops, with the same names, signatures and docstring contracts.

`fast` exports an op only once its kernel exists; `specdec.op_checks.WORKER_OPS` lists what the
workers need, and `Engine(impl="fast")` names whatever is still missing. Argument checks are the
shared ones of `specdec.op_checks` and run before any kernel launches. On a machine without CUDA the
kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is imported).
"""
from .kv import commit_kv_cache

__all__ = ["commit_kv_cache"]
