"""The ops' contract, shared by `reference`, `fast` and the workers: which ops a worker reaches through its
ops module, the plan type the attention ops pass between them, the tree arithmetic, the padding values and the
greedy rule.

A leaf module: it imports the standard library's dataclasses only, never `reference`, `fast`, the models or the
workers. The logprob helper's duck types (`logprob_types`) and its host packing (`logprob_packing`) sit
beside it; the argument checks are in `op_checks`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

#: Every op a worker reaches through its ops module (`reference` or `fast`) beside the verify rules' own (each rule's
#: record names its op: `specdec.verify_rules.rule_ops()`): a module can run the workers only when it has all of
#: them, with the reference's signatures.
WORKER_OPS = (
    "argmax_finite",
    "softmax_topk",
    "select_top_k_tokens",
    "organize_draft_results",
    "build_tree_kernel_efficient",
    "verify_tree_greedy",
    "compute_spec_v2_logprobs",
    "softmax_with_temperature",
    "top_k_renorm_prob",
    "top_p_renorm_prob",
    "plan_tree_attention",
    "apply_rope_and_write_kv",
    "tree_attention",
    "commit_kv_cache",
    "apply_penalties_tree",
    "apply_token_bitmask",
    "sample_without_replacement",
    "rms_norm",
    "fused_add_rms_norm",
    "silu_and_mul",
)

#: The index that means "no node": a padded slot of `accept_index`, a `predict` entry at a node that was
#: not accepted, the end of a `retrieve_next_token` / `retrieve_next_sibling` chain (SGLang's -1).
NO_NODE = -1

#: Value written at a padded accept slot (``accept_index == -1``) in ``next_token_logprobs``,
#: in the top-logprob values and in the token-id logprob values. A real logprob is 0.0 only
#: when a token has probability 1; the engine never emits a padded slot (it slices every
#: step's output by ``accept_lens``), so the value is only ever seen by callers that look past
#: ``accept_lens``, and it is the same whatever the other requests hold.
PADDED_LOGPROB = 0.0
#: Index written in the top-logprob indices of a padded accept slot (never a real token id).
PADDED_TOP_LOGPROB_IDX = -1


#: A temperature below this (but above 0) decodes greedily, as SGLang does: dividing logits by it would
#: overflow fp32 or round to a one-hot distribution anyway.
GREEDY_TEMPERATURE_BELOW = 1e-6


def greedy_temperature(temperature):
    """The one greedy rule: a temperature (a float, or a tensor elementwise) below `GREEDY_TEMPERATURE_BELOW`,
    or NaN, decodes greedily. Such a request's logits are divided by 1.0 where a temperature is applied at all
    (SGLang stores 1.0 for greedy requests)."""
    return ~(temperature >= GREEDY_TEMPERATURE_BELOW) if hasattr(temperature, "dtype") else \
        not temperature >= GREEDY_TEMPERATURE_BELOW


def max_num_draft_tokens(topk: int, spec_steps: int) -> int:
    """``(topk, spec_steps) -> int``: the largest tree size W = 1 + K + (S-1)K^2 (root included)."""
    return 1 + topk + (spec_steps - 1) * topk * topk


@dataclass(frozen=True)
class TreeAttentionPlan:
    """What every layer of one forward shares: built once by an ops module's `plan_tree_attention`, read
    by the same module's `apply_rope_and_write_kv` and `tree_attention` (FlashInfer's plan / run split).

    impl: the building module's name (a plan is read only by the ops that built it); batch, num_new,
    write_offset, attn_len, max_seq_len: the call it was built for; tensors: the module's precomputed
    masks and indices (and what its ops derive once per forward, as the reference RoPE's factors)."""

    impl: str
    batch: int
    num_new: int
    write_offset: int
    attn_len: int
    max_seq_len: int
    tensors: dict
    #: op name -> (the arguments its checks passed with this plan, what they returned): each layer of a
    #: forward passes arguments of the same shapes, so the checks run once per forward
    #: (`op_checks.check_rope_kv_call`, `op_checks.check_attention_call`)
    checked: dict = field(default_factory=dict, compare=False, repr=False)


#: the step shape (num_steps, topk, num_draft_tokens) of a step that drafts nothing: the root alone is verified (a
#: one-token target forward), and the draft's extend still reads the emitted token (adaptive speculation's fallback;
#: the acceptance CSVs' target-only rows carry the same numbers)
NO_DRAFT = (0, 0, 1)
