"""The target's own user turns (Magpie, Xu et al. 2024): given its chat template up to the user's header with
nothing after it, an aligned model writes a user request, sampled; the recorder then lets it answer. The requests
are in the target's own distribution and need nothing but the target.

`python -m specdec.zoo.prompts.magpie --model NAME --n N --out FILE` writes N requests as prompt-file lines
({"question_id", "category": "chat", "turns": [request], "source": "magpie/<batch>"}), batches of BATCH requests
a source each, so the held-out split (by source, `build.is_heldout_source`) holds out whole batches.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from ...config import SamplingParams
from ...engine import Engine
from .. import load_target, target_fingerprint

BATCH = 64
MARK = "\x00MAGPIE\x00"
MIN_CHARS, MAX_CHARS = 12, 1500


def user_header_ids(tokenizer) -> list[int]:
    """The chat template rendered up to where a user's message would begin (its system turn included)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], add_generation_prompt=False,
                                         tokenize=False)
    if MARK not in text:
        raise ValueError("the chat template does not place the user's message in its text")
    return tokenizer.encode(text[:text.index(MARK)], add_special_tokens=False)


def request_rounds(target, tokenizer, seed: int = 0, temperature: float = 1.0, max_new_tokens: int = 128,
                   batch_size: int = 32, start_round: int = 0):
    """Yields (round, the requests that round sampled which ended at a stop id and are MIN_CHARS to MAX_CHARS
    long), rounds of batch_size samples from start_round on; round r's draws are a function of (seed, r) alone, so
    a run resumed at a round samples what an uninterrupted one would."""
    header = user_header_ids(tokenizer)
    engine = Engine(target, max_batch=batch_size, max_seq_len=len(header) + max_new_tokens + 1)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                            stop_token_ids=list(tokenizer.eos_token_ids))
    r = start_round
    while True:
        outs = engine.generate([header] * batch_size, [params] * batch_size, seed=seed * 100003 + r)
        texts = [tokenizer.decode(o.token_ids).strip() for o in outs if o.finish_reason == "stop"]
        yield r, [t for t in texts if MIN_CHARS <= len(t) <= MAX_CHARS]
        r += 1


def sample_requests(target, tokenizer, n: int, seed: int = 0, temperature: float = 1.0, max_new_tokens: int = 128,
                    batch_size: int = 32, log=print) -> list[str]:
    """-> up to n distinct user requests the target wrote (`request_rounds`), at most 4 n / batch_size + 4 rounds."""
    found: dict[str, None] = {}
    t0 = time.time()
    for r, texts in request_rounds(target, tokenizer, seed, temperature, max_new_tokens, batch_size):
        found.update(dict.fromkeys(texts))
        log(f"[magpie] {len(found)}/{n} requests after {(r + 1) * batch_size} samples, {time.time() - t0:.0f}s")
        if len(found) >= n or r + 1 >= 4 * (n // batch_size + 1):
            break
    return list(found)[:n]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.zoo.prompts.magpie", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="the target (default: %(default)s)")
    p.add_argument("--n", type=int, required=True, help="requests to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True,
                   help="JSON-lines file to write; an interrupted run continues it (OUT.rounds: the rounds done)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    target, tokenizer, _ = load_target(a.model)
    fp = target_fingerprint(target)
    out, progress = Path(a.out), Path(a.out + ".rounds")
    out.parent.mkdir(parents=True, exist_ok=True)
    done = json.loads(progress.read_text()) if progress.is_file() and out.is_file() else None
    if done is not None and (done["seed"], done["target"]) != (a.seed, fp):
        raise SystemExit(f"{out} was sampled with seed {done['seed']} from target {done['target']}: use a new --out")
    kept = [line for line in out.read_text().splitlines() if line.endswith("}")] if done else []  # no torn line
    found = dict.fromkeys(json.loads(line)["turns"][0] for line in kept)
    out.write_text("".join(line + "\n" for line in kept))
    t0 = time.time()
    for r, texts in request_rounds(target, tokenizer, a.seed, a.temperature, batch_size=a.batch_size,
                                   start_round=done["rounds"] if done else 0):
        new = [t for t in dict.fromkeys(texts) if t not in found][:a.n - len(found)]
        with out.open("a", encoding="utf-8") as f:
            for t in new:
                i = len(found)
                found[t] = None
                f.write(json.dumps({"question_id": f"magpie-{i}", "category": "chat", "turns": [t],
                                    "source": f"magpie/{fp}/{a.seed}/{i // BATCH}"}, ensure_ascii=False) + "\n")
        progress.write_text(json.dumps({"rounds": r + 1, "seed": a.seed, "target": fp}))
        print(f"[magpie] {len(found)}/{a.n} requests after {(r + 1) * a.batch_size} samples, "
              f"{time.time() - t0:.0f}s", file=sys.stderr, flush=True)
        if len(found) >= a.n or r + 1 >= 4 * (a.n // a.batch_size + 1):
            break
    print(f"wrote {out}: {len(found)} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
