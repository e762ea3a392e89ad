"""Pure-PyTorch reference of verification with the draft's distribution, and of the sampled drafting it needs.

Where `reference.verify` accepts a deterministic draft against the target alone (SGLang's
``tree_speculative_sampling_target_only``), these ops read the distribution q each proposal was drawn from:

* ``sample_without_replacement``: the draft's proposals at a node, drawn from q without replacement (the law of
  Gumbel-top-k, drawn with K uniforms per row: the k-th is an inverse-CDF draw from q with the first k-1 removed).
* ``tree_speculative_sampling_rejection``: recursive rejection sampling over a node's children, taken in their
  drawn order (SpecInfer's multi-step speculative sampling; Recursive Speculative Decoding for children drawn
  without replacement). On a chain it is token-wise rejection sampling (Leviathan et al., Chen et al.).
* ``chain_speculative_sampling_block``: block verification of a chain (Sun et al., ICLR 2025, arXiv 2403.10444),
  which decides the accepted length from the whole chain's ratios at once and accepts at least as much.

Notation: B batch, W tree size (root included), S ``num_steps``, V vocab; p the target's distribution at a node
(after temperature, top-k / top-p, penalties and grammar masks), q the draft's there. Outputs are those of the
target-only op (see `reference.verify`): ``predict (B*W,) int32`` (-1 off the accepted path), ``accept_index
(B, S+1) int32``, ``accept_length (B,) int32``. Randomness comes only from the uniform tensors, arithmetic is
float32, and a row need not be normalised (each is divided by its sum where a probability is read). Vectorised
over the batch, static loops only, no host synchronisation.
"""
from __future__ import annotations

import torch

from specdec.ops.op_checks import check_draft_probs_args, check_sample_without_replacement_args, check_tree_args
from specdec.ops.contract import NO_NODE

from .verify import _sample_residual

__all__ = ["chain_speculative_sampling_block", "sample_without_replacement", "tree_speculative_sampling_rejection"]


def sample_without_replacement(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """probs (N, V) float >= 0 (unnormalised is fine), uniforms (N, K) float in [0, 1) -> (N, K) int64.

    K draws per row without replacement, in draw order: draw k is the first token whose cumulative mass, over the
    row with draws 0..k-1 removed, exceeds ``uniforms[:, k]`` times that row's total (strict, so a token of zero
    mass is never drawn while mass remains; where that product rounds up to the total, the threshold is the float
    just below it). This is the law of Gumbel-top-k (Plackett-Luce) with K uniforms per row instead of V Gumbel
    variables. Once a row's mass is used up (fewer than K tokens of positive mass), the remaining draws are token
    V-1, of probability 0 under the row left at their turn: the verify ops skip a child whose draft probability is 0.
    """
    N, V, K = check_sample_without_replacement_args(probs, uniforms)
    left = probs.to(torch.float32, copy=True)
    draws = []
    for u in uniforms.float().split(1, dim=1):
        cdf = left.cumsum(-1)
        total = cdf[:, -1:]
        threshold = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
        x = torch.searchsorted(cdf, threshold, right=True).clamp_max_(V - 1)
        draws.append(x)
        left.scatter_(1, x, 0.0)
    return torch.cat(draws, dim=1)


def tree_speculative_sampling_rejection(
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
    order (`sample_without_replacement`); rows of nodes without children are not read. At the current node (the
    root first) the residual r starts as p = ``target_probs[b, n]`` and the proposal law g as q =
    ``draft_probs[b, n]``; the children are tried in sibling order. Child c with token x is accepted when
    ``uniform_samples[b, c] * g(x) < r(x)`` (both normalised: accept with probability min(1, r(x) / g(x)));
    the walk then moves to c. After a rejection, r becomes max(0, r - g) (normalised operands) and g loses x.
    A child with g(x) = 0 was not a draw from g (its row ran out of mass) and is skipped, changing nothing. When
    no child is accepted, the node has none, or S tokens were accepted, the bonus token is drawn from r by
    inverse CDF with ``uniform_samples_for_final_sampling[b]`` (the node's full target row if rounding emptied r).

    The emitted tokens are distributed as the target's, whatever q is, provided each node's children were drawn
    from its q row as above and the tree's shape does not depend on the drawn tokens (`specdec.verification`).
    """
    B, W = check_tree_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, num_steps)
    V = check_draft_probs_args(B, W, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                               draft_probs, candidates.device)
    S = num_steps
    device = candidates.device
    ri = retrieve_index.to(torch.int64)
    nxt = retrieve_next_token.to(torch.int64)
    sib = retrieve_next_sibling.to(torch.int64)
    cand_tok = candidates.to(torch.int64)
    target = _normalised(target_probs.reshape(B * W, V))
    draft = _normalised(draft_probs.reshape(B * W, V))
    unif = uniform_samples.to(torch.float32)
    b_off = torch.arange(B, device=device).unsqueeze(1) * W  # (B, 1)

    predict = torch.full((B * W + 1,), NO_NODE, dtype=torch.int32, device=device)
    accept_index = torch.full((B, S + 2), NO_NODE, dtype=torch.int32, device=device)
    accept_index[:, 0] = ri[:, 0].to(torch.int32)
    cur = torch.zeros(B, 1, dtype=torch.int64, device=device)
    child = nxt[:, :1]
    depth = torch.zeros(B, 1, dtype=torch.int64, device=device)
    resid, proposal = target[b_off[:, 0]], draft[b_off[:, 0]]  # (B, V) each, normalised
    for _ in range(W - 1):
        c = child.clamp(min=0)
        tok = torch.gather(cand_tok, 1, c)
        g_x = proposal.gather(1, tok)
        tried = (child >= 0) & (depth < S) & (g_x > 0)  # a child of zero draft mass was not drawn: skipped
        accept = tried & (torch.gather(unif, 1, c) * g_x < resid.gather(1, tok))
        reject = tried & ~accept
        cur_flat = torch.gather(ri, 1, cur)
        predict.scatter_(0, torch.where(accept, cur_flat, B * W).flatten(), tok.flatten().to(torch.int32))
        accept_index.scatter_(1, torch.where(accept, depth + 1, S + 1), torch.gather(ri, 1, c).to(torch.int32))
        depth = depth + accept.to(torch.int64)
        cur = torch.where(accept, c, cur)
        at_child = (b_off + c).flatten()
        resid = torch.where(accept, target[at_child],
                            torch.where(reject, _normalised(resid - proposal), resid))
        proposal = torch.where(accept, draft[at_child],
                               torch.where(reject, _normalised(proposal.scatter(1, tok, 0.0)), proposal))
        child = torch.where(accept, torch.gather(nxt, 1, c),
                            torch.where((child >= 0) & (depth < S) & ~accept, torch.gather(sib, 1, c), child))

    row = target[(b_off + cur).flatten()]
    bonus = _sample_residual(resid, row, uniform_samples_for_final_sampling.to(torch.float32))
    predict.scatter_(0, torch.gather(ri, 1, cur).flatten(), bonus.to(torch.int32))
    return predict[: B * W], accept_index[:, : S + 1].contiguous(), depth.flatten().to(torch.int32)


def _normalised(rows: torch.Tensor) -> torch.Tensor:
    """(..., V) -> fp32 rows with negative entries zeroed, divided by their sums (an all-zero row stays zero)."""
    rows = rows.to(torch.float32).clamp(min=0)
    return rows / rows.sum(-1, keepdim=True).clamp_min(1e-30)


def chain_speculative_sampling_block(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    num_steps: int,
):
    """candidates (B, W), retrieve_index (B, W), uniform_samples (B, W), uniform_samples_for_final_sampling (B,),
    target_probs (B, W, V), draft_probs (B, W, V). Returns ``(predict (B*W,) int32, accept_index (B, S+1) int32,
    accept_length (B,) int32)``, S = ``num_steps``.

    Block verification of a chain: node i (i >= 1) is the root's i-th descendant, its token x_i drawn from
    ``draft_probs[b, i-1]`` (Q_{i-1}); P_i = ``target_probs[b, i]``. With L = min(S, W - 1), w_0 = 1 and
    w_i = min(1, w_{i-1} P_{i-1}(x_i) / Q_{i-1}(x_i)), the stop weight at i < L is
    h_i = m_i / (m_i + 1 - w_i) with m_i = sum_x max(0, w_i P_i(x) - Q_i(x)) (0 where m_i = 0), and h_L = w_L.
    The accepted length tau is the largest i with ``uniform_samples[b, i] < h_i`` (0 if none); the bonus token is
    drawn, with ``uniform_samples_for_final_sampling[b]``, from P_L when tau = L, else from
    max(0, w_tau P_tau - Q_tau) (the full row P_tau if rounding emptied it). Column 0 of ``uniform_samples`` is not
    read. A token with Q_{i-1}(x_i) = 0 has weight 0. Rows are normalised before use.

    Sun et al. prove this lossless and optimal among verifiers of one drafted path; its accepted length is at
    least token-wise rejection's in expectation. The caller guarantees the chain layout (node i's child is i+1).
    """
    B, W = check_tree_args(candidates, retrieve_index, retrieve_index, retrieve_index, num_steps)
    check_draft_probs_args(B, W, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                           draft_probs, candidates.device)
    L = min(num_steps, W - 1)
    device = candidates.device
    ri = retrieve_index.to(torch.int64)
    P = target_probs.to(torch.float32).clamp(min=0)
    P = P / P.sum(-1, keepdim=True).clamp_min(1e-30)
    Q = draft_probs.to(torch.float32).clamp(min=0)
    Q = Q / Q.sum(-1, keepdim=True).clamp_min(1e-30)
    tok = candidates.to(torch.int64)
    unif = uniform_samples.to(torch.float32)

    weight = [torch.ones(B, device=device)]
    tau = torch.zeros(B, dtype=torch.int64, device=device)
    for i in range(1, L + 1):
        x = tok[:, i:i + 1]
        q_x = Q[:, i - 1].gather(1, x)[:, 0]
        ratio = torch.where(q_x > 0, P[:, i - 1].gather(1, x)[:, 0] / q_x.clamp_min(1e-30), 0.0)
        w = torch.clamp(weight[-1] * ratio, max=1.0)
        weight.append(w)
        if i < L:
            m = (w[:, None] * P[:, i] - Q[:, i]).clamp(min=0).sum(-1)
            h = torch.where(m > 0, torch.clamp(m / (m + (1.0 - w)).clamp_min(1e-30), max=1.0), 0.0)
        else:
            h = w
        tau = torch.where(unif[:, i] < h, i, tau)

    w_tau = torch.stack(weight, dim=1).gather(1, tau[:, None])  # (B, 1)
    rows = torch.arange(B, device=device)
    P_tau, Q_tau = P[rows, tau], Q[rows, tau]
    resid = torch.where((tau == L)[:, None], P_tau, (w_tau * P_tau - Q_tau).clamp(min=0))
    bonus = _sample_residual(resid, P_tau, uniform_samples_for_final_sampling.to(torch.float32))

    node = torch.arange(W, device=device)[None, :]
    on_path = node <= tau[:, None]
    accept_index = torch.where(node[:, :L + 1] <= tau[:, None], ri[:, :L + 1], NO_NODE).to(torch.int32)
    if L < num_steps:
        accept_index = torch.cat([accept_index, accept_index.new_full((B, num_steps - L), NO_NODE)], dim=1)
    next_tok = torch.cat([tok[:, 1:], tok[:, :1]], dim=1)  # node i's child token (the last column is not read)
    value = torch.where(node == tau[:, None], bonus[:, None], next_tok)
    predict = torch.full((B * W + 1,), NO_NODE, dtype=torch.int32, device=device)  # last slot: write sink
    predict.scatter_(0, torch.where(on_path, ri, B * W).flatten(), value.flatten().to(torch.int32))
    return predict[: B * W], accept_index.contiguous(), tau.to(torch.int32)
