"""The workers, written once against an ops module: construct one with `reference` or `fast` (or let
`specdec.Engine(..., impl=...)` do it)."""
from __future__ import annotations

from .base import TargetOnlyWorker, WorkerBase
from .speculative import SpeculativeWorkerBase
from .step import StepOutput
from .eagle import EagleWorkerV2
from .multi_layer_eagle import MultiLayerEagleWorkerV2

__all__ = ["EagleWorkerV2", "MultiLayerEagleWorkerV2", "SpeculativeWorkerBase", "StepOutput", "TargetOnlyWorker",
           "WorkerBase"]
