"""The check vocabulary every layer uses: one integer check, one real check, one tensor check. The ops' argument
checks built from them (one definition of a valid call, shared by `reference` and `fast`) are in
`specdec.ops.op_checks`.

One rule for what a bad value raises: a `ValueError` naming the value. A value of the wrong kind (not an
integer, not a tensor, a float dtype where an integer one is needed) raises `ArgumentTypeError`, which is a
`ValueError` and a `TypeError` at once, so `except ValueError` catches every bad input and `except TypeError`
still catches a wrong type (numpy's `AxisError` is both in the same way).

Only shapes, dtypes, devices and Python values are checked: nothing here reads a tensor's values, so the
checks cost no host synchronisation inside a decode step.

Inside `trusted_calls()` the tensor, integer and real checks pass their value through without looking at it.
A worker runs a decode step that way once the same kind of step (batch size, sampling flags, step shape, grammar)
has run checked: its op calls then repeat shapes that already passed, as a replayed CUDA graph repeats them, and
the checks' Python costs a few percent of a small model's decode step on a CPU.
"""
from __future__ import annotations

import contextvars
import numbers
import operator

import torch


class ArgumentTypeError(TypeError, ValueError):
    """A value of the wrong kind: both a TypeError and a ValueError (see the module docstring)."""


#: True inside `trusted_calls()`: per thread and per asyncio task, so a caller elsewhere is still checked
_TRUSTED = contextvars.ContextVar("specdec_trusted_calls", default=False)


class trusted_calls:
    """`with trusted_calls(on):` -- when `on`, `check_tensor`, `check_int` and `check_real` return their value
    unchecked inside the block (in this thread or task only), and the attention ops' once-per-plan checks
    (`check_attention_call`, `check_rope_kv_call` in `specdec.ops.op_checks`) return q's shape; when not, the block
    is checked as anywhere else.
    For a caller whose op calls repeat argument shapes that already passed the checks (see the module docstring)."""

    __slots__ = ("on", "_token")

    def __init__(self, on: bool = True):
        self.on = on

    def __enter__(self):
        self._token = _TRUSTED.set(self.on)
        return self

    def __exit__(self, *exc):
        _TRUSTED.reset(self._token)
        return False


def calls_are_trusted() -> bool:
    """Whether this context is inside `trusted_calls(True)`."""
    return _TRUSTED.get()


def _bounds(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f" in [{minimum}, {maximum}]"
    if minimum is not None:
        return f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""


def _check_range(name: str, kind: str, v, minimum, maximum):
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise ValueError(f"{name} must be {kind}{_bounds(minimum, maximum)}, got {v}")
    return v


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (Python or numpy, or a 0-d integer tensor; never a bool) within [minimum, maximum] -> int."""
    if _TRUSTED.get():
        return operator.index(value)
    ok = not isinstance(value, bool) and (
        isinstance(value, numbers.Integral)
        or (isinstance(value, torch.Tensor) and value.dim() == 0 and _is_integer_dtype(value.dtype))
        or (type(value).__module__ == "numpy" and getattr(value, "shape", None) == ()
            and "int" in str(getattr(value, "dtype", "")))
    )
    if not ok:
        raise ArgumentTypeError(f"{name} must be an int{_bounds(minimum, maximum)}, got {type(value).__name__} "
                                f"{value!r}")
    return _check_range(name, "an int", operator.index(value), minimum, maximum)


def check_ints(name, values, minimum: int | None = None, maximum: int | None = None) -> list[int]:
    """A list of `check_int`s: ``name(i)`` names entry i in an error. A list of plain ints within the bounds
    (the usual batch field) is checked in one pass, without a call per entry; anything else goes entry by
    entry, so the error names the first bad one."""
    values = list(values)
    if all(type(v) is int for v in values) and (
        not values or ((minimum is None or min(values) >= minimum) and (maximum is None or max(values) <= maximum))
    ):
        return values
    return [check_int(name(i), v, minimum, maximum) for i, v in enumerate(values)]


def check_real(name: str, value, minimum: float | None = None, maximum: float | None = None) -> float:
    """A real number (not a bool, not a string, not NaN) within [minimum, maximum] -> float."""
    if _TRUSTED.get():
        return float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name} must be a number{_bounds(minimum, maximum)}, got {type(value).__name__} "
                                f"{value!r}")
    v = float(value)
    if v != v:
        raise ValueError(f"{name} must be a number{_bounds(minimum, maximum)}, got nan")
    return _check_range(name, "a number", v, minimum, maximum)


def _is_integer_dtype(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


_DTYPE_KINDS = {
    "int": ("an integer", _is_integer_dtype),
    "float": ("a floating-point", lambda d: d.is_floating_point),
    "bool": ("a bool", lambda d: d == torch.bool),
    "float32": ("the float32", lambda d: d == torch.float32),
    "int32": ("the int32", lambda d: d == torch.int32),
}


def check_tensor(name: str, t, dtype: str | None = None, shape: tuple | None = None, device=None,
                 what: str = "") -> torch.Tensor:
    """`t` must be a tensor; of dtype kind `dtype` ("int", "float", "bool", "float32" or "int32") when given; of
    `shape` when given (an entry None matches any size, and a shorter tuple than t.dim() never matches);
    on `device` when given. `what` explains the expected shape in the message. -> t."""
    if _TRUSTED.get():
        return t
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        label, ok = _DTYPE_KINDS[dtype]
        if not ok(t.dtype):
            raise ArgumentTypeError(f"{name} must have {label} dtype, got {t.dtype}")
    if shape is not None:
        got = tuple(t.shape)
        if len(got) != len(shape) or any(w is not None and g != w for g, w in zip(got, shape)):
            raise ValueError(f"{name} must have shape {_shape_text(shape, what)}, got {got}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, the op's other tensors on {device}")
    return t


def _shape_text(shape: tuple, what: str) -> str:
    if all(w is None for w in shape):
        return f"({what})" if what else f"with {len(shape)} dims"
    concrete = "(" + ", ".join("*" if w is None else str(w) for w in shape) + ("," if len(shape) == 1 else "") + ")"
    return f"{concrete} ({what})" if what else concrete
