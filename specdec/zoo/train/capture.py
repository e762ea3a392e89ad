"""Capturing what a target reads while it writes: a wrapper the engine's target-only path runs, keeping every
forward's residual streams (and the target's top-k next-token probabilities), assembled per conversation.

`record_conversations(target, prompts, layers, ...)` decodes a batch and returns each conversation's tokens with the
streams entering `layers` at every token; `record` writes them as a recording, `shards` as resumable shards.
"""
from __future__ import annotations

import numpy as np
import torch

from ... import Engine, SamplingParams
from ...models.outputs import ModelOutput


class _RecordingTarget:
    """Wraps a target for the engine: every forward also returns the recorded layers' streams, which are kept
    (tokens, positions, features and, with topk > 0, the target's top-k next-token ids and probabilities, on the
    host) while the engine sees the target's usual output."""

    def __init__(self, target, layers, topk: int = 0):
        self._target, self.layers, self.topk, self.calls = target, tuple(layers), topk, []

    def __getattr__(self, name):
        return getattr(self._target, name)

    def __call__(self, input_ids, positions, cache=None, meta=None, return_logits=True, features=None):
        if features is not None:
            raise ValueError("a recording target serves the target-only path, which asks for no features")
        out = self._target(input_ids, positions, cache, meta, return_logits=return_logits, features=self.layers)
        arrays = [out.features.to(torch.float16).cpu()]
        if self.topk and out.logits is not None:  # a decode step: one row a request
            arrays += self._topk(out.logits)
        elif self.topk:  # the prefill: only each prompt's last row is read (`compute_logits`), the others stay -1
            B, T = input_ids.shape
            arrays += [torch.full((B, T, self.topk), -1, dtype=torch.int32),
                       torch.zeros(B, T, self.topk, dtype=torch.float16)]
        self.calls.append((input_ids.cpu(), positions.cpu(), arrays))
        return ModelOutput(out.logits, out.hidden, None)

    def compute_logits(self, hidden):
        """The prefill's last rows (B, H) -> logits; their top-k kept for `_assemble` to place at each prompt's
        last token."""
        logits = self._target.compute_logits(hidden)
        if self.topk:
            self.prefill_last = self._topk(logits)
        return logits

    def _topk(self, logits):
        probs, ids = torch.softmax(logits.float(), dim=-1).topk(self.topk, dim=-1)
        return [ids.to(torch.int32).cpu(), probs.to(torch.float16).cpu()]


def _assemble(calls, prompts, outputs, prefill_last=None):
    """The engine's forwards -> per conversation (tokens (n,), [features (n - 1, F), ...]): the prefill is call 0
    (row b = request b); decode step s feeds request r its token s - 1, for the requests still running
    (len(output) > s), in request order (the engine drops finished rows and keeps the order). prefill_last: the
    arrays of each prompt's last row, placed there in the prefill's arrays 1, 2, ..."""
    ids0, _, a0 = calls[0]
    for k, rows in enumerate(prefill_last or (), start=1):
        a0[k] = a0[k].clone()  # made in inference mode, which forbids writing outside it
        for r, p in enumerate(prompts):
            a0[k][r, len(p) - 1] = rows[r]
    seqs = []
    for r, (p, o) in enumerate(zip(prompts, outputs)):
        if not torch.equal(ids0[r, :len(p)], torch.tensor(p)):
            raise RuntimeError("recording: the prefill rows are not the prompts in order")
        seqs.append((list(p) + list(o), [[a[r, :len(p)]] for a in a0]))
    for s, (ids, pos, arrays) in enumerate(calls[1:], start=1):
        active = [r for r, o in enumerate(outputs) if len(o) > s]
        if ids.shape[0] != len(active):
            raise RuntimeError(f"recording: decode step {s} has {ids.shape[0]} rows for {len(active)} requests")
        for b, r in enumerate(active):
            if int(ids[b, 0]) != outputs[r][s - 1] or int(pos[b, 0]) != len(prompts[r]) + s - 1:
                raise RuntimeError(f"recording: decode step {s} row {b} is not request {r}'s token {s - 1}")
            for k, a in enumerate(arrays):
                seqs[r][1][k].append(a[b, :1])
    return [(np.asarray(t[:-1], dtype=np.int32), [torch.cat(parts).numpy() for parts in per_array])
            for t, per_array in seqs]


def record_conversations(target, prompts, layers, max_new_tokens: int, temperatures, batch_size: int = 16,
                         seed: int = 0, stop_token_ids=(), topk: int = 0):
    """prompts: token id lists (at most batch_size); temperatures: one per prompt (0: greedy) -> (per conversation
    (tokens (n,) int32, [features (n, F*H) float16, and with topk: top-k ids (n, topk) int32, probabilities
    (n, topk) float16]), the answers' token ids): each conversation is its prompt and the target's answer (up to
    max_new_tokens, ending at a stop id) without its last token, with the streams entering `layers` at every token
    and the target's next-token distribution after it."""
    if len(temperatures) != len(prompts):
        raise ValueError(f"got {len(temperatures)} temperatures for {len(prompts)} prompts")
    rec = _RecordingTarget(target, layers, topk)
    engine = Engine(rec, max_batch=batch_size, max_seq_len=max(len(p) for p in prompts) + max_new_tokens + 1)
    params = [SamplingParams(max_new_tokens=max_new_tokens, temperature=t, stop_token_ids=list(stop_token_ids))
              for t in temperatures]
    outs = engine.generate(prompts, params, seed=seed)
    answers = [o.token_ids for o in outs]
    return _assemble(rec.calls, prompts, answers, getattr(rec, "prefill_last", None)), answers


