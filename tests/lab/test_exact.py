"""The exact-law checker (specdec.lab.exact_law, monte_carlo_law) on logit tables: it recovers known laws exactly
(target-only decoding, a chain verified by rejection sampling), finds a lossy rule (Medusa's typical acceptance,
registered from outside) and a bug planted in each built-in rule, and refuses what it cannot enumerate."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import reference.rejection
import reference.traversal
import reference.verify
import specdec
from specdec import NgramDraft, SamplingParams, SpecConfig, verify_rules
from specdec.lab import LabError, exact_law, monte_carlo_law, table_model, target_law
from tests.helpers import FALSE_FAILURE_RATE
from tests.helpers.rules import TYPICAL

V = 3
#: what float32 rounding of the engine's probabilities leaves of a lossless rule's law, far above what it leaves
LOSSLESS = 1e-6
#: what a planted bug moves, far below what it moves on these tables
BUGGY = 1e-3
SAMPLE = {"draft_sampling": "sample"}


@pytest.fixture(scope="module")
def pair():
    """A bigram target and a draft LM that half agrees with it, both from logit tables."""
    gen = torch.Generator().manual_seed(3)
    P = torch.randn(V, V, generator=gen) * 1.5
    Q = P * 0.5 + torch.randn(V, V, generator=gen)
    return table_model(P), table_model(Q)


def test_target_only_decoding_is_its_own_law(pair):
    report = exact_law(pair[0], params=SamplingParams(temperature=0.8, top_k=2), prompt=[1], n=3)
    assert report.max_diff < LOSSLESS, report
    assert abs(sum(report.law.values()) - 1.0) < 1e-9 and len(report.law) == 2 ** 3
    assert report.method == "exact" and report.p_value is None and "largest difference" in str(report)


def test_a_chain_verified_by_rejection_sampling_is_the_target_law(pair):
    spec = SpecConfig(2, 1, **SAMPLE, verify="rejection")
    report = exact_law(*pair, spec, SamplingParams(temperature=1.0), prompt=[1], n=3)
    assert report.max_diff < LOSSLESS, report
    assert report.law.keys() == report.target.keys() and abs(sum(report.law.values()) - 1.0) < 1e-9
    # closing every path after its first decode step (the target completing it) enumerates fewer paths
    one_step = exact_law(*pair, spec, SamplingParams(temperature=1.0), prompt=[1], n=3, steps=1)
    assert one_step.max_diff < LOSSLESS and one_step.paths < report.paths


@pytest.fixture
def typical():
    rule = specdec.register_verify_rule(**TYPICAL)
    yield rule
    verify_rules.unregister(rule.name)


def test_typical_acceptance_is_found_lossy(pair, typical):
    spec = SpecConfig(2, 1, verify="typical")
    report = exact_law(*pair, spec, SamplingParams(temperature=1.0), prompt=[1], n=3)
    assert report.max_diff > 0.01, report
    assert report.where in report.law or report.where in report.target
    sampled = monte_carlo_law(*pair, spec, SamplingParams(temperature=1.0), prompt=[1], n=3, samples=2000)
    assert sampled.p_value < FALSE_FAILURE_RATE, sampled


def test_monte_carlo_finds_a_lossless_rule_lossless(pair):
    spec = SpecConfig(2, 2, 4, **SAMPLE, verify="traversal")
    report = monte_carlo_law(*pair, spec, SamplingParams(temperature=1.0), prompt=[1], n=3, samples=2000)
    assert report.p_value > FALSE_FAILURE_RATE and report.paths == 2000, report
    assert report.method == "monte-carlo" and report.max_diff < 0.05


#: each built-in rule's module (whose bonus token the planted bug draws from the full target row, not the residual
#: its rejections left) and a shape of its own: a tree of the root's two children, or a chain of two
PLANTED = {"target_only": (reference.verify, SpecConfig(1, 2, 3, **SAMPLE)),
           "rejection": (reference.rejection, SpecConfig(1, 2, 3, **SAMPLE, verify="rejection")),
           "block": (reference.rejection, SpecConfig(2, 1, **SAMPLE, verify="block")),
           "traversal": (reference.traversal, SpecConfig(1, 2, 3, **SAMPLE, verify="traversal"))}


@pytest.mark.parametrize("rule", list(PLANTED))
def test_a_bug_planted_in_each_rule_is_caught(pair, rule, monkeypatch):
    module, spec = PLANTED[rule]
    assert spec.verify == rule
    run = dict(params=SamplingParams(temperature=1.0), prompt=[1], n=3, steps=1)
    assert exact_law(*pair, spec, **run).max_diff < LOSSLESS
    residual = module._sample_residual
    monkeypatch.setattr(module, "_sample_residual", lambda resid, row, u: residual(row, row, u))
    report = exact_law(*pair, spec, **run)
    assert report.max_diff > BUGGY, report


def test_what_it_cannot_enumerate_is_refused(pair):
    with pytest.raises(ValueError, match="shared NGRAM trie") as e:
        exact_law(pair[0], NgramDraft(), SpecConfig(2))
    assert "\n" not in str(e.value)
    banned = SamplingParams(temperature=1.0, logit_bias={0: float("-inf")})
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        exact_law(*pair, SpecConfig(2), banned, steps=1)
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        exact_law(*pair, SpecConfig(2), n=0)
    with pytest.raises(LabError, match="more than max_paths=5 paths"):
        exact_law(*pair, SpecConfig(2, 1, **SAMPLE, verify="rejection"), prompt=[1], n=3, max_paths=5)


def test_a_row_left_with_nothing_runs_every_cell_to_its_end(pair):
    """A -inf bias on every token but one ends no request, one on every token ends each in error at once: nothing is
    foreseen, and the law is still the target's."""
    spec = SpecConfig(2, 1, **SAMPLE, verify="rejection")
    sp = SamplingParams(temperature=1.0, logit_bias={2: float("-inf")})
    assert exact_law(*pair, spec, sp, prompt=[1], n=2).max_diff < LOSSLESS
    every = dataclasses.replace(sp, logit_bias={t: float("-inf") for t in range(V)})
    report = exact_law(*pair, spec, every, prompt=[1], n=3)
    assert report.law == report.target == target_law(pair[0], [1], 3, every) == {("error",): 1.0}
