"""CUDA-graph decode steps (`specdec.workers.graphs`): what a step copies into the graph's static inputs and out of
its outputs, what every capture shares, and what a captured graph may rely on staying alive. The captures
themselves need CUDA."""
from __future__ import annotations

import pytest
import torch

from specdec import Engine, SamplingParams
from specdec.models.rope import rope_tables
from specdec.workers.graphs import DecodeGraphs
from tests.helpers import assert_same_as_baseline, logprob_params, near_bigram_target, perfect_drafts_by_kind

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="captures CUDA graphs")
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [3, 3, 3, 3], [2, 7]]


class _StepLogits:
    """Wraps a DecodeGraphs' decode_step: records whether each returned step's logits are the first B*W rows of
    the graph's own logits buffer (a view, nothing copied out), and the step's B, W and S+1."""

    def __init__(self, graphs: DecodeGraphs):
        self.graphs, self.seen = graphs, []

    def __call__(self):
        step = self.graphs.decode_step()
        logits = step.logits_output.next_token_logits
        buffers = [e.step.logits_output.next_token_logits for e in self.graphs.entries.values()]
        in_buffer = any(logits.data_ptr() == b.data_ptr() for b in buffers)
        B, T = step.accept_index.shape
        self.seen.append((in_buffer, logits.shape[0], B, step.predict.shape[0] // B, T))
        return step


@pytest.mark.parametrize("logprobs", [True, False], ids=["logprobs", "no-logprobs"])
@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_a_step_copies_no_logits_out_of_the_graph(kind, logprobs):
    """A returned step's logits are its B requests' B*W rows of the graph's buffer, a view (the logprob helper
    reads the accepted rows there through the accept index), with or without logprobs, also for a tree's W > S+1
    rows; tokens and logprobs equal plain eager steps."""
    target = near_bigram_target(seed=6, mix=0.4)
    draft, spec = perfect_drafts_by_kind(target)[kind]
    params = [(logprob_params(max_new=5 + 3 * i) if logprobs else SamplingParams(max_new_tokens=5 + 3 * i))
              for i in range(5)]
    base = Engine(target, draft, spec, impl="reference", max_batch=6, max_seq_len=96).generate(PROMPTS, params)
    padded = Engine(target, draft, spec, impl="reference", max_batch=6, max_seq_len=96, preallocate=True)
    steps = _StepLogits(DecodeGraphs(padded.worker, capture=False))
    padded._decode = steps
    assert_same_as_baseline(padded.generate(PROMPTS, params), base)
    assert steps.seen
    for in_buffer, rows, B, W, _ in steps.seen:
        assert in_buffer and rows == B * W, (rows, B, W)
    if kind == "eagle":
        assert all(W == spec.num_draft_tokens > T == spec.num_steps + 1 for _, _, _, W, T in steps.seen)


class _Plumbing:
    """Wraps a DecodeGraphs: before each step records whether the worker's live state was already the views of
    the static inputs it is loaded into (a steady step: nothing of it to copy); checks after each load that the
    padded rows repeat request 0 on the scratch slot, and after each body that it left the sampling inputs as
    they were."""

    def __init__(self, graphs: DecodeGraphs):
        self.graphs, self.steps = graphs, []  # (B, bucket, steady)
        load, run_body = graphs._load, graphs._run_body
        scratch = graphs.worker.cache.scratch_slot

        def checked_load(entry, B):
            live = {k: v for k, v in graphs._live_tensors().items() if k != "state.uniforms"}
            steady = all(v.data_ptr() == entry.inputs[k].data_ptr() for k, v in live.items())
            self.steps.append((B, entry.bucket, steady))
            load(entry, B)
            for name, buffer in entry.inputs.items():
                pads = buffer[B:]
                want = torch.full_like(pads, scratch) if name == "state.slots" else buffer[:1].expand_as(pads)
                assert torch.equal(pads, want), name

        def checked_body(entry):
            sampling = {k: v.clone() for k, v in entry.inputs.items() if k.startswith("sampling.")}
            run_body(entry)
            assert all(torch.equal(entry.inputs[k], v) for k, v in sampling.items())

        graphs._load, graphs._run_body = checked_load, checked_body


@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_steady_steps_and_filters_through_the_static_inputs_equal_eager_steps(kind):
    """Requests leave mid-way (a filter's kept rows are copied in), buckets change (another entry's inputs), and
    between those the steps of one batch find the state already in the bucket's inputs (padded or not, sampled
    or greedy): tokens and logprobs equal plain eager steps."""
    target = near_bigram_target(seed=6, mix=0.4)
    draft, spec = perfect_drafts_by_kind(target)[kind]
    params = [logprob_params(max_new=8 + 6 * i, temperature=0.9 * (i % 2), top_k=-1 if i < 3 else 4)
              for i in range(5)]
    base = Engine(target, draft, spec, impl="reference", max_batch=6, max_seq_len=96).generate(PROMPTS, params, seed=3)
    padded = Engine(target, draft, spec, impl="reference", max_batch=6, max_seq_len=96, preallocate=True)
    plumbing = _Plumbing(DecodeGraphs(padded.worker, capture=False))
    padded._decode = plumbing.graphs.decode_step
    assert_same_as_baseline(padded.generate(PROMPTS, params, seed=3), base)
    steps = plumbing.steps
    assert len({bucket for _, bucket, _ in steps}) >= 3
    assert not steps[0][2] and any(not steady for _, _, steady in steps[1:])  # the prefill's state, filters
    assert any(steady and bucket > B for B, bucket, steady in steps)  # steady in a padded bucket
    assert any(steady and bucket == B for B, bucket, steady in steps)


def _steady_eager_ops(kind: str, sampled: bool):
    """The eager ops (those outside the body a graph replays) of steady steps of two requests in their bucket
    of two, without logprobs, whether the worker's live state stayed views of the bucket's static inputs after
    each, and the uniforms the worker draws per step."""
    from specdec.bench.suites.kernel_count import KernelCounter, host_work

    target = near_bigram_target(seed=6, mix=0.4)
    draft, spec = perfect_drafts_by_kind(target)[kind]
    engine = Engine(target, draft, spec, impl="reference", max_batch=2, max_seq_len=96, preallocate=True)
    worker, graphs = engine.worker, DecodeGraphs(engine.worker, capture=False)
    run_body, eager, views = graphs._run_body, [], []
    body = KernelCounter()

    def counted_body(entry):
        with body:
            run_body(entry)

    params = [SamplingParams(max_new_tokens=40, temperature=0.8 if sampled else 0.0)] * 2
    with torch.inference_mode():
        worker.prefill(PROMPTS[:2], params, seed=1)
        worker.rng.uniforms = host_work(worker.rng.uniforms)
        graphs.decode_step()
        graphs._run_body = counted_body
        for _ in range(3):
            body.kernels.clear()
            body.triton.clear()
            with KernelCounter() as step:
                graphs.decode_step()
            eager.append(step.by_op() - body.by_op())
            entry = next(iter(graphs.entries.values()))
            views.append(all(t.data_ptr() == entry.inputs[f"state.{k}"].data_ptr()
                             for k, t in worker.state.tensors().items()))
        worker.finish()
    return eager, views, worker.uniforms_per_step


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_a_steady_step_copies_nothing_but_its_uniforms(kind, sampled):
    """Without logprobs a steady step of a batch in its own bucket launches nothing outside the body but the copy
    of the uniforms its prologue drew (when the worker draws any): no state or sampling tensor is copied into the
    static inputs, nothing out of the outputs, and the live state stays the views of the inputs."""
    eager, views, uniforms = _steady_eager_ops(kind, sampled)
    assert all(views)
    assert all(ops == ({"aten.copy_": 1} if uniforms else {}) for ops in eager), eager
    assert bool(uniforms) == sampled  # a greedy batch draws none



def test_rope_tables_never_evict_a_tensor_a_graph_reads():
    first, _ = rope_tables(8, 10000.0, None, torch.device("cpu"))
    for i in range(200):  # more configurations than any bounded cache of the old size held
        rope_tables(8, 20000.0 + i, None, torch.device("cpu"))
    again, _ = rope_tables(8, 10000.0, None, torch.device("cpu"))
    assert again is first


@needs_cuda
def test_every_capture_shares_one_stream():
    """Warm-up and capture of every bucket, of every engine, run the body on the one capture stream."""
    from specdec.workers.graphs import capture_stream

    target = near_bigram_target(seed=6, mix=0.4).cuda()
    streams = []

    def recording(worker):
        body = worker.decode_body

        def decode_body():
            streams.append(torch.cuda.current_stream())
            return body()
        worker.decode_body = decode_body

    for max_batch, prompts in ((4, [PROMPTS[:3], PROMPTS[:1]]), (2, [PROMPTS[:2]])):
        engine = Engine(target, impl="fast", max_batch=max_batch, max_seq_len=64, cuda_graphs=True)
        recording(engine.worker)
        for batch in prompts:
            engine.generate(batch, SamplingParams(max_new_tokens=4))
    assert len(streams) >= 9  # three captures, each two warm-up runs and the captured one
    assert set(streams) == {capture_stream(torch.device("cuda", torch.cuda.current_device()))}


SAMPLED = dict(temperature=0.7, top_k=8, top_p=0.9)


@needs_cuda
@pytest.mark.parametrize("mix", ["sampled", "mixed"])
@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_captured_sampling_body_equals_eager(kind, mix):
    """The sampling body (temperature, top-k, top-p, tree sampling verify) captured and replayed gives the
    tokens of eager fast decoding from the same seed; in a mixed batch greedy requests ride along."""
    target = near_bigram_target(seed=6, mix=0.4).cuda()
    draft, spec = perfect_drafts_by_kind(target)[kind]
    params = [logprob_params(max_new=6 + 3 * i, **({} if mix == "mixed" and i % 2 else SAMPLED)) for i in range(5)]
    eager = Engine(target, draft, spec, impl="fast", max_batch=6, max_seq_len=96, cuda_graphs=False)
    graphed = Engine(target, draft, spec, impl="fast", max_batch=6, max_seq_len=96, cuda_graphs=True)
    for a, b in zip(graphed.generate(PROMPTS, params, seed=4), eager.generate(PROMPTS, params, seed=4)):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-4
