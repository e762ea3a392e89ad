"""DFlash block drafting: one drafter forward per step proposes a block, the target verifies it as a chain. Lossless
against target-only decoding (greedy tokens and logprobs, the exact distribution when sampling, penalties, logit
bias, min_new_tokens, grammars with masked drafts, ragged batches, the fixed-shape step through padded static
buffers, the fast path), its proposals equal z-lab's forward written out from the raw tensors over the committed
sequence at every step (alignment), no host sync in a step, and the zoo's drafters load and are accepted."""
from collections import Counter

import pytest
import torch

import reference
from specdec.lab import target_law
from specdec import Engine, SamplingParams, SpecConfig, zoo
from specdec.draft_kinds import kind_of
from specdec.cli.generate import load_draft
from specdec.models import random_llama
from specdec.models.dflash import DFlashDraftModel, random_dflash
from specdec.workers.dflash import DFlashWorker
from specdec.workers.graphs import DecodeGraphs
from specdec.zoo import corpus
from tests.helpers.equivalence import no_host_sync
from tests.helpers import (FALSE_FAILURE_RATE, assert_same_as_baseline, chi_square_pvalue,
                           logprob_params, near_bigram_target)
from tests.helpers.oracles import dflash_logits_from_tensors


@pytest.fixture(scope="module")
def tiny():
    """A 4-layer target of 12 tokens (small enough that a random drafter's proposals are sometimes accepted) and a
    random 2-layer drafter of block 6 reading the outputs of target layers 0 and 2."""
    target = random_llama(vocab_size=12, hidden_size=32, num_hidden_layers=4, seed=11)
    return target, random_dflash(target, 2, 6, target_layer_ids=[0, 2], mask_token_id=11, seed=5)


PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 3], [4, 4, 10, 2, 6]]


def record_drafts(w) -> list:
    """Wraps the worker's draft() so that each call appends (slots, committed lengths, candidates) to the list
    returned."""
    seen, inner = [], w.draft

    def recording():
        out = inner()
        seen.append((list(w.slot_list), w.state.seq_lens.tolist(), out.candidates.tolist()))
        return out

    w.draft = recording
    return seen

@pytest.mark.parametrize("spec", [SpecConfig(1), SpecConfig(3), SpecConfig(5)], ids=str)
def test_greedy_identical_with_logprobs_on_a_ragged_batch(tiny, spec):
    target, draft = tiny
    base = Engine(target, max_seq_len=64).generate(PROMPTS, logprob_params(24))
    engine = Engine(target, draft=draft, spec=spec, max_seq_len=64)
    assert type(engine.worker) is DFlashWorker
    assert_same_as_baseline(engine.generate(PROMPTS, logprob_params(24)), base)


def test_each_block_is_zlabs_forward_over_the_committed_sequence(small):
    """At every step, for every request of a ragged batch, the block the worker proposes is the argmax of z-lab's
    forward written out from the raw tensors over the target features of the committed tokens and the block
    [root, mask...]: the context's positions, features and commits line up (a misaligned context only costs
    acceptance, which losslessness never shows). The zoo's drafter, so that most blocks are partly accepted."""
    target, draft = small.target, small.dflash
    prompts = [list(small.tokenizer.encode(s)) for s in ("import os\nimport sys\n\n\ndef main", "class A:\n    def ",
                                                          "    return self.")]
    engine = Engine(target, draft=draft, spec=SpecConfig(5), max_seq_len=96)
    seen = record_drafts(engine.worker)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=24))
    cfg, sd = draft.checkpoint()
    request_of = {slot: i for i, slot in enumerate(seen[0][0])}
    checked = 0
    for slots, lens, candidates in seen:
        for slot, n, cand in zip(slots, lens, candidates):
            seq = prompts[request_of[slot]] + outs[request_of[slot]].token_ids
            with torch.no_grad():
                feats = target(torch.tensor([seq[:n]]), torch.arange(n)[None], features=draft.feature_layers).features
            logits = dflash_logits_from_tensors(sd, cfg, target.model.embed_tokens.weight, target.lm_head.weight,
                                                feats[0], [seq[n]] + [draft.mask_token_id] * 5)
            assert cand == [seq[n]] + logits[1:].argmax(-1).tolist()
            checked += 1
    assert checked > 10 and any(a > 2 for o in outs for a in o.accept_lens)


def test_the_fixed_shape_step_through_padded_static_buffers(tiny):
    """The step the CUDA graphs replay, run eagerly through their static buffers: three requests padded to a
    bucket of four, then two, then one as they finish."""
    target, draft = tiny
    base = Engine(target, max_seq_len=64).generate(PROMPTS, logprob_params(18))
    engine = Engine(target, draft=draft, spec=SpecConfig(4), max_seq_len=64)
    engine._decode = DecodeGraphs(engine.worker, capture=False).decode_step
    params = [logprob_params(18), logprob_params(9), logprob_params(14)]
    outs = engine.generate(PROMPTS, params)
    assert_same_as_baseline(outs, [Engine(target, max_seq_len=64).generate([p], q)[0]
                                   for p, q in zip(PROMPTS, params)])
    assert outs[0].token_ids == base[0].token_ids


def test_a_decode_step_makes_no_host_sync(tiny):
    target, draft = tiny
    w = DFlashWorker(target, draft, SpecConfig(3), reference, max_batch=2, max_seq_len=64)
    params = [logprob_params(temperature=0.7, top_k=5, top_p=0.9), SamplingParams(max_new_tokens=14)]
    w.prefill([[1, 2, 3], [4, 5]], params, seed=0)
    for _ in range(2):
        with no_host_sync():
            step = w.decode_step()
    assert step.accept_lens.shape == (2,)
    meta_target = near_bigram_target(seed=3, mix=0.3).to("meta")
    meta_draft = random_dflash(near_bigram_target(seed=3, mix=0.3), 1, 4, target_layer_ids=[0], mask_token_id=1)
    meta_draft._target = (meta_target,)
    w = DFlashWorker(meta_target, meta_draft.to("meta"), SpecConfig(3), reference, max_batch=2, max_seq_len=64)
    with torch.inference_mode():
        w.prefill([[1, 2, 3], [4, 5]], params, seed=0)
        step = w.decode_step()
    assert step.predict.device.type == "meta"


def test_the_fast_path_is_identical(tiny):
    target, draft = tiny
    prompts = [[1, 2, 3], [8, 9]]
    base = Engine(target, max_seq_len=24).generate(prompts, logprob_params(5))
    outs = Engine(target, draft=draft, spec=SpecConfig(2), impl="fast", max_seq_len=24).generate(
        prompts, logprob_params(5))
    assert_same_as_baseline(outs, base)


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_a_context_layer_listed_twice(tiny, impl):
    """z-lab's default ids for two draft layers on a 4-layer target are [1, 1]: every block the worker proposes is
    the raw-tensor forward over layer 1's output concatenated with itself, and decoding stays lossless."""
    target = tiny[0]
    draft = random_dflash(target, 2, 4, target_layer_ids=[1, 1], mask_token_id=11, seed=6)
    prompts = [[1, 2, 3], [8, 9]]
    base = Engine(target, max_seq_len=24).generate(prompts, logprob_params(5))
    engine = Engine(target, draft=draft, spec=SpecConfig(3), impl=impl, max_seq_len=24)
    seen = record_drafts(engine.worker)
    outs = engine.generate(prompts, logprob_params(5))
    assert_same_as_baseline(outs, base)
    cfg, sd = draft.checkpoint()
    request_of = {slot: i for i, slot in enumerate(seen[0][0])}
    for slots, lens, candidates in seen:
        for slot, n, cand in zip(slots, lens, candidates):
            seq = prompts[request_of[slot]] + outs[request_of[slot]].token_ids
            with torch.no_grad():
                layer1 = target(torch.tensor([seq[:n]]), torch.arange(n)[None], features=(2,)).features[0]
            logits = dflash_logits_from_tensors(sd, cfg, target.model.embed_tokens.weight, target.lm_head.weight,
                                                torch.cat([layer1, layer1], dim=-1), [seq[n]] + [11] * 3)
            assert cand == [seq[n]] + logits[1:].argmax(-1).tolist()


@pytest.mark.parametrize("spec", [SpecConfig(2), SpecConfig(3)], ids=str)
def test_sampling_is_the_exact_distribution(spec):
    V, N = 6, 3000
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3)
    draft = random_dflash(target, 1, 4, target_layer_ids=[0], mask_token_id=5, seed=4)
    exact = target_law(target, [1, 2], 3, SamplingParams(temperature=0.8))
    outs = Engine(target, draft=draft, spec=spec, max_batch=N, max_seq_len=16).generate(
        [[1, 2]] * N, SamplingParams(max_new_tokens=3, temperature=0.8), seed=5)
    assert any(a > 1 for o in outs for a in o.accept_lens)  # drafts were accepted: verify decided the law
    assert chi_square_pvalue(Counter(tuple(o.token_ids) for o in outs), exact) > FALSE_FAILURE_RATE


# ---- the zoo's drafters -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def held_out():
    return [[int(t) for t in w[:n]] for w, n in zip(corpus.heldout_windows(3, 100, seed=5), (100, 61, 33))]


def test_the_zoo_drafter_loads_and_is_accepted(small, held_out):
    draft = small.dflash
    assert isinstance(draft, DFlashDraftModel) and kind_of(draft).name == "dflash" and draft.block_size == 8
    loaded, spec = load_draft(small.target, small.path / "target", small.path / "dflash", "auto")
    assert isinstance(loaded, DFlashDraftModel) and spec == SpecConfig(7)
    base = Engine(small.target, max_seq_len=256).generate(held_out, logprob_params(40))
    engine = Engine(small.target, draft=draft, spec=spec, max_seq_len=256)
    assert_same_as_baseline(engine.generate(held_out, logprob_params(40)), base)
    assert engine.last_stats.mean_accept_len > 2.0


def test_penalties_grammars_and_a_ragged_batch(small, held_out):
    tok = small.tokenizer
    params = [SamplingParams(max_new_tokens=24, frequency_penalty=0.8, presence_penalty=0.4, return_logprob=True),
              SamplingParams(max_new_tokens=16, regex=r"(def|class) [A-Za-z_]+", stop_token_ids=[32]),
              SamplingParams(max_new_tokens=20, repetition_penalty=1.4, min_new_tokens=5, stop_token_ids=[10],
                             logit_bias={101: -3.0, 32: 1.5}),
              SamplingParams(max_new_tokens=10, temperature=0.8)]
    batch = [held_out[0], tok.encode("import os\n\n"), held_out[2], held_out[1]]
    spec = SpecConfig(5, draft_penalties=True, draft_grammar=True)
    outs = Engine(small.target, draft=small.dflash, spec=spec, max_seq_len=256, tokenizer=tok).generate(batch, params)
    alone = Engine(small.target, max_seq_len=256, tokenizer=tok)
    for i in range(3):
        assert_same_as_baseline([outs[i]], [alone.generate([batch[i]], params[i])[0]])
    assert tok.decode(outs[1].token_ids) == "class "
    assert len(outs[2].token_ids) >= 5 and 10 not in outs[2].token_ids[:4]


@pytest.mark.slow
def test_the_deep_pairs_drafter_is_greedy_identical(held_out):
    deep = zoo.load(zoo.DEEP_NAME)
    base = Engine(deep.target, max_seq_len=256).generate(held_out, logprob_params(32))
    for impl in ("reference", "fast"):
        outs = Engine(deep.target, draft=deep.dflash, spec=SpecConfig(7), impl=impl, max_seq_len=256).generate(
            held_out, logprob_params(32))
        assert_same_as_baseline(outs, base)
