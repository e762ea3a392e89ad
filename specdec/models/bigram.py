"""Targets whose next token depends (mostly) on the current token alone, and drafts that predict them exactly.

With attention and MLP outputs zeroed, a Llama's next-token distribution is a function of its current token
(`bigram_target`); scaled down instead of zeroed, mostly so (`near_bigram_target`). An EAGLE head or MTP layers
that pass the token embedding through and add nothing (`perfect_eagle`, `perfect_mtp`) then predict exactly what
a bigram target will, but only when the worker feeds them the right token at the right step: the alignment
check of every worker (a perfect draft's chain or tree is accepted in full), and drafts whose steps accept
several tokens on any device, without a trained checkpoint.
"""
from __future__ import annotations

import torch

from .eagle import random_eagle_head
from .llama import random_llama
from .mtp import random_mtp


def bigram_target(seed=0, vocab_size=64, hidden_size=32, num_hidden_layers=2, **kw):
    """A random Llama whose attention and MLP outputs are zeroed: its next-token distribution depends only on the
    current token."""
    return near_bigram_target(seed, 0.0, vocab_size, hidden_size, num_hidden_layers, **kw)


def near_bigram_target(seed=0, mix=0.3, vocab_size=64, hidden_size=32, num_hidden_layers=2, **kw):
    """A random Llama whose attention and MLP outputs are scaled by `mix`: mostly bigram, so a bigram-perfect draft
    is often but not always right, and the target still reads its context."""
    t = random_llama(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                     seed=seed, **kw)
    with torch.no_grad():
        for layer in t.model.layers:
            layer.self_attn.o_proj.weight.mul_(mix)
            layer.mlp.down_proj.weight.mul_(mix)
    return t


def perfect_eagle(target, seed=0):
    """An EAGLE head that predicts exactly what a bigram target will: fc passes the token embedding through, the
    decoder layer adds nothing, the norm is the target's final norm."""
    d = random_eagle_head(target, seed=seed)
    H = target.config.hidden_size
    with torch.no_grad():
        d.fc.weight.zero_()
        d.fc.weight[:, :H] = torch.eye(H)
        d.layers[0].self_attn.o_proj.weight.zero_()
        d.layers[0].mlp.down_proj.weight.zero_()
        d.norm.weight.copy_(target.model.norm.weight)
    return d


def perfect_mtp(target, num_layers, chain_hidden_states, seed=0):
    """MTP layers that predict exactly what a bigram target will (see `perfect_eagle`)."""
    d = random_mtp(target, num_layers, chain_hidden_states, seed=seed)
    H = target.config.hidden_size
    with torch.no_grad():
        for layer in d.layers:
            layer.eh_proj.weight.zero_()
            layer.eh_proj.weight[:, :H] = torch.eye(H)
            layer.enorm.weight.fill_(1.0)
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
            layer.shared_head.norm.weight.copy_(target.model.norm.weight)
    return d
