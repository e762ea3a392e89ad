"""Llama-architecture GGUF files (llama.cpp's format) -> `LlamaForCausalLM` and its tokenizer.

The file is read with the `gguf` package (llama.cpp's own reader and dequantisers): its metadata gives the config,
every tensor of a type the package dequantises becomes fp32 (then the requested dtype), and the rows of `attn_q` /
`attn_k`, which llama.cpp's converter interleaves for its rotary layout in Llama files, are put back in Hugging
Face's order. The tokenizer comes from the metadata too (vocabulary, merges, token types, special ids, chat
template) as a `tokenizers` byte-level BPE tokenizer.

The first load writes what it converted to a cache directory in Hugging Face's layout (config.json,
model.safetensors in fp32, tokenizer.json, tokenizer_config.json, generation_config.json), keyed by the GGUF's
resolved path, size and modification time; the next load reads that directory and never opens the GGUF. The cache
lives under `$SPECDEC_CACHE_DIR` (default `~/.cache/specdec`), in `gguf/`.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from .io import load_strict, save_dir
from .llama import LlamaConfig, LlamaForCausalLM
from ..tokenizer import HFTokenizer, load_tokenizer

#: llama.cpp's `general.architecture` -> the Hugging Face model_type this loader maps it to. Mistral's GGUF files
#: say "llama" (its sliding window is off in the files llama.cpp writes).
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

#: the environment variable naming the cache root (default ~/.cache/specdec)
CACHE_ENV = "SPECDEC_CACHE_DIR"
#: bumped when what the cache holds changes, so that an old entry is never read as a new one
_CACHE_FORMAT = 1

#: GGUF tensor name (after `blk.N.`) -> Hugging Face name (after `model.layers.N.`)
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# llama.cpp's token types (tokenizer.ggml.token_type)
_CONTROL, _USER_DEFINED = 3, 4


# ---- reading -----------------------------------------------------------------------------------------

def read_gguf(path):
    """A GGUF file -> `gguf.GGUFReader` over it; a file that is missing, not GGUF, or truncated (a tensor reaching
    past its end) is a one-line ValueError naming it."""
    # lazy: gguf is needed only to read GGUF files
    import gguf

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # the reader raises ValueError, IndexError, struct errors... on a bad or short file
        raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: {_one_line(e)})") from None
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise ValueError(f"{path}: truncated GGUF file: tensor {t.name!r} needs bytes up to "
                             f"{t.data_offset + t.n_bytes}, the file has {size}")
    return reader


def _one_line(e) -> str:
    return " ".join(str(e).split())


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def architecture(reader, path) -> str:
    """The file's llama.cpp architecture; one this loader does not map is a ValueError naming it."""
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported (supported: "
                         f"{sorted(GGUF_ARCHITECTURES)})")
    return arch


def gguf_config(reader, path) -> LlamaConfig:
    """The file's metadata -> LlamaConfig. The head is tied to the embedding when the file has no output.weight
    (llama.cpp drops it then); head_dim is `attention.key_length` when given, else hidden / heads; a rotary
    dimension other than head_dim (partial rotary) or a rotary scaling other than linear is a ValueError."""
    arch = architecture(reader, path)

    def key(name, default=None, required=True):
        v = _field(reader, f"{arch}.{name}", default)
        if v is None and required:
            raise ValueError(f"{path}: GGUF metadata {arch}.{name} is missing")
        return v

    names = {t.name for t in reader.tensors}
    vocab = key("vocab_size", required=False)
    if vocab is None:  # older files give the vocabulary's size only through the tokenizer or the embedding
        embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
        if embd is None:
            raise ValueError(f"{path}: GGUF file has no token_embd.weight")
        vocab = int(embd.shape[-1])
    heads = key("attention.head_count")
    hidden = key("embedding_length")
    head_dim = key("attention.key_length", hidden // heads if heads else None, required=False)
    rotary = key("rope.dimension_count", head_dim, required=False)
    if rotary != head_dim:
        raise ValueError(f"{path}: {arch}.rope.dimension_count={rotary} differs from head_dim={head_dim}: partial "
                         f"rotary embeddings are not implemented")
    if "rope_freqs.weight" in names:
        raise ValueError(f"{path}: GGUF tensor rope_freqs.weight (per-frequency rotary factors, Llama 3.1's rope) "
                         f"is not implemented")
    scaling_type = key("rope.scaling.type", "none", required=False)
    if scaling_type in ("none", None):
        rope_scaling = None
    elif scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    else:
        raise ValueError(f"{path}: {arch}.rope.scaling.type={scaling_type!r} is not implemented "
                         f"(supported: none, linear)")
    d = {
        "model_type": GGUF_ARCHITECTURES[arch],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads, required=False),
        "head_dim": head_dim,
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(key("rope.freq_base", 10000.0, required=False)),
        "max_position_embeddings": key("context_length", 2048, required=False),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": arch == "llama" and "blk.0.attn_q.bias" in names,
        "rope_scaling": rope_scaling,
    }
    return LlamaConfig.from_dict(d, where=str(path))


def _unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's converter stores each head's rows of attn_q / attn_k as (2, head_dim / 2) interleaved into
    (head_dim / 2, 2), so that its rotary kernel pairs adjacent rows; Hugging Face's rotate_half pairs row i with
    row i + head_dim / 2. This puts the rows back: (n_head, head_dim / 2, 2, ...) -> (n_head, 2, head_dim / 2)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _hf_name(name: str, path) -> str:
    stem, _, kind = name.rpartition(".")
    if kind not in ("weight", "bias"):
        raise ValueError(f"{path}: GGUF tensor {name!r} is not a weight or a bias")
    if stem in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}.{kind}"
    raise ValueError(f"{path}: GGUF tensor {name!r} has no place in a Llama-architecture model")


def gguf_state_dict(reader, config: LlamaConfig, path) -> dict[str, torch.Tensor]:
    """Every tensor, dequantised to fp32 by the `gguf` package, under Hugging Face's names, with attn_q / attn_k
    rows in Hugging Face's order (Llama files only: llama.cpp leaves Qwen's NEOX-style rows as they are). A tensor
    type the package cannot dequantise is a ValueError naming the tensor and the type."""
    # lazy: gguf is needed only to read GGUF files
    from gguf import GGMLQuantizationType, dequantize

    sd = {}
    for t in reader.tensors:
        hf = _hf_name(t.name, path)
        try:
            w = dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ValueError(f"{path}: GGUF tensor {t.name!r} has quantisation type "
                             f"{GGMLQuantizationType(t.tensor_type).name}, which the gguf package cannot "
                             f"dequantise") from None
        if w.dtype != np.float32:  # the integer types (I8 ... I64, F64) come back as they are stored
            raise ValueError(f"{path}: GGUF tensor {t.name!r} has type {t.tensor_type.name}, not a floating-point "
                             f"or quantised weight")
        w = torch.from_numpy(np.ascontiguousarray(w).reshape(*reversed([int(n) for n in t.shape])).copy())
        if config.model_type == "llama" and t.name.endswith((".attn_q.weight", ".attn_q.bias")):
            w = _unpermute_rows(w, config.num_attention_heads)
        elif config.model_type == "llama" and t.name.endswith((".attn_k.weight", ".attn_k.bias")):
            w = _unpermute_rows(w, config.num_key_value_heads)
        sd[hf] = w
    if config.tie_word_embeddings and "model.embed_tokens.weight" in sd:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    return sd


# ---- the tokenizer -------------------------------------------------------------------------------------

def _pre_tokenizer(pre: str | None):
    """llama.cpp's pre-tokenizer rule (`tokenizer.ggml.pre`) for the byte-level files this loader reads; the
    default is GPT-2's, which is what llama.cpp's "smollm" rule adds single digits to."""
    # lazy: tokenizers is slow to import and only GGUF tokenizers need it
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        # llama.cpp: every digit alone first ("\p{N}"), then GPT-2's split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in (None, "default", "gpt-2", "gpt2"):
        return byte_level
    raise ValueError(f"GGUF tokenizer.ggml.pre={pre!r} is not supported (supported: smollm, starcoder, refact, "
                     f"codeshell, default, gpt-2)")


def gguf_tokenizer_files(reader, path) -> tuple[dict, dict, list[int]]:
    """The file's tokenizer metadata -> (tokenizer.json as a dict, tokenizer_config.json as a dict, eos ids).
    A file without tokenizer metadata, or with a tokenizer other than byte-level BPE, is a ValueError."""
    # lazy: tokenizers is slow to import and only GGUF tokenizers need it
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    model = _field(reader, "tokenizer.ggml.model")
    if model is None or "tokenizer.ggml.tokens" not in reader.fields:
        raise ValueError(f"{path}: GGUF file has no tokenizer metadata (tokenizer.ggml.model / tokens)")
    if model != "gpt2":
        raise ValueError(f"{path}: GGUF tokenizer.ggml.model={model!r} is not supported (supported: 'gpt2', "
                         f"byte-level BPE)")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    merges = list(_field(reader, "tokenizer.ggml.merges", []))
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    # A token spelled with characters outside the byte alphabet is written in it (as Hugging Face spells them).
    byte_spelling = _bytes_to_unicode()
    alphabet = set(byte_spelling.values())
    spelled = [t if set(t) <= alphabet else "".join(byte_spelling[b] for b in t.encode("utf-8")) for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = _pre_tokenizer(_field(reader, "tokenizer.ggml.pre"))
    tok.decoder = decoders.ByteLevel()
    # control tokens (<|im_start|>) are special: matched whole, dropped by decode; user-defined ones matched whole
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == _CONTROL and set(t) <= alphabet])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types)
                    if k == _USER_DEFINED])

    def token_of(key):
        i = _field(reader, f"tokenizer.ggml.{key}")
        return None if i is None or not 0 <= i < len(tokens) else tokens[i]

    bos, eos = token_of("bos_token_id"), token_of("eos_token_id")
    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(_field(reader, "tokenizer.ggml.add_eos_token", False)) and eos is not None
    single = ([f"{bos}:0"] if add_bos else []) + ["$A:0"] + ([f"{eos}:0"] if add_eos else [])
    specials = sorted({(t, vocab[t]) for t, on in ((bos, add_bos), (eos, add_eos)) if on})
    tok.post_processor = processors.TemplateProcessing(single=" ".join(single), special_tokens=specials)
    config = {"bos_token": bos, "eos_token": eos, "unk_token": token_of("unknown_token_id"),
              "pad_token": token_of("padding_token_id"), "add_bos_token": add_bos, "add_eos_token": add_eos,
              "chat_template": _field(reader, "tokenizer.chat_template")}
    # where generation stops: the end-of-sequence id, and llama.cpp's end-of-turn / end-of-message ids when given
    eos_ids = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        i = _field(reader, f"tokenizer.ggml.{key}")
        if i is not None and 0 <= i < len(tokens) and i not in eos_ids:
            eos_ids.append(int(i))
    return json.loads(tok.to_str()), config, eos_ids


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the byte-level alphabet, in byte order)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


# ---- the cache -----------------------------------------------------------------------------------------

def cache_root() -> Path:
    """Where converted GGUF files are kept: $SPECDEC_CACHE_DIR/gguf, else ~/.cache/specdec/gguf."""
    root = os.environ.get(CACHE_ENV)
    return (Path(root) if root else Path.home() / ".cache" / "specdec") / "gguf"


def cache_dir_for(path, cache_root_dir=None) -> Path:
    """The cache directory of a GGUF file: its name and a digest of its resolved path, size and mtime."""
    path = Path(path).resolve()
    st = path.stat()
    key = hashlib.sha256(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{_CACHE_FORMAT}".encode()).hexdigest()[:16]
    return Path(cache_root_dir or cache_root()) / f"{path.stem}-{key}"


#: what a complete cache directory holds (the tokenizer's files too when the GGUF has tokenizer metadata)
_MODEL_FILES = ("config.json", "model.safetensors", "source.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def _has_tokenizer(reader) -> bool:
    return "tokenizer.ggml.model" in reader.fields and "tokenizer.ggml.tokens" in reader.fields


def convert_gguf(path, out) -> Path:
    """Convert a GGUF file into a Hugging Face directory `out` (fp32 weights; the tokenizer and chat template when
    the file has tokenizer metadata); written to a temporary directory beside it and renamed, so that a reader
    never sees half a directory."""

    path, out = Path(path), Path(out)
    reader = read_gguf(path)
    config = gguf_config(reader, path)
    tokenizer = gguf_tokenizer_files(reader, path) if _has_tokenizer(reader) else None
    model = LlamaForCausalLM(config)
    load_strict(model, gguf_state_dict(reader, config, path), path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
    try:
        save_dir(tmp, *model.checkpoint())
        if tokenizer is not None:
            tokenizer_json, tokenizer_config, eos_ids = tokenizer
            (tmp / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False))
            (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False))
            (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_ids}, indent=2))
        # written last: its presence marks a complete directory
        (tmp / "source.json").write_text(json.dumps({"gguf": str(path.resolve()), "tokenizer": tokenizer is not None},
                                                    indent=2))
        if out.exists() and not _complete(out):
            shutil.rmtree(out)  # left half-written by a killed conversion
        try:
            os.replace(tmp, out)
        except OSError:  # another process converted it first
            if not _complete(out):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _complete(out: Path) -> bool:
    return all((out / f).is_file() for f in _MODEL_FILES)


def cached_gguf_dir(path, cache_dir=None) -> Path:
    """The Hugging Face directory converted from a GGUF file, converting it on first use (see the module's
    docstring). cache_dir: the cache root (default `cache_root()`)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    out = cache_dir_for(path, cache_dir)
    if not _complete(out):
        convert_gguf(path, out)
    return out


# ---- public loaders --------------------------------------------------------------------------------------

def load_gguf(path, device="cpu", dtype: torch.dtype = torch.float32, cache: bool = True,
              cache_dir=None) -> LlamaForCausalLM:
    """A Llama-architecture GGUF file (Llama, SmolLM, Mistral, Qwen2, Qwen3), any tensor type the `gguf` package
    dequantises -> LlamaForCausalLM in eval mode on `device` in `dtype` (fp32 by default, or bf16 ...). With
    `cache` (the default) the converted weights are kept (`cached_gguf_dir`) and the next load reads those."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if cache:
        return LlamaForCausalLM.from_pretrained(cached_gguf_dir(path, cache_dir), device=device, dtype=dtype)
    reader = read_gguf(path)
    config = gguf_config(reader, path)
    model = LlamaForCausalLM(config)
    load_strict(model, gguf_state_dict(reader, config, path), path)
    return model.to(device=device, dtype=dtype).eval()


def load_gguf_tokenizer(path, cache: bool = True, cache_dir=None):
    """A GGUF file's tokenizer (`specdec.tokenizer.HFTokenizer`: byte-level BPE from its vocabulary and merges,
    its special tokens, end-of-sequence ids and chat template)."""

    if cache:
        out = cached_gguf_dir(path, cache_dir)
        if all((out / f).is_file() for f in _TOKENIZER_FILES):
            return load_tokenizer(out)
    reader = read_gguf(path)
    tokenizer_json, config, eos_ids = gguf_tokenizer_files(reader, path)
    return HFTokenizer.from_json(json.dumps(tokenizer_json), eos_ids, config)
