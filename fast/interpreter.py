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

import os
import sys

import torch

_FALSE = ("", "0", "false", "off", "no")


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
    return True


def _interpret_language_functions() -> int:
    """Replace every compiled-mode JITFunction of triton.language (module attributes and tensor methods)
    by an InterpretedFunction of the same Python function. Returns how many were replaced."""
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


#: True when this package's kernels run under Triton's interpreter (no CUDA, TRITON_INTERPRET not turned off).
INTERPRETED = use_interpreter_without_cuda()
