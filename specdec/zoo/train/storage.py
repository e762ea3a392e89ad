"""How the zoo stores what it ships: the target in float16, a draft's matrices in int8 with one float16 scale
per output row (`specdec.models.io.quantize_int8_matrices`; the loader dequantizes to fp32)."""
from __future__ import annotations

from pathlib import Path

import torch

from ...models.io import quantize_int8_matrices, save_dir


STORE_DTYPE = torch.float16


#: How a draft's matrices are stored (see `save_stored`); recorded in its config.json and the card.
DRAFT_STORAGE = "int8 matrices with one float16 scale per output row (`<name>_scale`), other weights float16"


def save_stored(model, path: Path, *, draft: bool) -> int:
    """Save `model` as the zoo ships it -> bytes on disk. The target (draft=False): float16. A draft: its
    matrices int8 per output row (`quantize_int8_matrices`, from the fp32 weights), its norms float16, its id
    maps as they are; the loader (`read_state_dict`) dequantizes to fp32. Drafts only propose, so their
    rounding cannot change what the workers decode; it halves their share of the ~20 MB that ships. A draft LM
    is a `LlamaForCausalLM` like the target, hence the flag rather than the model's class."""
    cfg, sd = model.checkpoint()
    cfg["torch_dtype"] = "float16"
    sd = {k: v.detach().float() if v.is_floating_point() else v.detach() for k, v in sd.items()}
    if draft:
        sd = quantize_int8_matrices(sd)
        cfg["specdec_storage"] = DRAFT_STORAGE
    save_dir(path, cfg, {k: v.to(STORE_DTYPE) if v.is_floating_point() else v for k, v in sd.items()})
    for f in Path(path).iterdir():
        f.chmod(0o644)
    return sum(f.stat().st_size for f in Path(path).iterdir())
