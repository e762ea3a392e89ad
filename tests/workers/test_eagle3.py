"""EAGLE-3 heads in EagleWorkerV2: target features from several layers, a reduced draft vocabulary."""
from collections import Counter

import pytest
import torch

from specdec import Engine, SamplingParams, SpecConfig
from specdec.models import Eagle3DraftHead, random_eagle3_head
from specdec.models.eagle3 import default_feature_layers
from tests.helpers import (FALSE_FAILURE_RATE, LOGPROB_ATOL, assert_same_as_baseline, chi_square_pvalue,
                           near_bigram_target, sampled_sequences_pvalue)
from specdec.lab import target_law

#: Every optional norm of an EAGLE-3 head switched on (off is the default).
ALL_NORMS = {"norm_before_fc": True, "fc_norm": True, "norm_output": True}


def test_the_target_returns_the_residual_streams_entering_the_asked_layers():
    """Features = the input of each asked layer (SGLang's capture points), checked with forward hooks."""
    target = near_bigram_target(seed=1, num_hidden_layers=4)
    seen = {}
    hooks = [layer.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(i, args[0]))
             for i, layer in enumerate(target.model.layers)]
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = target(ids, torch.arange(5).expand(2, 5), features=(2, 1, 0))
        plain = target(ids, torch.arange(5).expand(2, 5))
    for h in hooks:
        h.remove()
    assert torch.equal(out.features, torch.cat([seen[2], seen[1], seen[0]], -1)) and plain.features is None
    assert torch.equal(out.logits, plain.logits) and torch.equal(out.hidden, plain.hidden)
    assert default_feature_layers(32) == [2, 16, 29]


@pytest.mark.parametrize("spec, draft_vocab, norms", [
    (spec, vocab, {}) for spec in (SpecConfig(3, 1), SpecConfig(3, 4, 10), SpecConfig(2, 2, 4)) for vocab in (64, 23)
] + [(SpecConfig(3, 4, 10), 23, ALL_NORMS), (SpecConfig(3, 1), 64, ALL_NORMS)])
def test_eagle3_greedy_is_lossless(spec, draft_vocab, norms):
    target = near_bigram_target(seed=3, mix=0.4, num_hidden_layers=4)
    head = random_eagle3_head(target, draft_vocab_size=draft_vocab, seed=1, **norms)
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
    params = SamplingParams(max_new_tokens=n_tokens, temperature=temperature, top_k=top_k)
    engine = Engine(target, head, spec, impl="reference", max_batch=N, max_seq_len=12)
    outs = engine.generate([prompt] * N, params, seed=2025)
    counts = Counter(tuple(o.token_ids) for o in outs)
    assert any(a > 1 for o in outs for a in o.accept_lens)  # speculation accepted something
    assert chi_square_pvalue(counts, target_law(target, prompt, n_tokens, params)) > FALSE_FAILURE_RATE


@pytest.mark.parametrize("norms", [{}, ALL_NORMS])
def test_eagle3_checkpoints_in_sglang_layout_round_trip(tmp_path, norms):
    import json

    from safetensors.torch import load_file
    target = near_bigram_target(seed=3, num_hidden_layers=4)
    head = random_eagle3_head(target, draft_vocab_size=23, seed=1, feature_layers=[1, 2, 4], **norms)
    head.save_pretrained(tmp_path)
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert {"fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
            "midlayer.self_attn.q_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= keys
    assert ({"input_norm.weight", "fc_norm.0.weight", "fc_norm.2.weight"} <= keys) == bool(norms)
    config = json.loads((tmp_path / "config.json").read_text())
    assert all(config[k] == bool(norms) for k in ALL_NORMS)
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


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_the_feature_norms_and_norm_output_compute_as_specified():
    """norm_before_fc: one RMSNorm over the concatenated features; fc_norm: one per feature; norm_output: the
    returned hidden is the final-normed one and the LM head reads it as it is. Checked against the midlayer
    run on a hand-normed, hand-projected input."""
    target = near_bigram_target(seed=3, num_hidden_layers=4)
    head = random_eagle3_head(target, draft_vocab_size=23, seed=1, feature_layers=[1, 3, 4], **ALL_NORMS)
    plain = random_eagle3_head(target, draft_vocab_size=23, seed=1, feature_layers=[1, 3, 4])
    eps = head.config.rms_norm_eps
    with torch.no_grad():
        for p in (head.input_norm.weight, *[n.weight for n in head.fc_norm]):
            p.uniform_(0.5, 1.5)
        ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
        pos = torch.arange(6).expand(2, 6)
        feats = target(ids, pos, features=head.feature_layers).features
        logits, hidden, _ = head(ids, feats, pos)
        x = _rms(feats, head.input_norm.weight, eps)
        x = torch.cat([_rms(c, n.weight, eps) for c, n in zip(x.chunk(3, -1), head.fc_norm)], -1)
        plain.load_state_dict({k: v for k, v in head.state_dict().items() if k in plain.state_dict()})
        pre_norm = plain(ids, head.fc(x), pos).hidden  # the plain head skips fc on an H-wide input
        want_hidden = _rms(pre_norm, head.norm.weight, eps)
        torch.testing.assert_close(hidden, want_hidden, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits, want_hidden @ head.lm_head.weight.T, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(head.compute_logits(hidden), logits)


def test_an_unimplemented_eagle3_option_is_refused(tmp_path):
    import json
    target = near_bigram_target(seed=3, num_hidden_layers=4)
    random_eagle3_head(target, draft_vocab_size=23, seed=1).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, norm_before_residual=True)))
    with pytest.raises(ValueError, match="norm_before_residual"):
        Eagle3DraftHead.from_pretrained(tmp_path, target)


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


def _rewrite_checkpoint(path, config_update=None, drop_keys=()):
    import json

    from safetensors.torch import load_file, save_file
    if config_update:
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps(config_update(config)))
    sd = load_file(str(path / "model.safetensors"))
    save_file({k: v for k, v in sd.items() if k not in drop_keys}, str(path / "model.safetensors"))


def _decode_both(target, head_a, head_b):
    spec = SpecConfig(3, 2, 6)
    prompts = [[1, 2, 3, 4, 5], [9, 8]]
    sp = SamplingParams(max_new_tokens=16, return_logprob=True)
    base = Engine(target, max_seq_len=64).generate(prompts, sp)
    a = Engine(target, head_a, spec, max_seq_len=64).generate(prompts, sp)
    b = Engine(target, head_b, spec, max_seq_len=64).generate(prompts, sp)
    return base, a, b


def test_an_unsorted_feature_list_is_read_in_layer_order(tmp_path):
    """SafeAILab, SGLang and vLLM append features while walking the layers: a checkpoint listing
    eagle_aux_hidden_state_layer_ids [4, 1, 3] feeds the features of layers 2, 4, 5 in that order. The
    oracle: the same weights saved with the ids ascending drafts the same tokens (same acceptance)."""
    target = near_bigram_target(seed=3, mix=0.4, num_hidden_layers=6)
    head = random_eagle3_head(target, draft_vocab_size=23, seed=1, feature_layers=[2, 4, 5])
    head.save_pretrained(tmp_path)
    ids = lambda c: dict(c, eagle_config={"eagle_aux_hidden_state_layer_ids": [4, 1, 3]})
    _rewrite_checkpoint(tmp_path, ids)
    loaded = Eagle3DraftHead.from_pretrained(tmp_path, target)
    assert loaded.feature_layers == (2, 4, 5)
    base, a, b = _decode_both(target, head, loaded)
    assert [o.accept_lens for o in a] == [o.accept_lens for o in b]
    assert [o.token_ids for o in a] == [o.token_ids for o in b] == [o.token_ids for o in base]
    head.save_pretrained(tmp_path / "again")  # written ascending
    import json
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    assert again["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]


def test_a_repeated_feature_layer_is_refused(tmp_path):
    target = near_bigram_target(seed=3, num_hidden_layers=4)
    random_eagle3_head(target, draft_vocab_size=23, seed=1, feature_layers=[1, 2, 4]).save_pretrained(tmp_path)
    _rewrite_checkpoint(tmp_path, lambda c: dict(c, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 0, 2]}))
    with pytest.raises(ValueError, match=r"feature_layers lists layer\(s\) \[1\] more than once"):
        Eagle3DraftHead.from_pretrained(tmp_path, target)
    with pytest.raises(ValueError, match="more than once"):
        random_eagle3_head(target, feature_layers=[3, 1, 3])


@pytest.mark.parametrize("L", range(1, 65))
def test_the_default_feature_layers_are_distinct_ascending_and_in_range(L):
    layers = default_feature_layers(L)
    assert layers == sorted(set(layers)) and len(layers) == min(3, L) and all(1 <= i <= L for i in layers)
    if L >= 7:  # SafeAILab's rule wherever it gives three distinct layers
        assert layers == [2, L // 2, L - 3]


def test_a_full_vocabulary_checkpoint_without_id_maps_loads_as_the_identity(tmp_path):
    """SafeAILab deletes d2t and t2d when the draft vocabulary is the target's; such a head decodes as the
    same head saved with its (identity) maps, and losslessly."""
    target = near_bigram_target(seed=3, mix=0.4, num_hidden_layers=4)
    head = random_eagle3_head(target, seed=1)  # the whole vocabulary
    assert head.config.draft_vocab_size == target.config.vocab_size
    head.save_pretrained(tmp_path)
    _rewrite_checkpoint(tmp_path, drop_keys=("d2t", "t2d"))
    loaded = Eagle3DraftHead.from_pretrained(tmp_path, target)
    assert torch.equal(loaded.d2t, torch.zeros_like(loaded.d2t)) and bool(loaded.t2d.all())
    base, a, b = _decode_both(target, head, loaded)
    assert [o.accept_lens for o in a] == [o.accept_lens for o in b]
    assert [o.token_ids for o in a] == [o.token_ids for o in b] == [o.token_ids for o in base]
    assert max(abs(x - y) for o, p in zip(b, base) for x, y in zip(o.logprobs, p.logprobs)) <= LOGPROB_ATOL


def test_eagle3_on_the_fast_path_equals_the_reference():
    pytest.importorskip("triton")
    target = near_bigram_target(seed=3, mix=0.4, num_hidden_layers=4)
    head = random_eagle3_head(target, draft_vocab_size=23, seed=1)
    prompts = [[1, 2, 3, 4, 5], [9, 8]]
    sp = SamplingParams(max_new_tokens=8, return_logprob=True)
    ref = Engine(target, head, SpecConfig(2, 2, 4), impl="reference", max_seq_len=32).generate(prompts, sp)
    fast = Engine(target, head, SpecConfig(2, 2, 4), impl="fast", max_seq_len=32).generate(prompts, sp)
    assert_same_as_baseline(fast, ref)


def _cycle_target_and_perfect_eagle3(n=12, V=40, H=16, feature_layers=(1, 2)):
    """A target that continues the cycle c_0 -> c_1 -> ... -> c_{n-1} -> c_0 over the even ids c_k = 2k, and
    an EAGLE-3 head that predicts it exactly at every depth, through its features, its MLP and its d2t map.

    Target: every residual branch zeroed (o_proj = down_proj = 0), so each layer's input is the token's
    embedding e(c_k) = onehot(k); its LM head scores c_{k+1} from onehot(k). Head: fc reads the first feature
    chunk (onehot(k)); attention is off (o_proj = 0); the MLP adds onehot(k+1) - onehot(k), so each draft step
    advances the state by one; its LM head, over the even ids, reads state onehot(m) as c_{m+1}."""
    from specdec.models import random_llama

    target = random_llama(vocab_size=V, hidden_size=H, intermediate_size=24, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, seed=5)
    eye = torch.eye(H)
    shift = torch.zeros(H, H)  # onehot(k) -> onehot(k + 1 mod n)
    shift[:n, :n] = torch.roll(torch.eye(n), 1, dims=0)
    sd = target.state_dict()
    for k in sd:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            sd[k] = torch.zeros_like(sd[k])
        elif k.endswith("norm.weight"):
            sd[k] = torch.ones_like(sd[k])
    embed = torch.zeros(V, H)
    embed[torch.arange(n) * 2, torch.arange(n)] = 1.0
    lm = torch.zeros(V, H)
    lm[((torch.arange(n) + 1) % n) * 2, torch.arange(n)] = 1.0
    sd["model.embed_tokens.weight"], sd["lm_head.weight"] = embed, lm
    target.load_state_dict(sd)

    vocab = torch.arange(0, V, 2)
    head = random_eagle3_head(target, draft_vocab_size=len(vocab), feature_layers=list(feature_layers), seed=1)
    head.set_draft_vocabulary(vocab)
    hs = head.state_dict()
    F = len(feature_layers)
    hs["fc.weight"] = torch.cat([eye] + [torch.zeros(H, H)] * (F - 1), 1)
    hs["midlayer.self_attn.o_proj.weight"] = torch.zeros(H, H)
    for k in ("midlayer.post_attention_layernorm.weight", "norm.weight"):
        hs[k] = torch.ones(H)
    s = (1 / H + head.config.rms_norm_eps) ** -0.5  # RMSNorm of onehot(k): s * onehot(k)
    inter = hs["midlayer.mlp.gate_proj.weight"].shape[0]
    gain = 4.0
    gate, up = torch.zeros(inter, H), torch.zeros(inter, H)
    gate[:H, :H], up[:H, :H] = gain * eye, eye
    act = torch.nn.functional.silu(torch.tensor(gain * s)) * s  # the MLP's hidden value on the active unit
    down = torch.zeros(H, inter)
    down[:, :H] = (shift - eye) / act
    hs["midlayer.mlp.gate_proj.weight"], hs["midlayer.mlp.up_proj.weight"] = gate, up
    hs["midlayer.mlp.down_proj.weight"] = down
    lm_d = torch.zeros(len(vocab), H)  # draft id m + 1 (target c_{m+1}) reads state onehot(m)
    lm_d[(torch.arange(n) + 1) % n, torch.arange(n)] = 1.0
    hs["lm_head.weight"] = lm_d
    head.load_state_dict(hs)
    return target, head, n


@pytest.mark.parametrize("spec", [SpecConfig(1, 1), SpecConfig(3, 1), SpecConfig(5, 1), SpecConfig(4, 4, 16)])
def test_a_perfect_eagle3_draft_accepts_every_drafted_token(spec):
    """Built so that its mapped argmax equals the target's at every depth: every step accepts S + 1 (K = 1: the
    chain; K = 4: the tree holds the chain as each node's top child), and the tokens are target-only's."""
    target, head, n = _cycle_target_and_perfect_eagle3()
    prompts = [[0, 2, 4], [10], [6, 8, 10, 12, 14]]
    sp = SamplingParams(max_new_tokens=31, return_logprob=True)
    base = Engine(target, max_seq_len=64).generate(prompts, sp)
    for p, b in zip(prompts, base):  # the target continues the cycle
        assert b.token_ids == [(p[-1] + 2 * (i + 1)) % (2 * n) for i in range(31)]
    outs = Engine(target, head, spec, impl="reference", max_seq_len=64).generate(prompts, sp)
    assert_same_as_baseline(outs, base)
    for o in outs:
        assert o.accept_lens == [spec.num_steps + 1] * len(o.accept_lens), o.accept_lens


# ---- the zoo's trained EAGLE-3 head --------------------------------------------------------------
@pytest.fixture(scope="module")
def zoo_bundle():
    from specdec import zoo
    b = zoo.load("stdlib-byte-6l")
    if b.eagle3 is None:
        pytest.fail("the shipped checkpoint has no eagle3 head")
    return b


@pytest.mark.parametrize("spec", [SpecConfig(5, 4, 16), SpecConfig(3, 1, 4)])
def test_the_trained_eagle3_head_is_lossless_and_speculates(zoo_bundle, spec):
    from specdec.zoo.corpus import heldout_prompts
    prompts = heldout_prompts(3, 64, seed=11)
    sp = SamplingParams(max_new_tokens=40, return_logprob=True, top_logprobs_num=2)
    base = Engine(zoo_bundle.target, max_seq_len=160).generate(prompts, sp)
    outs = Engine(zoo_bundle.target, zoo_bundle.eagle3, spec, impl="reference", max_seq_len=160).generate(prompts, sp)
    assert_same_as_baseline(outs, base)
    acc = [a for o in outs for a in o.accept_lens]
    assert sum(acc) / len(acc) > 2.0  # a trained head: an untrained one accepts about 1 per step


# CI keeps the tree at 1200 draws (a batch of 3000 costs five times as much: its attention outgrows the cache); the
# chain (whose verify is EagleWorkerV2's, tested for its law in test_workers' sampling cases) and 3000 draws run with
# -m slow
@pytest.mark.parametrize("spec, N", [pytest.param(SpecConfig(2, 1), 3000, marks=pytest.mark.slow),
                                     pytest.param(SpecConfig(2, 4, 6), 3000, marks=pytest.mark.slow),
                                     (SpecConfig(2, 4, 6), 1200)])
def test_the_trained_eagle3_head_samples_the_targets_distribution(zoo_bundle, spec, N):
    prompt = list(b"    def __init__(self, ")
    n_tokens, temperature = 3, 1.0
    exact = target_law(zoo_bundle.target, prompt, n_tokens, SamplingParams(temperature=temperature), floor=1e-5)
    engine = Engine(zoo_bundle.target, zoo_bundle.eagle3, spec, impl="reference", max_batch=N, max_seq_len=40)
    outs = engine.generate([prompt] * N, SamplingParams(max_new_tokens=n_tokens, temperature=temperature), seed=7)
    assert sum(a for o in outs for a in o.accept_lens) > 1.3 * sum(len(o.accept_lens) for o in outs)
    assert sampled_sequences_pvalue(outs, exact) > FALSE_FAILURE_RATE
