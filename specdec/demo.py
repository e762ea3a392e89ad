"""`specdec demo`: decode a few prompts target-only and speculatively, print text, acceptance and speed."""
from __future__ import annotations

import torch

from . import Engine, SamplingParams, SpecConfig


def _random_bundle():
    from .models import random_eagle_head, random_llama, random_mtp
    target = random_llama(vocab_size=256, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                          num_attention_heads=4, seed=0)
    return target, random_eagle_head(target, seed=1), random_mtp(target, 3, False, seed=2), None


def run_demo(impl="auto", max_new_tokens=64, random_model=False) -> int:
    torch.manual_seed(0)
    target, eagle, mtp, tok = _random_bundle()
    prompts = [[(7 * i + 3 * j) % 256 for j in range(12 + 5 * i)] for i in range(3)]
    params = SamplingParams(max_new_tokens=max_new_tokens, return_logprob=True)
    runs = [("target-only", None, None), ("EAGLE S=3 K=1", eagle, SpecConfig(3, 1)),
            ("EAGLE S=5 K=4 W=16", eagle, SpecConfig(5, 4, 16)), ("MTP S=3 (MiMo)", mtp, SpecConfig(3))]
    base = None
    for name, draft, spec in runs:
        engine = Engine(target, draft, spec, impl=impl, max_batch=len(prompts), max_seq_len=512)
        engine.generate(prompts[:1], SamplingParams(max_new_tokens=4))  # warm-up
        outs = engine.generate(prompts, params)
        st = engine.last_stats
        if base is None:
            base = outs
        same = all(o.token_ids == b.token_ids for o, b in zip(outs, base))
        lp_diff = max(abs(x - y) for o, b in zip(outs, base) for x, y in zip(o.logprobs, b.logprobs))
        print(f"{name:22s} tokens/s {st.tokens_per_s:8.1f}  accepted/step {st.mean_accept_len:5.2f}  "
              f"same tokens as baseline: {same}  max |logprob diff| {lp_diff:.2e}")
    print("first output:", base[0].token_ids[:32])
    return 0
