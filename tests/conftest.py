import os

import pytest
import torch

# The fast path's Triton kernels run on CPU through Triton's interpreter when no CUDA device is
# present; on a GPU the compiled kernels are tested. Must be decided before triton is imported
# (importing torch does not import it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (`-n auto`, the README's test command) each worker is one process per core: one torch thread
# each, or the workers would oversubscribe the cores (the tests' models are small enough that one thread is fastest).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def pytest_configure(config):
    """On a GPU: every public fast op and launcher accepts CPU tensors (tests build their inputs on the CPU)."""
    if not torch.cuda.is_available():
        return
    import inspect

    import fast
    from fast import activation, attention, draft, kv, logprobs, norm, rejection, sampling, traversal, tree, verify
    from tests.helpers.cuda_shim import _on_cuda
    for module in (activation, attention, draft, kv, logprobs, norm, rejection, sampling, traversal, tree, verify):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__ and not name.endswith("_kernel") and not name.startswith("__"):
                setattr(module, name, _on_cuda(fn))
                if getattr(fast, name, None) is fn:
                    setattr(fast, name, module.__dict__[name])


@pytest.fixture(scope="module")
def small():
    """The shipped small pair (`specdec.zoo.SMALL_NAME`)."""
    from specdec import zoo
    return zoo.load(zoo.SMALL_NAME)
