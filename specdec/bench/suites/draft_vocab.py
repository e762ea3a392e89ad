"""`specdec bench --suite draft-vocab`: a real target's drafts with each draft vocabulary (`--vocab-sizes`, the most
frequent ids of the target's recorded answers first), acceptance against what a draft step costs.

An EAGLE or STANDALONE draft takes the vocabulary as a token map (`Engine(token_map=)`, SGLang's
`--speculative-token-map`: its LM head restricted to those rows); the EAGLE-3 head as its own draft vocabulary
(`Eagle3DraftHead.with_draft_vocabulary`: its LM head rows are the target's, since `specdec zoo train-draft` trains
it so, so one trained head runs with any vocabulary). A larger vocabulary lets a draft propose more of what the target
writes and costs more per draft step (its LM head reads more rows). Every size decodes the same held-out chat prompts
at B = 1, greedy, beside target-only in the same run; one CSV (`results/draft-vocab-<run_id>.csv`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ... import Engine, SamplingParams, zoo
from ...draft_kinds import DRAFT_KINDS, draft_kind
from .acceptance import _forward_pass, _measure
from ..common import DTYPES, Run, RunRow, dtype_name, median_of, progress_bar
from ...prompt_sets import load_requests
from ..report.plots import plot_csv

#: the vocabularies the suite runs when none are given (None: the target's whole vocabulary)
DEFAULT_SIZES = (None, 32768, 16384, 8192, 4096)


@dataclass
class DraftVocabRow(RunRow):
    """One draft vocabulary (or target-only) of `specdec bench --suite draft-vocab`."""

    model: str
    dtype: str
    worker: str  # the draft kind ("" for target-only)
    label: str
    draft_vocab_size: int
    output_token_coverage: float  # of target-only's output tokens, the fraction inside the draft vocabulary
    num_steps: int
    topk: int
    num_draft_tokens: int
    batch_size: int
    num_prompts: int
    max_new_tokens: int
    repeats: int
    tokens: int
    cpu_s: float
    cpu_tokens_per_s: float
    cpu_tokens_per_s_by_pass: str
    mean_accept_len: float | str
    accept_vs_whole_vocab: float | str  # mean_accept_len over the same draft's with the whole vocabulary
    draft_ms_per_step: float | str
    step_cost_in_target_only_steps: float
    cpu_speedup_vs_target_only: float
    cpu_speedup_vs_whole_vocab: float | str
    same_tokens_as_target_only: bool


def token_ranking(bundle) -> torch.Tensor:
    """The target's ids, most frequent in its recorded training answers first (`token_ranking.npy` beside its
    drafts, written by `specdec zoo train-draft`)."""
    path = None if bundle.path is None else bundle.path / "token_ranking.npy"
    if path is None or not path.is_file():
        raise ValueError(f"{bundle.name!r} ships no token_ranking.npy beside its drafts (`specdec zoo train-draft "
                         f"--kind eagle3` writes it)")
    return torch.from_numpy(np.load(path).astype(np.int64))


def vocabulary_kinds(bundle) -> list[str]:
    """The bundle's draft kinds that run with a draft vocabulary: a token map, or a head of their own vocabulary."""
    return [k for k in bundle.drafts if DRAFT_KINDS[k].token_map or k == "eagle3"]


def _engine_with_vocabulary(bundle, kind: str, ids, max_len: int) -> Engine:
    """The bundle's `kind` draft proposing from target ids `ids` only (None: its own whole vocabulary)."""
    draft = getattr(bundle, kind)
    spec = DRAFT_KINDS[kind].default_spec(draft)
    if DRAFT_KINDS[kind].token_map:
        return Engine(bundle.target, draft, spec, max_batch=1, max_seq_len=max_len, token_map=ids)
    if ids is not None:
        draft = draft.with_draft_vocabulary(ids)
    return Engine(bundle.target, draft, spec, max_batch=1, max_seq_len=max_len)


def run_draft_vocab(bundle, sizes, prompts, max_new_tokens: int, repeats: int, stop_token_ids, out_dir,
                    kinds=None, progress=print):
    """Target-only and each of `kinds` (default: every draft of the bundle that takes a vocabulary) at each draft
    vocabulary size, B = 1, greedy -> the CSV's path."""
    V = bundle.target.config.vocab_size
    offered = vocabulary_kinds(bundle)
    kinds = list(kinds or offered)
    missing = [k for k in kinds if k not in offered]
    if missing:
        raise ValueError(f"--workers {missing}: {bundle.name!r} ships no such draft that takes a draft vocabulary "
                         f"(it has {offered})")
    sizes = [V if s is None else s for s in sizes]
    bad = [s for s in sizes if not 1 <= s <= V]
    if bad:
        raise ValueError(f"--vocab-sizes {bad} must be in [1, {V}] (the target's vocabulary)")
    ranking = token_ranking(bundle)
    max_len = max(len(p) for p in prompts) + max_new_tokens + 64
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=list(stop_token_ids))
    cases = [(k, n) for k in kinds for n in sizes]
    # a token map of the whole vocabulary is the draft's own LM head: run that instead (an EAGLE-3 head's whole
    # vocabulary is a head of its own, resliced)
    runners = [Engine(bundle.target, max_batch=1, max_seq_len=max_len)]
    runners += [_engine_with_vocabulary(bundle, k, None if n == V and DRAFT_KINDS[k].token_map else ranking[:n],
                                        max_len) for k, n in cases]
    batches = [[p] for p in prompts]
    bar = progress_bar(len(runners) * len(batches) * (repeats + 1), "draft-vocab", unit="prompt")
    measured = _measure(runners, batches, params, repeats, bar.update)
    phases = [_forward_pass(r, batches, params, bar.update) for r in runners]
    bar.close()
    medians = [median_of(ps, key=lambda p: p["tokens"] / p["cpu"]) for ps in measured]
    base = medians[0]
    base_tps, base_step = base["tokens"] / base["cpu"], base["cpu"] / base["steps"]
    out_tokens = torch.tensor([t for o in base["outs"] for t in o.token_ids])
    run, rows = Run("draft-vocab", bundle.target.device), []
    for (kind, n), runner, ps, med, ph in zip([("", 0)] + cases, runners, measured, medians, phases):
        is_base = not kind
        acc = [a for o in med["outs"] for a in o.accept_lens]
        tps = med["tokens"] / med["cpu"]
        spec = None if is_base else runner.spec
        inside = torch.isin(out_tokens, ranking[:n]).float().mean().item()
        rows.append(DraftVocabRow(
            **run.prefix(), model=bundle.name, dtype=dtype_name(bundle.target.dtype), worker=kind,
            label="target-only" if is_base else f"{draft_kind(kind).label} vocab {n}", draft_vocab_size=n,
            output_token_coverage=round(inside, 4) if not is_base else "",
            num_steps=0 if is_base else spec.num_steps, topk=0 if is_base else spec.topk,
            num_draft_tokens=1 if is_base else spec.num_draft_tokens, batch_size=1, num_prompts=len(prompts),
            max_new_tokens=max_new_tokens, repeats=repeats, tokens=med["tokens"], cpu_s=round(med["cpu"], 4),
            cpu_tokens_per_s=round(tps, 2),
            cpu_tokens_per_s_by_pass=";".join(f"{p['tokens'] / p['cpu']:.2f}" for p in ps),
            mean_accept_len=round(sum(acc) / len(acc), 4) if acc and not is_base else "", accept_vs_whole_vocab="",
            draft_ms_per_step=round(ph[1] * 1e3, 4) if not is_base else "",
            step_cost_in_target_only_steps=round(med["cpu"] / med["steps"] / base_step, 4),
            cpu_speedup_vs_target_only=round(tps / base_tps, 4), cpu_speedup_vs_whole_vocab="",
            same_tokens_as_target_only=all(a.token_ids == b.token_ids for a, b in zip(med["outs"], base["outs"]))))
        progress(f"{rows[-1].label:26s} accept {rows[-1].mean_accept_len or 1:.2f} cpu-tok/s {tps:7.2f} "
                 f"x{rows[-1].cpu_speedup_vs_target_only:.2f} same={rows[-1].same_tokens_as_target_only}")
    for kind in kinds:
        whole = next((r for r in rows if r.worker == kind and r.draft_vocab_size == V), None)
        for r in rows:
            if whole is not None and r.worker == kind:
                r.cpu_speedup_vs_whole_vocab = round(r.cpu_tokens_per_s / whole.cpu_tokens_per_s, 4)
                r.accept_vs_whole_vocab = round(r.mean_accept_len / whole.mean_accept_len, 4)
    return run.write(rows, out_dir, "draft-vocab")


def main_draft_vocab(args) -> int:
    """`specdec bench --suite draft-vocab --model NAME`: the first --num-prompts of the held-out chat set
    (`specdec.prompt_sets`; --max-new-tokens, --repeats), written to args.out."""
    if args.model not in zoo.REAL_TARGETS:
        raise ValueError(f"--suite draft-vocab runs a real target's drafts: --model one of "
                         f"{sorted(zoo.REAL_TARGETS)}, got {args.model!r}")
    bundle = zoo.load(args.model, device=args.device, dtype=DTYPES[args.dtype])
    prompts = [r.ids for r in load_requests(bundle, num_prompts=args.num_prompts)]
    path = run_draft_vocab(bundle, args.vocab_sizes or DEFAULT_SIZES, prompts, args.max_new_tokens, args.repeats,
                           bundle.tokenizer.eos_token_ids, args.out, kinds=args.workers)
    print(f"wrote {path} and {plot_csv(path)}")
    return 0
