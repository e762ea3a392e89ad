"""Passages from text the machine has: manual pages (rendered by `man`, English and other languages), the standard
library's docstrings and the text files of /usr/share/doc. A passage names its source (`man:ls`, `man-de:ls`,
`stdlib:json`, `doc:gzip`), its subject (what it documents) and its language.

Pages are taken in sorted order, every k-th where there are more than asked for, so the same machine gives the same
passages.
"""
from __future__ import annotations

import gzip
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..chat_prompts import SPLITS, subjects

MAN_ROOT = Path("/usr/share/man")
DOC_ROOT = Path("/usr/share/doc")
#: a passage is cut at a paragraph end below this many characters (prompts stay short)
MAX_PASSAGE_CHARS = 1200
MIN_PASSAGE_CHARS = 160
#: the non-English manual directories and the language each holds
MAN_LANGUAGES = {"de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "pt": "Portuguese",
                 "nl": "Dutch", "pl": "Polish", "ru": "Russian", "ja": "Japanese", "zh_CN": "Chinese"}


@dataclass(frozen=True)
class Passage:
    source: str
    subject: str
    text: str
    language: str = "English"
    options: tuple[str, ...] = ()


def _every_kth(paths: list[Path], limit: int) -> list[Path]:
    paths = sorted(paths)
    step = max(1, len(paths) // max(limit, 1))
    return paths[::step][:limit]


def _render(path: Path) -> str:
    try:
        out = subprocess.run(["man", "-l", str(path)], capture_output=True, timeout=20,
                             env={"MANWIDTH": "4000", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    except (OSError, subprocess.TimeoutExpired):
        return ""
    # man's overstrike bold and underline (c\bc, _\bc) -> plain characters
    return re.sub(r".\x08", "", out.stdout.decode("utf-8", "replace"))


_HEADING = re.compile(r"^[A-Z][A-Z0-9 ,/&()-]{2,}$")
_OPTION = re.compile(r"(?<![\w-])--?[a-zA-Z][\w-]*")


def _sections(rendered: str) -> dict[str, list[str]]:
    """A rendered page -> {heading: paragraphs}, each paragraph one line of words."""
    sections, name, para = {}, None, []
    for raw in rendered.splitlines():
        line = raw.strip()
        if raw and not raw[0].isspace() and _HEADING.match(line):
            name = line
            sections[name] = []
            para = []
            continue
        if name is None:
            continue
        if not line:
            if para:
                sections[name].append(" ".join(para))
            para = []
        else:
            para.append(line)
    return sections


def _cut(paragraphs: list[str]) -> str:
    out, size = [], 0
    for p in paragraphs:
        if size + len(p) > MAX_PASSAGE_CHARS and out:
            break
        out.append(p[:MAX_PASSAGE_CHARS])
        size += len(p) + 2
    return "\n\n".join(out)


def _man_passage(path: Path, prefix: str, language: str) -> Passage | None:
    secs = _sections(_render(path))
    desc = next((secs[k] for k in ("DESCRIPTION", "BESCHREIBUNG", "DESCRIPCIÓN", "DESCRIZIONE", "DESCRIÇÃO",
                                   "BESCHRIJVING", "OPIS", "ОПИСАНИЕ", "説明", "描述") if secs.get(k)), None)
    if desc is None:  # a page whose heading is translated otherwise: its longest section
        desc = max(secs.values(), key=lambda ps: sum(map(len, ps)), default=[])
    text = _cut([p for p in desc if len(p) > 40])
    if len(text) < MIN_PASSAGE_CHARS:
        return None
    flags = {m.group(0) for p in secs.get("OPTIONS", []) for m in _OPTION.finditer(p[:60])}
    options = tuple(sorted(flags))[:40]
    page = path.name.split(".")[0]
    return Passage(f"{prefix}:{page}", page, text, language, options)


def man_passages(limit: int, language: str | None = None, workers: int = 4) -> list[Passage]:
    """Up to `limit` passages of manual pages (sections 1, 5 and 8; `language` a key of MAN_LANGUAGES, or None for
    English), each the page's description cut to MAX_PASSAGE_CHARS, with the options its OPTIONS section lists."""
    root = MAN_ROOT if language is None else MAN_ROOT / language
    paths = [p for sec in ("man1", "man5", "man8") for p in (root / sec).glob("*.gz")] if root.is_dir() else []
    prefix = "man" if language is None else f"man-{language}"
    lang = "English" if language is None else MAN_LANGUAGES[language]
    # the Google Cloud CLI ships thousands of near-identical pages: at most a fifth of the sample
    cloud = [p for p in paths if p.name.startswith("gcloud")]
    other = [p for p in paths if not p.name.startswith("gcloud")]
    chosen = _every_kth(other, limit * 2) + _every_kth(cloud, limit // 5)  # some pages have no usable description
    with ThreadPoolExecutor(workers) as pool:
        found = [p for p in pool.map(lambda path: _man_passage(path, prefix, lang), chosen) if p is not None]
    return found[:limit]


def stdlib_passages(split_of_source=None) -> list[Passage]:
    """The long docstrings (modules, classes, functions) of the standard library, one passage each."""
    out = []
    for split in SPLITS:
        for s in subjects(split):
            text = _cut([" ".join(p.split()) for p in s.doc.split("\n\n") if p.strip()])
            if len(text) >= MIN_PASSAGE_CHARS:
                out.append(Passage(f"stdlib:{s.source}", s.name, text))
    return out


def doc_passages(limit: int) -> list[Passage]:
    """Up to `limit` passages of /usr/share/doc's README, NEWS and text files (changelogs and licences aside)."""
    if not DOC_ROOT.is_dir():
        return []
    paths = [p for p in DOC_ROOT.rglob("*") if p.is_file() and re.search(r"(README|NEWS|\.txt)(\.gz)?$", p.name)
             and not re.search(r"changelog|copyright|LICENSE|COPYING", p.name, re.I)]
    out = []
    for p in _every_kth(paths, limit * 2):
        try:
            raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        paras = [" ".join(x.split()) for x in raw.decode("utf-8", "replace").split("\n\n")]
        text = _cut([x for x in paras if len(x) > 60 and x.count("*") < 5 and not x.startswith(("-", "="))])
        if len(text) >= MIN_PASSAGE_CHARS:
            pkg = p.relative_to(DOC_ROOT).parts[0]
            out.append(Passage(f"doc:{pkg}", pkg, text))
    return out[:limit]


def sentences(text: str, lo: int = 40, hi: int = 300) -> list[str]:
    """The sentences of a passage between lo and hi characters (translation material)."""
    parts = re.split(r"(?<=[.!?])\s+(?=[A-ZÀ-ÝА-Я])", text.replace("\n\n", " "))
    return [s.strip() for s in parts if lo <= len(s.strip()) <= hi]
