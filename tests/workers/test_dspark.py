"""DSpark block drafting: one drafter forward per step, the Markov head choosing the block token after token, the
confidence head capping each request's verified chain. Lossless against target-only decoding (greedy tokens and
logprobs on ragged batches whose caps differ per request and per step, at every threshold, with the verify narrowed
on the CPU and at the fixed width the CUDA graphs replay; the exact distribution when sampling, target-only and
rejection verify; penalties, logit bias, grammars with masked drafts; the fast path); every block and every cap equal
DeepSpec's computation written out from the raw tensors over the committed sequence; no host sync in a fixed-shape
step; a block longer than the drafter's is a one-line ValueError. The greedy, oracle, fixed-shape and fast-path
checks run with a vanilla and an rnn Markov head (the one that carries a state through the block)."""
from collections import Counter

import pytest
import torch

import reference
from specdec import Engine, SamplingParams, SpecConfig
from specdec.draft_kinds import draft_kind, kind_of
from specdec.lab import target_law
from specdec.models import random_llama
from specdec.models.dspark import random_dspark
from specdec.workers.dspark import DSparkWorker
from specdec.workers.graphs import DecodeGraphs
from tests.helpers import (FALSE_FAILURE_RATE, assert_same_as_baseline, chi_square_pvalue, logprob_params,
                           near_bigram_target)
from tests.helpers.equivalence import no_host_sync
from tests.helpers.oracles import dspark_block_from_tensors

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 3], [4, 4, 10, 2, 6]]


@pytest.fixture(scope="module")
def tiny():
    """A 4-layer target of 12 tokens and a random 2-layer DSpark drafter of block 6 reading the embedding output
    and target layer 2 (weights large enough that its confidence estimates spread around one half)."""
    target = random_llama(vocab_size=12, hidden_size=32, num_hidden_layers=4, seed=11, model_type="qwen3")
    return target, random_dspark(target, 2, 6, target_layer_ids=[-1, 2], mask_token_id=11, seed=5, std=0.5,
                                 markov_rank=8)


@pytest.fixture(scope="module")
def tiny_rnn(tiny):
    """`tiny`'s target with a drafter of the same shape whose Markov head is DeepSpec's rnn head (a state carried
    through the block)."""
    target, _ = tiny
    return target, random_dspark(target, 2, 6, target_layer_ids=[-1, 2], mask_token_id=11, seed=6, std=0.5,
                                 markov_rank=8, markov_head_type="rnn")


#: the Markov head types the worker's tests run, by the fixture holding a pair with one
MARKOV_PAIRS = {"vanilla": "tiny", "rnn": "tiny_rnn"}


def record_blocks(w) -> list:
    """Wraps the worker's draft() so that each call appends (slots, committed lengths, full candidates, verified
    chain lengths) to the list returned: the verified length read from the tree's links (nodes linked from the
    root), the candidates from the block before any narrowing."""
    seen, inner, propose = [], w.draft, w._propose_block
    blocks = []

    def proposing(hidden, root):
        proposals, q = propose(hidden, root)
        blocks.append(torch.cat([root[:, None], proposals], dim=1).tolist())
        return proposals, q

    def recording():
        tree = inner()
        links = tree.retrieve_next_token
        verified = (links[:, :-1] >= 0).cumprod(1).sum(1) if links.shape[1] > 1 else torch.zeros(links.shape[0])
        seen.append((list(w.slot_list), w.state.seq_lens.tolist(), blocks[-1], verified.tolist(),
                     tree.candidates.shape[1]))
        return tree

    w._propose_block, w.draft = proposing, recording
    return seen


@pytest.mark.parametrize("markov", list(MARKOV_PAIRS))
@pytest.mark.parametrize("threshold", [0.0, 0.5, 0.8])
@pytest.mark.parametrize("fixed", [False, True], ids=["narrowed", "fixed-width"])
def test_greedy_identical_with_logprobs_on_a_ragged_batch(request, markov, threshold, fixed):
    target, draft = request.getfixturevalue(MARKOV_PAIRS[markov])
    draft.confidence_threshold = threshold
    base = Engine(target, max_seq_len=64).generate(PROMPTS, logprob_params(24))
    engine = Engine(target, draft=draft, spec=SpecConfig(6), max_seq_len=64)
    assert type(engine.worker) is DSparkWorker and kind_of(draft).name == "dspark"
    engine.worker.fixed_step_shapes = fixed
    seen = record_blocks(engine.worker)
    assert_same_as_baseline(engine.generate(PROMPTS, logprob_params(24)), base)
    widths = {width for *_, width in seen}
    verified = {v for _, _, _, lengths, _ in seen for v in lengths}
    if threshold == 0.0:
        assert verified == {6} and widths == {7}
    elif fixed:
        assert widths == {7} and len(verified) > 1
    else:
        assert len(verified) > 1 and max(widths) < 7 or len(widths) > 1


@pytest.mark.parametrize("markov", list(MARKOV_PAIRS))
def test_each_block_and_cap_is_deepspecs_computation_over_the_committed_sequence(request, markov):
    """At every step, for every request of a ragged batch, the block the worker drafts is the Markov argmax chain of
    DeepSpec's forward written out from the raw tensors over the target features of the committed tokens, and the
    chain it verifies is cut where DeepSpec's confidence rule cuts it: the context's positions, features and commits
    line up (a misaligned context only costs acceptance, which losslessness never shows), and an rnn head's state
    runs through each block from zero."""
    target, draft = request.getfixturevalue(MARKOV_PAIRS[markov])
    draft.confidence_threshold = 0.5
    engine = Engine(target, draft=draft, spec=SpecConfig(6), max_seq_len=64)
    seen = record_blocks(engine.worker)
    outs = engine.generate(PROMPTS, SamplingParams(max_new_tokens=16))
    cfg, sd = draft.checkpoint()
    request_of = {slot: i for i, slot in enumerate(seen[0][0])}
    caps = set()
    for slots, lens, blocks, verified, _ in seen:
        for slot, n, block, cap in zip(slots, lens, blocks, verified):
            seq = PROMPTS[request_of[slot]] + outs[request_of[slot]].token_ids
            with torch.no_grad():
                feats = target(torch.tensor([seq[:n]]), torch.arange(n)[None], features=draft.feature_layers).features
            proposals, _, _, length = dspark_block_from_tensors(sd, cfg, feats[0], seq[n], 6, threshold=0.5)
            assert block == [seq[n]] + proposals and cap == length
            caps.add(cap)
    assert len(caps) > 2


def test_the_fixed_shape_step_through_padded_static_buffers(tiny):
    """The step the CUDA graphs replay, run eagerly through their static buffers (the verify at its full width):
    three requests padded to a bucket of four, then two, then one as they finish."""
    target, draft = tiny
    draft.confidence_threshold = 0.5
    engine = Engine(target, draft=draft, spec=SpecConfig(5), max_seq_len=64)
    engine._decode = DecodeGraphs(engine.worker, capture=False).decode_step
    assert engine.worker.fixed_step_shapes and not engine.worker.trims_verify
    params = [logprob_params(18), logprob_params(9), logprob_params(14, temperature=0.8)]
    outs = engine.generate(PROMPTS, params)
    assert_same_as_baseline(outs[:2], [Engine(target, max_seq_len=64).generate([p], q)[0]
                                       for p, q in zip(PROMPTS[:2], params[:2])])
    assert len(outs[2].token_ids) == 14


@pytest.mark.parametrize("markov", list(MARKOV_PAIRS))
def test_a_fixed_shape_decode_step_makes_no_host_sync(request, markov):
    target, draft = request.getfixturevalue(MARKOV_PAIRS[markov])
    draft.confidence_threshold = 0.5
    w = DSparkWorker(target, draft, SpecConfig(4), reference, max_batch=2, max_seq_len=64)
    w.fixed_step_shapes = True  # as DecodeGraphs sets it; on a CPU alone the verify is narrowed with one read
    params = [logprob_params(temperature=0.7, top_k=5, top_p=0.9), SamplingParams(max_new_tokens=14)]
    w.prefill([[1, 2, 3], [4, 5]], params, seed=0)
    for _ in range(2):
        with no_host_sync():
            step = w.decode_step()
    assert step.accept_lens.shape == (2,)
    meta_target = near_bigram_target(seed=3, mix=0.3).to("meta")
    meta_draft = random_dspark(near_bigram_target(seed=3, mix=0.3), 1, 4, target_layer_ids=[0], mask_token_id=1,
                               markov_head_type=markov)
    meta_draft._target = (meta_target,)
    w = DSparkWorker(meta_target, meta_draft.to("meta"), SpecConfig(3), reference, max_batch=2, max_seq_len=64)
    assert not w.trims_verify
    with torch.inference_mode():
        w.prefill([[1, 2, 3], [4, 5]], params, seed=0)
        step = w.decode_step()
    assert step.predict.device.type == "meta"


@pytest.mark.parametrize("markov", ["vanilla", pytest.param("rnn", marks=pytest.mark.slow)])
def test_the_fast_path_is_identical(request, markov):
    target, draft = request.getfixturevalue(MARKOV_PAIRS[markov])
    draft.confidence_threshold = 0.5
    prompts = [[1, 2, 3], [8, 9]]
    base = Engine(target, max_seq_len=24).generate(prompts, logprob_params(5))
    outs = Engine(target, draft=draft, spec=SpecConfig(3), impl="fast", max_seq_len=24).generate(
        prompts, logprob_params(5))
    assert_same_as_baseline(outs, base)


@pytest.mark.parametrize("spec", [SpecConfig(2), SpecConfig(3, draft_sampling="sample", verify="rejection")],
                         ids=["target-only", "rejection"])
def test_sampling_is_the_exact_distribution(spec):
    """The first three sampled tokens (two from a speculative step) against the target's law by enumeration, with
    caps that vary with the drafted tokens."""
    V, N = 6, 3000
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3)
    draft = random_dspark(target, 1, 4, target_layer_ids=[0], mask_token_id=5, seed=4, markov_rank=4, std=0.6,
                          confidence_threshold=0.5)
    exact = target_law(target, [1, 2], 3, SamplingParams(temperature=0.8))
    engine = Engine(target, draft=draft, spec=spec, max_batch=N, max_seq_len=16, preallocate=True)
    seen = record_blocks(engine.worker)
    outs = engine.generate([[1, 2]] * N, SamplingParams(max_new_tokens=3, temperature=0.8), seed=5)
    assert any(a > 1 for o in outs for a in o.accept_lens)  # drafts were accepted: verify decided the law
    assert len({v for _, _, _, lengths, _ in seen for v in lengths}) > 1  # and the caps varied
    assert chi_square_pvalue(Counter(tuple(o.token_ids) for o in outs), exact) > FALSE_FAILURE_RATE


def test_penalties_grammars_and_a_ragged_batch(small):
    """The small pair's target with a random DSpark drafter: penalties, logit bias, min_new_tokens and a grammar,
    with the draft's penalties and grammar masks on, each request equal to target-only decoding of it alone."""
    tok, target = small.tokenizer, small.target
    draft = random_dspark(target, 1, 5, mask_token_id=0, seed=3, confidence_threshold=0.3)
    held = [tok.encode("import os\nimport sys\n\n\ndef main"), tok.encode("class A:\n    def "),
            tok.encode("    return self.")]
    params = [SamplingParams(max_new_tokens=20, frequency_penalty=0.8, presence_penalty=0.4, return_logprob=True),
              SamplingParams(max_new_tokens=16, regex=r"(def|class) [A-Za-z_]+", stop_token_ids=[32]),
              SamplingParams(max_new_tokens=16, repetition_penalty=1.4, min_new_tokens=5, stop_token_ids=[10],
                             logit_bias={101: -3.0, 32: 1.5})]
    spec = SpecConfig(5, draft_penalties=True, draft_grammar=True)
    outs = Engine(target, draft=draft, spec=spec, max_seq_len=128, tokenizer=tok).generate(held, params)
    alone = Engine(target, max_seq_len=128, tokenizer=tok)
    for i in range(3):
        assert_same_as_baseline([outs[i]], [alone.generate([held[i]], params[i])[0]])
    assert tok.decode(outs[1].token_ids) == "class "


def _one_line_value_error(match, fn):
    with pytest.raises(ValueError, match=match) as e:
        fn()
    assert "\n" not in str(e.value)


def test_shapes_the_drafter_was_not_trained_for_are_one_line_value_errors(tiny):
    target, draft = tiny
    _one_line_value_error(r"a block of num_steps=7 proposals exceeds the DSpark drafter's trained block_size=6: its "
                          r"drafter and confidence head were trained on 6 block positions",
                          lambda: Engine(target, draft, SpecConfig(7)))
    _one_line_value_error(r"DSparkWorker drafts a block verified as a chain: it needs topk=1",
                          lambda: Engine(target, draft, SpecConfig(3, 2, 5)))
    shallow = random_llama(vocab_size=12, hidden_size=32, num_hidden_layers=2, seed=1)
    _one_line_value_error(r"DSpark drafter target_layer_ids \[2\] do not fit the target's 2 layers \(ids -1\.\.0\)",
                          lambda: Engine(shallow, draft, SpecConfig(3)))
    assert draft_kind("dspark").default_spec(draft) == SpecConfig(6)


def test_block_verification_of_a_capped_block_is_refused(tiny):
    """Block verification weighs a chain against a length fixed before the draws; the cap's length depends on them
    (the exact-law sweep finds the pair lossy). Without the cap it verifies the whole block, exactly."""
    target, draft = tiny
    spec = SpecConfig(3, draft_sampling="sample", verify="block")
    draft.confidence_threshold = 0.5
    _one_line_value_error(r"verify='block' is not exact on a chain whose length the drafted tokens decide, as the "
                          r"DSpark confidence cap \(confidence_threshold=0.5\) makes it",
                          lambda: Engine(target, draft, spec))
    draft.confidence_threshold = 0.0
    outs = Engine(target, draft, spec, max_seq_len=32).generate([[1, 2]], SamplingParams(max_new_tokens=6,
                                                                                         temperature=0.9))
    assert len(outs[0].token_ids) == 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("markov", list(MARKOV_PAIRS))
def test_cuda_graph_replay_equals_eager(markov):
    """On a GPU: the capped block captured at its full width and replayed gives eager fast decoding's tokens and
    logprobs (eager on CUDA verifies at the full width too: no narrowing off the CPU)."""
    target = random_llama(vocab_size=12, hidden_size=32, num_hidden_layers=4, seed=11, model_type="qwen3",
                          device="cuda")
    draft = random_dspark(target, 2, 6, target_layer_ids=[-1, 2], mask_token_id=11, seed=5, std=0.5, markov_rank=8,
                          markov_head_type=markov, confidence_threshold=0.5)
    params = [logprob_params(max_new=6 + 5 * i) for i in range(3)]
    eager = Engine(target, draft, SpecConfig(6), impl="fast", max_batch=4, max_seq_len=96, cuda_graphs=False)
    graphed = Engine(target, draft, SpecConfig(6), impl="fast", max_batch=4, max_seq_len=96, cuda_graphs=True)
    assert not eager.worker.trims_verify and graphed.worker.fixed_step_shapes
    for a, b in zip(graphed.generate(PROMPTS, params), eager.generate(PROMPTS, params)):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-4
