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
    path = Path(path)
    f = path / "model.safetensors"
    if f.is_file():
        return _load_checked(f)
    shards = sorted(path.glob("model-*.safetensors"))
    if not shards:
        raise ValueError(f"{path}: no model.safetensors")
    sd = {}
    for s in shards:
        sd.update(_load_checked(s))
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
