"""The target's own chat responses with the hidden states it computed while writing them (SpecForge's practice:
regenerate the training answers with the target, then train the drafts on what the target read).

`record_responses` decodes chat prompts through the engine's target-only path and keeps, for every token the target
read (the prompt's and its own answer's, except the answer's last token, which no forward reads), the residual
streams entering the recorded layers (index L: the last layer's output, before the final norm). The target's logits
and final hidden state follow from layer L's stream through its norm and LM head (`RecordedTarget`), so a draft
trains without running the target again.

A recording is a directory: `tokens.npy` (N,) int32, the conversations end to end, each without its last token;
`features.npy` (N, len(layers) * H) float16, aligned with the tokens; `starts.npy` the offset of each conversation;
`meta.json` (layers, target fingerprint, prompts, sampling, time). Several recordings (written on several cores)
are read together by `load_recordings`; a directory of shards (`shards`, a prompt file recorded resumably, each shard
a recording of this layout) reads as its sealed shards, memory-mapped.

`python -m specdec.zoo.train.record --model NAME --prompts FILE --out DIR` (a prompt file, in shards), or
`--prompts N --shard I/K` (the first N stdlib chat prompts, the shipped drafts' recipe)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...models.outputs import ModelOutput
from .capture import record_conversations
from .shards import RecordPlan, record_shards, sha256_of, summary
from .. import target_fingerprint
from ... import zoo
from ...prompt_files import read_prompts
from ...models.eagle3 import default_feature_layers
from ..chat_prompts import chat_prompt_ids


def record_responses(target, prompts, layers, max_new_tokens: int, temperatures, batch_size: int = 16,
                     seed: int = 0, stop_token_ids=(), log=print):
    """prompts: token id lists; temperatures: one per prompt (0: greedy) -> (tokens (N,) int32, features (N, F*H)
    float16, starts (len(prompts),) int64): each conversation is its prompt and the target's answer (up to
    max_new_tokens, ending at a stop id) without its last token, and the streams entering `layers` at every
    token."""
    if len(temperatures) != len(prompts):
        raise ValueError(f"got {len(temperatures)} temperatures for {len(prompts)} prompts")
    toks, feats, starts, n = [], [], [], 0
    t0 = time.time()
    for lo in range(0, len(prompts), batch_size):
        batch = prompts[lo:lo + batch_size]
        convs, _ = record_conversations(target, batch, layers, max_new_tokens, temperatures[lo:lo + batch_size],
                                        batch_size, seed + lo, stop_token_ids)
        for t, (f,) in convs:
            starts.append(n)
            toks.append(t)
            feats.append(f)
            n += len(t)
        log(f"[record] {lo + len(batch)}/{len(prompts)} conversations, {n} tokens, {time.time() - t0:.0f}s")
    return np.concatenate(toks), np.concatenate(feats), np.asarray(starts, dtype=np.int64)


class SegmentedRows:
    """Row-aligned arrays (memory-mapped, one per recording or shard) read as one: `rows[a:b]` reads only the
    segments the slice touches, so recordings larger than memory can be sampled."""

    def __init__(self, parts):
        self.parts = list(parts)
        self.offsets = np.concatenate([[0], np.cumsum([len(x) for x in self.parts])]).astype(np.int64)
        self.shape = (int(self.offsets[-1]),) + tuple(self.parts[0].shape[1:])
        self.dtype = self.parts[0].dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index):
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("SegmentedRows reads contiguous row slices only")
        lo, hi, _ = index.indices(len(self))
        first = int(np.searchsorted(self.offsets, lo, side="right")) - 1
        pieces = []
        for k in range(max(first, 0), len(self.parts)):
            a, b = self.offsets[k], self.offsets[k + 1]
            if a >= hi:
                break
            pieces.append(np.asarray(self.parts[k][max(lo, a) - a:min(hi, b) - a]))
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces) if pieces else self.parts[0][:0]


@dataclass
class Recording:
    """Recordings read together: tokens (N,) int64, features (N, F) float16 (memory-mapped, `SegmentedRows` over
    several), layers, meta (one per recording or shard); and where every one of them recorded the target's top-k
    (shards of prompt files), topk_ids (N, k) int32 (-1 on rows the target was not asked to continue: a prompt's
    rows but its last) and topk_probs (N, k) float16."""

    tokens: np.ndarray
    features: np.ndarray | SegmentedRows
    layers: tuple
    meta: list
    topk_ids: np.ndarray | SegmentedRows | None = None
    topk_probs: np.ndarray | SegmentedRows | None = None


def recording_dirs(dirs) -> list[Path]:
    """Comma-separated directories (or a list) -> the recordings they hold: a directory `record` wrote, or the
    sealed shards of one a prompt file was recorded into (`shards`; its unsealed shards are left out)."""
    out = []
    for d in (Path(x) for x in (dirs.split(",") if isinstance(dirs, str) else dirs) if str(x)):
        if (d / "manifest.json").is_file():
            sealed = sorted(x for x in d.glob("shard-?????") if (x / "meta.json").is_file())
            if not sealed:
                raise ValueError(f"recording {str(d)!r} has no sealed shard yet")
            out += sealed
        elif (d / "meta.json").is_file():
            out.append(d)
        else:
            raise ValueError(f"recording {str(d)!r}: no meta.json (not a directory `record` wrote)")
    if not out:
        raise ValueError("recordings: no directory given")
    return out


def load_recordings(dirs) -> Recording:
    """Comma-separated recording directories (or a list; `recording_dirs`) -> one `Recording`; they must record
    the same layers of the same target."""
    dirs = recording_dirs(dirs)
    metas, toks, feats = [], [], []
    for d in dirs:
        metas.append(json.loads((d / "meta.json").read_text()))
        toks.append(np.load(d / "tokens.npy").astype(np.int64))
        feats.append(np.load(d / "features.npy", mmap_mode="r"))
    for m in metas[1:]:
        if m["layers"] != metas[0]["layers"] or m["target"] != metas[0]["target"]:
            raise ValueError(f"recordings {[str(d) for d in dirs]} record different layers or targets")
    rows = lambda parts: parts[0] if len(parts) == 1 else SegmentedRows(parts)  # noqa: E731
    topk_ids = topk_probs = None
    if all((d / "topk_ids.npy").is_file() and (d / "topk_probs.npy").is_file() for d in dirs):
        topk_ids = rows([np.load(d / "topk_ids.npy", mmap_mode="r") for d in dirs])
        topk_probs = rows([np.load(d / "topk_probs.npy", mmap_mode="r") for d in dirs])
    return Recording(np.concatenate(toks), rows(feats), tuple(metas[0]["layers"]), metas, topk_ids, topk_probs)


#: the logit of an id outside a row's recorded top-k: finite, so that a softmax over ids none of which was recorded
#: (an EAGLE-3 head's draft vocabulary missing all of them) is a harmless uniform row rather than NaN
OUTSIDE_TOPK_LOGIT = -1e4

#: the teachers a recording can answer with: the target's LM head on the recorded last-layer stream (every row), or
#: the recorded top-k distribution where there is one (the target's LM head only on the rows without)
TEACHERS = ("full", "topk")


def topk_logits(ids: torch.Tensor, probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(..., k) recorded ids and probabilities -> (..., V) logits whose softmax is the top-k distribution renormalised
    (the mass beyond the k-th id dropped): log p at the recorded ids, `OUTSIDE_TOPK_LOGIT` elsewhere."""
    logits = torch.full((*ids.shape[:-1], vocab_size), OUTSIDE_TOPK_LOGIT, dtype=torch.float32, device=ids.device)
    return logits.scatter_(-1, ids.long(), probs.float().clamp_min(1e-30).log())


class RecordedTarget(torch.nn.Module):
    """The frozen target as the trainer's losses call it (`target(x, positions, features=...)`), answered from a
    recording: the batch `RecordedWindows` drew last, whose ids x must be (a prefix of). The final hidden state is the
    target's norm applied to the recorded layer-L stream. Logits, with teacher "full", are the target's LM head on that
    hidden state; with "topk", on the rows where the recording holds the target's top-k (an answer's), the recorded
    top-k distribution (`topk_logits`), and the LM head only on the rows without (a prompt's): the draft then learns
    the distribution the target was sampled from while it wrote the answer, and the answers' rows need no LM head."""

    def __init__(self, target, layers, teacher: str = "full"):
        super().__init__()
        L = target.config.num_hidden_layers
        if L not in layers:
            raise ValueError(f"a recording must keep layer {L} (the last layer's output), got layers {list(layers)}")
        if teacher not in TEACHERS:
            raise ValueError(f"teacher must be one of {TEACHERS}, got {teacher!r}")
        self.target, self.layers, self.teacher, self.current = target, tuple(layers), teacher, None

    def forward(self, input_ids, positions=None, cache=None, meta=None, return_logits=True, features=None):
        ids, feats, topk = self.current
        ids = ids.to(input_ids.device)
        T = input_ids.shape[1]
        if T > ids.shape[1] or not torch.equal(input_ids, ids[:, :T]):
            raise ValueError("RecordedTarget: the ids are not (a prefix of) the batch last drawn from the recording")
        H = self.target.config.hidden_size
        f = feats[:, :T].to(input_ids.device).float()
        part = {i: f[..., k * H:(k + 1) * H] for k, i in enumerate(self.layers)}
        hidden = self.target.model.norm(part[self.target.config.num_hidden_layers])
        logits = self._logits(hidden, topk, T) if return_logits else None
        if features is not None:
            missing = [i for i in features if i not in part]
            if missing:
                raise ValueError(f"the recording keeps layers {list(self.layers)}, not {missing}")
        out_f = None if features is None else torch.cat([part[i] for i in features], dim=-1)
        return ModelOutput(logits, hidden, out_f)

    def _logits(self, hidden: torch.Tensor, topk, T: int) -> torch.Tensor:
        if self.teacher == "full":
            return self.target.compute_logits(hidden)
        if topk is None:
            raise ValueError("teacher 'topk' needs a recording of the target's top-k (record with --topk > 0)")
        ids, probs = (x[:, :T].to(hidden.device) for x in topk)
        recorded = ids[..., 0] >= 0
        logits = topk_logits(ids.clamp_min(0), probs, self.target.config.vocab_size)
        if not bool(recorded.all()):
            logits[~recorded] = self.target.compute_logits(hidden[~recorded]).float()
        return logits


class RecordedWindows:
    """Seeded random windows of a recording (`Windows`' interface): `next()` -> (B, length) int64 ids, and the
    teacher's `current` set to those ids with their features."""

    def __init__(self, rec: Recording, teacher: RecordedTarget, batch_size: int, length: int, seed: int):
        if len(rec.tokens) <= length:
            raise ValueError(f"a recording of {len(rec.tokens)} tokens is too short for windows of {length}")
        self.rec, self.teacher, self.batch_size, self.length = rec, teacher, batch_size, length
        self.rng = np.random.default_rng(seed)

    def next(self) -> torch.Tensor:
        starts = np.sort(self.rng.integers(0, len(self.rec.tokens) - self.length, size=self.batch_size))
        ids = torch.from_numpy(np.stack([self.rec.tokens[s:s + self.length] for s in starts]))
        feats = torch.from_numpy(np.stack([self.rec.features[s:s + self.length] for s in starts]))
        topk = None
        if self.teacher.teacher == "topk" and self.rec.topk_ids is not None:
            topk = tuple(torch.from_numpy(np.stack([rows[s:s + self.length] for s in starts]))
                         for rows in (self.rec.topk_ids, self.rec.topk_probs))
        self.teacher.current = (ids, feats, topk)
        return ids


class RecordedData:
    """What a trainer stage reads from recordings instead of the corpus (`stages.stage_batches`): `stream`, the
    recorded tokens (the draft vocabulary is their most frequent ids); `teacher`, the target answered from the
    recording; `windows(batch_size, length, seed)`; `stats()`, what the card records of the data. The recordings
    must be of this target (its fingerprint)."""

    def __init__(self, target, dirs, teacher: str = "auto"):
        self.rec = load_recordings(dirs)
        want = target_fingerprint(target)
        if self.rec.meta[0]["target"] != want:
            raise ValueError(f"recordings {dirs!r} were written by target {self.rec.meta[0]['target']}, not this one "
                             f"({want})")
        if teacher == "auto":
            teacher = "topk" if self.rec.topk_ids is not None else "full"
        elif teacher == "topk" and self.rec.topk_ids is None:
            raise ValueError(f"teacher 'topk': recordings {dirs!r} hold no top-k (record with --topk > 0)")
        self.teacher = RecordedTarget(target, self.rec.layers, teacher)
        self.stream = self.rec.tokens

    def windows(self, batch_size: int, length: int, seed: int) -> RecordedWindows:
        return RecordedWindows(self.rec, self.teacher, batch_size, length, seed)

    def stats(self) -> dict:
        m = self.rec.meta
        data = {"recordings": len(m), "conversations": sum(x["conversations"] for x in m),
                "tokens": int(len(self.rec.tokens)), "split": m[0]["split"], "layers": list(self.rec.layers),
                "max_new_tokens": m[0]["max_new_tokens"], "sampled_every": m[0]["sampled_every"],
                "temperature": m[0]["temperature"], "record_cpu_seconds": round(sum(x["cpu_seconds"] for x in m), 1),
                "teacher": self.teacher.teacher}
        if self.teacher.teacher == "topk":
            data["teacher_topk"] = int(self.rec.topk_ids.shape[1])
        if all("answer_tokens" in x for x in m):  # shards of prompt files (`shards`)
            data["answer_tokens"] = sum(x["answer_tokens"] for x in m)
            data["prompt_files"] = sorted({Path(x["prompts_file"]).name for x in m})
        return {"data": data}


def _file_main(a, p) -> int:
    """`--prompts FILE`: the sharded, resumable recording (`shards`)."""
    i, k = _shard_arg(a.shard, p)
    prompts = read_prompts(a.prompts, a.categories.split(",") if a.categories else None)
    if a.limit:
        prompts = prompts[:a.limit]
    target, tok, _ = zoo.load_target(a.model, device=a.device)
    L = target.config.num_hidden_layers
    plan = RecordPlan(str(a.prompts), sha256_of(Path(a.prompts)), len(prompts), a.model, target_fingerprint(target),
                      tuple(sorted(set(default_feature_layers(L)) | {L})), a.topk, a.max_new_tokens,
                      a.sampled_every, a.temperature, a.seed, a.shard_size, a.batch_size)
    out = Path(a.out)
    record_shards(target, tok, plan, prompts, out, range(i, plan.num_shards, k),
                  log=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(summary(out)))
    return 0


def _shard_arg(text, p):
    try:
        i, k = (int(x) for x in text.split("/"))
        if not 0 <= i < k:
            raise ValueError
    except ValueError:
        p.error(f"--shard must be I/K with 0 <= I < K, got {text!r}")
    return i, k


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.zoo.train.record", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="the target: a zoo real target, a .gguf file or a Hugging Face directory (default: "
                        "%(default)s)")
    p.add_argument("--prompts", required=True,
                   help="a prompt file (`specdec.prompt_files`; recorded in resumable shards), or a number N: the "
                        "first N chat prompts of --split (`specdec.zoo.chat_prompts`), all --shard parts together")
    p.add_argument("--categories", default="", help="with a prompt file: only these categories (comma-separated)")
    p.add_argument("--limit", type=int, default=0, help="with a prompt file: its first N prompts only")
    p.add_argument("--split", default="train", choices=("train", "heldout"),
                   help="the chat prompts' split (`specdec.zoo.chat_prompts`; default: %(default)s)")
    p.add_argument("--shard", default="0/1",
                   help="I/K: record every K-th prompt (with a prompt file: every K-th shard) from the I-th "
                        "(default: %(default)s)")
    p.add_argument("--shard-size", type=int, default=256, help="with a prompt file: prompts a shard")
    p.add_argument("--topk", type=int, default=32,
                   help="with a prompt file: the target's top-k next-token probabilities kept at every token "
                        "(default: %(default)s; 0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--sampled-every", type=int, default=4,
                   help="every N-th prompt is answered at --temperature, the others greedily (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="with a prompt file: where the target runs (cpu, cuda, ...)")
    p.add_argument("--out", required=True, help="directory to write")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    if not a.prompts.isdigit():
        return _file_main(a, p)
    a.prompts = int(a.prompts)
    i, k = _shard_arg(a.shard, p)
    bundle = zoo.load_model(a.model)
    target, tok = bundle.target, bundle.tokenizer
    L = target.config.num_hidden_layers
    layers = sorted(set(default_feature_layers(L)) | {L})
    all_ids = chat_prompt_ids(tok, a.split, a.prompts, a.seed)
    idx = list(range(i, a.prompts, k))
    prompts = [all_ids[j] for j in idx]
    temps = [a.temperature if j % a.sampled_every == a.sampled_every - 1 else 0.0 for j in idx]
    t0, c0 = time.time(), time.process_time()
    toks, feats, starts = record_responses(target, prompts, layers, a.max_new_tokens, temps, a.batch_size,
                                           a.seed * 1000 + i, tok.eos_token_ids,
                                           log=lambda s: print(s, file=sys.stderr))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "tokens.npy", toks)
    np.save(out / "features.npy", feats)
    np.save(out / "starts.npy", starts)
    meta = {"target": target_fingerprint(target), "model": a.model, "layers": layers, "split": a.split,
            "prompts": a.prompts, "shard": a.shard, "seed": a.seed, "conversations": len(prompts),
            "tokens": int(len(toks)), "max_new_tokens": a.max_new_tokens, "sampled_every": a.sampled_every,
            "temperature": a.temperature, "wall_seconds": round(time.time() - t0, 1),
            "cpu_seconds": round(time.process_time() - c0, 1), "threads": a.threads}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {out}: {len(prompts)} conversations, {len(toks)} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
