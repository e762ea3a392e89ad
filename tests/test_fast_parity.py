"""`fast` mirrors `reference`: same op names, same signatures, nothing exported that does not exist,
and the engine refuses a fast path that lacks an op the workers call."""
from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import fast
import reference
from specdec import Engine
from specdec.models import random_llama
from specdec.op_checks import WORKER_OPS, missing_ops

WORKER_CLASSES = {"EagleWorkerV2", "MultiLayerEagleWorkerV2", "TargetOnlyWorker"}
SHARED_OPS = sorted(set(reference.__all__) - WORKER_CLASSES & set(fast.__all__))


def test_fast_exports_only_what_exists():
    for name in fast.__all__:
        assert callable(getattr(fast, name)), name
    assert set(fast.__all__) - WORKER_CLASSES <= set(reference.__all__)
    assert SHARED_OPS, "fast exports no op at all"


@pytest.mark.parametrize("name", SHARED_OPS)
def test_same_signature_as_the_reference(name):
    ref, fst = inspect.signature(getattr(reference, name)), inspect.signature(getattr(fast, name))
    assert [(p.name, p.kind, p.default) for p in ref.parameters.values()] == \
        [(p.name, p.kind, p.default) for p in fst.parameters.values()]
    assert getattr(fast, name).__doc__, f"fast.{name} has no docstring"


def test_reference_has_every_worker_op():
    assert missing_ops(reference) == []
    assert set(WORKER_OPS) <= set(reference.__all__)


def test_engine_names_every_missing_fast_op():
    target = random_llama()
    missing = missing_ops(fast)
    if not missing:
        assert Engine(target, impl="fast").impl == "fast"
        return
    with pytest.raises(ValueError, match="the `fast` package lacks") as err:
        Engine(target, impl="fast")
    for name in missing:
        assert name in str(err.value)
    assert Engine(target, impl="auto").impl == "reference"  # CPU, and fast incomplete


def test_reference_never_imports_triton():
    code = "import sys, reference, specdec, specdec.workers; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
