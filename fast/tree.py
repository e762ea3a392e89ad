"""Triton version of EAGLE's tree-building op, with the reference's names, signatures and contracts.

``build_tree_kernel_efficient`` is one kernel launch with one program per request; it writes every
output itself (no fill or arange launches beside it) and reads nothing back to the host.
``select_top_k_tokens`` and ``organize_draft_results`` are the torch ops of `specdec.ops.draft_tree`, shared
with `reference`: O(B*K^2) sorts of a few hundred elements, one small launch each, and the decode step is
replayed as a CUDA graph, where launch overhead vanishes.

Notation as in ``reference.tree``: B batch, K ``topk``, S ``spec_steps``, W ``num_verify_tokens``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from specdec.ops.draft_tree import organize_draft_results, select_top_k_tokens
from specdec.ops.op_checks import check_build_tree_args
from specdec.ops.contract import max_num_draft_tokens

__all__ = [
    "build_tree_kernel_efficient",
    "max_num_draft_tokens",
    "organize_draft_results",
    "select_top_k_tokens",
]


@triton.jit
def build_tree_kernel_efficient_kernel(
    bonus_tokens_ptr,
    parent_list_ptr,
    top_scores_index_ptr,
    draft_tokens_ptr,
    seq_lens_ptr,
    tree_mask_ptr,
    positions_ptr,
    retrieve_index_ptr,
    retrieve_next_token_ptr,
    retrieve_next_sibling_ptr,
    tokens_ptr,
    K,
    P,
    W,
    BLOCK_W: tl.constexpr,
    DOUBLING_ROUNDS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    node = tl.arange(0, BLOCK_W)
    in_tree = node < W
    is_draft = (node >= 1) & in_tree

    sel = tl.load(top_scores_index_ptr + b * (W - 1) + node - 1, mask=is_draft, other=-1).to(tl.int64)
    pc = sel // K
    is_root_child = pc == 0
    # index into [sentinel -1, parent_list...], clamped like the reference's gather
    padded_index = tl.minimum(tl.maximum(tl.where(is_root_child, 0, pc + 1), 0), P)
    parent_cand = tl.load(
        parent_list_ptr + b * P + padded_index - 1, mask=is_draft & (padded_index >= 1), other=-1
    ).to(tl.int64)

    # parent node = the first draft node whose candidate index is the parent candidate
    match = (sel[None, :] == parent_cand[:, None]) & is_draft[None, :]
    first_match = tl.min(tl.where(match, node[None, :], BLOCK_W), axis=1)
    found = first_match < BLOCK_W
    linked = is_draft & (is_root_child | found)
    parent = tl.where(is_draft & ~is_root_child & found, first_match, 0)  # detached -> root

    # Ancestors by pointer doubling, as the reference: after r rounds anc holds every ancestor within
    # 2^r hops. Row gathers anc[jump[i], :] are a one-hot matrix product, exact for 0/1 values in fp16.
    anc = (node[:, None] == node[None, :]) | (parent[:, None] == node[None, :])
    jump = parent
    for _ in tl.static_range(DOUBLING_ROUNDS):
        jump_onehot = (jump[:, None] == node[None, :]).to(tl.float16)
        gathered = tl.dot(jump_onehot, anc.to(tl.float16), out_dtype=tl.float32)
        anc = anc | (gathered > 0.5)
        jump = tl.sum(tl.where(jump[:, None] == node[None, :], jump[None, :], 0), axis=1)

    in_square = in_tree[:, None] & in_tree[None, :]
    # int64 request base, int32 offsets inside the request: a W x W int64 tile would cost registers
    request_mask_ptr = tree_mask_ptr + b * W * W
    tl.store(request_mask_ptr + node[:, None] * W + node[None, :], anc.to(tl.uint8), mask=in_square)

    depth = (tl.sum(anc.to(tl.int32), axis=1) - 1).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int64)
    tl.store(positions_ptr + b * W + node, seq_len + depth, mask=in_tree)
    tl.store(retrieve_index_ptr + b * W + node, b * W + node, mask=in_tree)

    # child[p, i]: node i is a linked child of node p; the first child is the smallest index
    child = (parent[None, :] == node[:, None]) & linked[None, :]
    first_child = tl.min(tl.where(child, node[None, :], BLOCK_W), axis=1)
    tl.store(
        retrieve_next_token_ptr + b * W + node,
        tl.where(first_child < BLOCK_W, first_child, -1).to(tl.int64),
        mask=in_tree,
    )
    # sibling[i, j]: j > i shares i's parent, both linked
    sibling = (
        (parent[None, :] == parent[:, None])
        & linked[None, :]
        & linked[:, None]
        & (node[None, :] > node[:, None])
    )
    next_sibling = tl.min(tl.where(sibling, node[None, :], BLOCK_W), axis=1)
    tl.store(
        retrieve_next_sibling_ptr + b * W + node,
        tl.where(next_sibling < BLOCK_W, next_sibling, -1).to(tl.int64),
        mask=in_tree,
    )

    bonus = tl.load(bonus_tokens_ptr + b).to(tl.int64)
    draft = tl.load(draft_tokens_ptr + b * (W - 1) + node - 1, mask=is_draft, other=0).to(tl.int64)
    tl.store(tokens_ptr + b * W + node, tl.where(node == 0, bonus, draft), mask=in_tree)


def _launch_build_tree(bonus_tokens, parent_list, top_scores_index, draft_tokens, seq_lens, K, B, W):
    device = top_scores_index.device
    tree_mask = torch.empty(B, W, W, dtype=torch.bool, device=device)
    positions = torch.empty(B * W, dtype=torch.int64, device=device)
    retrieve_index = torch.empty(B, W, dtype=torch.int64, device=device)
    retrieve_next_token = torch.empty(B, W, dtype=torch.int64, device=device)
    retrieve_next_sibling = torch.empty(B, W, dtype=torch.int64, device=device)
    tokens = torch.empty(B * W, dtype=torch.int64, device=device)
    if B > 0:
        P = parent_list.shape[1]
        # tl.dot needs every dimension >= 16
        w_block = max(16, triton.next_power_of_2(W))
        build_tree_kernel_efficient_kernel[(B,)](
            bonus_tokens.contiguous(),
            parent_list.contiguous(),
            top_scores_index.contiguous(),
            draft_tokens.contiguous(),
            seq_lens.contiguous(),
            tree_mask.view(torch.uint8),
            positions,
            retrieve_index,
            retrieve_next_token,
            retrieve_next_sibling,
            tokens,
            K,
            P,
            W,
            BLOCK_W=w_block,
            DOUBLING_ROUNDS=max(1, math.ceil(math.log2(W))),
            num_warps=4 if w_block <= 32 else 8,  # W x W tiles in registers: no spills up to W = 64
        )
    return tree_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, tokens


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

    Same semantics as ``reference.tree.build_tree_kernel_efficient``, malformed input included (a
    node whose parent candidate was not selected is detached: linked neither in
    ``retrieve_next_token`` nor in ``retrieve_next_sibling``, and a child of the root for its mask
    row and position).

    One launch, one program per request. The program holds the request's W nodes as vectors of
    ``BLOCK_W = max(16, next_power_of_two(W))`` lanes: the parent of each node is the first node
    whose candidate index equals its parent candidate (a W x W comparison), the mask rows come from
    ceil(log2 W) pointer-doubling rounds (each a one-hot W x W matrix product, exact for 0/1 values),
    the depth is the row's popcount, and first-child / next-sibling links are W x W minima. Integer
    inputs of any integer dtype are read as they are (non-contiguous ones are made contiguous); no
    value is read on the host. Candidate indices are compared as int64 and assumed >= 0 (for a
    negative one, Triton's ``//`` truncates where torch's floors).
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
    return _launch_build_tree(bonus_tokens, parent_list, top_scores_index, draft_tokens, seq_lens, topk, B, W)
