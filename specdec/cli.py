"""`specdec` console command: `specdec demo`, `specdec zoo train ...`."""
from __future__ import annotations

import argparse
import sys


THREADS_HELP = ("torch CPU threads (default 1: the shipped models are small enough that one thread is fastest, and "
                "a loaded machine slows one thread least; 0 leaves torch's default)")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="specdec", description="EAGLE-style speculative decoding toolkit")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="decode held-out prompts with target-only, EAGLE and MTP decoding")
    demo.add_argument("--impl", default="auto", choices=["auto", "reference", "fast"])
    demo.add_argument("--max-new-tokens", type=int, default=64)
    demo.add_argument("--num-prompts", type=int, default=2)
    demo.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    sub.add_parser("zoo", help="the shipped checkpoints: `specdec zoo train --help`", add_help=False)
    bench = sub.add_parser("bench", help="acceptance and tokens/s of every worker against target-only; "
                                         "writes a CSV to results/ and its plot")
    bench.add_argument("--suite", default="acceptance", choices=["acceptance", "kernels", "e2e"],
                       help="acceptance: every worker against target-only on the shipped models (default); "
                            "kernels: every op of the decode step, reference / fast / torch.compile, against "
                            "the copy bandwidth (the full B x S+1 x V sweep on CUDA, a corner of it on CPU); "
                            "e2e: every worker, reference / fast / fast + CUDA graphs, tokens/s and the phases "
                            "of a step, on the shipped model and (CUDA) a random 1.2B Llama")
    bench.add_argument("--impl", default="auto", choices=["auto", "reference", "fast"])
    bench.add_argument("--batch-sizes", default=None,
                       help="comma-separated batch sizes (default: 1,4 for acceptance, 1,8,32 for e2e)")
    bench.add_argument("--temperatures", default="0,0.7")
    bench.add_argument("--num-prompts", type=int, default=16)
    bench.add_argument("--prompt-len", type=int, default=96)
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--repeats", type=int, default=3)
    bench.add_argument("--out", default="results")
    bench.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    if argv[:1] == ["zoo"]:
        rest = argv[1:]
        if rest[:1] != ["train"]:
            print("usage: specdec zoo train [options]  (see `specdec zoo train --help`)", file=sys.stderr)
            return 2
        from .zoo.train import main as train_main
        return train_main(rest[1:]) or 0
    args = parser.parse_args(argv)
    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    if args.command == "bench":
        if args.suite == "kernels":
            from .bench_kernels import main_kernels
            return main_kernels(args) or 0
        if args.suite == "e2e":
            from .bench_e2e import main_e2e
            return main_e2e(args) or 0
        from .bench import main_bench
        return main_bench(args) or 0
    if args.command == "demo":
        from .demo import run_demo
        return run_demo(impl=args.impl, max_new_tokens=args.max_new_tokens, num_prompts=args.num_prompts) or 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
