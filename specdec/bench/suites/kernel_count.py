"""The device kernels one decode step issues, counted on a CPU: `python -m specdec.bench.suites.kernel_count`.

A step's launch count bounds its speed on a GPU once the weights are read: at B = 1 a decode step of the e2e model
(`e2e.random_1b_target`) is mostly launches. Counting them needs no GPU: every aten op the step dispatches is seen
by a `TorchDispatchMode` (`KernelCounter`), and every Triton kernel it launches by a wrapper around the kernel
objects' `run` (`triton_launches`), which also works under Triton's CPU interpreter (the `fast` ops' kernels on a
machine without CUDA) where triton's own launch hooks are never called.

What counts as one kernel (`classify`):

- counted: every aten op that computes or writes device memory: arithmetic, reductions, matmuls, copies (`copy_`,
  `clone`, a `_to_copy` that casts), and the factories that write what they allocate (`zeros`, `ones`, `full`,
  `arange`, `fill_`, `zero_`): each is at least one launch on a GPU. An op that launches several on a GPU (a sort, a
  split-K matmul) counts once: the count is a floor, comparable across changes, not a profiler's trace;
- counted: each Triton launch, once, by kernel name. The aten ops Triton's interpreter runs around a launch (its
  copies of the arguments to and from the host) are not counted: on a GPU the launch is the kernel;
- not counted, views and metadata: an op whose every output shares the memory of an input it does not write
  (`view`, `_unsafe_view`, `expand`, `permute`, `transpose`, `t`, `slice`, `select`, `unsqueeze`, `squeeze`,
  `as_strided`, `detach`, `alias`, `split`, `unbind`, `narrow`, `lift_fresh`, and `reshape`, `to` or `contiguous`
  with nothing to copy), and ops that return no tensor (size, stride and dim queries): they change a tensor's
  description on the host, never its memory. Judged by the memory, not the schema: an alias annotation means "may
  alias" (`to`, `reshape` and `contiguous` copy when they must, and a cast is a kernel), and `_unsafe_view` has none;
- not counted, allocation: `empty`, `empty_strided`, `empty_like`, `new_empty*`, `resize_`: the caching
  allocator hands out memory without a kernel;
- not counted, empty outputs: an op whose every output has no elements; CUDA kernels return before launching;
- not counted but reported (`host_reads`): a tensor value read by the host (`item`, `equal`: tagged
  `data_dependent_output`): a copy back that waits for the stream, which a decode body must not do.

Ops are seen as the step dispatches them under `torch.inference_mode` (as the engine runs it): a composite op
arrives whole (`aten.linear`, `aten.to`), as one kernel on a GPU too (a GEMM, a cast). The per-request uniforms are
drawn on host tensors (`host_work`), as on a GPU, and not counted.

What a CPU run cannot see: host-to-device copies (`.to(device)` of a host tensor is a no-op on a CPU; on a GPU it is
a memcpy, not a kernel, so nothing is lost), and branches taken on the device type: the model runs in bf16, the
e2e model's dtype, so its RMSNorms and linears take the GPU's path (fp32 on a CPU takes `torch.rms_norm` and
`torch.mv`). The count does not depend on the model's width (the same ops run at any width), so the e2e model's
structure (its 16 layers, its layer composition) runs at a small width; a vocabulary split of the logprob kernel
(`fast.logprobs.num_vocab_splits`) adds one `zeros` to the step's epilogue at V = 128,256 that V = 512 has not.

A step is counted as a GPU run pays it: through the CUDA-graph path's padded static buffers
(`specdec.workers.graphs.DecodeGraphs`, run without capture). What the graph replays (`decode_body`, then the copy of
the new state into the static inputs) is `body_kernels`; everything else in the step is `eager_ops`, each an eager
launch that the host issues on a GPU: the prologue (`prepare_decode`), the load of whatever live state is not yet in
the static inputs (in a steady step the prologue's uniforms only, and the padded rows' when the bucket is larger than
B), the epilogue (`finish_decode`: the logprob kernel) and the engine's packing of the step's outputs into the one
buffer it copies to the host (`HostStep.pack`). The counted step is a steady one, the second after the
prefill: the first makes the bucket's buffers and copies the prefill's state in. `KERNEL_BUDGETS` holds the kernels
of one whole step (body and eager ops) of each budgeted worker at B = 1 with impl="fast", and `EAGER_OPS_GOAL` the
most eager ops such a step may issue; tests/bench/test_kernel_count.py fails when a change exceeds either. The roofline
goals are 220 kernels for target-only and 450 for EAGLE tree S5 K4 W16; the budgets only go down, towards them.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections import Counter
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..common import Run, RunRow, dtype_name
from ...models import random_llama
from ...draft_kinds import draft_kind, worker_label
from ... import Engine, SamplingParams
from ...engine import HostStep
from ...workers.graphs import DecodeGraphs
from ..cases import CASES, by_kind
from .e2e import RANDOM_1B_NAME

#: The whole step's kernels (the graph's body + the eager ops around it) at B = 1, impl="fast", measured; a budget
#: is the measurement rounded up to a multiple of 10 unless the budget before was lower. Lower a budget when a change
#: saves kernels; never raise one (goals: target-only 220, EAGLE tree S5 K4 W16 450).
KERNEL_BUDGETS = {"target-only": 175, "EAGLE tree S5 K4 W16": 410, "EAGLE chain S3": 318}
#: The most eager ops (launches outside the CUDA graph) of a budgeted worker's step at B = 1, greedy, with logprobs:
#: each costs a GPU launch of several microseconds that the host must issue.
EAGER_OPS_GOAL = 8

#: the e2e model's structure (`e2e.random_1b_target`): its depth and its widths' ratios to the hidden size
E2E_LAYERS = 16
E2E_MLP_RATIO = 4  # intermediate 8192 / hidden 2048
E2E_HEAD_DIM = 64  # 32 heads of hidden 2048 ...
E2E_GQA_GROUP = 4  # ... sharing 8 KV heads
E2E_MODEL_NAME = RANDOM_1B_NAME

_aten = torch.ops.aten
#: ops that only allocate: the caching allocator serves them without a kernel
ALLOCATORS = frozenset(p for p in (_aten.empty, _aten.empty_strided, _aten.empty_like, _aten.new_empty,
                                   _aten.new_empty_strided, _aten.resize_, getattr(_aten, "empty_permuted", None))
                       if p is not None)

KERNEL, VIEW, ALLOCATION, QUERY, EMPTY, HOST_READ = "kernel", "view", "allocation", "query", "empty", "host_read"


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def classify(func, args, kwargs, out) -> str:
    """What one dispatched aten op is on a GPU: KERNEL (a launch) or one of the classes that launch nothing (the
    module docstring says why each is in or out)."""
    if func.overloadpacket in ALLOCATORS:
        return ALLOCATION
    outputs = _tensors(out)
    if not outputs:
        return HOST_READ if torch.Tag.data_dependent_output in func.tags else QUERY
    if all(t.numel() == 0 for t in outputs):
        return EMPTY
    if any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments):
        return KERNEL  # in place, or into an out= tensor
    # By the memory, not the schema: a schema's alias annotation says "may alias" (`to`, `reshape` and
    # `contiguous` alias when they can and copy when they must), and `_unsafe_view` has none
    inputs = {_storage(t) for t in _tensors(list(args) + list(kwargs.values())) if t.numel()}
    if all(t.numel() and _storage(t) in inputs for t in outputs):
        return VIEW
    return KERNEL


def op_name(func) -> str:
    """aten.mul.Tensor -> "aten.mul.Tensor"; the default overload without its suffix ("aten.mm")."""
    return str(func).removesuffix(".default")


class KernelCounter(TorchDispatchMode):
    """Counts, while active, the aten ops that launch a kernel (`kernels`, by op name), the Triton launches
    (`triton`, by kernel name), the host reads (`host_reads`) and what was left out (`skipped`, by class).
    Counters nest: an inner one's ops are counted by the outer one too."""

    def __init__(self):
        super().__init__()
        self.kernels: Counter = Counter()
        self.triton: Counter = Counter()
        self.host_reads: Counter = Counter()
        self.skipped: Counter = Counter()
        self._in_launch = 0
        self._hook = None

    #: > 0 inside `host_work`: what runs there runs on the host on a GPU too
    _host_depth = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._in_launch or KernelCounter._host_depth:
            return out  # the interpreter's own copies around a Triton launch; host tensors
        kind = classify(func, args, kwargs, out)
        if kind == KERNEL:
            self.kernels[op_name(func)] += 1
        elif kind == HOST_READ:
            self.host_reads[op_name(func)] += 1
        else:
            self.skipped[kind] += 1
        return out

    @contextlib.contextmanager
    def _launch(self, name: str):
        self.triton[name] += 1
        self._in_launch += 1
        try:
            yield
        finally:
            self._in_launch -= 1

    def __enter__(self):
        self._hook = triton_launches(self._launch)
        self._hook.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self._hook.__exit__(*sys.exc_info())
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._hook.__exit__(*exc)

    @property
    def num_kernels(self) -> int:
        return sum(self.kernels.values()) + sum(self.triton.values())

    def by_op(self) -> Counter:
        """Every launch by name: aten ops as `aten.<op>`, Triton kernels as `triton.<kernel>`."""
        return self.kernels + Counter({f"triton.{k}": n for k, n in self.triton.items()})


def host_work(fn):
    """`fn` with no counter counting its ops: for work on host tensors (the per-request generators' uniforms,
    drawn on the CPU and copied to the device), which a CPU run cannot tell from device work."""
    @functools.wraps(fn)
    def on_host(*args, **kwargs):
        KernelCounter._host_depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            KernelCounter._host_depth -= 1
    return on_host


def _kernel_classes() -> list[type]:
    """The classes whose `run(*args, grid, warmup, **kwargs)` is one launch: triton's JITFunction (compiled) and,
    where triton has it, the interpreter's InterpretedFunction. An autotuner's `run` calls its function's, so it
    is counted there, once."""
    try:
        # lazy: triton is imported only through fast, on use
        from triton.runtime.jit import JITFunction
    except ImportError:
        return []
    classes = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        classes.append(InterpretedFunction)
    except ImportError:
        pass
    return classes


@contextlib.contextmanager
def triton_launches(on_launch):
    """While active, every Triton launch runs inside `on_launch(kernel_name)` (a context manager factory).

    `run` of the kernel classes is wrapped for the duration: triton's `knobs.runtime.launch_enter_hook` is called by
    compiled launches only, never by the interpreter's, and a warm-up (`warmup=True`) compiles without launching."""
    originals = [(cls, cls.__dict__["run"]) for cls in _kernel_classes() if "run" in cls.__dict__]

    def wrapped(run):
        @functools.wraps(run)
        def counted_run(self, *args, grid, warmup, **kwargs):
            if warmup:
                return run(self, *args, grid=grid, warmup=warmup, **kwargs)
            with on_launch(getattr(self.fn, "__name__", repr(self.fn))):
                return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        return counted_run

    for cls, run in originals:
        cls.run = wrapped(run)
    try:
        yield
    finally:
        for cls, run in reversed(originals):
            cls.run = run


# ---- one decode step of the e2e model's structure --------------------------------------------------------------
def e2e_structure_target(width: int = 64, vocab_size: int = 512, dtype=torch.bfloat16, num_layers: int = E2E_LAYERS):
    """A random Llama with `e2e.random_1b_target`'s structure (16 layers, MLP 4x the hidden size, GQA groups of 4,
    untied embeddings) at hidden size `width`, with at least 4 heads (one KV head): hidden 64 has heads of 16 lanes,
    the smallest Triton's tiles take."""
    heads = max(E2E_GQA_GROUP, width // E2E_HEAD_DIM)
    if width % heads:
        raise ValueError(f"width {width} must be a multiple of {heads} heads")
    return random_llama(vocab_size=vocab_size, hidden_size=width, intermediate_size=E2E_MLP_RATIO * width,
                        num_hidden_layers=num_layers, num_attention_heads=heads,
                        num_key_value_heads=heads // E2E_GQA_GROUP, seed=0, dtype=dtype, device="cpu",
                        max_position_embeddings=4096)


def _draft_and_spec(worker_kind: str, target, spec):
    if worker_kind == "target-only":
        if spec is not None:
            raise ValueError("target-only takes no spec")
        return None, None

    kind = draft_kind(worker_kind)
    draft = kind.new_random_draft(target)
    if draft is None:
        raise ValueError(f"draft kind {worker_kind!r} names no random_draft factory")
    return draft, spec if spec is not None else kind.default_spec(draft)


def count_step_kernels(worker_kind: str = "target-only", batch_size: int = 1, impl: str = "fast", width: int = 64,
                       spec=None, vocab_size: int = 512, dtype=torch.bfloat16, prompt_len: int = 8,
                       return_logprob: bool = True, num_layers: int = E2E_LAYERS) -> dict:
    """The kernels of one decode step of `worker_kind` ("target-only" or a draft kind, its random draft, at `spec`
    or the kind's default shape) on `e2e_structure_target(width)` (of `num_layers` layers), after B = `batch_size`
    prompts are prefilled and one warm-up step has run (the step's argument checks and the kernels' first-use work
    are then done).

    The step runs through `DecodeGraphs(worker, capture=False)`, as a GPU runs it as a CUDA graph (the module
    docstring says what is counted where). Greedy, logprobs returned (the e2e suite's requests). -> dict:
    `total_kernels` (the step's launches, what `KERNEL_BUDGETS` holds: `aten_kernels` + `triton_launches`), of them
    `body_kernels` (the graph's) and `eager_ops` (the launches outside it), `host_reads` (in the body), `by_op`
    (Counter of the step's launches by name), `body_by_op` and `eager_by_op` (the two parts'), and `label` / `spec`
    of the worker."""
    if impl == "fast":
        # lazy: fast imports triton
        import fast
        if not fast.INTERPRETED:  # compiled kernels would be handed the CPU model's tensors
            raise ValueError("impl='fast' is counted under Triton's CPU interpreter, which is off in this process "
                             "(CUDA is present, or TRITON_INTERPRET turns it off): use impl='reference' or a "
                             "machine without CUDA")
    target = e2e_structure_target(width, vocab_size, dtype, num_layers)
    draft, spec = _draft_and_spec(worker_kind, target, spec)
    engine = Engine(target, draft, spec, impl=impl, max_batch=batch_size, max_seq_len=prompt_len + 64,
                    preallocate=True)  # its worker is wrapped before the call
    worker = engine.worker
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(vocab_size, (batch_size, prompt_len), generator=gen).tolist()
    params = [SamplingParams(max_new_tokens=32, return_logprob=return_logprob).validated(i, vocab_size)
              for i in range(batch_size)]
    graphs = DecodeGraphs(worker, capture=False)
    run_body, step_counter, body_counter = graphs._run_body, KernelCounter(), KernelCounter()

    def counted_body(entry):
        with body_counter:
            return run_body(entry)

    with torch.inference_mode():
        worker.prefill(prompts, params, seed=0)
        worker.rng.uniforms = host_work(worker.rng.uniforms)  # the generators `prefill` made, drawing on the host
        try:
            # warm-up: makes the bucket's buffers (the first step's load copies all of the state in) and runs the
            # ops' first-use work; the counted step is then a steady one
            step = graphs.decode_step()
            worker.sync_lengths(step.accept_lens.tolist())
            graphs._run_body = counted_body  # an instance attribute: decode_step calls it in place of the method
            with step_counter:
                HostStep.pack(graphs.decode_step())  # and the engine's packing of the step for its one transfer
        finally:
            worker.finish()
    return dict(label=worker_label(worker_kind, spec), spec=spec, total_kernels=step_counter.num_kernels,
                aten_kernels=sum(step_counter.kernels.values()), triton_launches=sum(step_counter.triton.values()),
                body_kernels=body_counter.num_kernels, eager_ops=step_counter.num_kernels - body_counter.num_kernels,
                host_reads=sum(body_counter.host_reads.values()), by_op=step_counter.by_op(),
                body_by_op=body_counter.by_op(), eager_by_op=step_counter.by_op() - body_counter.by_op())


def top_ops(by_op: Counter, n: int = 10) -> str:
    """"aten.mul.Tensor:96;aten.mm:80;...": the n most frequent launches, most first."""
    return ";".join(f"{name}:{count}" for name, count in by_op.most_common(n))


# ---- the CSV --------------------------------------------------------------------------------------------------
@dataclass
class KernelCountRow(RunRow):
    """One (worker, impl, batch size) of `python -m specdec.bench.suites.kernel_count`: the launches of one decode
    step of the e2e model's structure (`num_layers` layers at hidden `hidden_size`, `vocab_size` ids)."""

    model: str
    dtype: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    worker: str
    label: str
    num_steps: int
    topk: int
    num_draft_tokens: int
    impl: str
    batch_size: int
    total_kernels: int
    body_kernels: int
    aten_kernels: int
    triton_launches: int
    eager_ops: int
    host_reads: int
    budget: int | str  # KERNEL_BUDGETS' (B = 1, fast rows only)
    top_ops: str


def worker_cases(kinds) -> list:
    """`cases.CASES` of the named kinds ("target-only", "eagle", ...): each kind's e2e shapes, else its demo ones."""
    cases = []
    for kind in kinds:
        if kind != "target-only":
            draft_kind(kind)  # ValueError naming the registered kinds
        own = [c for c in by_kind(CASES) if c.kind == kind]
        cases += [c for c in own if c.e2e] or own
    return cases


def run_kernel_count(kinds=("target-only", "eagle"), batch_sizes=(1, 32), impl: str = "fast", width: int = 64,
                     vocab_size: int = 512, out_dir="results", progress=print):
    """Every case of `kinds` at every batch size -> the CSV's path (results/kernel-count-<run_id>.csv)."""
    run, rows = Run("kernel-count", "cpu"), []
    for case in worker_cases(kinds):
        for B in batch_sizes:
            c = count_step_kernels(case.kind, B, impl, width, spec=case.spec, vocab_size=vocab_size)
            spec = c["spec"]
            budget = KERNEL_BUDGETS.get(c["label"], "") if (B, impl) == (1, "fast") else ""
            rows.append(KernelCountRow(
                **run.prefix(), model=E2E_MODEL_NAME, dtype=dtype_name(torch.bfloat16), num_layers=E2E_LAYERS,
                hidden_size=width, vocab_size=vocab_size, worker=case.kind, label=c["label"],
                num_steps=spec.num_steps if spec else 0, topk=spec.topk if spec else 0,
                num_draft_tokens=spec.num_draft_tokens if spec else 1, impl=impl, batch_size=B,
                **{k: c[k] for k in ("total_kernels", "body_kernels", "aten_kernels", "triton_launches", "eager_ops",
                                     "host_reads")}, budget=budget, top_ops=top_ops(c["by_op"])))
            progress(f"{c['label']:24s} {impl:9s} B={B:<3d} {c['total_kernels']:4d} kernels (aten {c['aten_kernels']}, "
                     f"triton {c['triton_launches']}; body {c['body_kernels']}, eager {c['eager_ops']})"
                     + (f" budget {budget}" if budget != "" else "") + f"  top: {top_ops(c['by_op'], 5)}")
    return run.write(rows, out_dir)


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected batch sizes >= 1, got {text!r}")
    return values


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.suites.kernel_count", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="target-only,eagle",
                   help="comma-separated kinds: target-only or draft kinds, each at its e2e shapes (default: "
                        "%(default)s)")
    p.add_argument("--batch-sizes", type=_ints, default=[1, 32], help="comma-separated (default: 1,32)")
    p.add_argument("--impl", choices=("reference", "fast"), default="fast")
    p.add_argument("--width", type=int, default=64, help="the model's hidden size (default: %(default)s)")
    p.add_argument("--vocab-size", type=int, default=512, help="(default: %(default)s)")
    p.add_argument("--out", default="results", help="directory of the CSV (default: %(default)s)")
    a = p.parse_args(argv)
    kinds = [k.strip() for k in a.workers.split(",") if k.strip()]
    try:
        path = run_kernel_count(kinds, a.batch_sizes, a.impl, a.width, a.vocab_size, a.out)
    except ValueError as e:
        p.error(str(e))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
