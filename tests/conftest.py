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


#: The modules with tests of a minute or more of one core, run first: `-n auto` hands the tests out in collection
#: order, so a long one collected late keeps one worker busy while the others have finished. Whole modules move, so
#: that a module's fixtures are still set up once per worker (an entry that matches nothing costs nothing).
RUN_FIRST = (
    "tests/test_notebooks.py",
    "tests/gpu_check/test_gpu_check.py",
    "tests/bench/test_kernel_count.py",
    "tests/models/test_gguf.py",
    "tests/workers/test_sampled_verification.py",
    "tests/workers/test_fast_workers.py",
    "tests/engine/test_penalties.py",
    "tests/bench/test_bench_real_target.py",
    "tests/workers/test_eagle3.py",
    "tests/zoo/test_deep_pair.py",
    "tests/zoo/test_real_drafts.py",
)


def pytest_collection_modifyitems(config, items):
    """The modules of `RUN_FIRST` first, in its order, then the rest in collection order: a stable reorder, the same
    in every xdist worker."""
    def rank(item):
        path = item.nodeid.split("::")[0]
        return RUN_FIRST.index(path) if path in RUN_FIRST else len(RUN_FIRST)
    items.sort(key=rank)
