"""The workers, written once against an ops module: construct one with `reference` or `fast` (or let
`specdec.Engine(..., impl=...)` do it)."""
from __future__ import annotations

from .base import TargetOnlyWorker, WorkerBase
from .dflash import DFlashWorker
from .eagle import EagleWorkerV2
from .host_proposal import HostProposalWorker
from .multi_layer_eagle import MultiLayerEagleWorkerV2
from .speculative import SpeculativeWorkerBase
from .standalone import StandaloneWorker
from .step import StepOutput

__all__ = ["DFlashWorker", "EagleWorkerV2", "HostProposalWorker", "MultiLayerEagleWorkerV2", "SpeculativeWorkerBase",
           "StandaloneWorker", "StepOutput", "TargetOnlyWorker", "WorkerBase"]
