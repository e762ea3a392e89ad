"""A worker's decode step replayed as a CUDA graph, one graph per batch-size bucket, set of sampling flags
(`SamplingTensors.flags`) and worker step shape (`step_shape`: NGRAM's verify width).

The body of a step (`decode_body`) reads only the worker's per-request state, its sampling tensors,
the caches and constants, has the same shapes at every step for a batch size and makes no host sync,
so it can be captured once and replayed. The batch is padded to the next bucket (1, 2, 4, ..., up to
`max_batch`): padded rows repeat request 0 on the caches' scratch row, and their results are dropped.

The per-request state lives in the graph's static inputs between steps. The captured body ends by copying
each new state tensor into its input, so a replay leaves the next step's state there, and the worker's live
state is then the views `inputs[name][:B]`; the live sampling tensors become such views too at the step's
load (the body never writes them). The load before a replay copies only what is not already that view:
state the host set since (the step's uniforms, a new prefill, a filter's kept rows), or the state of another
bucket's (or flags', or shape's) buffers. In a bucket larger than B it also sets the padded rows of the state
to request 0's again, on the scratch slot, at every step: a padded row left to evolve could outgrow the cache.
So a steady step of one batch copies its uniforms only (and those padded rows). Logprobs and the host's length
bound stay outside the graph (`finish_decode`).

A returned step's tensors are views of the graph's static outputs, the first B requests' rows (predict and
empty (B*W,), accept_index (B, S+1), accept_lens and finite (B,), `logits_output.next_token_logits` (B*W, V),
request b's node i at row b*W + i, as `worker.decode_step` returns them), valid until the next `decode_step`,
whose replay overwrites them: pack or read a step before asking for the next (`Engine` packs each into its
`StepTransfer` as it returns, so it may enqueue the next step before it reads the last). The logprob helper
reads them as they are: it takes the accept index into B*W rows, so no row of the logits is copied out of the
graph; its own outputs are new tensors.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from ..ops.logprob_types import LogitsOutput
from .step import StepOutput


@functools.cache
def capture_stream(device: torch.device) -> "torch.cuda.Stream":
    """The one side stream every capture on `device` warms up and records on. cuBLAS keeps a workspace per
    (handle, stream), so a new stream per capture (or warming up on one stream and capturing on another)
    would leave a workspace behind for each."""
    return torch.cuda.Stream(device=device)


def batch_buckets(max_batch: int) -> list[int]:
    """The padded batch sizes: powers of two below `max_batch`, and `max_batch` itself."""
    buckets, b = [], 1
    while b < max_batch:
        buckets.append(b)
        b *= 2
    return buckets + [max_batch]


def _is_view_of(t: torch.Tensor, buffer: torch.Tensor) -> bool:
    """Whether t is exactly `buffer` (the same memory, shape and strides): copying one into the other is a no-op."""
    return t.data_ptr() == buffer.data_ptr() and t.shape == buffer.shape and t.stride() == buffer.stride()


def _shares_memory(t: torch.Tensor, buffers: list[torch.Tensor]) -> bool:
    return any(t.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() for b in buffers)


@dataclass
class _Entry:
    """One bucket's static buffers: `inputs` (bucket, ...) the body reads, the state part of which it leaves the
    next step's state in; `state_names` the state fields set after the body; `step` its StepOutput."""

    bucket: int
    inputs: dict[str, torch.Tensor]
    sampling: object
    state_names: tuple[str, ...] = field(default_factory=tuple)
    step: StepOutput | None = None
    graph: object = None


class DecodeGraphs:
    """Runs `worker.decode_step` through padded static buffers, as one CUDA graph per (bucket, sampling
    flags, step shape) when `capture` is True, or eagerly through the same buffers when False (which tests
    the padding and the state plumbing on any device)."""

    def __init__(self, worker, capture: bool = True):
        if capture and torch.device(worker.device).type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the worker runs on {worker.device}")
        self.worker = worker
        worker.fixed_step_shapes = True  # one shape per key: the static buffers hold it
        self.capture = capture
        self.buckets = batch_buckets(worker.cache.max_batch)
        self.entries: dict[tuple, _Entry] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def decode_step(self) -> StepOutput:
        """One step; its tensors are views valid until the next call (see the module docstring)."""
        w = self.worker
        w.prepare_decode()
        B = w.state.seq_lens.shape[0]
        bucket = next(b for b in self.buckets if b >= B)
        key = (bucket, *w.sampling.flags, *w.step_shape)
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = self._new_entry(bucket)
        self._load(entry, B)
        if self.capture:
            entry.graph.replay()
        else:
            self._run_body(entry)
        return w.finish_decode(self._unload(entry, B))

    # ---- static buffers ------------------------------------------------------------------------
    def _live_tensors(self) -> dict[str, torch.Tensor]:
        w = self.worker
        live = {f"state.{k}": v for k, v in w.state.tensors().items()}
        live.update({f"sampling.{k}": getattr(w.sampling, k) for k in w.sampling.tensor_names})
        return live

    def _new_entry(self, bucket: int) -> _Entry:
        inputs = {k: torch.empty((bucket,) + tuple(v.shape[1:]), dtype=v.dtype, device=v.device)
                  for k, v in self._live_tensors().items()}
        sampling = type(self.worker.sampling).__new__(type(self.worker.sampling))
        vars(sampling).update(vars(self.worker.sampling))
        entry = _Entry(bucket, inputs, sampling)
        if self.capture:
            self._capture(entry)
        return entry

    def _load(self, entry: _Entry, B: int) -> None:
        """Live state -> static inputs, each tensor only when it is not already its input's first B rows; padded
        rows repeat request 0 on the scratch cache row. Afterwards the live sampling tensors are those views."""
        pad = entry.bucket - B
        for name, live in self._live_tensors().items():
            dst = entry.inputs[name]
            held = _is_view_of(live, dst[:B])
            if not held:
                dst[:B].copy_(live)
            # the body evolves the padded rows of the state, never those of the sampling tensors; the slots'
            # are filled below
            if pad and not (held and name.startswith("sampling.")) and name != "state.slots":
                dst[B:].copy_(dst[:1].expand((pad,) + tuple(dst.shape[1:])))
        if pad:
            entry.inputs["state.slots"][B:].fill_(self.worker.cache.scratch_slot)
        sampling = self.worker.sampling
        for name in sampling.tensor_names:
            setattr(sampling, name, entry.inputs[f"sampling.{name}"][:B])

    def _unload(self, entry: _Entry, B: int) -> StepOutput:
        """The live state -> views of the static inputs the body left it in; the step as views of its first B
        requests' rows (no copies: see the module docstring for how long they hold)."""
        state = self.worker.state
        for name in entry.state_names:
            setattr(state, name, entry.inputs[f"state.{name}"][:B])
        step = entry.step
        W = step.predict.shape[0] // entry.bucket
        logits = step.logits_output.next_token_logits
        return StepOutput(step.predict[:B * W], step.accept_index[:B], step.accept_lens[:B],
                          LogitsOutput(next_token_logits=logits[:B * W]), step.finite[:B],
                          None if step.empty is None else step.empty[:B * W],
                          None if step.emitted is None else step.emitted[:B])

    # ---- the body on static buffers ------------------------------------------------------------
    def _run_body(self, entry: _Entry) -> None:
        """Run `decode_body` with the worker pointed at the entry's inputs, then copy the new state into them
        (recorded in the graph when capturing); record the step."""
        w = self.worker
        live_state, live_sampling = w.state, w.sampling
        static = type(w.state)()
        for name, t in entry.inputs.items():
            kind, attr = name.split(".", 1)
            setattr(static if kind == "state" else entry.sampling, attr, t)
        w.state, w.sampling = static, entry.sampling
        try:
            step = w.decode_body()
        finally:
            w.state, w.sampling = live_state, live_sampling
        new = static.tensors()
        unknown = [name for name in new if f"state.{name}" not in entry.inputs]
        if unknown:
            raise RuntimeError(f"decode_body set state fields {unknown} that were unset before the step: the "
                               f"static inputs carry the fields set when the buffers are made")
        written = {name: t for name, t in new.items() if not _is_view_of(t, entry.inputs[f"state.{name}"])}
        targets = [entry.inputs[f"state.{name}"] for name in written]

        def kept(t):
            # what is read after the copies (the next state, the step) must not sit in memory they overwrite
            return t.clone() if isinstance(t, torch.Tensor) and _shares_memory(t, targets) else t

        written = {name: kept(t) for name, t in written.items()}
        entry.step = StepOutput(kept(step.predict), kept(step.accept_index), kept(step.accept_lens),
                                LogitsOutput(next_token_logits=kept(step.logits_output.next_token_logits)),
                                kept(step.finite), kept(step.empty), kept(step.emitted))
        # the inputs were made under the engine's inference_mode; a benchmark may run the body outside it
        with torch.inference_mode():
            for name, t in written.items():
                entry.inputs[f"state.{name}"].copy_(t)
        entry.state_names = tuple(new)

    def _capture(self, entry: _Entry) -> None:
        """Warm up on a side stream (Triton compiles, cuBLAS allocates), then capture the body once.
        The warm-up writes only cache slots past each request's committed length (and the draft window
        that every step recomputes), so it leaves nothing the real replay depends on; the state it advances
        in the inputs is loaded again from the live state (which is no view of a new entry's inputs) before
        each warm-up, before the capture and before the first replay (`decode_step`)."""
        B = self.worker.state.seq_lens.shape[0]
        self._load(entry, B)
        device = torch.device(self.worker.device)
        side = capture_stream(torch.device("cuda", device.index if device.index is not None
                                           else torch.cuda.current_device()))
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._load(entry, B)
                self._run_body(entry)
        torch.cuda.current_stream().wait_stream(side)
        self._load(entry, B)
        entry.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(entry.graph, pool=self.pool, stream=side):
            self._run_body(entry)
