"""specdec: EAGLE-style speculative decoding, reference (PyTorch) and fast (Triton) paths."""
from .config import SamplingParams, SpecConfig
from .engine import Engine, GenerateOutput, GenerateStats

__all__ = ["Engine", "GenerateOutput", "GenerateStats", "SamplingParams", "SpecConfig"]
__version__ = "0.1.0"
