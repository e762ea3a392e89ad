"""Usage, from the repository root: python scripts/studies/adaptive-sim-20261205/sim.py PAIR TUNED.json B SET [SET ...]
(SET: code or mixed, the tune check's 32 prompts x 48 tokens; e.g. stdlib-byte-24l
specdec/zoo/tuned/stdlib-byte-24l-eagle.json 16 code mixed); its output is results/adaptive-sim-20261205/sim-*.jsonl.

Adaptive speculation's choices, costed without a clock. Every policy decodes the prompts greedily once (deterministic:
the same tokens and steps on any machine); each decode step is then priced by the tuned file's own step cost of the
shape it ran at bucket B (the full batch's, also for the last steps of a batch whose requests finish apart)
(`Candidate.step_ms`), the figure adaptive itself chooses by. So policies are compared on the
same prices, free of the machine's noise: decode tokens per priced millisecond, relative to the best static candidate
on the same prompts. At B = 1 the per-prompt oracle also picks, for each prompt, the static candidate that was best on
that prompt: what choosing one shape per request, knowing its prompt, could gain at most. One thread; JSON lines."""
import dataclasses
import json
import sys

import torch

from specdec import Engine, SamplingParams, SpecConfig, zoo
from specdec.bench.tune.search import fixed_shape_spec, mixed_prompts
from specdec.ops.contract import NO_DRAFT
from specdec.tuning import AdaptiveShapes, TunedSpec, shape_name
from specdec.zoo.corpus import heldout_prompts, prose_prompts

POLICIES = {}  # name -> factory(tuned) -> ShapePolicy


def policy(name):
    def reg(f):
        POLICIES[name] = f
        return f
    return reg


def chain_accept(steps: int, alpha: float) -> float:
    """Expected accepted tokens (bonus included) of a chain of `steps` drafts each accepted with probability alpha."""
    return sum(alpha ** j for j in range(steps + 1))


def effective_alpha(steps: int, accept: float) -> float:
    """The alpha at which a chain of `steps` accepts `accept` tokens a step (a tree: the chain it equals)."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chain_accept(steps, mid) < accept else (lo, mid)
    return (lo + hi) / 2


class DepthShapes(AdaptiveShapes):
    """AdaptiveShapes with another model of a request's quality: r scales the per-depth acceptance, not the accepted
    length. Each candidate c has the alpha_c at which a chain of its depth accepts its tuned mean; request b is
    predicted chain_accept(S_c, min(r_b alpha_c, 0.995)). r_b: the EMA of accepted drafts over what alpha_c predicts
    for the depths tried (n accepted of min(n + 1, S) tried)."""

    def __init__(self, tuned, decay=0.25, probe_every=4, margin=0.0):
        super().__init__(tuned, decay, probe_every, margin)
        self.alphas = {}

    def alpha(self, c):
        if c.shape not in self.alphas:
            self.alphas[c.shape] = effective_alpha(c.shape[0], c.mean_accept_len)
        return self.alphas[c.shape]

    def start(self, batch_size):
        super().start(batch_size)
        self.got, self.want = [1.0] * batch_size, [1.0] * batch_size
        self.got_sum, self.want_sum = [1.0] * batch_size, [1.0] * batch_size

    def filter(self, keep):
        super().filter(keep)
        for k in ("got", "want", "got_sum", "want_sum"):
            setattr(self, k, [getattr(self, k)[i] for i in keep])

    def observe(self, accept_lens):
        c = self.last
        if c is None or c.shape == NO_DRAFT or c.mean_accept_len <= 1.0:
            return
        d, S, al = self.decay, c.shape[0], self.alpha(c)
        for i, a in enumerate(accept_lens):
            n = a - 1
            tried = min(n + 1, S)
            self.got[i] = (1 - d) * self.got[i] + d * n
            self.want[i] = (1 - d) * self.want[i] + d * tried * al
            self.got_sum[i] += n
            self.want_sum[i] += tried * al
        self.quality = [g / w for g, w in zip(self.got, self.want)]
        self.drafted += 1

    def mean_quality(self):
        return [g / w for g, w in zip(self.got_sum, self.want_sum)]

    def predicted_tokens(self, c, quality=None):
        if c.shape == NO_DRAFT or c.mean_accept_len <= 1.0:
            return float(len(self.quality if quality is None else quality))
        al = self.alpha(c)
        return sum(chain_accept(c.shape[0], min(q * al, 0.995)) for q in (self.quality if quality is None else quality))


policy("adaptive, no margin (before)")(lambda t: AdaptiveShapes(t, margin=0.0))
policy("depth model, no margin")(lambda t: DepthShapes(t, margin=0.0))
for m in (0.03, 0.06, 0.1):
    policy(f"adaptive, margin {m}")(lambda t, m=m: AdaptiveShapes(t, margin=m))


def main():
    torch.set_num_threads(1)
    name, path, B, sets = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    b = zoo.load(name)
    tuned = TunedSpec.load(path)
    bucket = tuned.bucket(B)
    # bucket B alone: a batch that empties out keeps B's shapes and prices, for the static shapes and policies alike
    tuned = dataclasses.replace(tuned, buckets={B: bucket})
    price = {c.shape: c.step_ms for c in bucket.candidates}
    code = heldout_prompts(32, 96, seed=0)
    prompt_sets = {"code": code, "mixed": mixed_prompts(code, prose_prompts(32, 96, seed=0))[:32]}
    params = SamplingParams(max_new_tokens=48)
    for set_name in sets:
        prompts = prompt_sets[set_name]
        batches = [prompts[i:i + B] for i in range(0, len(prompts) - len(prompts) % B, B)]
        rows = {}
        per_prompt = {}
        for shape in price:
            spec = fixed_shape_spec(b.target, b.eagle, shape, B) if shape == NO_DRAFT else SpecConfig(*shape)
            e = Engine(b.target, b.eagle, spec, impl="reference", max_batch=B, max_seq_len=96 + 48 + 64)
            tokens = ms = 0.0
            pp = []
            for batch in batches:
                outs = e.generate(batch, params, seed=0)
                steps = e.last_stats.num_decode_steps
                tokens += e.last_stats.num_tokens
                ms += steps * price[shape]
                pp += [(len(o.token_ids), len(o.accept_lens) * price[shape]) for o in outs]
            rows[shape_name(shape)] = tokens / ms
            per_prompt[shape] = pp
        best_static = max(rows, key=rows.get)
        out = {"pair": name, "B": B, "set": set_name, "best_static": best_static,
               "static": {k: round(v / rows[best_static], 4) for k, v in rows.items()}}
        if B == 1:
            n = len(prompts)
            best_each = [max(price, key=lambda s: (per_prompt[s][i][0]) / per_prompt[s][i][1]) for i in range(n)]
            tok = sum(per_prompt[s][i][0] for i, s in enumerate(best_each))
            ms = sum(per_prompt[s][i][1] for i, s in enumerate(best_each))
            out["per_prompt_oracle_vs_best_static"] = round(tok / ms / rows[best_static], 4)
            out["per_prompt_oracle_shapes"] = sorted({shape_name(s) for s in best_each})
        for pname, factory in POLICIES.items():
            TunedSpec.policy = lambda self, f=factory: f(self)
            e = Engine(b.target, b.eagle, tuned.with_adaptive(True), impl="reference", max_batch=B,
                       max_seq_len=96 + 48 + 64)
            tokens = ms = 0.0
            used = {}
            for batch in batches:
                e.generate(batch, params, seed=0)
                shapes = e.last_stats.step_shapes
                tokens += e.last_stats.num_tokens
                ms += sum(price[s] for s in shapes)
                for s in shapes:
                    used[shape_name(s)] = used.get(shape_name(s), 0) + 1
            out[pname] = {"vs_best_static": round(tokens / ms / rows[best_static], 4), "steps_by_shape": used}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
