"""`specdec generate`: text in, text out, from checkpoint directories, streamed to the terminal."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from .config import SamplingParams, SpecConfig
from .draft_kinds import DRAFT_KINDS, draft_kind, kind_of
from .engine import Engine
from .text import generate_text
from .tokenizer import eos_ids_of, load_tokenizer


#: the kind an `--draft-layout auto` checkpoint loads as when its architectures name no kind's model: EAGLE-1/2
#: checkpoints are published under several (`EagleDraftHead.from_pretrained` reads them, and names what it
#: expects otherwise)
AUTO_LAYOUT_FALLBACK = "eagle"


def load_draft(target, target_dir: Path, draft_dir: Path | None, layout: str):
    """-> the draft model (None without one) and the SpecConfig its kind suggests (`DraftKind.default_spec`).
    layout: "auto" (the kind whose model's architecture the draft's config.json names), a draft kind's name, or
    "mtp-deepseek" / "mtp-mimo" (MTP layers beside a target's weights)."""
    from .models.io import read_config
    from .models.mtp import mtp_from_target_dir
    if layout in ("mtp-deepseek", "mtp-mimo"):
        draft = mtp_from_target_dir(draft_dir or target_dir, target, layout.removeprefix("mtp-"))
        return draft, kind_of(draft).default_spec(draft)
    if str(draft_dir) == "ngram":  # no weights: an n-gram index over the request (SGLang's NGRAM)
        draft = draft_kind("ngram").untrained_draft()
        return draft, kind_of(draft).default_spec(draft)
    if draft_dir is None:
        if layout != "auto":
            raise ValueError(f"--draft-layout {layout} needs --draft DIR")
        return None, None
    if layout == "auto":
        archs = read_config(draft_dir).get("architectures") or []
        layout = next((k.name for k in DRAFT_KINDS.values()
                       if archs == [getattr(k.model_class(), "architecture", None)]), None)
        if layout is None:
            layout = "draft_lm" if is_causal_lm_dir(draft_dir) else AUTO_LAYOUT_FALLBACK
    draft = draft_kind(layout).load(draft_dir, target)
    return draft, kind_of(draft).default_spec(draft)


def is_causal_lm_dir(path: Path) -> bool:
    """Whether a checkpoint directory holds a whole causal LM (a STANDALONE draft) rather than an EAGLE-1/2 head,
    which is published under the same architecture names: a head has `fc`, an LM has every layer and a norm."""
    from safetensors import safe_open
    keys = set()
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            keys.update(st.keys())
    return "fc.weight" not in keys and "model.norm.weight" in keys and "model.embed_tokens.weight" in keys


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


def run_generate(args) -> int:
    from .models import LlamaForCausalLM
    target_dir = Path(args.target)
    if not target_dir.is_dir():
        raise ValueError(f"--target {target_dir}: no such directory")
    if args.draft not in (None, "ngram") and not Path(args.draft).is_dir():
        raise ValueError(f"--draft {args.draft}: no such directory")
    tokenizer = load_tokenizer(target_dir)
    target = LlamaForCausalLM.from_pretrained(target_dir)
    draft, spec = load_draft(target, target_dir, Path(args.draft) if args.draft else None, args.draft_layout)
    if draft is not None and (args.num_steps or args.topk or args.num_draft_tokens):
        S = args.num_steps or spec.num_steps
        spec = SpecConfig(S, args.topk or spec.topk, args.num_draft_tokens)
    if draft is not None and (args.penalty_mode != spec.penalty_mode or args.draft_grammar):
        spec = SpecConfig(spec.num_steps, spec.topk, spec.num_draft_tokens, penalty_mode=args.penalty_mode,
                          draft_grammar=args.draft_grammar)
    prompt_len = len(tokenizer.encode(args.prompt))
    # room for the in-flight draft slots of the worker that runs (MTP's extend writes up to 2 S past the length)
    margin = 0 if draft is None else kind_of(draft).kv_margin(spec)
    grammar = read_grammar(args)
    engine = Engine(target, draft, spec, impl=args.impl, max_batch=1, tokenizer=tokenizer,
                    max_seq_len=min(target.config.max_position_embeddings, prompt_len + args.max_new_tokens + margin))
    eos = set(eos_ids_of(tokenizer))
    shown = []

    def show(_request, new_ids):
        # decode the whole continuation each time: a multi-byte character can span two steps
        before = tokenizer.decode(shown)
        shown.extend(t for t in new_ids if t not in eos)
        sys.stdout.write(tokenizer.decode(shown)[len(before):])
        sys.stdout.flush()

    sys.stdout.write(args.prompt)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                            frequency_penalty=args.frequency_penalty, presence_penalty=args.presence_penalty,
                            repetition_penalty=args.repetition_penalty, min_new_tokens=args.min_new_tokens,
                            logit_bias=parse_logit_bias(args.logit_bias), **grammar)
    t0 = time.perf_counter()
    out = generate_text(engine, tokenizer, [args.prompt], params, seed=args.seed, stream=show)[0]
    wall = time.perf_counter() - t0
    stats = engine.last_stats
    n = len(out.output.token_ids)
    what = "target-only" if draft is None else f"{type(draft).__name__} {spec}"
    print(f"\n\n[{what}, impl={engine.impl}] {n} tokens in {wall:.2f} s ({n / wall:.1f} tokens/s), "
          f"{stats.mean_accept_len:.2f} accepted per step, finish: {out.output.finish_reason}")
    return 0
