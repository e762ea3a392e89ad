"""Sampled drafting and verification with the draft's distribution (SpecConfig.draft_sampling / verify).

The ops' laws against exact ones (Plackett-Luce for draws without replacement, the target's sequential law for
what the verify rules emit), every drafting kind and rule through the engine against the target's exact joint law
by enumeration (under top-k / top-p, penalties and a grammar too), greedy requests unchanged, and the refusals."""
from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
import xgrammar as xgr

from reference import (chain_speculative_sampling_block, sample_without_replacement,
                       tree_speculative_sampling_rejection, tree_speculative_sampling_target_only,
                       tree_speculative_sampling_traversal)
from specdec import Engine, SamplingParams, SpecConfig
from specdec.grammar import GrammarCompiler
from specdec.models.bigram import near_bigram_target, perfect_eagle, perfect_mtp
from specdec.models.dflash import random_dflash
from specdec.models.eagle3 import random_eagle3_head
from specdec.models.llama import random_llama
from specdec.models.ngram import NgramDraft
from specdec.workers.graphs import DecodeGraphs
from tests.helpers.equivalence import no_host_sync
from tests.helpers import FALSE_FAILURE_RATE, chi_square_pvalue
from tests.helpers.oracles import exact_joint, exact_joint_grammar, exact_joint_penalised, tree_links

SAMPLE = {"draft_sampling": "sample"}


# ---- the ops ------------------------------------------------------------------------------------------------------

def plackett_luce(q: list[float], K: int) -> dict:
    """Exact law of K draws without replacement from q, in draw order."""
    law = {}
    for seq in itertools.permutations(range(len(q)), K):
        p, left = 1.0, 1.0
        for x in seq:
            p *= q[x] / left
            left -= q[x]
        law[seq] = p
    return law


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


def emitted_two_token_law(predict, accept_index, accept_length, P, W):
    """The law of the first two tokens, a one-token emission completed by the target (what the next step emits)."""
    B = accept_length.shape[0]
    tokens = predict.view(B, W).gather(1, accept_index.clamp_min(0).long() % W).tolist()
    law: dict = {}
    for row, a in zip(tokens, accept_length.tolist()):
        if a >= 1:
            law[tuple(row[:2])] = law.get(tuple(row[:2]), 0) + 1
        else:
            for t in range(P.shape[0]):
                law[(row[0], t)] = law.get((row[0], t), 0) + float(P[row[0], t])
    return law


def exact_two_token_law(P, root=0):
    V = P.shape[0]
    return {(a, b): float(P[root, a] * P[a, b]) for a in range(V) for b in range(V)}


def drafted_tree(B, V, P, Q, gen):
    """A depth-2 tree: the root's 3 children drawn from Q[root] without replacement, the first child's 2 children
    drawn from Q[its token] (node order: root, children 1..3, grandchildren 4..5)."""
    W = 6
    root = torch.zeros(B, dtype=torch.long)
    first = sample_without_replacement(Q[root], torch.rand(B, 3, generator=gen))
    second = sample_without_replacement(Q[first[:, 0]], torch.rand(B, 2, generator=gen))
    candidates = torch.cat([root[:, None], first, second], dim=1)
    index = torch.arange(B * W).view(B, W)
    nxt = torch.tensor([1, 4, -1, -1, -1, -1]).expand(B, W).contiguous()
    sib = torch.tensor([-1, 2, 3, -1, 5, -1]).expand(B, W).contiguous()
    return candidates, index, nxt, sib, P[candidates], Q[candidates]


def test_recursive_rejection_on_a_tree_emits_the_target_law_and_accepts_more():
    V, B = 5, 120000
    P, Q = tables(V, seed=3)
    gen = torch.Generator().manual_seed(4)
    cand, index, nxt, sib, tp, dp = drafted_tree(B, V, P, Q, gen)
    coins, final = torch.rand(B, 6, generator=gen), torch.rand(B, generator=gen)
    out = tree_speculative_sampling_rejection(cand, index, nxt, sib, coins, final, tp, dp, 2)
    law = emitted_two_token_law(*out, P, 6)
    assert chi_square_pvalue(law, exact_two_token_law(P)) > FALSE_FAILURE_RATE
    wrong = P.clone()
    wrong[0] = wrong[0] + torch.tensor([0.03, -0.03, 0, 0, 0])
    assert chi_square_pvalue(law, exact_two_token_law(wrong)) < FALSE_FAILURE_RATE
    target_only = tree_speculative_sampling_target_only(cand, index, nxt, sib, coins, final, tp, 2)
    assert out[2].float().mean() > target_only[2].float().mean() + 0.05


def drafted_chain(B, S, Q, gen):
    """B chains of S tokens after root 0, each drawn from Q[the token before it]; their links and the rules' coins."""
    tokens = [torch.zeros(B, dtype=torch.long)]
    for _ in range(S):
        tokens.append(sample_without_replacement(Q[tokens[-1]], torch.rand(B, 1, generator=gen))[:, 0])
    index, nxt, sib = chain_links(B, S + 1)
    return (torch.stack(tokens, 1), index, nxt, sib, torch.rand(B, S + 1, generator=gen),
            torch.rand(B, generator=gen))


@pytest.mark.parametrize("rule", ["rejection", "block"])
def test_a_chains_rules_emit_the_target_law(rule):
    V, B, S = 5, 120000, 3
    P, Q = tables(V, seed=5)
    gen = torch.Generator().manual_seed(6)
    cand, index, nxt, sib, coins, final = drafted_chain(B, S, Q, gen)
    if rule == "block":
        out = chain_speculative_sampling_block(cand, index, coins, final, P[cand], Q[cand], S)
    else:
        out = tree_speculative_sampling_rejection(cand, index, nxt, sib, coins, final, P[cand], Q[cand], S)
    assert chi_square_pvalue(emitted_two_token_law(*out, P, S + 1), exact_two_token_law(P)) > FALSE_FAILURE_RATE


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


# ---- traversal verification ------------------------------------------------------------------------------------

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


def emitted_law(predict, accept_index, accept_length, P, W, n):
    """The law of the first n emitted tokens, an emission shorter than n completed by the target's law."""
    B, V = accept_length.shape[0], P.shape[0]
    tokens = predict.view(B, W).gather(1, accept_index.clamp_min(0).long() % W).tolist()
    law: dict = {}

    def add(seq, weight):
        if len(seq) >= n:
            law[seq[:n]] = law.get(seq[:n], 0) + weight
            return
        for t in range(V):
            add(seq + (t,), weight * float(P[seq[-1], t]))

    for row, a in zip(tokens, accept_length.tolist()):
        add(tuple(row[:a + 1]), 1.0)
    return law


def exact_law(P, n, root=0):
    law = {}
    for seq in itertools.product(range(P.shape[0]), repeat=n):
        law[seq] = float(torch.prod(P[torch.tensor((root,) + seq[:-1]), torch.tensor(seq)]))
    return law


def test_traversal_on_a_deep_tree_emits_the_target_law_and_accepts_more_than_rejection():
    V, B, S = 4, 200000, 3
    P, Q = tables(V, seed=12)
    gen = torch.Generator().manual_seed(13)
    cand, index, nxt, sib = drafted_from_parents(B, DEEP_PARENTS, Q, gen)
    W = len(DEEP_PARENTS)
    coins, final = torch.rand(B, W, generator=gen), torch.rand(B, generator=gen)
    out = tree_speculative_sampling_traversal(cand, index, nxt, sib, coins, final, P[cand], Q[cand], S)
    law = emitted_law(*out, P, W, 3)
    assert chi_square_pvalue(law, exact_law(P, 3)) > FALSE_FAILURE_RATE
    wrong = P.clone()
    wrong[0] = wrong[0] + torch.tensor([0.02, -0.02, 0, 0])
    assert chi_square_pvalue(law, exact_law(wrong, 3)) < FALSE_FAILURE_RATE
    rejection = tree_speculative_sampling_rejection(cand, index, nxt, sib, coins, final, P[cand], Q[cand], S)
    assert out[2].float().mean() > rejection[2].float().mean() + 0.02  # standard errors ~0.002


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


# ---- through the engine: every drafting kind, the target's exact law -------------------------------------------

V = 6


@pytest.fixture(scope="module")
def target():
    return near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3)


def biased(draft, attr):
    """A bigram-perfect draft made imperfect: its logits flattened and tilted, so acceptance is neither 0 nor 1."""
    f = getattr(draft, attr)
    setattr(draft, attr, lambda *a, **k: f(*a, **k) * 0.4 + torch.linspace(0, 1.5, V))
    return draft


def draft_of(kind, target):
    if kind == "eagle":
        return biased(perfect_eagle(target), "compute_logits")
    if kind == "eagle3":
        return random_eagle3_head(target, draft_vocab_size=4, seed=3)
    if kind in ("mtp", "mtp_chain"):
        return biased(perfect_mtp(target, 3, kind == "mtp_chain"), "layer_logits")
    if kind == "dflash":
        return random_dflash(target, 1, 4, target_layer_ids=[0], mask_token_id=5, seed=4)
    return random_llama(vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, seed=2)


CASES = [  # (kind, shape, rule)
    ("eagle", SpecConfig(3, 2, 6, **SAMPLE, verify="rejection"), "tree"),
    ("eagle", SpecConfig(3, 1, **SAMPLE, verify="block"), "chain"),
    ("eagle", SpecConfig(3, 2, 6, **SAMPLE, verify="traversal"), "tree"),
    ("eagle3", SpecConfig(2, 2, 5, **SAMPLE, verify="rejection"), "tree"),
    ("mtp", SpecConfig(3, **SAMPLE, verify="rejection"), "chain"),
    ("mtp_chain", SpecConfig(3, **SAMPLE, verify="block"), "chain"),
    ("dflash", SpecConfig(3, **SAMPLE, verify="rejection"), "chain"),
    ("draft_lm", SpecConfig(2, 2, 4, **SAMPLE, verify="traversal"), "tree"),
    ("draft_lm", SpecConfig(2, 2, 4, **SAMPLE, verify="rejection"), "tree"),
    ("draft_lm", SpecConfig(3, 1, **SAMPLE, verify="target_only"), "chain"),
]


def run_counts(engine, N, params, seed=7):
    outs = engine.generate([[1, 2]] * N, params, seed=seed)
    return Counter(tuple(o.token_ids) for o in outs), [a for o in outs for a in o.accept_lens]


@pytest.mark.parametrize("kind,spec,shape", CASES, ids=[f"{k}-{s.verify}-{sh}" for k, s, sh in CASES])
def test_every_kind_and_rule_samples_the_target_law(target, kind, spec, shape):
    N = 3000
    engine = Engine(target, draft=draft_of(kind, target), spec=spec, impl="reference", max_batch=N, max_seq_len=16)
    counts, accepted = run_counts(engine, N, SamplingParams(max_new_tokens=3, temperature=0.9, top_k=4, top_p=0.95))
    assert any(a > 1 for a in accepted)  # drafts were accepted: the rule decided the law
    assert chi_square_pvalue(counts, exact_joint(target, [1, 2], 3, 0.9, 4, 0.95)) > FALSE_FAILURE_RATE


def test_rejection_under_penalties_is_the_exact_law(target):
    N = 3000
    sp = SamplingParams(max_new_tokens=3, temperature=0.8, frequency_penalty=0.7, presence_penalty=0.3,
                        repetition_penalty=1.3)
    spec = SpecConfig(3, 2, 6, **SAMPLE, verify="rejection", draft_penalties=True)
    engine = Engine(target, draft=draft_of("eagle", target), spec=spec, max_batch=N, max_seq_len=16)
    counts, accepted = run_counts(engine, N, sp)
    assert any(a > 1 for a in accepted)
    assert chi_square_pvalue(counts, exact_joint_penalised(target, [1, 2], 3, sp)) > FALSE_FAILURE_RATE


def test_block_verification_under_a_grammar_is_the_exact_law(target):
    N = 3000
    info = xgr.TokenizerInfo(["a", "b", "c", "d", "e", ""], vocab_size=V, stop_token_ids=[5])
    regex = "[ab][bcd]*"
    compiled = GrammarCompiler(info, V).compile(SamplingParams(regex=regex), 0)
    spec = SpecConfig(3, **SAMPLE, verify="block", draft_grammar=True)
    engine = Engine(target, draft_of("mtp", target), spec, max_batch=N, max_seq_len=16, tokenizer=info)
    counts, accepted = run_counts(engine, N, SamplingParams(max_new_tokens=3, temperature=0.8, regex=regex,
                                                            stop_token_ids=[5]))
    assert any(a > 1 for a in accepted)
    exact = exact_joint_grammar(target, [1, 2], 3, 0.8, compiled, [5])
    assert chi_square_pvalue(counts, exact) > FALSE_FAILURE_RATE


def test_the_draft_distribution_rules_accept_more_than_target_only(target):
    """What the rules are for: on the same imperfect EAGLE draft at T = 1, the tree accepts more tokens per step."""
    N = 1500
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    mean = {}
    for spec in (SpecConfig(3, 2, 6), SpecConfig(3, 2, 6, **SAMPLE, verify="rejection")):
        engine = Engine(target, draft=draft_of("eagle", target), spec=spec, max_batch=N, max_seq_len=24)
        outs = engine.generate([[1, 2]] * N, params, seed=3)
        steps = [a for o in outs for a in o.accept_lens[1:]]
        mean[spec.verify] = sum(steps) / len(steps)
    assert mean["rejection"] > 1.2 * mean["target_only"], mean


# ---- greedy requests, mixed batches, the captured step's buffers --------------------------------------------------

def test_greedy_requests_take_greedy_verification_in_a_mixed_ragged_batch(target):
    """Greedy requests are identical to target-only decoding whatever the rule; the sampled ones of the same
    batches follow the target's law. Run through the CUDA graphs' padded static buffers (eagerly, on a CPU)."""
    spec = SpecConfig(3, 2, 6, **SAMPLE, verify="rejection")
    greedy_prompts = [[1, 2, 3, 4], [2], [5, 1, 1]]
    base = Engine(target, max_seq_len=32).generate(greedy_prompts, SamplingParams(max_new_tokens=10))
    engine = Engine(target, draft=draft_of("eagle", target), spec=spec, max_batch=256, max_seq_len=32)
    engine._decode = DecodeGraphs(engine.worker, capture=False).decode_step
    sampled = SamplingParams(max_new_tokens=3, temperature=0.9)
    counts = Counter()
    for seed in range(3):
        prompts = greedy_prompts + [[1, 2]] * 250
        params = [SamplingParams(max_new_tokens=10)] * 3 + [sampled] * 250
        outs = engine.generate(prompts, params, seed=seed)
        assert [o.token_ids for o in outs[:3]] == [b.token_ids for b in base]
        counts.update(tuple(o.token_ids) for o in outs[3:])
    assert chi_square_pvalue(counts, exact_joint(target, [1, 2], 3, 0.9, -1, 1.0)) > FALSE_FAILURE_RATE


@pytest.mark.parametrize("kind", ["eagle", "mtp", "dflash"])
def test_greedy_decoding_is_unchanged_by_the_sampled_rules(target, kind):
    spec = SpecConfig(3, **SAMPLE, verify="block")
    prompts = [[1, 2, 3], [4], [2, 2, 5, 1]]
    base = Engine(target, max_seq_len=40).generate(prompts, SamplingParams(max_new_tokens=16))
    outs = Engine(target, draft=draft_of(kind, target), spec=spec, max_seq_len=40).generate(
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
def test_ngram_refuses_what_needs_a_draft_distribution(target, kwargs):
    with pytest.raises(ValueError, match="NGRAM") as e:
        Engine(target, draft=NgramDraft(), spec=SpecConfig(3, **kwargs))
    assert "\n" not in str(e.value)


# ---- the step stays a fixed-shape, sync-free body ---------------------------------------------------------------

@pytest.mark.parametrize("kind,spec", [("eagle", SpecConfig(3, 2, 6, **SAMPLE, verify="rejection")),
                                       ("eagle", SpecConfig(3, 2, 6, **SAMPLE, verify="traversal")),
                                       ("mtp", SpecConfig(3, **SAMPLE, verify="block")),
                                       ("dflash", SpecConfig(3, **SAMPLE, verify="rejection"))],
                         ids=["eagle-tree-rejection", "eagle-tree-traversal", "mtp-block", "dflash-rejection"])
def test_a_sampled_step_makes_no_host_sync(target, kind, spec):
    """Greedy and sampled requests (top-k, top-p, logprobs) in one batch: the drafts' draws and the rules' verify read
    no value on the host."""
    engine = Engine(target, draft=draft_of(kind, target), spec=spec, impl="reference", max_seq_len=64)
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
def test_the_fast_path_draws_and_verifies_as_the_reference(target, kind, spec):
    """The same seeds through the Triton ops (interpreted on a CPU): the same tokens, request by request, for a
    ragged batch mixing greedy and sampled requests."""
    prompts = [[1, 2, 3], [4], [2, 5, 1, 1]]
    params = [SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.9), SamplingParams(max_new_tokens=8),
              SamplingParams(max_new_tokens=6, temperature=1.2, top_k=4)]
    draft = draft_of(kind, target)
    outs = {impl: Engine(target, draft=draft, spec=spec, impl=impl, max_seq_len=32).generate(prompts, params, seed=11)
            for impl in ("reference", "fast")}
    assert [o.token_ids for o in outs["fast"]] == [o.token_ids for o in outs["reference"]]
    assert [o.accept_lens for o in outs["fast"]] == [o.accept_lens for o in outs["reference"]]
