"""Logit tables as models the engine runs: a bigram table (the next token's logits a function of the current token)
becomes a one-layer Llama whose attention and MLP add nothing, usable as a target or as a STANDALONE draft LM."""
from __future__ import annotations

import torch

from ..models.llama import LlamaForCausalLM, random_llama


def table_model(logits, max_position_embeddings: int = 256) -> LlamaForCausalLM:
    """A `LlamaForCausalLM` whose next-token logits after token x are `logits[x]` (a (V, V) table) whatever came
    before it, up to float32 rounding: the embedding of x is the x-th unit vector, the decoder layer's attention and
    MLP outputs are zero (the residual carries the embedding through), the final norm scales it back to the unit
    vector and the LM head's column x is the table's row x. -inf entries become -1e4 (a probability of 0 in float32
    after any softmax the engine applies)."""
    table = torch.as_tensor(logits, dtype=torch.float64)
    if table.ndim != 2 or table.shape[0] != table.shape[1] or table.shape[0] < 2:
        raise ValueError(f"logits must be a (V, V) table with V >= 2, got shape {tuple(table.shape)}")
    if torch.isnan(table).any() or (table == float("inf")).any():
        raise ValueError("logits must be finite or -inf")
    V = table.shape[0]
    H = 4 * -(-V // 4)  # two heads of an even head dimension
    model = random_llama(vocab_size=V, hidden_size=H, intermediate_size=4, num_hidden_layers=1, num_attention_heads=2,
                         max_position_embeddings=max_position_embeddings, seed=0)
    eps = model.config.rms_norm_eps
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, :V] = torch.eye(V)
        model.model.norm.weight.fill_((1.0 / H + eps) ** 0.5)  # RMSNorm(e_x) = e_x / sqrt(1/H + eps)
        head = torch.zeros(V, H, dtype=torch.float64)
        head[:, :V] = table.clamp(min=-1e4).T
        model.lm_head.weight.copy_(head)
    return model
