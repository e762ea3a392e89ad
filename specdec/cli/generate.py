"""`specdec generate`: text in, text out, from a zoo pair or checkpoint directories, streamed to the terminal, then
the same request target-only beside it."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ..config import SamplingParams, SpecConfig
from ..draft_kinds import DRAFT_KINDS, draft_kind, kind_of
from ..engine import Engine
from ..tokenizer import eos_ids_of, load_tokenizer
from .. import tuning
from ..tuning import shape_name, shape_spec, shipped_files, TunedSpec
from ..cli_args import IMPL_HELP, MODEL_PATH_HELP, THREADS_HELP, HelpFormatter, confidence_threshold, positive_int
from ..models.mtp import mtp_from_target_dir
from ..models import LlamaForCausalLM

NAME = "generate"


def load_draft(target, target_dir: Path, draft_dir: Path | None, layout: str):
    """-> the draft model (None without one) and the SpecConfig its kind suggests (`DraftKind.default_spec`).
    layout: "auto" (the kind whose model's architecture the draft's config.json names: `zoo.draft_kind_of_dir`), a
    draft kind's name, or "mtp-deepseek" / "mtp-mimo" (MTP layers beside a target's weights). A draft whose
    config.json names another target's fingerprint is refused (`zoo.load_draft_for`)."""
    # lazy: the CLI builds its parser before importing command implementations (the zoo)
    from .. import zoo
    if layout in ("mtp-deepseek", "mtp-mimo"):
        draft = mtp_from_target_dir(draft_dir or target_dir, target, layout.removeprefix("mtp-"))
        return draft, kind_of(draft).default_spec(draft)
    if str(draft_dir) in untrained_kinds():  # no weights: a draft of parameters only (NGRAM, SUFFIX)
        draft = draft_kind(str(draft_dir)).untrained_draft()
        return draft, kind_of(draft).default_spec(draft)
    if draft_dir is None:
        if layout != "auto":
            raise ValueError(f"--draft-layout {layout} needs --draft DIR")
        return None, None
    if layout == "auto":
        layout = zoo.draft_kind_of_dir(draft_dir)
    draft = zoo.load_draft_for(layout, draft_dir, target)
    return draft, kind_of(draft).default_spec(draft)


def untrained_kinds() -> list[str]:
    """The kinds whose drafts need no weights, which `--draft` names instead of a directory."""
    return [k.name for k in DRAFT_KINDS.values() if k.untrained]


def parse_logit_bias(items: list[str]) -> dict[int, float] | None:
    """["ID=BIAS", ...] -> {ID: BIAS} (None when empty); a malformed item is a ValueError naming it."""
    bias = {}
    for item in items:
        token, sep, value = item.partition("=")
        try:
            bias[int(token)] = float(value)
        except ValueError:
            raise ValueError(f"--logit-bias {item!r}: expected ID=BIAS, e.g. 10=-2.5") from None
        if not sep:
            raise ValueError(f"--logit-bias {item!r}: expected ID=BIAS, e.g. 10=-2.5")
    return bias or None


def read_grammar(args) -> dict:
    """--json-schema FILE / --regex R / --ebnf FILE -> the SamplingParams field it sets ({} for none)."""
    if args.regex is not None:
        return {"regex": args.regex}
    for flag, name in (("json_schema", "json_schema"), ("ebnf", "ebnf")):
        path = getattr(args, flag)
        if path is not None:
            try:
                return {name: Path(path).read_text()}
            except OSError as e:
                raise ValueError(f"--{flag.replace('_', '-')} {path}: {e.strerror}") from None
    return {}


def measured_default(bundle):
    """The draft kind and shape `specdec generate --model` decodes with when --draft names none: of the pair's
    tuned files (`specdec tune`), the one whose batch-size-1 shape measured the largest speed-up over target-only
    in its own run (accepted tokens per step over the step's cost against target-only's step, both measured by
    that run) -> (kind, SpecConfig), or (None, why) where no tuned file measured a draft faster than target-only."""
    best, best_gain = None, 1.0
    for (pair, kind), path in sorted(tuning.shipped_files().items()):
        if pair != bundle.name or getattr(bundle, kind) is None:
            continue
        bucket = tuning.TunedSpec.load(path).bucket(1)
        measured = {c.shape: c for c in bucket.candidates}
        chosen, alone = measured.get(bucket.shape), measured.get(tuning.NO_DRAFT)
        if bucket.shape == tuning.NO_DRAFT or chosen is None or alone is None:
            continue
        gain = chosen.mean_accept_len / chosen.step_ms * alone.step_ms
        if gain > best_gain:
            best, best_gain = (kind, tuning.shape_spec(bucket.shape)), gain
    if best is None:
        return None, (f"no draft of {bundle.name!r} is measured faster than target-only at batch size 1 (no tuned "
                      f"file says so: `specdec tune`); decoding target-only")
    return best


def zoo_draft(bundle, kind: str | None):
    """A --model bundle and a --draft value (a kind's name, "none", a draft directory, or None for the measured
    default, `measured_default`) -> (its draft or None, the SpecConfig to run it with: the pair's tuned shape at batch
    size 1 where a tuned file ships, else the kind's default; a note for the user or None). A directory
    (`zoo.add_drafts`: one draft, or train-draft's --out) runs its draft, or the first of its drafts in the kinds'
    order."""
    # lazy: the CLI builds its parser before importing command implementations (the zoo)
    from .. import zoo
    if kind == "none":
        return None, None, None
    if kind is None:
        kind, spec = measured_default(bundle)
        if kind is None:
            return None, None, f"note: {spec}"
        return getattr(bundle, kind), spec, None
    if kind not in DRAFT_KINDS and Path(kind).is_dir():
        added = sorted(zoo.add_drafts(bundle, kind), key=list(DRAFT_KINDS).index)
        draft = bundle.drafts[added[0]]
        note = None if len(added) == 1 else (f"note: {kind} holds the drafts {', '.join(added)}; decoding with "
                                             f"{added[0]} (--draft {Path(kind) / added[1]} runs another)")
        return draft, kind_of(draft).default_spec(draft), note
    if kind not in DRAFT_KINDS:
        raise ValueError(f"--draft {kind!r}: with --model, a draft kind ({', '.join(DRAFT_KINDS)}), none, or a draft "
                         f"directory")
    draft = getattr(bundle, kind)
    if draft is None:
        shipped = ", ".join(k for k, d in bundle.drafts.items() if d is not None) or "none"
        raise ValueError(f"--draft {kind}: zoo pair {bundle.name!r} ships no {kind} draft (it ships: {shipped})")
    tuned = shipped_files().get((bundle.name, kind))
    if tuned is not None:
        spec = shape_spec(TunedSpec.load(tuned).bucket(1).shape)
        if spec is not None:  # the tuned file may say that batch size 1 is best served without drafting
            return draft, spec, None
    return draft, kind_of(draft).default_spec(draft), None


def is_instruct(name: str, card: dict) -> bool:
    """Whether a model was tuned to follow its chat template: its zoo card says so (`instruct`), else its name (a
    zoo pair's, or the target directory's) says Instruct or chat. The zoo's byte pairs were trained on raw code."""
    if "instruct" in card:
        return bool(card["instruct"])
    return any(word in Path(name).name.lower() for word in ("instruct", "chat"))


def chat_prompt_ids(tokenizer, prompt: str, use_template: bool) -> list[int]:
    """The prompt's ids: through the tokenizer's chat template as one user turn (with the assistant's opening)
    where it has one and `use_template`, else the text as the tokenizer encodes it."""
    if use_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=False)
        return tokenizer.encode(text, add_special_tokens=False)  # the template writes the special tokens itself
    return tokenizer.encode(prompt)


def load_models(args):
    """--model / --target, --draft, --draft-layout -> (name, target, tokenizer, draft or None, its SpecConfig,
    whether the target is an instruct model)."""
    if args.target is None:
        # lazy: the CLI builds its parser before importing command implementations (the zoo)
        from .. import zoo
        if args.draft_layout != "auto":
            raise ValueError("--draft-layout reads --draft DIR with --target; with --model, --draft names a kind or "
                             "a directory train-draft wrote")
        bundle = zoo.load_model(args.model or zoo.DEFAULT_NAME)
        draft, spec, note = zoo_draft(bundle, args.draft)
        if note:
            print(note, file=sys.stderr)
        return bundle.name, bundle.target, bundle.tokenizer, draft, spec, is_instruct(bundle.name, bundle.card)
    target_dir = Path(args.target)
    if not target_dir.is_dir():
        raise ValueError(f"--target {target_dir}: no such directory")
    if args.draft not in (None, "none", *untrained_kinds()) and not Path(args.draft).is_dir():
        raise ValueError(f"--draft {args.draft}: no such directory")
    tokenizer = load_tokenizer(target_dir)
    target = LlamaForCausalLM.from_pretrained(target_dir)
    draft_dir = None if args.draft in (None, "none") else Path(args.draft)
    draft, spec = load_draft(target, target_dir, draft_dir, args.draft_layout)
    return str(target_dir), target, tokenizer, draft, spec, is_instruct(str(target_dir.resolve()), {})


def spec_name(spec: SpecConfig) -> str:
    return shape_name((spec.num_steps, spec.topk, spec.num_draft_tokens))


def timed_generate(engine, ids, params, seed, stream=None) -> tuple:
    """-> (the one output, process CPU seconds, wall seconds) of decoding `ids`."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = engine.generate([ids], params, seed=seed, stream=stream)[0]
    return out, time.process_time() - c0, time.perf_counter() - t0


def summary(what: str, engine, out, cpu_s: float, wall_s: float) -> str:
    n = len(out.token_ids)
    return (f"[{what}, impl={engine.impl}] {n} tokens: {n / cpu_s:.1f} tokens/s by CPU time, {n / wall_s:.1f} by "
            f"wall time; {engine.last_stats.mean_accept_len:.2f} accepted per step; finish: {out.finish_reason}")


def run(args) -> int:
    name, target, tokenizer, draft, spec, instruct = load_models(args)
    if args.confidence_threshold is not None:
        if draft is None or not kind_of(draft).stops_chains:
            capped = " or ".join(k.label for k in DRAFT_KINDS.values() if k.stops_chains)
            what = "target-only decoding" if draft is None else f"the {kind_of(draft).label} draft"
            raise ValueError(f"--confidence-threshold {args.confidence_threshold:g}: a {capped} draft's option, not "
                             f"{what}'s")
        draft.confidence_threshold = args.confidence_threshold
    if draft is not None and (args.num_steps or args.topk or args.num_draft_tokens):
        spec = SpecConfig(args.num_steps or spec.num_steps, args.topk or spec.topk, args.num_draft_tokens)
    if draft is not None and (args.penalty_mode != spec.penalty_mode or args.draft_grammar):
        spec = SpecConfig(spec.num_steps, spec.topk, spec.num_draft_tokens, penalty_mode=args.penalty_mode,
                          draft_grammar=args.draft_grammar)
    chat = args.chat_template == "yes" or (args.chat_template == "auto" and instruct)
    ids = chat_prompt_ids(tokenizer, args.prompt, chat)
    # room for the in-flight draft slots of the worker that runs (MTP's extend writes up to 2 S past the length)
    margin = 0 if draft is None else kind_of(draft).kv_margin(spec)
    max_seq_len = min(target.config.max_position_embeddings, len(ids) + args.max_new_tokens + margin)
    eos = eos_ids_of(tokenizer)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                            frequency_penalty=args.frequency_penalty, presence_penalty=args.presence_penalty,
                            repetition_penalty=args.repetition_penalty, min_new_tokens=args.min_new_tokens,
                            logit_bias=parse_logit_bias(args.logit_bias), stop_token_ids=eos,
                            **read_grammar(args))
    engine = Engine(target, draft, spec, impl=args.impl, max_batch=1, tokenizer=tokenizer, max_seq_len=max_seq_len,
                    token_map=args.token_map)
    baseline = None
    if draft is not None and not args.no_baseline:
        baseline = Engine(target, impl=args.impl, max_batch=1, tokenizer=tokenizer, max_seq_len=max_seq_len)
    for warm in filter(None, (engine, baseline)):  # first calls pay one-time costs the comparison should not
        warm.generate([ids], SamplingParams(max_new_tokens=2), seed=args.seed)
        warm.flush_cache()  # an NGRAM index forgets the warm-up
    shown = []
    eos_set = set(eos)

    def show(_request, new_ids):
        # decode the whole continuation each time: a multi-byte character can span two steps
        before = tokenizer.decode(shown)
        shown.extend(t for t in new_ids if t not in eos_set)
        sys.stdout.write(tokenizer.decode(shown)[len(before):])
        sys.stdout.flush()

    sys.stdout.write(args.prompt + ("\n" if chat and getattr(tokenizer, "chat_template", None) else ""))
    out, cpu_s, wall_s = timed_generate(engine, ids, params, args.seed, stream=show)
    what = "target-only" if draft is None else f"{kind_of(draft).name}: {type(draft).__name__} {spec_name(spec)}"
    print("\n\n" + summary(what, engine, out, cpu_s, wall_s))
    if baseline is None:
        return 0
    base, base_cpu_s, base_wall_s = timed_generate(baseline, ids, params, args.seed)
    print(summary("target-only", baseline, base, base_cpu_s, base_wall_s))
    if params.temperature == 0:
        same = "yes" if base.token_ids == out.token_ids else "NO"
    else:  # lossless in distribution: a sampled request draws another path through the RNG than target-only's
        same = f"not compared (sampled at temperature {params.temperature:g})"
    print(f"speculative against target-only: {base_cpu_s / cpu_s:.2f}x by CPU time, {base_wall_s / wall_s:.2f}x by "
          f"wall time; identical tokens: {same}")
    if base.token_ids != out.token_ids:
        print("--- target-only output ---\n" + tokenizer.decode([t for t in base.token_ids if t not in eos_set]))
    return 0


def add_parser(subparsers):
    p = subparsers.add_parser(NAME, formatter_class=HelpFormatter,
                              help="decode a prompt (text) with a zoo pair or checkpoint directories, streaming the "
                                   "continuation, then the same request target-only for comparison",
                              description="Decode one prompt speculatively, printing the continuation as it is "
                                          "produced, then decode it again target-only with the same sampling "
                                          "parameters and print both runs' tokens/s (process CPU time and wall "
                                          "time), tokens accepted per step, and whether the tokens are identical. "
                                          "Example: specdec generate --model stdlib-byte-24l --draft eagle3 'def "
                                          "parse_args('")
    p.add_argument("prompt", help="the prompt, as text")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model", default=None, help=MODEL_PATH_HELP + "; its target, and its draft of the kind "
                                                                         "--draft names. Without --model and "
                                                                         "--target, the deep pair")
    source.add_argument("--target", default=None, help="the target's directory (config.json, safetensors, "
                                                       "tokenizer.json), instead of --model")
    p.add_argument("--draft", default=None,
                   help=f"with --model: the pair's draft of this kind, one of {', '.join(DRAFT_KINDS)}, or a draft "
                        "directory `specdec zoo train-draft` wrote for this target (refused for another target) "
                        "(default: the kind and shape its tuned files measured fastest at batch size 1, or "
                        "target-only with a note where none measured a draft faster). With --target: the draft's "
                        "directory (a head, MTP layers, or a small causal LM of the target's vocabulary: "
                        "STANDALONE; for mtp-deepseek / mtp-mimo the directory holding the MTP layers, by default "
                        f"the target's), or a kind that needs no weights ({', '.join(untrained_kinds())}: "
                        "SGLang's NGRAM, vLLM's suffix decoding); none decodes target-only")
    p.add_argument("--draft-layout", default="auto",
                   choices=["auto", *(k for k in DRAFT_KINDS if k not in untrained_kinds()), "mtp-deepseek",
                            "mtp-mimo"],
                   help="how to read --draft DIR (with --target); auto: from the draft's config.json and weights "
                        "(this project's heads, an EAGLE-1/2 or an EAGLE-3 checkpoint, MTP layers, a causal LM)")
    p.add_argument("--num-steps", type=positive_int, default=None,
                   help="draft depth S (default: with --model, the shape tuned for the pair and kind at batch "
                        "size 1 where one ships; else 5 for EAGLE heads, the layer count for MTP)")
    p.add_argument("--topk", type=positive_int, default=None,
                   help="draft top-K per step (default: the tuned shape's, else 4 for EAGLE)")
    p.add_argument("--num-draft-tokens", type=positive_int, default=None,
                   help="tree size W, root included (default: the tuned shape's, else 16 for EAGLE, S+1 for "
                        "chains)")
    p.add_argument("--confidence-threshold", type=confidence_threshold, default=None,
                   help="a DSpark draft's confidence threshold in [0, 1] (0: its whole block verified; default: the "
                        "drafter's own)")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the target-only run that follows the speculative one")
    p.add_argument("--chat-template", default="auto", choices=["auto", "yes", "no"],
                   help="send the prompt as a user turn of the tokenizer's chat template; auto: where the tokenizer "
                        "has one and the model is an instruct model (its zoo card says so, or its name has "
                        "'instruct' or 'chat'; not the byte pairs, trained on raw code)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens to generate")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="in [-2, 2]: minus this per occurrence "
                                                                         "in the output")
    p.add_argument("--presence-penalty", type=float, default=0.0, help="in [-2, 2]: minus this once a token is out")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 0, 1 off: prompt and output tokens' logits divided (positive) or multiplied (negative)")
    p.add_argument("--min-new-tokens", type=int, default=0, help="hold the end-of-sequence ids back until this "
                                                                "many tokens are out")
    p.add_argument("--logit-bias", action="append", default=[], metavar="ID=BIAS",
                   help="add BIAS to token ID's logit (repeatable)")
    p.add_argument("--penalty-mode", default="exact", choices=["exact", "sglang"],
                   help="exact: each tree node penalised along its own path (lossless); sglang: every node as "
                        "the root, SGLang's approximation")
    grammar = p.add_mutually_exclusive_group()
    grammar.add_argument("--json-schema", metavar="FILE", default=None,
                         help="constrain the output to JSON of this JSON schema (needs the grammar extra: xgrammar)")
    grammar.add_argument("--regex", metavar="R", default=None, help="constrain the output to this regular expression")
    grammar.add_argument("--ebnf", metavar="FILE", default=None,
                         help="constrain the output to this EBNF grammar (xgrammar's syntax, root ::= ...)")
    p.add_argument("--draft-grammar", action="store_true",
                   help="mask the draft's proposals by the grammar too (more tokens per step, same output)")
    p.add_argument("--token-map", metavar="FILE", default=None,
                   help="an EAGLE or STANDALONE draft proposes only these target ids, its LM head restricted to "
                        "their rows (SGLang's --speculative-token-map: a torch.save'd list of ids; `specdec "
                        "token-map` writes one). Same output; acceptance and draft cost may change")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--impl", default="auto", choices=["auto", "reference", "fast"], help=IMPL_HELP)
    p.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    return p
