"""Train the zoo's checkpoints on the standard-library corpus: `specdec zoo train`.

Stages (each seeded, with a tqdm progress bar; AdamW, linear warm-up then cosine decay; random
windows of the train stream; bf16 autocast on CPU, fp32 master weights):

1. target   - a Llama-architecture byte-level LM, next-token cross-entropy.
2. eagle    - an EAGLE head on the frozen target: smooth-L1 regression of its output hidden onto the
              target's next hidden state plus cross-entropy, through the shared LM head, against the
              target's distribution (distillation, so the head learns the target's argmax). Trained
              with "training-time test" unrolling: pass j feeds the head its own output hidden of pass
              j-1 (as draft step j does at inference) and attends to exactly the keys that draft step j
              sees (the real-hidden prefix, then one key per earlier draft step), see `ttt_mask`.
3. mtp      - S MTP layers, MiMo style (every layer reads the target's hidden states), distilled from
              the target's distribution S+1 positions ahead.
4. mtp_chain- the same in Step-3.5 style (layer k reads layer k-1's output), trained jointly.
5. eagle3   - an EAGLE-3 head: features from three target layers, its own LM head over the most
              frequent ids, cross-entropy only, with the EAGLE head's unrolling and budget.

The target is stored in float16, the drafts' matrices in int8 with per-row scales (`save_stored`); the
loader dequantizes to fp32. Held-out metrics in the card are measured on the stored weights, in fp32,
without autocast, as inference runs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import reference

from ..models import EagleDraftHead, LlamaConfig, LlamaForCausalLM, MTPDraftModel
from ..models.draft_common import draft_config_like
from ..models.eagle3 import Eagle3DraftHead, default_feature_layers, eagle3_config_like
from ..models.io import quantize_int8_matrices, save_dir
from ..models.layers import AttentionMetadata, hf_named_parameters, rope_cos_sin
from . import DEFAULT_NAME, WEIGHTS_DIR, corpus
from .tokenizer import ByteTokenizer

STORE_DTYPE = torch.float16


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------
@dataclass
class TargetShape:
    hidden_size: int = 256
    num_hidden_layers: int = 6
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 688
    max_position_embeddings: int = 2048

    def config(self, vocab_size: int = ByteTokenizer.vocab_size) -> LlamaConfig:
        return LlamaConfig(vocab_size=vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
                           num_attention_heads=self.num_attention_heads,
                           num_key_value_heads=self.num_key_value_heads, rope_theta=10000.0,
                           max_position_embeddings=self.max_position_embeddings, tie_word_embeddings=False)


@dataclass
class StageOpts:
    """One stage's optimisation settings (tokens per step = batch_size * seq_len)."""

    steps: int
    batch_size: int = 8
    seq_len: int = 512
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    amp: bool = True
    eval_every: int = 0  # 0: only at the end
    eval_windows: int = 16
    extra: dict = field(default_factory=dict)


def default_opts() -> dict[str, StageOpts]:
    return {
        "target": StageOpts(steps=2200, warmup=100, lr=2e-3, eval_every=500),
        "eagle": StageOpts(steps=700, warmup=50, lr=2e-3, extra={"unroll": 3, "w_reg": 1.0, "w_cls": 1.0}),
        # the EAGLE head's budget (steps, tokens, unrolled passes), so that the two heads compare fairly
        # per-feature norms before fc and a normed output hidden: the recipe of current EAGLE-3 trainers
        "eagle3": StageOpts(steps=700, warmup=50, lr=2e-3, extra={"unroll": 3, "draft_vocab_size": 128,
                                                                   "fc_norm": True, "norm_output": True}),
        "mtp": StageOpts(steps=750, warmup=50, lr=2e-3, extra={"num_layers": 3}),
        "mtp_chain": StageOpts(steps=750, warmup=50, lr=2e-3, extra={"num_layers": 3}),
    }


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
class Windows:
    """Seeded random windows of a token stream: `next()` -> (B, length) int64."""

    def __init__(self, stream: np.ndarray, batch_size: int, length: int, seed: int):
        if len(stream) <= length:
            raise ValueError(f"stream of {len(stream)} tokens is too short for windows of {length}")
        self.stream, self.batch_size, self.length = stream, batch_size, length
        self.rng = np.random.default_rng(seed)

    def next(self) -> torch.Tensor:
        starts = self.rng.integers(0, len(self.stream) - self.length, size=self.batch_size)
        idx = starts[:, None] + np.arange(self.length)[None, :]
        return torch.from_numpy(self.stream[idx].astype(np.int64))


def lr_at(step: int, opts: StageOpts) -> float:
    """Linear warm-up to opts.lr, then cosine decay to opts.lr * opts.min_lr_ratio at opts.steps."""
    if step < opts.warmup:
        return opts.lr * (step + 1) / opts.warmup
    frac = (step - opts.warmup) / max(1, opts.steps - opts.warmup)
    return opts.lr * (opts.min_lr_ratio + (1 - opts.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def init_weights_(module: torch.nn.Module, num_layers: int, seed: int, std: float = 0.02) -> None:
    """GPT-2 style init: N(0, std) for matrices and embeddings, std / sqrt(2 L) for the residual
    projections (o_proj, down_proj), ones for norms."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_named_parameters(module):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                p.copy_(torch.randn(p.shape, generator=g) * std / math.sqrt(2 * num_layers))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def make_optimizer(params_named, opts: StageOpts) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, p in params_named:
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and "embed" not in name else no_decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": opts.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=opts.lr, betas=(0.9, 0.95), eps=1e-8)


def _autocast(enabled: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def _positions(B: int, T: int, device="cpu") -> torch.Tensor:
    return torch.arange(T, device=device)[None].expand(B, T)


def soft_ce(logits: torch.Tensor, target_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logits, target_probs: (B, T, V); mask: (B, T) bool -> mean over masked positions of
    -sum_v p(v) log q(v) (cross-entropy against the target's distribution)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    ce = -(target_probs * lp).sum(-1)
    return (ce * mask).sum() / mask.sum().clamp_min(1)


def _freeze(model):
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _run_loop(name: str, opts: StageOpts, params_named, loss_fn, windows: Windows, seed: int,
              eval_fn=None, log=print) -> dict:
    """The shared training loop. loss_fn(batch) -> (loss, dict of floats for the progress bar)."""
    torch.manual_seed(seed)
    params_named = list(params_named)
    params = [p for _, p in params_named if p.requires_grad]
    opt = make_optimizer(params_named, opts)
    tokens_per_step = opts.batch_size * opts.seq_len
    t0 = time.time()
    ema = None
    history = []
    bar = tqdm(range(opts.steps), desc=f"train {name}", dynamic_ncols=True, mininterval=2.0, file=sys.stderr)
    for step in bar:
        lr = lr_at(step, opts)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = windows.next()
        loss, parts = loss_fn(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, opts.grad_clip)
        opt.step()
        lv = float(loss.detach())
        if not math.isfinite(lv):
            raise RuntimeError(f"{name}: loss is {lv} at step {step}")
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        el = time.time() - t0
        bar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr:.1e}", gn=f"{float(gnorm):.2f}",
                        tok_s=f"{tokens_per_step * (step + 1) / el:.0f}", refresh=False,
                        **{k: f"{v:.3f}" for k, v in parts.items()})
        if (step + 1) % 100 == 0 or step + 1 == opts.steps:
            history.append({"step": step + 1, "loss_ema": round(ema, 4), "elapsed_s": round(el, 1)})
            log(f"[{name}] step {step + 1}/{opts.steps} loss(ema) {ema:.4f} lr {lr:.2e} "
                f"{tokens_per_step * (step + 1) / el:.0f} tok/s {el:.0f}s " +
                " ".join(f"{k}={v:.3f}" for k, v in parts.items()))
        if eval_fn is not None and opts.eval_every and (step + 1) % opts.eval_every == 0 and step + 1 < opts.steps:
            log(f"[{name}] eval at step {step + 1}: {json.dumps(eval_fn())}")
    bar.close()
    wall = time.time() - t0
    return {"steps": opts.steps, "batch_size": opts.batch_size, "seq_len": opts.seq_len,
            "tokens_seen": tokens_per_step * opts.steps, "peak_lr": opts.lr, "warmup_steps": opts.warmup,
            "min_lr_ratio": opts.min_lr_ratio, "weight_decay": opts.weight_decay, "grad_clip": opts.grad_clip,
            "bf16_autocast": opts.amp, "train_seconds": round(wall, 1), "final_train_loss_ema": round(ema, 4),
            "history": history, **opts.extra}


def num_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


# ----------------------------------------------------------------------------------------------
# target
# ----------------------------------------------------------------------------------------------
def target_loss(target, batch: torch.Tensor, amp: bool) -> torch.Tensor:
    """batch: (B, T+1) -> mean next-token cross-entropy (nats per byte) over the T predictions."""
    x, y = batch[:, :-1], batch[:, 1:]
    with _autocast(amp):
        logits = target(x, _positions(*x.shape)).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def train_target(shape: TargetShape | LlamaConfig, opts: StageOpts, seed: int = 0, log=print):
    """-> (trained LlamaForCausalLM fp32, stats dict). `shape` is a TargetShape or a full LlamaConfig."""
    cfg = shape.config() if isinstance(shape, TargetShape) else shape
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    init_weights_(model, cfg.num_hidden_layers, seed)
    model.train()
    windows = Windows(corpus.token_stream("train"), opts.batch_size, opts.seq_len + 1, seed + 1)
    heldout = torch.from_numpy(corpus.heldout_windows(opts.eval_windows, opts.seq_len + 1, seed=1234))

    def loss_fn(batch):
        return target_loss(model, batch, opts.amp), {}

    def eval_fn():
        model.eval()
        with torch.no_grad():
            r = {"heldout_nats_per_byte": round(float(target_loss(model, heldout, opts.amp)), 4)}
        model.train()
        return r

    stats = _run_loop("target", opts, model.named_parameters(), loss_fn, windows, seed + 2, eval_fn, log)
    return model.eval(), stats


# ----------------------------------------------------------------------------------------------
# EAGLE head with training-time-test unrolling
# ----------------------------------------------------------------------------------------------
def ttt_mask(T: int, j: int, device="cpu") -> torch.Tensor:
    """(T, (j+1) T) bool: which keys the pass-j query at position t sees. Key r = i*T + s is pass i's key
    at position s. Pass 0 (real target hidden) keys at s <= t - j, then pass i's key at s = t - j + i for
    1 <= i <= j (the draft steps along the path from the last real position t - j), as draft step j does
    at inference."""
    t = torch.arange(T, device=device)[:, None]
    s = torch.arange(T, device=device)[None, :]
    blocks = [s <= t - j] + [s == t - j + i for i in range(1, j + 1)]
    return torch.cat(blocks, dim=1)


def eagle_unrolled(head, hidden: torch.Tensor, input_ids: torch.Tensor, passes: int):
    """hidden: (B, T, H) the target's h_t (an EAGLE-3 head: its features, (B, T, F * H)); input_ids:
    (B, T) x_{t+1} -> list of `passes` pairs (logits (B, T, V or draft_vocab_size), hidden_out (B, T, H)).

    Pass 0 is the draft extend (reads h_t); pass j >= 1 at position t reads pass j-1's output hidden at
    t-1 and stands for draft step j anchored at the last real position t - j. Every pass at t predicts
    x_{t+2}; pass j is meaningful for t >= j only."""
    B, T = input_ids.shape
    cfg = head.config
    dev = input_ids.device
    cos, sin = rope_cos_sin(_positions(B, T, dev), cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    slots = torch.arange(B, device=dev)
    start = torch.zeros(B, dtype=torch.long, device=dev)
    kv_shape = (B, T, cfg.num_key_value_heads, cfg.head_dim)
    prev_k = prev_v = None
    h_in = hidden
    outs = []
    for j in range(passes):
        zk = torch.zeros(kv_shape, dtype=torch.float32, device=dev)
        zv = torch.zeros(kv_shape, dtype=torch.float32, device=dev)
        k_cache = zk if j == 0 else torch.cat([prev_k, zk], dim=1)
        v_cache = zv if j == 0 else torch.cat([prev_v, zv], dim=1)
        mask = None if j == 0 else ttt_mask(T, j, dev)[None].expand(B, T, (j + 1) * T)
        meta = AttentionMetadata(slots=slots, cache_start=start, attn_len=(j + 1) * T, ops=reference,
                                 write_offset=j * T, tree_mask=mask)
        # the head's step with gradients (its forward's cached path is inference only): each pass attends
        # through the cache to the keys that earlier passes left in it
        out_h = head.step(input_ids, h_in, cos, sin, (k_cache, v_cache), meta)
        logits = head.compute_logits(out_h)
        outs.append((logits, out_h))
        prev_k, prev_v = k_cache, v_cache
        # position 0 of a later pass is never read by a query that counts (see ttt_mask): any filler will do
        h_in = torch.cat([out_h[:, :1], out_h[:, :-1]], dim=1)
    return outs


def _target_features(target, x: torch.Tensor, amp: bool, features=None):
    """-> the frozen target's logits (B, T, V) and hidden (B, T, H) in fp32; with `features`, the
    concatenated residual streams entering those layers (B, T, F * H) instead of the hidden."""
    with torch.no_grad(), _autocast(amp):
        out = target(x, _positions(*x.shape, x.device), features=features)
    return out.logits.float(), (out.hidden if features is None else out.features).float()


def eagle_loss(target, head, batch: torch.Tensor, passes: int, w_reg: float, w_cls: float, amp: bool):
    """batch: (B, T+1) = x_0..x_T -> (loss, parts). Pass j at t (j <= t <= T-2) regresses onto h_{t+1}
    and matches the target's distribution z_{t+1}; pass losses are averaged."""
    x = batch[:, :-1]
    B, T = x.shape
    z, h = _target_features(target, x, amp)
    p = torch.softmax(z, dim=-1)
    with _autocast(amp):
        outs = eagle_unrolled(head, h, batch[:, 1:], passes)
    t = torch.arange(T)[None, :]
    total, parts = 0.0, {}
    for j, (logits, out_h) in enumerate(outs):
        mask = ((t >= j) & (t <= T - 2)).expand(B, T)[:, :-1]
        reg = F.smooth_l1_loss(out_h[:, :-1].float(), h[:, 1:], reduction="none").mean(-1)
        reg = (reg * mask).sum() / mask.sum()
        cls = soft_ce(logits[:, :-1], p[:, 1:], mask)
        total = total + (w_reg * reg + w_cls * cls) / passes
        parts[f"ce{j + 1}"] = float(cls.detach())
    return total, parts


def train_eagle(target, opts: StageOpts, seed: int = 0, log=print):
    """-> (trained EagleDraftHead fp32, stats). The target is frozen; embedding and LM head are shared."""
    passes = int(opts.extra.get("unroll", 3))
    w_reg, w_cls = float(opts.extra.get("w_reg", 1.0)), float(opts.extra.get("w_cls", 1.0))
    _freeze(target)
    torch.manual_seed(seed)
    head = EagleDraftHead(draft_config_like(target, 1), target)
    init_weights_(head, 1, seed + 10)
    head.train()
    windows = Windows(corpus.token_stream("train"), opts.batch_size, opts.seq_len + 1, seed + 11)
    stats = _run_loop("eagle", opts, head.named_parameters(),
                      lambda b: eagle_loss(target, head, b, passes, w_reg, w_cls, opts.amp), windows, seed + 12,
                      None, log)
    return head.eval(), stats


# ----------------------------------------------------------------------------------------------
# EAGLE-3 head: multi-layer target features, a reduced draft vocabulary, training-time test
# ----------------------------------------------------------------------------------------------
def draft_vocabulary(stream: np.ndarray, vocab_size: int, size: int) -> torch.Tensor:
    """The `size` most frequent ids of a token stream (ties: the lower id), ascending -> (size,) int64:
    draft id d is target id vocab[d], as EAGLE-3's d2t = vocab - arange(size) records it."""
    if not 1 <= size <= vocab_size:
        raise ValueError(f"draft vocabulary size must be in [1, {vocab_size}], got {size}")
    counts = np.bincount(np.asarray(stream, dtype=np.int64), minlength=vocab_size)[:vocab_size]
    most = np.lexsort((np.arange(vocab_size), -counts))[:size]
    return torch.from_numpy(np.sort(most)).long()


def zoo_feature_layers(num_target_layers: int) -> list[int]:
    """Low, middle and high features. A deep target (L >= 7) takes SafeAILab's and SGLang's default, the
    inputs of layers 2, L // 2 and L - 3 (`default_feature_layers`), as real EAGLE-3 heads do. A shallow one
    takes the inputs of layers L // 3 and 2L // 3 and the last layer's output (L): at L = 6 the peers' rule
    gives [2, 3, 3], one layer twice and nothing from the top half."""
    L = num_target_layers
    if L >= 7:
        return default_feature_layers(L)
    return sorted({max(1, L // 3), max(1, 2 * L // 3), L})


def new_eagle3_head(target, vocab: torch.Tensor, feature_layers, seed: int, **norms) -> Eagle3DraftHead:
    """An untrained EAGLE-3 head on `target` whose draft vocabulary is `vocab` (ascending target ids); `norms`:
    Eagle3Config's norm_before_fc / fc_norm / norm_output. Weights as `init_weights_`, except the final norm
    and the LM head, which start as the target's (its rows of the draft vocabulary): the head then begins
    by reading its output hidden state as the target reads its own."""
    head = Eagle3DraftHead(eagle3_config_like(target, len(vocab), feature_layers, **norms), target)
    init_weights_(head, 1, seed)
    head.set_draft_vocabulary(vocab)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.lm_head.weight[vocab])
        head.norm.weight.copy_(target.model.norm.weight)
    return head


def _draft_vocab_targets(head, z: torch.Tensor):
    """z: (B, T, V) target logits -> (the target's distribution over the head's vocabulary (B, T, Vd),
    renormalised; (B, T) bool: the target's argmax is an id the head can propose). An EAGLE head's
    vocabulary is the target's."""
    if not isinstance(head, Eagle3DraftHead):
        return torch.softmax(z, dim=-1), torch.ones(z.shape[:-1], dtype=torch.bool, device=z.device)
    vocab = head.draft_to_target(torch.arange(head.config.draft_vocab_size, device=z.device))
    return torch.softmax(z[..., vocab], dim=-1), head.t2d[z.argmax(-1)]


def eagle3_loss(target, head, batch: torch.Tensor, passes: int, amp: bool):
    """batch: (B, T+1) = x_0..x_T -> (loss, parts). Pass j at t (j <= t <= T-2) matches the target's
    distribution z_{t+1} restricted to the draft vocabulary, where the target's argmax is in it (as EAGLE-3
    trains: cross-entropy only, no feature regression); pass losses are averaged."""
    x = batch[:, :-1]
    B, T = x.shape
    z, feats = _target_features(target, x, amp, head.feature_layers)
    p, in_vocab = _draft_vocab_targets(head, z)
    with _autocast(amp):
        outs = eagle_unrolled(head, feats, batch[:, 1:], passes)
    t = torch.arange(T)[None, :]
    total, parts = 0.0, {}
    for j, (logits, _) in enumerate(outs):
        mask = ((t >= j) & (t <= T - 2)).expand(B, T)[:, :-1] & in_vocab[:, 1:]
        ce = soft_ce(logits[:, :-1], p[:, 1:], mask)
        total = total + ce / passes
        parts[f"ce{j + 1}"] = float(ce.detach())
    return total, parts


def train_eagle3(target, opts: StageOpts, seed: int = 0, log=print):
    """-> (trained Eagle3DraftHead fp32, stats). Its draft vocabulary is the opts.extra['draft_vocab_size']
    most frequent ids of the train stream; its features the inputs of opts.extra['feature_layers'] (default
    `zoo_feature_layers`). The target is frozen; the token embedding is shared, the LM head is the head's."""
    passes = int(opts.extra.get("unroll", 3))
    stream = corpus.token_stream("train")
    V = target.config.vocab_size
    vocab = draft_vocabulary(stream, V, int(opts.extra.get("draft_vocab_size", V)))
    layers = list(opts.extra.get("feature_layers") or zoo_feature_layers(target.config.num_hidden_layers))
    norms = {k: bool(opts.extra.get(k, False)) for k in ("norm_before_fc", "fc_norm", "norm_output")}
    _freeze(target)
    torch.manual_seed(seed)
    head = new_eagle3_head(target, vocab, layers, seed + 40, **norms)
    head.train()
    windows = Windows(stream, opts.batch_size, opts.seq_len + 1, seed + 41)
    stats = _run_loop("eagle3", opts, head.named_parameters(),
                      lambda b: eagle3_loss(target, head, b, passes, opts.amp), windows, seed + 42, None, log)
    counts = np.bincount(np.asarray(stream, dtype=np.int64), minlength=V)
    stats.update(unroll=passes, draft_vocab_size=len(vocab), feature_layers=layers, **norms,
                 draft_vocab_train_coverage=round(float(counts[vocab.numpy()].sum() / counts.sum()), 6))
    return head.eval(), stats


# ----------------------------------------------------------------------------------------------
# MTP layers (MiMo and Step-3.5 styles)
# ----------------------------------------------------------------------------------------------
def mtp_forward(model: MTPDraftModel, hidden: torch.Tensor, tokens: torch.Tensor, T: int):
    """hidden: (B, T, H) the target's h_t; tokens: (B, >= T + S) x_0.. -> list over layers k of
    (logits (B, T, V), hidden_out (B, T, H)); layer k at t reads x_{t+k+1} and predicts x_{t+k+2}."""
    B = hidden.shape[0]
    pos = _positions(B, T, hidden.device)
    outs, h_in = [], hidden
    for k in range(model.num_layers):
        logits, out_h, _ = model.forward_layer(k, tokens[:, k + 1:k + 1 + T], h_in, pos)
        outs.append((logits, out_h))
        if model.chain_hidden_states:
            h_in = out_h
    return outs


def mtp_loss(target, model, batch: torch.Tensor, amp: bool):
    """batch: (B, T + S) -> (loss, parts): layer k at t (t <= T-k-2) matches the target's distribution
    z_{t+k+1}; layer losses are averaged."""
    S = model.num_layers
    T = batch.shape[1] - S
    x = batch[:, :T]
    z, h = _target_features(target, x, amp)
    p = torch.softmax(z, dim=-1)
    with _autocast(amp):
        outs = mtp_forward(model, h, batch, T)
    total, parts = 0.0, {}
    for k, (logits, _) in enumerate(outs):
        n = T - k - 1  # positions t = 0 .. T-k-2
        mask = torch.ones(batch.shape[0], n, dtype=torch.bool)
        ce = soft_ce(logits[:, :n], p[:, k + 1:k + 1 + n], mask)
        total = total + ce / S
        parts[f"ce{k + 1}"] = float(ce.detach())
    return total, parts


def train_mtp(target, opts: StageOpts, chain_hidden_states: bool = False, seed: int = 0, log=print):
    """-> (trained MTPDraftModel fp32 with opts.extra['num_layers'] layers, stats). The layers are trained
    jointly; MiMo style (chain_hidden_states=False) or Step-3.5 style (True)."""
    S = int(opts.extra.get("num_layers", 3))
    _freeze(target)
    off = 30 if chain_hidden_states else 20
    torch.manual_seed(seed + off)
    model = MTPDraftModel(draft_config_like(target, S, chain_hidden_states), target)
    init_weights_(model, S, seed + off)
    model.train()
    windows = Windows(corpus.token_stream("train"), opts.batch_size, opts.seq_len + S, seed + off + 1)
    name = "mtp_chain" if chain_hidden_states else "mtp"
    stats = _run_loop(name, opts, model.named_parameters(), lambda b: mtp_loss(target, model, b, opts.amp),
                      windows, seed + off + 2, None, log)
    return model.eval(), stats


# ----------------------------------------------------------------------------------------------
# held-out evaluation (fp32, no autocast: as inference runs)
# ----------------------------------------------------------------------------------------------
def _heldout(n: int, length: int, seed: int = 4321) -> torch.Tensor:
    return torch.from_numpy(corpus.heldout_windows(n, length, seed=seed))


@torch.no_grad()
def evaluate_target(target, windows: torch.Tensor) -> dict:
    """windows: (N, T+1) -> held-out next-token loss (nats/byte), bits/byte, top-1 accuracy."""
    x, y = windows[:, :-1], windows[:, 1:]
    logits = target(x, _positions(*x.shape)).logits
    loss = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))
    acc = float((logits.argmax(-1) == y).float().mean())
    return {"heldout_nats_per_byte": round(loss, 4), "heldout_bits_per_byte": round(loss / math.log(2), 4),
            "heldout_top1_accuracy": round(acc, 4)}


@torch.no_grad()
def evaluate_eagle(target, head, windows: torch.Tensor, depths: int = 5) -> dict:
    """windows: (N, T+1) -> per draft depth d = 1..depths: cross-entropy against the true next byte,
    cross-entropy against the target's distribution, and top-1 agreement with the target's argmax
    (depth d = draft step d-1: d = 1 reads the target's hidden, d >= 2 the head's own output).

    An EAGLE-3 head is scored over its draft vocabulary: the target's distribution restricted to it and
    renormalised, the true byte where it is in it; agreement compares its mapped argmax with the target's
    over every position (a target argmax it cannot propose counts as a miss)."""
    x = windows[:, :-1]
    B, T = x.shape
    out = target(x, _positions(B, T), features=getattr(head, "feature_layers", None))
    z, h = out.logits, out.hidden if out.features is None else out.features
    outs = eagle_unrolled(head, h, windows[:, 1:], depths)
    tgt_arg = z.argmax(-1)
    p, _ = _draft_vocab_targets(head, z)
    if isinstance(head, Eagle3DraftHead):
        true_in_vocab = head.t2d[windows[:, 2:]]
        true_draft = (torch.cumsum(head.t2d.long(), 0) - 1).clamp_min(0)[windows[:, 2:]]
    else:
        true_in_vocab, true_draft = torch.ones_like(windows[:, 2:], dtype=torch.bool), windows[:, 2:]
    to_target = getattr(head, "draft_to_target", lambda ids: ids)
    res = {}
    t = torch.arange(T)[None, :]
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
def evaluate_mtp(target, model, windows: torch.Tensor) -> dict:
    """windows: (N, T + S) -> per layer k: cross-entropy against the true byte x_{t+k+2}, against the
    target's distribution, and top-1 agreement with the target's argmax."""
    S = model.num_layers
    T = windows.shape[1] - S
    z, h, _ = target(windows[:, :T], _positions(windows.shape[0], T))
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


# ----------------------------------------------------------------------------------------------
# saving, the card, the whole pipeline
# ----------------------------------------------------------------------------------------------
#: How a draft's matrices are stored (see `save_stored`); recorded in its config.json and the card.
DRAFT_STORAGE = "int8 matrices with one float16 scale per output row (`<name>_scale`), other weights float16"


def save_stored(model, path: Path) -> int:
    """Save `model` as the zoo ships it -> bytes on disk. The target: float16. A draft: its matrices int8
    per output row (`quantize_int8_matrices`, from the fp32 weights), its norms float16, its id maps as
    they are; the loader dequantizes to fp32. Drafts only propose, so their rounding cannot change what
    the workers decode; it halves their share of the ~20 MB that ships."""
    cfg, sd = model.checkpoint()
    cfg["torch_dtype"] = "float16"
    sd = {k: v.detach().float() if v.is_floating_point() else v.detach() for k, v in sd.items()}
    if not isinstance(model, LlamaForCausalLM):
        sd = quantize_int8_matrices(sd)
        cfg["specdec_storage"] = DRAFT_STORAGE
    save_dir(path, cfg, {k: v.to(STORE_DTYPE) if v.is_floating_point() else v for k, v in sd.items()})
    for f in Path(path).iterdir():
        f.chmod(0o644)
    return sum(f.stat().st_size for f in Path(path).iterdir())


def _card_path(out: Path, name: str) -> Path:
    return out / name / "card.json"


def _read_card(out: Path, name: str) -> dict:
    p = _card_path(out, name)
    return json.loads(p.read_text()) if p.is_file() else {}


def _write_card(out: Path, name: str, card: dict) -> None:
    p = _card_path(out, name)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(card, indent=2, sort_keys=False) + "\n")


def _shape_summary(cfg) -> dict:
    keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "rope_theta", "tie_word_embeddings"]
    d = {k: getattr(cfg, k) for k in keys}
    if hasattr(cfg, "chain_hidden_states"):
        d["chain_hidden_states"] = cfg.chain_hidden_states
    for extra in ("draft_vocab_size", "feature_layers"):  # EAGLE-3 heads
        if hasattr(cfg, extra):
            d[extra] = getattr(cfg, extra)
    return d


def evaluate_bundle(bundle, n_windows: int = 32, seq_len: int = 512, seed: int = 4321) -> dict:
    """Held-out metrics of every model of a loaded bundle (fp32, no autocast)."""
    res = {}
    win = _heldout(n_windows, seq_len + 3, seed)
    res["target"] = evaluate_target(bundle.target, win[:, :seq_len + 1])
    for key in ("eagle", "eagle3"):
        if getattr(bundle, key) is not None:
            res[key] = evaluate_eagle(bundle.target, getattr(bundle, key), win[:, :seq_len + 1])
    for key in ("mtp", "mtp_chain"):
        m = getattr(bundle, key)
        if m is not None:
            res[key] = evaluate_mtp(bundle.target, m, win[:, :seq_len + m.num_layers])
    return res


STAGES = ("target", "eagle", "mtp", "mtp_chain", "eagle3")
DRAFTS = ("eagle", "eagle3", "mtp", "mtp_chain")


def train_all(out=WEIGHTS_DIR, name: str = DEFAULT_NAME, seed: int = 0, stages=STAGES, shape: TargetShape | None = None,
              opts: dict[str, StageOpts] | None = None, command: str = "", log=print,
              eval_windows: int = 32, eval_len: int = 512) -> dict:
    """Train `stages` in order and write out/name/{target,eagle,eagle3,mtp,mtp_chain}/ and
    out/name/card.json. A stage after `target` loads the existing target from out/name/target.
    -> the card (dict)."""
    from . import _load_dir

    out = Path(out)
    shape = shape or TargetShape()
    opts = opts or default_opts()
    root = out / name
    card = _read_card(out, name)
    card.setdefault("name", name)
    card["tokenizer"] = {"type": "ByteTokenizer", "vocab_size": ByteTokenizer.vocab_size,
                         "bos_token_id": ByteTokenizer.bos_token_id, "eos_token_id": ByteTokenizer.eos_token_id}
    card["corpus"] = corpus.corpus_info()
    card["stored_dtype"] = "target float16; drafts " + DRAFT_STORAGE
    card.setdefault("training", {})
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if set(stages) == set(STAGES) or (stages and "command" not in card):
        # a whole run; a single stage (or a re-evaluation) keeps the record of the run it adds to
        card["seed"] = seed
        card["command"] = command
        card["environment"] = {"python": sys.version.split()[0], "torch": torch.__version__,
                               "machine": platform.machine(), "processor": platform.processor() or platform.machine(),
                               "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
        card["created"] = now
    target = None
    for stage in stages:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
        o = opts[stage]
        if stage == "target":
            log(f"== target: {asdict(shape)}")
            model, stats = train_target(shape, o, seed, log)
            stats["bytes_on_disk"] = save_stored(model, root / "target")
            target = None
        else:
            if target is None:
                target = LlamaForCausalLM.from_pretrained(root / "target", device="cpu", dtype=torch.float32)
            _freeze(target)
            if stage == "eagle":
                model, stats = train_eagle(target, o, seed, log)
            elif stage == "eagle3":
                model, stats = train_eagle3(target, o, seed, log)
            else:
                model, stats = train_mtp(target, o, stage == "mtp_chain", seed, log)
            stats["bytes_on_disk"] = save_stored(model, root / stage)
        stats["parameters"] = num_params(model)
        stats.update(command=command, seed=seed, finished=now, torch_threads=torch.get_num_threads())
        card["training"][stage] = stats
        _write_card(out, name, card)
        log(f"== {stage} done in {stats['train_seconds']:.0f}s")
    bundle = _load_dir(root, name)
    log("== evaluating the stored weights on held-out windows")
    card["heldout"] = evaluate_bundle(bundle, eval_windows, eval_len)
    card["heldout_eval"] = {"windows": eval_windows, "length": eval_len, "seed": 4321}
    card["models"] = {}
    for key in ("target",) + DRAFTS:
        m = getattr(bundle, key)
        if m is not None:
            card["models"][key] = {"parameters": num_params(m), **_shape_summary(m.config)}
    card["total_train_seconds"] = round(sum(s.get("train_seconds", 0) for s in card["training"].values()), 1)
    card["total_bytes_on_disk"] = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    _write_card(out, name, card)
    log(json.dumps(card["heldout"], indent=1))
    return card


def why_this_shape(card: dict) -> str:
    """The model card's paragraph on why the target has its shape."""
    target = card.get("models", {}).get("target", {})
    if card.get("name") == DEFAULT_NAME or target.get("num_hidden_layers", 6) <= 6:
        return ("Why this size: the ~20 MB cap on what ships binds first, since eight draft decoder layers of the "
                "target's width ship beside it (1 EAGLE + 1 EAGLE-3 + 3 + 3 MTP); hidden 256 with 6 layers fits "
                "(the target in float16, the drafts' matrices in int8), trains in about 18 minutes at ~8k bytes/s "
                "on two cores (about one pass over the train split), and leaves the target six times as deep as "
                "one draft step, so drafting stays cheap relative to verifying. On this pair one draft step costs "
                "about a quarter of a target step, so it bounds what speculation can gain far below real pairs.")
    cost = card.get("draft_step_cost", {})
    measured = (f" Measured on the trained pair (B = 1, {cost.get('threads')} thread, process CPU time, "
                f"`specdec.bench.draft_step_cost`): a target-only decode step {cost.get('target_only_step_ms')} ms, "
                f"one EAGLE draft step {cost.get('eagle_draft_forward_ms')} ms, i.e. "
                f"{cost.get('draft_forward_in_target_only_steps')} of a target step."
                if cost else "")
    return (f"Why this shape: a deep, narrow target ({target.get('num_hidden_layers')} layers at hidden "
            f"{target.get('hidden_size')}, about the small pair's parameter count) so that one draft decoder "
            f"layer costs a small fraction of a target step, as real drafts do beside their targets (an EAGLE-3 "
            f"head beside Llama-3.1-8B, one MTP layer beside a 36- to 61-layer model)." + measured)


def render_model_cards(cards: list[dict]) -> str:
    """MODEL_CARD.md: every shipped pair's card, the small pair first."""
    return "\n\n".join(render_model_card(c) for c in sorted(cards, key=lambda c: c.get("name") != DEFAULT_NAME))


def render_model_card(card: dict) -> str:
    """The human-readable model card (Markdown) of one card.json."""
    tr, ho, mo = card.get("training", {}), card.get("heldout", {}), card.get("models", {})
    c = card.get("corpus", {})
    lines = [f"# `{card['name']}`", "",
             "Tiny checkpoints trained on real text, shipped so that speculative decoding can be studied with "
             "drafts that actually agree with their target. Load with `specdec.zoo.load(%r)`." % card["name"], "",
             "## Corpus", "",
             f"- {c.get('source')} (Python {c.get('python')}); files sorted by relative path.",
             f"- Excluded directories: {', '.join(c.get('excluded_dirs', []))}; excluded files: "
             f"{', '.join(c.get('excluded_files', []))}.",
             f"- Split {c.get('split')}.",
             f"- Train: {c.get('train', {}).get('files')} files, {c.get('train', {}).get('bytes'):,} bytes; "
             f"held out: {c.get('heldout', {}).get('files')} files, {c.get('heldout', {}).get('bytes'):,} bytes "
             f"(content digests {c.get('train', {}).get('sha256')} / {c.get('heldout', {}).get('sha256')}).",
             "- Tokenizer: bytes (ids 0-255), BOS = 256, EOS = 257 (vocab 258); every file ends with EOS.", "",
             "## Models", "", why_this_shape(card), "",
             "| model | what | parameters | layers | hidden | intermediate | heads (kv) | train steps | tokens seen | "
             "train time | on disk |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    e3 = mo.get("eagle3", {})
    what = {"target": "Llama-architecture byte LM", "eagle": "EAGLE head (1 decoder layer, shared embedding/LM head)",
            "eagle3": f"EAGLE-3 head (features entering target layers {e3.get('feature_layers')}, its own LM head "
                      f"over the {e3.get('draft_vocab_size')} most frequent ids)",
            "mtp": "3 MTP layers, MiMo style", "mtp_chain": "3 MTP layers, Step-3.5 style (chained hidden)"}
    for k in ("target",) + DRAFTS:
        if k not in mo:
            continue
        m, t = mo[k], tr.get(k, {})
        lines.append(f"| `{k}` | {what[k]} | {m['parameters']:,} | {m['num_hidden_layers']} | {m['hidden_size']} | "
                     f"{m['intermediate_size']} | {m['num_attention_heads']} ({m['num_key_value_heads']}) | "
                     f"{t.get('steps')} | {t.get('tokens_seen', 0):,} | {t.get('train_seconds', 0) / 60:.1f} min | "
                     f"{t.get('bytes_on_disk', 0) / 1e6:.2f} MB |")
    lines += ["", f"Total training time: {card.get('total_train_seconds', 0) / 60:.1f} min on "
              f"{card.get('environment', {}).get('cpu_count')} CPU cores "
              f"({card.get('environment', {}).get('torch_threads')} torch threads, bf16 autocast, fp32 master "
              f"weights); total on disk {card.get('total_bytes_on_disk', 0) / 1e6:.1f} MB "
              f"(stored: {card.get('stored_dtype')}; loaded as fp32).", "",
              "## Held-out metrics", "",
              "Measured on the stored weights in fp32 over windows of the held-out files "
              "(%s windows of %s bytes)." % (card.get("heldout_eval", {}).get("windows"),
                                             card.get("heldout_eval", {}).get("length")), ""]
    if "target" in ho:
        t = ho["target"]
        lines.append(f"- target: {t['heldout_nats_per_byte']:.3f} nats/byte ({t['heldout_bits_per_byte']:.3f} "
                     f"bits/byte), top-1 accuracy {t['heldout_top1_accuracy']:.3f}.")
    lines += ["", "| draft | step | CE vs true byte (nats) | CE vs target distribution (nats) | "
              "top-1 agreement with target |", "|---|---|---|---|---|"]
    for k in DRAFTS:
        for step, r in ho.get(k, {}).items():
            lines.append(f"| `{k}` | {step} | {r['ce_true_nats']:.3f} | {r['ce_target_nats']:.3f} | "
                         f"{r['top1_agreement']:.3f} |")
    lines += ["", "At position t the target predicts byte t+1; EAGLE depth d and MTP layer k (1-based) predict "
              "byte t+1+d (t+1+k), reading the true bytes before it. EAGLE depth 1 reads the target's hidden "
              "state, depth d >= 2 the head's own output hidden state of depth d-1, attending to exactly what "
              "draft step d-1 sees at inference (the head was trained with %s unrolled passes). Agreement is "
              "the fraction of positions where the draft's argmax equals the target's; the speculative "
              "workers' acceptance is measured separately (`specdec bench`)." % tr.get("eagle", {}).get("unroll", "?"),
              "",
              "The EAGLE-3 head is scored over its draft vocabulary (%s ids, %.4f %% of the train bytes): "
              "cross-entropy against the target's distribution restricted to it and renormalised, against the "
              "true byte where the byte is in it; its agreement counts every position, so a target argmax "
              "outside its vocabulary is a miss." % (tr.get("eagle3", {}).get("draft_vocab_size", "?"),
                                                    100 * tr.get("eagle3", {}).get("draft_vocab_train_coverage", 0)),
              "",
              "## Training", "",
              "AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), linear warm-up then cosine decay to 10 %, "
              "gradient clipping at 1.0, random windows of the train stream. The target minimises next-byte "
              "cross-entropy. The drafts are trained on the frozen target: the EAGLE head with smooth-L1 "
              "regression onto the target's next hidden state plus cross-entropy against the target's "
              "distribution through the shared LM head, unrolled as at inference (training-time test); the "
              "EAGLE-3 head with the EAGLE head's budget (steps, tokens per step, unrolled passes) and "
              "cross-entropy only, against the target's distribution over its draft vocabulary, at the positions "
              "where the target's argmax is in it (one RMSNorm per feature before fc, the normed output hidden fed "
              "back, its LM head and final norm initialised from the target's); the MTP layers with "
              "cross-entropy against the target's distribution, all layers jointly.", "",
              f"Seed {card.get('seed')}; created {card.get('created')}; torch "
              f"{card.get('environment', {}).get('torch')}.", "",
              "Retrain (writes the weights and this card's data into the package):", "",
              "```", card.get("command") or "specdec zoo train", "```", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    """`specdec zoo train`: argparse front end of `train_all`."""
    d = default_opts()
    p = argparse.ArgumentParser(prog="specdec zoo train", description="Train the zoo's checkpoints on the "
                                "Python standard library (target, EAGLE and EAGLE-3 heads, MTP layers in two styles).")
    p.add_argument("--out", default=str(WEIGHTS_DIR), help="weights root (default: the package's own)")
    p.add_argument("--name", default=DEFAULT_NAME)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stage", default="all", choices=("all",) + STAGES + ("eval",),
                   help="train every stage, one stage (later stages read the stored target), or only "
                        "re-measure the held-out metrics of the stored weights and rewrite the card")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--no-amp", action="store_true", help="train in fp32 instead of bf16 autocast")
    for st in STAGES:
        p.add_argument(f"--{st.replace('_', '-')}-steps", type=int, default=d[st].steps)
    p.add_argument("--batch-size", type=int, default=d["target"].batch_size)
    p.add_argument("--seq-len", type=int, default=d["target"].seq_len)
    p.add_argument("--layers", type=int, default=TargetShape.num_hidden_layers)
    p.add_argument("--hidden", type=int, default=TargetShape.hidden_size)
    p.add_argument("--intermediate", type=int, default=TargetShape.intermediate_size)
    p.add_argument("--heads", type=int, default=TargetShape.num_attention_heads)
    p.add_argument("--kv-heads", type=int, default=TargetShape.num_key_value_heads)
    p.add_argument("--eagle-unroll", type=int, default=d["eagle"].extra["unroll"],
                   help="unrolled training-time-test passes of the EAGLE and EAGLE-3 heads (default: %(default)s)")
    p.add_argument("--eagle3-vocab", type=int, default=d["eagle3"].extra["draft_vocab_size"],
                   help="the EAGLE-3 head's draft vocabulary: this many most frequent ids (default: %(default)s)")
    p.add_argument("--eval-windows", type=int, default=32, help="held-out windows for the card's metrics")
    p.add_argument("--eval-len", type=int, default=512, help="length of those windows")
    p.add_argument("--model-card", default=None,
                   help="also write the Markdown model card here (default: specdec/zoo/MODEL_CARD.md when --out "
                        "is the package's weights directory)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    opts = default_opts()
    for st in STAGES:
        o = opts[st]
        o.steps = getattr(a, f"{st}_steps")
        o.batch_size, o.seq_len, o.amp = a.batch_size, a.seq_len, not a.no_amp
        o.warmup = min(o.warmup, max(1, o.steps // 10))
    opts["eagle"].extra["unroll"] = opts["eagle3"].extra["unroll"] = a.eagle_unroll
    if not 1 <= a.eagle3_vocab <= ByteTokenizer.vocab_size:  # checked before hours of earlier stages
        p.error(f"--eagle3-vocab must be in [1, {ByteTokenizer.vocab_size}] (the byte vocabulary), "
                f"got {a.eagle3_vocab}")
    opts["eagle3"].extra["draft_vocab_size"] = a.eagle3_vocab
    shape = TargetShape(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                        num_key_value_heads=a.kv_heads, intermediate_size=a.intermediate)
    stages = STAGES if a.stage == "all" else () if a.stage == "eval" else (a.stage,)
    command = "specdec zoo train " + " ".join(argv if argv is not None else sys.argv[1:])
    card = train_all(a.out, a.name, a.seed, stages, shape, opts, command.strip(),
                     log=lambda s: tqdm.write(s, file=sys.stderr), eval_windows=a.eval_windows,
                     eval_len=a.eval_len)
    md = a.model_card
    if md is None and Path(a.out).resolve() == WEIGHTS_DIR:
        md = str(Path(__file__).resolve().parent / "MODEL_CARD.md")
    if md and Path(md).resolve() == (Path(__file__).resolve().parent / "MODEL_CARD.md") and \
            Path(a.out).resolve() == WEIGHTS_DIR:
        from . import names
        Path(md).write_text(render_model_cards([_read_card(WEIGHTS_DIR, n) for n in names()]))
    elif md:
        Path(md).write_text(render_model_card(card))
    print(json.dumps(card["heldout"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
