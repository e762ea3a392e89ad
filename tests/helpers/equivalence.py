"""One comparison helper and one tolerance table for every reference/fast pair, and a host-sync guard.

Integer and boolean outputs (trees, accept indices, tokens, top-k ids) must be bit-equal. Floating
outputs agree within ``TOLERANCES[(quantity, input dtype)]``; every row states why it is what it is.
"""
from __future__ import annotations

import contextlib
import sys

import torch
from torch.overrides import TorchFunctionMode

# (quantity, dtype of the op's floating input) -> (atol, rtol, reason)
TOLERANCES: dict[tuple[str, torch.dtype], tuple[float, float, str]] = {
    ("logprob", torch.float32): (
        1e-4, 0.0, "fp32 log-softmax over V <= 2^18: both paths read the same values; only the order of the "
                   "fp32 max/sum reduction differs (observed <= 1e-5)"),
    ("logprob", torch.bfloat16): (
        1e-4, 0.0, "both paths upcast the same stored bf16 values to fp32 before any arithmetic, so the "
                   "fp32 row applies unchanged"),
    ("logprob", torch.float16): (
        1e-4, 0.0, "both paths upcast the same stored fp16 values to fp32 before any arithmetic, so the "
                   "fp32 row applies unchanged"),
    ("prob", torch.float32): (
        2e-7, 1e-5, "fp32 softmax / renormalisation: a blocked sum and torch's sum differ by a few ulps of "
                    "the row total, i.e. a relative 1e-5 on each probability at most"),
    ("prob", torch.bfloat16): (
        2e-7, 1e-5, "logits are upcast to fp32 before the softmax in both paths: as fp32"),
    ("prob", torch.float16): (
        2e-7, 1e-5, "logits are upcast to fp32 before the softmax in both paths: as fp32"),
    ("attention", torch.float32): (
        2e-5, 0.0, "fp32 IEEE products on both sides; the online softmax re-associates the sums over key blocks"),
    ("attention", torch.bfloat16): (
        2 ** -8, 2 ** -7, "outputs are rounded to bf16 (8-bit mantissa) after fp32 accumulation: a rounding flip "
                          "is one ulp (rtol). On a GPU the probabilities meet V on the tensor cores in bf16, each "
                          "rounded by up to 2^-8 of itself, so an output is off by up to 2^-8 of the |v| it "
                          "averages, not of itself: on an output that cancels to near 0 that is absolute (atol, "
                          "for unit-scale V; the H200 run of 2026-12-04 saw 1.1e-3 on outputs of ~0.01)"),
    ("attention", torch.float16): (
        1e-3, 2 ** -9, "as bf16 with fp16's 11-bit mantissa: two ulps"),
    ("rope", torch.float32): (
        1e-6, 1e-6, "x*cos - y*sin in fp32; a compiled kernel may contract it into one FMA (one ulp)"),
    ("rope", torch.bfloat16): (
        0.0, 2 ** -7, "one bf16 ulp (2^-7 relative at most): an FMA's fp32 ulp can flip the final rounding, and "
                      "Triton's CPU interpreter rounds fp32 -> bf16 by truncation"),
    ("rope", torch.float16): (
        0.0, 2 ** -10, "an FMA's ulp of fp32 difference can flip the final fp16 rounding: one fp16 ulp"),
    ("penalised_logits", torch.float32): (
        0.0, 2 ** -23, "the same elementwise fp32 operations in the same order (division correctly rounded in "
                       "both); a compiled kernel may fuse frequency * count into an FMA: one fp32 ulp"),
    ("penalised_logits", torch.bfloat16): (
        0.0, 2 ** -23, "both paths upcast the same stored bf16 logits to fp32 first: as fp32"),
    ("penalised_logits", torch.float16): (
        0.0, 2 ** -23, "both paths upcast the same stored fp16 logits to fp32 first: as fp32"),
    ("kv", torch.float32): (0.0, 0.0, "a commit moves values: bit-equal"),
    ("kv", torch.bfloat16): (0.0, 0.0, "a commit moves values: bit-equal"),
    ("kv", torch.float16): (0.0, 0.0, "a commit moves values: bit-equal"),
}


def tolerance(quantity: str, dtype: torch.dtype = torch.float32) -> tuple[float, float]:
    atol, rtol, _ = TOLERANCES[(quantity, dtype)]
    return atol, rtol


def assert_equivalent(ref, fast, quantity: str, dtype: torch.dtype = torch.float32, where: str = "output"):
    """Compare a reference output with a fast output, recursively through tuples, lists and dicts.

    Tensors must agree in shape and dtype; integer / bool tensors and Python ints must be equal;
    floating tensors must agree within ``TOLERANCES[(quantity, dtype)]`` with NaN where the other has
    NaN. Raises AssertionError naming the path of the first difference (``where``)."""
    if isinstance(ref, (tuple, list)):
        assert isinstance(fast, (tuple, list)) and len(ref) == len(fast), \
            f"{where}: {type(ref).__name__} of {len(ref)} vs {type(fast).__name__} of {len(fast)}"
        for i, (r, f) in enumerate(zip(ref, fast)):
            assert_equivalent(r, f, quantity, dtype, f"{where}[{i}]")
        return
    if isinstance(ref, dict):
        assert isinstance(fast, dict) and ref.keys() == fast.keys(), f"{where}: keys differ"
        for k in ref:
            assert_equivalent(ref[k], fast[k], quantity, dtype, f"{where}[{k!r}]")
        return
    if ref is None or isinstance(ref, (int, str, bool)):
        assert ref == fast, f"{where}: {ref!r} != {fast!r}"
        return
    if isinstance(ref, float):
        atol, rtol = tolerance(quantity, dtype)
        assert abs(ref - fast) <= atol + rtol * abs(ref), f"{where}: {ref!r} vs {fast!r}"
        return
    assert isinstance(ref, torch.Tensor) and isinstance(fast, torch.Tensor), \
        f"{where}: {type(ref).__name__} vs {type(fast).__name__}"
    assert ref.shape == fast.shape, f"{where}: shape {tuple(ref.shape)} vs {tuple(fast.shape)}"
    assert ref.dtype == fast.dtype, f"{where}: dtype {ref.dtype} vs {fast.dtype}"
    assert ref.device == fast.device, f"{where}: device {ref.device} vs {fast.device}"
    if not ref.dtype.is_floating_point:
        if not torch.equal(ref, fast):
            diff = (ref != fast).nonzero()
            first = tuple(diff[0].tolist())
            raise AssertionError(f"{where}: {len(diff)} entries differ, first at {first}: "
                                 f"{ref[first].item()} vs {fast[first].item()}")
        return
    atol, rtol = tolerance(quantity, dtype)
    r, f = ref.double(), fast.double()
    nan_r, nan_f = torch.isnan(r), torch.isnan(f)
    assert torch.equal(nan_r, nan_f), f"{where}: NaN in different places"
    same_inf = (r == f)
    err = torch.where(same_inf | nan_r, 0.0, (r - f).abs())
    bound = atol + rtol * r.abs()
    bad = err > bound
    if bad.any():
        first = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(f"{where}: {int(bad.sum())} entries outside atol={atol}, rtol={rtol}; max error "
                             f"{err.max().item():.3e}; first at {first}: {r[first].item()!r} vs {f[first].item()!r}")


class _HostSyncGuard(TorchFunctionMode):
    """Raises on any call that reads a tensor's value on the host, except from inside Triton itself
    (its CPU interpreter copies kernel arguments to numpy and back; on a GPU nothing of it runs)."""

    FORBIDDEN = frozenset({"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__",
                           "nonzero", "masked_select", "unique", "unique_consecutive", "argwhere", "bincount"})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        sync = name in self.FORBIDDEN
        if name == "repeat_interleave" and len(args) > 1 and isinstance(args[1], torch.Tensor):
            sync = "output_size" not in kwargs  # tensor-valued repeats need their sum on the host
        if name == "__getitem__" and len(args) > 1 and _has_bool_mask(args[1]):
            sync = True  # boolean-mask indexing is a nonzero
        if sync and not _called_from_triton():
            raise AssertionError(f"host sync: {name}")
        return func(*args, **kwargs)


def _has_bool_mask(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _called_from_triton() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/triton/" in name or "\\triton\\" in name:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def no_host_sync():
    """Inside the block, any host read of a tensor value raises AssertionError("host sync: ...").

    Sees Python-level reads (.item(), .tolist(), bool(t), int(t)) and the ops that sync inside C++
    (nonzero, boolean-mask indexing, tensor-valued repeat_interleave, unique, ...). On CUDA it also
    turns on torch's sync debug mode, which sees every synchronising CUDA call."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
    try:
        with _HostSyncGuard():
            yield
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode(previous)


class TorchCalls(TorchFunctionMode):
    """Names of the torch functions an op calls itself (not Triton's interpreter)."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        frame, inside_triton = sys._getframe(1), False
        while frame is not None and not inside_triton:
            inside_triton = "/triton/" in frame.f_code.co_filename
            frame = frame.f_back
        if not inside_triton:
            self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


#: Torch calls that launch no device work (allocation, metadata, views, contiguous() of contiguous input).
NO_LAUNCH = {"__get__", "contiguous", "dim", "empty", "view", "numel", "stride", "size", "is_contiguous"}


def ops_module(ops, calls=None, counted=(), without=()):
    """`ops` (an ops module) copied as a module whose ops named in `counted` count their calls in `calls`, and
    without those named in `without` (a model then takes its plain torch path for them)."""
    import types
    module = types.ModuleType(f"{ops.__name__}_copy")
    module.__dict__.update({k: v for k, v in vars(ops).items() if not k.startswith("__")})
    for name in without:
        del module.__dict__[name]
    for name in counted:
        if name not in without:
            setattr(module, name, _counting(name, getattr(ops, name), calls))
    return module


def _counting(name, op, calls):
    def counting(*args):
        calls[name] = calls.get(name, 0) + 1
        return op(*args)
    return counting


def cached_decode(model, ops, steps=3):
    """Logits and hidden states of a prompt's prefill and `steps` greedy steps of `model` through a KV cache,
    its forwards given the ops module `ops`."""
    from specdec.kv_cache import KVCache
    from specdec.models import AttentionMetadata
    B, P = 2, 5
    ids = torch.randint(0, model.config.vocab_size, (B, P), generator=torch.Generator().manual_seed(0))
    cache = KVCache.for_model(model.config, model.config.num_hidden_layers, B, 16, model.dtype, "cpu")
    slots = torch.arange(B)
    outs, start = [], torch.zeros(B, dtype=torch.long)
    with torch.inference_mode():
        for _ in range(steps + 1):
            T = ids.shape[1]
            meta = AttentionMetadata(slots, start, attn_len=int(start[0]) + T, ops=ops)
            out = model(ids, start[:, None] + torch.arange(T), cache, meta)
            outs += [out.logits, out.hidden]
            start = start + T
            ids = out.logits[:, -1:].argmax(-1)
    return outs


def raised(fn, *args, **kwargs):
    """(exception type, message) of the ValueError or TypeError `fn` raises on bad input; AssertionError if none."""
    try:
        fn(*args, **kwargs)
    except (ValueError, TypeError) as e:
        return type(e), str(e)
    raise AssertionError(f"{fn.__module__}.{fn.__name__} accepted bad input")


def record_triton_launches(monkeypatch) -> list:
    """The names of the Triton kernels launched from now on under the interpreter, in order (a list that grows)."""
    import triton.runtime.interpreter as interpreter
    launches = []
    run = interpreter.GridExecutor.__call__
    monkeypatch.setattr(interpreter.GridExecutor, "__call__",
                        lambda self, *a, **k: launches.append(self.fn.__name__) or run(self, *a, **k))
    return launches
