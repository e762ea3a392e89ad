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
from .. import target_fingerprint
from ..train.for_target import load_target

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


def sample_requests(target, tokenizer, n: int, seed: int = 0, temperature: float = 1.0, max_new_tokens: int = 128,
                    batch_size: int = 32, log=print) -> list[str]:
    """-> up to n distinct user requests the target wrote (those that ended at a stop id, of MIN_CHARS to
    MAX_CHARS characters)."""
    header = user_header_ids(tokenizer)
    engine = Engine(target, max_batch=batch_size, max_seq_len=len(header) + max_new_tokens + 1)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                            stop_token_ids=list(tokenizer.eos_token_ids))
    found: dict[str, None] = {}
    t0, round_ = time.time(), 0
    while len(found) < n and round_ < 4 * (n // batch_size + 1):
        outs = engine.generate([header] * batch_size, [params] * batch_size, seed=seed * 100003 + round_)
        for o in outs:
            text = tokenizer.decode(o.token_ids).strip()
            if o.finish_reason == "stop" and MIN_CHARS <= len(text) <= MAX_CHARS:
                found.setdefault(text)
        round_ += 1
        log(f"[magpie] {len(found)}/{n} requests after {round_ * batch_size} samples, {time.time() - t0:.0f}s")
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
    p.add_argument("--out", required=True, help="JSON-lines file to write")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    target, tokenizer, _ = load_target(a.model)
    reqs = sample_requests(target, tokenizer, a.n, a.seed, a.temperature, batch_size=a.batch_size,
                           log=lambda s: print(s, file=sys.stderr))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fp = target_fingerprint(target)
    out.write_text("".join(json.dumps({"question_id": f"magpie-{i}", "category": "chat", "turns": [r],
                                       "source": f"magpie/{fp}/{a.seed}/{i // BATCH}"}, ensure_ascii=False) + "\n"
                           for i, r in enumerate(reqs)), encoding="utf-8")
    print(f"wrote {out}: {len(reqs)} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
