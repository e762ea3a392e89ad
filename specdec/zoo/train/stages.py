"""The stages' models and losses (target; EAGLE and EAGLE-3 heads with training-time-test unrolling; MTP layers
in two styles; a standalone draft LM), each trained by `train_<stage>` through the shared loop."""
from __future__ import annotations

import hashlib
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


def target_features(target, x: torch.Tensor, amp: bool, features=None):
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
    z, h = target_features(target, x, amp)
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
        z, feats = target_features(target, x, amp, head.feature_layers)
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
    z, h = target_features(target, x, amp)
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
    z, _ = target_features(target, batch, amp)
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
