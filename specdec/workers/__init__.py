"""The workers, written once against an ops module: construct one with `reference` or `fast` (or let
`specdec.Engine(..., impl=...)` do it)."""
from __future__ import annotations

from .base import TargetOnlyWorker, WorkerBase
from .dflash import DFlashWorker
from .eagle import EagleWorkerV2
from .multi_layer_eagle import MultiLayerEagleWorkerV2
from .ngram import NgramWorker
from .speculative import SpeculativeWorkerBase
from .standalone import StandaloneWorker
from .step import StepOutput

__all__ = ["DFlashWorker", "EagleWorkerV2", "MultiLayerEagleWorkerV2", "NgramWorker", "SpeculativeWorkerBase",
           "StandaloneWorker", "StepOutput", "TargetOnlyWorker", "WorkerBase"]
