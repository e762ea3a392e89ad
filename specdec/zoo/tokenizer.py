"""Byte-level tokenizer of the model zoo: every UTF-8 byte is a token, plus BOS and EOS."""
from __future__ import annotations

from ..checks import ArgumentTypeError


class ByteTokenizer:
    """ids 0..255 are the bytes of the UTF-8 encoding; 256 = BOS, 257 = EOS (vocab_size = 258).

    encode(str) -> list[int] (no specials added unless asked); decode(list[int]) -> str drops the special
    ids and replaces invalid UTF-8 (a draft cut in the middle of a multi-byte character) with U+FFFD."""

    bos_token_id = 256
    eos_token_id = 257
    vocab_size = 258

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """str -> list[int] of length len(text.encode('utf-8')) (+1 per special asked for)."""
        if not isinstance(text, str):
            raise ArgumentTypeError(f"text must be a str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        if add_bos:
            ids.insert(0, self.bos_token_id)
        if add_eos:
            ids.append(self.eos_token_id)
        return ids

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

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size})"
