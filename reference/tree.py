"""Pure-PyTorch reference of EAGLE's tree-drafting ops.

The functions mirror SGLang's ``select_top_k_tokens``, ``organize_draft_results`` and
``build_tree_kernel_efficient`` (names, argument names and tensor contracts), so a result
obtained here transfers to the serving engine. Two deliberate improvements over SGLang are
documented where they apply: score ties are broken towards the lower candidate index (which makes
an "invalid eagle tree" impossible), and the tree mask is returned over the in-flight nodes only
(``[B, W, W]``), the committed prefix being handled by the attention's causal part.

Notation: B batch, K ``topk``, S ``spec_steps`` (draft depth), W ``num_verify_tokens`` (tree size,
root included), H hidden size.

Candidate index space (shared by ``organize_draft_results`` and ``build_tree_*``): draft step 0
contributes candidates ``0 .. K-1`` (the root's children); step ``i >= 1`` contributes the ``K*K``
candidates ``K + (i-1)*K*K + f*K + m`` (child ``m`` of the step's frontier node ``f``). The parent
of candidate ``c`` is the root when ``c // K == 0``, else the candidate ``parent_list[c // K]``.

``build_tree_kernel_efficient`` is vectorised over the batch, loops in Python only over static
sizes and makes no host synchronisation, so it can run inside a fixed-shape decode step (and be
captured in a CUDA graph). ``build_tree_naive`` is the same computation written as a per-request,
per-node loop, for tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from specdec.op_checks import (check_build_tree_args, check_float_dtype, check_int, check_integer_dtype, check_shape,
                               check_tensor, check_tree_size, max_num_draft_tokens)

__all__ = [
    "build_tree_kernel_efficient",
    "build_tree_naive",
    "max_num_draft_tokens",
    "organize_draft_results",
    "select_top_k_tokens",
]


# --------------------------------------------------------------------------------------------
# validation helpers (shapes and python ints only: nothing here reads tensor values)
# --------------------------------------------------------------------------------------------


def _stable_topk_desc(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest values along the last dim, ties broken towards the lower index.

    ``torch.topk`` leaves the order of equal values unspecified (and it differs between devices);
    a stable descending sort makes the choice deterministic and identical everywhere.
    """
    values, index = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], index[..., :k]


# --------------------------------------------------------------------------------------------
# select_top_k_tokens
# --------------------------------------------------------------------------------------------


def select_top_k_tokens(
    i: int,
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    hidden_states: torch.Tensor,
    scores: torch.Tensor | None,
    topk: int,
):
    """i == 0: topk_p (B, K), topk_index (B, K), hidden_states (B, H), scores ignored (may be None).
    i > 0:  topk_p (B*K, K), topk_index (B*K, K), hidden_states (B*K, H), scores (B, K).
    Returns ``(input_ids (B*K,), hidden_states (B*K, H), scores (B, K), tree_info)``.

    One EAGLE draft expansion step, as SGLang's ``select_top_k_tokens``.

    * Step 0: the root's K children from the draft. ``input_ids = topk_index.flatten()``, every
      request's hidden state is repeated K times, ``scores = topk_p`` and
      ``tree_info = (topk_p[:, None, :] (B,1,K), topk_index (B,K), parents (B,K+1) int64)`` with
      ``parents[b] = [-1, 0, 1, ..., K-1]``.
    * Step i > 0: ``topk_p``/``topk_index`` hold the K children of each of the K frontier nodes and
      ``hidden_states`` the draft output of each frontier node. The path score of child m of
      frontier node f is ``scores[b, f] * topk_p[b*K + f, m]``; the K best of the K*K candidates
      become the new frontier (``scores``), their tokens the next ``input_ids`` and each new
      frontier node takes its parent's hidden state (row ``b*K + cs // K``).
      ``tree_info = (expand_scores (B,K,K), topk_index.reshape(B, K*K), parents (B,K) int64)`` where
      ``parents = cs + K*K*(i-1) + K`` are the new frontier's candidate indices.

    Difference from SGLang: among equal path scores the lower candidate index wins (stable
    descending sort instead of ``torch.topk``, whose tie order is unspecified), so the result is
    deterministic and identical on every device. Path scores are products of probabilities
    ``<= 1``; a child's fp32 score never exceeds its parent's.

    Fast path: ``fast`` re-exports this torch op unchanged rather than writing a Triton kernel. It is
    an O(B*K^2) sort of a few hundred elements, one small launch, and the decode step is replayed as
    a CUDA graph, where launch overhead vanishes.
    """
    check_int("i", i, 0)
    check_int("topk", topk, 1)
    for name, t in (("topk_p", topk_p), ("topk_index", topk_index), ("hidden_states", hidden_states)):
        check_tensor(name, t)
    if topk_p.dim() != 2:
        raise ValueError(f"topk_p must be 2-D, got shape {tuple(topk_p.shape)}")
    if topk_p.shape[1] != topk:
        raise ValueError(f"topk_p.shape[1] must equal topk={topk}, got shape {tuple(topk_p.shape)}")
    check_shape("topk_index", topk_index, tuple(topk_p.shape), "same as topk_p")
    check_integer_dtype("topk_index", topk_index)
    check_float_dtype("topk_p", topk_p)
    if hidden_states.dim() != 2 or hidden_states.shape[0] != topk_p.shape[0]:
        raise ValueError(
            f"hidden_states must have shape ({topk_p.shape[0]}, H) (one row per row of topk_p), "
            f"got {tuple(hidden_states.shape)}"
        )
    K = topk
    device = topk_p.device

    if i == 0:
        B = topk_p.shape[0]
        input_ids = topk_index.flatten()
        hidden_states = hidden_states.repeat_interleave(K, dim=0)
        scores = topk_p
        parents = torch.arange(-1, K, dtype=torch.int64, device=device).unsqueeze(0).repeat(B, 1)
        tree_info = (topk_p.unsqueeze(1), topk_index, parents)
        return input_ids, hidden_states, scores, tree_info

    check_tensor("scores", scores)
    if scores.dim() != 2 or scores.shape[1] != K:
        raise ValueError(f"scores must have shape (B, topk={K}), got {tuple(scores.shape)}")
    B = scores.shape[0]
    if topk_p.shape[0] != B * K:
        raise ValueError(
            f"at step i={i} topk_p must have B*K = {B}*{K} = {B * K} rows (K children of each "
            f"frontier node), got shape {tuple(topk_p.shape)}"
        )
    expand_scores = scores.unsqueeze(2) * topk_p.reshape(B, K, K)  # (B, K, K)
    topk_cs_p, topk_cs_index = _stable_topk_desc(expand_scores.flatten(start_dim=1), K)  # (B, K)
    scores = topk_cs_p
    topk_index = topk_index.reshape(B, K * K)
    input_ids = torch.gather(topk_index, 1, topk_cs_index).flatten()
    rows = topk_cs_index // K + torch.arange(B, device=device).unsqueeze(1) * K  # (B, K)
    hidden_states = hidden_states[rows.flatten()]
    parents = (topk_cs_index + (K * K * (i - 1) + K)).to(torch.int64)
    tree_info = (expand_scores, topk_index, parents)
    return input_ids, hidden_states, scores, tree_info


# --------------------------------------------------------------------------------------------
# organize_draft_results
# --------------------------------------------------------------------------------------------


def organize_draft_results(
    score_list: Sequence[torch.Tensor],
    token_list: Sequence[torch.Tensor],
    parents_list: Sequence[torch.Tensor],
    num_draft_token: int,
):
    """score_list: S tensors, (B, 1, K) then (B, K, K) ...; token_list: S tensors, (B, K) then
    (B, K*K) ...; parents_list: S tensors, (B, K+1) then (B, K) ... (the ``tree_info`` of each
    ``select_top_k_tokens`` step). Returns ``(parent_list (B, 1 + K*(S-1)) int64,
    top_scores_index (B, W-1) int64, draft_tokens (B, W-1) int64)`` with W = ``num_draft_token``.

    Keeps the W-1 draft candidates with the best path scores over all S steps (the candidate index
    space is described in the module docstring), sorted by candidate index so that every parent
    precedes its children. ``parent_list`` concatenates ``parents_list[:-1]`` (the candidate index
    of every frontier node that received children); it is an empty (B, 0) int64 tensor when S == 1.

    Difference from SGLang: SGLang takes ``torch.topk`` of the scores, whose order among equal
    scores is unspecified, and can then keep a child whose equally-scored parent was dropped (the
    "invalid eagle tree" warning of its tree kernel). Here ties are broken towards the LOWER
    candidate index (stable descending sort). A child's score is ``parent_score * p`` with
    ``p <= 1``, hence ``<= parent_score`` exactly in floating point, and a parent's candidate index is
    always lower than its children's, so a selected node's parent is always selected.

    Fast path: ``fast`` re-exports this torch op unchanged rather than writing a Triton kernel. It is
    an O(B*K^2) sort of a few hundred elements, one small launch, and the decode step is replayed as
    a CUDA graph, where launch overhead vanishes.
    """
    check_int("num_draft_token", num_draft_token, 2)
    S = len(score_list)
    if S < 1:
        raise ValueError("score_list must hold at least one draft step, got an empty list")
    if len(token_list) != S or len(parents_list) != S:
        raise ValueError(
            f"score_list, token_list and parents_list must have the same length, got "
            f"{S}, {len(token_list)}, {len(parents_list)}"
        )
    s0 = check_tensor("score_list[0]", score_list[0])
    if s0.dim() != 3 or s0.shape[1] != 1:
        raise ValueError(f"score_list[0] must have shape (B, 1, K), got {tuple(s0.shape)}")
    B, _, K = s0.shape
    if K < 1:
        raise ValueError(f"topk (score_list[0].shape[2]) must be >= 1, got {K}")
    for j in range(S):
        sc = check_tensor(f"score_list[{j}]", score_list[j])
        tk = check_tensor(f"token_list[{j}]", token_list[j])
        pa = check_tensor(f"parents_list[{j}]", parents_list[j])
        if j == 0:
            check_shape("token_list[0]", tk, (B, K))
            check_shape("parents_list[0]", pa, (B, K + 1))
        else:
            check_shape(f"score_list[{j}]", sc, (B, K, K))
            check_shape(f"token_list[{j}]", tk, (B, K * K))
            check_shape(f"parents_list[{j}]", pa, (B, K))
        check_integer_dtype(f"token_list[{j}]", tk)
        check_integer_dtype(f"parents_list[{j}]", pa)
    check_tree_size("num_draft_token", num_draft_token, K, S)

    scores = torch.cat([s.flatten(start_dim=1) for s in score_list], dim=1)  # (B, K + (S-1)K^2)
    tokens = torch.cat(list(token_list), dim=1)
    _, top_scores_index = _stable_topk_desc(scores, num_draft_token - 1)
    top_scores_index = torch.sort(top_scores_index, dim=-1).values.to(torch.int64)
    draft_tokens = torch.gather(tokens, 1, top_scores_index).to(torch.int64)
    if S > 1:
        parent_list = torch.cat(list(parents_list[:-1]), dim=1).to(torch.int64)
    else:
        parent_list = torch.empty(B, 0, dtype=torch.int64, device=s0.device)
    return parent_list, top_scores_index, draft_tokens


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
    retrieve_next_token = torch.where(has_child, first_child, -1).to(torch.int64)
    # sib[b, i, j]: j > i is a linked child of i's parent, i itself linked
    sib = (
        (parent_full.unsqueeze(2) == parent_full.unsqueeze(1))
        & linked_full.unsqueeze(1)
        & linked_full.unsqueeze(2)
        & (node.view(1, 1, W) > node.view(1, W, 1))
    )
    has_sib = sib.any(dim=-1)
    retrieve_next_sibling = torch.where(has_sib, sib.to(torch.int8).argmax(dim=-1), -1).to(torch.int64)

    retrieve_index = torch.arange(B * W, dtype=torch.int64, device=device).view(B, W)
    tokens = torch.cat([bonus_tokens.to(torch.int64).unsqueeze(1), draft_tokens.to(torch.int64)], dim=1)
    return tree_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, tokens.flatten()


def build_tree_naive(
    bonus_tokens: torch.Tensor,
    parent_list: torch.Tensor,
    top_scores_index: torch.Tensor,
    draft_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    spec_steps: int,
    num_verify_tokens: int,
):
    """Same shapes and semantics as ``build_tree_kernel_efficient``.

    A plain per-request, per-node Python loop that reads like SGLang's CUDA kernel
    (``build_tree_efficient``): walk each node's parent chain for its depth and mask row, and link
    the children of every node front-to-back in descending node order, so that the first child is
    the smallest and siblings come in ascending order. Slow (host syncs everywhere): for tests.
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
    sel = top_scores_index.tolist()
    plist = parent_list.tolist()
    lens = seq_lens.tolist()

    tree_mask = torch.zeros(B, W, W, dtype=torch.bool)
    positions = torch.zeros(B * W, dtype=torch.int64)
    next_token = torch.full((B, W), -1, dtype=torch.int64)
    next_sibling = torch.full((B, W), -1, dtype=torch.int64)

    def parent_of(b: int, i: int) -> tuple[int, bool]:
        """(parent node, linked) of the non-root node i of request b."""
        c = sel[b][i - 1]
        if c // K == 0:
            return 0, True
        parent_cand = plist[b][c // K]
        for j in range(W - 1):
            if sel[b][j] == parent_cand:
                return j + 1, True
        return 0, False  # invalid tree: detached, counted as a child of the root

    for b in range(B):
        # depth and mask: walk up to the root
        for i in range(W):
            tree_mask[b, i, i] = True
            tree_mask[b, i, 0] = True
            depth = 0
            cur = i
            while cur != 0 and depth < W:
                cur, _ = parent_of(b, cur)
                tree_mask[b, i, cur] = True
                depth += 1
            positions[b * W + i] = lens[b] + depth

        # children lists, built front-to-back from the last node down
        for i in range(W - 1, 0, -1):
            p, linked = parent_of(b, i)
            if not linked:
                continue
            if next_token[b, p] != -1:
                next_sibling[b, i] = next_token[b, p]
            next_token[b, p] = i

    retrieve_index = torch.arange(B * W, dtype=torch.int64).view(B, W)
    tokens = torch.cat(
        [bonus_tokens.to(torch.int64).cpu().unsqueeze(1), draft_tokens.to(torch.int64).cpu()], dim=1
    )
    out = (tree_mask, positions, retrieve_index, next_token, next_sibling, tokens.flatten())
    return tuple(t.to(device) for t in out)
