"""`specdec token-map`: a hot-vocabulary token map (SGLang's --speculative-token-map format) from a corpus's counts."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..cli_args import MODEL_PATH_HELP, THREADS_HELP, HelpFormatter, positive_int
from ..token_map import rank_token_ids, save_token_map
from ..tokenizer import load_tokenizer

NAME = "token-map"


def add_parser(subparsers):
    p = subparsers.add_parser(NAME, formatter_class=HelpFormatter,
                              help="write a hot-vocabulary token map (SGLang's --speculative-token-map format): the "
                                   "target's most frequent ids in a corpus",
                              description="Rank the target's ids by their count in a corpus (ties to the lower id) "
                                          "and write the first --size as a token map: torch.save of a list of ids, "
                                          "what SGLang's --speculative-token-map and `specdec generate --token-map` "
                                          "read. Example: specdec token-map --model smollm2-135m-instruct --size "
                                          "32768 --out hot-32k.pt")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", default=None,
                        help=MODEL_PATH_HELP + ": its tokenizer, and for a zoo entry without --corpus the ranking "
                                               "shipped beside its drafts (the target's recorded answers)")
    source.add_argument("--target", default=None, help="a target directory with tokenizer.json (needs --corpus)")
    p.add_argument("--corpus", nargs="+", metavar="FILE", default=None,
                   help="UTF-8 text files whose token counts rank the ids")
    p.add_argument("--size", type=positive_int, required=True, help="how many ids the map keeps")
    p.add_argument("--out", required=True, help="the file to write (.pt)")
    p.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    return p


def run(args) -> int:
    """`specdec token-map`: --model (`zoo.load_model`: a zoo entry, a GGUF file or a model directory) or --target (a
    directory with tokenizer.json), ranked by --corpus's token counts or, for a zoo entry without --corpus, by its
    shipped ranking; the first --size ids written to --out."""

    # lazy: the CLI builds its parser before importing command implementations (the zoo)
    from .. import zoo

    if args.model is not None:
        bundle = zoo.load_model(args.model)
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
