"""The workers, written once against an ops module; `reference` and `fast` bind them to their ops."""
from __future__ import annotations

import functools

from .base import SpeculativeWorkerBase, StepOutput, TargetOnlyWorker, WorkerBase


@functools.cache
def bind(name: str, ops):
    """A subclass of worker `name` whose constructor takes every argument but `ops`."""
    if name == "EagleWorkerV2":
        from .eagle import EagleWorkerV2 as base
    elif name == "MultiLayerEagleWorkerV2":
        from .multi_layer_eagle import MultiLayerEagleWorkerV2 as base
    elif name == "TargetOnlyWorker":
        base = TargetOnlyWorker
    else:
        raise AttributeError(name)

    if base is TargetOnlyWorker:
        def __init__(self, target, max_batch=16, max_seq_len=2048, return_original_logprob=False):
            base.__init__(self, target, ops, max_batch, max_seq_len, return_original_logprob)
    else:
        def __init__(self, target, draft, spec, max_batch=16, max_seq_len=2048, return_original_logprob=False):
            base.__init__(self, target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob)
    return type(name, (base,), {"__init__": __init__, "__module__": ops.__name__,
                                "__doc__": f"{base.__doc__}\n\nBound to the `{ops.__name__}` ops."})


__all__ = ["SpeculativeWorkerBase", "StepOutput", "TargetOnlyWorker", "WorkerBase", "bind"]
