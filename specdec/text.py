"""Text in, text out: a thin layer over `Engine.generate` with a `specdec.tokenizer` tokenizer.

The engine takes and returns token ids; `generate_text` encodes prompts with the model's tokenizer, uses its
end-of-sequence ids as the default stop tokens (as transformers' `generate` does), and decodes the output.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .config import SamplingParams
from .engine import Engine, GenerateOutput
from .tokenizer import eos_ids_of


@dataclass
class TextOutput:
    """One request's continuation as text, with the engine's output (token ids, logprobs, accept_lens...)."""

    text: str
    output: GenerateOutput


def generate_text(engine: Engine, tokenizer, prompts: list[str], params: SamplingParams | None = None, seed: int = 0,
                  stream=None) -> list[TextOutput]:
    """prompts: B strings -> B TextOutput. A request whose params name no stop tokens stops at the tokenizer's
    end-of-sequence ids. stream(request_index, new_token_ids), when given, is called as tokens are produced."""
    if not isinstance(prompts, (list, tuple)) or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a list of strings")
    params = params or SamplingParams()
    eos = eos_ids_of(tokenizer)
    if not params.stop_token_ids and eos:
        params = replace(params, stop_token_ids=eos)
    ids = [tokenizer.encode(p) for p in prompts]
    outs = engine.generate(ids, params, seed=seed, stream=stream)
    return [TextOutput(tokenizer.decode([t for t in o.token_ids if t not in eos]), o) for o in outs]
