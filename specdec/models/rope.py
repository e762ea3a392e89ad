"""Rotary position embeddings: the rope types real checkpoints use, as one frequency table per config.

`RopeScaling` is the config's `rope_scaling` (transformers 4.x) / `rope_parameters` (5.x) minus the base:
default (none), linear (positions divided by `factor`), llama3 (Llama 3.1: long wavelengths divided by
`factor`, short ones kept, a smooth blend between) and yarn (YaRN: per-frequency blend of interpolation and
extrapolation over a ramp set by `beta_fast` / `beta_slow`, and cos / sin scaled by an attention factor).
Dynamic NTK scaling is refused: it re-derives the frequencies from each forward's longest position, so a
speculative verify and a target-only step would rotate the same position differently.

A forward with a KV cache looks its positions' cos and sin up in `rope_table` (positions 0 .. the cache's length - 1,
built once) with one gather, where computing them costs five kernels; without a cache (training) they are computed.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from ..checks import check_real

#: For each rope type: the fields it requires, and the ones it may have.
_FIELDS = {
    "default": (set(), set()),
    "linear": ({"factor"}, set()),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}, set()),
    "yarn": ({"factor", "original_max_position_embeddings"},
             {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
}


def normalize_rope_scaling(spec, where: str) -> dict | None:
    """A config's rope_scaling / rope_parameters (without rope_theta) -> {"rope_type": ..., fields} or None
    for the default rope. Unknown types, missing or unknown fields, and non-numeric values are ValueErrors."""
    if spec in (None, {}):
        return None
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: rope scaling {spec!r} must be a JSON object")
    spec = {k: v for k, v in spec.items() if k != "rope_theta"}
    kind = spec.pop("rope_type", spec.pop("type", "default"))
    if kind == "dynamic":
        raise ValueError(f"{where}: rope_type='dynamic' is not implemented: dynamic NTK scaling derives the "
                         f"frequencies from each forward's longest position, so speculative and target-only "
                         f"decoding would rotate the same position differently")
    if kind not in _FIELDS:
        raise ValueError(f"{where}: rope_type={kind!r} is not implemented (supported: {sorted(_FIELDS)})")
    required, optional = _FIELDS[kind]
    missing = sorted(required - set(spec))
    unknown = sorted(set(spec) - required - optional)
    if missing or unknown:
        raise ValueError(f"{where}: rope_type={kind!r} needs {sorted(required)}"
                         + (f"; missing {missing}" if missing else "") + (f"; unknown {unknown}" if unknown else ""))
    for k, v in spec.items():
        if k == "truncate":
            if not isinstance(v, bool):
                raise ValueError(f"{where}: rope field truncate must be true or false, got {v!r}")
        elif v is not None and not check_real(f"{where}: rope field {k}", v) > 0:
            raise ValueError(f"{where}: rope field {k} must be a number > 0, got {v!r}")
    if kind == "default":
        return None
    return {"rope_type": kind, **spec}


def _default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def _llama3(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    context = s["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    # wavelengths longer than context / low are slowed by `factor`, shorter than context / high kept; between
    # the two, a linear blend in context / wavelength
    blend = ((context / wavelength - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - blend) * inv_freq / factor + blend * inv_freq


def _yarn(head_dim: int, theta: float, s: dict) -> tuple[torch.Tensor, float]:
    factor, context = s["factor"], s["original_max_position_embeddings"]
    fast, slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def dim_for(rotations):  # the frequency index whose wavelength fits `rotations` turns in the context
        return head_dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = dim_for(fast), dim_for(slow)
    if s.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, head_dim - 1)
    if hi == lo:
        hi += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0.0, 1.0)
    extrapolated = _default_inv_freq(head_dim, theta)
    keep = 1 - ramp  # high frequencies (small index) extrapolate, low ones interpolate
    inv_freq = extrapolated / factor * (1 - keep) + extrapolated * keep

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = s.get("attention_factor")
    if attention is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return inv_freq, float(attention)


@functools.cache
def rope_tables(head_dim: int, theta: float, scaling: tuple | None, device: torch.device) -> tuple[torch.Tensor, float]:
    """-> inv_freq (head_dim / 2,) fp32 on `device`, and the factor cos and sin are scaled by.
    scaling: the normalized rope_scaling as sorted (key, value) items, or None.

    Never evicts: a captured CUDA graph reads the returned tensor's memory at every replay, and an evicted
    entry would free it under the graph. An entry is head_dim / 2 floats per model config and device."""
    s = dict(scaling) if scaling else {"rope_type": "default"}
    kind = s["rope_type"]
    attention = 1.0
    with torch.inference_mode(False), torch.no_grad():  # plain tensors, usable under autograd later
        if kind == "yarn":
            inv_freq, attention = _yarn(head_dim, theta, s)
        else:
            inv_freq = _default_inv_freq(head_dim, theta)
            if kind == "linear":
                inv_freq = inv_freq / s["factor"]
            elif kind == "llama3":
                inv_freq = _llama3(inv_freq, s)
        return inv_freq.to(device), attention


def _scaling_key(scaling: dict | None) -> tuple | None:
    return tuple(sorted(scaling.items())) if scaling else None


def _cos_sin(positions, head_dim: int, theta: float, key: tuple | None):
    inv_freq, attention = rope_tables(head_dim, theta, key, positions.device)
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    if attention == 1.0:
        return emb.cos(), emb.sin()
    return emb.cos() * attention, emb.sin() * attention


@functools.cache
def rope_table(head_dim: int, theta: float, scaling: tuple | None, device: torch.device, length: int) -> torch.Tensor:
    """-> (length, 2 * head_dim) fp32 on `device`: row p is cos then sin at position p, bit for bit what
    `rope_cos_sin` computes for p. scaling: as `rope_tables`'.

    Built by `rope_cos_sin`'s own ops, on `device`, over positions 0 .. length - 1 at once: every op is elementwise
    and deterministic, so a row equals what a forward computing its positions directly gets, on that device (a table
    built on the CPU and copied would carry the CPU's cos and sin, not the GPU's). That an element's value does not
    depend on where it sits in a long tensor was measured on the CPU, not assumed: torch 2.13 with the AVX512, AVX2
    and default kernels, 1 and 2 threads, head_dim 6 to 128, 7 to 40,000 positions, rows against (B, T) calls
    (B, T up to 17) and single positions: no bit differs; tests/models/test_rope_table.py pins it.

    Never evicts, as `rope_tables`: a captured CUDA graph reads the table at every replay. An entry is
    length * 2 * head_dim floats (4 MiB for 4096 positions of head_dim 128) per model config, device and length."""
    with torch.inference_mode(False), torch.no_grad():  # plain tensors, usable under autograd later
        cos, sin = _cos_sin(torch.arange(length, device=device)[None], head_dim, theta, scaling)
        return torch.cat([cos[0], sin[0]], dim=-1)


def rope_cos_sin(positions, head_dim: int, theta: float, scaling: dict | None = None, table_len: int | None = None):
    """positions: (B, T) int64 -> cos, sin: (B, T, head_dim) fp32 (Hugging Face's rotate-half layout), for
    the rope `scaling` describes (a normalized rope_scaling dict; None: the default rope).

    table_len: None computes them; an int looks them up in `rope_table` of positions 0 .. table_len - 1 (every
    position must be below it: a KV cache's `max_seq_len`, which no position it holds reaches), one gather for
    both: cos and sin are then views of its rows (last dimension contiguous, the same strides)."""
    key = _scaling_key(scaling)
    if table_len is None:
        return _cos_sin(positions, head_dim, float(theta), key)
    both = F.embedding(positions, rope_table(head_dim, float(theta), key, positions.device, table_len))
    return both[..., :head_dim], both[..., head_dim:]
