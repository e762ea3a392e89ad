"""Directory format shared by every model: config.json + model.safetensors (Hugging Face layout)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def save_dir(path, config_dict: dict, state_dict: dict) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    save_file({k: v.detach().contiguous().cpu() for k, v in state_dict.items()}, str(path / "model.safetensors"))


def read_config(path) -> dict:
    path = Path(path)
    f = path / "config.json"
    if not f.is_file():
        raise ValueError(f"{path}: no config.json")
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{f}: not valid JSON ({e})") from None


def _load_checked(f: Path) -> dict[str, torch.Tensor]:
    """One safetensors file -> its tensors; a file safetensors cannot parse (empty, truncated, garbled)
    or a floating-point tensor holding a NaN or an infinity is a ValueError naming the file (and key)."""
    try:
        sd = load_file(str(f))
    except Exception as e:  # safetensors raises its own SafetensorError (and OSError / ValueError variants)
        raise ValueError(f"{f}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    for key, t in sd.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(f"{f}: tensor {key!r} holds {bad} non-finite value(s) (NaN or infinity): a corrupt "
                             f"or diverged checkpoint")
    return sd


def read_state_dict(path) -> dict[str, torch.Tensor]:
    """A checkpoint directory's tensors (one file or `model-*.safetensors` shards), int8-stored matrices
    dequantized to fp32 (see `quantize_int8_matrices`)."""
    path = Path(path)
    f = path / "model.safetensors"
    if f.is_file():
        return dequantize_int8_matrices(_load_checked(f), f)
    shards = sorted(path.glob("model-*.safetensors"))
    if not shards:
        raise ValueError(f"{path}: no model.safetensors")
    sd = {}
    for s in shards:
        sd.update(_load_checked(s))
    return dequantize_int8_matrices(sd, path)


#: Suffix of the per-output-channel scale stored beside an int8 matrix `name` (SGLang's int8 layouts name
#: it `weight_scale` beside `weight`).
INT8_SCALE_SUFFIX = "_scale"


def quantize_int8_matrices(state_dict: dict, scale_dtype: torch.dtype = torch.float16) -> dict:
    """Weight-only storage: every 2-D floating-point tensor W (out, in) becomes int8 q = round(W / s) with
    s = max|W[o, :]| / 127 per output row, stored (out, 1) in `scale_dtype` under name + "_scale"; other
    tensors are returned as they are. The error per element is at most s / 2 (plus the scale's rounding)."""
    out = {}
    for name, t in state_dict.items():
        if not (t.is_floating_point() and t.dim() == 2):
            out[name] = t
            continue
        w = t.detach().float()
        scale = (w.abs().amax(dim=1, keepdim=True) / 127).to(scale_dtype)
        s = scale.float()
        q = torch.where(s > 0, w / torch.where(s > 0, s, 1.0), 0.0).round().clamp(-127, 127).to(torch.int8)
        out[name], out[name + INT8_SCALE_SUFFIX] = q, scale
    return out


def dequantize_int8_matrices(state_dict: dict, where) -> dict:
    """The inverse of `quantize_int8_matrices`: int8 `name` with a float `name_scale` (out, 1) or (out,)
    -> fp32 q * scale. A scale of the wrong shape or an int8 tensor without one is a ValueError."""
    sd = dict(state_dict)
    for name in [k for k, t in sd.items() if t.dtype == torch.int8]:
        scale = sd.pop(name + INT8_SCALE_SUFFIX, None)
        q = sd[name]
        if scale is None or not scale.is_floating_point():
            raise ValueError(f"{where}: int8 tensor {name!r} has no floating-point {name + INT8_SCALE_SUFFIX!r} "
                             f"beside it")
        if q.dim() != 2 or scale.numel() != q.shape[0] or (scale.dim() == 2 and scale.shape[1] != 1):
            raise ValueError(f"{where}: {name + INT8_SCALE_SUFFIX!r} has shape {tuple(scale.shape)}; int8 "
                             f"{name!r} of shape {tuple(q.shape)} needs one scale per row ({q.shape[0]}, 1)")
        sd[name] = q.float() * scale.float().reshape(-1, 1)
    return sd


def load_strict(module: torch.nn.Module, state_dict: dict, where) -> None:
    """load_state_dict that reports missing/unexpected/mis-shaped keys as one ValueError."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    shapes = [f"{k}: {tuple(state_dict[k].shape)} vs {tuple(own[k].shape)}"
              for k in own if k in state_dict and state_dict[k].shape != own[k].shape]
    kinds = [f"{k}: {state_dict[k].dtype}" for k in own
             if k in state_dict and own[k].is_floating_point() and not state_dict[k].is_floating_point()]
    if kinds:
        raise ValueError(f"{where}: weights must be floating point, got {kinds[:5]}")
    if missing or unexpected or shapes:
        raise ValueError(f"{where}: state dict does not match the config: missing={missing[:5]} "
                         f"unexpected={unexpected[:5]} shape mismatches={shapes[:5]}")
    module.load_state_dict(state_dict)
