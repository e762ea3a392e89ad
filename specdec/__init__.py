"""specdec: EAGLE-style speculative decoding, reference (PyTorch) and fast (Triton) paths."""
from .config import SamplingParams, SpecConfig
from .engine import Engine, GenerateOutput, GenerateStats
from .models.ngram import NgramDraft

__all__ = ["Engine", "GenerateOutput", "GenerateStats", "NgramDraft", "SamplingParams", "SpecConfig"]
__version__ = "0.1.0"
