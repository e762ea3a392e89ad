"""EAGLE-3 heads in EagleWorkerV2: target features from several layers, a reduced draft vocabulary."""
import pytest
import torch

from specdec import Engine, SamplingParams, SpecConfig
from specdec.models import Eagle3DraftHead, random_eagle3_head
from specdec.models.eagle3 import default_feature_layers
from tests.helpers import FALSE_FAILURE_RATE, LOGPROB_ATOL, chi_square_pvalue, near_bigram_target
from tests.test_workers import _exact_joint, assert_same_as_baseline


def test_the_target_returns_the_residual_streams_entering_the_asked_layers():
    """Features = the input of each asked layer (SGLang's capture points), checked with forward hooks."""
    target = near_bigram_target(seed=1, num_hidden_layers=4)
    seen = {}
    hooks = [layer.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(i, args[0]))
             for i, layer in enumerate(target.model.layers)]
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, hidden, feats = target(ids, torch.arange(5).expand(2, 5), features=(2, 1, 0))
        plain_logits, plain_hidden = target(ids, torch.arange(5).expand(2, 5))
    for h in hooks:
        h.remove()
    assert torch.equal(feats, torch.cat([seen[2], seen[1], seen[0]], -1))
    assert torch.equal(logits, plain_logits) and torch.equal(hidden, plain_hidden)
    assert default_feature_layers(32) == [2, 16, 29]


@pytest.mark.parametrize("spec", [SpecConfig(3, 1), SpecConfig(3, 4, 10), SpecConfig(2, 2, 4)])
@pytest.mark.parametrize("draft_vocab", [64, 23])
def test_eagle3_greedy_is_lossless(spec, draft_vocab):
    target = near_bigram_target(seed=3, mix=0.4, num_hidden_layers=4)
    head = random_eagle3_head(target, draft_vocab_size=draft_vocab, seed=1)
    prompts = [[1, 2, 3, 4, 5], [9, 8], [7] * 11]
    sp = SamplingParams(max_new_tokens=20, return_logprob=True, top_logprobs_num=2)
    base = Engine(target, max_seq_len=64).generate(prompts, sp)
    outs = Engine(target, head, spec, impl="reference", max_seq_len=64).generate(prompts, sp)
    assert_same_as_baseline(outs, base)


def test_eagle3_proposes_only_ids_its_vocabulary_maps_to():
    """Top-K is taken over draft ids and mapped through d2t: no proposal lies outside t2d, even when the
    head's best draft logits belong to ids whose targets the rest of the vocabulary would prefer."""
    target = near_bigram_target(seed=3, mix=0.4, num_hidden_layers=4)
    head = random_eagle3_head(target, draft_vocab_size=17, seed=2)
    engine = Engine(target, head, SpecConfig(3, 4, 12), impl="reference", max_seq_len=64)
    w = engine.worker
    w.prefill([[1, 2, 3, 4, 5], [6]], [SamplingParams(max_new_tokens=30)] * 2, seed=0)
    allowed = set(torch.nonzero(head.t2d).flatten().tolist())
    assert len(allowed) == 17
    for _ in range(4):
        _, token_list, _ = w.draft_forward()
        proposed = set(torch.cat([t.flatten() for t in token_list]).tolist())
        assert proposed <= allowed, proposed - allowed
        assert set(w.state.topk_index.flatten().tolist()) <= allowed
        w.decode_step()


@pytest.mark.parametrize("spec, temperature, top_k", [(SpecConfig(2, 1), 1.0, -1), (SpecConfig(2, 4, 7), 0.8, 3)])
def test_eagle3_sampling_follows_the_target_distribution(spec, temperature, top_k):
    V = 6
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3,
                                num_hidden_layers=3)
    head = random_eagle3_head(target, draft_vocab_size=5, seed=4, std=1.0)
    prompt, n_tokens, N = [1, 2], 3, 5000
    exact = _exact_joint(target, prompt, n_tokens, temperature, top_k, 1.0)
    engine = Engine(target, head, spec, impl="reference", max_batch=N, max_seq_len=12)
    outs = engine.generate([prompt] * N, SamplingParams(max_new_tokens=n_tokens, temperature=temperature,
                                                        top_k=top_k), seed=2025)
    counts = dict.fromkeys(exact, 0)
    for o in outs:
        counts[tuple(o.token_ids)] += 1
    assert any(a > 1 for o in outs for a in o.accept_lens)  # speculation accepted something
    cells = list(exact)
    assert chi_square_pvalue([counts[c] for c in cells], [exact[c] for c in cells]) > FALSE_FAILURE_RATE


def test_eagle3_checkpoints_in_sglang_layout_round_trip(tmp_path):
    from safetensors.torch import load_file
    target = near_bigram_target(seed=3, num_hidden_layers=4)
    head = random_eagle3_head(target, draft_vocab_size=23, seed=1, feature_layers=[1, 2, 4])
    head.save_pretrained(tmp_path)
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert {"fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
            "midlayer.self_attn.q_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= keys
    loaded = Eagle3DraftHead.from_pretrained(tmp_path, target)
    assert loaded.feature_layers == (1, 2, 4)  # saved as SGLang's layer-output ids [0, 1, 3]
    for (k, a), (k2, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    prompts = [[1, 2, 3], [4]]
    sp = SamplingParams(max_new_tokens=12, return_logprob=True)
    a = Engine(target, head, SpecConfig(3, 2, 6), max_seq_len=48).generate(prompts, sp)
    b = Engine(target, loaded, SpecConfig(3, 2, 6), max_seq_len=48).generate(prompts, sp)
    assert [o.token_ids for o in a] == [o.token_ids for o in b] and [o.accept_lens for o in a] == [o.accept_lens
                                                                                                for o in b]
    assert max(abs(x - y) for o, p in zip(a, b) for x, y in zip(o.logprobs, p.logprobs)) <= LOGPROB_ATOL


@pytest.mark.parametrize("break_it, match", [
    (lambda sd: sd.pop("d2t"), "has no 'd2t'"),
    (lambda sd: sd.update(d2t=torch.zeros(5, dtype=torch.int64)), r"'d2t' has shape \(5,\), expected \(23,\)"),
    (lambda sd: sd.pop("midlayer.hidden_norm.weight"), "midlayer.hidden_norm.weight"),
])
def test_a_broken_eagle3_checkpoint_names_the_key(tmp_path, break_it, match):
    from safetensors.torch import load_file, save_file
    target = near_bigram_target(seed=3, num_hidden_layers=4)
    random_eagle3_head(target, draft_vocab_size=23, seed=1).save_pretrained(tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    sd.pop("t2d")  # SGLang's loader skips it; ours rebuilds it from d2t
    break_it(sd)
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=match):
        Eagle3DraftHead.from_pretrained(tmp_path, target)


def test_eagle3_on_the_fast_path_equals_the_reference():
    pytest.importorskip("triton")
    target = near_bigram_target(seed=3, mix=0.4, num_hidden_layers=4)
    head = random_eagle3_head(target, draft_vocab_size=23, seed=1)
    prompts = [[1, 2, 3, 4, 5], [9, 8]]
    sp = SamplingParams(max_new_tokens=8, return_logprob=True)
    ref = Engine(target, head, SpecConfig(2, 2, 4), impl="reference", max_seq_len=32).generate(prompts, sp)
    fast = Engine(target, head, SpecConfig(2, 2, 4), impl="fast", max_seq_len=32).generate(prompts, sp)
    assert_same_as_baseline(fast, ref)
