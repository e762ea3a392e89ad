"""The zoo's training text: the running interpreter's own standard-library `.py` sources.

Every machine that runs specdec has them, so the corpus needs no download. Files are listed by
their path relative to the stdlib directory, sorted (a deterministic order), and split by file: a
file is held out when a stable hash (SHA-256) of its relative path falls in the held-out bucket
(about 5 % of the files), so no held-out line was ever seen in training. Excluded: site-packages,
test directories (test, tests, idle_test), `pydoc_data/topics.py` and the codec tables that
`gencodec.py` generated (data, not code).

A stream is the bytes of its files, each followed by the EOS id, as a uint16 numpy array of token ids
of `ByteTokenizer`.
"""
from __future__ import annotations

import functools
import hashlib
import os
import random
import sys
import sysconfig
from pathlib import Path

import numpy as np

from ..tokenizer import ByteTokenizer

EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
EXCLUDED_FILES = frozenset({"pydoc_data/topics.py"})
HELDOUT_BUCKETS = 20  # 1 bucket of 20 -> about 5 % of the files are held out


def stdlib_dir() -> Path:
    """The directory of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel_path: str) -> bool:
    """True when the file (a '/'-separated path relative to the stdlib directory) is in the held-out split."""
    h = int(hashlib.sha256(rel_path.encode("utf-8")).hexdigest()[:8], 16)
    return h % HELDOUT_BUCKETS == 0


def _generated(data: bytes) -> bool:
    return b"gencodec.py" in data[:400]


@functools.lru_cache(maxsize=4)
def _files(root: str) -> tuple[tuple[str, bytes], ...]:
    base = Path(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        for fn in filenames:
            p = Path(dirpath, fn)
            rel = p.relative_to(base).as_posix()
            if not fn.endswith(".py") or rel in EXCLUDED_FILES or not p.is_file():
                continue
            data = p.read_bytes()
            if not data or _generated(data):
                continue
            out.append((rel, data))
    out.sort(key=lambda x: x[0])
    return tuple(out)


def files(split: str = "train", root=None) -> list[tuple[str, bytes]]:
    """split: 'train' | 'heldout' | 'all' -> [(relative path, bytes)] sorted by path."""
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")
    fs = _files(str(root or stdlib_dir()))
    if split == "all":
        return list(fs)
    want = split == "heldout"
    return [(rel, data) for rel, data in fs if is_heldout(rel) == want]


@functools.lru_cache(maxsize=4)
def _stream(split: str, root: str) -> np.ndarray:
    eos = ByteTokenizer.eos_token_id
    chunks = []
    for _, data in files(split, root):
        chunks.append(np.frombuffer(data, dtype=np.uint8).astype(np.uint16))
        chunks.append(np.array([eos], dtype=np.uint16))
    arr = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint16)
    arr.setflags(write=False)
    return arr


def token_stream(split: str = "train", root=None) -> np.ndarray:
    """split: 'train' | 'heldout' -> (N,) uint16 token ids: every file's bytes followed by EOS, in path order."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    return _stream(split, str(root or stdlib_dir()))


def heldout_windows(n: int, length: int, seed: int = 0, root=None) -> np.ndarray:
    """-> (n, length) int64: n windows of the held-out stream at seeded random offsets (evaluation)."""
    s = token_stream("heldout", root)
    if len(s) < length + 1:
        raise ValueError(f"held-out stream has {len(s)} tokens, fewer than length={length} + 1")
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(s) - length, size=n)
    return np.stack([s[i:i + length].astype(np.int64) for i in starts])


def _line_starts(data: bytes) -> np.ndarray:
    nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 0x0A) + 1
    return np.concatenate([[0], nl])


def heldout_prompts(n: int, length: int = 128, seed: int = 0, root=None) -> list[list[int]]:
    """-> n prompts (lists of byte token ids, at most `length` long, at least length // 2) from held-out files.

    Each prompt starts at a line start of a held-out file and ends just after a newline, so the model
    continues with a fresh line; the choice of file and line is seeded, so the list is reproducible."""
    if n < 0 or length < 2:
        raise ValueError(f"need n >= 0 and length >= 2, got n={n}, length={length}")
    fs = [(rel, data) for rel, data in files("heldout", root) if len(data) > 2 * length]
    if not fs:
        raise ValueError("no held-out file is long enough for prompts of length %d" % length)
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        _, data = fs[rng.randrange(len(fs))]
        starts = _line_starts(data)
        starts = starts[starts < len(data) - length]
        s = int(starts[rng.randrange(len(starts))])
        piece = data[s:s + length]
        cut = piece.rfind(b"\n")
        if cut + 1 < length // 2 or not piece[:cut + 1].strip():
            continue
        out.append(list(piece[:cut + 1]))
    return out


def corpus_info(root=None) -> dict:
    """Summary for the model card: interpreter, stdlib directory, file and byte counts, a content digest."""
    root_s = str(root or stdlib_dir())
    info = {"source": "Python standard library .py sources of the running interpreter",
            "python": sys.version.split()[0], "stdlib_dir": root_s,
            "excluded_dirs": sorted(EXCLUDED_DIRS), "excluded_files": sorted(EXCLUDED_FILES) + ["gencodec tables"],
            "split": f"by file: sha256(relative path) % {HELDOUT_BUCKETS} == 0 is held out"}
    for split in ("train", "heldout"):
        fs = files(split, root_s)
        h = hashlib.sha256()
        for rel, data in fs:
            h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
        info[split] = {"files": len(fs), "bytes": sum(len(d) for _, d in fs), "sha256": h.hexdigest()[:16]}
    return info


#: English prose written for this toolkit, which no shipped model saw in training (they read Python sources only):
#: the prompts on which drafts are rarely accepted, beside held-out code on which they often are
PROSE = (
    "The ferry left the harbour an hour late, and by the time it cleared the breakwater the wind had turned. "
    "Most of the passengers went below, but an old man in a green coat stayed at the rail, watching the gulls "
    "follow the wake. He had made this crossing every autumn for forty years, first with his father, later alone. "
    "On the far shore a row of white houses caught the last of the sun. Somewhere a dog was barking, and the sound "
    "carried over the water long after the houses had gone grey. "
    "In the village the bakery opened before dawn. Its windows fogged with steam while the first loaves cooled on "
    "wire racks, and the smell drifted down the lane to the square, where the market traders were unloading crates "
    "of apples, cabbages and late plums. Nobody hurried. The church clock had stopped at twenty past nine in a storm "
    "three winters ago, and the council still argued about who should pay to mend it. "
    "Her letter arrived on a Tuesday, folded twice and written in pencil. She said the garden was overgrown, that "
    "the roof over the kitchen leaked again, and that she had started to paint in the mornings, badly but with great "
    "pleasure. She asked whether he remembered the orchard behind the school, and the summer they had spent counting "
    "the swallows that nested under the eaves. At the end she wrote only that the river was high and the bridge "
    "would be closed until spring. "
    "The museum kept its oldest maps in a cool room on the top floor. Visitors were allowed in twice a week, in "
    "small groups, and asked to wear cotton gloves. One map showed the coast as a sailor had imagined it, with "
    "islands that do not exist and a sea monster drawn carefully in the corner, its tail curled around a compass "
    "rose. The guide liked to say that every map is an argument about what matters. "
)


def prose_prompts(n: int, length: int = 96, seed: int = 0) -> list[list[int]]:
    """-> n prompts (lists of byte token ids, at most `length` long) of `PROSE`, each starting at a sentence and
    ending after a space; seeded, so the list is reproducible."""
    if n < 0 or length < 8:
        raise ValueError(f"need n >= 0 and length >= 8, got n={n}, length={length}")
    data = PROSE.encode()
    starts = [0] + [i + 2 for i in range(len(data) - 2) if data[i:i + 2] == b". "]
    starts = [s for s in starts if s < len(data) - length]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = starts[rng.randrange(len(starts))]
        piece = data[s:s + length]
        out.append(list(piece[:piece.rfind(b" ") + 1]))
    return out
