"""Triton versions of the `reference` ops, with the same names, signatures and docstring contracts.

`fast` exports an op only once its kernel exists; `specdec.op_checks.WORKER_OPS` lists what the
workers need, and `Engine(impl="fast")` names whatever is still missing. Argument checks are the
shared ones of `specdec.op_checks` and run before any kernel launches. On a machine without CUDA the
kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is imported).
"""
from .attention import apply_rope_and_write_kv, tree_attention
from .draft import softmax_topk
from .kv import commit_kv_cache
from .logprobs import compute_spec_v2_logprobs
from .sampling import softmax_with_temperature, top_k_renorm_prob, top_p_renorm_prob

__all__ = ["softmax_topk", "compute_spec_v2_logprobs", "softmax_with_temperature", "top_k_renorm_prob",
           "top_p_renorm_prob", "apply_rope_and_write_kv", "tree_attention", "commit_kv_cache"]
