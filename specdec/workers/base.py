"""What every worker shares: request state, target forward, sampling and logprobs (`WorkerBase`), and the
target-only worker.

`WorkerBase` has two subclasses: `TargetOnlyWorker` (here) and `SpeculativeWorkerBase` (`speculative.py`: draft,
verify, commit), whose four subclasses draft: `EagleWorkerV2` (`eagle.py`; `StandaloneWorker`, `standalone.py`,
derives from it), `MultiLayerEagleWorkerV2` (`multi_layer_eagle.py`), `HostProposalWorker` (`host_proposal.py`: NGRAM
and suffix decoding) and `DFlashWorker` (`dflash.py`). A worker binds an ops module (`reference` or `fast`); the
algorithms are written once here and in `SpeculativeWorkerBase`. One decode step has fixed shapes and makes no
host sync. Correctness never depends on the host's copy of the lengths: the device holds the exact lengths, the
worker keeps a host upper bound that grows by the most a step can add, and a caller that has read a step's
`accept_lens` may tighten it (`sync_lengths`); a stale bound costs attention compute only.
"""
from __future__ import annotations

import contextlib

import torch

from ..config import SamplingParams
from ..checks import trusted_calls
from ..kv_cache import KVCache
from ..ops.logprob_types import LogitsOutput, SamplingInfo, SpecBatch
from ..models.layers import AttentionMetadata
from ..sampling import RequestRNG, SamplingTensors, sample_from_probs
from .shaping import LogitShaping
from .step import StepOutput, finite_rows
from .timing import PhaseTimer  # noqa: F401 (the benches import it from here)
from ..grammar import GrammarBatch


_NO_PHASE = contextlib.nullcontext()


class RequestState:
    """The per-request tensors of a worker (leading dim B), in one object: `filter` indexes them all.

    Every field is declared (a worker's own in a subclass, its `state_type`) and None until set; setting an
    undeclared one is an AttributeError, so a field cannot appear by accident and readers test `is None`.
    Created at `start` and filled at prefill; anything a worker keeps per request lives here, so dropping
    finished requests cannot miss one, and a CUDA graph's static copy carries exactly the set fields."""

    slots: torch.Tensor | None  # (B,) int64: each request's row in every cache
    seq_lens: torch.Tensor | None  # (B,) int64: committed target length
    last_tokens: torch.Tensor | None  # (B,) int64: the last emitted token (the next step's root)
    uniforms: torch.Tensor | None  # (B, uniforms_per_step) fp32: the step's randomness; None for an all-greedy batch
    prompt_mask: torch.Tensor | None  # (B, V) bool: the prompt's tokens (repetition_penalty); penalized batches
    output_counts: torch.Tensor | None  # (B, V) int32: committed output token counts; penalized batches
    output_lens: torch.Tensor | None  # (B,) int64: committed output length; penalized batches
    grammar_tokens: torch.Tensor | None  # (B, T) int64: the last step's emitted tokens, not yet on the host
    grammar_lens: torch.Tensor | None  # (B,) how many of them were emitted; grammar batches, until the transfer

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        names = []
        for klass in reversed(cls.__mro__):
            names += [n for n in getattr(klass, "__annotations__", {}) if n not in names]
        return tuple(names)

    def __init__(self):
        for name in self.fields():
            object.__setattr__(self, name, None)

    def __setattr__(self, name, value) -> None:
        if name not in self.fields():
            raise AttributeError(f"{type(self).__name__} declares no field {name!r}")
        object.__setattr__(self, name, value)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The fields set now."""
        return {k: v for k, v in vars(self).items() if isinstance(v, torch.Tensor)}

    def filter(self, keep: torch.Tensor) -> None:
        """Keep the requests at batch positions `keep` ((B',) int64, on the state's device)."""
        for name, value in self.tensors().items():
            setattr(self, name, value[keep])


class WorkerBase(LogitShaping):
    """Target-side machinery; subclasses add drafting. `ops` is the `reference` or `fast` module; the logits'
    shaping (penalties, bias, min_new_tokens, grammar masks) is `LogitShaping`'s."""

    #: the per-request state's type: `RequestState`, or a subclass declaring the worker's own fields
    state_type = RequestState
    #: whether the engine may enqueue a decode step before it reads the one before (`Engine(overlap=)`): the step's
    #: prologue reads nothing of the last step on the host, and a step run for a request the last one ended changes
    #: nothing another request reads
    decodes_ahead = True
    #: whether every decode step must keep the shapes of its step shape whatever the step's data: set by
    #: `DecodeGraphs`, whose static buffers (and CUDA graphs) hold one shape per key. A worker that may narrow a step
    #: to its data otherwise (DSpark's verify, to the longest confident block on a CPU) keeps the full width then
    fixed_step_shapes = False

    def __init__(self, target, ops, max_batch: int, max_seq_len: int, return_original_logprob: bool = False):
        self.target = target
        self.ops = ops
        self.vocab_size = target.config.vocab_size
        self.device = target.device
        self.return_original_logprob = return_original_logprob
        self.cache = KVCache.for_model(target.config, target.config.num_hidden_layers, max_batch, max_seq_len,
                                       target.dtype, self.device)
        self.slot_list: list[int] = []
        self.state = self.state_type()
        self.timer: PhaseTimer | None = None
        self.seq_lens_host: list[int] = []  # per request, an upper bound on the committed target length
        self._unsynced_steps = 0
        #: layers whose input residual streams the draft reads (EAGLE-3) instead of the final hidden state
        self.target_features: tuple[int, ...] | None = None
        #: the requests' grammar matchers (`specdec.grammar.GrammarBatch`), None when no request has a grammar
        self.grammar = None
        self._one_token_paths: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        #: the `step_kind`s whose decode body has run with the ops' argument checks on
        self._checked_step_kinds: set[tuple] = set()

    # ---- request lifecycle -------------------------------------------------------------------
    @property
    def kv_margin(self) -> int:
        """Cache slots past the committed length that one decode step may write."""
        return 0

    def caches(self) -> list[KVCache]:
        return [self.cache]

    def start(self, prompts: list[list[int]], params: list[SamplingParams], seed: int, grammars=None) -> None:
        """grammars: B xgrammar CompiledGrammars or None (the engine compiles them), or None for none at all."""
        B = len(prompts)
        self.grammar = None
        if grammars is not None and any(g is not None for g in grammars):
            self.grammar = GrammarBatch(list(grammars), self.vocab_size)
        self.params = list(params)
        self.slot_list = self.cache.alloc(B)
        for c in self.caches()[1:]:
            c.alloc(B)  # every cache hands out the same rows: one slot id per request
        self.state = self.state_type()
        self.state.slots = torch.tensor(self.slot_list, dtype=torch.int64, device=self.device)
        self.sampling = SamplingTensors(self.params, self.vocab_size, self.device)
        self.rng = RequestRNG(seed, B)
        self.seq_lens_host = [len(p) for p in prompts]
        self._unsynced_steps = 0
        self.state.seq_lens = torch.tensor(self.seq_lens_host, dtype=torch.int64, device=self.device)
        if self.sampling.penalized:
            # the committed output's token counts and length, and the prompt's tokens (repetition_penalty)
            prompt_mask = torch.zeros(B, self.vocab_size, dtype=torch.bool)
            for b, p in enumerate(prompts):
                prompt_mask[b, p] = True
            self.state.prompt_mask = prompt_mask.to(self.device)
            self.state.output_counts = torch.zeros(B, self.vocab_size, dtype=torch.int32, device=self.device)
            self.state.output_lens = torch.zeros(B, dtype=torch.int64, device=self.device)

    def finish(self) -> None:
        for c in self.caches():
            c.free(self.slot_list)
        self.slot_list = []

    def clear_cache_pool(self) -> None:
        """Drop what drafting keeps across requests (`Engine.flush_cache`); a draft that keeps nothing has nothing
        to drop."""

    def filter(self, keep: list[int]) -> None:
        """Keep only the requests at batch positions `keep` (drop finished ones; free their slots)."""
        kept = set(keep)
        gone = [s for i, s in enumerate(self.slot_list) if i not in kept]
        for c in self.caches():
            c.free(gone)
        self.slot_list = [self.slot_list[i] for i in keep]
        self.params = [self.params[i] for i in keep]
        self.seq_lens_host = [self.seq_lens_host[i] for i in keep]
        idx = torch.tensor(keep, dtype=torch.int64, device=self.device)
        self.sampling.filter(idx, self.params)
        self.rng.filter(keep)
        if self.grammar is not None:
            self.grammar.filter(keep)
        self.state.filter(idx)

    def phase(self, name: str):
        """Times the block as phase `name` when a benchmark set `timer`; otherwise does nothing."""
        return _NO_PHASE if self.timer is None else self.timer(name)

    # ---- one decode step: host prologue, device body (capturable), host epilogue --------------
    def decode_step(self) -> StepOutput:
        """One decode step for every request in the batch. Its body runs the ops' argument checks the first time
        its kind of step (`step_kind`) runs, and runs inside `trusted_calls` afterwards (`specdec.checks`)."""
        self.prepare_decode()
        kind = self.step_kind
        with trusted_calls(kind in self._checked_step_kinds):
            step = self.decode_body()
        self._checked_step_kinds.add(kind)
        return self.finish_decode(step)

    @property
    def step_kind(self) -> tuple:
        """What fixes the shapes of every op call in a decode body: the batch size, the sampling flags, the step
        shape and whether a grammar masks the step (a CUDA graph is captured per value of the first three)."""
        return (self.state.seq_lens.shape[0], *self.sampling.flags, *self.step_shape, self.grammar is not None)

    @property
    def uniforms_per_step(self) -> int:
        """Uniform samples a decode step consumes per request (a target-only step: one, drawn only when some
        request samples)."""
        return 0 if self.sampling.all_greedy else 1

    @property
    def logprob_steps(self) -> int:
        """``speculative_num_steps`` of this worker's logprob call (0: one token per step)."""
        return 0

    @property
    def step_shape(self) -> tuple:
        """What, beside the batch bucket and the sampling flags, fixes the shapes of this step's body (a CUDA
        graph is captured per value): nothing for a worker whose step always has the same shapes."""
        return ()

    def prepare_decode(self) -> None:
        """Host side, before the body: the step's randomness, drawn from the per-request generators, goes
        into ``state.uniforms`` (B, uniforms_per_step); the body reads nothing else from the host."""
        n = self.uniforms_per_step
        if n:
            self.state.uniforms = self.rng.uniforms(n, self.device)
        else:
            self.state.uniforms = None  # an all-greedy batch reads none: keep the state's shape honest

    def decode_body(self) -> StepOutput:
        """The device part of a step: reads only `state`, the sampling tensors, the caches and the
        worker's constants; fixed shapes for a batch size; no host sync. Logprobs are not filled here."""
        raise NotImplementedError

    def finish_decode(self, step: StepOutput) -> StepOutput:
        """Host side, after the body: logprobs through the shared helper, and the length bound grows."""
        with self.phase("logprobs"):
            step.logits_output = self.compute_logprobs(step.logits_output, step.predict, step.accept_index,
                                                       self.logprob_steps)
        self._grow_length_bound()
        return step

    # ---- the host's bound on the lengths -----------------------------------------------------
    @property
    def max_step_tokens(self) -> int:
        """The most tokens one decode step can commit for a request."""
        return 1

    @property
    def len_bound(self) -> int:
        """Host upper bound on every request's committed target length (exact after a sync)."""
        return max(self.seq_lens_host, default=0)

    def attn_len(self, extra: int) -> int:
        """The host bound on a forward's key span: committed length + `extra` in-flight slots, capped
        at the cache's capacity (no request can exceed it)."""
        return min(self.len_bound + extra, self.cache.max_seq_len)

    def _grow_length_bound(self) -> None:
        """After a decode step: every request may have committed up to `max_step_tokens` more."""
        self.seq_lens_host = [n + self.max_step_tokens for n in self.seq_lens_host]
        self._unsynced_steps += 1

    def sync_lengths(self, accept_lens: list[int]) -> None:
        """Tighten the host bound with a step's `accept_lens`, read by the caller, oldest unsynced step
        first. Optional: a worker driven without it is just as correct, only its attention spans grow."""
        if self._unsynced_steps == 0:
            raise ValueError("sync_lengths: every decode step's lengths were already synced")
        if len(accept_lens) != len(self.seq_lens_host):
            raise ValueError(f"sync_lengths: got {len(accept_lens)} lengths for {len(self.seq_lens_host)} requests")
        self.seq_lens_host = [n - self.max_step_tokens + a for n, a in zip(self.seq_lens_host, accept_lens)]
        self._unsynced_steps -= 1

    # ---- shared stages -----------------------------------------------------------------------
    def prefill_target(self, prompts: list[list[int]]):
        """Target forward over the ragged prompts (right-padded) -> logits at each prompt's last token
        (B, V) (the only ones read), hidden (B, T, H), and the (B, T) token/position tensors used."""
        T = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), T, dtype=torch.int64)
        for b, p in enumerate(prompts):
            ids[b, :len(p)] = torch.tensor(p)
        ids = ids.to(self.device)
        positions = torch.arange(T, device=self.device).expand(len(prompts), T)
        meta = AttentionMetadata(self.state.slots, torch.zeros_like(self.state.seq_lens), attn_len=T, ops=self.ops)
        out = self.target(ids, positions, self.cache, meta, return_logits=False, features=self.target_features)
        hidden = out.hidden
        last = self.state.seq_lens - 1
        logits_last = self.target.compute_logits(hidden[torch.arange(len(prompts), device=self.device), last])
        return logits_last, hidden if self.target_features is None else out.features, ids, positions

    def count_emitted(self, tokens, num_emitted) -> None:
        """tokens: (B, T) int64, the first num_emitted[b] (B,) of row b emitted this step: into the counts (and,
        for a grammar batch, kept on the device until the next step's transfer advances the matchers)."""
        st = self.state
        if self.grammar is not None:
            st.grammar_tokens, st.grammar_lens = tokens, num_emitted
        if not self.sampling.penalized:
            return
        valid = torch.arange(tokens.shape[1], device=self.device)[None, :] < num_emitted[:, None]
        st.output_counts = st.output_counts.scatter_add(1, tokens.long(), valid.to(torch.int32))
        st.output_lens = st.output_lens + num_emitted

    def greedy_and_finite(self, logits, raw_logits, num_requests: int):
        """logits: (N, V) the rows decoding reads (shaped: penalties, grammar masks), raw_logits: (N, V) the
        target's, N = num_requests * nodes per request -> (argmax of logits (N,) int64, finite (num_requests,) bool:
        every raw value of the request's rows is finite). Nothing shaped the rows (logits is raw_logits): one
        `argmax_finite` read of them, in their stored dtype."""
        if logits is raw_logits:
            greedy, finite = self.ops.argmax_finite(raw_logits)
            return greedy, finite if finite.shape[0] == num_requests else finite.view(num_requests, -1).all(1)
        return logits.argmax(-1), finite_rows(raw_logits.view(num_requests, -1))

    def sample_tokens(self, logits, uniforms, greedy):
        """logits: (B, V); uniforms: (B,), or None for an all-greedy batch; greedy: (B,) int64, the argmax of
        logits -> (B,) int64 (greedy for greedy requests)."""
        if self.sampling.all_greedy:
            return greedy
        sampled = sample_from_probs(self.sampling.probs(logits, self.ops), uniforms)
        return torch.where(self.sampling.is_greedy, greedy, sampled)

    def compute_logprobs(self, logits_output, predict, accept_index, num_steps):
        """Fill logits_output's logprob fields through the shared helper when any request asked."""
        if not any(p.return_logprob for p in self.params):
            return logits_output
        batch = SpecBatch(
            seq_lens=self.state.seq_lens,
            sampling_info=SamplingInfo(self.sampling.temperatures[:, None], self.sampling.all_greedy),
            top_logprobs_nums=[p.top_logprobs_num if p.return_logprob else 0 for p in self.params],
            token_ids_logprobs=[p.token_ids_logprob if p.return_logprob else None for p in self.params],
        )
        return self.ops.compute_spec_v2_logprobs(batch, logits_output, predict, accept_index, num_steps,
                                                 return_original_logprob=self.return_original_logprob)

    def one_token_output(self, logits, tokens, finite, empty) -> StepOutput:
        """A one-node step (prefill, or target-only decode): logits (B, V) as sampled from (shaped),
        tokens (B,), finite (B,) bool (`greedy_and_finite`'s, of the target's raw logits), empty as
        `shape_target_logits` gave it. Its logprob fields are empty: `prefill` fills them at once, `finish_decode`
        after a decode body."""
        accept_index, accept_lens = self._one_token_path(tokens.shape[0])
        return StepOutput(tokens, accept_index, accept_lens, LogitsOutput(next_token_logits=logits), finite, empty,
                          emitted=tokens[:, None])

    def _one_token_path(self, B: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A one-node step's accept index ((B, 1) int32, row b) and accepted lengths ((B,) int32 ones): constants of
        the batch size, made once (two launches fewer per step), read and never written. A size's pair is made
        eagerly, before a CUDA graph of that size is captured: by the prefill, or by the graph runner's warm-up."""
        pair = self._one_token_paths.get(B)
        if pair is None:
            pair = self._one_token_paths[B] = (torch.arange(B, dtype=torch.int32, device=self.device)[:, None],
                                               torch.ones(B, dtype=torch.int32, device=self.device))
        return pair

    def prefill(self, prompts, params, seed, grammars=None) -> StepOutput:
        """Target forward over the prompts, the first token sampled, then the draft's prefill extend.
        Returns the one-token step of the first token, its logprobs filled. grammars: as `start`."""
        self.start(prompts, params, seed, grammars)
        logits_last, hidden, ids, positions = self.prefill_target(prompts)
        raw_logits = logits_last
        logits_last, empty = self.shape_target_logits(raw_logits, ids[:, :1], None, self.grammar_bitmask_roots())
        greedy, finite = self.greedy_and_finite(logits_last, raw_logits, len(prompts))
        tokens = self.sample_tokens(logits_last, self.rng.uniforms(1, self.device)[:, 0], greedy)
        self.state.last_tokens = tokens
        self.count_emitted(tokens[:, None], torch.ones_like(tokens))
        self.draft_extend_for_prefill(ids, hidden, positions, tokens)
        step = self.one_token_output(logits_last, tokens, finite, empty)
        step.logits_output = self.compute_logprobs(step.logits_output, tokens, step.accept_index, 0)
        return step

    def draft_extend_for_prefill(self, ids, hidden, positions, tokens) -> None:
        """The draft's forward over the prompt (nothing without a draft). ids, positions: (B, T) int64 of the
        right-padded prompts; hidden: (B, T, H), the target's hidden states (or features); tokens: (B,) the
        sampled first tokens."""


class TargetOnlyWorker(WorkerBase):
    """Plain autoregressive decoding with the target: the baseline every result is compared with."""

    def decode_body(self) -> StepOutput:
        st = self.state
        meta = AttentionMetadata(st.slots, st.seq_lens, attn_len=self.attn_len(1), ops=self.ops)
        with self.phase("verify_forward"):
            logits = self.target(st.last_tokens[:, None], st.seq_lens[:, None], self.cache, meta).logits
        raw_logits = logits[:, 0]
        with self.phase("verify"):
            with self.phase("grammar"):
                bitmask = self.grammar_bitmask_roots()
            logits, empty = self.shape_target_logits(raw_logits, st.last_tokens[:, None], None, bitmask)
            greedy, finite = self.greedy_and_finite(logits, raw_logits, raw_logits.shape[0])
            tokens = self.sample_tokens(logits, None if st.uniforms is None else st.uniforms[:, 0], greedy)
        st.seq_lens = st.seq_lens + 1
        st.last_tokens = tokens
        step = self.one_token_output(logits, tokens, finite, empty)
        self.count_emitted(step.emitted, step.accept_lens)
        return step
