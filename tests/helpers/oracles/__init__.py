"""Independent oracles and the test inputs they judge, shared by several test modules, one family per module.

Nothing here calls the op it is the oracle of: the float64 sampling filters and the law of draws without replacement
are Python loops over floats (`distributions`; the exact law of sampled sequences is the lab's `target_law`, one for
every test); the tree oracles (node structure from token paths, the exact law of the sampling verify on the fixed
tree) follow the definitions node by node, and the tree builders draft test inputs through ``select_top_k_tokens``
+ ``organize_draft_results`` while tracking every candidate's path and score themselves (`trees`); `logprob_cases`
draws the logprob helper's random batches; `penalties` and `grammars` decode plainly with penalties applied by hand
and with masks from fresh xgrammar matchers.
"""
from .dflash import dflash_logits_from_tensors
from .dspark import dspark_block_from_tensors
from .distributions import NEG_INF, oracle_softmax, oracle_top_k, oracle_top_p, plackett_luce, softmax_filtered
from .grammars import grammar_allowed, grammar_greedy_decode, grammar_stops
from .logprob_cases import random_logprob_case
from .penalties import penalised_greedy_decode, penalised_row64
from .trees import (FAST_GRID, FIXED_DRAFT_TOKENS, FIXED_PARENT, FIXED_PARENT_LIST, FIXED_TARGET,
                    FIXED_TOP_SCORES_INDEX, FULL_GRID, DraftedTree, drafted_case, emitted_sequences,
                    exact_fixed_tree_distribution, fixed_tree, sampling_inputs, target_predict_for,
                    random_prob_rows, target_probs_for, tree_links, tree_shapes, tree_structure, valid_build_args,
                    valid_verify_inputs)

__all__ = [
    "dflash_logits_from_tensors", "dspark_block_from_tensors",
    "NEG_INF", "oracle_softmax", "oracle_top_k", "oracle_top_p", "plackett_luce", "softmax_filtered",
    "grammar_allowed", "grammar_greedy_decode", "grammar_stops", "random_logprob_case", "penalised_greedy_decode",
    "penalised_row64", "FAST_GRID",
    "FIXED_DRAFT_TOKENS", "FIXED_PARENT", "FIXED_PARENT_LIST", "FIXED_TARGET", "FIXED_TOP_SCORES_INDEX",
    "FULL_GRID", "DraftedTree", "drafted_case", "emitted_sequences", "exact_fixed_tree_distribution", "fixed_tree",
    "sampling_inputs", "target_predict_for", "target_probs_for", "tree_shapes", "tree_structure",
    "valid_build_args", "valid_verify_inputs", "tree_links", "random_prob_rows",
]
