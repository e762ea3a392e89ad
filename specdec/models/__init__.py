from .draft_common import DraftConfig
from .eagle import EagleDraftHead, random_eagle_head
from .eagle3 import Eagle3Config, Eagle3DraftHead, random_eagle3_head
from .layers import AttentionMetadata
from .llama import LlamaConfig, LlamaForCausalLM, random_llama
from .mtp import MTPDraftModel, random_mtp
from .outputs import ModelOutput

__all__ = ["AttentionMetadata", "DraftConfig", "Eagle3Config", "Eagle3DraftHead", "EagleDraftHead", "LlamaConfig",
           "LlamaForCausalLM", "MTPDraftModel", "ModelOutput", "random_eagle3_head", "random_eagle_head",
           "random_llama", "random_mtp"]
