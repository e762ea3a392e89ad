"""Chat prompts built from the Python standard library's docstrings: instructions a chat model answers, from text
every machine that runs specdec has (the running interpreter's stdlib sources, `specdec.zoo.corpus.files`).

A source is a top-level module or package ("json" covers json/decoder.py too). Each documented public function,
class, method and module of a source gives one subject; an instruction is one of `TEMPLATES` filled with the
subject's dotted name and docstring ("Explain what `textwrap.dedent` does and give a short example."). The split is
by source: a source is held out when sha256(its name) % `HELDOUT_BUCKETS` == 0 (about a fifth), so a drafter trained
on the training split never saw a held-out source's docstrings. The sources are parsed with `ast` (nothing is
imported), in sorted order, and the prompts drawn with a seed: the same interpreter gives the same list.

`chat_prompts(split, n, seed)` -> n conversations (lists of {"role", "content"} messages);
`chat_prompt_ids(tokenizer, split, n, seed)` -> their token ids through `tokenizer.apply_chat_template`.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import random
from dataclasses import dataclass

from .corpus import files

HELDOUT_BUCKETS = 5  # 1 bucket of 5 -> about a fifth of the sources are held out
SPLITS = ("train", "heldout")
#: a docstring quoted in an instruction is cut to this many characters (at a line end), to keep prompts short
MAX_QUOTED_CHARS = 480
#: docstrings shorter than this say too little to ask about ("Return self.")
MIN_DOC_CHARS = 24

#: the instructions, each filled with a subject's `name`, its docstring's first paragraph (`summary`) or the docstring
#: itself cut to MAX_QUOTED_CHARS (`doc`)
TEMPLATES = (
    "Explain what `{name}` does and give a short example.",
    "Write a short Python function that uses `{name}`. Its documentation says: \"{summary}\"",
    "Summarise this docstring of `{name}` in one sentence:\n\n{doc}",
    "When would I use `{name}` in a Python program? Its documentation begins: \"{summary}\"",
    "Here is the documentation of `{name}`:\n\n{doc}\n\nWhat are its arguments, and what does it return?",
)
#: each template's task, the category its prompts carry in a prompt file (MT-Bench's and Spec-Bench's names where one
#: fits: coding, summarization, qa, extraction)
TEMPLATE_CATEGORIES = ("explanation", "coding", "summarization", "qa", "extraction")


@dataclass(frozen=True)
class Subject:
    """One documented thing of a source: its source (the top-level module), dotted name and docstring."""

    source: str
    name: str
    doc: str


def source_of(rel_path: str) -> str:
    """A stdlib file's path relative to the stdlib directory -> its source, the top-level module or package
    ("json/decoder.py" -> "json", "textwrap.py" -> "textwrap")."""
    return rel_path.split("/", 1)[0].removesuffix(".py")


def is_heldout_source(source: str) -> bool:
    """True when `source` (a top-level module name) is in the held-out split: sha256(name) % HELDOUT_BUCKETS == 0."""
    return int(hashlib.sha256(source.encode("utf-8")).hexdigest(), 16) % HELDOUT_BUCKETS == 0


def split_of(source: str) -> str:
    """"heldout" or "train": the split a source belongs to (the rule trainers and benchmarks share)."""
    return "heldout" if is_heldout_source(source) else "train"


def _module_name(rel_path: str) -> str:
    parts = rel_path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _public(name: str) -> bool:
    return not name.startswith("_")


def _subjects_of_file(rel_path: str, data: bytes) -> list[Subject]:
    module = _module_name(rel_path)
    if not all(_public(part) for part in module.split(".")):
        return []
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError):  # a file for another Python version (lib2to3's test data and the like)
        return []
    source, out = source_of(rel_path), []

    def add(name, node):
        doc = ast.get_docstring(node, clean=True)
        doc = (doc or "").strip()
        if len(doc) >= MIN_DOC_CHARS:
            out.append(Subject(source, name, doc))

    add(module, tree)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _public(node.name):
            add(f"{module}.{node.name}", node)
            if isinstance(node, ast.ClassDef):
                for member in node.body:
                    if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(member.name):
                        add(f"{module}.{node.name}.{member.name}", member)
    return out


@functools.lru_cache(maxsize=4)
def _subjects(split: str, root) -> tuple[Subject, ...]:
    out = []
    for rel_path, data in files("all", root):
        if split_of(source_of(rel_path)) == split:
            out += _subjects_of_file(rel_path, data)
    return tuple(out)


def subjects(split: str = "train", root=None) -> list[Subject]:
    """split: 'train' | 'heldout' -> every documented public subject of that split's sources, in file order."""
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    return list(_subjects(split, None if root is None else str(root)))


def sources(split: str = "train", root=None) -> list[str]:
    """The sorted sources (top-level modules) that give prompts to `split`."""
    return sorted({s.source for s in subjects(split, root)})


def _quoted(doc: str) -> str:
    if len(doc) <= MAX_QUOTED_CHARS:
        return doc
    cut = doc.rfind("\n", 0, MAX_QUOTED_CHARS)
    return doc[:cut if cut > 0 else MAX_QUOTED_CHARS].rstrip() + "\n..."


def instruction(subject: Subject, template: str) -> str:
    """One of `TEMPLATES` filled with `subject`."""
    # the summary: the docstring's first paragraph on one line (its first sentence often wraps)
    summary = " ".join(subject.doc.split("\n\n", 1)[0].split())
    return template.format(name=subject.name, summary=_quoted(summary), doc=_quoted(subject.doc))


def drawn_instructions(split: str = "heldout", n: int = 8, seed: int = 0, root=None) -> list[tuple[Subject, int, str]]:
    """-> n (subject, template index, instruction): documented subjects of the split's sources drawn without
    replacement, each with a template (`TEMPLATES`) drawn at random, both from `seed`."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    pool = subjects(split, root)
    if n > len(pool):
        raise ValueError(f"n={n} exceeds the {len(pool)} documented subjects of the {split!r} split")
    rng = random.Random(seed)
    out = []
    for subject in rng.sample(pool, n):
        k = TEMPLATES.index(rng.choice(TEMPLATES))
        out.append((subject, k, instruction(subject, TEMPLATES[k])))
    return out


def chat_prompts(split: str = "heldout", n: int = 8, seed: int = 0, root=None) -> list[list[dict]]:
    """-> n conversations, each one user message: an instruction (`drawn_instructions`) about a documented subject of
    the split's sources."""
    return [[{"role": "user", "content": text}] for _, _, text in drawn_instructions(split, n, seed, root)]


def chat_prompt_ids(tokenizer, split: str = "heldout", n: int = 8, seed: int = 0, root=None) -> list[list[int]]:
    """`chat_prompts` rendered by `tokenizer.apply_chat_template` with the generation prompt -> token id lists."""
    return [list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
            for messages in chat_prompts(split, n, seed, root)]
