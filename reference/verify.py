"""Pure-PyTorch reference of EAGLE's tree verification (greedy and lossless tree sampling).

Mirrors SGLang's sgl-kernel ops ``verify_tree_greedy`` and
``tree_speculative_sampling_target_only`` (names, argument names and tensor contracts), except that
they return their outputs instead of filling preallocated buffers.

Notation: B batch, W tree size (root included), S ``num_steps`` (draft depth), V vocab.
The tree comes from ``build_tree_kernel_efficient``: node 0 is the root, ``retrieve_next_token``
(first child or -1) and ``retrieve_next_sibling`` (next sibling or -1) link the children, and
``retrieve_index[b, i]`` is node i's flat index (``b*W + i``), used, as in SGLang, for the values
of ``accept_index``, the slots of ``predict`` and the reads of the flattened ``target_predict``.

Outputs (both verifies):

* ``predict (B*W,) int32``: at the flat index of every accepted node (root included) the token
  that follows it (the next accepted node's token, or the bonus token at the last accepted node);
  -1 at every other slot, as in SGLang, whose callers fill the buffer with -1 before the kernel runs.
* ``accept_index (B, S+1) int32``: flat indices of the accepted path, root first, padded with -1.
* ``accept_length (B,) int32``: accepted draft tokens, the bonus token excluded.

The walk examines each non-root node at most once, so the vectorised versions run a static loop of
W-1 iterations over the whole batch with no host synchronisation. Their per-request, per-node
oracles are in `reference.naive`.
"""

from __future__ import annotations

import torch

from specdec.ops.contract import NO_NODE
from specdec.ops.op_checks import check_sampling_args, check_tree_args, check_verify_greedy_args

__all__ = ["tree_speculative_sampling_target_only", "verify_tree_greedy"]


# --------------------------------------------------------------------------------------------
# the final (bonus) sample, shared definition
# --------------------------------------------------------------------------------------------


def _sample_residual(resid: torch.Tensor, row: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """resid, row (B, V) float32 >= 0, u (B,) float32 -> (B,) int64.

    Inverse-CDF sample of the residual: the first index v with ``cumsum(resid)[v] > u * sum``
    (strict, so a zero-probability token is never chosen). If every token of the residual is zero
    (possible only through rounding, when the rejected children held all the mass), the full target
    row is sampled instead. If ``u * sum`` rounds up to the sum, the last positive token is taken;
    an all-zero row (invalid input) yields V-1, SGLang's default.
    """
    V = resid.shape[-1]
    empty = resid.sum(dim=-1, keepdim=True) <= 0
    resid = torch.where(empty, row, resid)
    cdf = torch.cumsum(resid, dim=-1)
    thr = u * cdf[:, -1]
    first = (cdf <= thr.unsqueeze(1)).sum(dim=-1)
    last_pos = (V - 1) - (resid > 0).flip(-1).to(torch.int8).argmax(dim=-1)
    return torch.minimum(first, last_pos).to(torch.int64)


# --------------------------------------------------------------------------------------------
# greedy
# --------------------------------------------------------------------------------------------


def verify_tree_greedy(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    num_steps: int,
):
    """candidates (B, W), retrieve_index (B, W), retrieve_next_token (B, W), retrieve_next_sibling
    (B, W), target_predict (B, W). Returns ``(predict (B*W,) int32, accept_index (B, S+1) int32,
    accept_length (B,) int32)`` with S = ``num_steps``.

    Greedy tree verification, as SGLang's ``verify_tree_greedy``: start at the root; at each depth
    accept the first child (in sibling order) whose token equals ``target_predict`` at the current
    node (read at its flat index ``retrieve_index``); stop at the first depth with no match, at a
    node without children, or after S accepted tokens. ``predict`` holds ``target_predict`` at every
    accepted node (so the last accepted node holds the bonus token) and -1 elsewhere.

    Loop-free over the nodes, no host synchronisation: a node is accepted exactly when it is within S
    of the root and it and each of its ancestors is the first matching child of its parent. Parents,
    sibling ranks, depths and that ancestor test come from the links by pointer jumping (ceil(log2 W)
    rounds each), so a step costs a fixed ~70 tensor ops whatever W.
    """
    B, W = check_verify_greedy_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling,
                                    target_predict, num_steps)
    S = num_steps
    device = candidates.device
    ri = retrieve_index.to(torch.int64)
    nxt = retrieve_next_token.to(torch.int64)
    sib = retrieve_next_sibling.to(torch.int64)
    tp_flat = target_predict.reshape(-1).to(torch.int64)
    node = torch.arange(W, device=device).expand(B, W)
    rounds = max(1, (W - 1).bit_length())

    def linked_from(links):
        """(B, W): the node whose link points here, -1 if none (column W collects the absent links)."""
        out = torch.full((B, W + 1), -1, dtype=torch.int64, device=device)
        return out.scatter_(1, torch.where(links >= 0, links, W), node)[:, :W]

    def jump(ptr, value, combine):
        """Pointer jumping: fold `value` along ptr (a forest whose roots point at themselves)."""
        for _ in range(rounds):
            value = combine(value, value.gather(1, ptr))
            ptr = ptr.gather(1, ptr)
        return value, ptr

    # siblings: rank in the sibling chain, and the chain's head (the first child, which the parent links)
    prev_sibling = linked_from(sib)
    rank, head = jump(torch.where(prev_sibling >= 0, prev_sibling, node), (prev_sibling >= 0).long(), torch.add)
    parent = linked_from(nxt).gather(1, head)  # -1 at the root and at nodes no link reaches
    has_parent = parent >= 0
    up = torch.where(has_parent, parent, node)
    depth, _ = jump(up, has_parent.long(), torch.add)

    # first matching child of its parent: a match whose sibling rank is the smallest among the matches
    match = has_parent & (candidates.to(torch.int64) == tp_flat[ri.gather(1, up)])
    first_rank = torch.full((B, W + 1), W, dtype=torch.int64, device=device).scatter_reduce_(
        1, torch.where(match, parent, W), torch.where(match, rank, W), "amin")
    first = match & (rank == first_rank.gather(1, up))
    path_ok, _ = jump(up, first | (node == 0), torch.logical_and)
    accepted = path_ok & has_parent & (depth <= S)

    accept_length = accepted.sum(1)
    accept_index = torch.full((B, S + 2), NO_NODE, dtype=torch.int32, device=device)  # last column: sink
    accept_index[:, 0] = ri[:, 0].to(torch.int32)
    accept_index.scatter_(1, torch.where(accepted, depth, S + 1), ri.to(torch.int32))
    on_path = accepted | (node == 0)
    predict = torch.full((B * W + 1,), NO_NODE, dtype=torch.int32, device=device)  # last slot: write sink
    flat = torch.where(on_path, ri, B * W).flatten()
    predict.scatter_(0, flat, tp_flat[flat.clamp_max(B * W - 1)].to(torch.int32))
    return predict[: B * W], accept_index[:, : S + 1].contiguous(), accept_length.to(torch.int32)


# --------------------------------------------------------------------------------------------
# tree speculative sampling (target only: deterministic draft)
# --------------------------------------------------------------------------------------------


def tree_speculative_sampling_target_only(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    num_steps: int,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
):
    """candidates (B, W), retrieve_index (B, W), retrieve_next_token (B, W), retrieve_next_sibling
    (B, W), uniform_samples (B, W), uniform_samples_for_final_sampling (B,), target_probs (B, W, V).
    Returns ``(predict (B*W,) int32, accept_index (B, S+1) int32, accept_length (B,) int32)`` with
    S = ``num_steps``.

    Lossless tree sampling for a deterministic draft, as sgl-kernel's
    ``tree_speculative_sampling_target_only``. At the current node n (the root first) with coin
    ``u = uniform_samples[b, n]``, the children of n are tried in sibling order, accumulating
    ``prob_acc += p(child token)`` under ``target_probs[b, n]``. A child is accepted when
    ``u < prob_acc / threshold_acc`` or ``p(child) >= threshold_single``; the walk then moves to it
    with ``prob_acc = 0`` and a new coin ``uniform_samples[b, child]``. A rejected child's mass is
    removed from n's residual. When no child is accepted, when the accepted node has no children,
    or after S accepted tokens, the bonus token is drawn from the residual of the current node
    (its target row with every rejected child's mass zeroed; unnormalised) by inverse CDF with
    ``uniform_samples_for_final_sampling[b]``: the first token whose cumulative mass exceeds
    ``u * total`` (strict). Arithmetic in float32, whatever the input dtypes.

    With thresholds 1.0 this is exactly sequential sampling from the target (one coin per node picks
    a child with probability p(child), the residual is the target restricted to the other tokens),
    so the emitted tokens are distributed as the target's. Thresholds in [0, 1) are SGLang's relaxed
    acceptance and LOSSY: they accept more, and the output is no longer distributed as the target
    (a warning says so, once per process). At ``threshold_single = 0`` every first child is accepted
    whatever its probability; ``threshold_acc = 0`` makes ``prob_acc / threshold_acc`` infinite, so any
    child of positive cumulative mass is accepted (0 / 0 is NaN: a zero-mass child still is not).

    Difference from SGLang: acceptance uses a STRICT ``u < prob_acc`` (SGLang: ``<=``), so a child of
    probability 0 is never accepted, even with a coin of exactly 0; consequently a one-hot target
    reproduces greedy verification exactly. Randomness comes only from the uniform tensors:
    identical uniforms give identical decisions.

    Vectorised over the batch, no host synchronisation.
    """
    B, W = check_tree_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, num_steps)
    V = check_sampling_args(
        B,
        W,
        uniform_samples,
        uniform_samples_for_final_sampling,
        target_probs,
        threshold_single,
        threshold_acc,
        device=candidates.device,
    )
    S = num_steps
    device = candidates.device
    ri = retrieve_index.to(torch.int64)
    nxt = retrieve_next_token.to(torch.int64)
    sib = retrieve_next_sibling.to(torch.int64)
    cand_tok = candidates.to(torch.int64)
    probs = target_probs.reshape(B * W, V)
    unif = uniform_samples.to(torch.float32)
    b_off = torch.arange(B, device=device).unsqueeze(1) * W  # (B, 1)

    predict = torch.full((B * W + 1,), NO_NODE, dtype=torch.int32, device=device)
    accept_index = torch.full((B, S + 2), NO_NODE, dtype=torch.int32, device=device)
    accept_index[:, 0] = ri[:, 0].to(torch.int32)
    cur = torch.zeros(B, 1, dtype=torch.int64, device=device)
    child = nxt[:, :1]
    depth = torch.zeros(B, 1, dtype=torch.int64, device=device)
    prob_acc = torch.zeros(B, 1, dtype=torch.float32, device=device)
    coin = unif[:, :1]
    # rejected children: (token, node they were rejected at); token V is a sink
    rej_tok = torch.full((B, max(W - 1, 1)), V, dtype=torch.int64, device=device)
    rej_at = torch.full((B, max(W - 1, 1)), -1, dtype=torch.int64, device=device)
    for t in range(W - 1):
        active = (child >= 0) & (depth < S)
        c = child.clamp(min=0)
        tok = torch.gather(cand_tok, 1, c)
        p = probs[(b_off + cur).flatten(), tok.flatten()].to(torch.float32).unsqueeze(1)
        prob_acc = torch.where(active, prob_acc + p, prob_acc)
        accept = active & ((coin < prob_acc / threshold_acc) | (p >= threshold_single))
        reject = active & ~accept
        rej_tok[:, t : t + 1] = torch.where(reject, tok, V)
        rej_at[:, t : t + 1] = torch.where(reject, cur, -1)
        cur_flat = torch.gather(ri, 1, cur)
        predict.scatter_(0, torch.where(accept, cur_flat, B * W).flatten(), tok.flatten().to(torch.int32))
        accept_index.scatter_(
            1, torch.where(accept, depth + 1, S + 1), torch.gather(ri, 1, c).to(torch.int32)
        )
        depth = depth + accept.to(torch.int64)
        cur = torch.where(accept, c, cur)
        prob_acc = torch.where(accept, 0.0, prob_acc)
        coin = torch.where(accept, torch.gather(unif, 1, c), coin)
        child = torch.where(
            accept, torch.gather(nxt, 1, c), torch.where(reject, torch.gather(sib, 1, c), child)
        )

    row = probs[(b_off + cur).flatten()].to(torch.float32).clamp(min=0)  # (B, V)
    zero_at = torch.where(rej_at == cur, rej_tok, V)
    resid = torch.cat([row, row.new_zeros(B, 1)], dim=1).scatter(1, zero_at, 0.0)[:, :V]
    bonus = _sample_residual(resid, row, uniform_samples_for_final_sampling.to(torch.float32))
    last_flat = torch.gather(ri, 1, cur).flatten()
    predict.scatter_(0, last_flat, bonus.to(torch.int32))
    return predict[: B * W], accept_index[:, : S + 1].contiguous(), depth.flatten().to(torch.int32)
