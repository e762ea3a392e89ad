"""The DSpark drafter against DeepSeek's own code (deepseek-ai/DeepSpec, MIT): a checkpoint this package writes is
loaded by DeepSpec's `Qwen3DSparkModel` (transformers), and on a random Qwen3 target (each Markov head type) every
block the worker proposes while decoding a ragged batch, its Markov-refined logits, confidence logits and confident
length equal what DeepSpec's evaluator (`forward_dspark_draft_block`, `build_dspark_proposal`) computes over the same
committed sequence.

DeepSpec is not a dependency: the tests import it from the checkout `SPECDEC_DEEPSPEC_DIR` names
(`scripts/fetch_deepspec.sh` makes one) and are skipped, with the reason, without one or where it does not import
(it needs transformers and, on a CPU, nothing else)."""
import os
import sys

import pytest
import torch

from specdec import Engine, SamplingParams, SpecConfig
from specdec.models import random_llama
from specdec.models.dspark import random_dspark
from tests.helpers.dspark import block_through_cache

CHECKOUT = os.environ.get("SPECDEC_DEEPSPEC_DIR")


@pytest.fixture(scope="module")
def deepspec():
    """DeepSpec's DSpark model class and evaluator ops, imported from the checkout."""
    if not CHECKOUT:
        pytest.skip("SPECDEC_DEEPSPEC_DIR is not set (a checkout of deepseek-ai/DeepSpec: scripts/fetch_deepspec.sh)")
    sys.path.insert(0, CHECKOUT)
    try:
        from deepspec.eval.dspark.draft_ops import build_dspark_proposal, forward_dspark_draft_block
        from deepspec.modeling.dspark.qwen3.modeling import Qwen3DSparkModel
        from transformers import DynamicCache
    except Exception as e:  # any import failure of a third-party checkout is a reason to skip, stated
        pytest.skip(f"DeepSpec from {CHECKOUT} does not import here: {type(e).__name__}: {e}")
    finally:
        sys.path.remove(CHECKOUT)
    return Qwen3DSparkModel, forward_dspark_draft_block, build_dspark_proposal, DynamicCache


@pytest.fixture(scope="module", params=["vanilla", "gated", "rnn"])
def pair(tmp_path_factory, deepspec, request):
    """A random Qwen3 target, a random DSpark drafter of block 5 (context from the embedding output and target
    layer 2, a Markov head of each type, a confidence head with the Markov embedding) saved, and DeepSpec's model of
    the same checkpoint."""
    target = random_llama(vocab_size=40, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, seed=3, model_type="qwen3")
    draft = random_dspark(target, 2, 5, target_layer_ids=[-1, 2], mask_token_id=39, seed=4, markov_rank=8,
                          markov_head_type=request.param, std=0.4, confidence_threshold=0.5)
    path = tmp_path_factory.mktemp("dspark")
    draft.save_pretrained(path)
    theirs = deepspec[0].from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    return target, draft, theirs


def deepspec_block(deepspec, theirs, feats, root: int, S: int, threshold: float):
    """DeepSpec's evaluator on one committed sequence -> (verify ids [root, d_1..d_c], refined logits (S, V),
    confidence logits (S,))."""
    _, forward_block, build_proposal, DynamicCache = deepspec

    class FreshCache(DynamicCache):
        """A new cache per block: DeepSpec's crop back to the context after the block (written for transformers
        4's `crop`, which transformers 5 reads otherwise) has nothing to keep, and the block is computed before it."""

        def crop(self, max_length):
            pass

    Tc = feats.shape[1]
    ids = torch.full((1, S), theirs.mask_token_id, dtype=torch.long)
    ids[0, 0] = root
    with torch.no_grad():
        hidden = forward_block(theirs, draft_input_ids=ids, position_ids=torch.arange(Tc + S)[None],
                               past_key_values_draft=FreshCache(), target_hidden_states=feats, start=Tc,
                               block_size=S)
        proposal = build_proposal(theirs, draft_input_ids=ids, block_hidden=hidden, block_size=S, temperature=0.0,
                                  confidence_threshold=threshold)
        _, refined = theirs.sample_draft_tokens(theirs.compute_logits(hidden), first_prev_token_ids=ids[:, 0],
                                                temperature=0.0, hidden_states=hidden)
        tokens = torch.cat([ids[:, :1], refined.argmax(-1)[:, :-1]], dim=1)
        confidence = theirs.predict_confidence_step(hidden, prev_token_ids=tokens)
    return proposal.verify_input_ids[0].tolist(), refined[0], confidence[0]


def test_every_block_of_a_ragged_greedy_batch_is_deepspecs(deepspec, pair):
    target, draft, theirs = pair
    prompts = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 3], [4, 4, 10, 2, 6, 30, 31, 12, 1]]
    engine = Engine(target, draft=draft, spec=SpecConfig(5), max_seq_len=64)
    w, seen, inner = engine.worker, [], engine.worker.draft

    def recording():
        tree = inner()
        seen.append((list(w.slot_list), w.state.seq_lens.tolist(), w._confident_lengths.tolist()))
        return tree

    w.draft = recording
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=10))
    base = Engine(target, max_seq_len=64).generate(prompts, SamplingParams(max_new_tokens=10))
    assert [o.token_ids for o in outs] == [b.token_ids for b in base]
    request_of = {slot: i for i, slot in enumerate(seen[0][0])}
    worst, lengths = 0.0, set()
    for slots, lens, confident in seen:
        for slot, n, c in zip(slots, lens, confident):
            seq = prompts[request_of[slot]] + outs[request_of[slot]].token_ids
            with torch.no_grad():
                feats = target(torch.tensor([seq[:n]]), torch.arange(n)[None], features=draft.feature_layers).features
            ours = block_through_cache(draft, feats, seq[n], 5)
            verify, refined, confidence = deepspec_block(deepspec, theirs, feats, seq[n], 5, 0.5)
            assert verify == [seq[n]] + ours[0][:c] and ours[3] == c
            worst = max(worst, float((ours[1] - refined).abs().max()), float((ours[2] - confidence).abs().max()))
            lengths.add(c)
    assert worst < 1e-4, worst
    assert len(lengths) > 1  # the cap varied: the test saw ragged verification
    print(f"{draft.config.markov_head_type} head: largest logit difference from DeepSpec's code: {worst:.2e} over "
          f"{len(seen)} steps")
