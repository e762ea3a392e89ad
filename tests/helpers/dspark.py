"""The DSpark drafter's block for one request through the path the worker runs (the context in a KV cache, the block
as in-flight slots over it), for the tests that hold it against an oracle."""
from __future__ import annotations

import torch

import reference
from specdec.kv_cache import KVCache
from specdec.models.layers import AttentionMetadata


@torch.no_grad()
def block_through_cache(model, feats, root: int, S: int):
    """feats (1, Tc, F*H) the target's features of the committed tokens -> (proposals [d_1..d_S] along the argmax
    chain, refined logits (S, V), confidence logits (S,) or None, confident length at the model's threshold)."""
    Tc = feats.shape[1]
    cache = KVCache.for_model(model.config, model.config.num_hidden_layers, 1, Tc + S + 8, torch.float32, "cpu")
    slots = torch.tensor([0])
    model.write_context(feats, torch.arange(Tc)[None], cache,
                        AttentionMetadata(slots, torch.tensor([0]), attn_len=Tc, ops=reference))
    meta = AttentionMetadata(slots, torch.tensor([Tc]), attn_len=Tc + S, ops=reference,
                             tree_mask=torch.ones(1, S, S, dtype=torch.bool))
    block = torch.tensor([[root] + [model.mask_token_id] * (S - 1)])
    hidden = model(block, Tc + torch.arange(S)[None], cache, meta, return_logits=False).hidden[0]
    base = model.compute_logits(hidden)
    prev, tokens, rows, state = torch.tensor(root), [], [], None
    for j in range(S):
        row, state = model.refine_step(base[j], prev, hidden[j], state)
        rows.append(row)
        prev = row.argmax()
        tokens.append(int(prev))
    before = torch.tensor([root] + tokens[:-1])
    confidence = model.confidence_logits(hidden, before)
    length = int(model.confident_length(confidence[None], S)[0]) if confidence is not None else S
    return tokens, torch.stack(rows), confidence, length
