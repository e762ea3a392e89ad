"""Training text the target wrote itself: corpus prefixes followed by the target's greedy continuations.

A draft head is judged on what it drafts after a prompt, where the text it reads is the target's own output; the
corpus windows it otherwise trains on are text the target did not write. SpecForge (SGLang's EAGLE-3 trainer) offers
the same: regenerate the training responses with the target before training its head (its example samples at
temperature 0.8; here greedy, as the heads bench, the tuner and the acceptance bench decode). Here a segment is `prefix`
tokens of the train stream at a seeded random offset followed by the target's `new_tokens` greedy tokens after them
(an EOS it writes is kept and followed by what it writes next, as EOS is followed by the next file in the
train stream); a training row joins random segments (`SegmentWindows`).

`python -m specdec.zoo.train.regenerate --model NAME --segments N --seed S --out FILE.npy` writes one file of
segments; several files (written on several cores with different seeds) are joined by `--regen-data A.npy,B.npy`
of `specdec zoo train`."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ... import Engine, SamplingParams, zoo
from .. import corpus


def regenerate_segments(target, stream: np.ndarray, n: int, prefix: int, new_tokens: int, seed: int,
                        batch_size: int = 64, log=print) -> np.ndarray:
    """-> (n, prefix + new_tokens) uint16: row i is stream[s_i : s_i + prefix] (s_i seeded, uniform) followed by
    the target's first `new_tokens` greedy tokens after it (no stop ids: every segment has its full length)."""
    if n < 1 or prefix < 1 or new_tokens < 1 or batch_size < 1:
        raise ValueError(f"n, prefix, new_tokens and batch_size must be >= 1, got {n}, {prefix}, {new_tokens}, "
                         f"{batch_size}")
    if len(stream) <= prefix:
        raise ValueError(f"stream of {len(stream)} tokens is too short for prefixes of {prefix}")
    starts = np.random.default_rng(seed).integers(0, len(stream) - prefix, size=n)
    engine = Engine(target, max_batch=min(batch_size, n), max_seq_len=prefix + new_tokens + 1)
    params = SamplingParams(max_new_tokens=new_tokens)
    out = np.empty((n, prefix + new_tokens), dtype=np.uint16)
    t0 = time.time()
    for lo in range(0, n, batch_size):
        idx = range(lo, min(lo + batch_size, n))
        prompts = [stream[starts[i]:starts[i] + prefix].astype(np.int64).tolist() for i in idx]
        for i, p, o in zip(idx, prompts, engine.generate(prompts, params)):
            out[i, :prefix] = p
            out[i, prefix:] = o.token_ids
        log(f"[regenerate] {idx.stop}/{n} segments, {time.time() - t0:.0f}s")
    return out


def load_segments(paths) -> np.ndarray:
    """Comma-separated .npy files (or a list of paths) of segments of one length -> (N, length) uint16."""
    paths = [p for p in (paths.split(",") if isinstance(paths, str) else paths) if p]
    parts = []
    for p in paths:
        if not Path(p).is_file():
            raise ValueError(f"regenerated data {p!r}: no such file")
        a = np.load(p)
        if a.ndim != 2 or (parts and a.shape[1] != parts[0].shape[1]):
            raise ValueError(f"regenerated data {p!r}: segments of shape {a.shape}, expected (N, "
                             f"{parts[0].shape[1] if parts else 'length'})")
        parts.append(a)
    if not parts:
        raise ValueError("regenerated data: no file given")
    return np.concatenate(parts)


class SegmentWindows:
    """Seeded rows of regenerated segments: `next()` -> (B, length) int64, each row random segments joined end to
    end and cut to `length` (the corpus `Windows`' interface)."""

    def __init__(self, segments: np.ndarray, batch_size: int, length: int, seed: int):
        if segments.ndim != 2 or len(segments) < 1:
            raise ValueError(f"segments must be (N >= 1, L), got shape {segments.shape}")
        self.segments, self.batch_size, self.length = segments, batch_size, length
        self.per_row = -(-length // segments.shape[1])
        self.rng = np.random.default_rng(seed)

    def next(self) -> torch.Tensor:
        pick = self.rng.integers(0, len(self.segments), size=(self.batch_size, self.per_row))
        rows = self.segments[pick].reshape(self.batch_size, -1)[:, :self.length]
        return torch.from_numpy(rows.astype(np.int64))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.zoo.train.regenerate", description=__doc__)
    p.add_argument("--model", default=zoo.DEEP_NAME, help="zoo pair whose target writes (default: %(default)s)")
    p.add_argument("--segments", type=int, required=True)
    p.add_argument("--prefix", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=129)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True, help=".npy file to write")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    try:
        seg = regenerate_segments(zoo.load(a.model).target, corpus.token_stream("train"), a.segments, a.prefix,
                                  a.new_tokens, a.seed, a.batch_size, log=lambda s: print(s, file=sys.stderr))
    except ValueError as e:
        p.error(str(e))
    np.save(a.out, seg)
    print(f"wrote {a.out}: {seg.shape[0]} segments of {seg.shape[1]} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
