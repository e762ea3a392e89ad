from .draft_common import DraftConfig
from .eagle import EagleDraftHead, random_eagle_head
from .layers import AttentionMetadata
from .llama import LlamaConfig, LlamaForCausalLM, random_llama
from .mtp import MTPDraftModel, random_mtp

__all__ = ["AttentionMetadata", "DraftConfig", "EagleDraftHead", "LlamaConfig", "LlamaForCausalLM", "MTPDraftModel",
           "random_eagle_head", "random_llama", "random_mtp"]
