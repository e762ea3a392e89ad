"""Pure-PyTorch reference of Traversal Verification (Weng et al., NeurIPS 2025, arXiv 2505.12398).

Where recursive rejection (`reference.rejection`) decides a tree token by token from the root down, traversal
verification decides it from the leaves up, with sequence-level acceptance weights: a deep path whose tokens the
target likes as a whole can be kept even where one of its tokens alone would have been rejected. On a chain it is
block verification (Sun et al.); on a tree of depth one it is recursive rejection.

Notation and outputs as in `reference.rejection`: B batch, W tree size (root included), S ``num_steps``, V vocab;
``predict (B*W,) int32`` (-1 off the accepted path), ``accept_index (B, S+1) int32``, ``accept_length (B,) int32``.
Randomness comes only from the uniform tensors, arithmetic is float32, rows need not be normalised. Vectorised over
the batch with static loops (over W and S), no host synchronisation. The walk is not run step by step here: every
node's test weight is computed first (the updates never read a coin), then the first passing node in post-order is
taken; `fast.traversal` runs the walk itself, and its tests replay it in float64.
"""
from __future__ import annotations

import torch

from specdec.ops.op_checks import check_draft_probs_args, check_tree_args
from specdec.ops.contract import NO_NODE

from .rejection import _normalised
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
    replacement and the tree's shape does not depend on the drawn tokens (the exact-law checker `specdec.lab` proves
    it on the shapes of its record, through every drafting kind); on a depth-three tree it accepts more than
    recursive rejection on the same draws (tests/workers/test_sampled_verification.py).
    """
    B, W = check_tree_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, num_steps)
    V = check_draft_probs_args(B, W, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                               draft_probs, candidates.device)
    S = num_steps
    device = candidates.device
    ri = retrieve_index.to(torch.int64)
    tok = candidates.to(torch.int64)
    unif = uniform_samples.to(torch.float32)
    target = _normalised(target_probs.reshape(B, W, V))
    rows = torch.arange(B, device=device)
    parent, depth, order = _tree_walk(retrieve_next_token.to(torch.int64), retrieve_next_sibling.to(torch.int64), S)

    # The walk tests a node when it is a leaf: after every child's subtree was rejected, each rejection having
    # folded that child into the node's residual and weight. Those updates read only the node's own rows and its
    # children's tokens, never the coins, so every node's test weight (`weight` after the loop) and bonus row
    # (`resid`) can be computed first, children in pre-order (a node's weight before its later siblings'); the
    # walk then accepts the first node in post-order whose coin passes.
    resid = target.clone().view(B * W, V)
    proposal = _normalised(draft_probs.reshape(B * W, V))
    weight = torch.zeros(B * W, device=device)
    weight[::W] = 1.0
    tested = torch.zeros(B * W, dtype=torch.bool, device=device)
    tested[::W] = True
    flat_parent = (parent.clamp(min=0) + rows[:, None] * W).flatten()
    flat_depth, flat_tok = depth.flatten(), tok.flatten()
    for t in range(W - 1):
        c = order[:, t]
        fc = c.clamp(min=0) + rows * W
        fy = flat_parent.index_select(0, fc)
        x = flat_tok.index_select(0, fc)[:, None]
        P_y, Q_y, w_y = resid.index_select(0, fy), proposal.index_select(0, fy), weight.index_select(0, fy)
        q_x = Q_y.gather(1, x)[:, 0]
        # a child past depth S is not verified; one of zero mass was not a draw (its row ran out): both skipped
        ok = (c >= 0) & tested.index_select(0, fy) & (flat_depth.index_select(0, fc) <= S) & (q_x > 0)
        w_c = torch.clamp(w_y * P_y.gather(1, x)[:, 0] / q_x.clamp_min(1e-30), max=1.0)
        r = (w_y[:, None] * P_y - Q_y).clamp(min=0)
        m = r.sum(-1)
        w_new = torch.where(m > 0, torch.clamp(m / (m + (1.0 - w_y)).clamp_min(1e-30), max=1.0), 0.0)
        keep = ok[:, None]
        resid.index_copy_(0, fy, torch.where(keep, r / m.clamp_min(1e-30)[:, None], P_y))
        proposal.index_copy_(0, fy, torch.where(keep, _normalised(Q_y.scatter(1, x, 0.0)), Q_y))
        weight.index_copy_(0, fy, torch.where(ok, w_new, w_y))
        weight.index_copy_(0, fc, torch.where(ok, w_c, weight.index_select(0, fc)))
        tested.index_copy_(0, fc, tested.index_select(0, fc) | ok)
    resid, weight, tested = resid.view(B, W, V), weight.view(B, W), tested.view(B, W)

    passes = tested & (unif < weight)
    passes[:, 0] = True
    post = _post_order_rank(parent, depth, order, S)
    accepted = torch.where(passes, post, W).argmin(dim=1)  # (B,)
    accept_depth = depth[rows, accepted]

    # the accepted path, leaf up: level d's node is the accepted node's ancestor at depth d
    node = torch.zeros(B, S + 1, dtype=torch.int64, device=device)
    cur = accepted
    for d in range(S, 0, -1):
        here = accept_depth >= d
        node[:, d] = torch.where(here, cur, 0)
        cur = torch.where(here, parent[rows, cur].clamp(min=0), cur)
    level = torch.arange(S + 1, device=device)[None, :]
    on_path = level <= accept_depth[:, None]
    bonus = _sample_residual(resid[rows, accepted], target[rows, accepted],
                             uniform_samples_for_final_sampling.to(torch.float32))
    path_flat = torch.gather(ri, 1, node)  # (B, S + 1)
    accept_index = torch.where(on_path, path_flat, NO_NODE).to(torch.int32)
    child_tok = torch.cat([torch.gather(tok, 1, node[:, 1:]), tok[:, :1]], dim=1)  # level d's accepted child
    value = torch.where(level == accept_depth[:, None], bonus[:, None], child_tok)
    predict = torch.full((B * W + 1,), NO_NODE, dtype=torch.int32, device=device)  # last slot: write sink
    predict.scatter_(0, torch.where(on_path, path_flat, B * W).flatten(), value.flatten().to(torch.int32))
    return predict[: B * W], accept_index.contiguous(), accept_depth.to(torch.int32)


def _tree_walk(nxt: torch.Tensor, sib: torch.Tensor, S: int):
    """nxt, sib (B, W) int64 links -> (parent (B, W), depth (B, W), order (B, W-1)): each node's parent (-1 for the
    root and for nodes the links never reach), its depth (capped at S + 1, enough to tell a node past S), and the
    non-root nodes in pre-order (-1 past the last). Static loops over W and S."""
    B, W = nxt.shape
    device = nxt.device
    sink = torch.full((B, 1), -1, dtype=torch.int64, device=device)
    at = torch.arange(W, device=device).expand(B, W)
    # a first child's parent from its parent's link, then down each sibling chain
    parent = torch.full((B, W + 1), -1, dtype=torch.int64, device=device)
    parent.scatter_(1, torch.where(nxt >= 0, nxt, W), at)
    prev = torch.full((B, W + 1), -1, dtype=torch.int64, device=device)
    prev.scatter_(1, torch.where(sib >= 0, sib, W), at)
    parent, prev = parent[:, :W], prev[:, :W]
    first = torch.where(prev >= 0, prev, at)  # pointer doubling to each node's first sibling
    for _ in range(max(W - 2, 1).bit_length()):
        first = torch.gather(first, 1, first)
    parent = torch.gather(parent, 1, first)
    depth = torch.zeros(B, W, dtype=torch.int64, device=device)
    for _ in range(S + 1):
        depth = torch.where(parent >= 0, torch.gather(depth, 1, parent.clamp(min=0)) + 1, 0)
    # pre-order: a node's first child, else the next sibling of its nearest ancestor-or-self that has one
    after = sib.clone()
    for _ in range(S + 1):
        up = torch.cat([sink, torch.gather(after, 1, parent.clamp(min=0))[:, 1:]], dim=1)
        after = torch.where(sib >= 0, sib, torch.where(parent >= 0, up, -1))
    step = torch.where(nxt >= 0, nxt, after)
    order, cur = [], torch.zeros(B, 1, dtype=torch.int64, device=device)
    for _ in range(W - 1):
        cur = torch.where(cur >= 0, torch.gather(step, 1, cur.clamp(min=0)), cur)
        order.append(cur)
    return parent, depth, torch.cat(order, dim=1) if order else nxt[:, :0]


def _post_order_rank(parent, depth, order, S: int):
    """(B, W) each node's rank in the post-order of the verified tree (the nodes at most S deep): its pre-order rank
    less its depth, plus its subtree's size less one. Other nodes rank W (after every verified one)."""
    B, W = parent.shape
    device = parent.device
    verified = (order >= 0) & (torch.gather(depth, 1, order.clamp(min=0)) <= S)
    pre = torch.full((B, W + 1), W, dtype=torch.int64, device=device)
    pre[:, 0] = 0
    pre.scatter_(1, torch.where(verified, order, W), verified.to(torch.int64).cumsum(1))
    pre = pre[:, :W]
    reached = pre < W
    size = torch.ones(B, W + 1, dtype=torch.int64, device=device)
    for d in range(S, 0, -1):  # deepest first: a subtree is summed before its parent reads it
        at_d = reached & (depth == d)
        size.scatter_add_(1, torch.where(at_d, parent.clamp(min=0), W), torch.where(at_d, size[:, :W], 0))
    return torch.where(reached, pre - depth + size[:, :W] - 1, W)
