"""`specdec demo`: the shipped models decode held-out prompts target-only, with EagleWorkerV2 (the EAGLE and
the EAGLE-3 head, side by side at the same S, K, W) and with MultiLayerEagleWorkerV2 (both MTP styles);
prints text, acceptance, speed and the logprob check."""
from __future__ import annotations

import textwrap

import torch

from . import Engine, SamplingParams, zoo
from .bench.cases import CASES
from .prompt_sets import load_requests


def run_demo(impl="auto", max_new_tokens=64, num_prompts=2, prompt_len=160, device="cpu", model=None, drafts=(),
             prompts_file=None, categories=None, turns="first") -> int:
    """model: what `--model` names (`zoo.load_model`; default `zoo.speed_pair()`, the deep pair when it ships), with
    `drafts` (draft directories, `zoo.add_drafts`); a model with a chat template answers its prompts through it and
    stops at its EOS ids. The prompts: the first `num_prompts` of `prompts_file` (of `categories`; every turn with
    turns="all") or of the model's held-out set (`specdec.prompt_sets`). A shipped pair names each kind it lacks; any
    other model runs the drafts it has."""
    bundle = zoo.load_model(model or zoo.speed_pair(), device=device, drafts=drafts)
    tok = bundle.tokenizer
    cases = CASES
    if bundle.name not in zoo.names():
        cases = [c for c in CASES if c.spec is None or getattr(bundle, c.kind) is not None]
    requests = load_requests(bundle, prompts_file, categories, turns, num_prompts, prompt_len=prompt_len,
                             max_new_tokens=max_new_tokens)
    prompts, stop = [r.ids for r in requests], bundle.stop_token_ids
    params = SamplingParams(max_new_tokens=max_new_tokens, return_logprob=True, stop_token_ids=stop)
    max_seq_len = max(len(p) for p in prompts) + max_new_tokens + 64
    ran = Engine._resolve_impl(impl, bundle.target.device)  # what "auto" means here
    source = "held-out prompts" if prompts_file is None else f"prompts of {prompts_file}"
    what = "zoo checkpoint" if bundle.name in zoo.names() or bundle.name in zoo.REAL_TARGETS else "model"
    print(f"specdec demo: {what} {bundle.name!r}, impl={ran}, device={bundle.target.device}, {len(prompts)} {source}, "
          f"greedy, {max_new_tokens} new tokens, batch size 1")
    if ran == "fast" and torch.device(bundle.target.device).type != "cuda":
        print("note: no CUDA device: the fast path's Triton kernels run under Triton's interpreter (exact, slow)")
    base, base_tps, status = None, None, 0
    header = (f"{'worker':26s}{'accepted/step':>14s}{'tokens/s':>10s}{'vs target-only':>16s}  {'identical':9s}  "
              f"max |logprob diff|")
    for case in cases:
        name, spec = case.label, case.spec
        draft = getattr(bundle, case.kind) if spec else None
        if spec is not None and draft is None:  # a kind registered before this pair was trained with it
            print(f"{name:26s}skipped: {bundle.name!r} ships no {case.kind} draft")
            continue
        engine = Engine(bundle.target, draft, spec, impl=impl, max_batch=1, max_seq_len=max_seq_len)
        engine.generate(prompts[:1], SamplingParams(max_new_tokens=8))  # warm-up
        outs, wall, tokens, acc = [], 0.0, 0, []
        for p in prompts:  # B = 1: the latency setting speculative decoding is for
            outs += engine.generate([p], params)
            st = engine.last_stats
            wall, tokens = wall + st.wall_s, tokens + st.num_tokens
            acc += outs[-1].accept_lens
        tps = tokens / wall
        if base is None:
            base, base_tps = outs, tps
            print("\n--- first prompt ---\n" + textwrap.indent(tok.decode(prompts[0]).rstrip(), "  "))
            print("--- target-only continuation ---\n" + textwrap.indent(tok.decode(outs[0].token_ids), "  "))
            print("\ntokens/s: wall time over every prompt; identical: the same tokens as target-only\n")
            print(header)
        same = all(o.token_ids == b.token_ids for o, b in zip(outs, base))
        lp_diff = max(abs(x - y) for o, b in zip(outs, base) for x, y in zip(o.logprobs, b.logprobs))
        mean_acc = sum(acc) / len(acc) if acc else 1.0
        if outs is base:
            print(f"{name + ' (baseline)':26s}{mean_acc:14.2f}{tps:10.1f}{1:15.2f}x  {'-':9s}  -")
            continue
        print(f"{name:26s}{mean_acc:14.2f}{tps:10.1f}{tps / base_tps:15.2f}x  {'yes' if same else 'NO':9s}  "
              f"{lp_diff:.1e}")
        if not same or lp_diff > 1e-4:
            print("  !! not lossless: the speculative output differs from the baseline")
            status = 1
    return status


