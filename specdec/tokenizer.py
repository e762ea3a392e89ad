"""Tokenizers: the one protocol the engine, the text helpers, the grammar backend and the zoo read, and its two
implementations, the zoo's byte tokenizer and a Hugging Face `tokenizer.json` one.

A tokenizer here has
- `vocab_size`: the ids it can produce (a model's vocabulary may be larger: padded rows never sampled);
- `eos_token_ids`: the ids generation stops at by default, and a grammar's terminators (empty when it names none);
- `encode(text, add_special_tokens=...) -> list[int]` and `decode(ids) -> str` (special ids dropped);
- `apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`: a conversation (a list of
  {"role", "content"} dicts) -> its prompt, as ids (no special token added beyond the template's) or as text, the
  way transformers' `apply_chat_template` renders a model's jinja template;
- `xgrammar_info(vocab_size)`: its vocabulary as xgrammar's `TokenizerInfo` over a model's `vocab_size` ids, for
  structured output (imports xgrammar; only a grammar request calls it).

This module sits below the engine: it imports nothing of specdec but the argument checks. A GGUF file's tokenizer
(`specdec.models.gguf.load_gguf_tokenizer`) is an `HFTokenizer` built from the file's metadata.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

from .checks import ArgumentTypeError, check_int


@runtime_checkable
class Tokenizer(Protocol):
    vocab_size: int
    eos_token_ids: list[int]

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids) -> str: ...

    def apply_chat_template(self, messages, add_generation_prompt: bool = ..., tokenize: bool = ...): ...

    def xgrammar_info(self, vocab_size: int): ...


def _check_text(text) -> None:
    if not isinstance(text, str):
        raise ArgumentTypeError(f"text must be a str, got {type(text).__name__}")


def _check_messages(messages) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"messages must be a non-empty list of {{'role': ..., 'content': ...}} dicts, "
                         f"got {messages!r:.80}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] must be a dict with str 'role' and 'content', got {m!r:.80}")
    return [dict(m) for m in messages]


def render_chat_template(template: str, messages, add_generation_prompt: bool = True,
                         special_tokens: dict | None = None) -> str:
    """A jinja chat template rendered as transformers renders one: a sandboxed environment with trim_blocks and
    lstrip_blocks, the loop-controls extension, `raise_exception`, `strftime_now` and a `tojson` that does not
    escape HTML; the template sees `messages`, `add_generation_prompt`, `tools` / `documents` (None) and the
    special tokens' strings (bos_token, eos_token, ...). A template that raises is a ValueError."""
    # lazy: jinja2 is slow to import and only chat templates need it
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    messages = _check_messages(messages)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    try:
        compiled = env.from_string(template)
        return compiled.render(messages=messages, tools=None, documents=None,
                               add_generation_prompt=bool(add_generation_prompt), **(special_tokens or {}))
    except jinja2.exceptions.TemplateError as e:
        raise ValueError(f"chat template: {' '.join(str(e).split())}") from None


class ByteTokenizer:
    """The zoo's: ids 0..255 are the bytes of the UTF-8 encoding; 256 = BOS, 257 = EOS (vocab_size = 258).

    encode(str) -> list[int], one id per byte (BOS first when add_special_tokens: the zoo's models read raw bytes,
    so no special is added by default); decode(list[int]) -> str drops the special ids and replaces invalid UTF-8
    (a draft cut in the middle of a multi-byte character) with U+FFFD."""

    bos_token_id = 256
    eos_token_id = 257
    eos_token_ids = [eos_token_id]
    vocab_size = 258
    #: the zoo's models read raw text, so their template is plain: "role: content" per line, then "assistant: "
    chat_template = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
                     "{% if add_generation_prompt %}assistant: {% endif %}")

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

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = True):
        """messages -> "user: hi\n" per message, then "assistant: " when add_generation_prompt; its bytes'
        ids when tokenize (no BOS), else the text."""
        text = render_chat_template(self.chat_template, messages, add_generation_prompt)
        return self.encode(text) if tokenize else text

    def xgrammar_info(self, vocab_size: int):
        # lazy: xgrammar is optional (specdec[grammar])
        import xgrammar as xgr
        # 256 single bytes, then the specials as empty strings (xgrammar's mark of a special token)
        vocab = [bytes([i]) for i in range(256)] + [""] * (self.vocab_size - 256)
        return xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, vocab_size=vocab_size,
                                 stop_token_ids=self.eos_token_ids)

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size})"


#: tokenizer_config.json's special tokens that a chat template reads by name
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


class HFTokenizer:
    """A Hugging Face `tokenizer.json` through the `tokenizers` package.

    encode(text) adds the special tokens the tokenizer's post-processor adds (a BOS for Llama); decode(ids)
    drops special tokens. eos_token_ids: the ids generation stops at, from generation_config.json (else
    config.json); empty when neither names one. config: tokenizer_config.json's fields (its `chat_template` and
    special tokens' strings, which the template reads)."""

    def __init__(self, path, eos_token_ids=(), config: dict | None = None):
        _Tokenizer = self._tokenizers()
        try:
            tok = _Tokenizer.from_file(str(path))
        except Exception as e:  # the package raises its own exception type for a bad file
            raise ValueError(f"{path}: not a readable tokenizer.json ({e})") from None
        self._init(tok, eos_token_ids, config)

    @classmethod
    def from_json(cls, text: str, eos_token_ids=(), config: dict | None = None) -> "HFTokenizer":
        """tokenizer.json's text (e.g. one built from a GGUF file's metadata) -> HFTokenizer."""
        try:
            tok = cls._tokenizers().from_str(text)
        except Exception as e:
            raise ValueError(f"not a readable tokenizer.json ({e})") from None
        self = cls.__new__(cls)
        self._init(tok, eos_token_ids, config)
        return self

    @staticmethod
    def _tokenizers():
        try:
            # lazy: tokenizers is slow to import and only tokenizer.json needs it
            from tokenizers import Tokenizer as _Tokenizer
        except ImportError:
            raise ValueError("reading tokenizer.json needs the `tokenizers` package (pip install tokenizers)") from None
        return _Tokenizer

    def _init(self, tok, eos_token_ids, config):
        self._tok = tok
        self.eos_token_ids = list(eos_token_ids)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        config = config or {}
        template = config.get("chat_template")
        if isinstance(template, list):  # transformers' named templates: [{"name": "default", "template": ...}]
            template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}.get("default")
        self.chat_template = template if isinstance(template, str) else None
        self.special_tokens = {}
        for name in SPECIAL_TOKEN_NAMES:
            v = config.get(name)
            if isinstance(v, dict):  # an AddedToken written out
                v = v.get("content")
            if isinstance(v, str):
                self.special_tokens[name] = v

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = True):
        """messages -> the model's chat template rendered (see `render_chat_template`); its ids when tokenize
        (encoded without adding special tokens, as transformers does), else the text. ValueError when the
        tokenizer has no chat template."""
        if self.chat_template is None:
            raise ValueError(f"{self!r} has no chat template (tokenizer_config.json's chat_template)")
        text = render_chat_template(self.chat_template, messages, add_generation_prompt, self.special_tokens)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        _check_text(text)
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def xgrammar_info(self, vocab_size: int):
        # lazy: xgrammar and transformers are optional
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


def _tokenizer_config(path: Path) -> dict:
    """tokenizer_config.json (when there is one), with the chat template from chat_template.jinja when the
    directory keeps it there (as transformers 4.43+ writes it)."""
    f, config = path / "tokenizer_config.json", {}
    if f.is_file():
        try:
            config = json.loads(f.read_text())
        except json.JSONDecodeError:
            raise ValueError(f"{f}: not valid JSON") from None
        if not isinstance(config, dict):
            raise ValueError(f"{f}: not a JSON object")
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        config = dict(config, chat_template=jinja.read_text())
    return config


def load_tokenizer(path):
    """A model directory -> its tokenizer: `tokenizer.json` (HFTokenizer, with tokenizer_config.json's chat
    template and special tokens), or for the shipped zoo models (a directory inside a zoo bundle, beside its
    card.json) the byte tokenizer. ValueError when there is none."""
    path = Path(path)
    if (path / "tokenizer.json").is_file():
        return HFTokenizer(path / "tokenizer.json", _eos_ids(path), _tokenizer_config(path))
    if (path.parent / "card.json").is_file():
        return ByteTokenizer()
    raise ValueError(f"{path}: no tokenizer.json (and not a shipped zoo model)")
