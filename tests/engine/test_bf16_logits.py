"""A bf16 model's logits stay bf16 from its LM head to the ops that read them (argmax, sampling, verify, penalties,
logprobs, the draft's top-K): each op upcasts as it reads, so decoding equals decoding from logits upcast to fp32
first, the way every op read them before. The independent computation is the same model with an fp32
`compute_logits`: tokens, finish reasons and every logprob must match bit for bit, greedy and sampled, with
penalties, for every draft kind whose draft reads logits, on both paths."""
from __future__ import annotations

import pytest
import torch

from specdec import Engine, SamplingParams
from specdec.bench.suites.kernel_count import e2e_structure_target
from specdec.draft_kinds import draft_kind

VOCAB = 512
PROMPTS = [[5, 9, 14, 3, 77, 200], [1, 2, 3], [300, 301, 302, 303, 9, 9, 9, 9]]


def requests() -> list[SamplingParams]:
    every_logprob = dict(return_logprob=True, top_logprobs_num=3, token_ids_logprob=[0, 5, 0])
    return [SamplingParams(max_new_tokens=6, **every_logprob),
            SamplingParams(max_new_tokens=5, temperature=0.8, top_k=40, top_p=0.9, **every_logprob),
            SamplingParams(max_new_tokens=5, temperature=1.1, frequency_penalty=0.4, repetition_penalty=1.3,
                           **every_logprob)]


def upcast_every_head(*models) -> None:
    """Every module of `models` with a `compute_logits` upcasts its logits to fp32 (the instance's attribute
    shadows the class's method, which the forwards call through `self`)."""
    for model in models:
        if model is None:
            continue
        for module in model.modules():
            method = getattr(type(module), "compute_logits", None)
            if method is not None:
                module.compute_logits = (lambda m, f: lambda hidden: f(m, hidden).float())(module, method)


def decode(target, draft, spec, impl):
    engine = Engine(target, draft, spec, impl=impl, max_batch=len(PROMPTS), max_seq_len=64)
    return engine.generate(PROMPTS, requests(), seed=11)


KINDS = ["target-only", "eagle", "eagle3", "mtp", "draft_lm", "dflash", "dspark"]
CASES = [(kind, "reference") for kind in KINDS] + [
    pytest.param(kind, "fast", marks=[] if kind == "target-only" else pytest.mark.slow) for kind in KINDS]


@pytest.mark.parametrize("kind, impl", CASES)
def test_bf16_logits_decode_as_upcast_logits(kind, impl):
    target = e2e_structure_target(width=64, vocab_size=VOCAB, dtype=torch.bfloat16, num_layers=2)
    draft = spec = None
    if kind != "target-only":
        registered = draft_kind(kind)
        draft = registered.new_random_draft(target)
        spec = registered.default_spec(draft)
    logits = target(torch.tensor([PROMPTS[0]]), torch.arange(len(PROMPTS[0]))[None]).logits
    assert logits.dtype == torch.bfloat16  # what the ops are handed now

    outs = decode(target, draft, spec, impl)
    upcast_every_head(target, draft)
    assert target(torch.tensor([PROMPTS[0]]), torch.arange(len(PROMPTS[0]))[None]).logits.dtype == torch.float32
    expected = decode(target, draft, spec, impl)

    for got, want in zip(outs, expected):
        assert got.token_ids == want.token_ids
        assert got.finish_reason == want.finish_reason
        assert got.accept_lens == want.accept_lens
        assert got.logprobs == want.logprobs
        assert got.top_logprobs == want.top_logprobs
        assert got.token_ids_logprobs == want.token_ids_logprobs
    assert sum(len(o.token_ids) for o in outs) == 16
