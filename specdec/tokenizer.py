"""Tokenizers: the one protocol the engine, the text helpers, the grammar backend and the zoo read, and its two
implementations, the zoo's byte tokenizer and a Hugging Face `tokenizer.json` one.

A tokenizer here has
- `vocab_size`: the ids it can produce (a model's vocabulary may be larger: padded rows never sampled);
- `eos_token_ids`: the ids generation stops at by default, and a grammar's terminators (empty when it names none);
- `encode(text, add_special_tokens=...) -> list[int]` and `decode(ids) -> str` (special ids dropped);
- `xgrammar_info(vocab_size)`: its vocabulary as xgrammar's `TokenizerInfo` over a model's `vocab_size` ids, for
  structured output (imports xgrammar; only a grammar request calls it).

This module sits below the engine: it imports nothing of specdec but the argument checks.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, runtime_checkable

from .checks import ArgumentTypeError, check_int


@runtime_checkable
class Tokenizer(Protocol):
    vocab_size: int
    eos_token_ids: list[int]

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids) -> str: ...

    def xgrammar_info(self, vocab_size: int): ...


def _check_text(text) -> None:
    if not isinstance(text, str):
        raise ArgumentTypeError(f"text must be a str, got {type(text).__name__}")


class ByteTokenizer:
    """The zoo's: ids 0..255 are the bytes of the UTF-8 encoding; 256 = BOS, 257 = EOS (vocab_size = 258).

    encode(str) -> list[int], one id per byte (BOS first when add_special_tokens: the zoo's models read raw bytes,
    so no special is added by default); decode(list[int]) -> str drops the special ids and replaces invalid UTF-8
    (a draft cut in the middle of a multi-byte character) with U+FFFD."""

    bos_token_id = 256
    eos_token_id = 257
    eos_token_ids = [eos_token_id]
    vocab_size = 258

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """str -> list[int] of length len(text.encode('utf-8')) (+1 for the BOS when add_special_tokens)."""
        _check_text(text)
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id] + ids if add_special_tokens else ids

    def decode(self, ids) -> str:
        """list[int] (or a 1-D tensor/array of ints) -> str; special ids are skipped, bad UTF-8 is replaced."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        out = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                out.append(i)
            elif i not in (self.bos_token_id, self.eos_token_id):
                raise ValueError(f"token id {i} is outside the byte vocabulary (0..{self.vocab_size - 1})")
        return out.decode("utf-8", errors="replace")

    def xgrammar_info(self, vocab_size: int):
        import xgrammar as xgr
        # 256 single bytes, then the specials as empty strings (xgrammar's mark of a special token)
        vocab = [bytes([i]) for i in range(256)] + [""] * (self.vocab_size - 256)
        return xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, vocab_size=vocab_size,
                                 stop_token_ids=self.eos_token_ids)

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size})"


class HFTokenizer:
    """A Hugging Face `tokenizer.json` through the `tokenizers` package.

    encode(text) adds the special tokens the tokenizer's post-processor adds (a BOS for Llama); decode(ids)
    drops special tokens. eos_token_ids: the ids generation stops at, from generation_config.json (else
    config.json); empty when neither names one."""

    def __init__(self, path, eos_token_ids=()):
        try:
            from tokenizers import Tokenizer as _Tokenizer
        except ImportError:
            raise ValueError("reading tokenizer.json needs the `tokenizers` package (pip install tokenizers)") from None
        try:
            self._tok = _Tokenizer.from_file(str(path))
        except Exception as e:  # the package raises its own exception type for a bad file
            raise ValueError(f"{path}: not a readable tokenizer.json ({e})") from None
        self.eos_token_ids = list(eos_token_ids)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        _check_text(text)
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def xgrammar_info(self, vocab_size: int):
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast
        # xgrammar reads a transformers tokenizer to learn how the vocabulary encodes bytes
        hf = PreTrainedTokenizerFast(tokenizer_object=self._tok)
        return xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size,
                                                  stop_token_ids=self.eos_token_ids or None)

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.vocab_size}, eos_token_ids={self.eos_token_ids})"


def eos_ids_of(tokenizer) -> list[int]:
    """A tokenizer's end-of-sequence ids: the protocol's `eos_token_ids`, or a transformers tokenizer's single
    `eos_token_id`; [] when it names none."""
    ids = getattr(tokenizer, "eos_token_ids", None)
    if ids is None:
        eos = getattr(tokenizer, "eos_token_id", None)
        ids = [] if eos is None else [eos]
    return list(ids)


def _eos_ids(path: Path) -> list[int]:
    for name in ("generation_config.json", "config.json"):
        f = path / name
        if f.is_file():
            try:
                eos = json.loads(f.read_text()).get("eos_token_id")
            except (json.JSONDecodeError, AttributeError):
                raise ValueError(f"{f}: not a JSON object") from None
            if eos is not None:
                return [check_int(f"{f}: eos_token_id", i, 0) for i in (eos if isinstance(eos, list) else [eos])]
    return []


def load_tokenizer(path):
    """A model directory -> its tokenizer: `tokenizer.json` (HFTokenizer), or for the shipped zoo models (a
    directory inside a zoo bundle, beside its card.json) the byte tokenizer. ValueError when there is none."""
    path = Path(path)
    if (path / "tokenizer.json").is_file():
        return HFTokenizer(path / "tokenizer.json", _eos_ids(path))
    if (path.parent / "card.json").is_file():
        return ByteTokenizer()
    raise ValueError(f"{path}: no tokenizer.json (and not a shipped zoo model)")
