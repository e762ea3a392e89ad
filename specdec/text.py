"""Text in, text out: tokenizers of real checkpoints, and a thin layer over `Engine.generate`.

The engine takes and returns token ids; `generate_text` encodes prompts with the model's tokenizer, uses its
end-of-sequence ids as the default stop tokens (as transformers' `generate` does), and decodes the output.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from .checks import ArgumentTypeError, check_int
from .config import SamplingParams
from .engine import Engine, GenerateOutput


class HFTokenizer:
    """A Hugging Face `tokenizer.json` through the `tokenizers` package.

    encode(text) adds the special tokens the tokenizer's post-processor adds (a BOS for Llama); decode(ids)
    drops special tokens. eos_token_ids: the ids generation stops at, from generation_config.json (else
    config.json); empty when neither names one."""

    def __init__(self, path, eos_token_ids=()):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ValueError("reading tokenizer.json needs the `tokenizers` package (pip install tokenizers)") from None
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # the package raises its own exception type for a bad file
            raise ValueError(f"{path}: not a readable tokenizer.json ({e})") from None
        self.eos_token_ids = list(eos_token_ids)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise ArgumentTypeError(f"text must be a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.vocab_size}, eos_token_ids={self.eos_token_ids})"


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
        from .zoo.tokenizer import ByteTokenizer
        return ByteTokenizer()
    raise ValueError(f"{path}: no tokenizer.json (and not a shipped zoo model)")


def eos_ids_of(tokenizer) -> list[int]:
    ids = getattr(tokenizer, "eos_token_ids", None)
    if ids is None:
        eos = getattr(tokenizer, "eos_token_id", None)
        ids = [] if eos is None else [eos]
    return list(ids)


@dataclass
class TextOutput:
    """One request's continuation as text, with the engine's output (token ids, logprobs, accept_lens...)."""

    text: str
    output: GenerateOutput


def generate_text(engine: Engine, tokenizer, prompts: list[str], params: SamplingParams | None = None, seed: int = 0,
                  stream=None) -> list[TextOutput]:
    """prompts: B strings -> B TextOutput. A request whose params name no stop tokens stops at the tokenizer's
    end-of-sequence ids. stream(request_index, new_token_ids), when given, is called as tokens are produced."""
    if not isinstance(prompts, (list, tuple)) or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a list of strings")
    params = params or SamplingParams()
    eos = eos_ids_of(tokenizer)
    if not params.stop_token_ids and eos:
        params = replace(params, stop_token_ids=eos)
    ids = [tokenizer.encode(p) for p in prompts]
    outs = engine.generate(ids, params, seed=seed, stream=stream)
    return [TextOutput(tokenizer.decode([t for t in o.token_ids if t not in eos]), o) for o in outs]
