"""Penalties applied by hand in float64: plain decoding and the exact law of sampled sequences under them."""
from __future__ import annotations


import math

import torch


def penalised_row64(logits_row, prompt, output, sp) -> torch.Tensor:
    """One next-token logits row after `sp`'s penalties, as plain decoding applies them having emitted `output`
    after `prompt`: float64, token by token, in SGLang's order (frequency and presence over the output,
    min_new_tokens on the stop ids, repetition over prompt and output, then the logit bias)."""
    row = torch.as_tensor(logits_row, dtype=torch.float64).clone()
    counts: dict[int, int] = {}
    for t in output:
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        row[t] -= sp.frequency_penalty * c + sp.presence_penalty
    if len(output) < sp.min_new_tokens:
        for t in sp.stop_token_ids:
            row[t] = -math.inf
    for t in set(prompt) | set(counts):
        row[t] = row[t] / sp.repetition_penalty if row[t] > 0 else row[t] * sp.repetition_penalty
    for t, bias in (sp.logit_bias or {}).items():
        row[int(t)] += bias
    return row


def penalised_greedy_decode(target, prompt, sp) -> tuple[list[int], list[float]]:
    """Greedy plain decoding under `sp`'s penalties: one full forward per token (no cache), the penalties by
    `penalised_row64`; stops at a stop id or max_new_tokens. -> (tokens, logprobs of each, float64)."""
    out, logprobs = [], []
    for _ in range(sp.max_new_tokens):
        seq = prompt + out
        with torch.no_grad():
            logits = target(torch.tensor([seq]), torch.arange(len(seq))[None]).logits[0, -1]
        row = penalised_row64(logits, prompt, out, sp)
        tok = int(row.argmax())
        logprobs.append(float(torch.log_softmax(row, -1)[tok]))
        out.append(tok)
        if tok in sp.stop_token_ids:
            break
    return out, logprobs
