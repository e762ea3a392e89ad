"""Sampled drafting and verification with the draft's distribution (SpecConfig.draft_sampling / verify).

The ops: draws without replacement against the Plackett-Luce law, the rules' reductions to one another and their
accepted lengths on the same draws. Through the engine, one oracle: every verify rule on every shape its record claims
(`VerifyRule.check_shapes`), through every drafting kind, under top-k / top-p, penalties and a grammar, checked by the
exact-law checker (`specdec.lab.exact_law`: every draw and coin enumerated), and a deep tree by its Monte-Carlo mode;
greedy requests unchanged; the refusals."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
import xgrammar as xgr

from reference import (chain_speculative_sampling_block, sample_without_replacement,
                       tree_speculative_sampling_rejection, tree_speculative_sampling_target_only,
                       tree_speculative_sampling_traversal)
from specdec import Engine, SamplingParams, SpecConfig, lab
from specdec.draft_kinds import BUILT_IN, DRAFT_KINDS
from specdec.lab.scripted import ScriptedDraft
from specdec.models.bigram import near_bigram_target, perfect_eagle, perfect_mtp
from specdec.models.dflash import random_dflash
from specdec.models.dspark import random_dspark
from specdec.models.eagle3 import random_eagle3_head
from specdec.models.llama import random_llama
from specdec.models.ngram import NgramDraft
from specdec.models.suffix import SuffixDraft
from specdec.verify_rules import VERIFY_RULES
from specdec.workers.graphs import DecodeGraphs
from tests.helpers.equivalence import no_host_sync
from tests.helpers import FALSE_FAILURE_RATE, chi_square_pvalue
from tests.helpers.oracles import plackett_luce, tree_links

SAMPLE = {"draft_sampling": "sample"}
#: what float32 rounding of the engine's probabilities leaves of a lossless rule's exact law
LOSSLESS = 1e-6


# ---- the ops ------------------------------------------------------------------------------------------------------

def test_draws_without_replacement_follow_the_plackett_luce_law():
    q = [0.05, 0.4, 0.25, 0.2, 0.1]
    N, K = 60000, 3
    gen = torch.Generator().manual_seed(1)
    draws = sample_without_replacement(torch.tensor(q).expand(N, 5).contiguous() * 3.0, torch.rand(N, K, generator=gen))
    counts = Counter(map(tuple, draws.tolist()))
    assert chi_square_pvalue(counts, plackett_luce(q, K)) > FALSE_FAILURE_RATE
    wrong = [0.05, 0.38, 0.27, 0.2, 0.1]  # one probability off by 2 points: the same test catches it
    assert chi_square_pvalue(counts, plackett_luce(wrong, K)) < FALSE_FAILURE_RATE


def test_a_row_with_fewer_tokens_than_draws_repeats_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.7, 0.0, 0.3], [0.0, 0.0, 0.0, 0.0]])
    draws = sample_without_replacement(probs, torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.3, 0.3]]))
    assert sorted(draws[0, :2].tolist()) == [1, 3] and draws[0, 2].item() in (1, 3)  # a repeat: q = 0 left
    assert draws[1].tolist() == [3, 3, 3]


def chain_links(B, W):
    index = torch.arange(B * W).view(B, W)
    nxt = torch.cat([torch.arange(1, W), torch.tensor([-1])]).expand(B, W).contiguous()
    return index, nxt, torch.full((B, W), -1)


def tables(V, seed):
    """Prefix-dependent target and draft laws: P[t] after token t, and a draft Q[t] that half agrees with it."""
    gen = torch.Generator().manual_seed(seed)
    P = torch.softmax(torch.randn(V, V, generator=gen) * 1.5, -1)
    Q = torch.softmax(torch.randn(V, V, generator=gen) * 1.5 + 0.8 * P.log(), -1)
    return P, Q


def drafted_chain(B, S, Q, gen):
    """B chains of S tokens after root 0, each drawn from Q[the token before it]; their links and the rules' coins."""
    tokens = [torch.zeros(B, dtype=torch.long)]
    for _ in range(S):
        tokens.append(sample_without_replacement(Q[tokens[-1]], torch.rand(B, 1, generator=gen))[:, 0])
    index, nxt, sib = chain_links(B, S + 1)
    return (torch.stack(tokens, 1), index, nxt, sib, torch.rand(B, S + 1, generator=gen),
            torch.rand(B, generator=gen))


def test_block_verification_accepts_at_least_token_wise_rejection():
    V, B, S = 5, 60000, 4
    P, Q = tables(V, seed=8)
    gen = torch.Generator().manual_seed(9)
    cand, index, nxt, sib, coins, final = drafted_chain(B, S, Q, gen)
    block = chain_speculative_sampling_block(cand, index, coins, final, P[cand], Q[cand], S)[2].float().mean()
    token_wise = tree_speculative_sampling_rejection(cand, index, nxt, sib, coins, final, P[cand], Q[cand],
                                                     S)[2].float().mean()
    assert block >= token_wise + 0.01  # 60k chains: the standard error of either mean is ~0.005


def test_a_one_hot_target_makes_rejection_greedy():
    """At a one-hot target the rule accepts exactly the drafted tokens that are the target's argmax."""
    B, V, W = 4, 6, 4
    cand = torch.tensor([[0, 2, 3, 1], [0, 2, 4, 1], [0, 5, 3, 1], [0, 2, 3, 2]])
    index, nxt, sib = chain_links(B, W)
    best = torch.tensor([2, 3, 1, 4])  # the target's argmax after each node, every request alike
    tp = torch.nn.functional.one_hot(best, V).float().expand(B, W, V).contiguous()
    dp = torch.full((B, W, V), 1.0 / V)
    out = tree_speculative_sampling_rejection(cand, index, nxt, sib, torch.rand(B, W), torch.rand(B), tp, dp, 3)
    assert out[2].tolist() == [3, 1, 0, 2]


#: a depth-3 tree, each node's parent (node 0 the root): the root's children 1, 2; node 1's 3, 4; node 2's 5;
#: node 3's 6, 7; node 5's 8. Siblings in node order are drawn in that order.
DEEP_PARENTS = [-1, 0, 0, 1, 1, 2, 3, 3, 5]


def drafted_from_parents(B, parents, Q, gen):
    """B trees of the shape `parents`, each node's children drawn from Q[its token] without replacement (the root's
    token 0) -> (candidates, index, next_token, next_sibling)."""
    W = len(parents)
    kids = [[c for c in range(W) if parents[c] == n] for n in range(W)]
    cand = torch.zeros(B, W, dtype=torch.long)
    for n in range(W):
        if kids[n]:
            cand[:, kids[n]] = sample_without_replacement(Q[cand[:, n]], torch.rand(B, len(kids[n]), generator=gen))
    nxt, sib = (torch.tensor(links).expand(B, W).contiguous() for links in tree_links(parents))
    return cand, torch.arange(B * W).view(B, W), nxt, sib


def test_on_the_same_draws_rejection_accepts_more_than_target_only_and_traversal_more_than_rejection():
    """What the rules are for, on one deep tree's draws and coins: the draft's distribution keeps more tokens than
    the target alone, and traversal's sequence-level weights more than token-wise rejection (their laws are the
    checker's, below)."""
    V, B, S = 4, 100000, 3
    P, Q = tables(V, seed=12)
    gen = torch.Generator().manual_seed(13)
    cand, index, nxt, sib = drafted_from_parents(B, DEEP_PARENTS, Q, gen)
    coins, final = torch.rand(B, len(DEEP_PARENTS), generator=gen), torch.rand(B, generator=gen)
    args = (cand, index, nxt, sib, coins, final, P[cand])
    target_only = tree_speculative_sampling_target_only(*args, S)[2].float().mean()
    rejection = tree_speculative_sampling_rejection(*args, Q[cand], S)[2].float().mean()
    traversal = tree_speculative_sampling_traversal(*args, Q[cand], S)[2].float().mean()
    assert rejection > target_only + 0.05 and traversal > rejection + 0.02  # standard errors ~0.003


def test_traversal_is_block_verification_on_a_chain_and_recursive_rejection_on_a_star():
    """Two independent ops it must reduce to, output for output: leaves-first on a chain tests the same stop
    weights as block verification, and a tree of depth one has nothing below its leaves."""
    V, B, S = 6, 4000, 4
    P, Q = tables(V, seed=14)
    gen = torch.Generator().manual_seed(15)
    cand, index, nxt, sib, coins, final = drafted_chain(B, S, Q, gen)
    traversal = tree_speculative_sampling_traversal(cand, index, nxt, sib, coins, final, P[cand], Q[cand], S)
    block = chain_speculative_sampling_block(cand, index, coins, final, P[cand], Q[cand], S)
    assert all(torch.equal(a, b) for a, b in zip(traversal, block))
    cand, index, nxt, sib = drafted_from_parents(B, [-1, 0, 0, 0, 0], Q, gen)
    coins, final = torch.rand(B, 5, generator=gen), torch.rand(B, generator=gen)
    traversal = tree_speculative_sampling_traversal(cand, index, nxt, sib, coins, final, P[cand], Q[cand], 1)
    rejection = tree_speculative_sampling_rejection(cand, index, nxt, sib, coins, final, P[cand], Q[cand], 1)
    assert all(torch.equal(a, b) for a, b in zip(traversal, rejection))
    assert 0 < traversal[2].float().mean() < 1


# ---- through the engine: every rule on its shapes, every drafting kind, one oracle ---------------------------------

#: the sweep's vocabulary: small enough to enumerate every draw and coin of a step
V = 3


@pytest.fixture(scope="module")
def target():
    return near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3)


@pytest.fixture(scope="module")
def big():
    """A six-token target: room for the draws of a tree of K = 2 and a ragged batch."""
    return near_bigram_target(seed=21, mix=0.5, vocab_size=6, hidden_size=16, num_attention_heads=2, init_std=0.3)


def biased(draft, attr):
    """A bigram-perfect draft made imperfect: its logits flattened and tilted, so acceptance is neither 0 nor 1."""
    f = getattr(draft, attr)
    vocab = draft.config.vocab_size
    setattr(draft, attr, lambda *a, **k: f(*a, **k) * 0.4 + torch.linspace(0, 1.5, vocab))
    return draft


#: a draft of each shipped kind for a target and a depth
DRAFTS = {
    "eagle": lambda t, S: biased(perfect_eagle(t), "compute_logits"),
    "eagle3": lambda t, S: random_eagle3_head(t, draft_vocab_size=t.config.vocab_size - 1, seed=3),
    "mtp": lambda t, S: biased(perfect_mtp(t, S, False), "layer_logits"),
    "mtp_chain": lambda t, S: biased(perfect_mtp(t, S, True), "layer_logits"),
    "dflash": lambda t, S: random_dflash(t, 1, 4, target_layer_ids=[0], mask_token_id=t.config.vocab_size - 1,
                                         seed=4),
    # a confidence threshold that caps some blocks: the law must hold whatever length the cap verifies
    "dspark": lambda t, S: random_dspark(t, 1, 4, target_layer_ids=[0], mask_token_id=t.config.vocab_size - 1,
                                         seed=4, markov_rank=4, std=0.6, confidence_threshold=0.5),
    "draft_lm": lambda t, S: random_llama(vocab_size=t.config.vocab_size, hidden_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, seed=2),
    "ngram": lambda t, S: NgramDraft(shared=False),
    # each path of the enumeration a request of its own: no global tree, so that no path proposes from another's
    "suffix": lambda t, S: SuffixDraft(max_cached_requests=0),
    # the target's greedy continuation at set agreement: the sampled paths leave it (then it proposes nothing)
    "scripted": lambda t, S: ScriptedDraft(t, (0.9, 0.6), runners_up=1),
}


def test_the_sweep_has_a_draft_of_every_shipped_kind():
    assert set(DRAFTS) == set(BUILT_IN)


def chains_only(kind: str) -> bool:
    """A kind whose every shape is a chain (MTP's layers, a DFlash block), by its record's demo shapes."""
    return all(spec.topk == 1 for spec in DRAFT_KINDS[kind].demo_specs)


def sweep() -> list:
    """(kind, rule, shape) for every lossless registered rule, each shape it is checked on and every shipped kind
    that can run it. CI runs each (rule, shape) of at most two tokens of breadth times depth once, on the kind used
    least so far, and every kind at least once; `-m slow` runs them all."""
    able = {}
    for rule in VERIFY_RULES.values():
        for shape in (rule.check_shapes if rule.lossless else ()):
            able[rule.name, shape] = [k for k in BUILT_IN if (shape[1] == 1 or not chains_only(k))
                                      and (DRAFT_KINDS[k].samples_drafts or not rule.reads_draft)]
    used = dict.fromkeys(BUILT_IN, 0)
    ci = set()
    for (rule, shape), kinds in able.items():
        if shape[0] * shape[1] <= 2:
            kind = min(kinds, key=lambda k: used[k])
            used[kind] += 1
            ci.add((kind, rule, shape))
    for kind in [k for k in BUILT_IN if not used[k]]:
        ci.add(next((kind, r, s) for (r, s), kinds in able.items() if kind in kinds and s[0] * s[1] <= 2))
    return [pytest.param(kind, rule, shape, marks=() if (kind, rule, shape) in ci else (pytest.mark.slow,),
                         id=f"{kind}-{rule}-{'-'.join(map(str, shape))}")
            for (rule, shape), kinds in able.items() for kind in kinds]


@pytest.mark.parametrize("kind,rule,shape", sweep())
def test_every_rule_runs_exactly_through_every_kind(target, kind, rule, shape):
    """The law of the first three tokens (the prefill's and the first decode step's two) after one decode step, every
    draw and coin enumerated, the target completing shorter emissions: the target's own, under top-p."""
    S, K, W = shape
    draft = DRAFTS[kind](target, S)
    if not VERIFY_RULES[rule].stopped_chains and DRAFT_KINDS[kind].stops_chains:
        draft.confidence_threshold = 0.0  # such a rule verifies DSpark's whole block (a capped one is refused)
    sampling = "sample" if DRAFT_KINDS[kind].samples_drafts else "topk"
    spec = SpecConfig(S, K, W, draft_sampling=sampling, verify=rule)
    report = lab.exact_law(target, draft, spec, SamplingParams(temperature=0.9, top_p=0.95), prompt=[1, 2], n=3,
                           steps=1)
    assert report.max_diff < LOSSLESS, report


def test_the_sweep_covers_every_kind_and_every_rules_shape_in_ci():
    ci = [p.values for p in sweep() if not p.marks]
    assert {k for k, _, _ in ci} == set(BUILT_IN)
    assert {(r, s) for _, r, s in ci} == {(r.name, s) for r in VERIFY_RULES.values() if r.lossless
                                          for s in r.check_shapes if s[0] * s[1] <= 2}
    assert {("tree" if s[1] > 1 else "chain") for _, r, s in ci if r == "traversal"} == {"chain", "tree"}


@pytest.mark.parametrize("kind", ["eagle", "draft_lm"])
@pytest.mark.parametrize("rule", ["rejection", "traversal"])
def test_a_one_step_tree_runs(big, kind, rule):
    """SpecConfig(num_steps=1, topk=4, num_draft_tokens=4) expands no frontier node: the tree's q rows are the
    root's alone."""
    spec = SpecConfig(num_steps=1, topk=4, num_draft_tokens=4, draft_sampling="sample", verify=rule)
    engine = Engine(big, DRAFTS[kind](big, 1), spec, impl="reference", max_seq_len=32)
    outs = engine.generate([[1, 2]] * 4, SamplingParams(max_new_tokens=6, temperature=1.0), seed=1)
    assert all(len(o.token_ids) == 6 for o in outs) and engine.last_stats.mean_accept_len > 1


def test_rejection_under_penalties_is_the_exact_law(target):
    sp = SamplingParams(temperature=0.8, frequency_penalty=0.7, presence_penalty=0.3, repetition_penalty=1.3)
    for spec in (SpecConfig(2, 1, **SAMPLE, verify="rejection", draft_penalties=True),
                 SpecConfig(1, 2, 3, **SAMPLE, verify="rejection", draft_penalties=True)):
        report = lab.exact_law(target, DRAFTS["eagle"](target, 2), spec, sp, prompt=[1, 2], n=3, steps=1)
        assert report.max_diff < LOSSLESS, report
    plain = lab.target_law(target, [1, 2], 3, SamplingParams(temperature=0.8))
    assert max(abs(report.target[k] - plain.get(k, 0.0)) for k in report.target) > 0.01  # the penalties mattered


def test_block_verification_under_a_grammar_is_the_exact_law(big):
    info = xgr.TokenizerInfo(["a", "b", "c", "d", "e", ""], vocab_size=6, stop_token_ids=[5])
    spec = SpecConfig(2, **SAMPLE, verify="block", draft_grammar=True)
    sp = SamplingParams(temperature=0.8, regex="[ab][bcd]*", stop_token_ids=[5])
    report = lab.exact_law(big, DRAFTS["mtp"](big, 2), spec, sp, prompt=[1, 2], n=3, tokenizer=info, steps=1)
    assert report.max_diff < LOSSLESS, report
    assert all(seq[0] in (0, 1) and set(seq[1:]) <= {1, 2, 3, 5} for seq in report.law)


def test_traversal_on_a_deep_tree_samples_the_target_law():
    """A tree of depth three, too many draws to enumerate: the checker's Monte-Carlo mode."""
    P, Q = tables(4, seed=12)
    target, draft = lab.table_model(P.log()), lab.table_model(Q.log())
    spec = SpecConfig(3, 2, 7, **SAMPLE, verify="traversal")
    report = lab.monte_carlo_law(target, draft, spec, SamplingParams(temperature=1.0), prompt=[0], n=4, samples=3000)
    assert report.p_value > FALSE_FAILURE_RATE, report


def test_the_draft_distribution_rules_accept_more_than_target_only(big):
    """What the rules are for: on the same imperfect EAGLE draft at T = 1, the tree accepts more tokens per step."""
    N = 1500
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    mean = {}
    for spec in (SpecConfig(3, 2, 6), SpecConfig(3, 2, 6, **SAMPLE, verify="rejection")):
        engine = Engine(big, draft=DRAFTS["eagle"](big, 3), spec=spec, max_batch=N, max_seq_len=24)
        outs = engine.generate([[1, 2]] * N, params, seed=3)
        steps = [a for o in outs for a in o.accept_lens[1:]]
        mean[spec.verify] = sum(steps) / len(steps)
    assert mean["rejection"] > 1.2 * mean["target_only"], mean


# ---- greedy requests, mixed batches, the captured step's buffers --------------------------------------------------

def draft_of(kind, target):
    return DRAFTS[kind](target, 3)



def test_greedy_requests_take_greedy_verification_in_a_mixed_ragged_batch(big):
    """Greedy requests are identical to target-only decoding whatever the rule; the sampled ones of the same
    batches follow the target's law. Run through the CUDA graphs' padded static buffers (eagerly, on a CPU)."""
    spec = SpecConfig(3, 2, 6, **SAMPLE, verify="rejection")
    greedy_prompts = [[1, 2, 3, 4], [2], [5, 1, 1]]
    base = Engine(big, max_seq_len=32).generate(greedy_prompts, SamplingParams(max_new_tokens=10))
    engine = Engine(big, draft=draft_of("eagle", big), spec=spec, max_batch=256, max_seq_len=32)
    engine._decode = DecodeGraphs(engine.worker, capture=False).decode_step
    sampled = SamplingParams(max_new_tokens=3, temperature=0.9)
    counts = Counter()
    for seed in range(3):
        prompts = greedy_prompts + [[1, 2]] * 250
        params = [SamplingParams(max_new_tokens=10)] * 3 + [sampled] * 250
        outs = engine.generate(prompts, params, seed=seed)
        assert [o.token_ids for o in outs[:3]] == [b.token_ids for b in base]
        counts.update(tuple(o.token_ids) for o in outs[3:])
    assert chi_square_pvalue(counts, lab.target_law(big, [1, 2], 3, sampled)) > FALSE_FAILURE_RATE


@pytest.mark.parametrize("kind", ["eagle", "mtp", "dflash"])
def test_greedy_decoding_is_unchanged_by_the_sampled_rules(big, kind):
    spec = SpecConfig(3, **SAMPLE, verify="block")
    prompts = [[1, 2, 3], [4], [2, 2, 5, 1]]
    base = Engine(big, max_seq_len=40).generate(prompts, SamplingParams(max_new_tokens=16))
    outs = Engine(big, draft=draft_of(kind, big), spec=spec, max_seq_len=40).generate(
        prompts, SamplingParams(max_new_tokens=16))
    assert [o.token_ids for o in outs] == [b.token_ids for b in base]


# ---- bad input ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    ({"verify": "traversal_v2"}, "verify must be"),
    ({"draft_sampling": "nucleus"}, "draft_sampling must be"),
    ({"verify": "rejection"}, "needs draft_sampling='sample'"),
    ({"verify": "block", "draft_sampling": "sample", "topk": 2, "num_draft_tokens": 5}, "verifies a chain"),
])
def test_a_bad_rule_is_a_one_line_error(kwargs, message):
    args = {"num_steps": 3, **kwargs}
    with pytest.raises(ValueError, match=message) as e:
        SpecConfig(**args)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs", [{"draft_sampling": "sample"}, {"draft_sampling": "sample", "verify": "rejection"}])
def test_ngram_refuses_what_needs_a_draft_distribution(big, kwargs):
    with pytest.raises(ValueError, match="NGRAM") as e:
        Engine(big, draft=NgramDraft(), spec=SpecConfig(3, **kwargs))
    assert "\n" not in str(e.value)


# ---- the step stays a fixed-shape, sync-free body ---------------------------------------------------------------

@pytest.mark.parametrize("kind,spec", [("eagle", SpecConfig(3, 2, 6, **SAMPLE, verify="rejection")),
                                       ("eagle", SpecConfig(3, 2, 6, **SAMPLE, verify="traversal")),
                                       ("mtp", SpecConfig(3, **SAMPLE, verify="block")),
                                       ("dflash", SpecConfig(3, **SAMPLE, verify="rejection"))],
                         ids=["eagle-tree-rejection", "eagle-tree-traversal", "mtp-block", "dflash-rejection"])
def test_a_sampled_step_makes_no_host_sync(big, kind, spec):
    """Greedy and sampled requests (top-k, top-p, logprobs) in one batch: the drafts' draws and the rules' verify read
    no value on the host."""
    engine = Engine(big, draft=draft_of(kind, big), spec=spec, impl="reference", max_seq_len=64)
    w = engine.worker
    params = [SamplingParams(max_new_tokens=14, temperature=0.8, top_k=4, top_p=0.9, return_logprob=True),
              SamplingParams(max_new_tokens=14)]
    w.prefill([[1, 2, 3], [4, 5]], params, seed=0)
    for _ in range(3):
        with no_host_sync():
            step = w.decode_step()
    assert step.accept_lens.shape == (2,)


@pytest.mark.parametrize("kind,spec", [("eagle", SpecConfig(3, 2, 6, **SAMPLE, verify="rejection")),
                                       ("eagle", SpecConfig(3, 2, 6, **SAMPLE, verify="traversal")),
                                       ("dflash", SpecConfig(3, **SAMPLE, verify="block"))],
                         ids=["eagle-tree-rejection", "eagle-tree-traversal", "dflash-block"])
def test_the_fast_path_draws_and_verifies_as_the_reference(big, kind, spec):
    """The same seeds through the Triton ops (interpreted on a CPU): the same tokens, request by request, for a
    ragged batch mixing greedy and sampled requests."""
    prompts = [[1, 2, 3], [4], [2, 5, 1, 1]]
    params = [SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.9), SamplingParams(max_new_tokens=8),
              SamplingParams(max_new_tokens=6, temperature=1.2, top_k=4)]
    draft = draft_of(kind, big)
    outs = {impl: Engine(big, draft=draft, spec=spec, impl=impl, max_seq_len=32).generate(prompts, params, seed=11)
            for impl in ("reference", "fast")}
    assert [o.token_ids for o in outs["fast"]] == [o.token_ids for o in outs["reference"]]
    assert [o.accept_lens for o in outs["fast"]] == [o.accept_lens for o in outs["reference"]]
