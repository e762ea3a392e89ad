"""Pure-PyTorch reference ops (never imports Triton) and the reference worker classes bound to them.

`fast` exposes the same op names with the same signatures.
"""
from .attention import apply_rope_and_write_kv, plan_tree_attention, tree_attention
from .draft import softmax_topk
from .kv import commit_kv_cache
from .logprobs import compute_spec_v2_logprobs
from .sampling import softmax_with_temperature, top_k_renorm_prob, top_p_renorm_prob
from .tree import build_tree_kernel_efficient, organize_draft_results, select_top_k_tokens
from .verify import tree_speculative_sampling_target_only, verify_tree_greedy


def __getattr__(name):
    # Worker classes bound to these ops; imported lazily because specdec imports this package.
    if name in ("EagleWorkerV2", "MultiLayerEagleWorkerV2", "TargetOnlyWorker"):
        import sys

        from specdec.workers import bind
        return bind(name, sys.modules[__name__])
    raise AttributeError(name)


__all__ = ["softmax_topk", "select_top_k_tokens", "organize_draft_results", "build_tree_kernel_efficient",
           "verify_tree_greedy", "tree_speculative_sampling_target_only", "compute_spec_v2_logprobs",
           "softmax_with_temperature", "top_k_renorm_prob", "top_p_renorm_prob", "plan_tree_attention",
           "apply_rope_and_write_kv", "tree_attention", "commit_kv_cache", "EagleWorkerV2", "MultiLayerEagleWorkerV2",
           "TargetOnlyWorker"]
