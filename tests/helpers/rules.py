"""A verify rule of the tests' own, registered from outside the package: Medusa's typical acceptance (Cai et al.,
2024), which accepts a drafted token x when p(x) > min(epsilon, delta * exp(-H(p))), H the entropy of the target's
distribution p at the node, and draws the bonus token from p. It is lossy: the checker must flag it."""
from __future__ import annotations

import torch

from specdec.ops.contract import NO_NODE

EPSILON, DELTA = 0.3, 0.6


def typical_acceptance(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling,
                       uniform_samples_for_final_sampling, target_probs, num_steps):
    """SGLang's verify contract (see `reference.verify`), deciding each node by typical acceptance: the walk moves to
    the first child in sibling order whose token clears the threshold, at most `num_steps` deep; the bonus token is
    drawn from the last accepted node's p by inverse CDF with the final coin. Per-request loops: a test's rule."""
    B, W = candidates.shape
    p = target_probs.double().clamp(min=0)
    p = p / p.sum(-1, keepdim=True)
    entropy = -(p * p.clamp(min=1e-30).log()).sum(-1)
    threshold = torch.clamp(DELTA * torch.exp(-entropy), max=EPSILON)
    predict = torch.full((B * W,), NO_NODE, dtype=torch.int32)
    accept_index = torch.full((B, num_steps + 1), NO_NODE, dtype=torch.int32)
    accept_length = torch.zeros(B, dtype=torch.int32)
    tok, nxt, sib = candidates.tolist(), retrieve_next_token.tolist(), retrieve_next_sibling.tolist()
    ri, final = retrieve_index.tolist(), uniform_samples_for_final_sampling.tolist()
    for b in range(B):
        node, path = 0, [0]
        while len(path) <= num_steps:
            child = nxt[b][node]
            while child >= 0 and not p[b, node, tok[b][child]] > threshold[b, node]:
                child = sib[b][child]
            if child < 0:
                break
            predict[ri[b][node]] = tok[b][child]
            node = child
            path.append(node)
        cdf = p[b, node].cumsum(0)
        predict[ri[b][node]] = min(int((cdf <= final[b] * cdf[-1]).sum()), p.shape[-1] - 1)
        accept_index[b, :len(path)] = torch.tensor([ri[b][n] for n in path], dtype=torch.int32)
        accept_length[b] = len(path) - 1
    return predict.to(candidates.device), accept_index.to(candidates.device), accept_length.to(candidates.device)


#: its record's fields: no draft distribution read, lossy, chains and trees
TYPICAL = dict(name="typical", label="typical acceptance (Medusa)", op=typical_acceptance, reads_draft=False,
               lossless=False)
