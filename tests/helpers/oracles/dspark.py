"""The DSpark drafter written out in float64 from a checkpoint's raw tensors (DeepSpec's names): the block forward
(DFlash's, every position proposing), the Markov head chosen token after token, the confidence head and its cap."""
from __future__ import annotations

import torch

from .dflash import block_hidden_from_tensors


def dspark_block_from_tensors(sd: dict, cfg: dict, features, root: int, S: int, threshold: float = 0.0,
                              proposals=None):
    """One request's block: the context features (Tc, F*H) at positions 0..Tc-1, the block [root, mask * (S-1)] at
    Tc..Tc+S-1 -> (proposals [d_1..d_S], refined logits (S, V), confidence logits (S,) or None, the confident
    length). Position j's logits are lm_head(h_j) plus the Markov bias of the token before it (root for j = 0; for
    an rnn head also of the recurrent state, zero at j = 0, updated at every position from the token before it and
    h_j), d_{j+1} their argmax unless `proposals` gives the tokens (a sampled block); its confidence reads h_j and that
    token's Markov embedding (never the state). The confident length is the number of leading positions whose
    sigmoid(confidence) is at least `threshold` (S for a threshold of 0 or no confidence head)."""
    f64 = {k: v.double() for k, v in sd.items()}
    block = [root] + [cfg["mask_token_id"]] * (S - 1)
    hidden = block_hidden_from_tensors(sd, cfg, f64["embed_tokens.weight"], features, block)
    base = hidden @ f64["lm_head.weight"].T
    rank, kind = cfg.get("markov_rank", 0), cfg.get("markov_head_type")
    chosen, logits, confidence, prev = [], [], [], root
    state = torch.zeros(rank, dtype=torch.float64)  # the rnn head's, zero before the block's first position
    for j in range(S):
        row = base[j].clone()
        e = f64["markov_head.markov_w1.weight"][prev] if rank else None
        if rank:
            latent = e
            if kind == "gated":
                gate = torch.cat([hidden[j], e]) @ f64["markov_head.gate_proj.weight"].T
                latent = e * torch.sigmoid(gate + f64["markov_head.gate_proj.bias"])
            elif kind == "rnn":  # rows 0..r-1 of joint_proj the gate, r..2r-1 the candidate, 2r..3r-1 the output
                z = f64["markov_head.joint_proj.weight"] @ torch.cat([state, e, hidden[j]])
                z = z + f64["markov_head.joint_proj.bias"]
                keep = 1 / (1 + torch.exp(-z[:rank]))
                state = keep * state + (1 - keep) * torch.tanh(z[rank:2 * rank])
                latent = torch.tanh(z[2 * rank:])
            row = row + f64["markov_head.markov_w2.weight"] @ latent
        if cfg.get("enable_confidence_head"):
            x = torch.cat([hidden[j], e]) if cfg.get("confidence_head_with_markov") else hidden[j]
            confidence.append(float(f64["confidence_head.proj.weight"][0] @ x + f64["confidence_head.proj.bias"][0]))
        logits.append(row)
        prev = int(row.argmax()) if proposals is None else int(proposals[j])
        chosen.append(prev)
    length = S
    if confidence and threshold > 0:
        below = [j for j, c in enumerate(confidence) if 1 / (1 + torch.exp(torch.tensor(-c)).item()) < threshold]
        length = below[0] if below else S
    return chosen, torch.stack(logits), (torch.tensor(confidence, dtype=torch.float64) if confidence else None), length
