"""Random batches for the logprob helper: mixed greedy and sampled requests, padded and permuted accept rows."""
from __future__ import annotations


import random

import torch

from specdec.ops.logprob_types import LogitsOutput, SamplingInfo, SpecBatch

from .distributions import NEG_INF


def random_logprob_case(seed: int, dtype: torch.dtype, **force):
    """A random batch mixing greedy and sampled requests, padded and permuted accept rows,
    -inf logits, top_logprobs_num in {0, 1, 5, 20} and ragged / None token id lists."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    B = force.get("B", rng.randint(1, 4))
    S = force.get("S", rng.randint(0, 4))
    W = force.get("W", S + 1 + rng.randint(0, 3))
    V = force.get("V", rng.choice([20, 23, 48]))

    logits = torch.rand(B * W, V, generator=g, dtype=torch.float32) * 6 - 3
    p_mask = rng.choice([0.0, 0.1, 0.5])
    logits[torch.rand(B * W, V, generator=g) < p_mask] = NEG_INF
    if rng.random() < 0.3:  # an occasional fully masked row
        logits[rng.randrange(B * W)] = NEG_INF
    logits = logits.to(dtype)

    greedy = [rng.random() < 0.4 for _ in range(B)]
    temps = [1.0 if gr else rng.uniform(0.1, 2.0) for gr in greedy]
    top_nums = [rng.choice([0, 1, 5, 20]) for _ in range(B)]
    token_ids = []
    for _ in range(B):
        c = rng.random()
        if c < 0.3:
            token_ids.append(None)
        elif c < 0.4:
            token_ids.append([])
        else:
            token_ids.append([rng.randrange(V) for _ in range(rng.randint(1, 6))])  # duplicates allowed

    # accept_index: request b's accepted nodes, in a random (permuted) order, in block blk[b];
    # sometimes the blocks themselves are permuted across requests.
    blk = list(range(B))
    if rng.random() < 0.3:
        rng.shuffle(blk)
    acc = []
    for b in range(B):
        a = rng.randint(0, min(S, W - 1))
        nodes = [0] + rng.sample(range(1, W), a)
        if rng.random() < 0.3:
            rng.shuffle(nodes)
        acc.append([blk[b] * W + n for n in nodes] + [-1] * (S - a))
    accept_index = torch.tensor(acc, dtype=torch.int32)
    predict = torch.randint(0, V, (B * W,), generator=g, dtype=torch.int32)

    batch = SpecBatch(
        seq_lens=torch.randint(1, 100, (B,), generator=g),
        sampling_info=SamplingInfo(
            temperatures=torch.tensor(temps, dtype=torch.float32).reshape(B, 1),
            is_all_greedy=all(greedy),
        ),
        top_logprobs_nums=top_nums,
        token_ids_logprobs=token_ids,
    )
    return batch, LogitsOutput(next_token_logits=logits), predict, accept_index, S
