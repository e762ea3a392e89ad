"""The stages' models and losses (target; EAGLE and EAGLE-3 heads with training-time-test unrolling; MTP layers
in two styles; a standalone draft LM), each trained by `train_<stage>` through the shared loop."""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...models import EagleDraftHead, LlamaConfig, LlamaForCausalLM, MTPDraftModel
from ...models.draft_common import draft_config_like
from ...models.eagle3 import Eagle3DraftHead, default_feature_layers, eagle3_config_like
from ...models.layers import AttentionMetadata, apply_rope, rope_cos_sin
from .. import corpus
from .hparams import StageOpts, TargetShape, Windows
from .regenerate import SegmentWindows, load_segments
from .loop import train_autocast, freeze, position_grid, run_stage_loop, init_weights_
from ...models.dflash import DFlashDraftModel, build_target_layer_ids, dflash_config_like
from ...models.dspark import DSparkDraftModel, dspark_config_like
from ...tokenizer import ByteTokenizer


def on_target_device(module: torch.nn.Module, target) -> torch.nn.Module:
    """A draft built (and initialised, from CPU generators) beside `target`, moved to the device the target is on."""
    return module.to(next(target.parameters()).device)


def soft_ce(logits: torch.Tensor, target_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logits, target_probs: (B, T, V); mask: (B, T) bool -> mean over masked positions of
    -sum_v p(v) log q(v) (cross-entropy against the target's distribution)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    ce = -(target_probs * lp).sum(-1)
    return (ce * mask).sum() / mask.sum().clamp_min(1)


# ----------------------------------------------------------------------------------------------
# target
# ----------------------------------------------------------------------------------------------

def target_loss(target, batch: torch.Tensor, amp: bool) -> torch.Tensor:
    """batch: (B, T+1) -> mean next-token cross-entropy (nats per byte) over the T predictions."""
    x, y = batch[:, :-1], batch[:, 1:]
    with train_autocast(amp):
        logits = target(x, position_grid(*x.shape)).logits
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

    stats = run_stage_loop("target", opts, model.named_parameters(), loss_fn, windows, seed + 2, eval_fn, log)
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


class _PassKV:
    """One layer's keys (or values) of the unrolled passes so far: pass i's (B, T, Hkv, D) tensor at
    `passes[i]`; what `TTT_OPS` writes and reads in place of a KV cache."""

    def __init__(self, T: int):
        self.passes = []
        self.shape = (None, T)  # the layer asks only for the length (its ops' plan key)


class TTT_OPS:
    """The attention ops of the unrolled passes (`eagle_unrolled`), in the layout `ttt_mask` draws: the pass-j
    query at t sees pass 0's keys at s <= t - j (one causal block, shifted by j) and one key of each earlier
    pass i >= 1, at s = t - j + i (a diagonal): T + j keys per query instead of the (j + 1) T of the dense mask,
    so a pass costs about what pass 0 does. Differentiable; called through the layers' cached path with a
    `_PassKV` pair as the cache."""

    @staticmethod
    def plan_tree_attention(*args):
        return None

    @staticmethod
    def apply_rope_and_write_kv(q, k, v, cos, sin, k_cache, v_cache, *args, plan=None):
        k_cache.passes.append(apply_rope(k, cos, sin))
        v_cache.passes.append(v)
        return apply_rope(q, cos, sin)

    @staticmethod
    def tree_attention(q, k_cache, v_cache, slots, cache_start, write_offset, tree_mask, attn_len, scale, plan=None):
        B, T, Hq, D = q.shape
        ks, vs = k_cache.passes, v_cache.passes
        j = len(ks) - 1
        groups = Hq // ks[0].shape[2]

        def heads(x):  # (B, T, Hkv, D) -> (B, Hq, T, D), each query head beside its KV head
            return x.transpose(1, 2).repeat_interleave(groups, dim=1)

        def shifted(x, d):  # row t holds x's row t - d (zeros before 0)
            return torch.cat([x.new_zeros(x.shape[0], x.shape[1], d, x.shape[3]), x[:, :, :T - d]], dim=2)

        qh = q.transpose(1, 2)
        t = torch.arange(T, device=q.device)
        scores = [(qh @ heads(ks[0]).transpose(-1, -2) * scale).masked_fill(t[None, :] > t[:, None] - j, -torch.inf)]
        diag_v = []
        for i in range(1, j + 1):  # pass i's key at s = t - (j - i)
            d = j - i
            kd = shifted(heads(ks[i]), d)
            scores.append(((qh * kd).sum(-1, keepdim=True) * scale).masked_fill((t < d)[:, None], -torch.inf))
            diag_v.append(shifted(heads(vs[i]), d))
        w = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(qh.dtype)
        out = w[..., :T] @ heads(vs[0])
        for i, vd in enumerate(diag_v):
            out = out + w[..., T + i:T + i + 1] * vd
        return out.transpose(1, 2)


def head_windows(opts: StageOpts, stream: np.ndarray, seed: int):
    """The batches a draft head trains on: seeded corpus windows of `stream`, or with opts.extra['regen_data']
    (comma-separated .npy files of `regenerate_segments`) rows of the target's own continuations."""
    files = opts.extra.get("regen_data")
    if not files:
        return Windows(stream, opts.batch_size, opts.seq_len + 1, seed)
    return SegmentWindows(load_segments(files), opts.batch_size, opts.seq_len + 1, seed)


def corpus_windows(opts: StageOpts, stream: np.ndarray, seed: int) -> Windows:
    """Seeded windows of opts.seq_len tokens of `stream` (a stage that reads no regenerated data)."""
    return Windows(stream, opts.batch_size, opts.seq_len, seed)


def stage_batches(target, data, opts: StageOpts, length: int, seed: int, corpus_batches):
    """-> (teacher, windows): what a stage's loss calls as the frozen target and where its batches of `length`
    tokens come from. Without data, the target itself over corpus_batches(opts, train stream, seed) (`head_windows`
    or `corpus_windows`, which know their own length); with data (`record.RecordedData`), the target's recorded
    outputs over windows of the recording."""
    if data is None:
        return target, corpus_batches(opts, corpus.token_stream("train"), seed)
    return data.teacher, data.windows(opts.batch_size, length, seed)


def regen_stats(opts: StageOpts) -> dict:
    """What the card records of the regenerated data a head trained on (nothing for corpus windows)."""
    files = opts.extra.get("regen_data")
    if not files:
        return {}
    seg = load_segments(files)
    return {"regen_data": {"files": [Path(f).name for f in files.split(",") if f], "segments": int(seg.shape[0]),
                           "segment_len": int(seg.shape[1]),
                           "sha256": hashlib.sha256(seg.tobytes()).hexdigest()[:16]}}


def eagle_unrolled(head, hidden: torch.Tensor, input_ids: torch.Tensor, passes: int):
    """hidden: (B, T, H) the target's h_t (an EAGLE-3 head: its features, (B, T, F * H)); input_ids:
    (B, T) x_{t+1} -> list of `passes` pairs (logits (B, T, V or draft_vocab_size), hidden_out (B, T, H)).

    Pass 0 is the draft extend (reads h_t); pass j >= 1 at position t reads pass j-1's output hidden at
    t-1 and stands for draft step j anchored at the last real position t - j, attending to the keys
    `ttt_mask` draws (`TTT_OPS`). Every pass at t predicts x_{t+2}; pass j is meaningful for t >= j only."""
    B, T = input_ids.shape
    cfg = head.config
    dev = input_ids.device
    cos, sin = rope_cos_sin(position_grid(B, T, dev), cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    zeros = torch.zeros(B, dtype=torch.long, device=dev)
    meta = AttentionMetadata(slots=zeros, cache_start=zeros, attn_len=T, ops=TTT_OPS)
    # the head's step with gradients (its forward's cached path is inference only) on its one decoder layer,
    # whose passes' keys and values `kv` keeps
    kv = (_PassKV(T), _PassKV(T))
    h_in = hidden
    outs = []
    for _ in range(passes):
        out_h = head.step(input_ids, h_in, cos, sin, kv, meta)
        outs.append((head.compute_logits(out_h).float(), out_h))
        # position 0 of a later pass is never read by a query that counts (see ttt_mask): any filler will do
        h_in = torch.cat([out_h[:, :1], out_h[:, :-1]], dim=1)
    return outs


def _target_features(target, x: torch.Tensor, amp: bool, features=None):
    """-> the frozen target's logits (B, T, V) and hidden (B, T, H) in fp32; with `features`, the
    concatenated residual streams entering those layers (B, T, F * H) instead of the hidden."""
    with torch.no_grad(), train_autocast(amp):
        out = target(x, position_grid(*x.shape, x.device), features=features)
    return out.logits.float(), (out.hidden if features is None else out.features).float()


def eagle_loss(target, head, batch: torch.Tensor, passes: int, w_reg: float, w_cls: float, amp: bool):
    """batch: (B, T+1) = x_0..x_T -> (loss, parts). Pass j at t (j <= t <= T-2) regresses onto h_{t+1}
    and matches the target's distribution z_{t+1}; pass losses are averaged."""
    x = batch[:, :-1]
    B, T = x.shape
    z, h = _target_features(target, x, amp)
    p = torch.softmax(z, dim=-1)
    with train_autocast(amp):
        outs = eagle_unrolled(head, h, batch[:, 1:], passes)
    t = torch.arange(T, device=x.device)[None, :]
    total, parts = 0.0, {}
    for j, (logits, out_h) in enumerate(outs):
        mask = ((t >= j) & (t <= T - 2)).expand(B, T)[:, :-1]
        reg = F.smooth_l1_loss(out_h[:, :-1].float(), h[:, 1:], reduction="none").mean(-1)
        reg = (reg * mask).sum() / mask.sum()
        cls = soft_ce(logits[:, :-1], p[:, 1:], mask)
        total = total + (w_reg * reg + w_cls * cls) / passes
        parts[f"ce{j + 1}"] = float(cls.detach())
    return total, parts


def train_eagle(target, opts: StageOpts, seed: int = 0, log=print, data=None):
    """-> (trained EagleDraftHead fp32, stats). The target is frozen; embedding and LM head are shared. data: where
    the batches and the target's outputs come from (`specdec.zoo.train.record.RecordedData`; default the corpus,
    the target run on each batch)."""
    passes = int(opts.extra.get("unroll", 3))
    w_reg, w_cls = float(opts.extra.get("w_reg", 1.0)), float(opts.extra.get("w_cls", 1.0))
    freeze(target)
    torch.manual_seed(seed)
    head = EagleDraftHead(draft_config_like(target, 1), target)
    init_weights_(head, 1, seed + 10)
    head = on_target_device(head, target).train()
    teacher, windows = stage_batches(target, data, opts, opts.seq_len + 1, seed + 11, head_windows)
    stats = run_stage_loop("eagle", opts, head.named_parameters(),
                      lambda b: eagle_loss(teacher, head, b, passes, w_reg, w_cls, opts.amp), windows, seed + 12,
                      None, log)
    stats.update(regen_stats(opts) if data is None else data.stats())
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


def draft_vocab_targets(head, z: torch.Tensor):
    """z: (B, T, V) target logits -> (the target's distribution over the head's vocabulary (B, T, Vd),
    renormalised; (B, T) bool: the target's argmax is an id the head can propose). An EAGLE head's
    vocabulary is the target's."""
    if not isinstance(head, Eagle3DraftHead):
        return torch.softmax(z, dim=-1), torch.ones(z.shape[:-1], dtype=torch.bool, device=z.device)
    vocab = head.draft_to_target(torch.arange(head.config.draft_vocab_size, device=z.device))
    return torch.softmax(z[..., vocab], dim=-1), head.t2d[z.argmax(-1)]


def pass_weights(passes: int, decay: float = 1.0) -> list[float]:
    """The unrolled passes' loss weights: decay ** j for pass j, normalised to sum to 1 (decay 1: the mean).
    The EAGLE-3 paper's trainer weighs pass j by 0.8 ** j (its sum; normalised here so that the loss, and what
    gradient clipping sees, stays on the scale of one pass's cross-entropy whatever the number of passes)."""
    if passes < 1 or not decay > 0:
        raise ValueError(f"passes must be >= 1 and decay > 0, got {passes} and {decay}")
    w = [decay ** j for j in range(passes)]
    return [x / sum(w) for x in w]


def eagle3_loss(target, head, batch: torch.Tensor, passes: int, amp: bool, decay: float = 1.0,
                w_reg: float = 0.0):
    """batch: (B, T+1) = x_0..x_T -> (loss, parts). Pass j at t (j <= t <= T-2) matches the target's
    distribution z_{t+1} restricted to the draft vocabulary, where the target's argmax is in it (as EAGLE-3
    trains: cross-entropy only, no feature regression; with the whole vocabulary, every position); pass losses
    are weighted by `pass_weights(passes, decay)`. w_reg > 0 adds EAGLE's regression, which the paper drops:
    w_reg times the smooth-L1 distance between what the head's LM head reads (its final norm of its output
    hidden) and what the target's reads at t+1, at every position of the pass."""
    x = batch[:, :-1]
    B, T = x.shape
    if w_reg > 0:
        with torch.no_grad(), train_autocast(amp):
            out = target(x, position_grid(B, T, x.device), features=head.feature_layers)
        z, feats, h = out.logits.float(), out.features.float(), out.hidden.float()
    else:
        z, feats = _target_features(target, x, amp, head.feature_layers)
    p, in_vocab = draft_vocab_targets(head, z)
    with train_autocast(amp):
        outs = eagle_unrolled(head, feats, batch[:, 1:], passes)
    t = torch.arange(T, device=x.device)[None, :]
    total, parts = 0.0, {}
    for j, ((logits, out_h), w) in enumerate(zip(outs, pass_weights(passes, decay))):
        window = ((t >= j) & (t <= T - 2)).expand(B, T)[:, :-1]
        ce = soft_ce(logits[:, :-1], p[:, 1:], window & in_vocab[:, 1:])
        total = total + w * ce
        parts[f"ce{j + 1}"] = float(ce.detach())
        if w_reg > 0:
            read = out_h if head.config.norm_output else head.norm(out_h)
            reg = F.smooth_l1_loss(read[:, :-1].float(), h[:, 1:], reduction="none").mean(-1)
            total = total + w * w_reg * (reg * window).sum() / window.sum()
    return total, parts


def train_eagle3(target, opts: StageOpts, seed: int = 0, log=print, data=None):
    """-> (trained Eagle3DraftHead fp32, stats). Its draft vocabulary is the opts.extra['draft_vocab_size']
    most frequent ids of the train stream (default: the whole vocabulary, d2t the identity); its features the
    inputs of opts.extra['feature_layers'] (default `zoo_feature_layers`); opts.extra['unroll'] training-time-test
    passes weighted by opts.extra['pass_weight_decay'] ** j (default 1: the mean); opts.extra['w_reg'] the weight of
    EAGLE's hidden-state regression (default 0: the paper's cross-entropy only, `eagle3_loss`);
    opts.extra['freeze_lm_head'] keeps the LM head's rows the target's (default: trained). The target is frozen;
    the token embedding is shared, the LM head is the head's. data: as `train_eagle` (its tokens pick the draft
    vocabulary)."""
    passes = int(opts.extra.get("unroll", 3))
    decay = float(opts.extra.get("pass_weight_decay", 1.0))
    w_reg = float(opts.extra.get("w_reg", 0.0))
    stream = corpus.token_stream("train") if data is None else data.stream
    V = target.config.vocab_size
    vocab = draft_vocabulary(stream, V, int(opts.extra.get("draft_vocab_size") or V))
    L = target.config.num_hidden_layers
    layers = list(opts.extra.get("feature_layers") or zoo_feature_layers(L))
    if not all(0 <= i <= L for i in layers):
        raise ValueError(f"feature_layers must be layer indices in [0, {L}] (the target's {L} layers; {L}: the last "
                         f"layer's output), got {layers}")
    norms = {k: bool(opts.extra.get(k, False)) for k in ("norm_before_fc", "fc_norm", "norm_output")}
    freeze(target)
    torch.manual_seed(seed)
    head = on_target_device(new_eagle3_head(target, vocab, layers, seed + 40, **norms), target)
    freeze_lm_head = bool(opts.extra.get("freeze_lm_head", False))
    if freeze_lm_head:  # its rows stay the target's: the same head then runs with any draft vocabulary
        head.lm_head.weight.requires_grad_(False)
    head.train()
    teacher, windows = stage_batches(target, data, opts, opts.seq_len + 1, seed + 41, head_windows)
    stats = run_stage_loop("eagle3", opts, head.named_parameters(),
                      lambda b: eagle3_loss(teacher, head, b, passes, opts.amp, decay, w_reg), windows, seed + 42,
                      None, log)
    counts = np.bincount(np.asarray(stream, dtype=np.int64), minlength=V)
    stats.update(unroll=passes, pass_weight_decay=decay, w_reg=w_reg, draft_vocab_size=len(vocab),
                 feature_layers=layers, **norms,
                 draft_vocab_train_coverage=round(float(counts[vocab.numpy()].sum() / counts.sum()), 6),
                 **(regen_stats(opts) if data is None else data.stats()))
    return head.eval(), stats


# ----------------------------------------------------------------------------------------------
# MTP layers (MiMo and Step-3.5 styles)
# ----------------------------------------------------------------------------------------------

def mtp_forward(model: MTPDraftModel, hidden: torch.Tensor, tokens: torch.Tensor, T: int):
    """hidden: (B, T, H) the target's h_t; tokens: (B, >= T + S) x_0.. -> list over layers k of
    (logits (B, T, V), hidden_out (B, T, H)); layer k at t reads x_{t+k+1} and predicts x_{t+k+2}."""
    B = hidden.shape[0]
    pos = position_grid(B, T, hidden.device)
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
    with train_autocast(amp):
        outs = mtp_forward(model, h, batch, T)
    total, parts = 0.0, {}
    for k, (logits, _) in enumerate(outs):
        n = T - k - 1  # positions t = 0 .. T-k-2
        mask = torch.ones(batch.shape[0], n, dtype=torch.bool, device=batch.device)
        ce = soft_ce(logits[:, :n], p[:, k + 1:k + 1 + n], mask)
        total = total + ce / S
        parts[f"ce{k + 1}"] = float(ce.detach())
    return total, parts


def train_mtp(target, opts: StageOpts, chain_hidden_states: bool = False, seed: int = 0, log=print):
    """-> (trained MTPDraftModel fp32 with opts.extra['num_layers'] layers, stats). The layers are trained
    jointly; MiMo style (chain_hidden_states=False) or Step-3.5 style (True)."""
    S = int(opts.extra.get("num_layers", 3))
    freeze(target)
    off = 30 if chain_hidden_states else 20
    torch.manual_seed(seed + off)
    model = MTPDraftModel(draft_config_like(target, S, chain_hidden_states), target)
    init_weights_(model, S, seed + off)
    model = on_target_device(model, target).train()
    windows = Windows(corpus.token_stream("train"), opts.batch_size, opts.seq_len + S, seed + off + 1)
    name = "mtp_chain" if chain_hidden_states else "mtp"
    stats = run_stage_loop(name, opts, model.named_parameters(), lambda b: mtp_loss(target, model, b, opts.amp),
                      windows, seed + off + 2, None, log)
    return model.eval(), stats


def train_mtp_chain(target, opts: StageOpts, seed: int = 0, log=print):
    """`train_mtp` in Step-3.5 style: the `mtp_chain` kind's stage."""
    return train_mtp(target, opts, True, seed, log)


# ----------------------------------------------------------------------------------------------
# draft LM (STANDALONE): a small causal LM of the target's vocabulary, distilled from the target
# ----------------------------------------------------------------------------------------------

#: the draft LM's shape keys in its stage's `opts.extra`
DRAFT_LM_SHAPE = ("num_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")


def new_draft_lm(target, extra, seed: int) -> LlamaForCausalLM:
    """An untrained draft LM for `target`: a Llama of the target's vocabulary, rotary base and context, shaped by
    `extra`'s `DRAFT_LM_SHAPE` keys, with `init_weights_`. It shares no weight with the target (its own embedding,
    decoder and LM head), so it is a standalone LM as STANDALONE drafting loads one. extra['tie_word_embeddings']:
    one matrix for its embedding and LM head (a large vocabulary's draft then ships half the bytes);
    extra['embed_from_target']: its embedding starts as the target's projected onto the target embedding's
    `hidden_size` principal directions (so a narrow draft starts with the target's notion of which ids are alike)."""
    missing = [k for k in DRAFT_LM_SHAPE if k not in extra]
    if missing:
        raise ValueError(f"the draft LM's shape lacks {missing} (opts.extra)")
    L, H, inter, heads, kv = (int(extra[k]) for k in DRAFT_LM_SHAPE)
    tc = target.config
    cfg = LlamaConfig(vocab_size=tc.vocab_size, hidden_size=H, intermediate_size=inter, num_hidden_layers=L,
                      num_attention_heads=heads, num_key_value_heads=kv, rope_theta=tc.rope_theta,
                      rope_scaling=tc.rope_scaling, max_position_embeddings=tc.max_position_embeddings,
                      tie_word_embeddings=bool(extra.get("tie_word_embeddings", False)))
    lm = LlamaForCausalLM(cfg)
    init_weights_(lm, L, seed)
    if extra.get("embed_from_target", False):
        with torch.no_grad():
            e = target.model.embed_tokens.weight.float()
            centred = e - e.mean(0)
            _, _, vh = torch.linalg.svd(centred[torch.randperm(len(e), generator=torch.Generator().manual_seed(seed))
                                                [:8192]], full_matrices=False)
            proj = centred @ vh[:H].T
            lm.model.embed_tokens.weight.copy_(proj * (0.02 / proj.std()))
            if not cfg.tie_word_embeddings:
                lm.lm_head.weight.copy_(lm.model.embed_tokens.weight)
    return lm


def draft_lm_loss(target, lm, batch: torch.Tensor, amp: bool):
    """batch: (B, T) -> (loss, parts): mean over the T positions of the draft LM's cross-entropy against the
    target's next-token distribution, both reading the same bytes (distillation: a draft is accepted where it
    agrees with the target, not with the text); parts: that loss and the top-1 agreement."""
    z, _ = _target_features(target, batch, amp)
    with train_autocast(amp):
        logits = lm(batch, position_grid(*batch.shape, batch.device)).logits.float()
    ce = soft_ce(logits, torch.softmax(z, dim=-1), torch.ones(batch.shape, dtype=torch.bool, device=batch.device))
    agree = (logits.detach().argmax(-1) == z.argmax(-1)).float().mean()
    return ce, {"ce": float(ce.detach()), "agree": float(agree)}


def train_draft_lm(target, opts: StageOpts, seed: int = 0, log=print, data=None):
    """-> (trained draft LM, a LlamaForCausalLM fp32, stats). Shaped by opts.extra (`DRAFT_LM_SHAPE`), distilled
    from the frozen target on windows of opts.seq_len bytes. Its step cost is measured after training, by the bench
    (`specdec.bench.suites.draft_cost`)."""
    freeze(target)
    torch.manual_seed(seed + 50)
    lm = on_target_device(new_draft_lm(target, opts.extra, seed + 50), target).train()
    teacher, windows = stage_batches(target, data, opts, opts.seq_len, seed + 51, corpus_windows)
    stats = run_stage_loop("draft_lm", opts, lm.named_parameters(), lambda b: draft_lm_loss(teacher, lm, b, opts.amp),
                      windows, seed + 52, None, log)
    if data is not None:
        stats.update(data.stats())
    lm.eval()
    return lm, stats


# ----------------------------------------------------------------------------------------------
# DFlash block drafter: a block of mask tokens after an anchor, attending to the target's features
# ----------------------------------------------------------------------------------------------

#: the DFlash drafter's keys in its stage's `opts.extra`
DFLASH_SHAPE = ("num_layers", "block_size")


def dflash_blocks(T: int, anchors: torch.Tensor, block_size: int, device="cpu"):
    """anchors: (B, N) int64 block starts in [1, T - block_size] -> (positions (B, N * bs) of the block tokens,
    mask (B, N * bs, T + N * bs) bool): block m's queries see the context keys at positions < its anchor and every
    key of block m (non-causal), as one inference step sees the committed context and its block."""
    B, N = anchors.shape
    j = torch.arange(block_size, device=device)
    positions = (anchors[:, :, None] + j).reshape(B, N * block_size)
    block_of = torch.arange(N, device=device).repeat_interleave(block_size)
    ctx = torch.arange(T, device=device)[None, None, :] < anchors.repeat_interleave(block_size, dim=1)[:, :, None]
    own = (block_of[:, None] == block_of[None, :])[None].expand(B, -1, -1)
    return positions, torch.cat([ctx, own], dim=2)


def dflash_loss(target, model, batch: torch.Tensor, blocks: int, gamma: float, amp: bool, gen: torch.Generator):
    """batch: (B, T) -> (loss, parts). `blocks` random anchors p per window; the block is x_p then mask tokens at
    p..p+bs-1 over the context features of x_0..x_{p-1}; block position j >= 1 matches the target's distribution
    for x_{p+j} (at position p+j-1), weighted exp(-(j-1)/gamma) (the DFlash paper's decay); parts: the weighted
    loss and the top-1 agreement at positions 1 and bs-1."""
    B, T = batch.shape
    bs = model.block_size
    blocks = min(blocks, T - bs)
    z, feats = _target_features(target, batch, amp, model.feature_layers)
    anchors = torch.stack([torch.randperm(T - bs, generator=gen)[:blocks] + 1 for _ in range(B)]).sort(1).values
    positions, mask = dflash_blocks(T, anchors.to(batch.device), bs, batch.device)
    ids = batch.gather(1, positions)
    ids.view(B, blocks, bs)[:, :, 1:] = model.mask_token_id
    with train_autocast(amp):
        hidden = model.forward_dense(feats, position_grid(B, T, batch.device), ids, positions, mask)
        logits = model.compute_logits(hidden).view(B, blocks, bs, -1)[:, :, 1:]
    label_pos = (positions.view(B, blocks, bs)[:, :, 1:] - 1).reshape(B, -1)
    zl = z.gather(1, label_pos[:, :, None].expand(-1, -1, z.shape[-1])).view(B, blocks, bs - 1, -1)
    lp = torch.log_softmax(logits.float(), -1)
    ce = -(torch.softmax(zl, -1) * lp).sum(-1)  # (B, blocks, bs - 1)
    w = torch.exp(-torch.arange(bs - 1, dtype=torch.float32, device=batch.device) / gamma)
    loss = (ce.mean((0, 1)) * w).sum() / w.sum()
    agree = (logits.detach().argmax(-1) == zl.argmax(-1)).float().mean((0, 1))
    return loss, {"ce": float(loss.detach()), "agree1": float(agree[0]), f"agree{bs - 1}": float(agree[-1])}


def context_layer_ids(target, ex: dict, num_layers: int) -> list[int]:
    """The target layers a block drafter (DFlash, DSpark) reads: `ex["target_layer_ids"]`, else z-lab's rule for
    `num_context_layers`, clipped to the layers a shallow target has."""
    T = target.config.num_hidden_layers
    return ex.get("target_layer_ids") or sorted({min(max(i, 0), T - 2) for i in build_target_layer_ids(
        T, int(ex.get("num_context_layers", num_layers)))})


def norm_from_target(model, target, ex: dict) -> None:
    """With `ex["norm_from_target"]`, a block drafter's output norm starts as the target's, whose LM head reads it."""
    if ex.get("norm_from_target", False):
        with torch.no_grad():
            model.norm.weight.copy_(target.model.norm.weight)


def train_dflash(target, opts: StageOpts, seed: int = 0, log=print, data=None):
    """-> (trained DFlashDraftModel fp32, stats). opts.extra: num_layers, block_size, blocks_per_window (anchors
    per window), gamma (the loss's decay by block position), target_layer_ids (default z-lab's
    `build_target_layer_ids` for num_context_layers layers, the drafter's layer count unless given). The target is
    frozen; its embedding and LM head are the drafter's; the mask token is opts.extra['mask_token_id'] (default the
    byte vocabulary's BOS id, never inside a window). data: as `train_eagle`. Its
    block cost is measured after training, by the bench (`specdec.bench.suites.draft_cost`)."""
    ex = opts.extra
    L, bs = int(ex.get("num_layers", 2)), int(ex.get("block_size", 8))
    freeze(target)
    torch.manual_seed(seed + 60)
    shape = {k: int(ex[k]) for k in ("intermediate_size",) if k in ex}
    T = target.config.num_hidden_layers
    if T < 2:
        raise ValueError(f"a DFlash drafter reads the outputs of target layers 0..L-2: a {T}-layer target has none")
    layer_ids = context_layer_ids(target, ex, L)
    mask_id = int(ex.get("mask_token_id", ByteTokenizer.bos_token_id))
    model = DFlashDraftModel(dflash_config_like(target, L, bs, layer_ids, mask_id, **shape), target)
    init_weights_(model, L, seed + 60)
    norm_from_target(model, target, ex)
    model = on_target_device(model, target).train()
    cpu0 = time.process_time()
    teacher, windows = stage_batches(target, data, opts, opts.seq_len, seed + 61, corpus_windows)
    gen = torch.Generator().manual_seed(seed + 63)
    blocks, gamma = int(ex.get("blocks_per_window", 24)), float(ex.get("gamma", 4.0))
    stats = run_stage_loop("dflash", opts, model.named_parameters(),
                      lambda b: dflash_loss(teacher, model, b, blocks, gamma, opts.amp, gen), windows, seed + 62,
                      None, log)
    if data is not None:
        stats.update(data.stats())
    model.eval()
    stats["train_cpu_seconds"] = round(time.process_time() - cpu0, 1)  # wall time counts other processes' load
    stats["target_layer_ids"] = list(model.config.target_layer_ids)
    return model, stats


# ----------------------------------------------------------------------------------------------
# DSpark block drafter: DFlash's block with every position proposing, a Markov head and a confidence head
# ----------------------------------------------------------------------------------------------

#: DeepSpec's loss weights (its released configs): the block's cross-entropy on the data's tokens, the total
#: variation between the drafter's and the target's distributions, the confidence head's binary cross-entropy
DSPARK_LOSS_WEIGHTS = {"ce": 0.1, "l1": 0.9, "confidence": 1.0}


def dspark_loss(target, model, batch: torch.Tensor, blocks: int, gamma: float, weights: dict, amp: bool,
                gen: torch.Generator):
    """batch: (B, T) -> (loss, parts), DeepSpec's loss. `blocks` random anchors p per window; the block is x_p then
    mask tokens at p..p+bs-1 over the context features of x_0..x_{p-1}; block position j proposes x_{p+j+1}, its
    logits Markov-refined by the token before it (teacher-forced: x_{p+j}). Per position, weighted
    exp(-j/gamma): the cross-entropy on x_{p+j+1}, the total variation |q - p|_1 against the target's distribution
    at p+j, and the confidence head's binary cross-entropy against the acceptance rate 1 - |q - p|_1 / 2 (a
    constant target); `weights` scales the three. parts: each term and the top-1 agreement with the target at the
    first and last position."""
    B, T = batch.shape
    bs = model.block_size
    blocks = min(blocks, T - bs - 1)
    z, feats = _target_features(target, batch, amp, model.feature_layers)
    anchors = torch.stack([torch.randperm(T - bs - 1, generator=gen)[:blocks] + 1 for _ in range(B)]).sort(1).values
    positions, mask = dflash_blocks(T, anchors.to(batch.device), bs, batch.device)
    before = batch.gather(1, positions)  # x_{p+j}: the token each position's proposal follows
    ids = before.clone()
    ids.view(B, blocks, bs)[:, :, 1:] = model.mask_token_id
    with train_autocast(amp):
        hidden = model.forward_dense(feats, position_grid(B, T, batch.device), ids, positions, mask)
        logits = model.refine_logits(model.compute_logits(hidden), before, hidden)
        confidence = model.confidence_logits(hidden, before)
    lq = torch.log_softmax(logits.float(), -1)
    pt = torch.softmax(z.gather(1, positions[:, :, None].expand(-1, -1, z.shape[-1])), -1)
    ce = F.nll_loss(lq.flatten(0, 1), batch.gather(1, positions + 1).flatten(), reduction="none").view(B, -1)
    tv = (lq.exp() - pt).abs().sum(-1)
    w = torch.exp(-torch.arange(bs, dtype=torch.float32, device=batch.device) / gamma)

    def by_position(x):  # (B, blocks * bs) -> the decay-weighted mean over positions of the per-position means
        return (x.view(B, blocks, bs).mean((0, 1)) * w).sum() / w.sum()

    terms = {"ce": by_position(ce), "l1": by_position(tv)}
    if confidence is not None:
        accept = (1 - tv.detach() / 2).clamp(0, 1)
        terms["confidence"] = by_position(F.binary_cross_entropy_with_logits(confidence.float(), accept,
                                                                             reduction="none"))
    loss = sum(weights[k] * v for k, v in terms.items())
    agree = (logits.detach().argmax(-1) == pt.argmax(-1)).float().view(B, blocks, bs).mean((0, 1))
    parts = {k: float(v.detach()) for k, v in terms.items()}
    parts.update({"agree1": float(agree[0]), f"agree{bs}": float(agree[-1])})
    return loss, parts


def train_dspark(target, opts: StageOpts, seed: int = 0, log=print, data=None):
    """-> (trained DSparkDraftModel fp32, stats). opts.extra: num_layers, block_size (DeepSpec's: 7),
    blocks_per_window, gamma (the loss's decay by block position, DeepSpec's 4), markov_rank, markov_head_type,
    confidence_head, confidence_head_with_markov, loss_weights (`DSPARK_LOSS_WEIGHTS` by default),
    target_layer_ids (default z-lab's rule for num_context_layers, as DFlash's), mask_token_id (default the byte
    vocabulary's BOS id), norm_from_target. The target is frozen; its embedding and LM head are the drafter's (a
    DSpark checkpoint carries copies of them). data: as `train_eagle`."""
    ex = opts.extra
    L, bs = int(ex.get("num_layers", 2)), int(ex.get("block_size", 7))
    freeze(target)
    torch.manual_seed(seed + 70)
    T = target.config.num_hidden_layers
    if T < 2:
        raise ValueError(f"a DSpark drafter reads the outputs of target layers -1..L-2: a {T}-layer target has too "
                         f"few")
    layer_ids = context_layer_ids(target, ex, L)
    heads = {k: ex[k] for k in ("markov_rank", "markov_head_type", "confidence_head", "confidence_head_with_markov",
                                "intermediate_size") if k in ex}
    mask_id = int(ex.get("mask_token_id", ByteTokenizer.bos_token_id))
    model = DSparkDraftModel(dspark_config_like(target, L, bs, layer_ids, mask_id, **heads), target)
    init_weights_(model, L, seed + 70)
    norm_from_target(model, target, ex)
    model = on_target_device(model, target).train()
    cpu0 = time.process_time()
    teacher, windows = stage_batches(target, data, opts, opts.seq_len, seed + 71, corpus_windows)
    gen = torch.Generator().manual_seed(seed + 73)
    blocks, gamma = int(ex.get("blocks_per_window", 24)), float(ex.get("gamma", 4.0))
    weights = dict(DSPARK_LOSS_WEIGHTS, **ex.get("loss_weights", {}))
    stats = run_stage_loop("dspark", opts, model.named_parameters(),
                           lambda b: dspark_loss(teacher, model, b, blocks, gamma, weights, opts.amp, gen), windows,
                           seed + 72, None, log)
    if data is not None:
        stats.update(data.stats())
    model.eval()
    stats["train_cpu_seconds"] = round(time.process_time() - cpu0, 1)
    stats["target_layer_ids"] = list(model.config.target_layer_ids)
    return model, stats
