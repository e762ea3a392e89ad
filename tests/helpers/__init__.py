"""Shared test utilities, the one package test modules import (they never import each other): here the logprob
tolerance, one statistical test, model constructions, the comparison of a run with its target-only baseline, and
the sampling-losslessness check (its chi-square and exact law the lab's: `specdec.lab`). Beside them: `oracles/`
(the independent oracles and the tree builders used as test inputs), `equivalence` (reference vs fast: one
comparison, one tolerance table, the host-sync guard), `cuda_shim` (CPU tensors into fast ops on a GPU, installed by
the conftest), `kernel_inventory`, `gguf_files` (small GGUF files written from a known model), `rules` (a verify rule
registered from outside: Medusa's typical acceptance), and two scripts: `python -m tests.helpers.gpu_compile_check`
(every kernel compiled for sm_90) and `python -m tests.helpers.triton_version_check VERSION` (CI's check under the GPU
runs' triton 3.6)."""
from __future__ import annotations

from collections import Counter

import torch
from hypothesis import HealthCheck, settings

from specdec import Engine, SamplingParams, SpecConfig
from specdec.lab import chi_square_pvalue, target_law
from specdec.models.bigram import bigram_target, near_bigram_target, perfect_eagle, perfect_mtp  # noqa: F401
from specdec.tuning import ShapePolicy

# Max abs difference allowed between two computations of the same logprob (fp32 logits).
LOGPROB_ATOL = 1e-4

# Every statistical test in the suite uses this false-failure rate per test; the one chi-square test is the lab's
# (`chi_square_pvalue`, imported above), the one exact law of sampled sequences the lab's `target_law`.
FALSE_FAILURE_RATE = 1e-6

# Hypothesis properties: few derandomized examples in CI, many fresh ones under `-m slow`.
PROPERTY_CI = settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
PROPERTY_SLOW = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def _ban_argmax(compute_logits):
    """Wrap a draft's logits function so that its best guess gets -inf: every proposal then differs from
    what a perfect draft (hence the bigram target's greedy choice) would say."""
    def banned(*args, **kw):
        logits = compute_logits(*args, **kw)
        return logits.scatter(-1, logits.argmax(-1, keepdim=True), float("-inf"))

    return banned


def always_wrong_eagle(target, seed=0):
    """A perfect_eagle whose best guess is banned, through the same plumbing."""
    d = perfect_eagle(target, seed)
    d.compute_logits = _ban_argmax(d.compute_logits)
    return d


def always_wrong_mtp(target, num_layers, chain_hidden_states, seed=0):
    d = perfect_mtp(target, num_layers, chain_hidden_states, seed)
    d.layer_logits = _ban_argmax(d.layer_logits)
    return d


def logprob_params(max_new=14, **kw):
    """Sampling parameters that ask for every kind of logprob: the chosen token's, the top 3 and those of
    token ids 0, 5, 0."""
    return SamplingParams(max_new_tokens=max_new, return_logprob=True, top_logprobs_num=3, token_ids_logprob=[0, 5, 0],
                          **kw)


def assert_same_as_baseline(outs, base):
    """The outputs of a speculative run equal their target-only baseline: the same tokens and finish reasons,
    logprobs (chosen, top and by id) within LOGPROB_ATOL."""
    for o, b in zip(outs, base):
        assert o.token_ids == b.token_ids
        assert o.finish_reason == b.finish_reason
        if b.logprobs is None:
            assert o.logprobs is None
            continue
        assert len(o.logprobs) == len(b.logprobs) == len(o.token_ids)
        assert max(abs(x - y) for x, y in zip(o.logprobs, b.logprobs)) <= LOGPROB_ATOL
        for ta, tb in zip(o.top_logprobs, b.top_logprobs):
            assert [t for _, t in ta] == [t for _, t in tb]
            assert max((abs(x - y) for (x, _), (y, _) in zip(ta, tb)), default=0.0) <= LOGPROB_ATOL
        for ta, tb in zip(o.token_ids_logprobs, b.token_ids_logprobs):
            assert [t for _, t in ta] == [t for _, t in tb]
            assert max((abs(x - y) for (x, _), (y, _) in zip(ta, tb)), default=0.0) <= LOGPROB_ATOL


#: The shipped pair's worker cases by label -> (draft kind, spec): every worker the feature tests cover.
ZOO_WORKERS = {
    "EAGLE tree S5 K4 W16": ("eagle", SpecConfig(5, 4, 16)),
    "EAGLE chain S3": ("eagle", SpecConfig(3, 1)),
    "EAGLE-3 tree S5 K4 W16": ("eagle3", SpecConfig(5, 4, 16)),
    "MTP MiMo S3": ("mtp", SpecConfig(3)),
    "MTP Step-3.5 S3": ("mtp_chain", SpecConfig(3)),
}


def perfect_drafts_by_kind(target):
    """kind -> (draft, spec) of a bigram-perfect draft of `target` for each worker kind (None, None: target-only)."""
    return {
        "target-only": (None, None),
        "eagle": (perfect_eagle(target), SpecConfig(3, 2, 6)),
        "mtp": (perfect_mtp(target, 3, True), SpecConfig(3)),
    }


def check_sampling_is_lossless(kind, spec, temperature, top_k, top_p, N, impl="reference"):
    """The joint law of the first three sampled tokens of a speculative run (the 2nd and 3rd come from speculative
    steps) against the exact one by enumeration; chi-square test, false-failure rate FALSE_FAILURE_RATE. `kind`:
    "eagle", "mtp" or "mtp_chain" (a bigram-perfect draft of each)."""
    V = 6
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3)
    draft = perfect_eagle(target) if kind == "eagle" else perfect_mtp(target, spec.num_steps, kind == "mtp_chain")
    prompt, n_tokens = [1, 2], 3
    params = SamplingParams(max_new_tokens=n_tokens, temperature=temperature, top_k=top_k, top_p=top_p)
    engine = Engine(target, draft=draft, spec=spec, impl=impl, max_batch=N, max_seq_len=12)
    outs = engine.generate([prompt] * N, params, seed=2024)
    accepted = [a for o in outs for a in o.accept_lens]
    assert any(a > 1 for a in accepted) and any(a == 1 for a in accepted)  # both paths exercised
    p = chi_square_pvalue(Counter(tuple(o.token_ids) for o in outs), target_law(target, prompt, n_tokens, params))
    assert p > FALSE_FAILURE_RATE, p


def sampled_sequences_pvalue(outs, exact) -> float:
    """Chi-square p-value of the sampled outputs' token sequences against `exact` (sequence -> probability,
    possibly pruned: the sequences it leaves out form one "other" cell holding the missing mass)."""
    counts = dict.fromkeys(exact, 0)
    other = 0
    for o in outs:
        key = tuple(o.token_ids)
        if key in counts:
            counts[key] += 1
        else:
            other += 1
    cells = list(exact)
    p_other = max(0.0, 1.0 - sum(exact.values()))
    return chi_square_pvalue([counts[c] for c in cells] + [other], [exact[c] for c in cells] + [p_other])


def assert_same_tensors(a, b):
    """Two sequences of tensors equal element for element: dtype, shape and every value."""
    assert len(a) == len(b)
    for k, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype, (k, x.dtype, y.dtype)
        assert x.shape == y.shape, (k, x.shape, y.shape)
        assert torch.equal(x, y), (k, x, y)


class CyclingSpec:
    """Stands in for an engine's tuned spec (`engine.tuned = CyclingSpec(shapes)`): its policy ignores acceptance and
    runs `shapes` in turn, one per decode step."""

    def __init__(self, shapes):
        self.shapes = shapes

    def policy(self):
        shapes = self.shapes

        class Cycle(ShapePolicy):
            i = -1

            def choose(self, batch_size):
                self.i += 1
                return shapes[self.i % len(shapes)]
        return Cycle()


def installed_gguf(name: str = "smollm2-135m-instruct"):
    """The installed GGUF file of the zoo's real target `name`, or None when its package is missing (the tests that
    need it skip, naming the install command)."""
    from specdec import zoo
    try:
        return zoo.real_target_gguf(name)
    except ValueError:
        return None


def write_gpu_rows(out, name: str, rows: list[dict]) -> None:
    """A gpu-check CSV `name` (`gpu_rows.ROW_TYPES`) under `out` with `rows`: the given columns, `status` ok, the
    rest blank, as a run writes it."""
    import dataclasses

    from specdec.gpu_check import rows as gpu_rows
    row_type = gpu_rows.ROW_TYPES[name]
    w = gpu_rows.writer(out, name)
    for values in rows:
        full = dict.fromkeys((f.name for f in dataclasses.fields(row_type)), "")
        full.update({"status": "ok", **values})
        w.write(row_type(**full))
    w.close()
