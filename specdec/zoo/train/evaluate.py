"""Held-out evaluation of the stored weights (fp32, no autocast: as inference runs): what the card reports."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import reference

from ...draft_kinds import DRAFT_KINDS
from ...kv_cache import KVCache
from ...models.eagle3 import Eagle3DraftHead
from ...models.layers import AttentionMetadata
from .. import corpus
from .loop import position_grid
from .block_stages import dflash_blocks
from .stages import draft_vocab_targets, eagle_unrolled, mtp_forward, ttt_mask

def heldout_tensor(n: int, length: int, seed: int = 4321) -> torch.Tensor:
    """(n, length) int64: the held-out windows the model card measures on (`corpus.heldout_windows`, seed 4321)."""
    return torch.from_numpy(corpus.heldout_windows(n, length, seed=seed))


@torch.no_grad()
def evaluate_target(target, windows: torch.Tensor) -> dict:
    """windows: (N, T+1) -> held-out next-token loss (nats/byte), bits/byte, top-1 accuracy."""
    x, y = windows[:, :-1], windows[:, 1:]
    logits = target(x, position_grid(*x.shape)).logits.float()
    loss = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))
    acc = float((logits.argmax(-1) == y).float().mean())
    return {"heldout_nats_per_byte": round(loss, 4), "heldout_bits_per_byte": round(loss / math.log(2), 4),
            "heldout_top1_accuracy": round(acc, 4)}


@torch.no_grad()
def evaluate_eagle(target, head, windows: torch.Tensor, depths: int = 5, *, seq_len: int | None = None) -> dict:
    """windows: (N, T+1) (with seq_len: their first seq_len + 1 bytes) -> per draft depth d = 1..depths:
    cross-entropy against the true next byte, cross-entropy against the target's distribution, and top-1
    agreement with the target's argmax (depth d = draft step d-1: d = 1 reads the target's hidden, d >= 2 the
    head's own output).

    An EAGLE-3 head is scored over its draft vocabulary: the target's distribution restricted to it and
    renormalised, the true byte where it is in it; agreement compares its mapped argmax with the target's
    over every position (a target argmax it cannot propose counts as a miss)."""
    windows = windows.to(next(target.parameters()).device)
    if seq_len is not None:
        windows = windows[:, :seq_len + 1]
    x = windows[:, :-1]
    B, T = x.shape
    out = target(x, position_grid(B, T, windows.device), features=getattr(head, "feature_layers", None))
    z, h = out.logits.float(), out.hidden if out.features is None else out.features
    outs = eagle_unrolled(head, h, windows[:, 1:], depths)
    tgt_arg = z.argmax(-1)
    p, _ = draft_vocab_targets(head, z)
    if isinstance(head, Eagle3DraftHead):
        true_in_vocab = head.t2d[windows[:, 2:]]
        true_draft = (torch.cumsum(head.t2d.long(), 0) - 1).clamp_min(0)[windows[:, 2:]]
    else:
        true_in_vocab, true_draft = torch.ones_like(windows[:, 2:], dtype=torch.bool), windows[:, 2:]
    to_target = getattr(head, "draft_to_target", lambda ids: ids)
    res = {}
    t = torch.arange(T, device=windows.device)[None, :]
    for j, (logits, _) in enumerate(outs):
        mask = ((t >= j) & (t <= T - 2)).expand(B, T)[:, :-1]
        lp = torch.log_softmax(logits[:, :-1], -1)
        ce_true = -lp.gather(-1, true_draft[..., None])[..., 0]
        ce_tgt = -(p[:, 1:] * lp).sum(-1)
        agree = (to_target(logits[:, :-1].argmax(-1)) == tgt_arg[:, 1:]).float()
        m, mt = mask.float(), (mask & true_in_vocab).float()
        res[f"depth{j + 1}"] = {"ce_true_nats": round(float((ce_true * mt).sum() / mt.sum()), 4),
                                "ce_target_nats": round(float((ce_tgt * m).sum() / m.sum()), 4),
                                "top1_agreement": round(float((agree * m).sum() / m.sum()), 4)}
    return res


@torch.no_grad()
def evaluate_mtp(target, model, windows: torch.Tensor, *, seq_len: int | None = None) -> dict:
    """windows: (N, T + S) (with seq_len: their first seq_len + S bytes) -> per layer k: cross-entropy against
    the true byte x_{t+k+2}, against the target's distribution, and top-1 agreement with the target's argmax."""
    windows = windows.to(next(target.parameters()).device)
    S = model.num_layers
    if seq_len is not None:
        windows = windows[:, :seq_len + S]
    T = windows.shape[1] - S
    z, h, _ = target(windows[:, :T], position_grid(windows.shape[0], T))
    outs = mtp_forward(model, h, windows, T)
    res = {}
    for k, (logits, _) in enumerate(outs):
        n = T - k - 1
        lp = torch.log_softmax(logits[:, :n], -1)
        ce_true = -lp.gather(-1, windows[:, k + 2:k + 2 + n, None])[..., 0]
        ce_tgt = -(torch.softmax(z[:, k + 1:k + 1 + n], -1) * lp).sum(-1)
        agree = (logits[:, :n].argmax(-1) == z[:, k + 1:k + 1 + n].argmax(-1)).float()
        res[f"layer{k + 1}"] = {"ce_true_nats": round(float(ce_true.mean()), 4),
                                "ce_target_nats": round(float(ce_tgt.mean()), 4),
                                "top1_agreement": round(float(agree.mean()), 4)}
    return res


class _UnrolledPasses:
    """One causal LM run pass after pass over the same T positions, each pass's keys kept: pass j at position t
    reads the pass-0 keys at s <= t - j, then pass i's key at t - j + i for 1 <= i <= j (`ttt_mask`), so it sees
    the sequence anchored at t - j and continued by the tokens fed at passes 1..j."""

    def __init__(self, model, batch_size: int, length: int, passes: int):
        self.model, self.B, self.T = model, batch_size, length
        self.cache = KVCache.for_model(model.config, model.config.num_hidden_layers, batch_size, passes * length,
                                       torch.float32, model.device)
        self.slots = torch.arange(batch_size, device=model.device)
        self.start = torch.zeros(batch_size, dtype=torch.long, device=model.device)

    def __call__(self, ids: torch.Tensor, j: int) -> torch.Tensor:
        """ids: (B, T) the tokens pass j reads -> its logits (B, T, V)."""
        B, T = self.B, self.T
        mask = None if j == 0 else ttt_mask(T, j, ids.device)[None].expand(B, T, (j + 1) * T)
        meta = AttentionMetadata(self.slots, self.start, attn_len=(j + 1) * T, ops=reference, write_offset=j * T,
                                 tree_mask=mask)
        return self.model(ids, position_grid(B, T, ids.device), self.cache, meta).logits.float()


@torch.no_grad()
def evaluate_draft_lm(target, lm, windows: torch.Tensor, depths: int = 5, *, seq_len: int | None = None,
                      chunk: int = 8) -> dict:
    """windows: (N, T+1) (with seq_len: their first seq_len + 1 bytes) -> per draft depth d = 1..depths: the draft
    LM's cross-entropy against the true next byte, against the target's distribution, and top-1 agreement with the
    target's argmax.

    A draft LM reads bytes only, so what changes with depth is what it reads: at depth d, anchored at position
    t, the held-out bytes up to t and then the target's d-1 greedy bytes after them, the path a greedy chain has
    accepted when it drafts at depth d; the target is scored on that same path (depth 1 is teacher forcing).
    The cross-entropy against the true byte counts the positions where that path is still the held-out text.
    Windows are run `chunk` at a time (the passes' attention masks grow with depth)."""
    windows = windows.to(next(target.parameters()).device)
    if seq_len is not None:
        windows = windows[:, :seq_len + 1]
    T = windows.shape[1] - 1
    # per depth: ce_true, n_true, ce_tgt, agree, n
    totals = [torch.zeros(5, dtype=torch.float64, device=windows.device) for _ in range(depths)]
    t = torch.arange(T, device=windows.device)[None, :]
    for w in windows.split(chunk):
        x, y = w[:, :-1], w[:, 1:]
        B = x.shape[0]
        target_passes, lm_passes = _UnrolledPasses(target, B, T, depths), _UnrolledPasses(lm, B, T, depths)
        ids, on_text = x, torch.ones(B, T, dtype=torch.bool, device=x.device)
        for j in range(depths):
            z, q = target_passes(ids, j), lm_passes(ids, j)
            valid = (t >= j).expand(B, T)
            lp = torch.log_softmax(q, -1)
            ce_true = -lp.gather(-1, y[..., None])[..., 0]
            ce_tgt = -(torch.softmax(z, -1) * lp).sum(-1)
            agree = (q.argmax(-1) == z.argmax(-1)).double()
            m, mt = valid.double(), (valid & on_text).double()
            totals[j] += torch.stack([(ce_true * mt).sum(), mt.sum(), (ce_tgt * m).sum(), (agree * m).sum(), m.sum()])
            # pass j + 1 at t reads the target's greedy byte of pass j at t - 1 (position 0 reads a filler no
            # counted query sees)
            greedy = z.argmax(-1)
            on_text = torch.cat([on_text[:, :1] & False, on_text[:, :-1] & (greedy[:, :-1] == x[:, 1:])], dim=1)
            ids = torch.cat([x[:, :1], greedy[:, :-1]], dim=1)
    return {f"depth{j + 1}": {"ce_true_nats": round(float(s[0] / s[1]), 4),
                              "ce_target_nats": round(float(s[2] / s[4]), 4),
                              "top1_agreement": round(float(s[3] / s[4]), 4)} for j, s in enumerate(totals)}


@torch.no_grad()
def evaluate_dflash(target, model, windows: torch.Tensor, *, seq_len: int | None = None, stride: int = 4,
                    chunk: int = 8) -> dict:
    """windows: (N, T) (with seq_len: their first seq_len bytes) -> per block position j = 1..bs-1, over blocks
    anchored every `stride` bytes (the block x_p then mask tokens over the context x_0..x_{p-1}, teacher-forced
    on the held-out text): cross-entropy against the true byte x_{p+j}, against the target's distribution, top-1
    agreement with the target's argmax, and `accept_prefix`, the fraction of blocks whose positions 1..j all agree
    (what a chain verify would accept on that text)."""
    windows = windows.to(next(target.parameters()).device)
    if seq_len is not None:
        windows = windows[:, :seq_len]
    T, bs = windows.shape[1], model.block_size
    anchors = torch.arange(1, T - bs + 1, stride)
    n = len(anchors)
    sums = torch.zeros(4, bs - 1, dtype=torch.float64, device=windows.device)
    count = 0
    for w in windows.split(chunk):
        B = w.shape[0]
        grid = position_grid(B, T, w.device)
        out = target(w, grid, features=model.feature_layers)
        positions, mask = dflash_blocks(T, anchors[None].expand(B, n).to(w.device), bs, w.device)
        ids = w.gather(1, positions)
        ids.view(B, n, bs)[:, :, 1:] = model.mask_token_id
        lp = torch.log_softmax(model.compute_logits(model.forward_dense(out.features, grid, ids, positions,
                                                                        mask)).float(), -1)
        lp = lp.view(B, n, bs, -1)[:, :, 1:]
        z = out.logits.gather(1, (positions - 1).clamp_min(0)[:, :, None].expand(-1, -1, out.logits.shape[-1]))
        z = z.view(B, n, bs, -1)[:, :, 1:]
        true = w.gather(1, positions).view(B, n, bs)[:, :, 1:]
        agree = (lp.argmax(-1) == z.argmax(-1)).double()
        sums += torch.stack([-lp.gather(-1, true[..., None])[..., 0].double().sum((0, 1)),
                             -(torch.softmax(z, -1) * lp).sum(-1).double().sum((0, 1)), agree.sum((0, 1)),
                             agree.cumprod(-1).sum((0, 1))])
        count += B * n
    r = sums / count
    return {f"pos{j + 1}": {"ce_true_nats": round(float(r[0, j]), 4), "ce_target_nats": round(float(r[1, j]), 4),
                            "top1_agreement": round(float(r[2, j]), 4), "accept_prefix": round(float(r[3, j]), 4)}
            for j in range(bs - 1)}


@torch.no_grad()
def evaluate_dspark(target, model, windows: torch.Tensor, *, seq_len: int | None = None, stride: int = 4,
                    chunk: int = 8) -> dict:
    """windows: (N, T) (with seq_len: their first seq_len bytes) -> per block position j = 1..bs (the proposal of
    x_{p+j}), over blocks anchored every `stride` bytes (the block x_p then mask tokens over the context x_0..x_{p-1},
    teacher-forced on the held-out text: the Markov head and the confidence head read the true x_{p+j-1}):
    cross-entropy against the true byte, against the target's distribution, top-1 agreement with the target's
    argmax, `accept_prefix` (the fraction of blocks whose positions 1..j all agree) and `confidence` (the mean
    estimated acceptance, beside the agreement it estimates; absent without a confidence head)."""
    windows = windows.to(next(target.parameters()).device)
    if seq_len is not None:
        windows = windows[:, :seq_len]
    T, bs = windows.shape[1], model.block_size
    anchors = torch.arange(1, T - bs, stride)
    n = len(anchors)
    sums = torch.zeros(5, bs, dtype=torch.float64, device=windows.device)
    count = 0
    for w in windows.split(chunk):
        B = w.shape[0]
        grid = position_grid(B, T, w.device)
        out = target(w, grid, features=model.feature_layers)
        positions, mask = dflash_blocks(T, anchors[None].expand(B, n).to(w.device), bs, w.device)
        before = w.gather(1, positions)
        ids = before.clone()
        ids.view(B, n, bs)[:, :, 1:] = model.mask_token_id
        hidden = model.forward_dense(out.features, grid, ids, positions, mask)
        by_block = (B, n, bs)  # refine_logits unrolls a recurrent Markov head over each block's positions
        lp = torch.log_softmax(model.refine_logits(model.compute_logits(hidden).view(*by_block, -1),
                                                   before.view(by_block), hidden.view(*by_block, -1)).float(), -1)
        z = out.logits.gather(1, positions[:, :, None].expand(-1, -1, out.logits.shape[-1])).view(B, n, bs, -1)
        true = w.gather(1, positions + 1).view(B, n, bs)
        agree = (lp.argmax(-1) == z.argmax(-1)).double()
        confidence = model.confidence_logits(hidden, before)
        estimate = (torch.zeros_like(agree) if confidence is None else
                    torch.sigmoid(confidence).double().view(B, n, bs))
        sums += torch.stack([-lp.gather(-1, true[..., None])[..., 0].double().sum((0, 1)),
                             -(torch.softmax(z, -1) * lp).sum(-1).double().sum((0, 1)), agree.sum((0, 1)),
                             agree.cumprod(-1).sum((0, 1)), estimate.sum((0, 1))])
        count += B * n
    r = sums / count
    rows = {}
    for j in range(bs):
        rows[f"pos{j + 1}"] = {"ce_true_nats": round(float(r[0, j]), 4), "ce_target_nats": round(float(r[1, j]), 4),
                               "top1_agreement": round(float(r[2, j]), 4), "accept_prefix": round(float(r[3, j]), 4)}
        if model.confidence_head is not None:
            rows[f"pos{j + 1}"]["confidence"] = round(float(r[4, j]), 4)
    return rows


def evaluate_bundle(bundle, n_windows: int = 32, seq_len: int = 512, seed: int = 4321) -> dict:
    """Held-out metrics of every model of a loaded bundle (fp32, no autocast)."""
    res = {}
    win = heldout_tensor(n_windows, seq_len + 3, seed)
    res["target"] = evaluate_target(bundle.target, win[:, :seq_len + 1])
    for kind, draft in bundle.drafts.items():
        res[kind] = DRAFT_KINDS[kind].zoo.evaluate(bundle.target, draft, win, seq_len)
    return res
