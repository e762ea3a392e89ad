"""A worker's decode step replayed as a CUDA graph, one graph per batch-size bucket, set of sampling flags
(`SamplingTensors.flags`) and worker step shape (`step_shape`: NGRAM's verify width).

The body of a step (`decode_body`) reads only the worker's per-request state, its sampling tensors,
the caches and constants, has the same shapes at every step for a batch size and makes no host sync,
so it can be captured once and replayed. The batch is padded to the next bucket (1, 2, 4, ..., up to
`max_batch`): padded rows repeat request 0 on the caches' scratch row, and their results are dropped.
Before each replay the live state is copied into the graph's static inputs; after it, the outputs are
copied back. Logprobs and the host's length bound stay outside the graph (`finish_decode`): they read
only the accepted rows of the target logits, so only those are copied out of the graph's buffer, and
nothing when no request asked for logprobs. A returned step's `logits_output.next_token_logits` is
then the (B*(S+1), V) accepted rows (row b*(S+1) + j), or None.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from ..logprob_types import LogitsOutput
from .base import StepOutput



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


@dataclass
class _Entry:
    """One bucket's static buffers: `inputs` the body reads, `outputs` it leaves (state and step)."""

    bucket: int
    inputs: dict[str, torch.Tensor]
    sampling: object
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    step: StepOutput | None = None
    graph: object = None


class DecodeGraphs:
    """Runs `worker.decode_step` through padded static buffers, as one CUDA graph per (bucket, sampling
    flags) when `capture` is True, or eagerly through the same buffers when False (which tests the
    padding and the state plumbing on any device)."""

    def __init__(self, worker, capture: bool = True):
        if capture and torch.device(worker.device).type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the worker runs on {worker.device}")
        self.worker = worker
        self.capture = capture
        self.buckets = batch_buckets(worker.cache.max_batch)
        self.entries: dict[tuple, _Entry] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def decode_step(self) -> StepOutput:
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
        step = self._unload(entry, B)
        accepted = self._accepted_rows_step(entry, step, B)
        # logprobs on the accepted rows only; the caller gets the full step's tokens and indices
        step.logits_output = w.finish_decode(accepted).logits_output
        return step

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
        """Live state -> static inputs; padded rows repeat request 0 on the scratch cache row."""
        for name, live in self._live_tensors().items():
            dst = entry.inputs[name]
            dst[:B].copy_(live)
            if entry.bucket > B:
                dst[B:].copy_(live[:1].expand((entry.bucket - B,) + tuple(live.shape[1:])))
        if entry.bucket > B:
            entry.inputs["state.slots"][B:].fill_(self.worker.cache.scratch_slot)

    def _unload(self, entry: _Entry, B: int) -> StepOutput:
        """Static outputs -> live state (copies: the next replay overwrites the outputs); the step sliced,
        without its logits (see `_accepted_rows_step`)."""
        state = self.worker.state
        for name, out in entry.outputs.items():
            setattr(state, name, out[:B].clone())
        step = entry.step
        W = step.predict.shape[0] // entry.bucket
        return StepOutput(step.predict[:B * W].clone(), step.accept_index[:B].clone(), step.accept_lens[:B].clone(),
                          LogitsOutput(next_token_logits=None), step.finite[:B].clone(),
                          None if step.empty is None else step.empty[:B * W].clone())

    def _accepted_rows_step(self, entry: _Entry, step: StepOutput, B: int) -> StepOutput:
        """The step as the logprob helper reads it: the accepted rows of the graph's logits (row b*T + j,
        T = S+1), their tokens, and an accept index into them (-1 padded as before). A full copy would
        move B*W rows of fp32 logits per step (263 MB at B=32, W=16, V=128k) for the B*T that are read;
        with no request asking for logprobs the helper reads none, and none are copied."""
        if not any(p.return_logprob for p in self.worker.params):
            return step
        T = step.accept_index.shape[1]
        flat = step.accept_index.clamp_min(0).reshape(-1).long()
        logits = entry.step.logits_output.next_token_logits.index_select(0, flat)
        compact_index = torch.arange(B * T, dtype=step.accept_index.dtype, device=flat.device).view(B, T)
        compact_index = torch.where(step.accept_index >= 0, compact_index, step.accept_index)
        return StepOutput(step.predict.index_select(0, flat), compact_index, step.accept_lens,
                          LogitsOutput(next_token_logits=logits), step.finite,
                          None if step.empty is None else step.empty.index_select(0, flat))

    # ---- the body on static buffers ------------------------------------------------------------
    def _run_body(self, entry: _Entry) -> None:
        """Run `decode_body` with the worker pointed at the entry's inputs; record its outputs."""
        w = self.worker
        live_state, live_sampling = w.state, w.sampling
        static = type(w.state)()
        for name, t in entry.inputs.items():
            kind, attr = name.split(".", 1)
            setattr(static if kind == "state" else entry.sampling, attr, t)
        w.state, w.sampling = static, entry.sampling
        try:
            entry.step = w.decode_body()
        finally:
            w.state, w.sampling = live_state, live_sampling
        entry.outputs = static.tensors()

    def _capture(self, entry: _Entry) -> None:
        """Warm up on a side stream (Triton compiles, cuBLAS allocates), then capture the body once.
        The warm-up writes only cache slots past each request's committed length (and the draft window
        that every step recomputes), so it leaves nothing the real replay depends on."""
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
