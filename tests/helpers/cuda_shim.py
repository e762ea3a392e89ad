"""The CUDA shim that lets fast-op tests pass CPU tensors on a GPU: `tests/conftest.py`'s `pytest_configure` wraps
every public fast op and launcher in `_on_cuda` when CUDA is available (tests build their inputs on the CPU)."""
import dataclasses
import functools
import types

import torch


def _map_tensors(x, fn):
    """x with every tensor t in it (also inside lists, tuples, dicts and objects) replaced by fn(t).

    Plain objects are updated in place, so the caller's object sees what an op wrote into it (a
    LogitsOutput's fields); a frozen dataclass (a TreeAttentionPlan, whose tensors sit in a dict) cannot be,
    so a new instance with the mapped fields is returned. Modules and classes are left alone."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map_tensors(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map_tensors(v, fn) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type) and x.__dataclass_params__.frozen:
        return dataclasses.replace(x, **{f.name: _map_tensors(getattr(x, f.name), fn)
                                         for f in dataclasses.fields(x) if f.init})
    if hasattr(x, "__dict__") and not callable(x) and not isinstance(x, (type, types.ModuleType)):
        for k, v in list(vars(x).items()):
            setattr(x, k, _map_tensors(v, fn))
        return x
    return x


def _to(x, device, moved):
    """x with its CPU tensors on `device`; records (original, moved) pairs so in-place writes can be copied
    back. An expanded tensor (a stride 0 over a dimension above 1) is moved but not recorded: no op writes
    into one, and copying into it raises."""
    def move(t):
        if t.device.type != "cpu":
            return t
        y = t.to(device)
        if not any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape)):
            moved.append((t, y))
        return y

    return _map_tensors(x, move)


def _back(x):
    return _map_tensors(x, lambda t: t.to("cpu"))


class _copies_allowed:
    """The shim's own host <-> device copies are not the op's: tests.helpers.equivalence.no_host_sync's CUDA sync
    check is paused around them."""

    def __enter__(self):
        self.mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode(self.mode)


def _on_cuda(op):
    """A fast op that tests may call with CPU tensors: on a GPU they run compiled on the device, every
    CPU input (and in-place output) is moved there and back, outputs come back to the CPU."""
    @functools.wraps(op)
    def shimmed(*args, **kwargs):
        moved = []
        with _copies_allowed():
            args = _to(list(args), "cuda", moved)
            kwargs = {k: _to(v, "cuda", moved) for k, v in kwargs.items()}
        if not moved:
            return op(*args, **kwargs)
        out = op(*args, **kwargs)
        with _copies_allowed():
            for original, on_device in moved:
                original.copy_(on_device)  # in-place writes (caches, kv) reach the caller's tensors
            for a in args:
                if hasattr(a, "__dict__") and not isinstance(a, torch.Tensor):
                    _back(a)
            return _back(out)

    shimmed.__wrapped__ = op
    return shimmed
