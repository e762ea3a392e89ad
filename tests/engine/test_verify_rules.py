"""The verify-rule registry (specdec.verify_rules): the shipped records against their ops, a rule registered from
outside running through the engine, the bench's cases and the exact-law checker, the arguments bound by name, and the
one-line refusals of a record the registry cannot take or a change to a shipped rule."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import fast
import reference
import specdec
from specdec import Engine, SamplingParams, SpecConfig, lab
from specdec.bench.cases import WorkerCase, with_verify_rules
from specdec.bench.suites.verify_rules import base_label, rule_of
from specdec.verify_rules import BUILT_IN, VERIFY_RULES, VerifyRule, op_arguments, rule_ops, unregister, verify_rule
from tests.helpers.rules import TYPICAL

V = 3


@pytest.fixture
def registry():
    """The registry as it stands, restored after the test (a rule registered in it leaves with it)."""
    before = dict(VERIFY_RULES)
    yield VERIFY_RULES
    for name in [r for r in VERIFY_RULES if r not in before]:
        unregister(name)
    assert dict(VERIFY_RULES) == before


@pytest.fixture(scope="module")
def pair():
    gen = torch.Generator().manual_seed(3)
    P = torch.randn(V, V, generator=gen) * 1.5
    return lab.table_model(P), lab.table_model(P * 0.5 + torch.randn(V, V, generator=gen))


def test_the_shipped_rules_name_ops_both_paths_export_with_the_arguments_they_claim():
    assert tuple(VERIFY_RULES) == BUILT_IN == ("target_only", "rejection", "block", "traversal")
    assert rule_ops() == ("tree_speculative_sampling_target_only", "tree_speculative_sampling_rejection",
                          "chain_speculative_sampling_block", "tree_speculative_sampling_traversal")
    for rule in VERIFY_RULES.values():
        for ops in (reference, fast):
            names = op_arguments(rule.op_for(ops), rule.name)
            assert ("draft_probs" in names) == rule.reads_draft, (rule.name, ops.__name__)
        assert rule.lossless and rule.check_shapes and all(rule.runs_on(k) for _, k, _ in rule.check_shapes)
    assert [r for r in VERIFY_RULES if VERIFY_RULES[r].runs_on(2)] == ["target_only", "rejection", "traversal"]


def shuffled_rejection(num_steps, draft_probs, target_probs, uniform_samples_for_final_sampling, uniform_samples,
                       retrieve_next_sibling, retrieve_next_token, retrieve_index, candidates):
    """Recursive rejection with its parameters in another order: the verification component binds them by name."""
    return reference.tree_speculative_sampling_rejection(candidates, retrieve_index, retrieve_next_token,
                                                         retrieve_next_sibling, uniform_samples,
                                                         uniform_samples_for_final_sampling, target_probs, draft_probs,
                                                         num_steps)


def test_a_plugin_rule_binds_its_arguments_by_name_and_the_checker_proves_it_lossless(registry, pair):
    rule = specdec.register_verify_rule(name="shuffled", label="rejection, shuffled", op=shuffled_rejection)
    assert verify_rule("shuffled") is rule and rule.reads_draft and rule.lossless
    report = lab.exact_law(*pair, SpecConfig(2, 1, draft_sampling="sample", verify="shuffled"),
                           SamplingParams(temperature=1.0), prompt=[1], n=3)
    assert report.max_diff < 1e-6, report


def test_a_plugin_rule_runs_through_the_engine_and_the_bench(registry, pair):
    specdec.register_verify_rule(**TYPICAL)
    spec = SpecConfig(2, 2, 4, verify="typical")  # it reads no draft distribution: top-K drafting will do
    outs = Engine(*pair, spec, max_seq_len=32).generate([[1]] * 3, SamplingParams(max_new_tokens=8, temperature=1.0))
    assert all(len(o.token_ids) == 8 for o in outs)
    cases = with_verify_rules([WorkerCase("target-only", None), WorkerCase("eagle", SpecConfig(2, 2, 4)),
                               WorkerCase("ngram", SpecConfig(3, 1))], ["target_only", "typical"])
    labels = [c.label for c in cases]
    assert labels == ["target-only", "EAGLE tree S2 K2 W4", "EAGLE tree S2 K2 W4 typical", "NGRAM chain S3"]
    assert (base_label(labels[2]), rule_of(labels[2])) == ("EAGLE tree S2 K2 W4", "typical")


def test_a_plugin_cannot_change_a_shipped_rule(registry):
    rejection = verify_rule("rejection")
    with pytest.raises(ValueError, match="verify rule 'rejection' is already registered"):
        specdec.register_verify_rule(name="rejection", label="mine", op=shuffled_rejection)
    with pytest.raises(ValueError, match="verify rule 'rejection' is built in: it cannot be removed"):
        unregister("rejection")
    with pytest.raises(TypeError):
        VERIFY_RULES["rejection"] = rejection  # a read-only view
    with pytest.raises(dataclasses.FrozenInstanceError):
        rejection.op = shuffled_rejection
    assert verify_rule("rejection").op == "tree_speculative_sampling_rejection"


def fills_nothing(candidates, temperature):
    return candidates


@pytest.mark.parametrize("fields,message", [
    (dict(name="mine", label="mine"), "verify rule 'mine' lacks op"),
    (dict(name="mine", label="mine", op="no_such_op"), "reference has no op 'no_such_op'"),
    (dict(name="mine", label="mine", op=fills_nothing), "parameter 'temperature' is none of candidates"),
    (dict(name="mine", label="mine", op=shuffled_rejection, reads_draft=False),
     "reads_draft=False but its op takes draft_probs"),
    (dict(name="mine", label="mine", op=shuffled_rejection, shapes=("dag",)), "shapes must be a non-empty subset"),
    (dict(name="mine", label="mine", op=shuffled_rejection, shapes=("chain",), check_shapes=((2, 2, 4),)),
     "check shape \\(2, 2, 4\\) is a tree"),
    (dict(name="my-rule", label="mine", op=shuffled_rejection), "must be a Python identifier"),
    (dict(name="sampled", label="mine", op=shuffled_rejection), "'sampled' is reserved"),
    (dict(name="mine", label="mine", op=42), "op must be the name of a reference op or a callable"),
    (dict(name="mine", label="mine", op="tree_speculative_sampling_rejection", fast_op=shuffled_rejection),
     "fast_op must be a callable beside a callable op"),
])
def test_a_record_the_registry_cannot_take_is_a_one_line_error(registry, fields, message):
    with pytest.raises(ValueError, match=message) as e:
        specdec.register_verify_rule(**fields)
    assert "\n" not in str(e.value) and "mine" not in VERIFY_RULES
    with pytest.raises(ValueError, match="takes a VerifyRule or its fields, not both"):
        specdec.register_verify_rule(VerifyRule(name="mine", label="mine", op=shuffled_rejection), label="x")


def test_an_unknown_rule_names_the_registered_ones():
    with pytest.raises(ValueError, match=r"verify must be one of the registered rules \(target_only, rejection, "
                                         r"block, traversal\), got 'typical'"):
        SpecConfig(2, verify="typical")


def test_an_op_that_names_no_parameter_is_refused_in_one_line():
    """A wrapper taking *args, **kwargs hides the names the verification component binds by."""
    from specdec.verify_rules import op_arguments

    def traced(*args, **kwargs):
        return None

    with pytest.raises(ValueError, match="functools.wraps") as e:
        op_arguments(traced, "mine")
    assert "\n" not in str(e.value)
