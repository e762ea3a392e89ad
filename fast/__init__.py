"""Triton versions of the `reference` ops, with the same names, signatures and docstring contracts.

`fast` exports every op of `specdec.ops.contract.WORKER_OPS` and every verify rule's named op
(`specdec.verify_rules.rule_ops`), the ops the workers call. Argument checks are the shared ones of
`specdec.ops.op_checks` and run before any kernel launches. On a machine without CUDA the
kernels run under Triton's interpreter: importing `fast` there sets ``TRITON_INTERPRET=1`` unless the
variable is already set (Triton reads it when the kernels below are defined), also when something
imported triton first (see `fast.interpreter`); exact, but slow.
"""
# first: the interpreter is set up before the kernels below are defined (and their mode fixed)
from .interpreter import INTERPRETED as INTERPRETED
from .activation import silu_and_mul
from .argmax import argmax_finite
from .attention import apply_rope_and_write_kv, plan_tree_attention, tree_attention
from .draft import softmax_topk
from .grammar import apply_token_bitmask
from .kv import commit_kv_cache
from .logprobs import compute_spec_v2_logprobs
from .norm import fused_add_rms_norm, rms_norm
from .penalties import apply_penalties_tree
from .rejection import chain_speculative_sampling_block, sample_without_replacement, tree_speculative_sampling_rejection
from .sampling import softmax_with_temperature, top_k_renorm_prob, top_p_renorm_prob
from .traversal import tree_speculative_sampling_traversal
from .tree import build_tree_kernel_efficient, organize_draft_results, select_top_k_tokens
from .verify import tree_speculative_sampling_target_only, verify_tree_greedy


__all__ = ["argmax_finite", "softmax_topk", "select_top_k_tokens", "organize_draft_results",
           "build_tree_kernel_efficient", "verify_tree_greedy", "tree_speculative_sampling_target_only",
           "compute_spec_v2_logprobs", "softmax_with_temperature", "top_k_renorm_prob", "top_p_renorm_prob",
           "plan_tree_attention", "apply_rope_and_write_kv", "tree_attention", "commit_kv_cache",
           "apply_penalties_tree", "apply_token_bitmask", "sample_without_replacement",
           "tree_speculative_sampling_rejection", "chain_speculative_sampling_block",
           "tree_speculative_sampling_traversal", "rms_norm", "fused_add_rms_norm", "silu_and_mul"]
