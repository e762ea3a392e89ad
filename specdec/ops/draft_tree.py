"""The draft-tree selection shared by `reference` and `fast`: SGLang's ``select_top_k_tokens`` and
``organize_draft_results`` (names, argument names and tensor contracts). Both are torch ops with no kernel:
each is a sort of a few hundred elements per request, one small launch, and the decode step is replayed as
a CUDA graph, where launch overhead vanishes; `reference` and `fast` export these same functions.

Notation: B batch, K ``topk``, S draft steps, W ``num_draft_token`` (tree size, root included), H hidden.

Candidate index space (shared with ``build_tree_kernel_efficient``): draft step 0 contributes candidates
``0 .. K-1`` (the root's children); step ``i >= 1`` contributes the ``K*K`` candidates
``K + (i-1)*K*K + f*K + m`` (child ``m`` of the step's frontier node ``f``). The parent of candidate ``c``
is the root when ``c // K == 0``, else the candidate ``parent_list[c // K]``.

Score ties are broken towards the lower candidate index, which makes an "invalid eagle tree" impossible.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.checks import check_int, check_tensor

from .op_checks import check_tree_size

__all__ = ["organize_draft_results", "select_top_k_tokens"]


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

    Fast path: ``fast`` exports this torch op unchanged rather than a Triton kernel (module docstring).
    """
    check_int("i", i, 0)
    check_int("topk", topk, 1)
    check_tensor("topk_p", topk_p, "float", (None, topk), what="rows, topk")
    check_tensor("topk_index", topk_index, "int", tuple(topk_p.shape), what="same as topk_p")
    check_tensor("hidden_states", hidden_states, shape=(topk_p.shape[0], None), what="one row per row of topk_p")
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

    check_tensor("scores", scores, shape=(None, K), what="B, topk")
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

    Fast path: ``fast`` exports this torch op unchanged rather than a Triton kernel (module docstring).
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
        check_tensor(f"score_list[{j}]", score_list[j], shape=(B, 1, K) if j == 0 else (B, K, K))
        check_tensor(f"token_list[{j}]", token_list[j], "int", (B, K) if j == 0 else (B, K * K))
        check_tensor(f"parents_list[{j}]", parents_list[j], "int", (B, K + 1) if j == 0 else (B, K))
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
