"""Peers from Hugging Face transformers, with the Engine's `generate` interface, for `specdec bench`."""
from __future__ import annotations

import math
import time

import torch

from ..engine import GenerateOutput, GenerateStats


class HFGenerate:
    """`transformers.LlamaForCausalLM.generate` on a target directory (greedy), optionally with prompt-lookup
    decoding (`prompt_lookup_num_tokens`) or assisted generation by a draft LM (`assistant_dir`: its directory,
    as `save_pretrained` writes it; transformers takes batch size 1 for both). Ragged batches are left-padded
    with an attention mask. Like the Engine, a request stops at `params.stop_token_ids` (kept as its last token);
    without any it decodes exactly max_new_tokens, the model's own EOS held back (`min_new_tokens`)."""

    def __init__(self, target_dir, prompt_lookup: int = 0, device="cpu", assistant_dir=None):
        # lazy: transformers is optional (specdec[bench])
        from transformers import LlamaForCausalLM
        from transformers.utils import logging

        logging.disable_progress_bar()  # its per-load bar would break the bench's own progress lines

        self.device = torch.device(device)
        self.model = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(self.device).eval()
        self.assistant = (None if assistant_dir is None else
                          LlamaForCausalLM.from_pretrained(assistant_dir, dtype=torch.float32).to(self.device).eval())
        self.prompt_lookup = prompt_lookup
        self.last_stats: GenerateStats | None = None

    @torch.inference_mode()
    def generate(self, prompts, params, seed: int = 0) -> list[GenerateOutput]:
        if params.temperature != 0:
            raise ValueError("the transformers peers run greedy decoding only")
        B, L = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros(B, L, dtype=torch.long)
        mask = torch.zeros(B, L, dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, L - len(p):] = torch.tensor(p)
            mask[b, L - len(p):] = 1
        stop = list(params.stop_token_ids)
        kwargs = dict(max_new_tokens=params.max_new_tokens, do_sample=False, pad_token_id=0)
        if stop:
            kwargs["eos_token_id"] = stop
        else:
            kwargs["min_new_tokens"] = params.max_new_tokens
        if self.prompt_lookup:
            kwargs["prompt_lookup_num_tokens"] = self.prompt_lookup
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant
        ids, mask = ids.to(self.device), mask.to(self.device)
        t0 = time.perf_counter()
        out = self.model.generate(ids, attention_mask=mask, **kwargs).cpu()  # .cpu() waits for the device
        wall = time.perf_counter() - t0
        outs = [_cut_at_stop(out[b, L:L + params.max_new_tokens].tolist(), stop) for b in range(B)]
        self.last_stats = GenerateStats(B, 0, sum(len(o.token_ids) for o in outs), wall, math.nan)
        return outs


def _cut_at_stop(token_ids: list[int], stop: list[int]) -> GenerateOutput:
    """A row of `generate`'s output -> its tokens through the first stop id (transformers pads a batch's finished
    rows after it), finish_reason "stop", or all of them, "length"."""
    for i, t in enumerate(token_ids):
        if t in stop:
            return GenerateOutput(token_ids[:i + 1], "stop")
    return GenerateOutput(token_ids, "length")
