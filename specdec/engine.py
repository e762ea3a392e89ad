"""The engine: runs a batch of requests through a worker and turns step outputs into per-request results."""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .checks import check_int
from .config import SamplingParams, SpecConfig
from .ops.contract import NO_DRAFT
from .draft_kinds import DRAFT_KINDS, kind_of
from .token_map import load_token_map
from .tuning import TunedSpec, parse_spec, shape_name, shape_spec
from .workers.step import HostStep, StepTransfer
from .workers.graphs import DecodeGraphs
from .workers.base import TargetOnlyWorker
from .grammar import GrammarCompiler, grammar_stop_ids, require_xgrammar
from .workers.shaping import EMPTY_BY_PENALTIES

#: an engine that grows its caches (`Engine(preallocate=False)`) starts with this many rows of this many slots
INITIAL_ROWS, INITIAL_LENGTH = 4, 256
#: a grown cache row holds a multiple of this many slots
LENGTH_STEP = 64


@dataclass
class GenerateOutput:
    """One request's result. `logprobs[i]`, `top_logprobs[i]` (list of (logprob, token_id), descending) and
    `token_ids_logprobs[i]` (list of (logprob, token_id) in the order asked) belong to `token_ids[i]`;
    they are None when the request did not set return_logprob. `accept_lens` holds, per decode step,
    the tokens that step produced for this request (accepted drafts + the bonus), before any cut at a
    stop token or max_new_tokens. A matched stop token is kept as the last token. finish_reason "error"
    means the request was stopped, `error` says why: the target produced a NaN or an infinity in the
    logits a step read (that step's tokens are not emitted, the earlier ones are), or the logits of the next
    token had nothing left to decode after the logit bias, min_new_tokens and the grammar mask (the tokens
    before it are emitted)."""

    token_ids: list[int]
    finish_reason: str  # "stop" (a stop token was emitted), "length" (max_new_tokens reached) or "error"
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[float, int]]] | None = None
    token_ids_logprobs: list[list[tuple[float, int]]] | None = None
    accept_lens: list[int] = field(default_factory=list)
    error: str | None = None


@dataclass
class GenerateStats:
    """What the last `generate` call measured."""

    num_requests: int
    num_decode_steps: int
    num_tokens: int
    wall_s: float
    mean_accept_len: float  # tokens per request per decode step, bonus included (1.0 without a draft)
    #: each decode step's (num_steps, topk, num_draft_tokens) with a tuned or adaptive spec, else None
    step_shapes: list[tuple[int, int, int]] | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.wall_s if self.wall_s > 0 else float("nan")


@dataclass
class _Run:
    """One `generate` call's state between its stages: its requests' params and outputs, the request of each of the
    worker's rows (`active`), the requests that finished, the decode steps read so far, each decode step's shape
    (with a tuned policy), and how it decodes (`decode`, and whether the next step may be enqueued before the last
    one is read)."""

    params: list[SamplingParams]
    outs: list[GenerateOutput]
    stream: Callable[[int, list[int]], object] | None
    policy: object | None  # the tuned spec's shape policy (`TunedSpec.policy()`), or None
    decode: Callable[[], object]  # enqueues one decode step of the worker's rows -> its StepOutput
    may_decode_ahead: bool
    active: list[int]
    finished: set[int] = field(default_factory=set)
    steps: int = 0  # decode steps read
    shapes: list[tuple[int, int, int]] | None = None


class Engine:
    """Engine(target, draft=None, spec=None, impl="auto"|"reference"|"fast").

    spec: a SpecConfig (one shape), or a file `specdec tune` wrote (`specdec.tuning`): "tuned:PATH" runs each step
    at the best measured shape of the batch's size, "adaptive:PATH" chooses each step's shape among the tuned
    candidates by an EMA of each request's accepted length (a `TunedSpec`, e.g. `TunedSpec.load(PATH)`, does the
    same); "tuned:PAIR" / "adaptive:PAIR" load the file shipped for a zoo pair and this draft's kind
    (`specdec.tuning.shipped_files`). The file must have been tuned for this target and draft (ValueError naming the
    field otherwise).

    draft=None is plain target-only decoding; a draft runs on the worker its kind names (`specdec.draft_kinds`:
    an EAGLE or EAGLE-3 head on EagleWorkerV2, MTP layers on MultiLayerEagleWorkerV2). impl="auto" is fast on
    CUDA, reference elsewhere.
    max_batch and max_seq_len bound the requests of one call and each request's prompt + new tokens. The KV caches
    (the target's and the draft's) grow with what calls ask, doubling up to those bounds (`memory()` says what they
    hold); preallocate=True (the default with CUDA graphs, which keep the caches' addresses) allocates the bounds
    whole at construction.
    cuda_graphs (default: on with the fast path on CUDA) replays each decode step as a CUDA graph, one
    per batch-size bucket (1, 2, 4, ..., max_batch), sampling flags and worker step shape (NGRAM's verify
    width), the batch padded to its bucket.
    token_map (SGLang's `--speculative-token-map`): a path to a token map file in SGLang's format, or the ids
    themselves; an EAGLE or STANDALONE draft then proposes those target ids only, its LM head restricted to their
    rows (`specdec.token_map`). The output is unchanged; acceptance and the draft step's cost may change.
    overlap (default: with cuda_graphs) enqueues each decode step before the host reads the one before it, as
    SGLang's overlap scheduler, when nothing the next step needs comes from that read: no grammar, no tuned policy,
    and room in every request's cache row for one more step. A request the read step ends has run one step too
    many, whose results are dropped. The output is unchanged; the host's reading and emitting hides behind the
    device's next step.
    tokenizer (a `specdec.tokenizer` one: the zoo's `ByteTokenizer` or a tokenizer.json `HFTokenizer`) gives the
    vocabulary that requests with a json_schema, regex or ebnf are compiled against (xgrammar, the `grammar`
    extra); a batch with a grammar decodes eagerly, outside the CUDA graphs.
    """

    def __init__(self, target, draft=None, spec: SpecConfig | None = None, impl: str = "auto",
                 max_batch: int = 16, max_seq_len: int | None = None, return_original_logprob: bool = False,
                 cuda_graphs: bool | None = None, tokenizer=None, token_map=None, overlap: bool | None = None,
                 preallocate: bool | None = None):
        if impl not in ("auto", "reference", "fast"):
            raise ValueError(f"impl must be 'auto', 'reference' or 'fast', got {impl!r}")
        max_batch = check_int("max_batch", max_batch, 1)
        max_pos = target.config.max_position_embeddings
        if max_seq_len is None:
            max_seq_len = min(max_pos, 4096)
        max_seq_len = check_int("max_seq_len", max_seq_len, 2)
        if max_seq_len > max_pos:
            raise ValueError(f"max_seq_len={max_seq_len} exceeds the target's max_position_embeddings={max_pos}")
        self.target = target
        self.draft = draft
        spec = parse_spec(spec, draft)
        self.tuned = spec if isinstance(spec, TunedSpec) else None
        if self.tuned is not None:
            if draft is None:
                raise ValueError(f"tuned file {self.tuned.path}: a tuned spec needs the draft it was tuned with")
            self.tuned.check_pair(target, draft)
            spec = shape_spec(self.tuned.drafting_shape)
        self.spec = spec
        self.impl = self._resolve_impl(impl, target.device)
        ops = self._ops_module(self.impl)
        if self.impl == "fast" and not torch.cuda.is_available() and not ops.INTERPRETED:
            raise ValueError(f"impl='fast' on a CPU runs the Triton kernels through Triton's interpreter, but "
                             f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r} turns it off: unset it "
                             f"or use impl='reference'")
        self.token_map = None if token_map is None else self._check_token_map(token_map)
        on_cuda = torch.device(target.device).type == "cuda"
        if cuda_graphs is None:
            cuda_graphs = on_cuda and self.impl == "fast"
        if cuda_graphs and not (on_cuda and self.impl == "fast"):
            raise ValueError(f"cuda_graphs=True needs impl='fast' on a CUDA device, got impl={self.impl!r} on "
                             f"{target.device}")
        self.cuda_graphs = bool(cuda_graphs)
        if preallocate is not None and not isinstance(preallocate, bool):
            raise ValueError(f"preallocate must be True, False or None, got {preallocate!r}")
        # CUDA graphs read the caches at the addresses they were captured with: those are allocated once, whole
        self.preallocate = self.cuda_graphs if preallocate is None else preallocate
        if self.cuda_graphs and not self.preallocate:
            raise ValueError("cuda_graphs=True needs preallocate=True (the graphs keep the caches' addresses)")
        self._ops, self._return_original_logprob = ops, return_original_logprob
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self._build_worker(*((max_batch, max_seq_len) if self.preallocate else
                             (min(max_batch, INITIAL_ROWS), min(max_seq_len, INITIAL_LENGTH))))
        if overlap is not None and not isinstance(overlap, bool):
            raise ValueError(f"overlap must be True, False or None, got {overlap!r}")
        self.overlap = self.cuda_graphs if overlap is None else overlap
        self.tokenizer = tokenizer
        self._grammar_compiler = None
        self.last_stats: GenerateStats | None = None
        # The worker's caches and request state serve one call at a time: concurrent calls queue here.
        self._lock = threading.Lock()

    def _build_worker(self, rows: int, length: int) -> None:
        """A worker whose caches hold `rows` requests of `length` token slots (the draft's caches alike)."""
        self.worker = self._make_worker(self._ops, rows, length, self._return_original_logprob)
        if self.tuned is not None:
            self._allow_tuned_shapes()
        if self.cuda_graphs:
            self._decode = DecodeGraphs(self.worker, capture=True).decode_step
        else:
            self._decode = self.worker.decode_step

    def _fit_worker(self, rows: int, length: int) -> None:
        """Grows the caches (a new worker; nothing an engine keeps between calls lives in it) when a call needs more
        rows or slots than they hold, doubling what they hold up to max_batch and max_seq_len."""
        cache = self.worker.cache
        if self.preallocate or (rows <= cache.max_batch and length <= cache.max_seq_len):
            return
        rows = min(self.max_batch, max(rows, cache.max_batch if rows <= cache.max_batch else 2 * cache.max_batch))
        length = -(-length // LENGTH_STEP) * LENGTH_STEP
        length = min(self.max_seq_len,
                     max(length, cache.max_seq_len if length <= cache.max_seq_len else 2 * cache.max_seq_len))
        self._build_worker(rows, length)

    def memory(self) -> dict:
        """What the engine holds: its caches' shape and bytes (every KV cache of the worker: the target's and the
        draft's) and its models' weight bytes."""
        caches = self.worker.caches()
        weights = {id(p): p.numel() * p.element_size() for m in (self.target, self.draft)
                   if isinstance(m, torch.nn.Module) for p in m.parameters()}
        return {"rows": self.worker.cache.max_batch, "slots_per_row": self.worker.cache.max_seq_len,
                "max_batch": self.max_batch, "max_seq_len": self.max_seq_len, "preallocated": self.preallocate,
                "kv_cache_bytes": sum(c.kv.numel() * c.kv.element_size() for c in caches),
                "weight_bytes": sum(weights.values())}

    def __repr__(self) -> str:
        m = self.memory()
        kind = "target-only" if self.draft is None else kind_of(self.draft).name
        return (f"Engine({kind}, impl={self.impl!r}, caches {m['rows']} x {m['slots_per_row']} of at most "
                f"{m['max_batch']} x {m['max_seq_len']}: {m['kv_cache_bytes'] / 2 ** 20:.1f} MiB, weights "
                f"{m['weight_bytes'] / 2 ** 20:.1f} MiB)")

    def _allow_tuned_shapes(self) -> None:
        """The worker may switch among the tuned file's shapes; ValueError naming the field of one it cannot run."""
        tuned, worker = self.tuned, self.worker
        if not hasattr(worker, "use_shape"):
            raise ValueError(f"tuned file {tuned.path}: draft.kind {tuned.draft['kind']!r} runs on "
                             f"{type(worker).__name__}, which keeps one shape for a whole run; tune a draft of a kind "
                             f"that switches shapes (EAGLE, EAGLE-3, STANDALONE, NGRAM)")
        for size, bucket in tuned.buckets.items():
            fields = [("shape", bucket.shape)] + [(f"candidates[{i}].shape", c.shape)
                                                  for i, c in enumerate(bucket.candidates)]
            for name, shape in fields:
                if shape == NO_DRAFT or (not tuned.adaptive and name != "shape" and shape != tuned.drafting_shape):
                    continue
                try:
                    worker.check_shape(shape_spec(shape))
                except ValueError as e:
                    raise ValueError(f"tuned file {tuned.path}: buckets['{size}'].{name} {shape_name(shape)} cannot "
                                     f"run on this draft: {e}") from None
        shapes = tuned.shapes()
        worker.allow_shapes([shape_spec(s) for s in shapes if s != NO_DRAFT], no_draft=NO_DRAFT in shapes)

    @staticmethod
    def _resolve_impl(impl, device):
        if impl == "auto":
            return "fast" if torch.device(device).type == "cuda" else "reference"
        return impl

    @staticmethod
    def _ops_module(impl):
        if impl == "fast":
            # lazy: fast imports triton; reference imports specdec.ops, whose package imports this module
            import fast
            return fast
        import reference
        return reference

    def _make_worker(self, ops, max_batch, max_seq_len, return_original_logprob):
        if self.draft is None:
            if self.spec is not None:
                raise ValueError("a SpecConfig was given without a draft model")
            return TargetOnlyWorker(self.target, ops, max_batch, max_seq_len, return_original_logprob)
        if self.spec is None:
            raise ValueError("a draft model needs a SpecConfig(num_steps, topk, num_draft_tokens)")
        # the draft's kind names the worker that runs it; a draft of no kind is a ValueError naming the kinds
        extra = {} if self.token_map is None else {"token_map": self.token_map}
        return kind_of(self.draft).worker_class()(self.target, self.draft, self.spec, ops, max_batch, max_seq_len,
                                                  return_original_logprob, **extra)

    def _check_token_map(self, token_map):
        """The token map's ids, checked (`specdec.token_map.load_token_map`); ValueError for a draft that takes none."""
        if self.draft is None:
            raise ValueError("token_map restricts a draft's vocabulary: it needs a draft model")
        kind = kind_of(self.draft)
        if not kind.token_map:
            takers = ", ".join(k.label for k in DRAFT_KINDS.values() if k.token_map)
            raise ValueError(f"token_map applies to drafts whose LM head covers the target's vocabulary ({takers}), "
                             f"not to {kind.label} drafts")
        return load_token_map(token_map, self.target.config.vocab_size)

    # ---- validation --------------------------------------------------------------------------
    def _validate(self, prompts, params) -> tuple[list[list[int]], list[SamplingParams], list | None]:
        """-> the prompts as int lists, a checked copy of each request's params and their compiled grammars
        (None when no request has one); ValueError otherwise (ImportError for a grammar without xgrammar)."""
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError("prompts must be a non-empty list of token-id lists")
        B = len(prompts)
        if isinstance(params, SamplingParams) or params is None:
            params = [params or SamplingParams()] * B
        params = list(params)
        if len(params) != B:
            raise ValueError(f"got {len(params)} SamplingParams for {B} prompts")
        V = self.target.config.vocab_size
        margin = self.worker.kv_margin
        checked, clean_prompts = [], []
        for i, (p, sp) in enumerate(zip(prompts, params)):
            if not isinstance(sp, SamplingParams):
                raise ValueError(f"request {i}: params must be a SamplingParams, got {type(sp).__name__}")
            if not isinstance(p, (list, tuple)) or len(p) == 0:
                raise ValueError(f"request {i}: the prompt must be a non-empty list of token ids, got {p!r}")
            clean_prompts.append([check_int(f"request {i}: prompt[{j}]", t, 0, V - 1) for j, t in enumerate(p)])
            sp = sp.validated(i, V)
            checked.append(sp)
            need = len(p) + sp.max_new_tokens + margin
            if need > self.max_seq_len:
                raise ValueError(
                    f"request {i}: prompt length {len(p)} + max_new_tokens {sp.max_new_tokens}"
                    + (f" + {margin} in-flight draft slots" if margin else "")
                    + f" = {need} exceeds max_seq_len={self.max_seq_len}")
        if B > self.max_batch:
            raise ValueError(f"a batch of {B} requests exceeds the cache: {self.max_batch} of {self.max_batch} slots "
                             f"free")
        grammars = self._compile_grammars(checked)
        self._fit_worker(B, max(len(p) + sp.max_new_tokens + margin for p, sp in zip(clean_prompts, checked)))
        free = self.worker.cache.num_free
        if B > free:
            raise ValueError(f"a batch of {B} requests exceeds the cache: {free} of {self.max_batch} slots free")
        return clean_prompts, checked, grammars

    def _compile_grammars(self, params: list[SamplingParams]) -> list | None:
        """Compile each request's grammar (xgrammar; a request without one gets None) before any compute. A grammar
        ends the request when it accepts one of its terminators (the tokenizer's EOS ids): the request's copy of the
        params gets those among its stop ids, so that they end it ("stop") and min_new_tokens holds them back."""
        if not any(sp.has_grammar for sp in params):
            return None
        first = next(i for i, sp in enumerate(params) if sp.has_grammar)
        if self.tokenizer is None:
            raise ValueError(f"request {first}: a json_schema, regex or ebnf needs the engine's vocabulary: pass "
                             f"Engine(..., tokenizer=...)")
        require_xgrammar()
        if self._grammar_compiler is None:
            self._grammar_compiler = GrammarCompiler(self.tokenizer, self.target.config.vocab_size)
        compiled = []
        for i, sp in enumerate(params):
            compiled.append(self._grammar_compiler.compile(sp, i))
            if compiled[-1] is None:
                continue
            ends = grammar_stop_ids(compiled[-1])
            if not ends:
                raise ValueError(f"request {i}: a grammar needs the tokenizer's end-of-sequence id to end on, and "
                                 f"the tokenizer names none")
            params[i] = dataclasses.replace(
                sp, stop_token_ids=list(sp.stop_token_ids) + [t for t in ends if t not in sp.stop_token_ids])
        return compiled

    # ---- generation --------------------------------------------------------------------------
    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 seed: int = 0, stream=None) -> list[GenerateOutput]:
        """prompts: list of B token-id lists (ragged); params: one SamplingParams or B of them.
        Returns B GenerateOutput, in order. Invalid input raises ValueError before any state changes.
        stream(request_index, new_token_ids), when given, is called after every step that emitted tokens.
        Calls from several threads run one after another; whatever a call raises (KeyboardInterrupt
        included), every cache slot it took is free again when it returns."""
        if stream is not None and not callable(stream):
            raise ValueError(f"stream must be callable, got {type(stream).__name__}")
        with self._lock, torch.inference_mode():
            return self._generate(prompts, params, seed, stream)

    def prepare(self, prompts, params: SamplingParams | list[SamplingParams] | None = None) -> None:
        """Let the draft do ahead of time the work it does once per request (a `ScriptedDraft` computes the target's
        continuation of each prompt, `specdec.lab.scripted`); nothing for the other drafts. The benchmarks call it
        before their timed passes, so that work is not timed; `generate` would otherwise do it when it meets the
        request. Arguments as `generate`'s."""
        prepare = getattr(self.draft, "prepare", None)
        if prepare is None:
            return
        with self._lock, torch.inference_mode():
            prompts, params, _ = self._validate(prompts, params)
            prepare(prompts, params)

    def flush_cache(self) -> None:
        """Forget what the draft has learned across requests (SGLang's `flush_cache`, which clears the NGRAM worker's
        cache pool): an `NgramDraft(shared=True)`'s index over every sequence decoded so far. The next request then
        drafts as on a fresh engine. Nothing else an engine keeps between calls depends on earlier requests."""
        with self._lock:
            self.worker.clear_cache_pool()

    def _generate(self, prompts, params, seed, stream=None) -> list[GenerateOutput]:
        prompts, params, grammars = self._validate(prompts, params)
        seed = check_int("seed", seed)
        run = self._start_run(params, grammars, stream)
        t0 = time.perf_counter()
        try:
            pending = self._prefill(run, prompts, seed, grammars)  # the oldest step not yet read
            while True:
                ahead = self._decode_ahead(run)
                host, rows = pending.wait(), pending.requests
                self._emit_and_stream(run, host, rows)
                self._sync_accepted(run, host, rows)
                if not self._drop_finished(run):
                    break
                pending = ahead if ahead is not None else self._decode_next(run)
                run.steps += 1
        finally:
            self.worker.finish()
        return self._finish_run(run, t0)

    def _start_run(self, params, grammars, stream) -> _Run:
        """A call's state before its prefill: empty outputs, every request active, and how it decodes."""
        outs = [GenerateOutput([], "length") for _ in params]
        for o, sp in zip(outs, params):
            if sp.return_logprob:
                o.logprobs, o.top_logprobs, o.token_ids_logprobs = [], [], []
        policy = None if self.tuned is None else self.tuned.policy()
        # a grammar batch fills masks on the host between drafting and verify: eager, outside the graphs
        decode = self._decode if grammars is None else self.worker.decode_step
        # a grammar's masks and a tuned policy's next shape need the step read first
        may_decode_ahead = self.overlap and grammars is None and policy is None and self.worker.decodes_ahead
        return _Run(params, outs, stream, policy, decode, may_decode_ahead, active=list(range(len(params))),
                    shapes=None if policy is None else [])

    def _prefill(self, run: _Run, prompts, seed: int, grammars) -> StepTransfer:
        """Start the policy and prefill the batch: -> the prefill's step on its way to the host."""
        if run.policy is not None:
            run.policy.start(len(prompts))
        return StepTransfer(self.worker.prefill(prompts, run.params, seed, grammars), run.active)

    def _decode_ahead(self, run: _Run) -> StepTransfer | None:
        """The next step, enqueued before the last one is read where it may be (`overlap`), else None. Every row runs
        it, also one whose request the last step ends (its results are dropped); the bound keeps its writes in its
        cache row."""
        worker = self.worker
        # every step writes at least its root's slot, which target-only's margin of 0 does not count
        if run.may_decode_ahead and worker.len_bound + max(worker.kv_margin, 1) <= worker.cache.max_seq_len:
            return StepTransfer(run.decode(), run.active)
        return None

    def _emit_and_stream(self, run: _Run, host: HostStep, rows: list[int]) -> None:
        """Append a read step's tokens to its requests' outputs (`_emit`), and stream each request's new ones."""
        outs, stream = run.outs, run.stream
        before = [len(outs[r].token_ids) for r in rows] if stream is not None else None
        run.finished |= self._emit(host, rows, run.params, outs, step_index=run.steps, finished=run.finished)
        if stream is not None:
            for r, n in zip(rows, before):
                if len(outs[r].token_ids) > n:
                    stream(r, outs[r].token_ids[n:])

    def _sync_accepted(self, run: _Run, host: HostStep, rows: list[int]) -> None:
        """After a decode step, tell the worker (and the policy) the accepted lengths of the rows it still runs."""
        if run.steps == 0:
            return
        running = set(run.active)  # the worker's rows now: a step read after a filter ran before it
        accept_lens = [n for r, n in zip(rows, host.accept_lens) if r in running]
        self.worker.sync_lengths(accept_lens)
        if run.policy is not None:
            run.policy.observe(accept_lens)

    def _drop_finished(self, run: _Run) -> bool:
        """Drop the finished requests' rows from the worker and the policy; False when no request is left."""
        keep = [i for i, r in enumerate(run.active) if r not in run.finished]
        if not keep:
            return False
        if len(keep) < len(run.active):
            self.worker.filter(keep)
            if run.policy is not None:
                run.policy.filter(keep)
            run.active = [run.active[i] for i in keep]
        return True

    def _decode_next(self, run: _Run) -> StepTransfer:
        """The next step, enqueued after the last one was read: at the policy's shape for the batch when tuned."""
        if run.policy is not None:
            run.shapes.append(run.policy.choose(len(run.active)))
            self.worker.use_shape(run.shapes[-1])
        return StepTransfer(run.decode(), run.active)

    def _finish_run(self, run: _Run, t0: float) -> list[GenerateOutput]:
        """Record the call's `last_stats` (wall time from `t0`, after the device is done); -> its outputs."""
        if torch.device(self.target.device).type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        outs = run.outs
        n_acc = [a for o in outs for a in o.accept_lens]
        self.last_stats = GenerateStats(len(outs), run.steps, sum(len(o.token_ids) for o in outs), wall,
                                        sum(n_acc) / len(n_acc) if n_acc else float("nan"), run.shapes)
        return outs

    @staticmethod
    def _emit(host: HostStep, rows, params, outs, step_index: int, finished=frozenset()) -> set[int]:
        """Append the accepted tokens (cut at a stop token / max_new_tokens) and logprobs of each row's request
        (`rows`: the request of each row of the step), skipping those already `finished`; return the requests
        that finished. step_index 0 is the prefill."""
        done = set()
        is_decode = step_index > 0
        for b, r in enumerate(rows):
            if r in finished:
                continue
            o, sp = outs[r], params[r]
            if not host.finite[b]:
                where = f"decode step {step_index}" if is_decode else "prefill"
                o.finish_reason = "error"
                o.error = (f"request {r}: the target's logits at {where} hold a NaN or an infinity; the request "
                           f"was stopped there (the {len(o.token_ids)} tokens before it are kept)")
                done.add(r)
                continue
            n = host.accept_lens[b]
            if is_decode:
                o.accept_lens.append(n)
            for j in range(n):
                if host.empty is not None and host.empty[b][j]:
                    o.finish_reason = "error"
                    o.error = _empty_row_error(r, sp, host.empty[b][j], len(o.token_ids))
                    done.add(r)
                    break
                tok = host.tokens[b][j]
                o.token_ids.append(tok)
                if sp.return_logprob:
                    o.logprobs.append(host.logprobs[b][j])
                    o.top_logprobs.append(host.top_logprobs(b, j, sp.top_logprobs_num))
                    o.token_ids_logprobs.append(host.token_ids_logprobs(b, j))
                if tok in sp.stop_token_ids:
                    o.finish_reason = "stop"
                    done.add(r)
                    break
                if len(o.token_ids) >= sp.max_new_tokens:
                    o.finish_reason = "length"
                    done.add(r)
                    break
        return done


def _empty_row_error(request: int, params: SamplingParams, cause: int, num_out: int) -> str:
    """The `error` of a request whose next token's logits had nothing left to decode (`StepOutput.empty`)."""
    banned = "a logit_bias of -inf" if params.logit_bias and -float("inf") in params.logit_bias.values() else ""
    held = f"min_new_tokens={params.min_new_tokens} (holding the stop ids back)" if params.min_new_tokens else ""
    penalties = " and ".join(x for x in (banned, held) if x) or "the penalties"
    if cause == EMPTY_BY_PENALTIES:
        what = f"{penalties} left no token with a finite logit"
    elif params.has_penalties:
        what = f"the grammar allows no token that {penalties} left"
    else:
        what = "the grammar allows no token"
    return f"request {request}: after {num_out} output tokens, {what}; the request was stopped there (they are kept)"
