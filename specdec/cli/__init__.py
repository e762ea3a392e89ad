"""`specdec` console command: `specdec demo`, `generate`, `bench`, `tune`, `report`, `plot`, `token-map`, `gpu-check`,
`zoo list`, `zoo train`."""
from __future__ import annotations

import argparse
import os
import sys

from ..draft_kinds import DRAFT_KINDS


from ..cli_args import (DEVICE_HELP, MODEL_HELP, THREADS_HELP, HelpFormatter, device_choice, draft_kinds_arg,
                       float_list, positive_int, positive_int_list, top_p_list, verify_rules_arg)

ZOO_HELP = """usage: specdec zoo list | specdec zoo train [options] | specdec zoo train-draft [options]

  list         each shipped pair: its models, their size on disk, its tokenizer and directory
  train        train a pair on the Python standard library (`specdec zoo train --help`)
  train-draft  train a draft for a given target on its recorded answers (`specdec zoo train-draft --help`)"""


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("specdec")
    except Exception:  # not installed as a distribution (a source checkout on sys.path)
        return "unknown"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    fmt = HelpFormatter
    parser = argparse.ArgumentParser(prog="specdec", description="EAGLE-style speculative decoding toolkit",
                                     formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"specdec {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    from ..bench.common import DTYPES
    from .. import zoo
    zoo_names = zoo.names()
    impl_help = "ops: reference (PyTorch), fast (Triton; interpreted on a CPU), auto (fast on CUDA)"
    demo = sub.add_parser("demo", formatter_class=fmt,
                          help="decode held-out prompts target-only and with every draft of a shipped pair, side "
                               "by side (a few seconds)",
                          description="Decode held-out prompts of a shipped pair (`specdec zoo list`) one at a time, "
                                      "greedy: target-only, then each draft the pair ships (EAGLE and EAGLE-3 heads, "
                                      "NGRAM, a STANDALONE draft LM: a tree S5 K4 W16 and a chain S3; MTP layers in "
                                      "MiMo and Step-3.5 style; DFlash). Prints a table: tokens accepted per step, "
                                      "tokens/s and its ratio to target-only's, whether the tokens are identical to "
                                      "target-only's, and the largest logprob difference; exits 1 if a worker's "
                                      "output differs.")
    demo.add_argument("--impl", default="auto", choices=["auto", "reference", "fast"], help=impl_help)
    demo.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens to generate per prompt")
    demo.add_argument("--num-prompts", type=positive_int, default=2, help="held-out prompts, decoded one at a time")
    demo.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    demo.add_argument("--device", type=device_choice, default="auto", help=DEVICE_HELP)
    demo.add_argument("--model", default="auto", choices=["auto"] + zoo_names + sorted(zoo.REAL_TARGETS),
                      help=MODEL_HELP + " (a real target answers held-out chat prompts)")
    gen = sub.add_parser("generate", formatter_class=fmt,
                         help="decode a prompt (text) with a zoo pair or checkpoint directories, streaming the "
                              "continuation, then the same request target-only for comparison",
                         description="Decode one prompt speculatively, printing the continuation as it is produced, "
                                     "then decode it again target-only with the same sampling parameters and print "
                                     "both runs' tokens/s (process CPU time and wall time), tokens accepted per "
                                     "step, and whether the tokens are identical. Example: specdec generate "
                                     "--model stdlib-byte-24l --draft eagle3 'def parse_args('")
    gen.add_argument("prompt", help="the prompt, as text")
    source = gen.add_mutually_exclusive_group()
    source.add_argument("--model", default=None, choices=zoo_names + sorted(zoo.REAL_TARGETS),
                        help="a zoo entry (`specdec zoo list`): a shipped pair, or a released model read from its "
                             "installed GGUF file; its target, and its draft of the kind --draft names. Without "
                             "--model and --target, the deep pair")
    source.add_argument("--target", default=None, help="the target's directory (config.json, safetensors, "
                                                       "tokenizer.json), instead of --model")
    gen.add_argument("--draft", default=None,
                     help=f"with --model: the pair's draft of this kind, one of {', '.join(DRAFT_KINDS)} "
                          "(default: eagle, else the first kind the pair ships). With --target: the draft's "
                          "directory (a head, MTP layers, or a small causal LM of the target's vocabulary: "
                          "STANDALONE; for mtp-deepseek / mtp-mimo the directory holding the MTP layers, by default "
                          "the target's), or 'ngram' (no model: SGLang's NGRAM); none decodes target-only")
    gen.add_argument("--draft-layout", default="auto",
                     choices=["auto", *(k for k in DRAFT_KINDS if k != "ngram"), "mtp-deepseek", "mtp-mimo"],
                     help="how to read --draft DIR (with --target); auto: from the draft's config.json and weights "
                          "(this project's heads, an EAGLE-1/2 or an EAGLE-3 checkpoint, MTP layers, a causal LM)")
    gen.add_argument("--num-steps", type=positive_int, default=None,
                     help="draft depth S (default: with --model, the shape tuned for the pair and kind at batch "
                          "size 1 where one ships; else 5 for EAGLE heads, the layer count for MTP)")
    gen.add_argument("--topk", type=positive_int, default=None,
                     help="draft top-K per step (default: the tuned shape's, else 4 for EAGLE)")
    gen.add_argument("--num-draft-tokens", type=positive_int, default=None,
                     help="tree size W, root included (default: the tuned shape's, else 16 for EAGLE, S+1 for "
                          "chains)")
    gen.add_argument("--no-baseline", action="store_true",
                     help="skip the target-only run that follows the speculative one")
    gen.add_argument("--chat-template", default="auto", choices=["auto", "yes", "no"],
                     help="send the prompt as a user turn of the tokenizer's chat template; auto: where the tokenizer "
                          "has one and the model is an instruct model (its zoo card says so, or its name has "
                          "'instruct' or 'chat'; not the byte pairs, trained on raw code)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    gen.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens to generate")
    gen.add_argument("--frequency-penalty", type=float, default=0.0, help="in [-2, 2]: minus this per occurrence "
                                                                           "in the output")
    gen.add_argument("--presence-penalty", type=float, default=0.0, help="in [-2, 2]: minus this once a token is out")
    gen.add_argument("--repetition-penalty", type=float, default=1.0,
                     help="> 0, 1 off: prompt and output tokens' logits divided (positive) or multiplied (negative)")
    gen.add_argument("--min-new-tokens", type=int, default=0, help="hold the end-of-sequence ids back until this "
                                                                  "many tokens are out")
    gen.add_argument("--logit-bias", action="append", default=[], metavar="ID=BIAS",
                     help="add BIAS to token ID's logit (repeatable)")
    gen.add_argument("--penalty-mode", default="exact", choices=["exact", "sglang"],
                     help="exact: each tree node penalised along its own path (lossless); sglang: every node as "
                          "the root, SGLang's approximation")
    grammar = gen.add_mutually_exclusive_group()
    grammar.add_argument("--json-schema", metavar="FILE", default=None,
                         help="constrain the output to JSON of this JSON schema (needs the grammar extra: xgrammar)")
    grammar.add_argument("--regex", metavar="R", default=None, help="constrain the output to this regular expression")
    grammar.add_argument("--ebnf", metavar="FILE", default=None,
                         help="constrain the output to this EBNF grammar (xgrammar's syntax, root ::= ...)")
    gen.add_argument("--draft-grammar", action="store_true",
                     help="mask the draft's proposals by the grammar too (more tokens per step, same output)")
    gen.add_argument("--token-map", metavar="FILE", default=None,
                     help="an EAGLE or STANDALONE draft proposes only these target ids, its LM head restricted to "
                          "their rows (SGLang's --speculative-token-map: a torch.save'd list of ids; `specdec "
                          "token-map` writes one). Same output; acceptance and draft cost may change")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed")
    gen.add_argument("--impl", default="auto", choices=["auto", "reference", "fast"], help=impl_help)
    gen.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    tmap = sub.add_parser("token-map", formatter_class=fmt,
                          help="write a hot-vocabulary token map (SGLang's --speculative-token-map format): the "
                               "target's most frequent ids in a corpus",
                          description="Rank the target's ids by their count in a corpus (ties to the lower id) and "
                                      "write the first --size as a token map: torch.save of a list of ids, what "
                                      "SGLang's --speculative-token-map and `specdec generate --token-map` read. "
                                      "Example: specdec token-map --model smollm2-135m-instruct --size 32768 --out "
                                      "hot-32k.pt")
    tsource = tmap.add_mutually_exclusive_group(required=True)
    tsource.add_argument("--model", default=None, choices=zoo_names + sorted(zoo.REAL_TARGETS),
                         help="a zoo entry: its tokenizer, and without --corpus the ranking shipped beside its drafts "
                              "(the target's recorded answers)")
    tsource.add_argument("--target", default=None, help="a target directory with tokenizer.json (needs --corpus)")
    tmap.add_argument("--corpus", nargs="+", metavar="FILE", default=None,
                      help="UTF-8 text files whose token counts rank the ids")
    tmap.add_argument("--size", type=positive_int, required=True, help="how many ids the map keeps")
    tmap.add_argument("--out", required=True, help="the file to write (.pt)")
    tmap.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    sub.add_parser("gpu-check", add_help=False,
                   help="one offline run that measures and checks the fast path on this machine's GPU, "
                        "writing CSVs and SUMMARY.md under --out (`specdec gpu-check --help`)")
    sub.add_parser("tune", add_help=False,
                   help="measure the best speculative shape per batch size for a pair on this machine and write the "
                        "JSON the engine loads (`Engine(..., spec='tuned:PATH')`; `specdec tune --help`)")
    zoo_help = sub.add_parser("zoo", help="the shipped checkpoints: `specdec zoo list`, `specdec zoo train --help`",
                              add_help=False)
    zoo_help.add_argument("action", nargs="?", choices=["list", "train", "train-draft"])
    report = sub.add_parser("report", formatter_class=fmt,
                            help="print docs/results.md from the committed CSVs, or one CSV's tables")
    report.add_argument("csv", nargs="?", default=None,
                        help="an acceptance-*.csv or penalties-*.csv of results/; without it, the whole results page "
                             "(run from the repository root; `specdec report > docs/results.md`)")
    report.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    plot = sub.add_parser("plot", formatter_class=fmt,
                          help="draw every CSV of a results directory (each schema its plot, beside the file) and "
                               "its committed gpu-check runs")
    plot.add_argument("csv", nargs="*", help="only these CSVs (default: every CSV of --results)")
    plot.add_argument("--results", default="results", help="the results directory")
    plot.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    bench = sub.add_parser("bench", formatter_class=fmt,
                           help="acceptance and tokens/s of every worker against target-only; writes a CSV to "
                                "results/ and its plot (about half an hour with the defaults on a CPU: it prints its "
                                "estimate before it starts)",
                           description="Benchmarks that write one CSV per run to --out (schemas: results/README.md) "
                                       "and its plot; `specdec report CSV` prints its tables. The acceptance suite "
                                       "prints how long it will take before it starts (its batch decodes priced at "
                                       "target-only's speed, measured first) and shows a progress bar. "
                                       "Example: specdec bench --workers eagle,ngram --batch-sizes 1 --no-peers")
    bench.add_argument("--suite", default="acceptance", choices=["acceptance", "kernels", "e2e", "penalties",
                                                                       "draft-cost", "draft-vocab"],
                       help="acceptance: every worker against target-only on the shipped models; "
                            "kernels: every op of the decode step, reference / fast / torch.compile, against "
                            "the copy bandwidth (the full B x S+1 x V sweep on CUDA, a corner of it on CPU); "
                            "e2e: every worker, reference / fast / fast + CUDA graphs, tokens/s and the phases "
                            "of a step, on the shipped model and (CUDA) a random 1.2B Llama; penalties: per "
                            "penalty setting, how often SGLang's approximation leaves target-only's output, "
                            "acceptance under it and under exact penalties, and what exact penalties cost a step; "
                            "draft-cost: each shipped draft's step against a target step (the kinds whose model "
                            "card states it), written onto the pair's card and MODEL_CARD.md (--model, "
                            "--num-prompts: the card used 4); draft-vocab: a real target's EAGLE-3 head with "
                            "each draft vocabulary of --vocab-sizes, acceptance against draft-step cost (B = 1, "
                            "greedy)")
    bench.add_argument("--impl", default="auto", choices=["auto", "reference", "fast"], help=impl_help)
    bench.add_argument("--batch-sizes", type=positive_int_list, default=None,
                       help="comma-separated batch sizes (default: 1,4 for acceptance, 1,8,32 for e2e)")
    bench.add_argument("--temperatures", type=float_list, default=[0.0, 0.7],
                       help="comma-separated temperatures, 0 = greedy (acceptance suite)")
    bench.add_argument("--top-ps", type=top_p_list, default=[1.0],
                       help="comma-separated top-p values, each run at every temperature above 0 (acceptance suite)")
    bench.add_argument("--verify", type=verify_rules_arg, default=["target_only"],
                       help="comma-separated verify rules for the sampled requests of every drafting case "
                            "(acceptance suite): target_only (SGLang's), rejection, block and traversal (with the "
                            "draft's distribution, drafting by sampling; block on chains only, traversal on trees "
                            "only); each case runs once per rule it can, the rules other than target_only at "
                            "temperatures above 0 only")
    bench.add_argument("--num-prompts", type=positive_int, default=16, help="held-out prompts per batch size")
    bench.add_argument("--check-prompts", type=positive_int, default=None,
                       help="acceptance suite: the untimed logprob and phase passes (logprobs against target-only's, "
                            "the draft and forward costs per step) decode the first N prompts only, whole batches "
                            "(default: every prompt); tokens and timings always cover all of them")
    bench.add_argument("--prompt-len", type=positive_int, default=96, help="prompt length in tokens (bytes)")
    bench.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens to generate per prompt")
    bench.add_argument("--repeats", type=positive_int, default=3,
                       help="timed passes per case (the CSV has their median and p20 / p80)")
    bench.add_argument("--workers", type=draft_kinds_arg, default=None,
                       help="comma-separated drafts to run beside target-only (acceptance and penalties suites), of "
                            f"{', '.join(DRAFT_KINDS)} (default: every kind the pair offers)")
    bench.add_argument("--shapes", default="auto", choices=["auto", "all", "demo", "first"],
                       help="acceptance suite: every kind's demo shapes and NGRAM's option variants (all), the demo "
                            "shapes only (demo), or each kind's default shape (first); auto: demo for a real target, "
                            "whose steps cost more, all for a shipped pair")
    bench.add_argument("--vocab-sizes", type=positive_int_list, default=None,
                       help="draft-vocab suite: draft vocabularies, most frequent ids first (default: the whole "
                            "vocabulary, 32768, 16384, 8192, 4096)")
    bench.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                       help="also run the transformers peers (acceptance suite, float32, needs the bench extra)")
    bench.add_argument("--dtype", default="float32", choices=list(DTYPES),
                       help="the models' dtype (acceptance suite; greedy agreement with target-only in low "
                            "precision is in the identical_request_fraction column)")
    bench.add_argument("--tuned", action="append", default=None, metavar="PATH",
                       help="a file `specdec tune` wrote for this pair: its draft also runs with the tuned shape per "
                            "batch size and with adaptive speculation (acceptance suite; the shape_policy column); "
                            "repeat it for several drafts")
    bench.add_argument("--out", default="results", help="directory for the CSV and its plot")
    bench.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    bench.add_argument("--device", type=device_choice, default="auto", help=DEVICE_HELP)
    bench.add_argument("--model", default="auto", choices=["auto"] + zoo_names + sorted(zoo.REAL_TARGETS),
                       help=MODEL_HELP + " (acceptance suite; a real target answers held-out chat prompts)")
    if argv[:1] == ["tune"]:
        from .tune import main as tune_main
        return tune_main(argv[1:])
    if argv[:1] == ["gpu-check"]:
        from ..gpu_check.driver import main as gpu_check_main
        return gpu_check_main(argv[1:])
    if argv[:1] == ["zoo"]:
        rest = argv[1:]
        if rest[:1] == ["list"]:
            return _zoo_list()
        if rest[:1] in (["-h"], ["--help"]):
            print(ZOO_HELP)
            return 0
        if rest[:1] == ["train-draft"]:
            from ..zoo.train.for_target import main as train_draft_main
            return train_draft_main(rest[1:]) or 0
        if rest[:1] != ["train"]:
            print(ZOO_HELP, file=sys.stderr)
            return 2
        from ..bench.draft_cost import record_trained_step_costs
        from ..zoo.train import main as train_main
        return train_main(rest[1:], after_training=record_trained_step_costs) or 0
    args = parser.parse_args(argv)
    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    if args.command == "bench" and args.batch_sizes and args.suite == "acceptance":
        too_big = [b for b in args.batch_sizes if b > args.num_prompts]
        if too_big:
            parser.error(f"--batch-sizes {too_big} exceed --num-prompts {args.num_prompts}")
    if args.threads:  # the one place --threads is applied, for every command
        import torch
        torch.set_num_threads(args.threads)
    try:
        return _run(args)
    except KeyboardInterrupt:
        print(f"specdec {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line, no traceback (SPECDEC_TRACEBACK=1 shows it)
        if os.environ.get("SPECDEC_TRACEBACK"):
            raise
        print(f"specdec {args.command}: error: {e}" if isinstance(e, ValueError)
              else f"specdec {args.command}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _zoo_list() -> int:
    """`specdec zoo list`: each shipped pair, its models and their sizes; each real target, where its weights come
    from (an installed package, never a model hub) and the drafts trained for it."""
    from .. import zoo
    for e in zoo.entries():
        if e["kind"] == "pair":
            print(f"{e['name']}: {', '.join(e['models'])} ({e['size_mib']:.1f} MiB on disk, {e['tokenizer']}); "
                  f"directory {e['directory']}")
            continue
        where = f"GGUF {e['source']}" if e["source"] else f"not installed: {e['install']}"
        print(f"{e['name']}: {e['description']}, {e['license']}; {where}; "
              f"drafts: {', '.join(e['drafts']) or 'none yet'}")
    return 0


def _token_map(args) -> int:
    """`specdec token-map`: --model (a zoo entry) or --target (a directory with tokenizer.json), ranked by
    --corpus's token counts or, for a zoo entry without --corpus, by its shipped ranking; the first --size ids
    written to --out."""
    import json
    from pathlib import Path

    import numpy as np

    from .. import zoo
    from ..token_map import rank_token_ids, save_token_map
    from ..tokenizer import load_tokenizer

    if args.model is not None:
        bundle = zoo.load(args.model)
        tokenizer, vocab_size, shipped = bundle.tokenizer, bundle.target.config.vocab_size, bundle.path
    else:
        tokenizer, shipped = load_tokenizer(args.target), None
        vocab_size = int(json.loads((Path(args.target) / "config.json").read_text())["vocab_size"])
    if args.size > vocab_size:
        raise ValueError(f"--size {args.size} exceeds the target's vocabulary of {vocab_size}")
    if args.corpus:
        stream = [t for f in args.corpus for t in tokenizer.encode(Path(f).read_text(encoding="utf-8"))]
        ranking, source = rank_token_ids(stream, vocab_size), f"{len(stream):,} tokens of {len(args.corpus)} file(s)"
    elif shipped is not None and (shipped / "token_ranking.npy").is_file():
        ranking, source = np.load(shipped / "token_ranking.npy").astype(np.int64), "the shipped ranking"
    else:
        raise ValueError("no ranking to read: give --corpus FILE ... (a zoo entry without token_ranking.npy, or "
                         "--target, needs one)")
    path = save_token_map(ranking[:args.size], args.out, vocab_size)
    print(f"wrote {path}: the {args.size:,} most frequent of {vocab_size:,} ids, ranked by {source}")
    return 0


def _run(args) -> int:
    if args.command == "report":
        if args.csv is None:
            from ..bench.results_page import render_page
            print(render_page("."), end="")
            return 0
        from ..bench.report import print_report
        return print_report(args.csv)
    if args.command == "plot":
        from ..bench.plots import plot_all, plot_csv
        written = [plot_csv(c) for c in args.csv] if args.csv else plot_all(args.results)
        for png in filter(None, written):
            print(f"wrote {png}")
        return 0
    if args.command == "generate":
        from .generate import run_generate
        return run_generate(args)
    if args.command == "token-map":
        return _token_map(args)
    if args.command == "bench":
        if args.suite == "kernels":
            from ..bench.kernels import main_kernels
            return main_kernels(args) or 0
        if args.suite == "e2e":
            from ..bench.e2e import main_e2e
            return main_e2e(args) or 0
        if args.suite == "penalties":
            from ..bench.penalties import main_penalties
            return main_penalties(args) or 0
        if args.suite == "draft-vocab":
            from ..bench.draft_vocab import main_draft_vocab
            return main_draft_vocab(args) or 0
        if args.suite == "draft-cost":
            from ..bench.draft_cost import main_draft_cost
            return main_draft_cost(args) or 0
        from ..bench.acceptance import main_bench
        return main_bench(args) or 0
    if args.command == "demo":
        from ..demo import run_demo
        return run_demo(impl=args.impl, max_new_tokens=args.max_new_tokens, num_prompts=args.num_prompts,
                        device=args.device, model=None if args.model == "auto" else args.model) or 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
