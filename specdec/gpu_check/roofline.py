"""What one decode step must read, and the fraction of the measured read ceiling a measured step reaches: the
`bytes_per_step` ... `frac_of_read_ceiling` columns of every end-to-end row of `specdec gpu-check` (e2e.csv).

A decode step at small batch is bound by memory reads: every weight matrix a forward touches is read once per
forward, and each request's KV cache up to its context once per forward. `min_step_bytes` is that count (the
arithmetic, in one place); `step_reads` finds its inputs on an engine's worker, per draft kind; `roofline_fields`
turns a measured step time into the columns. The ceiling is the environment part's read-only probe
(`bandwidth.read_sum`, kernels.csv op `device_read`).
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..workers.hot_vocab import HotVocabDraft


def min_step_bytes(target_weights: int, target_kv_per_token: int, batch_size: int, context_len: float,
                   draft_weights: int = 0, draft_forwards: int = 0, draft_kv_per_token: int = 0) -> float:
    """The bytes one decode step reads at least:

        bytes = W_t + B * L * KV_t + F * (W_d + B * L * KV_d)

    W_t: the target's weights one forward reads (`forward_weight_bytes`: every parameter but an untied input
    embedding, which a forward gathers only its tokens' rows of; a tied embedding is the LM head, counted once);
    KV_t: the target cache's bytes per token of one request (keys and values of every layer); B: the batch size;
    L: the context length (committed tokens per request, the mean over the measured steps); F: the draft forwards
    a step runs (0 without a draft); W_d and KV_d: the weights and the draft cache's bytes per token one draft
    forward reads (the target's LM head among W_d when the draft borrows it: each forward that makes logits reads
    it again). The verify forward reads the weights once whatever its width, so W (num_draft_tokens) is not a
    factor. Activations, logits and the writes are left out: at decode sizes they are a small fraction."""
    return (target_weights + batch_size * context_len * target_kv_per_token
            + draft_forwards * (draft_weights + batch_size * context_len * draft_kv_per_token))


def forward_weight_bytes(model) -> int:
    """Bytes of the parameters one forward of `model` reads in full: each tensor once (a tied one too), except the
    tables only an `nn.Embedding` reads (a gather of the step's rows, not the table)."""
    read = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            held = read.setdefault(id(p), [p, False])
            held[1] = held[1] or not isinstance(module, nn.Embedding)
    return sum(p.numel() * p.element_size() for p, whole in read.values() if whole)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Keys and values of one token of one request, over every layer of a cache."""
    return 2 * num_layers * num_kv_heads * head_dim * itemsize


def cache_bytes_per_token(cache) -> int:
    """A `KVCache`'s bytes per token of one request (its buffer is (2, layers, rows, max_seq_len, heads, dim))."""
    return cache.kv[:, :, 0, 0].numel() * cache.kv.element_size()


@dataclass(frozen=True)
class StepReads:
    """`min_step_bytes`' inputs other than B and L."""

    target_weights: int
    target_kv_per_token: int
    draft_weights: int = 0
    draft_forwards: int = 0
    draft_kv_per_token: int = 0

    def bytes(self, batch_size: int, context_len: float) -> float:
        return min_step_bytes(self.target_weights, self.target_kv_per_token, batch_size, context_len,
                              self.draft_weights, self.draft_forwards, self.draft_kv_per_token)


def target_reads(target) -> StepReads:
    """A target-only step of `target` (a specdec or a transformers Llama: their parameters are the same)."""
    c = target.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = kv_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads or c.num_attention_heads, head_dim,
                            next(target.parameters()).element_size())
    return StepReads(forward_weight_bytes(target), kv)


def step_reads(worker) -> StepReads:
    """An engine's worker -> what its decode step reads (`min_step_bytes`), by its draft's kind
    (`DraftKind.forwards_per_step`, `DraftKind.layers_per_forward`); ValueError for a kind that states no rule."""
    target = target_reads(worker.target)
    kind = getattr(worker, "draft_kind", None)
    if kind is None:
        return target
    if kind.forwards_per_step is None:
        raise ValueError(f"no bytes-per-step rule for draft kind {kind.name!r} (its forwards_per_step is None)")
    forwards, layers = kind.forwards_per_step(worker.num_steps), kind.layers_per_forward
    if forwards == 0:
        return target
    draft, hot_head = worker.draft_model, None
    if isinstance(draft, HotVocabDraft):  # a token map: its n rows replace whichever full head the logits read
        draft, hot_head = draft.draft, draft.lm_head.weight
    draft = getattr(draft, "lm", draft)  # STANDALONE's view of its LM
    own = forward_weight_bytes(draft)
    kv = cache_bytes_per_token(worker.draft_cache)
    if layers == "one":
        own, kv = own / len(draft.layers), kv / forwards  # the draft cache holds the num_steps layers that run
    own_head = next((p for name, p in draft.named_parameters() if name.endswith("lm_head.weight")), None)
    if hot_head is not None:
        if own_head is not None:
            own -= own_head.numel() * own_head.element_size()
        own += hot_head.numel() * hot_head.element_size()
    elif own_head is None:
        head = worker.target.lm_head.weight
        own += head.numel() * head.element_size()  # logits through the target's head, read again each forward
    return StepReads(target.target_weights, target.target_kv_per_token, round(own), forwards, round(kv))


def roofline_fields(bytes_per_step: float | str, step_s: float | str, ceiling_gbps: float | str,
                    context_len: float | str) -> dict:
    """The DecodeRow columns of a measured step: its time, its bytes and the rate they were read at, and that rate
    over the read ceiling ('' where a figure is missing)."""
    fields = dict(context_len=context_len, step_us="", bytes_per_step=bytes_per_step, read_gbps="",
                  read_ceiling_gbps=ceiling_gbps, frac_of_read_ceiling="")
    if isinstance(step_s, (int, float)) and step_s > 0:
        fields["step_us"] = step_s * 1e6
        if isinstance(bytes_per_step, (int, float)):
            fields["read_gbps"] = bytes_per_step / step_s / 1e9
            if isinstance(ceiling_gbps, (int, float)) and ceiling_gbps > 0:
                fields["frac_of_read_ceiling"] = fields["read_gbps"] / ceiling_gbps
    return fields


def blank_roofline() -> dict:
    return roofline_fields("", "", "", "")
