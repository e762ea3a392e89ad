"""`python -m specdec.bench.suites.grammar`: what a grammar costs each worker, and which way of filling masks is
cheapest.

Per worker case (`cases.CASES`) on the shipped model: tokens per process-CPU second (the median of `--repeats`
runs, with the 20th and 80th percentiles) and tokens per step without a grammar, with the
JSON schema of the tests (an object with a string, an integer and an enum field), and with it masking the drafts
too (`SpecConfig(draft_grammar=True)`), with the host time spent filling masks per step (`GrammarRow`; the
three runs of one case are taken in turn within each pass). Then, on the trees an EAGLE tree worker verifies under
the schema, the three ways xgrammar 0.2.9 offers to fill a tree's masks, timed on the same trees (`FillRow`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from dataclasses import dataclass

import torch

from ... import zoo
from ...config import SamplingParams, SpecConfig
from ...engine import Engine
from ..cases import CASES, WorkerCase, offered_cases
from ..common import Run, RunRow, median_of, quantile
from ...grammar import GrammarBatch

#: The schema the tests and this benchmark decode: a string, an integer and an enum field.
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "color": {"enum": ["red", "green", "blue"]}},
          "required": ["name", "age", "color"], "additionalProperties": False}
PROMPTS = ["person = ", "def load(path):\n    return ", "config = ", "    data = "]


@dataclass
class GrammarRow(RunRow):
    """One worker under one grammar setting: grammar "none" or "json"; draft_grammar: the drafts masked too."""

    model: str
    label: str
    worker: str
    grammar: str
    draft_grammar: bool
    requests: int
    tokens: int
    decode_steps: int
    repeats: int
    #: tokens per process-CPU second (one thread): the median run, and the 20th / 80th percentile runs
    tokens_per_s: float
    tokens_per_s_p20: float
    tokens_per_s_p80: float
    mean_accept_len: float
    fill_ms_per_step: float
    #: tokens/s against the same worker without a grammar (1.0 for the "none" row)
    relative_tokens_per_s: float


@dataclass
class FillRow(RunRow):
    """One way to fill the masks of the same verify trees: microseconds per tree node."""

    model: str
    method: str
    trees: int
    nodes: int
    us_per_node: float


def _engine(bundle, case: WorkerCase, draft_grammar: bool) -> Engine:
    spec = None if case.spec is None else dataclasses.replace(case.spec, draft_grammar=draft_grammar)
    draft = None if case.kind == "target-only" else getattr(bundle, case.kind)
    return Engine(bundle.target, draft, spec, impl="reference", tokenizer=bundle.tokenizer)


def _run(engine, prompts, params) -> tuple[float, int, int, float, float]:
    t0 = time.process_time()
    outs = engine.generate(prompts, params)
    cpu = time.process_time() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    fill = engine.worker.grammar.fill_seconds if engine.worker.grammar is not None else 0.0
    stats = engine.last_stats
    return tokens / cpu, tokens, stats.num_decode_steps, stats.mean_accept_len, fill


def grammar_rows(run: Run, bundle, model: str, max_new_tokens: int, repeats: int, cases=None) -> list[GrammarRow]:
    prompts = [bundle.tokenizer.encode(p) for p in PROMPTS]
    settings = [("none", False), ("json", False), ("json", True)]
    rows = []
    for case in offered_cases(bundle, CASES) if cases is None else cases:
        engines = {s: _engine(bundle, case, s[1]) for s in settings if case.spec is not None or not s[1]}
        params = {"none": SamplingParams(max_new_tokens=max_new_tokens),
                  "json": SamplingParams(max_new_tokens=max_new_tokens, json_schema=json.dumps(SCHEMA))}
        passes: dict = {s: [] for s in engines}
        for i in range(repeats + 1):  # the first pass warms up; the settings taken in turn within a pass
            for s, engine in engines.items():
                result = _run(engine, prompts, params[s[0]])
                if i:
                    passes[s].append(result)
        med = {s: median_of(p, key=lambda r: r[0]) for s, p in passes.items()}
        base = med[("none", False)][0]
        for s, (tps, tokens, steps, accept, fill) in med.items():
            rows.append(GrammarRow(**run.prefix(), model=model, label=case.label, worker=case.kind, grammar=s[0],
                                   draft_grammar=s[1], requests=len(prompts), tokens=tokens, decode_steps=steps,
                                   repeats=repeats, tokens_per_s=round(tps, 1),
                                   tokens_per_s_p20=round(quantile(passes[s], 0.2, key=lambda r: r[0])[0], 1),
                                   tokens_per_s_p80=round(quantile(passes[s], 0.8, key=lambda r: r[0])[0], 1),
                                   mean_accept_len=round(accept, 3),
                                   fill_ms_per_step=round(1e3 * fill / max(steps, 1), 4),
                                   relative_tokens_per_s=round(tps / base, 3)))
    return rows


# ---- the three ways to fill a tree's masks ---------------------------------------------------------------

def fill_traverse(m, cand, nt, ns, rows):
    m.traverse_draft_tree(nt, ns, cand, rows)


def fill_walk(m, cand, nt, ns, rows):
    """accept_token / fill_next_token_bitmask / rollback along a depth-first walk, in Python."""
    cand, nt, ns = cand.tolist(), nt.tolist(), ns.tolist()

    def visit(node):
        if not m.is_terminated():
            m.fill_next_token_bitmask(rows, node)
        child = nt[node]
        while child != -1:
            if not m.is_terminated() and m.accept_token(cand[child]):
                visit(child)
                m.rollback(1)
            child = ns[child]

    visit(0)


def fill_fork_batch(m, cand, nt, ns, rows, batch=None):
    """A fork per node (the parent's fork accepting the node's token), then one batch fill over the forks."""
    # lazy: xgrammar is optional
    import xgrammar as xgr
    cand, nt, ns = cand.tolist(), nt.tolist(), ns.tolist()
    forks, index, stack = [], [], [(0, m.fork())]
    while stack:
        node, matcher = stack.pop()
        if matcher.is_terminated():
            continue
        forks.append(matcher)
        index.append(node)
        child = nt[node]
        while child != -1:
            f = matcher.fork()
            if f.accept_token(cand[child]):
                stack.append((child, f))
            child = ns[child]
    (batch or xgr.BatchGrammarMatcher()).batch_fill_next_token_bitmask(forks, rows, index)


FILL_METHODS = {"traverse_draft_tree": fill_traverse, "python walk (accept / fill / rollback)": fill_walk,
                "fork per node + BatchGrammarMatcher": fill_fork_batch}


def fill_rows(run: Run, bundle, model: str, max_new_tokens: int) -> list[FillRow]:
    """Record the trees (and the matchers' states) an EAGLE tree worker fills under the schema, then time each
    method on each of them."""
    engine = _engine(bundle, WorkerCase("eagle", SpecConfig(5, 4, 16)), False)
    taken = []
    original = GrammarBatch.fill_tree

    def recording(self, candidates, next_token, next_sibling):
        for b, m in enumerate(self.matchers):
            if m is not None and not m.is_terminated():
                taken.append((m.fork(), candidates[b].clone(), next_token[b].clone(), next_sibling[b].clone()))
        return original(self, candidates, next_token, next_sibling)

    GrammarBatch.fill_tree = recording
    try:
        engine.generate([bundle.tokenizer.encode(p) for p in PROMPTS],
                        SamplingParams(max_new_tokens=max_new_tokens, json_schema=json.dumps(SCHEMA)))
    finally:
        GrammarBatch.fill_tree = original
    W = taken[0][1].shape[0]
    rows = []
    for method, fill in FILL_METHODS.items():
        bitmask = torch.full((W, (bundle.target.config.vocab_size + 31) // 32), -1, dtype=torch.int32)
        t0 = time.perf_counter()
        for m, cand, nt, ns in taken:
            fill(m, cand, nt, ns, bitmask)
        seconds = time.perf_counter() - t0
        rows.append(FillRow(**run.prefix(), model=model, method=method, trees=len(taken), nodes=len(taken) * W,
                            us_per_node=round(1e6 * seconds / (len(taken) * W), 3)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec.bench.suites.grammar", description=__doc__)
    ap.add_argument("--model", default=zoo.SMALL_NAME, choices=zoo.names())
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    bundle = zoo.load(args.model)
    run = Run("grammar", "cpu")
    rows = grammar_rows(run, bundle, args.model, args.max_new_tokens, args.repeats)
    for r in rows:
        print(f"{r.label:26s} {r.grammar:5s} draft_grammar={r.draft_grammar!s:5s} {r.tokens_per_s:8.1f} tok/s "
              f"x{r.relative_tokens_per_s:.2f}  {r.mean_accept_len:.2f} per step  fill {r.fill_ms_per_step:.3f} ms")
    print(run.write(rows, args.out))
    fills = fill_rows(run, bundle, args.model, args.max_new_tokens)
    for r in fills:
        print(f"{r.method:40s} {r.us_per_node:8.2f} us per node ({r.trees} trees)")
    print(run.write(fills, args.out, tag="grammar-fill"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
