"""The target's own law (specdec.lab.target_law) against laws written out here from a logit table: products of the
table's softmax rows (with top-k / top-p by the float64 loops of the oracles, penalties by hand), stop ids, a row left
with no token, a grammar whose allowed tokens are plain to see, the law given a prefix, and a floor."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from specdec import SamplingParams
from specdec.lab import ERROR, table_model, target_law
from tests.helpers.oracles import penalised_row64, softmax_filtered

V = 4


@pytest.fixture(scope="module")
def table():
    return torch.randn(V, V, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 1.5


def close(law: dict, want: dict, tol: float = 1e-6) -> bool:
    return set(law) == set(want) and max(abs(law[k] - want[k]) for k in want) < tol


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, 2, 1.0), (1.3, -1, 0.8), (0.9, 3, 0.6)])
def test_a_bigram_table_law_is_the_product_of_its_rows(table, temperature, top_k, top_p):
    law = target_law(table_model(table), [2, 1], 3, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    want = {}
    for seq in itertools.product(range(V), repeat=3):
        p, prev = 1.0, 1
        for t in seq:
            p *= softmax_filtered(table[prev].tolist(), temperature, top_k, top_p)[t]
            prev = t
        if p > 0:
            want[seq] = p
    assert close(law, want)


def test_greedy_is_one_sequence(table):
    law = target_law(table_model(table), [0], 3, SamplingParams(temperature=0.0))
    seq, prev = [], 0
    for _ in range(3):
        prev = int(table[prev].argmax())
        seq.append(prev)
    assert law == {tuple(seq): 1.0}


def test_penalties_are_applied_along_each_prefix(table):
    sp = SamplingParams(temperature=0.8, frequency_penalty=0.7, presence_penalty=0.3, repetition_penalty=1.3,
                        logit_bias={2: 1.5})
    prompt = [3, 1]
    law = target_law(table_model(table), prompt, 2, sp)
    want = {}
    for a, b in itertools.product(range(V), repeat=2):
        first = torch.softmax(penalised_row64(table[1], prompt, [], sp) / 0.8, -1)[a]
        second = torch.softmax(penalised_row64(table[a], prompt, [a], sp) / 0.8, -1)[b]
        want[(a, b)] = float(first * second)
    assert close(law, want)


def test_a_stop_id_ends_the_outcome_and_an_empty_row_ends_it_in_error(table):
    sp = SamplingParams(temperature=1.0, stop_token_ids=[3], min_new_tokens=1)
    law = target_law(table_model(table), [0], 2, sp)
    assert all(seq[0] != 3 for seq in law)  # min_new_tokens holds the stop id back at first
    assert all(len(seq) == 2 for seq in law)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    banned = SamplingParams(temperature=1.0, logit_bias={t: -math.inf for t in range(1, V)})
    law = target_law(table_model(table), [0], 3, banned)
    assert law == {(0, 0, 0): 1.0}
    everything = SamplingParams(temperature=1.0, logit_bias={t: -math.inf for t in range(V)})
    assert target_law(table_model(table), [0], 3, everything) == {(ERROR,): 1.0}


def test_a_grammar_renormalises_over_what_it_allows(table):
    xgr = pytest.importorskip("xgrammar")
    info = xgr.TokenizerInfo(["a", "b", "c", ""], vocab_size=V, stop_token_ids=[3])
    law = target_law(table_model(table), [1], 3, SamplingParams(temperature=1.0, regex="a[bc]"), tokenizer=info)
    # "a" is the only first token, then "b" or "c" by their renormalised probabilities, then only the terminator
    p = torch.softmax(table[0, 1:3], -1)
    assert close(law, {(0, 1, 3): float(p[0]), (0, 2, 3): float(p[1])})


def test_given_a_prefix_and_a_floor(table):
    model = table_model(table)
    sp = SamplingParams(temperature=1.0)
    full = target_law(model, [2], 3, sp)
    given = target_law(model, [2], 3, sp, given=(1,))
    first = sum(p for seq, p in full.items() if seq[0] == 1)
    assert close(given, {seq: p / first for seq, p in full.items() if seq[0] == 1})
    pruned = target_law(model, [2], 3, sp, floor=0.01)
    assert all(p >= 0.01 for p in pruned.values()) and close(pruned, {s: full[s] for s in pruned}, 1e-12)
    assert sum(pruned.values()) < 1.0
