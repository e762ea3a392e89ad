"""Pure-PyTorch reference of EAGLE's tree-drafting ops.

The functions mirror SGLang's ``select_top_k_tokens``, ``organize_draft_results`` and
``build_tree_kernel_efficient`` (names, argument names and tensor contracts), so a result
obtained here transfers to the serving engine. The first two are torch ops that `fast` exports too,
so they live in the leaf module `specdec.ops.draft_tree` (its docstring has the candidate index space and
the tie rule). Here the tree mask is returned over the in-flight nodes only (``[B, W, W]``), the
committed prefix being handled by the attention's causal part.

Notation: B batch, K ``topk``, S ``spec_steps`` (draft depth), W ``num_verify_tokens`` (tree size,
root included).

``build_tree_kernel_efficient`` is vectorised over the batch, loops in Python only over static
sizes and makes no host synchronisation, so it can run inside a fixed-shape decode step (and be
captured in a CUDA graph). Its per-node oracle is ``reference.naive.build_tree_naive``.
"""

from __future__ import annotations

import math

import torch

from specdec.ops.draft_tree import organize_draft_results, select_top_k_tokens
from specdec.ops.op_checks import check_build_tree_args
from specdec.ops.contract import NO_NODE, max_num_draft_tokens

__all__ = [
    "build_tree_kernel_efficient",
    "max_num_draft_tokens",
    "organize_draft_results",
    "select_top_k_tokens",
]


# --------------------------------------------------------------------------------------------
# build_tree
# --------------------------------------------------------------------------------------------


def build_tree_kernel_efficient(
    bonus_tokens: torch.Tensor,
    parent_list: torch.Tensor,
    top_scores_index: torch.Tensor,
    draft_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    spec_steps: int,
    num_verify_tokens: int,
):
    """bonus_tokens (B,), parent_list (B, 1 + K*(S-1)) (or (B, 0) when S == 1), top_scores_index
    (B, W-1), draft_tokens (B, W-1), seq_lens (B,) with K = ``topk``, S = ``spec_steps``,
    W = ``num_verify_tokens``. Returns ``(tree_mask (B, W, W) bool, positions (B*W,) int64,
    retrieve_index (B, W) int64, retrieve_next_token (B, W) int64, retrieve_next_sibling (B, W)
    int64, draft_tokens (B*W,) int64)``.

    Builds the verify tree from ``organize_draft_results``' output, as SGLang's
    ``build_tree_kernel_efficient``. Node 0 is the root (``bonus_tokens``, the last verified token,
    at position ``seq_lens``, the committed length); node ``i >= 1`` is candidate
    ``top_scores_index[:, i-1]`` with token ``draft_tokens[:, i-1]``. A node's parent is the root
    when ``c // K == 0``, else the node whose candidate index is ``parent_list[:, c // K]``.

    * ``tree_mask[b, i, j]``: node i attends node j, i.e. j is i itself or one of its ancestors
      (every row attends the root). Over the in-flight nodes only: the committed prefix is
      attended causally by every node (SGLang folds it into the same buffer).
    * ``positions[b*W + i] = seq_lens[b] + depth(i)`` (root depth 0).
    * ``retrieve_index[b, i] = b*W + i`` (flat node index).
    * ``retrieve_next_token[b, i]``: i's child with the smallest node index, or -1.
    * ``retrieve_next_sibling[b, i]``: the next child of i's parent in ascending node order, or -1.
    * ``draft_tokens``: the root token then the W-1 draft tokens, per request.

    Malformed input (a node whose parent candidate was not selected; ``organize_draft_results``
    never produces one): the node is detached, it is linked neither in ``retrieve_next_token`` nor
    in ``retrieve_next_sibling`` (verification never reaches it), and for the mask and its position
    it counts as a child of the root. SGLang's kernel prints "invalid eagle tree" in that case.

    Vectorised over the batch, Python loops only over static sizes, no host synchronisation.
    """
    B, W = check_build_tree_args(
        bonus_tokens,
        parent_list,
        top_scores_index,
        draft_tokens,
        seq_lens,
        topk,
        spec_steps,
        num_verify_tokens,
    )
    device = top_scores_index.device
    K = topk
    sel = top_scores_index.to(torch.int64)  # (B, W-1)

    # -- parent node of every non-root node ------------------------------------------------
    pc = sel // K  # position in parent_list; 0 means "child of the root"
    is_root_child = pc == 0
    padded = torch.cat(
        [torch.full((B, 1), -1, dtype=torch.int64, device=device), parent_list.to(torch.int64)], dim=1
    )  # padded[:, 0] is a sentinel that never equals a candidate index
    parent_cand = torch.gather(
        padded, 1, torch.where(is_root_child, 0, pc + 1).clamp(max=padded.shape[1] - 1)
    )
    match = sel.unsqueeze(1) == parent_cand.unsqueeze(2)  # (B, N child, N candidate parent)
    found = match.any(dim=-1)
    parent_pos = match.to(torch.int8).argmax(dim=-1) + 1  # first match, as a node index
    linked = is_root_child | found  # (B, N): the node hangs in the tree
    parent_node = torch.where(is_root_child | ~found, 0, parent_pos)  # (B, N), detached -> root

    zero_col = torch.zeros(B, 1, dtype=torch.int64, device=device)
    parent_full = torch.cat([zero_col, parent_node], dim=1)  # (B, W); the root is its own parent
    linked_full = torch.cat([torch.zeros(B, 1, dtype=torch.bool, device=device), linked], dim=1)

    # -- ancestors by pointer doubling: after k rounds anc holds ancestors within 2^k hops ------
    eye = torch.eye(W, dtype=torch.bool, device=device).unsqueeze(0).expand(B, W, W)
    anc = eye | torch.nn.functional.one_hot(parent_full, W).to(torch.bool)
    jump = parent_full
    for _ in range(max(1, math.ceil(math.log2(W)))):
        anc = anc | torch.gather(anc, 1, jump.unsqueeze(2).expand(B, W, W))
        jump = torch.gather(jump, 1, jump)
    tree_mask = anc.contiguous()
    depth = tree_mask.sum(dim=-1) - 1  # (B, W), root 0
    positions = (seq_lens.to(torch.int64).unsqueeze(1) + depth).flatten()

    # -- first child and next sibling ---------------------------------------------------------
    node = torch.arange(W, device=device)
    # child[b, p, i]: node i is a linked child of node p
    child = (parent_full.unsqueeze(1) == node.view(1, W, 1)) & linked_full.unsqueeze(1)
    has_child = child.any(dim=-1)
    first_child = child.to(torch.int8).argmax(dim=-1)
    retrieve_next_token = torch.where(has_child, first_child, NO_NODE).to(torch.int64)
    # sib[b, i, j]: j > i is a linked child of i's parent, i itself linked
    sib = (
        (parent_full.unsqueeze(2) == parent_full.unsqueeze(1))
        & linked_full.unsqueeze(1)
        & linked_full.unsqueeze(2)
        & (node.view(1, 1, W) > node.view(1, W, 1))
    )
    has_sib = sib.any(dim=-1)
    retrieve_next_sibling = torch.where(has_sib, sib.to(torch.int8).argmax(dim=-1), NO_NODE).to(torch.int64)

    retrieve_index = torch.arange(B * W, dtype=torch.int64, device=device).view(B, W)
    tokens = torch.cat([bonus_tokens.to(torch.int64).unsqueeze(1), draft_tokens.to(torch.int64)], dim=1)
    return tree_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, tokens.flatten()

