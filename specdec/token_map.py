"""Hot-vocabulary token maps: which target ids a draft may propose (SGLang's `--speculative-token-map`, FR-Spec).

A token map is a list of n distinct target ids; a draft run with it computes logits for those ids only (its LM head
restricted to their rows) and proposes draft id d as target id map[d]. The target verifies as always, so the output
does not change: only how many tokens a step accepts, and what a draft step costs (its LM head reads n rows, not V).

The file format is SGLang's: `torch.save` of the ids (a list of ints or a 1-D integer tensor), read back with
`torch.load(path, weights_only=True)`. FR-Spec publishes its maps so, most frequent id first; SGLang keeps the
file's order as the draft ids', and so does specdec.

`Engine(target, draft, spec, token_map=...)` takes a path or the ids themselves; `specdec token-map` builds one from
a target's recorded answers (the zoo's ranking) or from token ids of any corpus (`rank_token_ids`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def rank_token_ids(stream, vocab_size: int) -> np.ndarray:
    """stream: token ids of a corpus (any int sequence) -> (vocab_size,) int64: every id of the vocabulary, most
    frequent in `stream` first, ties (unseen ids included) to the lower id. A token map of size n is its prefix."""
    ids = np.asarray(stream, dtype=np.int64).reshape(-1)
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise ValueError(f"the corpus holds id {int(bad[0])} outside the vocabulary [0, {vocab_size})")
    counts = np.bincount(ids, minlength=vocab_size)
    return np.lexsort((np.arange(vocab_size), -counts)).astype(np.int64)


def check_token_map(ids, vocab_size: int, where: str = "token_map") -> torch.Tensor:
    """ids: a 1-D sequence or tensor of target ids -> (n,) int64 on the CPU, in the given order; ValueError naming
    the first problem: not 1-D integers, empty, larger than the vocabulary, an id outside [0, vocab_size), a
    duplicate."""
    if isinstance(ids, np.ndarray):
        ids = torch.from_numpy(ids)
    try:
        t = torch.as_tensor(ids)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{where} must be a list of token ids, got {type(ids).__name__}") from None
    if t.dim() != 1 or (t.numel() and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool)):
        raise ValueError(f"{where} must be a 1-D list of integer token ids, got {t.dtype} of shape {tuple(t.shape)}")
    n = t.numel()
    if n == 0:
        raise ValueError(f"{where} is empty: a draft needs at least one id to propose")
    if n > vocab_size:
        raise ValueError(f"{where} has {n} ids, more than the target's vocabulary of {vocab_size}")
    t = t.to(torch.int64).cpu()
    outside = t[(t < 0) | (t >= vocab_size)]
    if outside.numel():
        raise ValueError(f"{where} holds id {int(outside[0])} outside the target's vocabulary [0, {vocab_size})")
    uniq, counts = torch.unique(t, return_counts=True)
    if uniq.numel() != n:
        raise ValueError(f"{where} holds id {int(uniq[counts > 1][0])} more than once")
    return t


def load_token_map(source, vocab_size: int) -> torch.Tensor:
    """source: a path to a token map file in SGLang's format (`torch.save` of a list of ids or a 1-D tensor), or
    the ids themselves -> (n,) int64 checked by `check_token_map`."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"token map {str(path)!r} is not a file")
        try:
            ids = torch.load(path, weights_only=True, map_location="cpu")
        except Exception as e:  # a pickle of anything else, a truncated file: say which file, in one line
            raise ValueError(f"token map {str(path)!r} cannot be read as a torch.save'd list of ids: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        return check_token_map(ids, vocab_size, where=f"token map {str(path)!r}")
    return check_token_map(source, vocab_size)


def save_token_map(ids, path, vocab_size: int) -> Path:
    """Write `ids` (checked against `vocab_size`) as SGLang reads a token map: `torch.save` of a list of ints."""
    t = check_token_map(ids, vocab_size)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(t.tolist(), path)
    return path

