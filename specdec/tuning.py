"""Tuned speculative shapes: what `specdec tune` measured for one target + draft on one machine, as a small JSON the
engine loads, and the two ways the engine decodes with it.

    Engine(target, draft, spec="tuned:PATH")     # each step: the bucket's best measured shape
    Engine(target, draft, spec="adaptive:PATH")  # each step: a choice among the bucket's candidates, by an EMA of
                                                 # each request's accepted length (no draft at all among them)
    Engine(target, draft, spec=TunedSpec.load(PATH))  # the same as "tuned:PATH"; adaptive=True for the other
    Engine(target, draft, spec="tuned:stdlib-byte-24l")  # a zoo pair's name: the file shipped for it and the
                                                         # draft's kind (`SHIPPED_DIR`, `shipped_files`)

A shape is (num_steps, topk, num_draft_tokens); `NO_DRAFT` (0, 0, 1) verifies the root alone. Shapes switch between
steps only, each one a fixed-shape step (one CUDA graph per batch bucket and shape), so output stays exactly what
target-only decoding gives (greedy tokens, logprobs, the sampled distribution): only the speed moves.

The file (`FORMAT`):
    {"format": "specdec-tuned/1",
     "target": {"name": str, "fingerprint": str}, "draft": {"kind": str, "fingerprint": str},
     "machine": {"device": str, "cpu_model": str, "threads": int, "impl": str, "dtype": str},
     "buckets": {"<batch size>": {"shape": SHAPE,
                                  "candidates": [{"shape": SHAPE, "mean_accept_len": float, "step_ms": float}, ...]}}}
with SHAPE = {"num_steps": int, "topk": int, "num_draft_tokens": int}. A bucket serves the batches nearest its size by
ratio (`TunedSpec.bucket`); its shape may be no draft (SHAPE of `NO_DRAFT`), where the tuner measured no drafting
shape beating it at that batch size, and some candidate of the file must draft; its candidates are what adaptive
speculation chooses among (step_ms at that batch size, mean_accept_len per request and step, bonus token included).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import SpecConfig
from .ops.contract import NO_DRAFT
from .draft_kinds import kind_of

FORMAT = "specdec-tuned/1"
Shape = tuple[int, int, int]


def shape_spec(shape: Shape) -> SpecConfig | None:
    """A drafting shape's SpecConfig (ValueError naming the bad field), None for `NO_DRAFT`."""
    return None if tuple(shape) == NO_DRAFT else SpecConfig(*shape)


def shape_name(shape: Shape) -> str:
    """(5, 4, 16) -> "S5 K4 W16"; NO_DRAFT -> "no draft"."""
    return "no draft" if tuple(shape) == NO_DRAFT else "S{} K{} W{}".format(*shape)


def fingerprint(model) -> str:
    """A short hash of a model's class, config and weights (fp32 values): what a tuned file was measured on."""
    h = hashlib.sha256(type(model).__name__.encode())
    config = getattr(model, "config", None)
    if config is not None:
        h.update(repr(sorted((k, repr(v)) for k, v in vars(config).items())).encode())
    if dataclasses.is_dataclass(model):  # a draft of parameters only (NGRAM's)
        h.update(repr(model).encode())
    if isinstance(model, torch.nn.Module):
        for name, tensor in sorted(model.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def parameters_entry(draft) -> dict:
    """A tuned file's draft.parameters for a draft of parameters only (NGRAM's): recorded beside the fingerprint so
    that a file tuned for parameters of other names is refused naming them; {} for a model."""
    return {"parameters": dataclasses.asdict(draft)} if dataclasses.is_dataclass(draft) else {}


@dataclass(frozen=True)
class Candidate:
    """One shape of a bucket: its measured acceptance (tokens per request and step, bonus included) and step cost."""

    shape: Shape
    mean_accept_len: float
    step_ms: float

    @property
    def tokens_per_ms(self) -> float:
        """Per request: what adaptive speculation weighs a shape by, before a request's own acceptance."""
        return self.mean_accept_len / self.step_ms


@dataclass(frozen=True)
class Bucket:
    shape: Shape
    candidates: tuple[Candidate, ...]


@dataclass(frozen=True)
class TunedSpec:
    """A tuned file, loaded and checked (`load`); `adaptive` picks which of the two ways the engine uses it."""

    target: dict
    draft: dict
    machine: dict
    buckets: dict[int, Bucket]
    adaptive: bool = False
    path: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    # ---- reading and writing -----------------------------------------------------------------
    @classmethod
    def load(cls, path, adaptive: bool = False) -> "TunedSpec":
        """Read and check a tuned file; a one-line ValueError naming the bad field otherwise."""
        path = str(path)
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ValueError(f"tuned file {path}: cannot be read ({e.strerror or e})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"tuned file {path}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
        return cls.from_dict(data, path=path, adaptive=adaptive)

    @classmethod
    def from_dict(cls, data, path: str = "<dict>", adaptive: bool = False) -> "TunedSpec":
        def bad(where: str, what: str) -> ValueError:
            return ValueError(f"tuned file {path}: {where} {what}")

        def obj(value, where):
            if not isinstance(value, dict):
                raise bad(where, f"must be an object, got {type(value).__name__}")
            return value

        def get(d, key, where, kind):
            if key not in d:
                raise bad(f"{where}.{key}" if where else key, "is missing")
            value = d[key]
            if kind is str and not isinstance(value, str):
                raise bad(f"{where}.{key}" if where else key, f"must be a string, got {value!r}")
            return value

        def number(d, key, where):
            value = get(d, key, where, float)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise bad(f"{where}.{key}", f"must be a positive number, got {value!r}")
            return float(value)

        def shape(value, where):
            obj(value, where)
            out = []
            for key in ("num_steps", "topk", "num_draft_tokens"):
                v = get(value, key, where, int)
                if isinstance(v, bool) or not isinstance(v, int):
                    raise bad(f"{where}.{key}", f"must be an integer, got {v!r}")
                out.append(v)
            out = tuple(out)
            try:
                shape_spec(out)
            except ValueError as e:
                raise bad(where, f"is no legal shape: {e}") from None
            return out

        obj(data, "the top level")
        if data.get("format") != FORMAT:
            raise bad("format", f"must be {FORMAT!r}, got {data.get('format')!r}")
        target, draft = obj(get(data, "target", "", dict), "target"), obj(get(data, "draft", "", dict), "draft")
        for d, where in ((target, "target"), (draft, "draft")):
            get(d, "fingerprint", where, str)
        get(draft, "kind", "draft", str)
        machine = obj(data.get("machine", {}), "machine")
        raw = obj(get(data, "buckets", "", dict), "buckets")
        if not raw:
            raise bad("buckets", "must name at least one batch size")
        buckets = {}
        for key, value in raw.items():
            where = f"buckets[{key!r}]"
            if not (isinstance(key, str) and key.isdigit() and int(key) >= 1):
                raise bad(where, "must be keyed by a batch size >= 1")
            obj(value, where)
            best = shape(get(value, "shape", where, dict), f"{where}.shape")
            cands = get(value, "candidates", where, list)
            if not isinstance(cands, list) or not cands:
                raise bad(f"{where}.candidates", "must be a non-empty list")
            parsed = []
            for i, c in enumerate(cands):
                cw = f"{where}.candidates[{i}]"
                obj(c, cw)
                parsed.append(Candidate(shape(get(c, "shape", cw, dict), f"{cw}.shape"),
                                        number(c, "mean_accept_len", cw), number(c, "step_ms", cw)))
            if best not in [c.shape for c in parsed]:
                raise bad(f"{where}.shape", f"{shape_name(best)} must be one of the bucket's candidates")
            buckets[int(key)] = Bucket(best, tuple(parsed))
        if all(c.shape == NO_DRAFT for b in buckets.values() for c in b.candidates):
            raise bad("buckets", "hold no drafting shape: a file whose every candidate is no draft is target-only "
                                 "decoding (run without a draft)")
        known = {"format", "target", "draft", "machine", "buckets"}
        return cls(dict(target), dict(draft), dict(machine), dict(sorted(buckets.items())), adaptive, path,
                   {k: v for k, v in data.items() if k not in known})

    def to_dict(self) -> dict:
        def shape(s):
            return dict(zip(("num_steps", "topk", "num_draft_tokens"), s))
        return {"format": FORMAT, "target": self.target, "draft": self.draft, "machine": self.machine,
                "buckets": {str(b): {"shape": shape(v.shape),
                                     "candidates": [{"shape": shape(c.shape), "mean_accept_len": c.mean_accept_len,
                                                     "step_ms": c.step_ms} for c in v.candidates]}
                            for b, v in self.buckets.items()}, **self.extra}

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    def with_adaptive(self, adaptive: bool = True) -> "TunedSpec":
        """The same file, used adaptively (or not)."""
        return TunedSpec(self.target, self.draft, self.machine, self.buckets, adaptive, self.path, self.extra)

    # ---- use ---------------------------------------------------------------------------------
    def bucket(self, batch_size: int) -> Bucket:
        """The tuned bucket of a batch of `batch_size`: the nearest by ratio of sizes (log2), a tie going to the bigger
        bucket. A step's cost grows with the batch by a factor, not a difference: tuned at 1 and 16, a batch of 2 or 3
        is served by the B = 1 shape (its step costs nearly the one-request step), one of 4 to 16 by the B = 16 shape.
        A tie goes up because the bigger bucket's shapes are the cheaper ones."""
        return self.buckets[min(self.buckets, key=lambda size: (abs(math.log2(size / batch_size)), -size))]

    def shapes(self) -> list[Shape]:
        """Every shape the engine may run with this file: `drafting_shape` first, the buckets' best, and with
        `adaptive` their candidates."""
        out = [self.drafting_shape]
        for b in self.buckets.values():
            out += [b.shape] + ([c.shape for c in b.candidates] if self.adaptive else [])
        return list(dict.fromkeys(out))

    @property
    def drafting_shape(self) -> Shape:
        """The worker's own SpecConfig's shape: the first bucket's best that drafts, else the first drafting candidate
        (a file may tune every bucket to no draft, where no shape beat it: its batches then decode target-only)."""
        best = [b.shape for b in self.buckets.values()]
        return next(s for s in best + [c.shape for b in self.buckets.values() for c in b.candidates] if s != NO_DRAFT)

    def check_pair(self, target, draft) -> None:
        """ValueError naming the field when this file was tuned for another target or draft."""
        kind = kind_of(draft).name
        if self.draft["kind"] != kind:
            raise ValueError(f"tuned file {self.path}: draft.kind is {self.draft['kind']!r}, but the draft given is "
                             f"of kind {kind!r}")
        params, recorded_params = parameters_entry(draft).get("parameters"), self.draft.get("parameters")
        if params is not None and self.draft["fingerprint"] != fingerprint(draft) and (
                not isinstance(recorded_params, dict) or set(recorded_params) != set(params)):
            # a file from before the draft's parameters were renamed (NGRAM's, for SGLang 0.5.23's) is named so
            old = sorted(set(recorded_params) - set(params)) if isinstance(recorded_params, dict) else list(
                getattr(draft, "RETIRED_PARAMETERS", ()))
            raise ValueError(f"tuned file {self.path}: tuned for {type(draft).__name__}'s older parameters"
                             f"{' (' + ', '.join(old) + ')' if old else ''}, not this one's "
                             f"({', '.join(params)}); run `specdec tune` for this pair")
        for what, model in (("target", target), ("draft", draft)):
            recorded = getattr(self, what)
            if recorded["fingerprint"] != fingerprint(model):
                name = recorded.get("name", "")
                raise ValueError(f"tuned file {self.path}: {what}.fingerprint {recorded['fingerprint']} "
                                 f"{'(' + name + ') ' if name else ''}is not this {what}'s ({fingerprint(model)}): "
                                 f"the file was tuned for another {what}; run `specdec tune` for this pair")

    def policy(self) -> "ShapePolicy":
        return AdaptiveShapes(self) if self.adaptive else TunedShapes(self)


#: the tuned files that ship with the zoo's pairs, one per (pair, draft kind): `<pair>-<kind>.json`, measured at one
#: thread on the CPU their `machine` names (`specdec tune --out` writes one)
SHIPPED_DIR = Path(__file__).resolve().parent / "zoo" / "tuned"


def shipped_files() -> dict[tuple[str, str], Path]:
    """(pair, draft kind) -> the tuned file shipped for it. Kind names hold no hyphen, pair names do."""
    files = {}
    for path in sorted(SHIPPED_DIR.glob("*.json")):
        pair, _, kind = path.stem.rpartition("-")
        files[(pair, kind)] = path
    return files


def shipped_names() -> str:
    """What ships, for a message: `stdlib-byte-24l (draft_lm, eagle, ngram), stdlib-byte-6l (eagle)`."""
    by_pair: dict[str, list[str]] = {}
    for pair, kind in shipped_files():
        by_pair.setdefault(pair, []).append(kind)
    return ", ".join(f"{pair} ({', '.join(kinds)})" for pair, kinds in by_pair.items()) or "none"


def shipped_file(pair: str, kind: str) -> Path:
    """The tuned file shipped for a zoo pair and draft kind; a one-line ValueError listing what ships otherwise."""
    path = shipped_files().get((pair, kind))
    if path is None:
        raise ValueError(f"no tuned file ships for pair {pair!r} with a draft of kind {kind!r}; shipped: "
                         f"{shipped_names()}; run `specdec tune` and pass 'tuned:PATH'")
    return path


def names_a_pair(where: str) -> bool:
    """`tuned:WHERE` names a pair when WHERE is no file, holds no directory and no `.json`: a path stays a path."""
    return not Path(where).is_file() and "/" not in where and "\\" not in where and not where.endswith(".json")


def parse_spec(spec, draft=None):
    """Engine's `spec` argument: a SpecConfig, a TunedSpec, or "tuned:WHERE" / "adaptive:WHERE" (loaded), WHERE a
    file's path or a zoo pair's name (its shipped file for `draft`'s kind, `shipped_file`)."""
    if isinstance(spec, str):
        how, colon, where = spec.partition(":")
        if not colon or how not in ("tuned", "adaptive") or not where:
            raise ValueError(f"spec as a string must be 'tuned:PAIR' / 'adaptive:PAIR' (the file shipped for a zoo "
                             f"pair) or 'tuned:PATH' or 'adaptive:PATH', got {spec!r}")
        if names_a_pair(where):
            if draft is None:
                raise ValueError(f"spec {spec!r}: a tuned spec needs the draft it was tuned with (its kind picks "
                                 f"the file)")
            where = shipped_file(where, kind_of(draft).name)
        return TunedSpec.load(where, adaptive=how == "adaptive")
    return spec


class ShapePolicy:
    """The engine's choice of each decode step's shape (host side, between steps)."""

    def start(self, batch_size: int) -> None:
        """A new generate call of `batch_size` requests."""

    def filter(self, keep: list[int]) -> None:
        """Only the requests at batch positions `keep` go on."""

    def observe(self, accept_lens: list[int]) -> None:
        """The last decode step's accepted lengths, one per request (bonus token included)."""

    def choose(self, batch_size: int) -> Shape:
        raise NotImplementedError


class TunedShapes(ShapePolicy):
    """The best measured shape of the batch's bucket, re-read as requests finish and the batch shrinks."""

    def __init__(self, tuned: TunedSpec):
        self.tuned = tuned

    def choose(self, batch_size: int) -> Shape:
        return self.tuned.bucket(batch_size).shape


#: how much faster adaptive speculation must predict a drafting shape than the bucket's tuned one to leave it
#: (`AdaptiveShapes`): the size of the tuning prompts' misranking of near-equal shapes on other prompts
MARGIN = 0.06


class AdaptiveShapes(ShapePolicy):
    """Per request, an EMA of its draft quality q: its accepted drafts per step over what the tuning prompts averaged
    with the shape it ran (q = 1: as the tuning prompts, 0: nothing accepted). A shape c is predicted to give request b
    1 + q_b (a_c - 1) tokens per step (a_c its tuned mean, at most num_steps + 1); each step runs the bucket candidate
    with the most predicted tokens per millisecond over the batch. NO_DRAFT (a_c = 1) runs only when it wins both by
    the EMA and by each request's mean quality over all its drafted steps (the prior q = 1 counted as one step): a
    step's accepted length is noisy, so the EMA of a request whose drafts are half as good as the tuning prompts'
    (a sampled request, where the best drafting shapes still beat no draft by up to 29 %) dips past the no-draft
    boundary now and then, and an undrafted request observes nothing to climb back with (on the deep pair such
    requests spent up to half their steps undrafted). Since NO_DRAFT measures nothing, after `probe_every` such
    steps in a row the cheapest drafting candidate runs once.

    Among the drafting candidates the bucket's tuned shape stands unless another is predicted `margin` faster. The
    candidates' acceptance comes from the tuning prompts, and how it ranks near-equal shapes does not carry over to
    other prompts: on the small pair at B = 1 the chain S6 measured 0.2 % faster than the tuned chain S5 on the tuning
    prompts and 6 % slower on the tune check's code + prose prompts, so the policy without the margin ran S6 in 61 % of
    its steps and fell to 0.96x the best static shape (`results/adaptive-sim-20261205/`). A request whose drafts fail
    still leaves for no draft: that prediction (one token a step) does not depend on the tuning prompts.

    decay: the EMA's weight of the newest step. A step's accepted length varies widely around a request's mean, so a
    fast EMA leaves the best shape after one unlucky step, and a slow one keeps drafting for a request whose drafts
    all fail (with 0.25 it gives up after four such steps, with 0.1 after nine). On the deep pair (EAGLE, held-out
    code and code mixed with prose, B = 1 and 16, two passes in turn on a loaded machine) 0.5 ran 0.94-1.03x the best
    static shape, 0.25 0.98-1.00x (one outlier at 1.16x) and 0.1 0.99-1.03x."""

    def __init__(self, tuned: TunedSpec, decay: float = 0.25, probe_every: int = 4, margin: float = MARGIN):
        self.tuned = tuned
        self.decay = decay
        self.probe_every = probe_every
        self.margin = margin
        self.quality: list[float] = []
        self.quality_sum: list[float] = []  # per request: the prior 1 plus every drafted step's q
        self.drafted = 0  # drafted steps observed (every request of a generate call sees the same steps)
        self.last: Candidate | None = None
        self.undrafted = 0

    def start(self, batch_size: int) -> None:
        self.quality = [1.0] * batch_size
        self.quality_sum, self.drafted = [1.0] * batch_size, 0
        self.last, self.undrafted = None, 0

    def filter(self, keep: list[int]) -> None:
        self.quality = [self.quality[i] for i in keep]
        self.quality_sum = [self.quality_sum[i] for i in keep]

    def observe(self, accept_lens: list[int]) -> None:
        c = self.last
        if c is None or c.shape == NO_DRAFT or c.mean_accept_len <= 1.0:
            return
        d = self.decay
        seen = [(a - 1) / (c.mean_accept_len - 1) for a in accept_lens]
        self.quality = [(1 - d) * q + d * x for q, x in zip(self.quality, seen)]
        self.quality_sum = [total + x for total, x in zip(self.quality_sum, seen)]
        self.drafted += 1

    def mean_quality(self) -> list[float]:
        """Per request: its mean q over its drafted steps, the prior q = 1 counted as one."""
        return [total / (1 + self.drafted) for total in self.quality_sum]

    def predicted_tokens(self, c: Candidate, quality: list[float] | None = None) -> float:
        """The batch's predicted tokens of one step of candidate c (by the EMA, or by `quality`)."""
        cap = c.shape[0] + 1
        return sum(min(1 + q * (c.mean_accept_len - 1), cap) for q in (self.quality if quality is None else quality))

    def choose(self, batch_size: int) -> Shape:
        bucket = self.tuned.bucket(batch_size)
        cands = bucket.candidates
        drafting = [c for c in cands if c.shape != NO_DRAFT]
        best = max(cands, key=lambda c: self.predicted_tokens(c) / c.step_ms)
        if best.shape == NO_DRAFT and drafting:
            mean = self.mean_quality()
            undrafted_rate = self.predicted_tokens(best, mean) / best.step_ms
            if max(self.predicted_tokens(c, mean) / c.step_ms for c in drafting) > undrafted_rate:
                best = max(drafting, key=lambda c: self.predicted_tokens(c) / c.step_ms)  # the EMA picks which
        if best.shape != NO_DRAFT:
            best = self.anchored(bucket, best)
        if best.shape == NO_DRAFT:
            self.undrafted += 1
            if self.undrafted > self.probe_every and drafting:
                best, self.undrafted = min(drafting, key=lambda c: c.step_ms), 0
        else:
            self.undrafted = 0
        self.last = best
        return best.shape

    def anchored(self, bucket: Bucket, best: Candidate) -> Candidate:
        """The bucket's tuned shape instead of `best` (a drafting candidate) unless `best` is predicted `margin`
        faster for this batch."""
        tuned = next((c for c in bucket.candidates if c.shape == bucket.shape), None)
        if tuned is None or tuned.shape == NO_DRAFT or tuned is best:
            return best
        rate = self.predicted_tokens(best) / best.step_ms
        return best if rate > (1 + self.margin) * self.predicted_tokens(tuned) / tuned.step_ms else tuned
