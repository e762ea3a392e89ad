"""The block drafters' stages: DFlash (a block of mask tokens after an anchor, attending to the target's features)
and DSpark (DFlash's block with a Markov head and a confidence head, DeepSpec's loss), each trained by
`train_<stage>` through the shared loop on the shared stages' batches."""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ...models.dflash import DFlashDraftModel, build_target_layer_ids, dflash_config_like
from ...models.dspark import DSparkDraftModel, dspark_config_like
from ...tokenizer import ByteTokenizer
from .hparams import StageOpts
from .loop import freeze, init_weights_, position_grid, run_stage_loop, train_autocast
from .stages import target_features, corpus_windows, on_target_device, stage_batches

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
    z, feats = target_features(target, batch, amp, model.feature_layers)
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


def start_block_drafter(model, target, data, opts: StageOpts, seed: int):
    """What a new block drafter's stage does before its loop: the weights initialised (`seed`), the output norm the
    target's where `norm_from_target` asks, the model on the target's device in training mode; the teacher and
    training windows (`seed + 1`), the anchors' generator (`seed + 3`), the anchors per window and the loss's decay
    by block position -> (model, teacher, windows, generator, blocks, gamma). The loop takes `seed + 2`."""
    ex = opts.extra
    init_weights_(model, model.config.num_hidden_layers, seed)
    norm_from_target(model, target, ex)
    model = on_target_device(model, target).train()
    teacher, windows = stage_batches(target, data, opts, opts.seq_len, seed + 1, corpus_windows)
    gen = torch.Generator().manual_seed(seed + 3)
    return model, teacher, windows, gen, int(ex.get("blocks_per_window", 24)), float(ex.get("gamma", 4.0))


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
    cpu0 = time.process_time()
    model, teacher, windows, gen, blocks, gamma = start_block_drafter(model, target, data, opts, seed + 60)
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
    logits Markov-refined by the token before it (teacher-forced: x_{p+j}; an rnn head's state runs over x_p..x_{p+j}
    from zero at each block's position 0). Per position, weighted
    exp(-j/gamma): the cross-entropy on x_{p+j+1}, the total variation |q - p|_1 against the target's distribution
    at p+j, and the confidence head's binary cross-entropy against the acceptance rate 1 - |q - p|_1 / 2 (a
    constant target); `weights` scales the three. parts: each term and the top-1 agreement with the target at the
    first and last position."""
    B, T = batch.shape
    bs = model.block_size
    blocks = min(blocks, T - bs - 1)
    z, feats = target_features(target, batch, amp, model.feature_layers)
    anchors = torch.stack([torch.randperm(T - bs - 1, generator=gen)[:blocks] + 1 for _ in range(B)]).sort(1).values
    positions, mask = dflash_blocks(T, anchors.to(batch.device), bs, batch.device)
    before = batch.gather(1, positions)  # x_{p+j}: the token each position's proposal follows
    ids = before.clone()
    ids.view(B, blocks, bs)[:, :, 1:] = model.mask_token_id
    with train_autocast(amp):
        hidden = model.forward_dense(feats, position_grid(B, T, batch.device), ids, positions, mask)
        by_block = (B, blocks, bs)  # refine_logits unrolls a recurrent Markov head over each block's positions
        logits = model.refine_logits(model.compute_logits(hidden).view(*by_block, -1), before.view(by_block),
                                     hidden.view(*by_block, -1)).flatten(1, 2)
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
    cpu0 = time.process_time()
    model, teacher, windows, gen, blocks, gamma = start_block_drafter(model, target, data, opts, seed + 70)
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
