"""The optimisation loop every stage shares (AdamW, linear warm-up then cosine decay, gradient clipping,
bf16 autocast on CPU with fp32 master weights) and its helpers."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ...models.layers import hf_named_parameters
from .hparams import StageOpts, Windows


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


#: the device type the running stage trains on (`run_stage_loop` sets it from its parameters), for the losses'
#: autocast regions
_autocast_device = "cpu"


def train_autocast(enabled: bool):
    return torch.autocast(_autocast_device, dtype=torch.bfloat16, enabled=enabled)


def position_grid(B: int, T: int, device="cpu") -> torch.Tensor:
    return torch.arange(T, device=device)[None].expand(B, T)


def freeze(model):
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


#: what a checkpoint must agree on with the run that resumes it
_RESUME_KEYS = ("steps", "batch_size", "seq_len", "lr", "min_lr_ratio", "warmup", "weight_decay", "grad_clip")


def save_checkpoint(path: str, name: str, opts: StageOpts, step: int, params_named, opt, windows, ema, history,
                    elapsed: float, cpu_seconds: float) -> None:
    """The loop's whole state after `step` steps (weights, optimiser, RNGs, windows' RNG), written whole (a
    temporary file renamed)."""
    state = {"stage": name, "step": step, "opts": {k: getattr(opts, k) for k in _RESUME_KEYS},
             "params": {n: p.detach().clone() for n, p in params_named}, "optimizer": opt.state_dict(),
             "torch_rng": torch.get_rng_state(), "windows_rng": windows.rng.bit_generator.state, "ema": ema,
             "history": history, "elapsed": elapsed, "cpu_seconds": cpu_seconds}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str, name: str, opts: StageOpts, params_named, opt, windows):
    """Restores what `save_checkpoint` wrote into the parameters, optimiser and RNGs -> (steps done, ema,
    history, elapsed wall and CPU seconds); a checkpoint of another stage or other settings is refused."""
    state = torch.load(path, weights_only=False)
    want = {k: getattr(opts, k) for k in _RESUME_KEYS}
    if state["stage"] != name or state["opts"] != want:
        raise ValueError(f"checkpoint {path!r} is of stage {state['stage']!r} with {state['opts']}, not {name!r} "
                         f"with {want}: remove it or train with its settings")
    with torch.no_grad():
        for n, p in params_named:
            p.copy_(state["params"][n])
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    windows.rng.bit_generator.state = state["windows_rng"]
    return state["step"], state["ema"], state["history"], state["elapsed"], state["cpu_seconds"]


def run_stage_loop(name: str, opts: StageOpts, params_named, loss_fn, windows: Windows, seed: int,
              eval_fn=None, log=print) -> dict:
    """The shared training loop. loss_fn(batch) -> (loss, dict of floats for the progress bar). With
    opts.checkpoint, the state is saved every opts.checkpoint_every_s seconds, resumed from with opts.resume, and
    saved when opts.deadline passes; the stats then say `complete: False` and the steps done."""
    global _autocast_device
    torch.manual_seed(seed)
    params_named = list(params_named)
    params = [p for _, p in params_named if p.requires_grad]
    device = params[0].device
    _autocast_device = device.type
    opt = make_optimizer(params_named, opts)
    tokens_per_step = opts.batch_size * opts.seq_len
    ema, history, start, before, cpu_before = None, [], 0, 0.0, 0.0
    if opts.checkpoint and opts.resume and Path(opts.checkpoint).is_file():
        start, ema, history, before, cpu_before = load_checkpoint(opts.checkpoint, name, opts, params_named, opt,
                                                                  windows)
        log(f"[{name}] resumed from {opts.checkpoint} at step {start}")
    t0, c0 = time.time() - before, time.process_time() - cpu_before
    saved_at = time.time()
    # off where stderr is no terminal: a log file keeps the lines `log` writes every 100 steps, without carriage returns
    bar = tqdm(range(start, opts.steps), desc=f"train {name}", dynamic_ncols=True, mininterval=2.0, file=sys.stderr,
               disable=None)
    for step in bar:
        lr = lr_at(step, opts)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = windows.next().to(device)
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
        stopping = opts.checkpoint and opts.deadline and time.time() >= opts.deadline and step + 1 < opts.steps
        if opts.checkpoint and (stopping or time.time() - saved_at >= opts.checkpoint_every_s):
            save_checkpoint(opts.checkpoint, name, opts, step + 1, params_named, opt, windows, ema, history,
                            time.time() - t0, time.process_time() - c0)
            saved_at = time.time()
        if stopping:
            bar.close()
            log(f"[{name}] stopped at step {step + 1}/{opts.steps} (the time budget); resume from {opts.checkpoint}")
            return {"complete": False, "steps_done": step + 1, "steps": opts.steps,
                    "loop_cpu_seconds": round(time.process_time() - c0, 1)}
    bar.close()
    wall = time.time() - t0
    return {"steps": opts.steps, "batch_size": opts.batch_size, "seq_len": opts.seq_len,
            "tokens_seen": tokens_per_step * opts.steps, "peak_lr": opts.lr, "warmup_steps": opts.warmup,
            "min_lr_ratio": opts.min_lr_ratio, "weight_decay": opts.weight_decay, "grad_clip": opts.grad_clip,
            "bf16_autocast": opts.amp, "train_seconds": round(wall, 1), "final_train_loss_ema": round(ema, 4),
            "loop_cpu_seconds": round(time.process_time() - c0, 1),
            "tokens_per_cpu_second": round(tokens_per_step * (opts.steps - start)
                                           / max(time.process_time() - c0 - cpu_before, 1e-9), 1),
            "history": history, **opts.extra}


def num_params(module) -> int:
    return sum(p.numel() for p in module.parameters())
