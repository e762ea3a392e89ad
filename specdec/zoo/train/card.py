"""The model card: card.json beside the weights (read, written, the models' shape summaries) and its
Markdown rendering, MODEL_CARD.md."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from ...draft_kinds import DRAFT_KINDS
from .. import SMALL_NAME, WEIGHTS_DIR
from .hparams import DRAFTS, EXTRA_STAGES


#: the shipped pairs' rendered cards
MODEL_CARD = WEIGHTS_DIR.parent / "MODEL_CARD.md"


def card_path(out: Path, name: str) -> Path:
    return out / name / "card.json"


def read_card(out: Path, name: str) -> dict:
    p = card_path(out, name)
    return json.loads(p.read_text()) if p.is_file() else {}


def write_card(out: Path, name: str, card: dict) -> None:
    p = card_path(out, name)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(card, indent=2, sort_keys=False) + "\n")


def shape_summary(cfg) -> dict:
    keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "rope_theta", "tie_word_embeddings"]
    d = {k: getattr(cfg, k) for k in keys}
    if hasattr(cfg, "chain_hidden_states"):
        d["chain_hidden_states"] = cfg.chain_hidden_states
    for extra in ("draft_vocab_size", "feature_layers", "block_size", "target_layer_ids",  # EAGLE-3, DFlash
                  "markov_rank"):  # DSpark
        if hasattr(cfg, extra):
            d[extra] = getattr(cfg, extra)
    return d


def why_this_shape(card: dict) -> str:
    """The model card's paragraph on why the target has its shape."""
    target = card.get("models", {}).get("target", {})
    if card.get("name") == SMALL_NAME or target.get("num_hidden_layers", 6) <= 6:
        return ("Why this size: the ~20 MB cap on what ships binds first, since eight draft decoder layers of the "
                "target's width ship beside it (1 EAGLE + 1 EAGLE-3 + 3 + 3 MTP); hidden 256 with 6 layers fits "
                "(the target in float16, the drafts' matrices in int8), trains in about 18 minutes at ~8k bytes/s "
                "on two cores (about one pass over the train split), and leaves the target six times as deep as "
                "one draft step, so drafting stays cheap relative to verifying. On this pair one draft step costs "
                "about a quarter of a target step, so it bounds what speculation can gain far below real pairs.")
    cost = card.get("draft_step_cost", {})
    measured = (f" Measured on the trained pair (B = 1, {cost.get('threads')} thread, process CPU time, "
                f"`specdec.bench.draft_step_cost`): a target-only decode step {cost.get('target_only_step_ms')} ms, "
                f"one EAGLE draft step {cost.get('eagle_draft_forward_ms')} ms, i.e. "
                f"{cost.get('draft_forward_in_target_only_steps')} of a target step."
                if cost else "")
    return (f"Why this shape: a deep, narrow target ({target.get('num_hidden_layers')} layers at hidden "
            f"{target.get('hidden_size')}, about the small pair's parameter count) so that one draft decoder "
            f"layer costs a small fraction of a target step, as real drafts do beside their targets (an EAGLE-3 "
            f"head beside Llama-3.1-8B, one MTP layer beside a 36- to 61-layer model)." + measured)


def render_model_cards(cards: list[dict]) -> str:
    """MODEL_CARD.md: every shipped pair's card, the small pair first."""
    return "\n\n".join(render_model_card(c) for c in sorted(cards, key=lambda c: c.get("name") != SMALL_NAME))


def render_model_card(card: dict) -> str:
    """The human-readable model card (Markdown) of one card.json."""
    tr, ho, mo = card.get("training", {}), card.get("heldout", {}), card.get("models", {})
    c = card.get("corpus", {})
    lines = [f"# `{card['name']}`", "",
             "Tiny checkpoints trained on real text, shipped so that speculative decoding can be studied with "
             "drafts that actually agree with their target. Load with `specdec.zoo.load(%r)`." % card["name"], "",
             "## Corpus", "",
             f"- {c.get('source')} (Python {c.get('python')}); files sorted by relative path.",
             f"- Excluded directories: {', '.join(c.get('excluded_dirs', []))}; excluded files: "
             f"{', '.join(c.get('excluded_files', []))}.",
             f"- Split {c.get('split')}.",
             f"- Train: {c.get('train', {}).get('files')} files, {c.get('train', {}).get('bytes'):,} bytes; "
             f"held out: {c.get('heldout', {}).get('files')} files, {c.get('heldout', {}).get('bytes'):,} bytes "
             f"(content digests {c.get('train', {}).get('sha256')} / {c.get('heldout', {}).get('sha256')}).",
             "- Tokenizer: bytes (ids 0-255), BOS = 256, EOS = 257 (vocab 258); every file ends with EOS.", "",
             "## Models", "", why_this_shape(card), "",
             "| model | what | parameters | layers | hidden | intermediate | heads (kv) | train steps | tokens seen | "
             "train time | on disk |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in ("target",) + DRAFTS + EXTRA_STAGES:
        if k not in mo:
            continue
        m, t = mo[k], tr.get(k, {})
        # a field the card lacks reads None, as the table's other cells do
        what = ("Llama-architecture byte LM" if k == "target"
                else DRAFT_KINDS[k].zoo.card_text.format_map(defaultdict(lambda: None, m)))
        lines.append(f"| `{k}` | {what} | {m['parameters']:,} | {m['num_hidden_layers']} | {m['hidden_size']} | "
                     f"{m['intermediate_size']} | {m['num_attention_heads']} ({m['num_key_value_heads']}) | "
                     f"{t.get('steps')} | {t.get('tokens_seen', 0):,} | {t.get('train_seconds', 0) / 60:.1f} min | "
                     f"{t.get('bytes_on_disk', 0) / 1e6:.2f} MB |")
    stages = [(name, t) for name, t in tr.items() if isinstance(t, dict)]
    default_threads = card.get("environment", {}).get("torch_threads")  # stages trained before it was recorded
    threads = sorted({t.get("torch_threads") or default_threads for _, t in stages} - {None}) or [default_threads]
    fp32 = [f"`{name}`" for name, t in stages if t.get("bf16_autocast") is False]
    lines += ["", f"Total training time: {card.get('total_train_seconds', 0) / 60:.1f} min on "
              f"{card.get('environment', {}).get('cpu_count')} CPU cores "
              f"({' or '.join(map(str, threads))} torch threads, bf16 autocast, fp32 master weights"
              + (f"; {', '.join(fp32)} in fp32" if fp32 else "")
              + f"); total on disk {card.get('total_bytes_on_disk', 0) / 1e6:.1f} MB "
              f"(stored: {card.get('stored_dtype')}; loaded as fp32).", ""]
    for name, r in [(name, t["regen_data"]) for name, t in stages if t.get("regen_data")]:
        lines += [f"`{name}` trained on the target's own text, not corpus windows: {r['segments']:,} segments of "
                  f"{r['segment_len']} tokens, each a train-stream prefix and the target's greedy continuation of it "
                  f"(`python -m specdec.zoo.train.regenerate`, files {', '.join(r['files'])}, digest {r['sha256']}); "
                  "its held-out metrics below are on corpus windows, text the target did not write.", ""]
    lines += ["## Held-out metrics", "",
              "Measured on the stored weights in fp32 over windows of the held-out files "
              "(%s windows of %s bytes)." % (card.get("heldout_eval", {}).get("windows"),
                                             card.get("heldout_eval", {}).get("length")), ""]
    if "target" in ho:
        t = ho["target"]
        lines.append(f"- target: {t['heldout_nats_per_byte']:.3f} nats/byte ({t['heldout_bits_per_byte']:.3f} "
                     f"bits/byte), top-1 accuracy {t['heldout_top1_accuracy']:.3f}.")
    lines += ["", "| draft | step | CE vs true byte (nats) | CE vs target distribution (nats) | "
              "top-1 agreement with target | accepted prefix |", "|---|---|---|---|---|---|"]
    for k in DRAFTS + EXTRA_STAGES:
        for step, r in ho.get(k, {}).items():
            prefix = f"{r['accept_prefix']:.3f}" if r.get("accept_prefix") is not None else ""
            lines.append(f"| `{k}` | {step} | {r['ce_true_nats']:.3f} | {r['ce_target_nats']:.3f} | "
                         f"{r['top1_agreement']:.3f} | {prefix} |")
    lines += ["", "At position t the target predicts byte t+1; EAGLE depth d and MTP layer k (1-based) predict "
              "byte t+1+d (t+1+k), reading the true bytes before it. EAGLE depth 1 reads the target's hidden "
              "state, depth d >= 2 the head's own output hidden state of depth d-1, attending to exactly what "
              "draft step d-1 sees at inference (the head was trained with %s unrolled passes). Agreement is "
              "the fraction of positions where the draft's argmax equals the target's; the speculative "
              "workers' acceptance is measured separately (`specdec bench`)." % tr.get("eagle", {}).get("unroll", "?"),
              "",
              "A block drafter's position j is the j-th token of a block drafted after an anchor; its accepted prefix "
              "is the fraction of blocks whose positions 1..j all agree with the target, what greedy verification "
              "of the whole block would accept. DSpark's Markov head reads the block's tokens before j, here the "
              "held-out text's in place of its own proposals, so its agreement at j > 1 compares with DFlash's "
              "through the accepted prefix.",
              "",
              _eagle3_scoring_note(card), ""]
    lines += _draft_lm_heldout_note(card)
    lines += ["## Training", "",
              "AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), linear warm-up then cosine decay to 10 %, "
              "gradient clipping at 1.0, random windows of the train stream. The target minimises next-byte "
              "cross-entropy. The drafts are trained on the frozen target: the EAGLE head with smooth-L1 "
              "regression onto the target's next hidden state plus cross-entropy against the target's "
              "distribution through the shared LM head, unrolled as at inference (training-time test); "
              + _eagle3_recipe(tr.get("eagle3", {}), tr.get("eagle", {}),
                                                card.get("tokenizer", {}).get("vocab_size")) + "; the MTP layers with "
              "cross-entropy against the target's distribution, all layers jointly.", "",
              f"Seed {card.get('seed')}; created {card.get('created')}; torch "
              f"{card.get('environment', {}).get('torch')}.", "",
              "Retrain (writes the weights and this card's data into the package):", "",
              "```", card.get("command") or "specdec zoo train", "```", ""]
    lines += _draft_lm_training_note(card)
    lines += _dflash_note(card)
    return "\n".join(lines)


def _eagle3_scoring_note(card: dict) -> str:
    """How the EAGLE-3 head's held-out rows are scored: as the EAGLE head's when its LM head covers the whole
    vocabulary, else over its draft vocabulary (`evaluate_eagle`)."""
    t = card.get("training", {}).get("eagle3", {})
    vocab = card.get("tokenizer", {}).get("vocab_size")
    if t.get("draft_vocab_size") == vocab:
        return (f"The EAGLE-3 head's LM head covers the whole vocabulary ({vocab} ids), so it is scored as the EAGLE "
                f"head is.")
    return ("The EAGLE-3 head is scored over its draft vocabulary (%s ids, %.4f %% of the train bytes): "
            "cross-entropy against the target's distribution restricted to it and renormalised, against the "
            "true byte where the byte is in it; its agreement counts every position, so a target argmax "
            "outside its vocabulary is a miss." % (t.get("draft_vocab_size", "?"),
                                                  100 * t.get("draft_vocab_train_coverage", 0)))


def _eagle3_recipe(t: dict, eagle: dict, vocab_size) -> str:
    """The EAGLE-3 head's training, as its stage's stats record it (`train_eagle3`)."""
    passes, decay = t.get("unroll", "?"), t.get("pass_weight_decay", 1.0)
    weights = ("the passes' losses averaged" if decay == 1.0 else
               f"pass j's loss weighted {decay} ** j (normalised to sum to 1), as the EAGLE-3 paper's trainer does")
    budget = "steps, tokens per step" + (", unrolled passes" if passes == eagle.get("unroll") else "")
    vocab = ("over the whole vocabulary" if t.get("draft_vocab_size") == vocab_size else
             f"over its draft vocabulary of the {t.get('draft_vocab_size')} most frequent ids, at the positions "
             f"where the target's argmax is in it")
    norms = [text for key, text in (("norm_before_fc", "one RMSNorm over the concatenated features before fc"),
                                    ("fc_norm", "one RMSNorm per feature before fc"),
                                    ("norm_output", "the normed output hidden fed back")) if t.get(key)]
    arch = ("; ".join(norms) if norms else
            "fc on the raw concatenated features and the pre-norm output hidden fed back, as the paper")
    loss = ("cross-entropy only" if not t.get("w_reg") else
            f"cross-entropy plus {t['w_reg']} times EAGLE's smooth-L1 regression of what its LM head reads onto what "
            f"the target's reads (which the paper drops)")
    return (f"the EAGLE-3 head with the EAGLE head's budget ({budget}) and {loss}, against the "
            f"target's distribution {vocab}, with {passes} training-time-test passes (each feeding the head its own "
            f"output hidden state of the pass before, attending as draft steps do at inference), {weights} ({arch}; "
            f"its LM head and final norm initialised from the target's)"
            + (", in fp32 (`--no-amp`)" if t.get("bf16_autocast") is False else ""))


# The draft LM's notes are rendered only for a card that has one, so the cards of pairs without it read as before.

def _draft_lm_heldout_note(card: dict) -> list[str]:
    """What the draft LM's held-out rows measure (`evaluate_draft_lm`)."""
    if "draft_lm" not in card.get("heldout", {}):
        return []
    return ["The draft LM reads bytes only, so what changes with its depth is what it reads: at depth d, anchored "
            "at position t, the held-out bytes up to t and then the target's d-1 greedy bytes after them (the path a "
            "greedy chain has accepted when it drafts at depth d; depth 1 is teacher forcing), and the target is "
            "scored on that same path. Its cross-entropy against the true byte counts the positions where that path "
            "is still the held-out text.", ""]


def _measured_cost(cost: dict | None, what: str) -> str:
    """The card's sentence on a draft's measured step cost (`specdec.bench.suites.draft_cost`), or "" when not
    measured."""
    if not cost:
        return ""
    load = (f", load average {cost['load_average_1min']} on {cost['cpu_count']} cores"
            if "load_average_1min" in cost else "")
    return (f" {what} costs {cost['draft_forward_in_target_only_steps']} of a target-only decode step "
            f"({cost['draft_forward_ms']} ms against {cost['target_only_step_ms']} ms; B = 1, {cost['threads']} "
            f"thread, process CPU time, `specdec.bench.draft_step_cost`, measured after training{load}).")


def _draft_lm_training_note(card: dict) -> list[str]:
    """How the draft LM was trained, what its step costs against the target's (`train_draft_lm`'s stats), and the
    command that added it."""
    t = card.get("training", {}).get("draft_lm")
    if t is None:
        return []
    measured = _measured_cost(t.get("step_cost"), "One draft step")
    return ["The draft LM (`draft_lm`, SGLang's STANDALONE draft) shares no weight with the target: its own "
            "embedding, decoder and LM head, initialised at random, minimise cross-entropy against the frozen "
            "target's next-byte distribution on windows of the train stream (distillation, teacher-forced)."
            + measured + " It was added to this pair by one stage, which reads the stored target and leaves the "
            "other weights as they are:", "", "```", t.get("command") or "specdec zoo train --stage draft_lm", "```",
            ""]


def _dflash_note(card: dict) -> list[str]:
    """What the DFlash drafter's held-out rows measure (`evaluate_dflash`), how it was trained, what its block forward
    costs (`train_dflash`'s stats) and the command that added it."""
    t, ho = card.get("training", {}).get("dflash"), card.get("heldout", {}).get("dflash")
    if t is None:
        return []
    measured = _measured_cost(t.get("step_cost"), f"One block forward (block {t.get('block_size')})")
    accept = ""
    if ho:
        prefix = [r.get("accept_prefix") for r in ho.values()]
        if all(p is not None for p in prefix):
            accept = (" On the held-out text its blocks would be accepted up to position j (all of positions 1..j "
                      "agreeing with the target's argmax) at " + ", ".join(f"{p:.3f}" for p in prefix) +
                      f" for j = 1..{len(prefix)}: {1 + sum(prefix):.2f} tokens per step, teacher-forced.")
    return ["The DFlash drafter (`dflash`, z-lab's block drafter) reads the frozen target's features (the outputs of "
            f"target layers {t.get('target_layer_ids')}) and drafts a block of {t.get('block_size')} in one forward: "
            "the last verified byte, then mask tokens (BOS). It was trained on "
            f"{t.get('blocks_per_window')} random anchors per window, every block position matching the target's "
            f"distribution, weighted exp(-(j-1)/{t.get('gamma')}) by block position j (the paper's decay); rows "
            "pos1..pos7 of the table above are those positions, anchored every 4 bytes of the held-out windows."
            + accept + measured + " It was added to this pair by one stage, which reads the stored target and leaves "
            "the other weights as they are:", "", "```", t.get("command") or "specdec zoo train --stage dflash", "```",
            ""]
