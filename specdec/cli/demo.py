"""`specdec demo`: held-out prompts of a shipped pair (or a file's with a model of your own), target-only and with every
draft the model has, side by side."""
from __future__ import annotations

from ..cli_args import (DEVICE_HELP, DRAFT_DIR_HELP, IMPL_HELP, MODEL_HELP, THREADS_HELP, HelpFormatter,
                        add_prompt_arguments, device_choice, positive_int)

NAME = "demo"


def add_parser(subparsers):
    p = subparsers.add_parser(NAME, formatter_class=HelpFormatter,
                              help="decode held-out prompts target-only and with every draft of a shipped pair, side "
                                   "by side (a few seconds)",
                              description="Decode held-out prompts of a shipped pair (`specdec zoo list`), or the "
                                          "prompts of a file with a model of your own (--model, --draft, --prompts), "
                                          "one at a time, greedy: target-only, then each draft the model has (EAGLE "
                                          "and EAGLE-3 heads, NGRAM, a STANDALONE draft LM: a tree S5 K4 W16 and a "
                                          "chain S3; MTP layers in MiMo and Step-3.5 style; DFlash). Prints a table: "
                                          "tokens "
                                          "accepted per step, tokens/s and its ratio to target-only's, whether the "
                                          "tokens are identical to target-only's, and the largest logprob "
                                          "difference; exits 1 if a worker's output differs.")
    p.add_argument("--impl", default="auto", choices=["auto", "reference", "fast"], help=IMPL_HELP)
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens to generate per prompt")
    p.add_argument("--num-prompts", type=positive_int, default=2,
                   help="prompts decoded one at a time: the first N of --prompts (or of the held-out set)")
    p.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    p.add_argument("--device", type=device_choice, default="auto", help=DEVICE_HELP)
    p.add_argument("--model", default="auto", help=MODEL_HELP + " (a model with a chat template answers chat prompts)")
    p.add_argument("--draft", action="append", default=None, metavar="DIR", help=DRAFT_DIR_HELP)
    add_prompt_arguments(p)
    return p


def run(args) -> int:
    # lazy: the CLI builds its parser before importing command implementations
    from ..demo import run_demo
    return run_demo(impl=args.impl, max_new_tokens=args.max_new_tokens, num_prompts=args.num_prompts,
                    device=args.device, model=None if args.model == "auto" else args.model, drafts=args.draft or (),
                    prompts_file=args.prompts, categories=args.categories, turns=args.turns) or 0
