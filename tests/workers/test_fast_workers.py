"""The fast workers (Triton ops through the same worker code) against the reference workers and
plain target-only decoding, on CPU under Triton's interpreter and compiled on a GPU."""
from __future__ import annotations

import os
import sys


import pytest
import torch

import fast
import reference
from specdec import Engine, SamplingParams, SpecConfig
from tests.helpers.equivalence import no_host_sync
from tests.helpers import (CyclingSpec, assert_same_as_baseline, check_sampling_is_lossless, logprob_params,
                           near_bigram_target, perfect_eagle, perfect_mtp)

REFERENCE_DIR = os.path.dirname(reference.__file__) + os.sep
#: Where the tests that check the engine's choice of ops build their target: a CPU model never gets the
#: compiled kernels, so on a GPU machine it must live on the GPU.
TEST_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: Torch ops that `fast` shares with `reference` on purpose (their docstrings say why).
SHARED_TORCH_OPS = {"select_top_k_tokens", "organize_draft_results", "_stable_topk_desc", "check_tree_size",
                    "max_num_draft_tokens"}

CASES = {
    "EAGLE tree K=2": (lambda t: perfect_eagle(t, seed=1), SpecConfig(3, 2, 6)),
    "EAGLE tree K=4": (lambda t: perfect_eagle(t, seed=2), SpecConfig(2, 4, 9)),
    "EAGLE chain": (lambda t: perfect_eagle(t, seed=3), SpecConfig(3, 1)),
    "MTP MiMo": (lambda t: perfect_mtp(t, 2, False), SpecConfig(2)),
    "MTP Step-3.5": (lambda t: perfect_mtp(t, 2, True), SpecConfig(2)),
}


def test_a_worker_constructed_with_the_fast_ops_calls_them():
    from specdec.workers import EagleWorkerV2, TargetOnlyWorker
    target = near_bigram_target(seed=0).to(TEST_DEVICE)
    assert EagleWorkerV2(target, perfect_eagle(target), SpecConfig(2, 2, 4), fast, max_batch=2, max_seq_len=32).ops \
        is fast
    assert TargetOnlyWorker(target, fast, max_batch=2, max_seq_len=32).ops is fast
    assert Engine(target, impl="fast").worker.ops is fast


@pytest.mark.parametrize("name", ["target-only"] + list(CASES))
def test_fast_greedy_equals_reference_and_target_only(name):
    """Ragged prompts, requests that leave at different lengths (one of them mid-window through a stop
    token), a request without logprobs: the tokens of target-only decoding, logprobs within the table."""
    target = near_bigram_target(seed=11, mix=0.35, num_key_value_heads=2)
    draft, spec = (None, None) if name == "target-only" else (CASES[name][0](target), CASES[name][1])
    prompts = [[1, 2, 3, 4, 5], [7], [9, 10, 11]]
    free = Engine(target, max_seq_len=64).generate(prompts, SamplingParams(max_new_tokens=12))
    params = [logprob_params(max_new=12), SamplingParams(max_new_tokens=7), logprob_params(max_new=12)]
    params[2].stop_token_ids = [free[2].token_ids[5]]
    base = Engine(target, max_seq_len=64).generate(prompts, params)
    ref = Engine(target, draft, spec, impl="reference", max_seq_len=64).generate(prompts, params)
    engine = Engine(target, draft, spec, impl="fast", max_seq_len=64)
    outs = engine.generate(prompts, params)
    assert engine.impl == "fast"
    assert_same_as_baseline(outs, base)
    assert_same_as_baseline(outs, ref)
    assert outs[2].finish_reason == "stop"
    if spec is not None:
        assert engine.last_stats.mean_accept_len > 1.0


FAST_SAMPLING_CASES = [("eagle", SpecConfig(2, 2, 4), 1.0, -1, 1.0), ("mtp_chain", SpecConfig(2), 1.0, 3, 0.8)]


def test_fast_shape_switching_through_no_draft_steps_equals_target_only():
    """Adaptive speculation's contract on the fast path: steps switch among a tree, a chain and no draft, whose runs
    the draft catches up on in one extend (the fast attention over the skipped positions); ragged prompts, tokens and
    logprobs are target-only's."""
    from specdec.ops.contract import NO_DRAFT
    from specdec.tuning import Bucket, Candidate, TunedSpec, fingerprint
    target = near_bigram_target(seed=11, mix=0.35, num_key_value_heads=2)
    draft = perfect_eagle(target, seed=1)
    cycle = [(3, 2, 6), NO_DRAFT, NO_DRAFT, (3, 1, 4), NO_DRAFT, (3, 2, 6)]
    bucket = Bucket((3, 2, 6), tuple(Candidate(shape, 2.0, 1.0) for shape in dict.fromkeys(cycle)))
    tuned = TunedSpec({"fingerprint": fingerprint(target)}, {"kind": "eagle", "fingerprint": fingerprint(draft)}, {},
                      {4: bucket}, adaptive=True)
    prompts = [[1, 2, 3, 4, 5], [9, 10, 11]]
    params = logprob_params(max_new=10)
    base = Engine(target, max_seq_len=64).generate(prompts, params)
    runs = {}
    for impl in ("reference", "fast"):
        engine = Engine(target, draft, tuned, impl=impl, max_batch=4, max_seq_len=64)
        engine.tuned = CyclingSpec(cycle)
        runs[impl] = engine.generate(prompts, params)
        assert engine.impl == impl and engine.last_stats.step_shapes[:4] == cycle[:4]
    assert_same_as_baseline(runs["fast"], base)
    # the drafts after each catch-up are the reference's (whose catch-up test_tuning checks against a prefill): the
    # same accepted lengths, deep ones among them
    assert [o.accept_lens for o in runs["fast"]] == [o.accept_lens for o in runs["reference"]]
    assert max(a for o in runs["fast"] for a in o.accept_lens[1:]) > 2


@pytest.mark.parametrize("kind, spec, temperature, top_k, top_p", FAST_SAMPLING_CASES[:1])
def test_fast_sampling_is_lossless(kind, spec, temperature, top_k, top_p):
    """The exact-distribution test of the reference workers (joint law of three tokens, chi-square at the
    suite's false-failure rate) for the fast workers. On a CPU the interpreted kernels cost about 8 ms a
    program, so CI draws only 24 sequences there (a smoke test of the support and of both paths, drafts accepted
    and rejected); the `slow` grid below draws 2000, and a GPU 5000 (or SPECDEC_LOSSLESS_DRAWS: gpu-check sizes it
    to its budget)."""
    N = int(os.environ.get("SPECDEC_LOSSLESS_DRAWS", 5000)) if torch.cuda.is_available() else 24
    check_sampling_is_lossless(kind, spec, temperature, top_k, top_p, N, impl="fast")


@pytest.mark.slow
@pytest.mark.parametrize("kind, spec, temperature, top_k, top_p", FAST_SAMPLING_CASES)
def test_fast_sampling_is_lossless_many_draws(kind, spec, temperature, top_k, top_p):
    check_sampling_is_lossless(kind, spec, temperature, top_k, top_p, 5000 if torch.cuda.is_available() else 2000,
                               impl="fast")


@pytest.mark.parametrize("name", ["target-only", "EAGLE tree K=2", "MTP Step-3.5"])
def test_fast_decode_step_makes_no_host_sync(name):
    target = near_bigram_target(seed=3, mix=0.3)
    draft, spec = (None, None) if name == "target-only" else (CASES[name][0](target), CASES[name][1])
    w = Engine(target, draft, spec, impl="fast", max_seq_len=64).worker
    w.prefill([[1, 2, 3], [4, 5]],
              [logprob_params(temperature=0.7, top_k=5, top_p=0.9), SamplingParams(max_new_tokens=9)], seed=0)
    for _ in range(2):
        with no_host_sync():
            w.decode_step()


# the MTP worker with -m slow (about 50 s interpreted); CI checks target-only and the EAGLE tree
@pytest.mark.parametrize("name", ["target-only", "EAGLE tree K=2", pytest.param("MTP MiMo", marks=pytest.mark.slow)])
def test_a_fast_worker_never_calls_a_reference_op(name):
    """Every function that runs during a fast prefill and decode step is watched: none defined in
    `reference/` may run, except the torch ops `fast` shares on purpose."""
    target = near_bigram_target(seed=3, mix=0.3)
    draft, spec = (None, None) if name == "target-only" else (CASES[name][0](target), CASES[name][1])
    w = Engine(target, draft, spec, impl="fast", max_seq_len=64).worker
    called = set()

    def watch(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(REFERENCE_DIR):
            while frame.f_code.co_name.startswith("<"):  # a comprehension: charge it to its function
                frame = frame.f_back
            called.add(frame.f_code.co_name)

    sys.setprofile(watch)
    try:
        w.prefill([[1, 2, 3], [4, 5]], [logprob_params(temperature=0.7, top_k=5), logprob_params()], seed=0)
        w.decode_step()
    finally:
        sys.setprofile(None)
    assert called <= SHARED_TORCH_OPS, called - SHARED_TORCH_OPS
    reference_w = Engine(target, draft, spec, impl="reference", max_seq_len=64).worker
    sys.setprofile(watch)  # the watch itself sees reference ops when they run
    try:
        reference_w.prefill([[1, 2, 3]], [logprob_params()], seed=0)
    finally:
        sys.setprofile(None)
    assert called - SHARED_TORCH_OPS


def test_impl_auto_picks_fast_only_on_cuda():
    # built on the test's device: auto picks by the target's device, so a CPU target on a GPU machine is
    # the reference's
    target = near_bigram_target(seed=0).to(TEST_DEVICE)
    assert Engine(target).impl == ("fast" if torch.cuda.is_available() else "reference")
    with pytest.raises(ValueError, match="cuda_graphs=True needs impl='fast' on a CUDA device"):
        Engine(target, impl="reference", cuda_graphs=True)

