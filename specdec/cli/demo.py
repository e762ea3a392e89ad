"""`specdec demo`: held-out prompts of a shipped pair, target-only and with every draft it ships, side by side."""
from __future__ import annotations

from ..cli_args import DEVICE_HELP, IMPL_HELP, MODEL_HELP, THREADS_HELP, HelpFormatter, device_choice, positive_int

NAME = "demo"


def add_parser(subparsers):
    # lazy: the CLI builds its parser before importing command implementations (the zoo)
    from .. import zoo
    p = subparsers.add_parser(NAME, formatter_class=HelpFormatter,
                              help="decode held-out prompts target-only and with every draft of a shipped pair, side "
                                   "by side (a few seconds)",
                              description="Decode held-out prompts of a shipped pair (`specdec zoo list`) one at a "
                                          "time, greedy: target-only, then each draft the pair ships (EAGLE and "
                                          "EAGLE-3 heads, NGRAM, a STANDALONE draft LM: a tree S5 K4 W16 and a chain "
                                          "S3; MTP layers in MiMo and Step-3.5 style; DFlash). Prints a table: tokens "
                                          "accepted per step, tokens/s and its ratio to target-only's, whether the "
                                          "tokens are identical to target-only's, and the largest logprob "
                                          "difference; exits 1 if a worker's output differs.")
    p.add_argument("--impl", default="auto", choices=["auto", "reference", "fast"], help=IMPL_HELP)
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens to generate per prompt")
    p.add_argument("--num-prompts", type=positive_int, default=2, help="held-out prompts, decoded one at a time")
    p.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    p.add_argument("--device", type=device_choice, default="auto", help=DEVICE_HELP)
    p.add_argument("--model", default="auto", choices=["auto"] + zoo.names() + sorted(zoo.REAL_TARGETS),
                   help=MODEL_HELP + " (a real target answers held-out chat prompts)")
    return p


def run(args) -> int:
    # lazy: the CLI builds its parser before importing command implementations
    from ..demo import run_demo
    return run_demo(impl=args.impl, max_new_tokens=args.max_new_tokens, num_prompts=args.num_prompts,
                    device=args.device, model=None if args.model == "auto" else args.model) or 0
