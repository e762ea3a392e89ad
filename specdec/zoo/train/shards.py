"""Recording at scale: the target's answers to a prompt file, in shards that resume where they stopped.

A recording directory holds `manifest.json` (the prompt file and its sha256, the target's fingerprint, the layers,
top-k, the sampling, the shard and batch sizes) and one directory per shard of `shard_size` prompts:
`shard-00012/` once sealed (`tokens.npy`, `features.npy`, `starts.npy`, `topk_ids.npy`, `topk_probs.npy` and
`meta.json` with each file's sha256; the layout `record.load_recordings` reads), `shard-00012.partial/` while it is
written, one `part-NNN.npz` per engine batch, each written whole (a temporary file renamed). A run skips sealed
shards and, in a partial one, the parts already written; a part's sampling seed is a function of its index, so a
resumed run records what an uninterrupted one would, and nothing twice.

Every prompt's turns are answered in order (MT-Bench's practice: a later turn follows the model's own answer), each
answer its own conversation. Every `sampled_every`-th prompt is answered at `temperature`, the others greedily.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .capture import record_conversations

ARRAYS = ("tokens", "features", "starts", "topk_ids", "topk_probs")


@dataclass(frozen=True)
class RecordPlan:
    """What a recording directory is of; a run into an existing directory must ask for the same."""

    prompts_file: str
    prompts_sha256: str
    num_prompts: int
    model: str
    target: str
    layers: tuple
    topk: int
    max_new_tokens: int
    sampled_every: int
    temperature: float
    seed: int
    shard_size: int
    batch_size: int

    @property
    def num_shards(self) -> int:
        return -(-self.num_prompts // self.shard_size)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def open_plan(out: Path, plan: RecordPlan) -> None:
    """Writes the manifest, or checks that the one there is this plan (the same prompts, target and settings)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "manifest.json"
    want = json.loads(json.dumps(asdict(plan)))
    if path.is_file():
        have = json.loads(path.read_text())
        diff = [k for k in want if k != "prompts_file" and have.get(k) != want[k]]
        if diff:
            raise ValueError(f"recording {str(out)!r} was started with other settings ({diff[0]}: "
                             f"{have.get(diff[0])!r}, now {want[diff[0]]!r}); use a new --out")
        return
    _write_atomic(path, (json.dumps(want, indent=1) + "\n").encode())


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def shard_dir(out: Path, k: int, partial: bool = False) -> Path:
    return out / (f"shard-{k:05d}" + (".partial" if partial else ""))


def _part(convs) -> dict:
    lengths = [len(t) for t, _ in convs]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    arrays = {"tokens": np.concatenate([t for t, _ in convs]), "starts": starts}
    for name, k in (("features", 0), ("topk_ids", 1), ("topk_probs", 2)):
        if len(convs[0][1]) > k:
            arrays[name] = np.concatenate([a[k] for _, a in convs])
    return arrays


def record_part(target, tokenizer, plan: RecordPlan, prompts, indices, part_index: int):
    """The conversations of one engine batch: every turn of `prompts` (Prompt records; `indices` their places in
    the file), turn by turn -> (arrays, answer tokens)."""
    temps = [plan.temperature if i % plan.sampled_every == plan.sampled_every - 1 else 0.0 for i in indices]
    answers_text = [[] for _ in prompts]
    convs, answer_tokens = [], 0
    for turn in range(max(p.num_turns for p in prompts)):
        rows = [i for i, p in enumerate(prompts) if p.num_turns > turn]
        ids = [list(tokenizer.apply_chat_template(prompts[i].conversation(answers_text[i]),
                                                  add_generation_prompt=True, tokenize=True)) for i in rows]
        got, answers = record_conversations(target, ids, plan.layers, plan.max_new_tokens, [temps[i] for i in rows],
                                            plan.batch_size, plan.seed * 1_000_003 + part_index * 16 + turn,
                                            tokenizer.eos_token_ids, plan.topk)
        convs += got
        answer_tokens += sum(len(a) for a in answers)
        for i, a in zip(rows, answers):
            answers_text[i].append(tokenizer.decode(a))
    return _part(convs), answer_tokens


def _seal(out: Path, k: int, plan: RecordPlan, parts: list[Path]) -> dict:
    partial = shard_dir(out, k, partial=True)
    loaded = [np.load(p) for p in parts]
    arrays, offset, starts = {}, 0, []
    for d in loaded:
        starts.append(d["starts"] + offset)
        offset += len(d["tokens"])
    arrays["starts"] = np.concatenate(starts)
    for name in ARRAYS:
        if name != "starts" and name in loaded[0]:
            arrays[name] = np.concatenate([d[name] for d in loaded])
    metas = [json.loads(str(d["meta"])) for d in loaded]
    sealed = shard_dir(out, k)
    tmp = out / f".shard-{k:05d}.sealing"
    tmp.mkdir(exist_ok=True)
    files = {}
    for name, a in arrays.items():
        np.save(tmp / f"{name}.npy", a)
        files[f"{name}.npy"] = sha256_of(tmp / f"{name}.npy")
    meta = {"target": plan.target, "model": plan.model, "layers": list(plan.layers), "split": "train",
            "prompts_file": plan.prompts_file, "prompts_sha256": plan.prompts_sha256, "shard": k,
            "conversations": int(len(arrays["starts"])), "prompts": sum(m["prompts"] for m in metas),
            "tokens": int(len(arrays["tokens"])), "answer_tokens": sum(m["answer_tokens"] for m in metas),
            "max_new_tokens": plan.max_new_tokens, "sampled_every": plan.sampled_every,
            "temperature": plan.temperature, "topk": plan.topk,
            "cpu_seconds": round(sum(m["cpu_seconds"] for m in metas), 1),
            "wall_seconds": round(sum(m["wall_seconds"] for m in metas), 1),
            "bytes": sum((tmp / f).stat().st_size for f in files), "sha256": files}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp, sealed)
    for p in parts:
        p.unlink()
    partial.rmdir()
    return meta


def verify_shard(path: Path) -> None:
    """Raises ValueError naming the first file of a sealed shard whose sha256 is not the one its meta.json holds."""
    meta = json.loads((path / "meta.json").read_text())
    for name, digest in meta["sha256"].items():
        if sha256_of(path / name) != digest:
            raise ValueError(f"recording shard {str(path)!r}: {name} does not match its checksum")


def record_shards(target, tokenizer, plan: RecordPlan, prompts, out: Path, shards=None, log=print) -> list[dict]:
    """Records the shards of `plan` not yet sealed in `out` (all, or those listed in `shards`), resuming a partial
    one at its first missing part -> the metas of the shards sealed in this call."""
    open_plan(out, plan)
    sealed = []
    for k in (range(plan.num_shards) if shards is None else shards):
        if (shard_dir(out, k) / "meta.json").is_file():
            continue
        partial = shard_dir(out, k, partial=True)
        partial.mkdir(exist_ok=True)
        lo, hi = k * plan.shard_size, min((k + 1) * plan.shard_size, plan.num_prompts)
        # batches of prompts of like length: a batch's prefill pads every prompt to its longest
        order = sorted(range(lo, hi), key=lambda i: (len(tokenizer.apply_chat_template(
            prompts[i].conversation(), add_generation_prompt=True, tokenize=True)), i))
        parts = []
        for j, first in enumerate(range(0, hi - lo, plan.batch_size)):
            path = partial / f"part-{j:03d}.npz"
            parts.append(path)
            if path.is_file():
                continue
            t0, c0 = time.time(), time.process_time()
            indices = order[first:first + plan.batch_size]
            arrays, answer_tokens = record_part(target, tokenizer, plan, [prompts[i] for i in indices], indices,
                                                lo // plan.batch_size + j)
            meta = {"prompts": len(indices), "answer_tokens": answer_tokens, "wall_seconds": time.time() - t0,
                    "cpu_seconds": time.process_time() - c0}
            buf = io.BytesIO()
            np.savez(buf, meta=np.array(json.dumps(meta)), **arrays)
            _write_atomic(path, buf.getvalue())
            log(f"[record] shard {k} part {j}: {len(indices)} prompts, {len(arrays['tokens'])} tokens "
                f"({answer_tokens} answered) in {meta['cpu_seconds']:.0f} CPU s")
        sealed.append(_seal(out, k, plan, parts))
        log(f"[record] sealed {shard_dir(out, k)}: {sealed[-1]['tokens']} tokens")
    return sealed


def summary(out: Path) -> dict:
    """The sealed shards of a recording directory, totalled: tokens, answer tokens, bytes per token, tokens per
    CPU second."""
    metas = [json.loads((d / "meta.json").read_text()) for d in sorted(out.glob("shard-?????"))
             if (d / "meta.json").is_file()]
    tokens = sum(m["tokens"] for m in metas)
    cpu = sum(m["cpu_seconds"] for m in metas)
    return {"shards": len(metas), "prompts": sum(m["prompts"] for m in metas),
            "conversations": sum(m["conversations"] for m in metas), "tokens": tokens,
            "answer_tokens": sum(m["answer_tokens"] for m in metas), "cpu_seconds": round(cpu, 1),
            "bytes_per_token": round(sum(m["bytes"] for m in metas) / max(tokens, 1), 1),
            "tokens_per_cpu_second": round(tokens / max(cpu, 1e-9), 1)}
