"""Structured output: the bitmask op against its per-token loop and fast against reference; the per-node
masks of random trees against fresh matchers per path; every worker's outputs parse, satisfy the grammar and are
token-identical to plain greedy decoding with the grammar (a fresh matcher per step); the exact distribution when
sampling; cut windows, bad input, mixed batches."""
from __future__ import annotations

import builtins
import dataclasses
import json
import random
import re

import pytest
import torch

import fast
import reference
from reference.naive import apply_token_bitmask_naive
from specdec import Engine, SamplingParams, SpecConfig, zoo
from specdec.checks import ArgumentTypeError
from tests.helpers import FALSE_FAILURE_RATE, LOGPROB_ATOL, chi_square_pvalue, near_bigram_target, perfect_eagle, \
    perfect_mtp
from tests.helpers import ZOO_WORKERS as WORKERS
from specdec.lab import target_law
from tests.helpers.oracles import grammar_allowed, grammar_greedy_decode

OPS = {"reference": reference.apply_token_bitmask, "naive": apply_token_bitmask_naive,
       "fast": fast.apply_token_bitmask}


def _random_bitmask(N, V, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-2 ** 31, 2 ** 31 - 1, (N, (V + 31) // 32), generator=gen, dtype=torch.int64).to(torch.int32)


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("N, V", [(1, 1), (3, 32), (4, 33), (5, 258), (2, 1500)])
def test_the_op_equals_the_per_token_loop(impl, N, V):
    x = torch.randn(N, V, generator=torch.Generator().manual_seed(V))
    bitmask = _random_bitmask(N, V, N + V)
    bitmask[0] = -1  # all allowed, and a row of nothing allowed
    if N > 1:
        bitmask[1] = 0
    got = OPS[impl](x, bitmask)
    assert got.dtype == torch.float32
    assert torch.equal(got, apply_token_bitmask_naive(x, bitmask))
    allowed = torch.isfinite(got)
    for n in range(N):  # bit j of word i allows token 32 i + j, by hand
        for v in range(0, V, 7):
            assert bool(allowed[n, v]) == bool((int(bitmask[n, v // 32]) >> (v % 32)) & 1)


def test_the_op_reads_bf16_and_strided_logits():
    x = torch.randn(6, 80, generator=torch.Generator().manual_seed(1))
    bitmask = _random_bitmask(3, 40, 2)
    strided = x.to(torch.bfloat16)[::2, :40]
    want = apply_token_bitmask_naive(strided, bitmask)
    assert torch.equal(reference.apply_token_bitmask(strided, bitmask), want)
    assert torch.equal(fast.apply_token_bitmask(strided, bitmask), want)


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("edit, error, match", [
    (lambda x, m: (x, m.long()), ArgumentTypeError, "bitmask must have the int32 dtype"),
    (lambda x, m: (x, m[:, :-1]), ValueError, r"bitmask must have shape \(3, 9\)"),
    (lambda x, m: (x, m[:2]), ValueError, "bitmask must have shape"),
    (lambda x, m: (x.long(), m), ArgumentTypeError, "logits must have a floating-point dtype"),
    (lambda x, m: (x[0], m), ValueError, "logits must have shape"),
    (lambda x, m: (x, "mask"), ArgumentTypeError, "bitmask must be a torch.Tensor"),
])
def test_bad_op_arguments_are_value_errors(impl, edit, error, match):
    x, m = edit(torch.randn(3, 258), _random_bitmask(3, 258, 0))
    with pytest.raises(error, match=match):
        OPS[impl](x, m)


# ---- the host side: per-node masks ---------------------------------------------------------------------
xgr = pytest.importorskip("xgrammar")
from specdec.grammar import GrammarBatch, GrammarCompiler  # noqa: E402 (needs xgrammar)

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "color": {"enum": ["red", "green", "blue"]}},
          "required": ["name", "age", "color"], "additionalProperties": False}
DATE = r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
IDENT = r"[a-z_][a-z0-9_]{0,11}"
EBNF = 'root ::= "def " name "(" name ")"\nname ::= [a-z] [a-z_]*'
EBNF_RE = r"def [a-z][a-z_]*\([a-z][a-z_]*\)"
EOS = zoo.ByteTokenizer.eos_token_id


def _check_schema(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"name", "age", "color"}, value
    assert isinstance(value["name"], str) and len(value["name"]) <= 12
    assert isinstance(value["age"], int) and not isinstance(value["age"], bool) and 0 <= value["age"] <= 150
    assert value["color"] in ("red", "green", "blue")


GRAMMARS = {  # name -> (SamplingParams fields, a check of the decoded text of a finished output)
    "json": (dict(json_schema=json.dumps(SCHEMA)), _check_schema),
    "date": (dict(regex=DATE), lambda text: re.fullmatch(DATE, text) or pytest.fail(text)),
    "ident": (dict(regex=IDENT), lambda text: re.fullmatch(IDENT, text) or pytest.fail(text)),
    "ebnf": (dict(ebnf=EBNF), lambda text: re.fullmatch(EBNF_RE, text) or pytest.fail(text)),
}


def _compiled(name):
    return GrammarCompiler(zoo.ByteTokenizer(), 258).compile(SamplingParams(**GRAMMARS[name][0]), 0)


def _random_tree(W, seed, compiled, prefix):
    """A random tree over W nodes (parent < child), most tokens drawn from what the grammar allows after the
    parent's path, some anywhere -> candidates, retrieve_next_token, retrieve_next_sibling (W,) int64, paths."""
    rng = random.Random(seed)
    parent, tokens, paths = [-1], [0], [[]]
    for i in range(1, W):
        p = rng.randrange(i)
        allowed = grammar_allowed(compiled, prefix + paths[p])
        tok = rng.choice(sorted(allowed)) if allowed and rng.random() < 0.8 else rng.randrange(258)
        parent.append(p)
        tokens.append(tok)
        paths.append(paths[p] + [tok])
    next_token, next_sibling = [-1] * W, [-1] * W
    for i in range(W - 1, 0, -1):  # children linked smallest index first
        next_sibling[i] = next_token[parent[i]]
        next_token[parent[i]] = i
    return torch.tensor(tokens), torch.tensor(next_token), torch.tensor(next_sibling), paths


@pytest.mark.parametrize("name", list(GRAMMARS))
@pytest.mark.parametrize("seed", range(3))
def test_per_node_masks_equal_a_fresh_matcher_per_path(name, seed):
    compiled = _compiled(name)
    prefixes = {"json": list(b'{"name": "a'), "date": list(b"20"), "ident": [], "ebnf": list(b"def f")}
    prefix = prefixes[name]
    W, B = 12, 3
    trees = [_random_tree(W, seed * 10 + b, compiled, prefix) for b in range(B)]
    batch = GrammarBatch([compiled, None, compiled], 258)
    batch.advance([prefix, [1, 2, 3], prefix], [len(prefix), 3, len(prefix)])
    cand, nt, ns = (torch.stack([t[k] for t in trees]) for k in range(3))
    bitmask = batch.fill_tree(cand, nt, ns)
    root_before = batch.fill_roots()
    for b in range(B):
        for i in range(W):
            words = [w & 0xFFFFFFFF for w in bitmask[b * W + i].tolist()]
            got = {v for v in range(258) if (words[v // 32] >> (v % 32)) & 1}
            want = None if b == 1 else grammar_allowed(compiled, prefix + trees[b][3][i])
            assert got == (set(range(258)) if want is None else want), (b, i)
    assert torch.equal(batch.fill_roots(), root_before)  # filling left the matchers where they were
    assert torch.equal(root_before[1], torch.full_like(root_before[1], -1))


# ---- the engine: every worker ---------------------------------------------------------------------------

PROMPTS = {"json": "person = ", "date": "released on ", "ident": "def ", "ebnf": "class A:\n    "}


def _engine(small, worker, impl="reference", **kw):
    kind, spec = WORKERS[worker] if worker != "target-only" else (None, None)
    return Engine(small.target, None if kind is None else getattr(small, kind), spec, impl=impl,
                  tokenizer=small.tokenizer, **kw)


def _params(name, **kw):
    return SamplingParams(max_new_tokens=kw.pop("max_new_tokens", 60), **GRAMMARS[name][0], **kw)


def _check_outputs(small, name, outs):
    for o in outs:
        text = small.tokenizer.decode(o.token_ids)
        assert o.finish_reason == "stop" and o.token_ids[-1] == EOS, (o.finish_reason, text)
        GRAMMARS[name][1](small.tokenizer.decode(o.token_ids[:-1]))


@pytest.fixture(scope="module")
def baselines(small):
    """name -> (prompt, greedy output of plain decoding with the grammar, a fresh matcher per step)."""
    out = {}
    for name in GRAMMARS:
        prompt = small.tokenizer.encode(PROMPTS[name])
        out[name] = prompt, grammar_greedy_decode(small.target, prompt, _compiled(name), [EOS], 60)
    return out


@pytest.mark.parametrize("name", list(GRAMMARS))
def test_target_only_equals_plain_decoding_with_a_fresh_matcher(small, baselines, name):
    prompt, want = baselines[name]
    outs = _engine(small, "target-only").generate([prompt], _params(name))
    assert outs[0].token_ids == want
    _check_outputs(small, name, outs)


@pytest.mark.parametrize("worker", list(WORKERS))
@pytest.mark.parametrize("name", list(GRAMMARS))
def test_every_worker_is_greedy_identical_and_satisfies_the_grammar(small, baselines, worker, name):
    prompt, want = baselines[name]
    engine = _engine(small, worker)
    outs = engine.generate([prompt, small.tokenizer.encode("x = ")], _params(name))
    assert outs[0].token_ids == want
    _check_outputs(small, name, outs)
    assert max(outs[0].accept_lens) > 1  # speculation did accept drafts under the grammar


# the interpreter is slow (the tree case alone took 400 s on a loaded CI-like machine): CI reaches the fast path
# under a grammar through test_masked_drafts_on_the_fast_path (the same tree, masks over it and over the drafts)
@pytest.mark.slow
@pytest.mark.parametrize("worker", ["target-only", "EAGLE tree S5 K4 W16", "MTP Step-3.5 S3"])
def test_the_fast_workers_are_greedy_identical(small, baselines, worker):
    prompt, want = baselines["json"]
    outs = _engine(small, worker, impl="fast").generate([prompt], _params("json"))
    assert outs[0].token_ids == want


@pytest.mark.slow
@pytest.mark.parametrize("worker", list(WORKERS))
@pytest.mark.parametrize("name", ["date", "ebnf"])
def test_the_fast_workers_full_grid(small, baselines, worker, name):
    prompt, want = baselines[name]
    outs = _engine(small, worker, impl="fast").generate([prompt], _params(name))
    assert outs[0].token_ids == want


@pytest.mark.parametrize("worker", ["target-only", "EAGLE tree S5 K4 W16", "MTP MiMo S3"])
def test_logprobs_follow_target_only_under_the_grammar(small, baselines, worker):
    prompt, _ = baselines["json"]
    params = _params("json", return_logprob=True, top_logprobs_num=3)
    base = _engine(small, "target-only").generate([prompt], params)[0]
    got = _engine(small, worker).generate([prompt], params)[0]
    assert got.token_ids == base.token_ids
    assert max(abs(a - b) for a, b in zip(got.logprobs, base.logprobs)) <= LOGPROB_ATOL
    for top in got.top_logprobs:  # a masked token never shows up among the top logprobs with a finite value
        assert all(v > float("-inf") for v, _ in top[:1])


@pytest.mark.parametrize("worker", ["EAGLE tree S5 K4 W16", "MTP Step-3.5 S3"])
def test_a_grammar_that_ends_inside_a_window_cuts_the_tokens_and_logprobs(small, worker):
    prompt = small.tokenizer.encode("year = ")
    params = SamplingParams(max_new_tokens=40, regex=r"19\d\d", return_logprob=True)
    base = _engine(small, "target-only").generate([prompt], params)[0]
    got = _engine(small, worker).generate([prompt], params)[0]
    assert got.token_ids == base.token_ids and len(got.token_ids) == 5 and got.token_ids[-1] == EOS
    assert len(got.logprobs) == 5 and got.finish_reason == "stop"
    assert sum(got.accept_lens) >= len(got.token_ids) - 1  # the last window may hold more than was emitted


def test_max_new_tokens_cuts_a_grammar_request(small):
    outs = _engine(small, "EAGLE tree S5 K4 W16").generate([small.tokenizer.encode("a = ")],
                                                          _params("json", max_new_tokens=7))
    assert outs[0].finish_reason == "length" and len(outs[0].token_ids) == 7
    assert small.tokenizer.decode(outs[0].token_ids).startswith('{"name"')


def test_a_mixed_batch_with_penalties_and_no_grammar(small, baselines):
    prompt, want = baselines["date"]
    plain = SamplingParams(max_new_tokens=20)
    penal = SamplingParams(max_new_tokens=20, frequency_penalty=1.0, repetition_penalty=1.2)
    both = _params("ident", presence_penalty=0.5)
    reqs = [(prompt, _params("date")), (prompt, plain), (prompt, penal), (small.tokenizer.encode("def "), both)]
    for worker in ("EAGLE tree S5 K4 W16", "MTP MiMo S3"):
        outs = _engine(small, worker).generate([p for p, _ in reqs], [s for _, s in reqs])
        alone = [_engine(small, "target-only").generate([p], s)[0] for p, s in reqs]
        for o, a in zip(outs, alone):
            assert o.token_ids == a.token_ids
        assert outs[0].token_ids == want
        _check_outputs(small, "ident", outs[3:])


# ---- sampling: the exact distribution under a grammar that cuts the vocabulary -----------------------------

@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_sampling_under_a_grammar_is_the_exact_distribution(kind):
    V, n_tokens, N = 6, 3, 3000
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3)
    info = xgr.TokenizerInfo(["a", "b", "c", "d", "e", ""], vocab_size=V, stop_token_ids=[5])
    regex = "[ab][bcd]*"  # a cut vocabulary: e never, the stop token only after the first token
    params = SamplingParams(max_new_tokens=n_tokens, temperature=0.8, regex=regex, stop_token_ids=[5])
    exact = target_law(target, [1, 2], n_tokens, params, tokenizer=info)
    draft, spec = {"target-only": (None, None), "eagle": (perfect_eagle(target), SpecConfig(3, 2, 6)),
                   "mtp": (perfect_mtp(target, 3, True), SpecConfig(3))}[kind]
    engine = Engine(target, draft, spec, impl="reference", max_batch=N, max_seq_len=16, tokenizer=info)
    outs = engine.generate([[1, 2]] * N, params, seed=7)
    counts = dict.fromkeys(exact, 0)
    for o in outs:
        counts[tuple(o.token_ids)] += 1  # a sequence outside the support fails here
    if kind != "target-only":
        assert any(a > 1 for o in outs for a in o.accept_lens)
    assert chi_square_pvalue(counts, exact) > FALSE_FAILURE_RATE


# ---- bad input ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, error, match", [
    (dict(json_schema='{"type": "object", '), ValueError, "request 1: its json_schema does not compile"),
    (dict(json_schema={"type": "nonsense"}), ValueError, "request 1: its json_schema does not compile"),
    (dict(regex="[a-"), ValueError, "request 1: its regex does not compile"),
    (dict(ebnf="root ::= foo"), ValueError, "request 1: its ebnf does not compile"),
    (dict(regex="a", ebnf='root ::= "a"'), ValueError, "request 1: at most one of json_schema, regex and ebnf"),
    (dict(regex=3), ValueError, "request 1: regex must be a string"),
])
def test_bad_grammars_are_one_line_errors_and_the_engine_keeps_serving(small, kw, error, match):
    engine = _engine(small, "EAGLE tree S5 K4 W16")
    with pytest.raises(error, match=match) as info:
        engine.generate([[1, 2], [3, 4]], [SamplingParams(max_new_tokens=4), SamplingParams(max_new_tokens=4, **kw)])
    assert "\n" not in str(info.value)
    assert engine.worker.cache.num_free == engine.worker.cache.max_batch  # every row it holds is free
    assert len(engine.generate([[1, 2]], _params("date"))[0].token_ids) > 0


def test_a_grammar_without_a_tokenizer_is_a_value_error(small):
    engine = Engine(small.target, impl="reference")
    with pytest.raises(ValueError, match="request 0: a json_schema, regex or ebnf needs the engine's vocabulary"):
        engine.generate([[1, 2]], _params("date"))
    assert engine.generate([[1, 2]], SamplingParams(max_new_tokens=2))[0].token_ids


def test_a_grammar_without_xgrammar_names_the_extra(small, monkeypatch):
    real_import = builtins.__import__

    def no_xgrammar(name, *args, **kw):
        if name == "xgrammar" or name.startswith("xgrammar."):
            raise ImportError("No module named 'xgrammar'")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_xgrammar)
    engine = _engine(small, "target-only")
    with pytest.raises(ImportError, match=r"needs xgrammar: pip install 'specdec\[grammar\]'"):
        engine.generate([[1, 2]], _params("date"))
    assert engine.generate([[1, 2]], SamplingParams(max_new_tokens=2))[0].token_ids  # no grammar: no xgrammar


def test_a_grammar_batch_pays_nothing_when_no_request_has_one(small):
    engine = _engine(small, "EAGLE tree S5 K4 W16")
    engine.generate([[1, 2]], SamplingParams(max_new_tokens=4))
    assert engine.worker.grammar is None
    params = dataclasses.replace(_params("date"), stop_token_ids=[EOS, 10])
    outs = engine.generate([[1, 2]], params)
    assert engine.worker.grammar is not None and engine.worker.grammar.fill_seconds > 0
    assert outs[0].token_ids[-1] in (EOS, 10)


# ---- masked drafts ----------------------------------------------------------------------------------------

def test_path_masks_equal_a_fresh_matcher_per_path():
    compiled = _compiled("json")
    prefix = list(b'{"name": "')
    cand, _, _, paths = _random_tree(10, 5, compiled, prefix)
    R, L = 6, 10
    rng = random.Random(3)
    rows = torch.zeros(2, R, L, dtype=torch.bool)
    for r in range(R):  # a random node's ancestry (its path's nodes), as a frontier row marks it
        node = rng.randrange(L)
        anc = [i for i in range(1, L) if paths[i] == paths[node][:len(paths[i])] and i <= node]
        rows[:, r, anc] = True
    batch = GrammarBatch([compiled, None], 258)
    batch.advance([prefix, []], [len(prefix), 0])
    before = batch.fill_roots()
    bitmask = batch.fill_paths(torch.stack([cand, cand]), rows)
    for r in range(R):
        path = [int(cand[j]) for j in range(1, L) if rows[0, r, j]]
        words = [w & 0xFFFFFFFF for w in bitmask[r].tolist()]
        want = grammar_allowed(compiled, prefix + path)
        assert {v for v in range(258) if (words[v // 32] >> (v % 32)) & 1} == (set(range(258)) if want is None
                                                                               else want)
        assert torch.equal(bitmask[R + r], torch.full_like(bitmask[R + r], -1))
    assert torch.equal(batch.fill_roots(), before)


@pytest.mark.parametrize("worker", list(WORKERS))
def test_masked_drafts_change_only_the_proposals_and_accept_more(small, baselines, worker):
    prompt, want = baselines["json"]
    kind, spec = WORKERS[worker]
    accept = {}
    for masked in (False, True):
        engine = Engine(small.target, getattr(small, kind), dataclasses.replace(spec, draft_grammar=masked),
                        impl="reference", tokenizer=small.tokenizer)
        outs = engine.generate([prompt, small.tokenizer.encode("x = ")], _params("json"))
        assert outs[0].token_ids == want
        _check_outputs(small, "json", outs)
        accept[masked] = engine.last_stats.mean_accept_len
    assert accept[True] >= accept[False], accept


def test_masked_drafts_on_the_fast_path(small, baselines):
    prompt, want = baselines["date"]
    # a smaller tree than the reference cases': the interpreted kernels pay per node
    engine = Engine(small.target, small.eagle, SpecConfig(3, 2, 6, draft_grammar=True), impl="fast",
                    tokenizer=small.tokenizer)
    assert engine.generate([prompt], _params("date"))[0].token_ids == want


def test_a_reduced_draft_vocabulary_reads_its_ids_bits():
    ids = torch.randperm(258, generator=torch.Generator().manual_seed(0))[:100]
    bitmask = _random_bitmask(3, 258, 4)
    remapped = GrammarBatch.remap(bitmask, ids)
    assert remapped.shape == (3, 4) and remapped.dtype == torch.int32
    assert torch.equal(torch.isfinite(reference.apply_token_bitmask(torch.zeros(3, 100), remapped)),
                       torch.isfinite(reference.apply_token_bitmask(torch.zeros(3, 258), bitmask))[:, ids])


def test_draft_grammar_is_checked():
    with pytest.raises(ValueError, match="draft_grammar must be True or False"):
        SpecConfig(3, draft_grammar=1)


@pytest.mark.parametrize("kind", ["eagle", "mtp_chain"])
def test_sampling_with_masked_drafts_is_the_exact_distribution(kind):
    V, n_tokens, N = 6, 3, 3000
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3)
    info = xgr.TokenizerInfo(["a", "b", "c", "d", "e", ""], vocab_size=V, stop_token_ids=[5])
    params = SamplingParams(max_new_tokens=n_tokens, temperature=0.8, regex="[ab][bcd]*", stop_token_ids=[5])
    exact = target_law(target, [1, 2], n_tokens, params, tokenizer=info)
    draft, spec = ((perfect_eagle(target), SpecConfig(3, 2, 6, draft_grammar=True)) if kind == "eagle"
                   else (perfect_mtp(target, 3, False), SpecConfig(3, draft_grammar=True)))
    engine = Engine(target, draft, spec, impl="reference", max_batch=N, max_seq_len=16, tokenizer=info)
    outs = engine.generate([[1, 2]] * N, params, seed=11)
    counts = dict.fromkeys(exact, 0)
    for o in outs:
        counts[tuple(o.token_ids)] += 1  # a sequence outside the support fails here
    assert any(a > 1 for o in outs for a in o.accept_lens)
    assert chi_square_pvalue(counts, exact) > FALSE_FAILURE_RATE


def test_a_grammar_batch_leaves_the_graph_path_and_the_next_batch_takes_it_again(small, baselines):
    from specdec.workers.graphs import DecodeGraphs
    engine = _engine(small, "EAGLE tree S5 K4 W16")
    graphs = DecodeGraphs(engine.worker, capture=False)  # the graph path's static buffers, replayed eagerly
    calls = []

    def through_graphs():
        calls.append(1)
        return graphs.decode_step()

    engine._decode = through_graphs
    plain = SamplingParams(max_new_tokens=24)
    free = engine.generate([[1, 2, 3]], plain)[0].token_ids
    assert calls
    calls.clear()
    prompt, want = baselines["ident"]
    assert engine.generate([prompt], _params("ident"))[0].token_ids == want
    assert not calls  # a grammar batch decodes eagerly
    assert engine.generate([[1, 2, 3]], plain)[0].token_ids == free and calls


@pytest.mark.parametrize("impl", ["reference", pytest.param("fast", marks=pytest.mark.slow)])
def test_sampled_outputs_satisfy_the_grammar(small, impl):
    engine = _engine(small, "EAGLE tree S5 K4 W16", impl=impl)
    prompts = [small.tokenizer.encode(p) for p in ("person = ", "x = ", "def f():\n    return ")]
    outs = engine.generate(prompts, _params("json", temperature=0.9, top_p=0.95), seed=3)
    for o in outs:
        if o.finish_reason == "stop":
            _check_outputs(small, "json", [o])
        else:  # cut by max_new_tokens: a prefix the grammar allows
            assert grammar_allowed(_compiled("json"), o.token_ids) is not None
