"""Differential testing: random batches through every worker against target-only decoding of each request alone.

A seeded generator draws cases: a worker and a random SpecConfig for it (its verify rule and drafting from the rules'
records), a ragged batch of held-out prompts, and per request a random mix of stop ids, logprob options, penalties,
logit bias (-inf included), min_new_tokens and grammars (regex, JSON schema, EBNF), greedy or sampled. Every greedy
request must equal target-only decoding of that request alone (tokens, finish reason, error, logprobs); every
request, greedy or sampled, must obey its own rules: an output the request's grammar accepts token by token, a stop id
only as the last token, at most max_new_tokens.

CI runs up to `CI_CASES` cases, those that fit in `CI_SECONDS` (always at least `MIN_CASES`); `-m slow` runs many
more, the fast path among them. This is how the stop-id / grammar fault (a stop id the grammar needs as content)
was found.
"""
import random
import re
import time

import pytest
import torch

from specdec import Engine, SamplingParams, SpecConfig, zoo
from specdec.draft_kinds import DRAFT_KINDS
from specdec.grammar import GrammarCompiler
from specdec.verify_rules import VERIFY_RULES
from specdec.zoo import corpus
from tests.helpers import LOGPROB_ATOL, ZOO_WORKERS
from tests.helpers.oracles import grammar_stops

xgr = pytest.importorskip("xgrammar")

EOS = zoo.ByteTokenizer.eos_token_id
NEG_INF = float("-inf")
#: the logprob of a masked token, clamped to float32's finite minimum (`compute_spec_v2_logprobs`)
MASKED = -3.0e38
CI_SECONDS = 30.0
CI_CASES = 40
MIN_CASES = 3
SLOW_CASES = 400
MAX_SEQ_LEN = 192

#: the grammars a request may carry; the first is the issue's: its space is content the grammar needs
GRAMMARS = [
    dict(regex=r"(def|class) [A-Za-z_]+"),
    dict(regex=r"[a-z_]+\([a-z_, ]*\)"),
    dict(json_schema={"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                                       "n": {"type": "integer"}}, "required": ["name", "n"]}),
    dict(ebnf='root ::= "x = " [0-9]+ (";" | "\\n")'),
]
#: bytes a stop id is drawn from: space, newline, "(", "e", ":", "_" and EOS (content of the grammars above, or not)
STOP_POOL = [32, 10, 40, 101, 58, 95, EOS]
#: the worker kinds of the shipped pair, target-only included, and DSpark with its random draft (`random_draft`: the
#: pair ships none; random proposals still reach every verify path, and its confidence cap varies per request)
KINDS = ["target-only", "eagle", "eagle3", "mtp", "mtp_chain", "dspark"]


def draft_of(bundle, kind: str):
    """The pair's draft of `kind`, or its kind's random draft for the pair's target when the pair ships none (made
    once per bundle)."""
    if kind == "target-only":
        return None
    shipped = bundle.drafts.get(kind)
    if shipped is not None:
        return shipped
    made = bundle.__dict__.setdefault("_random_drafts", {})
    if kind not in made:
        made[kind] = DRAFT_KINDS[kind].new_random_draft(bundle.target)
    return made[kind]


def random_rule(rng: random.Random, kind: str, topk: int) -> dict:
    """A verify rule and a drafting for `kind` at `topk`, drawn from the rules' records (`VERIFY_RULES`, plugins
    included): a rule that runs on the shape, one reading the draft's distribution only for a kind that has one (it
    then drafts by sampling), none inexact on the chains the kind's drafted tokens stop (`DraftKind.stops_chains`),
    the others with either drafting the kind can do."""
    record = DRAFT_KINDS[kind]
    rule = rng.choice([r for r in VERIFY_RULES.values() if r.runs_on(topk) and (record.samples_drafts or not
                       r.reads_draft) and (r.stopped_chains or not record.stops_chains)])
    samples = record.samples_drafts
    drafting = "sample" if rule.reads_draft else rng.choice(["topk", "sample"] if samples else ["topk"])
    return dict(verify=rule.name, draft_sampling=drafting)


def random_spec(rng: random.Random, kind: str, draft) -> SpecConfig | None:
    """A legal SpecConfig for `kind`, drawn at random (the MTP workers' depth is their layer count), its verify rule and
    drafting among them (`random_rule`)."""
    if kind == "target-only":
        return None
    extra = dict(draft_penalties=rng.random() < 0.3, draft_grammar=rng.random() < 0.4,
                 penalty_mode="exact")
    if kind.startswith("mtp"):
        return SpecConfig(draft.num_layers, **extra, **random_rule(rng, kind, 1))
    if kind == "dspark":  # a chain of at most its block
        return SpecConfig(rng.randint(1, draft.block_size), **extra, **random_rule(rng, kind, 1))
    S, K = rng.randint(1, 5), rng.randint(1, 4)
    if K == 1:
        return SpecConfig(S, 1, **extra, **random_rule(rng, kind, 1))
    W = rng.randint(2, min(1 + K + (S - 1) * K * K, 20))
    return SpecConfig(S, K, W, **extra, **random_rule(rng, kind, K))


def random_params(rng: random.Random, greedy: bool) -> SamplingParams:
    """One request's parameters: every option at random, each with a modest probability."""
    kw = dict(max_new_tokens=rng.randint(1, 24))
    if not greedy:
        kw.update(temperature=rng.choice([0.6, 1.0, 1.3]), top_k=rng.choice([-1, 5, 40]),
                  top_p=rng.choice([1.0, 0.9]))
    if rng.random() < 0.6:
        kw["stop_token_ids"] = rng.sample(STOP_POOL, rng.randint(1, 3))
    if rng.random() < 0.5:
        kw.update(return_logprob=True, top_logprobs_num=rng.randint(0, 4),
                  token_ids_logprob=rng.sample(range(258), rng.randint(0, 3)) or None)
    if rng.random() < 0.35:
        kw.update(frequency_penalty=rng.choice([0.0, 0.5, 1.5]), presence_penalty=rng.choice([0.0, -0.5, 1.0]),
                  repetition_penalty=rng.choice([1.0, 1.2, 0.9]))
    if rng.random() < 0.3:
        kw["logit_bias"] = {rng.randrange(258): rng.choice([NEG_INF, -3.0, 4.0]) for _ in range(rng.randint(1, 4))}
    if rng.random() < 0.2:
        kw["min_new_tokens"] = rng.randint(1, kw["max_new_tokens"])
    if rng.random() < 0.45:
        kw.update(rng.choice(GRAMMARS))
    return SamplingParams(**kw)


def draw_case(rng: random.Random, bundle) -> tuple[str, SpecConfig | None, list[list[int]], list[SamplingParams]]:
    """(kind, spec, prompts, params): a ragged batch of 1-4 held-out prompts for one worker."""
    kind = rng.choice(KINDS)
    draft = draft_of(bundle, kind)
    spec = random_spec(rng, kind, draft)
    B = rng.randint(1, 4)
    windows = corpus.heldout_windows(B, 48, seed=rng.randrange(10 ** 6))
    prompts = [[int(t) for t in w[:rng.randint(4, 48)]] for w in windows]
    params = [random_params(rng, greedy=rng.random() < 0.75) for _ in range(B)]
    return kind, spec, prompts, params


def check_own_rules(compiled, out, sp: SamplingParams) -> None:
    """What holds for any request, greedy or sampled: the grammar (`compiled`, or None) accepts the output token by
    token (a request stop id included: it is emitted only where the grammar allows it), a stop id or a grammar
    terminator only as the last token and only after min_new_tokens, "stop" exactly when one ends the output."""
    assert len(out.token_ids) <= sp.max_new_tokens
    ends = set(sp.stop_token_ids) | (grammar_stops(compiled) if compiled is not None else set())
    assert out.finish_reason in ("stop", "length", "error") and (out.error is None) == (out.finish_reason != "error")
    if out.finish_reason == "stop":
        assert out.token_ids[-1] in ends and len(out.token_ids) > sp.min_new_tokens
    if out.finish_reason == "length":
        assert len(out.token_ids) == sp.max_new_tokens
    assert not ends & set(out.token_ids[:-1])
    if compiled is not None:
        m = xgr.GrammarMatcher(compiled)
        for t in out.token_ids:
            assert not m.is_terminated() and m.accept_token(t), (out.token_ids, sp)


def assert_same(got, want, what: str) -> None:
    """A request's output equals its target-only baseline: tokens, finish reason, error, logprobs."""
    assert got.token_ids == want.token_ids, what
    assert got.finish_reason == want.finish_reason, what
    # the error names the request by its index in its own batch
    assert (got.error is None) == (want.error is None), what
    if got.error is not None:
        assert re.sub(r"^request \d+: ", "", got.error) == re.sub(r"^request \d+: ", "", want.error), what
    if want.logprobs is None:
        assert got.logprobs is None, what
        return
    assert len(got.logprobs) == len(want.logprobs) == len(got.token_ids), what
    for a, b in zip(got.logprobs, want.logprobs):
        assert abs(a - b) <= LOGPROB_ATOL, what
    for rows_a, rows_b in ((got.top_logprobs, want.top_logprobs), (got.token_ids_logprobs, want.token_ids_logprobs)):
        for ta, tb in zip(rows_a, rows_b):
            # a top-k entry at the clamp floor is a masked token: which of the tied masked ids fills it is arbitrary
            assert [t for x, t in ta if x > MASKED] == [t for x, t in tb if x > MASKED], what
            assert all(abs(x - y) <= LOGPROB_ATOL for (x, _), (y, _) in zip(ta, tb)), what


class Differ:
    """Engines kept across cases (one per worker, spec and impl), the target-only baselines cached per request."""

    def __init__(self, bundle):
        self.bundle = bundle
        self.engines: dict = {}
        self.baselines: dict = {}
        self.compiler = GrammarCompiler(bundle.tokenizer, bundle.target.config.vocab_size)

    def engine(self, kind, spec, impl) -> Engine:
        key = (kind, spec, impl)
        if key not in self.engines:
            draft = draft_of(self.bundle, kind)
            self.engines[key] = Engine(self.bundle.target, draft=draft, spec=spec, impl=impl, max_batch=5,
                                       max_seq_len=MAX_SEQ_LEN, tokenizer=self.bundle.tokenizer)
        return self.engines[key]

    def compiled_of(self, sp):
        return self.compiler.compile(sp, 0)

    def baseline(self, prompt, sp):
        key = (tuple(prompt), repr(sp))
        if key not in self.baselines:
            self.baselines[key] = self.engine("target-only", None, "reference").generate([prompt], sp)[0]
        return self.baselines[key]

    def run(self, case, impl: str, seed: int) -> None:
        kind, spec, prompts, params = case
        outs = self.engine(kind, spec, impl).generate(prompts, params, seed=seed)
        for i, (prompt, sp, out) in enumerate(zip(prompts, params, outs)):
            what = f"{kind} {spec} {impl}, request {i} of {len(prompts)}: {sp}"
            if sp.is_greedy:
                assert_same(out, self.baseline(prompt, sp), what)
            check_own_rules(self.compiled_of(sp), out, sp)


def run_cases(bundle, seed: int, max_cases: int, seconds: float, fast_every: int = 0) -> int:
    """Draw and run cases until `max_cases` or `seconds` (at least MIN_CASES); every `fast_every`-th case also on the
    fast path. Returns the number run."""
    rng = random.Random(seed)
    differ = Differ(bundle)
    t0 = time.monotonic()
    n = 0
    while n < max_cases and (n < MIN_CASES or time.monotonic() - t0 < seconds):
        case = draw_case(rng, bundle)
        differ.run(case, "reference", seed=n)
        if fast_every and n % fast_every == fast_every - 1:
            differ.run(case, "fast", seed=n)
        n += 1
    return n


@pytest.fixture(scope="module")
def differ(small):
    """One Differ for the module: engines and baselines shared by the tests."""
    return Differ(small)


def test_random_batches_equal_target_only_alone(small):
    n = run_cases(small, seed=2029, max_cases=CI_CASES, seconds=CI_SECONDS)
    assert n >= MIN_CASES


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_batches_equal_target_only_alone_long(small, seed):
    run_cases(small, seed=seed, max_cases=SLOW_CASES, seconds=1200.0, fast_every=4)


# ---- the cases the differential run found, pinned --------------------------------------------------------------

ISSUE_PROMPT = "import os\n\n"
ISSUE_PARAMS = SamplingParams(max_new_tokens=12, regex=r"(def|class) [A-Za-z_]+", stop_token_ids=[32])


@pytest.mark.parametrize("impl", ["reference", pytest.param("fast", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", KINDS)
def test_a_stop_id_the_grammar_needs_is_content_then_stops(small, differ, kind, impl):
    """The stop id (a space) is content the grammar needs after 'class': every worker emits it and stops there."""
    d = differ
    spec = random_spec(random.Random(0), kind, draft_of(small, kind))
    out = d.engine(kind, spec, impl).generate([small.tokenizer.encode(ISSUE_PROMPT)], ISSUE_PARAMS)[0]
    assert small.tokenizer.decode(out.token_ids) == "class " and out.finish_reason == "stop"


# CI keeps one worker of each family (the random run covers the rest); -m slow runs them all, fast too
CI_MIXED = ("target-only", "EAGLE tree S5 K4 W16", "MTP Step-3.5 S3")


@pytest.mark.parametrize("impl", ["reference", pytest.param("fast", marks=pytest.mark.slow)])
@pytest.mark.parametrize("worker", [w if w in CI_MIXED else pytest.param(w, marks=pytest.mark.slow)
                                    for w in ["target-only"] + list(ZOO_WORKERS)])
def test_a_mixed_batch_equals_each_request_alone(small, differ, worker, impl):
    """The issue's request beside plain, penalised, other-grammar and empty-row requests, in one batch."""
    tok = small.tokenizer
    reqs = [
        (ISSUE_PROMPT, ISSUE_PARAMS),
        ("def main():\n", SamplingParams(max_new_tokens=10, return_logprob=True, top_logprobs_num=2)),
        ("class A:\n", SamplingParams(max_new_tokens=9, frequency_penalty=1.0, presence_penalty=0.5,
                                      stop_token_ids=[10])),
        ("    return ", SamplingParams(max_new_tokens=8, **GRAMMARS[2], return_logprob=True)),
        (ISSUE_PROMPT, SamplingParams(max_new_tokens=12, regex=r"(def|class) [A-Za-z_]+", logit_bias={32: NEG_INF})),
    ]
    kind, spec = ("target-only", None) if worker == "target-only" else ZOO_WORKERS[worker]
    d = differ
    prompts = [tok.encode(p) for p, _ in reqs]
    outs = d.engine(kind, spec, impl).generate(prompts, [sp for _, sp in reqs])
    for i, ((p, sp), out) in enumerate(zip(reqs, outs)):
        assert_same(out, d.baseline(tok.encode(p), sp), f"{worker} request {i}")
        check_own_rules(d.compiled_of(sp), out, sp)
    assert tok.decode(outs[0].token_ids) == "class " and outs[0].finish_reason == "stop"
    assert outs[4].finish_reason == "error" and tok.decode(outs[4].token_ids) == "class"


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_with_no_allowed_token_ends_the_request_in_error(small, differ, kind):
    """-inf on every token the grammar allows at the start (d, c), or after 'class' (the space); min_new_tokens
    holding back the grammar's terminator; every token banned: each ends its request with its own message, the
    earlier tokens kept, the rest of the batch unharmed."""
    tok = small.tokenizer
    regex = r"(def|class) [A-Za-z_]+"
    reqs = [
        SamplingParams(max_new_tokens=12, regex=regex, logit_bias={ord("d"): NEG_INF, ord("c"): NEG_INF}),
        SamplingParams(max_new_tokens=12, regex=regex, logit_bias={32: NEG_INF}, return_logprob=True),
        SamplingParams(max_new_tokens=12, regex="x = [0-9]", min_new_tokens=8),
        SamplingParams(max_new_tokens=6, logit_bias={t: NEG_INF for t in range(258)}),
        SamplingParams(max_new_tokens=12, regex=regex),
    ]
    d = differ
    spec = random_spec(random.Random(1), kind, draft_of(small, kind))
    outs = d.engine(kind, spec, "reference").generate([tok.encode(ISSUE_PROMPT)] * len(reqs), reqs)
    texts = [tok.decode(o.token_ids) for o in outs]
    assert [o.finish_reason for o in outs] == ["error", "error", "error", "error", "length"]
    assert texts[0] == texts[3] == "" and texts[1] == "class" and texts[4].startswith("class ")
    assert re.fullmatch("x = [0-9]", texts[2])
    assert outs[0].error == ("request 0: after 0 output tokens, the grammar allows no token that a logit_bias of -inf "
                             "left; the request was stopped there (they are kept)")
    assert "request 1: after 5 output tokens, the grammar allows no token that a logit_bias of -inf" in outs[1].error
    assert len(outs[1].logprobs) == 5 and all(x > NEG_INF for x in outs[1].logprobs)
    assert ("request 2: after 5 output tokens, the grammar allows no token that min_new_tokens=8 (holding the stop ids "
            "back) left") in outs[2].error
    assert "request 3: after 0 output tokens, a logit_bias of -inf left no token with a finite logit" in outs[3].error
    for sp, out in zip(reqs, outs):
        assert_same(out, d.baseline(tok.encode(ISSUE_PROMPT), sp), kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_row_with_no_allowed_token_ends_the_request_in_error_fast(small, differ, kind):
    tok = small.tokenizer
    reqs = [SamplingParams(max_new_tokens=12, regex=r"(def|class) [A-Za-z_]+", logit_bias={32: NEG_INF}),
            SamplingParams(max_new_tokens=12, regex=r"(def|class) [A-Za-z_]+")]
    d = differ
    spec = random_spec(random.Random(1), kind, draft_of(small, kind))
    outs = d.engine(kind, spec, "fast").generate([tok.encode(ISSUE_PROMPT)] * 2, reqs)
    for sp, out in zip(reqs, outs):
        assert_same(out, d.baseline(tok.encode(ISSUE_PROMPT), sp), kind)
    assert outs[0].finish_reason == "error" and tok.decode(outs[0].token_ids) == "class"


def test_empty_rows_are_decoded_without_nan(small):
    """The shaped logits of an emptied row are a uniform row: no NaN reaches verify, sampling or the logprobs."""
    tok = small.tokenizer
    sp = SamplingParams(max_new_tokens=6, temperature=1.0, logit_bias={t: NEG_INF for t in range(258)},
                        return_logprob=True)
    e = Engine(small.target, draft=small.eagle, spec=SpecConfig(3, 2, 5, draft_penalties=True), impl="reference")
    worker = e.worker
    step = worker.prefill([tok.encode("x")], [sp.validated(0, 258)], 0)
    assert step.empty.tolist() == [1]
    assert torch.isfinite(step.logits_output.next_token_logits).all()
    assert torch.isfinite(step.logits_output.next_token_logprobs).all()
    worker.finish()


@pytest.mark.parametrize("worker", ["EAGLE tree S5 K4 W16", "MTP MiMo S3"])
def test_an_emptied_row_through_the_graph_buffers(small, differ, worker):
    """A penalised batch (no grammar) takes the CUDA-graph path, padded to its bucket (3 left -> 4): min_new_tokens
    holding back every token a -inf bias left ends one request in error at its first token (a penalty-only row is
    emptied from the start or never), as target-only ends it; the others decode on through the graphs' static
    buffers (replayed eagerly here), whose steps carry the emptied-row codes."""
    from specdec.workers.graphs import DecodeGraphs
    kind, spec = ZOO_WORKERS[worker]
    engine = Engine(small.target, draft=getattr(small, kind), spec=spec, impl="reference", max_batch=4,
                    max_seq_len=MAX_SEQ_LEN)
    graphs = DecodeGraphs(engine.worker, capture=False)
    codes = []

    def through_graphs():
        step = graphs.decode_step()
        codes.append(step.empty)
        return step

    engine._decode = through_graphs
    allowed = [ord(c) for c in "ab\n"]
    reqs = [SamplingParams(max_new_tokens=10, min_new_tokens=6, stop_token_ids=allowed, return_logprob=True,
                           logit_bias={t: NEG_INF for t in range(258) if t not in allowed}),
            SamplingParams(max_new_tokens=16, frequency_penalty=0.5, return_logprob=True, top_logprobs_num=2),
            SamplingParams(max_new_tokens=16, repetition_penalty=1.3),
            SamplingParams(max_new_tokens=12, presence_penalty=1.0, stop_token_ids=[10])]
    prompts = [small.tokenizer.encode(p) for p in ("x = ", "def f(a, b):\n", "import", "class B(A):\n")]
    outs = engine.generate(prompts, reqs)
    assert outs[0].finish_reason == "error" and outs[0].token_ids == [] and "min_new_tokens=6" in outs[0].error
    assert codes and all(c is not None and not c.any() for c in codes)
    for p, sp, out in zip(prompts, reqs, outs):
        assert_same(out, differ.baseline(p, sp), worker)


def test_the_cases_draw_every_rule_and_drafting_a_kind_can_run():
    """Over many draws, each kind of the pair takes every rule that runs on its shapes and its drafting: the sampled
    rules are fuzzed like the rest."""
    rng, seen = random.Random(5), set()
    for _ in range(400):
        for kind in KINDS[1:]:
            spec = random_spec(rng, kind, type("Draft", (), {"num_layers": 3, "block_size": 7})())
            seen.add((kind, spec.topk > 1, spec.verify, spec.draft_sampling))
    for kind in KINDS[1:]:
        for rule in VERIFY_RULES.values():
            chains_only = all(s.topk == 1 for s in DRAFT_KINDS[kind].demo_specs)  # MTP's layers, DSpark's block
            for tree in ([False] if chains_only else [False, True]):
                if rule.runs_on(2 if tree else 1) and (rule.stopped_chains or not DRAFT_KINDS[kind].stops_chains):
                    assert (kind, tree, rule.name, "sample") in seen, (kind, tree, rule.name)
        assert (kind, False, "target_only", "topk") in seen
