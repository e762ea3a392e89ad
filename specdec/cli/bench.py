"""`specdec bench --suite ...`: the benchmark suites, one CSV per run (schemas: results/README.md) and its plot."""
from __future__ import annotations

import argparse

from ..cli_args import (DEVICE_HELP, DRAFT_DIR_HELP, IMPL_HELP, MODEL_HELP, THREADS_HELP, HelpFormatter,
                        add_prompt_arguments, confidence_threshold_list, device_choice, draft_kinds_arg, float_list,
                        positive_int, positive_int_list, top_p_list, verify_rules_arg)
from ..draft_kinds import DRAFT_KINDS
from ..bench.common import DTYPES
from ..bench.suites.acceptance import main_bench

NAME = "bench"


def add_parser(subparsers):
    p = subparsers.add_parser(NAME, formatter_class=HelpFormatter,
                              help="acceptance and tokens/s of every worker against target-only; writes a CSV to "
                                   "results/ and its plot (about half an hour with the defaults on a CPU: it prints "
                                   "its estimate before it starts)",
                              description="Benchmarks that write one CSV per run to --out (schemas: "
                                          "results/README.md) and its plot; `specdec report CSV` prints its tables. "
                                          "The acceptance suite prints how long it will take before it starts (its "
                                          "batch decodes priced at target-only's speed, measured first) and shows a "
                                          "progress bar. With prompts of several categories (--prompts FILE in "
                                          "MT-Bench's format) the CSV has a row per category beside the overall "
                                          "ones. Example: specdec bench --workers eagle,ngram --batch-sizes 1 "
                                          "--no-peers; specdec bench --model my.gguf --draft drafts/ --prompts "
                                          "question.jsonl --categories writing,coding")
    p.add_argument("--suite", default="acceptance", choices=["acceptance", "kernels", "e2e", "penalties",
                                                             "draft-cost", "draft-vocab", "repetitive"],
                   help="acceptance: every worker against target-only on the shipped models; "
                        "kernels: every op of the decode step, reference / fast / torch.compile, against "
                        "the copy bandwidth (the full B x S+1 x V sweep on CUDA, a corner of it on CPU); "
                        "e2e: every worker, reference / fast / fast + CUDA graphs, tokens/s and the phases "
                        "of a step, on the shipped model and (CUDA) a random 1.5B Llama; penalties: per "
                        "penalty setting, how often SGLang's approximation leaves target-only's output, "
                        "acceptance under it and under exact penalties, and what exact penalties cost a step; "
                        "draft-cost: each shipped draft's step against a target step (the kinds whose model "
                        "card states it), written onto the pair's card and MODEL_CARD.md (--model, "
                        "--num-prompts: the card used 4); draft-vocab: a real target's EAGLE-3 head with "
                        "each draft vocabulary of --vocab-sizes, acceptance against draft-step cost (B = 1, "
                        "greedy); repetitive: agent-like requests built from the standard library's sources (a "
                        "tool-call schema filled again and again, code edits that copy a function, conversations "
                        "that quote an earlier turn), written to a prompt file in --out, target-only and the "
                        "--workers (default: the kinds that need no weights) at their default shapes (--shapes "
                        "demo: every demo shape) on a real target (--model auto: smollm2-135m-instruct), B = 1 "
                        "unless --batch-sizes")
    p.add_argument("--impl", default="auto", choices=["auto", "reference", "fast"], help=IMPL_HELP)
    p.add_argument("--batch-sizes", type=positive_int_list, default=None,
                   help="comma-separated batch sizes (default: 1,4 for acceptance, 1,8,32 for e2e)")
    p.add_argument("--temperatures", type=float_list, default=[0.0, 0.7],
                   help="comma-separated temperatures, 0 = greedy (acceptance suite)")
    p.add_argument("--top-ps", type=top_p_list, default=[1.0],
                   help="comma-separated top-p values, each run at every temperature above 0 (acceptance suite)")
    p.add_argument("--verify", type=verify_rules_arg, default=["target_only"],
                   help="comma-separated verify rules for the sampled requests of every drafting case "
                        "(acceptance suite): target_only (SGLang's), rejection, block and traversal (with the "
                        "draft's distribution, drafting by sampling; block on chains only, traversal on trees "
                        "only); each case runs once per rule it can, the rules other than target_only at "
                        "temperatures above 0 only")
    p.add_argument("--num-prompts", type=positive_int, default=16,
                   help="prompts per batch size: the first N of --prompts (or of the held-out set)")
    p.add_argument("--check-prompts", type=positive_int, default=None,
                   help="acceptance suite: the untimed logprob and phase passes (logprobs against target-only's, "
                        "the draft and forward costs per step) decode the first N prompts only, whole batches "
                        "(default: every prompt); tokens and timings always cover all of them")
    p.add_argument("--prompt-len", type=positive_int, default=96,
                   help="a byte pair's held-out code prompts, cut to this many tokens (bytes) at a line end (a prompt "
                        "file's prompts are decoded as they are)")
    p.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens to generate per prompt")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="timed passes per case (the CSV has their median and p20 / p80)")
    p.add_argument("--workers", type=draft_kinds_arg, default=None,
                   help="comma-separated drafts to run beside target-only (acceptance and penalties suites), of "
                        f"{', '.join(DRAFT_KINDS)} (default: every kind the pair offers)")
    p.add_argument("--shapes", default="auto", choices=["auto", "all", "demo", "first"],
                   help="acceptance suite: every kind's demo shapes and NGRAM's option variants (all), the demo "
                        "shapes only (demo), or each kind's default shape (first); auto: demo for a real target, "
                        "whose steps cost more, all for a shipped pair")
    p.add_argument("--vocab-sizes", type=positive_int_list, default=None,
                   help="draft-vocab suite: draft vocabularies, most frequent ids first (default: the whole "
                        "vocabulary, 32768, 16384, 8192, 4096)")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the transformers peers (acceptance suite, float32, needs the bench extra)")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES),
                   help="the models' dtype (acceptance suite; greedy agreement with target-only in low "
                        "precision is in the identical_request_fraction column)")
    p.add_argument("--tuned", action="append", default=None, metavar="PATH",
                   help="a file `specdec tune` wrote for this pair: its draft also runs with the tuned shape per "
                        "batch size and with adaptive speculation (acceptance suite; the shape_policy column); "
                        "repeat it for several drafts")
    p.add_argument("--out", default="results", help="directory for the CSV and its plot")
    p.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    p.add_argument("--device", type=device_choice, default="auto", help=DEVICE_HELP)
    p.add_argument("--model", default="auto",
                   help=MODEL_HELP + " (acceptance suite; a model with a chat template answers chat prompts)")
    p.add_argument("--draft", action="append", default=None, metavar="DIR",
                   help=DRAFT_DIR_HELP + " (acceptance suite)")
    p.add_argument("--confidence-thresholds", type=confidence_threshold_list, default=None, metavar="LIST",
                   help="DSpark at each of these confidence thresholds, e.g. 0.5,0.3,0 (0: the whole block "
                        "verified), in place of its drafter's own and the whole block (acceptance suite)")
    add_prompt_arguments(p)
    return p


def check(args) -> str | None:
    """What the parser cannot see alone: the acceptance suite's batch sizes against its prompts, and its options
    asked of another suite."""
    if args.suite != "acceptance":
        given = [flag for flag, value in (("--draft", args.draft), ("--prompts", args.prompts),
                                          ("--confidence-thresholds", args.confidence_thresholds),
                                          ("--categories", args.categories), ("--turns", args.turns != "first"))
                 if value]
        if given:
            return f"{', '.join(given)}: the acceptance suite's, not --suite {args.suite}'s"
    if args.batch_sizes and args.suite == "acceptance":
        too_big = [b for b in args.batch_sizes if b > args.num_prompts]
        if too_big:
            return f"--batch-sizes {too_big} exceed --num-prompts {args.num_prompts}"
    return None


def run(args) -> int:
    if args.suite == "kernels":
        # lazy: the CLI builds its parser before importing command implementations
        from ..bench.suites.kernels import main_kernels
        return main_kernels(args) or 0
    if args.suite == "e2e":
        from ..bench.suites.e2e import main_e2e
        return main_e2e(args) or 0
    if args.suite == "penalties":
        from ..bench.suites.penalties import main_penalties
        return main_penalties(args) or 0
    if args.suite == "draft-vocab":
        from ..bench.suites.draft_vocab import main_draft_vocab
        return main_draft_vocab(args) or 0
    if args.suite == "repetitive":
        from ..bench.suites.repetitive import main_repetitive
        return main_repetitive(args) or 0
    if args.suite == "draft-cost":
        from ..bench.suites.draft_cost import main_draft_cost
        return main_draft_cost(args) or 0
    return main_bench(args) or 0
