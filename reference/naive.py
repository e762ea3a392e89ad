"""The naive oracles of the tree ops: per-request, per-node Python loops that read like SGLang's CUDA kernels,
with the same signatures and output contracts as the vectorised ops they check (`reference.tree`,
`reference.verify`), as flash-linear-attention keeps ``naive.py`` beside its kernels. Slow (host syncs
everywhere): for tests. They share nothing with the ops but the argument checks.
"""

from __future__ import annotations

import torch

from specdec.ops.op_checks import (check_bitmask_args, check_build_tree_args, check_penalty_args,
                                   check_sampling_args, check_tree_args, check_verify_greedy_args)

__all__ = ["apply_penalties_tree_naive", "apply_token_bitmask_naive", "build_tree_naive", "sample_residual_naive",
           "tree_speculative_sampling_target_only_naive", "verify_tree_greedy_naive"]


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


def sample_residual_naive(resid: torch.Tensor, row: torch.Tensor, u: torch.Tensor) -> int:
    """resid, row (V,) float32 >= 0, u () float32 -> int. One row of `reference.verify._sample_residual`, by a
    loop."""
    V = resid.shape[0]
    if not bool(resid.sum() > 0):
        resid = row
    cdf = torch.cumsum(resid, dim=0)
    thr = u * cdf[-1]
    for v in range(V):
        if bool(cdf[v] > thr):
            return v
    for v in range(V - 1, -1, -1):
        if bool(resid[v] > 0):
            return v
    return V - 1


def verify_tree_greedy_naive(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    num_steps: int,
):
    """Same shapes and semantics as ``verify_tree_greedy``.

    A plain per-request loop that reads like SGLang's CUDA kernel (``VerifyTreeGreedy``).
    Slow (host syncs everywhere): for tests.
    """
    B, W = check_verify_greedy_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling,
                                    target_predict, num_steps)
    S = num_steps
    device = candidates.device
    cand = candidates.tolist()
    ri = retrieve_index.tolist()
    nxt = retrieve_next_token.tolist()
    sib = retrieve_next_sibling.tolist()
    tp = target_predict.reshape(-1).tolist()

    predict = [-1] * (B * W)
    accept_index = [[-1] * (S + 1) for _ in range(B)]
    accept_length = [0] * B
    for b in range(B):
        last = ri[b][0]
        accept_index[b][0] = last
        num_accepted = 0
        cur = 0
        for _ in range(S):
            child = nxt[b][cur]
            hops = 0
            while child != -1 and hops < W:
                if cand[b][child] == tp[last]:
                    predict[last] = tp[last]
                    num_accepted += 1
                    accept_index[b][num_accepted] = ri[b][child]
                    last = ri[b][child]
                    cur = child
                    break
                child = sib[b][child]
                hops += 1
            if child == -1 or hops == W:
                break
        accept_length[b] = num_accepted
        predict[last] = tp[last]
    return (
        torch.tensor(predict, dtype=torch.int32, device=device),
        torch.tensor(accept_index, dtype=torch.int32, device=device).view(B, S + 1),
        torch.tensor(accept_length, dtype=torch.int32, device=device),
    )


def tree_speculative_sampling_target_only_naive(
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
    """Same shapes and semantics as ``tree_speculative_sampling_target_only``.

    A plain per-request loop that reads like sgl-kernel's ``TreeSpeculativeSamplingTargetOnly``
    (float32 scalar arithmetic, so its decisions match the vectorised version bit for bit).
    Slow (host syncs everywhere): for tests.
    """
    B, W = check_tree_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, num_steps)
    check_sampling_args(
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
    cand = candidates.tolist()
    ri = retrieve_index.tolist()
    nxt = retrieve_next_token.tolist()
    sib = retrieve_next_sibling.tolist()
    probs = target_probs.detach().to("cpu", torch.float32)
    unif = uniform_samples.detach().to("cpu", torch.float32)
    unif_final = uniform_samples_for_final_sampling.detach().to("cpu", torch.float32)

    predict = [-1] * (B * W)
    accept_index = [[-1] * (S + 1) for _ in range(B)]
    accept_length = [0] * B
    for b in range(B):
        last = ri[b][0]
        accept_index[b][0] = last
        num_accepted = 0
        cur = 0
        prob_acc = torch.zeros((), dtype=torch.float32)
        coin = unif[b, 0]
        rejected_here: list[int] = []  # tokens rejected at the current node
        for _ in range(S):
            child = nxt[b][cur]
            hops = 0
            while child != -1 and hops < W:
                tok = cand[b][child]
                p = probs[b, cur, tok]
                prob_acc = prob_acc + p
                if bool(coin < prob_acc / threshold_acc) or bool(p >= threshold_single):
                    predict[last] = tok
                    num_accepted += 1
                    accept_index[b][num_accepted] = ri[b][child]
                    last = ri[b][child]
                    cur = child
                    prob_acc = torch.zeros((), dtype=torch.float32)
                    coin = unif[b, child]
                    rejected_here = []
                    break
                rejected_here.append(tok)
                child = sib[b][child]
                hops += 1
            if child == -1 or hops == W:
                break
        accept_length[b] = num_accepted
        row = probs[b, cur].clamp(min=0)
        resid = row.clone()
        for tok in rejected_here:
            resid[tok] = 0.0
        predict[last] = sample_residual_naive(resid, row, unif_final[b])
    return (
        torch.tensor(predict, dtype=torch.int32, device=device),
        torch.tensor(accept_index, dtype=torch.int32, device=device).view(B, S + 1),
        torch.tensor(accept_length, dtype=torch.int32, device=device),
    )


def apply_penalties_tree_naive(logits, candidates, tree_mask, output_counts, prompt_mask, output_lens,
                               frequency_penalties, presence_penalties, repetition_penalties, min_new_tokens,
                               stop_mask, logit_bias):
    """Same shapes and semantics as ``apply_penalties_tree``.

    Per node: the tokens on its path (its ancestors below the root, itself included) are counted into a dict
    over the committed counts, and each penalty is applied token by token in float32, as SGLang's penalizers
    apply them one after another (frequency and presence, min_new_tokens, repetition, logit bias)."""
    B, R, W, V = check_penalty_args(logits, candidates, tree_mask, output_counts, prompt_mask, output_lens,
                                    frequency_penalties, presence_penalties, repetition_penalties, min_new_tokens,
                                    stop_mask, logit_bias)
    out = logits.float().clone().view(B, R, V)
    for b in range(B):
        committed = {v: int(c) for v, c in enumerate(output_counts[b].tolist()) if c}
        freq, pres = float(frequency_penalties[b]), float(presence_penalties[b])
        rep = float(repetition_penalties[b])
        for i in range(R):
            path = [] if tree_mask is None else [j for j in range(1, W) if bool(tree_mask[b, i, j])]
            counts = dict(committed)
            for j in path:
                t = int(candidates[b, j])
                counts[t] = counts.get(t, 0) + 1
            row = out[b, i]
            for t, c in counts.items():
                row[t] = row[t] - torch.tensor(freq * c + pres, dtype=torch.float32)
            if int(output_lens[b]) + len(path) < int(min_new_tokens[b]):
                row[stop_mask[b]] = float("-inf")
            for t in set(counts) | set(torch.nonzero(prompt_mask[b]).flatten().tolist()):
                row[t] = row[t] / rep if row[t] > 0 else row[t] * rep
            row += logit_bias[b].float()
    return out.view(B * R, V)


def apply_token_bitmask_naive(logits, bitmask):
    """Same shapes and semantics as ``apply_token_bitmask``: token by token, read its word and its bit as
    Python ints (the word's 32 bits as an unsigned number), -inf where the bit is 0."""
    N, V = check_bitmask_args(logits, bitmask)
    out = logits.float().clone()
    for n in range(N):
        words = [w & 0xFFFFFFFF for w in bitmask[n].tolist()]
        for v in range(V):
            if not (words[v // 32] >> (v % 32)) & 1:
                out[n, v] = float("-inf")
    return out
