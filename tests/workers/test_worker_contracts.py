"""EagleWorkerV2 and MultiLayerEagleWorkerV2: bad input at construction, no host sync in a step (and on the meta
device), steps without length syncs, stop tokens inside an accepted window, the CUDA-graph buffers, identical op
shapes per step, scaled ropes."""
import functools
import importlib
import threading

import pytest
import torch

import reference
from specdec import Engine, SamplingParams, SpecConfig
from specdec.models import random_eagle_head, random_llama, random_mtp
from specdec.checks import calls_are_trusted, trusted_calls
from specdec.ops.contract import TreeAttentionPlan
from specdec.workers import EagleWorkerV2, MultiLayerEagleWorkerV2
from tests.helpers.equivalence import no_host_sync
from tests.helpers import (assert_same_as_baseline, bigram_target, logprob_params, near_bigram_target,
                           perfect_drafts_by_kind, perfect_eagle, perfect_mtp)


# ---- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    (dict(num_steps=0), "num_steps must be an int >= 1, got 0"),
    (dict(num_steps=2, topk=0), "topk must be an int >= 1, got 0"),
    (dict(num_steps=2, topk=2, num_draft_tokens=8), r"num_draft_tokens=8 must be in \[2, 1 \+ topk .*\] = \[2, 7\]"),
    (dict(num_steps=2, topk=2, num_draft_tokens=1), "num_draft_tokens=1"),
    (dict(num_steps=3, topk=1, num_draft_tokens=3), "must equal num_steps \\+ 1 = 4, got 3"),
    (dict(num_steps=True), "num_steps must be an int >= 1, got bool True"),
    (dict(num_steps=2, topk=True), "topk must be an int >= 1, got bool True"),
    (dict(num_steps=2, topk=2, num_draft_tokens=4.0), "num_draft_tokens must be an int, got float 4.0"),
])
def test_spec_config_violations(kw, match):
    with pytest.raises(ValueError, match=match):
        SpecConfig(**kw)


def test_mismatched_or_misshapen_drafts_are_rejected_at_construction():
    target = random_llama(vocab_size=64, hidden_size=32)
    other = random_llama(vocab_size=80, hidden_size=32, seed=1)
    with pytest.raises(ValueError, match="draft vocab_size=80 does not match the target's vocab_size=64"):
        Engine(target, draft=random_eagle_head(other), spec=SpecConfig(2))
    with pytest.raises(ValueError, match="topk=1 and num_draft_tokens=num_steps\\+1"):
        Engine(target, draft=random_mtp(target, 3), spec=SpecConfig(3, 2, 5))
    with pytest.raises(ValueError, match="needs num_steps=2 layers, got 3"):
        Engine(target, draft=random_mtp(target, 3), spec=SpecConfig(2))
    with pytest.raises(ValueError, match=r"LlamaForCausalLM: draft_lm; DFlashDraftModel: dflash; .*\), got Linear"):
        Engine(target, draft=torch.nn.Linear(2, 2), spec=SpecConfig(2))


def test_a_worker_constructed_with_the_reference_ops_calls_them():
    target = random_llama()
    w = EagleWorkerV2(target, random_eagle_head(target), SpecConfig(2, 2, 4), reference, max_batch=2, max_seq_len=32)
    assert w.ops is reference
    w = MultiLayerEagleWorkerV2(target, random_mtp(target, 2), SpecConfig(2), reference, max_batch=2, max_seq_len=32)
    assert w.ops is reference
    assert Engine(target, impl="reference").worker.ops is reference


@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_decode_step_makes_no_host_sync(kind):
    """No value read on the host inside a decode step: not .item() / .tolist() / a tensor-valued `if`,
    nor the syncs hidden in C++ ops (nonzero, boolean-mask indexing, tensor-valued repeat_interleave);
    with greedy and sampled requests, logprobs, top-k and token-id logprobs in the batch."""
    target = near_bigram_target(seed=3, mix=0.3)
    draft, spec = perfect_drafts_by_kind(target)[kind]
    engine = Engine(target, draft=draft, spec=spec, impl="reference", max_seq_len=96)
    w = engine.worker
    params = [logprob_params(temperature=0.7, top_k=5, top_p=0.9),
              SamplingParams(max_new_tokens=14)]
    w.prefill([[1, 2, 3], [4, 5]], params, seed=0)
    for _ in range(2):
        with no_host_sync():
            step = w.decode_step()
    assert step.accept_lens.shape == (2,)


def _run_on_meta(kind):
    w = _unbound_worker(kind, near_bigram_target(seed=3, mix=0.3).to("meta"), reference, max_batch=2, max_seq_len=96)
    params = [logprob_params(temperature=0.7, top_k=5, top_p=0.9), SamplingParams(max_new_tokens=14)]
    with torch.inference_mode():
        w.prefill([[1, 2, 3], [4, 5]], params, seed=0)
        for _ in range(2):
            step = w.decode_step()
    return step


@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_whole_steps_run_on_the_meta_device(kind):
    """A tensor on `meta` has a shape and no value, so every read of a value, in Python or inside a C++ op
    (.item(), nonzero, boolean-mask indexing, tensor-valued repeat_interleave, a data-dependent shape),
    fails there: a prefill and decode steps that run on `meta`, logprobs included, make no host sync."""
    step = _run_on_meta(kind)
    assert step.predict.device.type == "meta" and step.accept_lens.shape == (2,)


@pytest.mark.parametrize("sync", ["nonzero", "bool_mask", "repeat_interleave", "item"])
def test_the_meta_device_catches_a_host_sync_in_a_step(monkeypatch, sync):
    """The check above can fail: a sync slipped into verify (one that a Python-level guard may miss when it
    happens inside C++) makes the step fail on `meta`."""
    real = reference.verify_tree_greedy

    def leaky(candidates, *args):
        x = candidates.flatten()
        if sync == "nonzero":
            x.nonzero()
        elif sync == "bool_mask":
            _ = x[x > 0]
        elif sync == "repeat_interleave":
            x.repeat_interleave(x.clamp(0, 2))
        else:
            x[0].item()
        return real(candidates, *args)

    monkeypatch.setattr(reference, "verify_tree_greedy", leaky)
    with pytest.raises((RuntimeError, NotImplementedError)):
        _run_on_meta("eagle")


@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_a_worker_driven_without_length_syncs_is_still_lossless(kind):
    """The host's length bound only grows when nobody syncs it: attention spans get longer, the tokens
    stay target-only's (a stale host length once changed the ninth token)."""
    target = near_bigram_target(seed=4, mix=0.4)
    draft, spec = perfect_drafts_by_kind(target)[kind]
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10]]
    base = Engine(target, max_seq_len=160).generate(prompts, SamplingParams(max_new_tokens=24))
    w = Engine(target, draft=draft, spec=spec, impl="reference", max_seq_len=160).worker
    step = w.prefill(prompts, [SamplingParams(max_new_tokens=24)] * 2, seed=0)
    tokens = [[t] for t in step.emitted_tokens()[:, 0].tolist()]
    while min(len(t) for t in tokens) < 24:
        step = w.decode_step()
        lens, emitted = step.accept_lens.tolist(), step.emitted_tokens().tolist()
        for b in range(2):
            tokens[b] += emitted[b][:lens[b]]
    true_max = max(int(n) for n in w.state.seq_lens)
    assert w._unsynced_steps > 1 and w.len_bound >= true_max
    if kind != "target-only":
        assert w.len_bound > true_max  # the bound went stale, as intended
    for b in range(2):
        assert tokens[b][:24] == base[b].token_ids
    with pytest.raises(ValueError, match="lengths for 2 requests"):
        w.sync_lengths([1])


@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_stop_token_inside_an_accepted_window(kind):
    """A stop token (or max_new_tokens) in the middle of a multi-token step cuts tokens and
    logprobs at the same place as target-only decoding does."""
    target = bigram_target(seed=12)
    prompts = [[1, 2, 3], [7, 7]]
    free = Engine(target, max_seq_len=96).generate(prompts, SamplingParams(max_new_tokens=30))
    stops = [free[0].token_ids[6], free[1].token_ids[4]]
    params = [logprob_params(max_new=30), logprob_params(max_new=30)]
    for p, s in zip(params, stops):
        p.stop_token_ids = [s]
    base = Engine(target, max_seq_len=96).generate(prompts, params)
    draft, spec = ((perfect_eagle(target), SpecConfig(4, 2, 8)) if kind == "eagle"
                   else (perfect_mtp(target, 4, True), SpecConfig(4)))
    outs = Engine(target, draft=draft, spec=spec, impl="reference", max_seq_len=96).generate(prompts, params)
    assert_same_as_baseline(outs, base)
    assert all(o.finish_reason == "stop" for o in outs)
    # every request's stop fell inside a window: its last step produced tokens past the stop, dropped
    assert all(1 + sum(o.accept_lens) > len(o.token_ids) for o in outs)
    n = 6 if kind == "eagle" else 7  # a length that falls inside a step of both requests (checked below)
    odd = logprob_params(max_new=n)
    cut = Engine(target, draft=draft, spec=spec, impl="reference", max_seq_len=96).generate(prompts, odd)
    assert_same_as_baseline(cut, Engine(target, max_seq_len=96).generate(prompts, odd))
    assert all(1 + sum(o.accept_lens) > len(o.token_ids) == n for o in cut)


@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_padded_static_buffer_steps_equal_eager_steps(kind):
    """The CUDA-graph plumbing without a GPU: every step runs through a bucket's static buffers (batch
    padded with copies of request 0 on the scratch cache row, state kept there between steps and copied
    in after a filter or a change of bucket), as a replay would; requests leave mid-way so buckets change;
    tokens and logprobs equal plain eager steps."""
    from specdec.workers.graphs import DecodeGraphs, batch_buckets

    assert batch_buckets(6) == [1, 2, 4, 6] and batch_buckets(1) == [1] and batch_buckets(8) == [1, 2, 4, 8]
    target = near_bigram_target(seed=6, mix=0.4)
    draft, spec = perfect_drafts_by_kind(target)[kind]
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [3, 3, 3, 3], [2, 7]]
    params = [logprob_params(max_new=6 + 5 * i, temperature=0.9 * (i % 2), top_k=-1 if i < 3 else 4) for i in range(5)]
    eager = Engine(target, draft, spec, impl="reference", max_batch=6, max_seq_len=96)
    base = eager.generate(prompts, params, seed=3)
    padded = Engine(target, draft, spec, impl="reference", max_batch=6, max_seq_len=96, preallocate=True)
    graphs = DecodeGraphs(padded.worker, capture=False)
    padded._decode = graphs.decode_step
    outs = padded.generate(prompts, params, seed=3)
    assert_same_as_baseline(outs, base)  # padding changes matmul blocking: logprobs within the table
    assert {key[0] for key in graphs.entries} >= {4, 6}  # 5 requests padded to 6, then fewer to 4 ...
    # padded rows duplicate request 0 on the scratch row: on a GPU two programs moving the same row's KV
    # in a commit would race, so they must never share a real request's row
    scratch = padded.worker.cache.scratch_slot
    assert all(int(e.inputs["state.slots"][-1]) == scratch for k, e in graphs.entries.items() if k[0] == 6)
    assert padded.worker.cache.num_free == 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_cuda_graph_replay_equals_eager(kind):
    """On a GPU: every bucket captured and replayed gives the tokens of eager fast decoding."""
    target = near_bigram_target(seed=6, mix=0.4).cuda()
    draft, spec = perfect_drafts_by_kind(target)[kind]
    draft = draft.cuda() if draft is not None else None
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [3, 3, 3, 3], [2, 7]]
    params = [logprob_params(max_new=6 + 5 * i) for i in range(5)]
    eager = Engine(target, draft, spec, impl="fast", max_batch=6, max_seq_len=96, cuda_graphs=False)
    graphed = Engine(target, draft, spec, impl="fast", max_batch=6, max_seq_len=96, cuda_graphs=True)
    for a, b in zip(graphed.generate(prompts, params), eager.generate(prompts, params)):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-4


class _RecordingOps:
    """An ops module that records, per call, the op's name and the shapes / dtypes of its tensor
    arguments, and its Python arguments (the host bound attn_len excepted: the fast kernels do not read
    it; so is everything of an attention plan that is sized by it, which only the reference's has)."""

    def __init__(self, ops):
        self._ops = ops
        self.calls = []

    def __getattr__(self, name):
        fn = getattr(self._ops, name)

        @functools.wraps(fn)  # the verify rules' ops are called by their parameters' names, read off the signature
        def recorded(*args, **kwargs):
            self.calls.append(self.record(name, args, kwargs))
            return fn(*args, **kwargs)

        return recorded

    @staticmethod
    def record(name, args, kwargs):
        shown = list(args)
        if name == "tree_attention":
            shown[7] = "attn_len"
        if name == "plan_tree_attention":
            shown[4] = "attn_len"
        return name, _describe(shown), _describe(kwargs)


def _describe(x):
    if isinstance(x, TreeAttentionPlan):
        return ("plan", x.impl, x.batch, x.num_new, x.write_offset, x.max_seq_len,
                _describe(x.tensors) if x.impl == "fast" else "attn_len-sized")
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_describe(v) for v in x)
    if isinstance(x, dict):
        return tuple((k, _describe(v)) for k, v in sorted(x.items()))
    if hasattr(x, "__dict__") and not callable(x):
        return (type(x).__name__, _describe(vars(x)))
    return x


def _unbound_worker(kind, target, ops, **kw):
    from specdec.workers.base import TargetOnlyWorker
    from specdec.workers.eagle import EagleWorkerV2
    from specdec.workers.multi_layer_eagle import MultiLayerEagleWorkerV2
    draft, spec = perfect_drafts_by_kind(target)[kind]
    if kind == "target-only":
        return TargetOnlyWorker(target, ops, **kw)
    cls = EagleWorkerV2 if kind == "eagle" else MultiLayerEagleWorkerV2
    return cls(target, draft, spec, ops, **kw)


# the interpreted fast MTP case (about 45 s) with -m slow: its ops' shapes are the reference's, which CI checks
@pytest.mark.parametrize("kind, impl", [(k, i) for k in ("target-only", "eagle", "mtp") for i in ("reference", "fast")
                                        if (k, i) != ("mtp", "fast")] + [
    pytest.param("mtp", "fast", marks=pytest.mark.slow)])
def test_decode_steps_have_identical_op_shapes(kind, impl):
    """Consecutive decode steps call the same ops with the same tensor shapes and Python values (what a
    CUDA graph needs), whatever was accepted, with greedy and sampled requests and logprobs."""
    ops = _RecordingOps(importlib.import_module(impl))
    w = _unbound_worker(kind, near_bigram_target(seed=3, mix=0.5), ops, max_batch=2, max_seq_len=96)
    w.prefill([[1, 2, 3], [4, 5]], [logprob_params(temperature=0.7, top_k=5, top_p=0.9), logprob_params(max_new=30)],
              seed=0)
    per_step = []
    accepted = set()
    for _ in range(4):
        ops.calls = []
        step = w.decode_step()
        accepted.update(step.accept_lens.tolist())
        per_step.append(ops.calls)
    assert len(per_step[0]) > 3
    assert all(calls == per_step[0] for calls in per_step[1:])
    if kind != "target-only":
        assert len(accepted) > 1  # the steps accepted different lengths


class _TrustRecordingOps(_RecordingOps):
    """An ops module that records, per op call, whether the call ran inside `checks.trusted_calls`."""

    @staticmethod
    def record(name, args, kwargs):
        return calls_are_trusted()


@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_a_kind_of_steps_first_decode_checks_its_op_calls_and_the_rest_skip_the_checks(kind):
    """Each kind of step (batch size, sampling flags, shape, grammar) runs its first decode body with the ops'
    argument checks and later ones without; a new batch size or new sampling flags is checked again."""
    ops = _TrustRecordingOps(reference)
    w = _unbound_worker(kind, near_bigram_target(seed=3, mix=0.5), ops, max_batch=2, max_seq_len=96)

    def steps(n):
        seen = []
        for _ in range(n):
            ops.calls = []
            w.decode_step()
            assert ops.calls and len(set(ops.calls)) == 1  # every op call of one body alike
            seen.append(ops.calls[0])
        return seen

    w.prefill([[1, 2, 3], [4, 5]], [SamplingParams(max_new_tokens=30)] * 2, seed=0)
    assert steps(3) == [False, True, True]
    w.filter([0])  # one request left: a new batch size
    assert steps(2) == [False, True]
    w.finish()
    w.prefill([[1, 2, 3]], [SamplingParams(max_new_tokens=30, temperature=0.7)], seed=0)  # new sampling flags
    assert steps(2) == [False, True]
    w.finish()
    w.prefill([[6, 7]], [SamplingParams(max_new_tokens=30)], seed=0)  # greedy at B = 1 again: already checked
    assert steps(1) == [True]
    assert not calls_are_trusted()


def test_trusted_calls_cover_only_their_own_block_and_thread():
    """A bad op call outside the block, after an exception left it, or from another thread while it is open,
    still raises its ValueError; inside it, the same call is not checked."""
    def bad_call():
        reference.select_top_k_tokens(0, torch.rand(2, 3), torch.zeros(2, 2, dtype=torch.int64), torch.rand(2, 4),
                                      None, 3)

    with pytest.raises(ValueError, match="topk_index must have shape"):
        bad_call()
    with trusted_calls():
        try:
            bad_call()
        except ValueError:
            raise AssertionError("checked inside trusted_calls()") from None
        except Exception:  # what the unchecked op itself makes of the bad shapes
            pass
        errors = []
        thread = threading.Thread(target=lambda: errors.append(pytest.raises(ValueError, bad_call)))
        thread.start()
        thread.join()
        assert len(errors) == 1
        with trusted_calls(False):
            with pytest.raises(ValueError, match="topk_index must have shape"):
                bad_call()
    with pytest.raises(RuntimeError), trusted_calls():
        raise RuntimeError
    with pytest.raises(ValueError, match="topk_index must have shape"):
        bad_call()
    engine = Engine(near_bigram_target(seed=3), impl="reference", max_seq_len=32)
    engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="topk_index must have shape"):
        bad_call()


@pytest.mark.parametrize("kind, spec", [("eagle", SpecConfig(3, 1)), ("mtp", SpecConfig(3)),
                                        ("eagle", SpecConfig(3, 2, 6))], ids=str)
def test_only_a_step_whose_tree_branches_moves_kv_in_its_commit(kind, spec, monkeypatch):
    """A chain's accepted path is nodes 0..a, whose KV the verify wrote in place: its steps skip the commit, and
    every layer's cache ends bitwise equal to that of a run that commits every step. A branching tree commits."""
    target = near_bigram_target(seed=3, mix=0.5)
    draft = perfect_drafts_by_kind(target)[kind][0]
    params = [logprob_params(temperature=0.7, top_k=5, top_p=0.9), logprob_params(max_new=30)]

    def run(commit_always):
        ops = _RecordingOps(reference)
        cls = EagleWorkerV2 if kind == "eagle" else MultiLayerEagleWorkerV2
        w = cls(target, draft, spec, ops, max_batch=2, max_seq_len=96)
        if commit_always:
            monkeypatch.setattr(type(w), "accepts_in_place", property(lambda self: False))
        w.prefill([[1, 2, 3], [4, 5]], params, seed=0)
        ops.calls, accepted = [], []
        for _ in range(5):
            accepted.append(w.decode_step().accept_lens.tolist())
        monkeypatch.undo()
        return w.cache.kv.clone(), [c[0] for c in ops.calls].count("commit_kv_cache"), accepted

    kv, commits, accepted = run(commit_always=False)
    assert commits == (0 if spec.topk == 1 else 5)
    kv_committed, commits_forced, accepted_forced = run(commit_always=True)
    assert commits_forced == 5 and accepted_forced == accepted and len({a for s in accepted for a in s}) > 1
    if spec.topk == 1:
        assert torch.equal(kv, kv_committed)


@pytest.mark.parametrize("num_steps", [1, 3])
def test_a_no_draft_steps_greedy_verify_is_the_ops_result_without_the_op(num_steps):
    """A one-node tree (a no-draft step) has nothing to verify: the worker builds verify_tree_greedy's result (the
    root's argmax as the bonus, the root accepted, no draft token) without calling it, equal in value and dtype."""
    w = _unbound_worker("eagle", near_bigram_target(seed=3, mix=0.5), reference, max_batch=4, max_seq_len=32)
    w.num_steps = num_steps
    gen = torch.Generator().manual_seed(num_steps)
    for B in (1, 4):
        predict = torch.randint(0, 50, (B, 1), generator=gen)
        candidates = torch.randint(0, 50, (B, 1), generator=gen)
        none = torch.full((B, 1), -1)
        want = reference.verify_tree_greedy(candidates, torch.arange(B)[:, None], none, none, predict, num_steps)
        got = w._root_only_greedy(predict)
        assert all(torch.equal(g, x) and g.dtype == x.dtype for g, x in zip(got, want))


@pytest.mark.parametrize("rope", [{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
                                  {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16}])
def test_scaled_ropes_stay_lossless(rope):
    """A scaled rope rotates each position the same way in a 1-token step and in a W-token verify: both workers
    stay token-identical to target-only past the original context."""
    target = near_bigram_target(seed=9, mix=0.5, rope_scaling=rope)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [4, 5]]
    sp = SamplingParams(max_new_tokens=30, return_logprob=True)
    base = Engine(target, max_seq_len=96).generate(prompts, sp)
    for draft, spec in ((random_eagle_head(target, seed=2), SpecConfig(3, 2, 6)), (random_mtp(target, 3, True),
                                                                                    SpecConfig(3))):
        assert draft.config.rope_scaling == target.config.rope_scaling
        outs = Engine(target, draft, spec, impl="reference", max_seq_len=96).generate(prompts, sp)
        assert_same_as_baseline(outs, base)
