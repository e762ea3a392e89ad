"""`specdec tune`'s command line: the arguments, the estimate it prints before it starts, the prompts it tunes on
(a prompt file's, or the model's held-out set: chat prompts for a model with a chat template, code for a byte pair;
`specdec.prompt_sets`), and the run (`tune`, `check_grid`)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from ..tuning import TunedSpec, names_a_pair, shipped_file
from ..cli_args import about, add_prompt_arguments, DRAFT_DIR_HELP, MODEL_HELP, THREADS_HELP, HelpFormatter
from ..bench.common import Run, above_bar, cpu_model, progress_bar, target_only_batch_seconds, DTYPES, write_csv
from ..bench.tune.check import check_grid, mixed_prompts, sampled_prompts
from ..bench.tune.search import CHECK_SETS, Measurer, candidate_shapes, planned_decodes, tune
from ..draft_kinds import DRAFT_KINDS, draft_kind


NAME = "tune"
#: The rest of the command line goes to `main`'s own parser (in args.argv).
OWN_PARSER = True


def add_parser(subparsers):
    return subparsers.add_parser(NAME, add_help=False,
                                 help="measure the best speculative shape per batch size for a pair on this machine "
                                      "and write the JSON the engine loads (`Engine(..., spec='tuned:PATH')`; "
                                      "`specdec tune --help`)")


def run(args) -> int:
    return main(args.argv)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="specdec tune", formatter_class=HelpFormatter,
                                description="Measure the best speculative shape (num_steps, topk, num_draft_tokens) "
                                            "of a zoo pair's draft on this machine, per batch size, and write the "
                                            "JSON the engine loads (Engine(..., spec='tuned:PATH') or "
                                            "'adaptive:PATH'). Prints how long the run will take before it starts. "
                                            "Example: specdec tune --kind eagle3 --batch-sizes 1,4")
    p.add_argument("--model", default="auto",
                   help=MODEL_HELP + " (a model with a chat template tunes on chat prompts)")
    p.add_argument("--draft", action="append", default=None, metavar="DIR", help=DRAFT_DIR_HELP)
    p.add_argument("--kind", default="eagle", choices=list(DRAFT_KINDS),
                   help="the pair's draft to tune: a kind that switches shapes (eagle, eagle3, draft_lm, ngram, "
                        "suffix)")
    p.add_argument("--batch-sizes", default="1,16", help="comma-separated batch sizes, one tuned shape each")
    p.add_argument("--num-prompts", type=int, default=32,
                   help="tuning prompts: those after the first N of --prompts (or of the held-out set), whose first N "
                        "the grid check and `specdec bench` decode; with 16 the shape chosen at B=16 did not carry "
                        "over to other prompts")
    p.add_argument("--acceptance-prompts", type=int, default=4, help="of them, how many measure acceptance at B=1")
    p.add_argument("--prompt-len", type=int, default=96,
                   help="a byte pair's held-out code prompts, cut to this many tokens (bytes) at a line end")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens to generate per prompt")
    p.add_argument("--max-steps", type=int, default=6, help="the deepest draft (num_steps) among the candidates")
    p.add_argument("--confirm", type=int, default=3, help="best predicted shapes measured per batch size")
    p.add_argument("--repeats", type=int, default=1, help="passes per confirmed shape (median)")
    p.add_argument("--check-grid", action="store_true",
                   help="also decode the 12-shape grid, the tuned shape and adaptive speculation on the evaluation "
                        "prompts (the first --num-prompts), side by side")
    p.add_argument("--check-repeats", default="3",
                   help="the grid check's passes: one count for every batch size, or one per batch size of "
                        "--batch-sizes")
    p.add_argument("--check-sets", default="code,mixed,sampled",
                   help="the grid check's prompt sets (the evaluation prompts), comma-separated: code (the prompts "
                        "as they are); mixed (those alternating with English prose no model saw); sampled (those, "
                        "every other request sampled at temperature 1)")
    p.add_argument("--check-tuned", default=None, metavar="PATH",
                   help="check the tuned file PATH against the grid (as --check-grid) without tuning again; a pair's "
                        "name checks the file shipped for it and --kind (specdec/zoo/tuned/)")
    p.add_argument("--out", default=None, help="the tuned JSON (default: results/tuned-<pair>-<kind>.json)")
    p.add_argument("--results", default="results", help="where the CSV and its plot go")
    p.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    p.add_argument("--dtype", default="float32", choices=list(DTYPES), help="the models' dtype")
    add_prompt_arguments(p)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        sizes = [int(x) for x in a.batch_sizes.split(",")]
        if any(s < 1 for s in sizes):
            raise ValueError
    except ValueError:
        p.error(f"--batch-sizes must be comma-separated integers >= 1, got {a.batch_sizes!r}")
    if max(sizes) > a.num_prompts:
        p.error(f"--batch-sizes {max(sizes)} exceeds --num-prompts {a.num_prompts}")
    try:
        a.check_repeats = [int(x) for x in a.check_repeats.split(",")]
        if any(r < 1 for r in a.check_repeats) or len(a.check_repeats) not in (1, len(sizes)):
            raise ValueError
    except ValueError:
        p.error(f"--check-repeats must be one count >= 1 or one per bucket of --batch-sizes {sizes}, "
                f"got {a.check_repeats!r}")
    a.check_repeats = a.check_repeats * len(sizes) if len(a.check_repeats) == 1 else a.check_repeats
    unknown = [x for x in a.check_sets.split(",") if x not in CHECK_SETS]
    if unknown:
        p.error(f"--check-sets: unknown prompt set(s) {unknown}; choose among {list(CHECK_SETS)}")
    try:
        return _tune_command(a, sizes)
    except ValueError as e:  # one line, as every specdec command
        print(f"specdec tune: error: {e}", file=sys.stderr)
        return 1


def estimate(target, prompts, planned: dict, max_new_tokens: int) -> str:
    """The line `specdec tune` prints before it starts: its batch decodes and how long they will take, each priced at
    what target-only takes for it on this machine, measured now (`target_only_batch_seconds`)."""
    seconds = target_only_batch_seconds(target, prompts, sorted(planned), max_new_tokens)
    total = sum(n * seconds[B] for B, n in planned.items())
    per_size = ", ".join(f"{n} at B={B}" for B, n in sorted(planned.items()))
    return (f"estimate: {about(total)} for at most {sum(planned.values())} batch decodes of {max_new_tokens} tokens "
            f"({per_size}), each priced at what target-only takes for it here, measured just now (a drafting shape "
            f"usually runs faster); --num-prompts, --max-new-tokens, --batch-sizes and --check-repeats shorten it")


def _prompts(bundle, a, skip: int) -> list[list[int]]:
    """The --num-prompts prompts after the first `skip` of --prompts (of --categories, --turns) or of the model's
    held-out set, as ids (`specdec.prompt_sets.load_requests`)."""
    # lazy: the CLI builds its parser before importing command implementations (the zoo)
    from ..prompt_sets import load_requests
    return [r.ids for r in load_requests(bundle, a.prompts, a.categories, a.turns, a.num_prompts, skip=skip,
                                         prompt_len=a.prompt_len, max_new_tokens=a.max_new_tokens)]


def _tune_command(a, sizes) -> int:
    # lazy: the CLI builds its parser before importing command implementations (the zoo, the report's pandas)
    from .. import zoo
    from ..zoo.corpus import prose_prompts

    kind = draft_kind(a.kind)
    if not hasattr(kind.worker_class(), "use_shape"):
        raise ValueError(f"draft kind {a.kind!r} runs on {kind.worker_class().__name__}, which keeps one shape for a "
                         f"whole run: tune a kind that switches shapes (eagle, eagle3, draft_lm, ngram, suffix)")
    name = zoo.speed_pair() if a.model == "auto" else a.model
    bundle = zoo.load_model(name, dtype=DTYPES[a.dtype], drafts=a.draft or ())
    draft = getattr(bundle, a.kind, None)
    if draft is None:
        raise ValueError(f"{name!r} has no {a.kind!r} draft" + ("" if name in zoo.names() else
                                                                " (--draft DIR gives one)"))
    # tuning prompts after the evaluation ones, which the grid check and `specdec bench` decode
    prompts = _prompts(bundle, a, skip=a.num_prompts)
    run = Run("tune", bundle.target.device)
    shapes = [] if a.check_tuned else candidate_shapes(a.max_steps)
    check_sets = a.check_sets.split(",") if a.check_grid or a.check_tuned else []
    planned = planned_decodes(shapes, sizes, a.num_prompts, a.acceptance_prompts, a.confirm, a.repeats,
                              a.check_repeats if check_sets else (), len(check_sets))
    print(estimate(bundle.target, prompts, planned, a.max_new_tokens))
    bar = progress_bar(sum(planned.values()), "tune", unit="batch")
    say = above_bar(print)
    t0 = time.monotonic()
    if a.check_tuned:
        # the grid check alone, of a tuned file written earlier (its pair and draft checked by the engine)
        if names_a_pair(a.check_tuned):
            a.check_tuned = str(shipped_file(a.check_tuned, a.kind))
        tuned = TunedSpec.load(a.check_tuned)
        print(f"specdec tune: checking {a.check_tuned} ({name} with its {a.kind} draft), buckets {sizes}, "
              f"{torch.get_num_threads()} thread(s), {cpu_model()}")
        rows = []
        m = Measurer(bundle.target, draft, max(len(p) for p in prompts) + a.max_new_tokens + 64, a.max_new_tokens,
                     bar=bar)
    else:
        print(f"specdec tune: {name} with its {a.kind} draft, {len(candidate_shapes(a.max_steps))} shapes, buckets "
              f"{sizes}, {torch.get_num_threads()} thread(s), {cpu_model()}")
        tuned, rows, m = tune(bundle.target, draft, prompts, sizes, a.max_new_tokens, candidate_shapes(a.max_steps),
                              a.confirm, a.repeats, model_name=name, progress=say, run=run,
                              acceptance_prompts=a.acceptance_prompts, bar=bar)
        written = Path(a.out or Path(a.results) / f"tuned-{Path(name).stem}-{a.kind}.json")
        tuned.save(written)
    if a.check_grid or a.check_tuned:
        code = _prompts(bundle, a, skip=0)
        mixed = mixed_prompts(code, prose_prompts(a.num_prompts, a.prompt_len, seed=0))[:a.num_prompts]
        sets = {"code": code, "mixed": mixed, "sampled": sampled_prompts(code, m.params)}
        check_grid(m, tuned, {k: sets[k] for k in check_sets}, sizes, a.check_repeats, rows, run, name, progress=say)
    bar.close()
    csv = write_csv(rows, a.results, f"tune-{run.run_id}.csv")
    from ..bench.report.plots import plot_csv
    png = plot_csv(csv)  # committed beside its CSV, as every bench's plot is
    print(f"wrote {'' if a.check_tuned else f'{written}, '}{csv} and {png} in {time.monotonic() - t0:.0f} s")
    return 0



if __name__ == "__main__":
    sys.exit(main())
