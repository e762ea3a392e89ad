"""Triton's interpreter on a machine without CUDA, whatever imported triton first.

Triton decides per ``@triton.jit`` function, when it is defined, whether it is compiled or interpreted
(``TRITON_INTERPRET`` read at decoration). The kernels of this package are defined after
``use_interpreter_without_cuda`` sets the variable, but triton's own language library
(``tl.max``, ``tl.sum``, ``tl.cumsum``, ``tl.argmax``, ...) is defined when triton is first imported. When
something imported triton before ``fast`` (transformers does while it loads a model; so does a bare
``import triton``), those library functions are compiled-mode ``JITFunction`` objects, and an interpreted
kernel that calls one fails with "Cannot call @triton.jit'd outside of the scope of a kernel". They are
then rebuilt as the interpreted functions a fresh import under ``TRITON_INTERPRET=1`` would have made.
Without CUDA nothing can run a compiled Triton function, so nothing else in the process loses by it.
"""
from __future__ import annotations

import inspect
import os
import re
import sys
import threading

import torch

_FALSE = ("", "0", "false", "off", "no")
#: The oldest triton this package is checked against: CI compiles every kernel for sm_90 under it (the GPU
#: machine's 3.6.0) as well as under the pinned one, and runs the fast ops under its CPU interpreter.
MIN_TRITON = (3, 6)


def require_supported_triton(version: str | None = None) -> None:
    """ImportError naming the version needed when triton is older than MIN_TRITON (pyproject's bound)."""
    if version is None:
        # lazy: TRITON_INTERPRET must be set (fast/__init__) before triton is imported
        import triton
        version = triton.__version__
    numbers = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    if numbers < MIN_TRITON:
        need = ".".join(map(str, MIN_TRITON))
        raise ImportError(f"the fast ops need triton >= {need} (found triton {version}): its kernels are "
                          f"compiled and interpreted against {need} and newer only; install triton>={need} or use "
                          "impl='reference'")


def interpreter_requested() -> bool:
    """True when TRITON_INTERPRET asks for the interpreter (triton's own reading of the variable)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() not in _FALSE


def use_interpreter_without_cuda() -> bool:
    """On a machine without CUDA: set TRITON_INTERPRET=1 unless the variable is already set, and make
    triton's already-defined language functions interpretable. Returns whether kernels are interpreted."""
    if torch.cuda.is_available():
        return False
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if not interpreter_requested():
        return False
    if "triton" in sys.modules:
        _interpret_language_functions()
    _squeeze_scalar_index()
    _reuse_language_builtins()
    _patch_language_once_per_launch()
    _memoize_numpy_dtypes()
    return True


def _squeeze_scalar_index() -> bool:
    """Make the interpreter's scalars usable as indices under every supported triton.

    The interpreter holds a scalar as a 1-element array; triton 3.6 turns one into a Python int with
    ``int(array)``, which numpy 2.4 refuses ("only 0-dimensional arrays can be converted to Python
    scalars"), so every ``range(lo, hi, step)`` over runtime values inside a kernel failed. Triton 3.9 does
    ``int(array.squeeze())``; the language patch that sets it is wrapped here to do the same (a no-op change
    where triton already does). Returns whether the wrap is in place."""
    try:
        # lazy: TRITON_INTERPRET must be set (fast/__init__) before triton is imported
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None:  # another layout: nothing known to fix
        return False
    if getattr(patch, "_squeezes_scalar_index", False):
        return True

    def patch_lang_tensor(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor._squeezes_scalar_index = True
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True


def _reuse_language_builtins() -> bool:
    """Make the interpreter's per-launch language patch find triton's builtins once, not on every launch.

    Before each kernel launch the interpreter swaps every builtin of ``triton.language`` (and of its tensor class)
    for an interpreted wrapper, and restores them after. It finds them with ``inspect.getmembers`` over the whole
    module and class each time, which was most of an interpreted launch's host time (a cProfile of the fast-path
    tests). The builtins are found here once per module or class and reused while each of them is still the
    module's attribute (one identity check per name); the wrappers are still made and restored per launch, as
    triton does. Returns whether the wrap is in place."""
    try:
        # lazy: TRITON_INTERPRET must be set (fast/__init__) before triton is imported
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_builtin = getattr(interpreter, "_patch_builtin", None)
    patch_attr = getattr(interpreter, "_patch_attr", None)
    if patch_builtin is None or patch_attr is None:  # another layout: nothing known to speed up
        return False
    if getattr(patch_builtin, "_reuses_builtins", False):
        return True
    found: dict[int, list] = {}

    def builtins_of(pkg) -> list:
        members = found.get(id(pkg))
        if members is not None:
            current = [getattr(pkg, name, None) is member for name, member in members]
            if all(current):
                return members
            if not any(current):
                # every builtin already swapped in this launch (`triton.language` and `triton.language.core` share
                # the tensor class, patched for each): triton's scan would find no builtin there either
                return []
        members = [(name, member) for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)]
        found[id(pkg)] = members
        return members

    def reusing_patch_builtin(pkg, builder, *scope):
        for name, member in builtins_of(pkg):
            patch_attr(pkg, name, member, builder, *scope)

    reusing_patch_builtin._reuses_builtins = True
    interpreter._patch_builtin = reusing_patch_builtin
    return True


def _patch_language_once_per_launch() -> bool:
    """Make a device-function call inside a launch keep the launch's language patch instead of making its own.

    A launch swaps triton's language builtins for interpreted ones and restores them when it ends; every call of one
    `@triton.jit` function from another made the whole swap again (and never restored it, since the launch's restore
    does), which was an eighth of an interpreted sampling step's host time (a cProfile of the fast-path tests). Inside
    a launch, a call whose function sees no language module beyond those the launch patched now patches nothing;
    outside a launch, or for a module the launch did not patch, triton's patch runs as before. Returns whether the
    wrap is in place."""
    try:
        # lazy: TRITON_INTERPRET must be set (fast/__init__) before triton is imported
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_lang = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if patch_lang is None or executor is None or scope_type is None:  # another layout: nothing known to speed up
        return False
    if getattr(patch_lang, "_once_per_launch", False):
        return True
    launch = threading.local()  # the language modules the running launch has patched (None: no launch running)
    languages = {}

    def languages_of(fn) -> frozenset:
        key = id(fn.__globals__)
        if key not in languages:
            languages[key] = frozenset(id(v) for v in list(fn.__globals__.values())
                                       if inspect.ismodule(v) and (v is tl or v is tl.core))
        return languages[key]

    def patch_lang_once(fn):
        patched, needed = getattr(launch, "patched", None), languages_of(fn)
        if patched is not None and needed <= patched:
            return scope_type()  # the launch's patch covers this call; nothing to restore
        scope = patch_lang(fn)
        if patched is not None:
            launch.patched = patched | needed
        return scope

    run_grid = executor.__call__

    def run_grid_patching_once(self, *args, **kwargs):
        launch.patched = frozenset()
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            launch.patched = None

    patch_lang_once._once_per_launch = True
    interpreter._patch_lang = patch_lang_once
    executor.__call__ = run_grid_patching_once
    return True


def _memoize_numpy_dtypes() -> bool:
    """The interpreter maps a triton dtype to its numpy dtype by building a table of twenty numpy dtypes on every call,
    several times per interpreted operation; the answer for each triton dtype is kept here. Returns whether the wrap is
    in place."""
    try:
        # lazy: TRITON_INTERPRET must be set (fast/__init__) before triton is imported
        from triton.runtime import interpreter
    except ImportError:
        return False
    get_np_dtype = getattr(interpreter, "_get_np_dtype", None)
    if get_np_dtype is None:  # another layout: nothing known to speed up
        return False
    if getattr(get_np_dtype, "_memoized", False):
        return True
    found = {}

    def memoized_np_dtype(tt_dtype):
        try:
            return found[tt_dtype]
        except KeyError:
            result = found[tt_dtype] = get_np_dtype(tt_dtype)
            return result
        except TypeError:  # an unhashable type: asked each time
            return get_np_dtype(tt_dtype)

    memoized_np_dtype._memoized = True
    interpreter._get_np_dtype = memoized_np_dtype
    return True


def _interpret_language_functions() -> int:
    """Replace every compiled-mode JITFunction of triton.language (module attributes and tensor methods)
    by an InterpretedFunction of the same Python function. Returns how many were replaced."""
    # lazy: TRITON_INTERPRET must be set (fast/__init__) before triton is imported
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    rebuilt: dict[int, InterpretedFunction] = {}

    def interpreted(jit_fn):
        if id(jit_fn) not in rebuilt:
            rebuilt[id(jit_fn)] = InterpretedFunction(jit_fn.fn)
        return rebuilt[id(jit_fn)]

    owners = [m for name, m in list(sys.modules.items())
              if m is not None and (name == "triton.language" or name.startswith("triton.language."))]
    owners.append(tl.tensor)
    for owner in owners:
        for attr, value in list(vars(owner).items()):
            if isinstance(value, JITFunction):
                setattr(owner, attr, interpreted(value))
    return len(rebuilt)


require_supported_triton()
#: True when this package's kernels run under Triton's interpreter (no CUDA, TRITON_INTERPRET not turned off).
INTERPRETED = use_interpreter_without_cuda()
