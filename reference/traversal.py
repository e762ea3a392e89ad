"""Pure-PyTorch reference of Traversal Verification (Weng et al., NeurIPS 2025, arXiv 2505.12398).

Where recursive rejection (`reference.rejection`) decides a tree token by token from the root down, traversal
verification decides it from the leaves up, with sequence-level acceptance weights: a deep path whose tokens the
target likes as a whole can be kept even where one of its tokens alone would have been rejected. On a chain it is
block verification (Sun et al.); on a tree of depth one it is recursive rejection.

Notation and outputs as in `reference.rejection`: B batch, W tree size (root included), S ``num_steps``, V vocab;
``predict (B*W,) int32`` (-1 off the accepted path), ``accept_index (B, S+1) int32``, ``accept_length (B,) int32``.
Randomness comes only from the uniform tensors, arithmetic is float32, rows need not be normalised. Vectorised over
the batch with a static loop (3W iterations), no host synchronisation.
"""
from __future__ import annotations

import torch

from specdec.checks import check_draft_probs_args, check_tree_args
from specdec.contract import NO_NODE

from .verify import _sample_residual

__all__ = ["tree_speculative_sampling_traversal"]


def tree_speculative_sampling_traversal(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    num_steps: int,
):
    """candidates (B, W), retrieve_index (B, W), retrieve_next_token (B, W), retrieve_next_sibling (B, W),
    uniform_samples (B, W), uniform_samples_for_final_sampling (B,), target_probs (B, W, V), draft_probs (B, W, V).
    Returns ``(predict (B*W,) int32, accept_index (B, S+1) int32, accept_length (B,) int32)``, S = ``num_steps``.

    ``draft_probs[b, n]`` is the distribution node n's children were drawn from, without replacement, in sibling
    order (`sample_without_replacement`). Each node on the current path holds a weight w, a target residual P and a
    proposal law Q; the root starts with w = 1, P = ``target_probs[b, 0]``, Q = ``draft_probs[b, 0]`` (normalised).
    The walk goes down to the first leaf in post-order (first children first, at most S deep); entering child c of
    node y with token x sets w_c = min(1, w_y P_y(x) / Q_y(x)), P_c, Q_c = node c's rows. At a leaf c (a node whose
    children are all gone, or at depth S) the path root..c is accepted when ``uniform_samples[b, c] < w_c``. Else c is
    removed and its parent y updated: with r = max(0, w_y P_y - Q_y) and m = sum(r), P_y becomes r / m,
    w_y becomes m / (m + 1 - w_y) (0 when m = 0), and Q_y loses x (renormalised); the walk goes on into c's next
    sibling, or tests y itself. The root is accepted when reached. A child with Q_y(x) = 0 was not a draw (its row
    ran out of mass) and is skipped. The bonus token is drawn from the accepted node's P with
    ``uniform_samples_for_final_sampling[b]`` by inverse CDF (its full target row if rounding emptied P).
    Column 0 of ``uniform_samples`` is not read.

    Exact (the emitted tokens follow the target's law) when each node's children were drawn from its q row without
    replacement and the tree's shape does not depend on the drawn tokens; it accepts at least as much as recursive
    rejection in expectation.
    """
    B, W = check_tree_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, num_steps)
    V = check_draft_probs_args(B, W, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                               draft_probs, candidates.device)
    S = num_steps
    device = candidates.device
    ri = retrieve_index.to(torch.int64)
    nxt = retrieve_next_token.to(torch.int64)
    sib = retrieve_next_sibling.to(torch.int64)
    tok = candidates.to(torch.int64)
    unif = uniform_samples.to(torch.float32)
    target = _normalised(target_probs.reshape(B, W, V))
    draft = _normalised(draft_probs.reshape(B, W, V))
    rows = torch.arange(B, device=device)

    # the current path as a stack of S + 1 levels: its nodes, weights, residuals, proposal laws, next children
    node = torch.zeros(B, S + 1, dtype=torch.int64, device=device)
    weight = torch.ones(B, S + 1, device=device)
    resid = target[:, :1].repeat(1, S + 1, 1)
    proposal = draft[:, :1].repeat(1, S + 1, 1)
    next_child = torch.full((B, S + 1), NO_NODE, dtype=torch.int64, device=device)
    next_child[:, 0] = nxt[:, 0]
    depth = torch.zeros(B, dtype=torch.int64, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)

    for _ in range(3 * W):
        d = depth
        here, w_y = node[rows, d], weight[rows, d]
        P_y, Q_y = resid[rows, d], proposal[rows, d]
        c = next_child[rows, d]
        has_child = ~done & (c >= 0) & (d < S)
        c0 = c.clamp(min=0)
        x = tok[rows, c0]
        q_x = Q_y.gather(1, x[:, None])[:, 0]
        skip = has_child & (q_x <= 0)
        descend = has_child & (q_x > 0)
        at_leaf = ~done & ~has_child
        accept = at_leaf & ((d == 0) | (unif[rows, here] < w_y))
        reject = at_leaf & ~accept

        # descend into c: push its level
        w_c = torch.clamp(w_y * P_y.gather(1, x[:, None])[:, 0] / q_x.clamp_min(1e-30), max=1.0)
        up = (d + 1).clamp(max=S)
        push = descend[:, None]
        node[rows, up] = torch.where(descend, c0, node[rows, up])
        weight[rows, up] = torch.where(descend, w_c, weight[rows, up])
        resid[rows, up] = torch.where(push, target[rows, c0], resid[rows, up])
        proposal[rows, up] = torch.where(push, draft[rows, c0], proposal[rows, up])
        next_child[rows, up] = torch.where(descend, nxt[rows, c0], next_child[rows, up])
        next_child[rows, d] = torch.where(skip, sib[rows, c0], next_child[rows, d])

        # reject the leaf at d: update its parent at d - 1, whose next child is the leaf's sibling
        dn = (d - 1).clamp(min=0)
        w_p, P_p, Q_p = weight[rows, dn], resid[rows, dn], proposal[rows, dn]
        r = (w_p[:, None] * P_p - Q_p).clamp(min=0)
        m = r.sum(-1)
        w_new = torch.where(m > 0, torch.clamp(m / (m + (1.0 - w_p)).clamp_min(1e-30), max=1.0), 0.0)
        Q_new = _normalised(Q_p.scatter(1, tok[rows, here][:, None], 0.0))
        pull = reject[:, None]
        weight[rows, dn] = torch.where(reject, w_new, w_p)
        resid[rows, dn] = torch.where(pull, r / m.clamp_min(1e-30)[:, None], P_p)
        proposal[rows, dn] = torch.where(pull, Q_new, Q_p)
        next_child[rows, dn] = torch.where(reject, sib[rows, here], next_child[rows, dn])

        depth = depth + descend.to(torch.int64) - reject.to(torch.int64)
        done = done | accept

    level = torch.arange(S + 1, device=device)[None, :]
    on_path = level <= depth[:, None]
    last = node[rows, depth]
    bonus = _sample_residual(resid[rows, depth], target[rows, last],
                             uniform_samples_for_final_sampling.to(torch.float32))
    path_flat = torch.gather(ri, 1, node)  # (B, S + 1)
    accept_index = torch.where(on_path, path_flat, NO_NODE).to(torch.int32)
    child_tok = torch.cat([torch.gather(tok, 1, node[:, 1:]), tok[:, :1]], dim=1)  # level d's accepted child
    value = torch.where(level == depth[:, None], bonus[:, None], child_tok)
    predict = torch.full((B * W + 1,), NO_NODE, dtype=torch.int32, device=device)  # last slot: write sink
    predict.scatter_(0, torch.where(on_path, path_flat, B * W).flatten(), value.flatten().to(torch.int32))
    return predict[: B * W], accept_index.contiguous(), depth.to(torch.int32)


def _normalised(rows: torch.Tensor) -> torch.Tensor:
    """(..., V) -> fp32 rows with negative entries zeroed, divided by their sums (an all-zero row stays zero)."""
    rows = rows.to(torch.float32).clamp(min=0)
    return rows / rows.sum(-1, keepdim=True).clamp_min(1e-30)
