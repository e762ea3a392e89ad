"""CUDA-graph decode steps (`specdec.workers.graphs`): what a step copies out of the graph, what every capture
shares, and what a captured graph may rely on staying alive. The captures themselves need CUDA."""
from __future__ import annotations

import pytest
import torch

from specdec import Engine, SamplingParams
from specdec.models.rope import rope_tables
from specdec.workers.graphs import DecodeGraphs
from tests.helpers import assert_same_as_baseline, logprob_params, near_bigram_target, perfect_drafts_by_kind

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="captures CUDA graphs")
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [3, 3, 3, 3], [2, 7]]


class _StepShapes:
    """Wraps a DecodeGraphs' decode_step: records each returned step's logits rows and its accept width."""

    def __init__(self, graphs: DecodeGraphs):
        self.graphs, self.seen = graphs, []

    def __call__(self):
        step = self.graphs.decode_step()
        logits = step.logits_output.next_token_logits
        self.seen.append((None if logits is None else logits.shape[0], step.accept_index.shape))
        return step


@pytest.mark.parametrize("logprobs", [True, False], ids=["logprobs", "no-logprobs"])
@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_a_step_copies_only_the_accepted_logits_rows(kind, logprobs):
    """Out of the graph's buffer come the B*(S+1) accepted rows when someone asked for logprobs (not the
    B*W rows of the tree), none otherwise; tokens and logprobs equal plain eager steps."""
    target = near_bigram_target(seed=6, mix=0.4)
    draft, spec = perfect_drafts_by_kind(target)[kind]
    params = [(logprob_params(max_new=5 + 3 * i) if logprobs else SamplingParams(max_new_tokens=5 + 3 * i))
              for i in range(5)]
    base = Engine(target, draft, spec, impl="reference", max_batch=6, max_seq_len=96).generate(PROMPTS, params)
    padded = Engine(target, draft, spec, impl="reference", max_batch=6, max_seq_len=96)
    shapes = _StepShapes(DecodeGraphs(padded.worker, capture=False))
    padded._decode = shapes
    assert_same_as_baseline(padded.generate(PROMPTS, params), base)
    assert shapes.seen
    for rows, (B, T) in shapes.seen:
        assert rows == (B * T if logprobs else None), (rows, B, T)
    if kind == "eagle":
        assert spec.num_draft_tokens > spec.num_steps + 1  # a tree: W rows per request, S+1 read


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
