"""The scripted draft (`specdec.lab.scripted`): under greedy decoding its measured acceptance by depth is the rate it
is set to, within sampling error, on chains and trees, and every output is target-only decoding's; it is refused
in one line where its settings or its target are wrong. (Its sampled law is exact: the rule sweep of
tests/workers/test_sampled_verification.py runs it.)"""
from __future__ import annotations

import math

import pytest
import torch

from specdec import Engine, SamplingParams, SpecConfig
from specdec.lab.scripted import DEFAULT_RATES, ScriptedDraft, draft_from_text
from specdec.models.llama import random_llama

RATES = (0.9, 0.7, 0.5, 0.3)
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def target():
    # a wide vocabulary and a sharp head: its greedy continuations wander rather than loop
    return random_llama(vocab_size=96, hidden_size=32, num_hidden_layers=2, seed=5, init_std=0.6)


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(96, (n,), generator=gen).tolist() for n in (3, 9, 5, 12, 7, 4, 10, 6, 8, 2, 11, 5)]


@pytest.fixture(scope="module")
def target_only(target, prompts):
    engine = Engine(target, impl="reference", max_batch=len(prompts), max_seq_len=128)
    return [o.token_ids for o in engine.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS))]


def acceptance_by_depth(outs, depth: int, new_tokens: int) -> tuple[list[int], list[int]]:
    """From each request's tokens per step: per depth d, the steps that reached it (their d - 1 drafts accepted) and
    those that accepted it, over the steps whose whole proposal lay within the request's length."""
    reached, accepted = [0] * depth, [0] * depth
    for out in outs:
        emitted = 1  # the prefill's token
        for n in out.accept_lens:
            if new_tokens - emitted >= depth:
                for d in range(depth):
                    reached[d] += n - 1 >= d
                    accepted[d] += n - 1 >= d + 1
            emitted += n
    return reached, accepted


@pytest.mark.parametrize("spec", [SpecConfig(4, 1), SpecConfig(4, 3, 9)], ids=["chain", "tree"])
def test_the_acceptance_by_depth_is_the_set_rate_and_the_tokens_are_target_onlys(target, prompts, target_only, spec):
    engine = Engine(target, ScriptedDraft(target, RATES, seed=1), spec, impl="reference", max_batch=len(prompts),
                    max_seq_len=128)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS))
    assert [o.token_ids for o in outs] == target_only
    reached, accepted = acceptance_by_depth(outs, len(RATES), NEW_TOKENS)
    for d, rate in enumerate(RATES):
        n = reached[d]
        assert n >= 30, (d, reached)
        # five standard deviations of a binomial proportion: a false failure about once in 3.5 million runs
        assert abs(accepted[d] / n - rate) <= 5 * math.sqrt(rate * (1 - rate) / n), (d, accepted[d], n, rate)


def test_the_fast_path_decodes_target_onlys_tokens_with_penalties_stops_and_ragged_lengths(target, prompts):
    params = [SamplingParams(max_new_tokens=n, repetition_penalty=1.3, frequency_penalty=0.4, stop_token_ids=[s])
              for n, s in zip((8, 3, 6), (7, 40, 3))]
    batch = prompts[:3]
    want = Engine(target, impl="reference", max_batch=3, max_seq_len=64).generate(batch, params)
    draft = ScriptedDraft(target, (1.0, 0.8, 0.5))
    got = Engine(target, draft, SpecConfig(3, 2, 5), impl="fast", max_batch=3, max_seq_len=64).generate(batch, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert any(n > 1 for o in got for n in o.accept_lens)  # an agreeing first depth is accepted


def test_an_agreement_of_one_accepts_every_depth_and_of_zero_none(target, prompts, target_only):
    for rates, accept in (((1.0, 1.0, 1.0), 4), ((0.0,), 1)):
        engine = Engine(target, ScriptedDraft(target, rates), SpecConfig(3, 1), impl="reference", max_batch=2,
                        max_seq_len=128)
        outs = engine.generate(prompts[:2], SamplingParams(max_new_tokens=20))
        assert [o.token_ids for o in outs] == [t[:20] for t in target_only[:2]]
        assert {n for o in outs for n in o.accept_lens[:-1]} == {accept}  # the last step may be cut short


def test_prepare_makes_the_scripts_and_decoding_reads_them(target, prompts):
    draft = ScriptedDraft(target)
    engine = Engine(target, draft, SpecConfig(5, 1), impl="reference", max_batch=4, max_seq_len=128)
    params = SamplingParams(max_new_tokens=16)
    engine.prepare(prompts[:4], params)
    made = dict(draft.scripts)
    assert len(made) == 4
    engine.generate(prompts[:4], params)
    assert draft.scripts == made  # nothing scripted again
    engine.generate(prompts[4:5], params)
    assert len(draft.scripts) == 5  # a prompt met first by generate is scripted there


def test_bad_settings_and_another_target_are_one_line_errors(target):
    other = random_llama(vocab_size=96, hidden_size=32, num_hidden_layers=2, seed=6)
    cases = [
        (lambda: ScriptedDraft(target, ()), "at least one depth"),
        (lambda: ScriptedDraft(target, (0.8, 1.5)), r"rates\[1\]"),
        (lambda: ScriptedDraft(target, (0.8, float("nan"))), r"rates\[1\]"),
        (lambda: ScriptedDraft(target, runners_up=0), "runners_up"),
        (lambda: draft_from_text(target, "0.8,high"), "comma-separated numbers"),
        (lambda: Engine(other, ScriptedDraft(target), SpecConfig(3, 1)), "another target"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError, match=message) as e:
            make()
        assert "\n" not in str(e.value)
    assert draft_from_text(target, "").rates == DEFAULT_RATES
    assert draft_from_text(target, "0.5,0.25").rates == (0.5, 0.25)
