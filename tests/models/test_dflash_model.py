"""The DFlash drafter: a checkpoint in z-lab's layout loads; its forward (the worker's cached path and the trainer's
dense path) equals z-lab's computation written out from the raw tensors; the trainer's mask shows each block what
inference shows it; every config layout z-lab publishes loads and proposes what the canonical layout of the same
weights proposes; a drafter that does not fit, or one with sliding-window layers, is a one-line ValueError before
any compute."""
import json
import sys
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

import reference
from specdec import Engine, SpecConfig
from specdec.kv_cache import KVCache
from specdec.models import random_llama
from specdec.models.dflash import DFlashDraftModel, build_target_layer_ids, random_dflash, read_dflash_config
from specdec.models.layers import AttentionMetadata
from specdec.zoo.train.block_stages import dflash_blocks
from tests.helpers.oracles import dflash_logits_from_tensors

H, V, L = 32, 64, 4


@pytest.fixture(scope="module")
def target():
    return random_llama(vocab_size=V, hidden_size=H, num_hidden_layers=L, seed=7)


def zlab_dir(path, target, layers=2, layer_ids=(0, 2), block=4, mask=63, seed=0, drop=None, heads=(4, 2, 8),
             extra=None, layout=None):
    """A checkpoint directory as z-lab's trainer writes one: a Qwen3 config with `block_size`,
    `num_target_layers` and `dflash_config`, tensors under z-lab's names (random) -> (config, tensors), the
    canonical layout. heads: (query heads, KV heads, head_dim); extra: more tensors written beside them; layout:
    a function that rewrites a copy of the config before it is written (the returned config stays canonical)."""
    (Hq, Hkv, D), inter = heads, 48
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H, "vocab_size": V,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": Hq,
           "num_key_value_heads": Hkv, "head_dim": D, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "max_position_embeddings": 128, "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu",
           "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None,
           "layer_types": ["full_attention"] * layers, "block_size": block,
           "num_target_layers": target.config.num_hidden_layers, "torch_dtype": "bfloat16",
           "dflash_config": {"target_layer_ids": list(layer_ids), "mask_token_id": mask}}
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=0.3):
        return torch.randn(*shape, generator=g) * s

    sd = {"fc.weight": r(H, len(layer_ids) * H, s=0.2), "hidden_norm.weight": 1 + r(H, s=0.1),
          "norm.weight": 1 + r(H, s=0.1)}
    for i in range(layers):
        p = f"layers.{i}."
        sd.update({p + "self_attn.q_proj.weight": r(Hq * D, H), p + "self_attn.k_proj.weight": r(Hkv * D, H),
                   p + "self_attn.v_proj.weight": r(Hkv * D, H), p + "self_attn.o_proj.weight": r(H, Hq * D),
                   p + "self_attn.q_norm.weight": 1 + r(D, s=0.1), p + "self_attn.k_norm.weight": 1 + r(D, s=0.1),
                   p + "input_layernorm.weight": 1 + r(H, s=0.1),
                   p + "post_attention_layernorm.weight": 1 + r(H, s=0.1),
                   p + "mlp.gate_proj.weight": r(inter, H), p + "mlp.up_proj.weight": r(inter, H),
                   p + "mlp.down_proj.weight": r(H, inter)})
    if drop:
        sd.pop(drop)
    path.mkdir(parents=True, exist_ok=True)
    written = json.loads(json.dumps(cfg))
    if layout:
        layout(written)
    (path / "config.json").write_text(json.dumps(written))
    save_file(dict(sd, **(extra or {})), str(path / "model.safetensors"))
    return cfg, sd


def _features(target, model, tokens):
    ids = torch.tensor([tokens])
    return target(ids, torch.arange(len(tokens))[None], features=model.feature_layers).features


def _oracle(target, sd, cfg, feats, block):
    return dflash_logits_from_tensors(sd, cfg, target.model.embed_tokens.weight, target.lm_head.weight, feats, block)


def test_zlab_checkpoint_forward_equals_the_raw_tensor_computation(target, tmp_path):
    cfg, sd = zlab_dir(tmp_path, target)
    model = DFlashDraftModel.from_pretrained(tmp_path, target)
    assert model.feature_layers == (1, 3) and model.block_size == 4 and model.mask_token_id == 63
    tokens = [5, 9, 2, 44, 17, 3, 30]
    feats = _features(target, model, tokens)
    Tc = len(tokens)
    block = [11, 63, 63, 63]
    want = _oracle(target, sd, cfg, feats[0], block)
    # the worker's path: the context written into a KV cache, the block as in-flight slots attending to all of it
    cache = KVCache.for_model(model.config, 2, 1, 32, torch.float32, "cpu")
    slots = torch.tensor([0])
    model.write_context(feats, torch.arange(Tc)[None], cache,
                        AttentionMetadata(slots, torch.tensor([0]), attn_len=Tc, ops=reference))
    meta = AttentionMetadata(slots, torch.tensor([Tc]), attn_len=Tc + 4, ops=reference,
                             tree_mask=torch.ones(1, 4, 4, dtype=torch.bool))
    cached = model(torch.tensor([block]), Tc + torch.arange(4)[None], cache, meta).logits[0]
    assert (cached.double() - want).abs().max() < 1e-4
    # the trainer's path: one block, every key visible
    every = torch.ones(1, 4, Tc + 4, dtype=torch.bool)
    dense = model.compute_logits(model.forward_dense(feats, torch.arange(Tc)[None], torch.tensor([block]),
                                                     Tc + torch.arange(4)[None], every))
    assert (dense[0].double() - want).abs().max() < 1e-4
    # a causal block (the mistake a Llama layer's default would make) is a different computation
    causal = torch.cat([torch.ones(4, Tc, dtype=torch.bool), torch.ones(4, 4, dtype=torch.bool).tril()], 1)[None]
    wrong = model.compute_logits(model.forward_dense(feats, torch.arange(Tc)[None], torch.tensor([block]),
                                                     Tc + torch.arange(4)[None], causal))
    assert (wrong[0].double() - want).abs().max() > 1e-3


def test_the_training_mask_shows_each_block_what_inference_shows_it(target):
    """Several blocks in one window (`dflash_blocks`): block m at anchor p sees the context x_0..x_{p-1} and
    itself, exactly one inference step's view."""
    model = random_dflash(target, 2, 4, target_layer_ids=[1, 2], mask_token_id=63, seed=2)
    cfg, sd = model.checkpoint()
    tokens = [5, 9, 2, 44, 17, 3, 30, 8, 12, 40, 1, 7]
    T, bs = len(tokens), 4
    feats = _features(target, model, tokens)
    anchors = torch.tensor([[1, 4, 8]])
    positions, mask = dflash_blocks(T, anchors, bs)
    ids = torch.tensor([tokens]).gather(1, positions)
    ids.view(1, 3, bs)[:, :, 1:] = 63
    got = model.compute_logits(model.forward_dense(feats, torch.arange(T)[None], ids, positions, mask))[0]
    for m, p in enumerate(anchors[0].tolist()):
        want = _oracle(target, sd, cfg, feats[0, :p], [tokens[p]] + [63] * (bs - 1))
        assert (got[m * bs:(m + 1) * bs].double() - want).abs().max() < 1e-4


def test_a_checkpoint_round_trips_in_zlabs_layout(target, tmp_path):
    _, sd = zlab_dir(tmp_path / "z", target)
    model = DFlashDraftModel.from_pretrained(tmp_path / "z", target)
    model.save_pretrained(tmp_path / "again")
    cfg = json.loads((tmp_path / "again" / "config.json").read_text())
    assert cfg["dflash_config"] == {"target_layer_ids": [0, 2], "mask_token_id": 63} and cfg["block_size"] == 4
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["num_target_layers"] == L
    saved = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert set(saved) == set(sd) and all(torch.equal(saved[k], sd[k]) for k in sd)


def test_zlabs_default_context_layers():
    """z-lab's `build_target_layer_ids`: the middle layer for one draft layer, else spread over 1 .. L-3."""
    assert build_target_layer_ids(36, 1) == [18]
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(24, 3) == [1, 11, 21] and build_target_layer_ids(6, 3) == [1, 2, 3]


def _one_line_value_error(match, fn):
    with pytest.raises(ValueError, match=match) as e:
        fn()
    assert "\n" not in str(e.value)


def test_drafters_that_do_not_fit_are_one_line_value_errors(target, tmp_path):
    zlab_dir(tmp_path / "ok", target)
    wide = random_llama(vocab_size=V, hidden_size=48, num_hidden_layers=L, seed=1)
    _one_line_value_error(r"draft hidden_size=32 does not match the target's hidden_size=48",
                          lambda: DFlashDraftModel.from_pretrained(tmp_path / "ok", wide))
    other_vocab = random_llama(vocab_size=80, hidden_size=H, num_hidden_layers=L, seed=1)
    _one_line_value_error(r"draft vocab_size=64 does not match the target's vocab_size=80",
                          lambda: DFlashDraftModel.from_pretrained(tmp_path / "ok", other_vocab))
    deeper = random_llama(vocab_size=V, hidden_size=H, num_hidden_layers=6, seed=1)
    _one_line_value_error(r"num_target_layers=4 does not match the target's num_hidden_layers=6",
                          lambda: DFlashDraftModel.from_pretrained(tmp_path / "ok", deeper))
    zlab_dir(tmp_path / "ids", target, layer_ids=(0, 3))
    _one_line_value_error(r"target_layer_ids \[3\] do not fit the target's 4 layers",
                          lambda: DFlashDraftModel.from_pretrained(tmp_path / "ids", target))
    zlab_dir(tmp_path / "missing", target, drop="layers.1.mlp.down_proj.weight")
    _one_line_value_error(r"missing=\['layers.1.mlp.down_proj.weight'\]",
                          lambda: DFlashDraftModel.from_pretrained(tmp_path / "missing", target))
    draft = DFlashDraftModel.from_pretrained(tmp_path / "ok", target)
    _one_line_value_error(r"block size num_steps\+1=5 exceeds the DFlash drafter's trained block_size=4",
                          lambda: Engine(target, draft, SpecConfig(4)))
    _one_line_value_error(r"needs topk=1 and num_draft_tokens=num_steps\+1=4",
                          lambda: Engine(target, draft, SpecConfig(3, 2, 5)))
    # a drafter made for one target, handed to a shallower one of the same width and vocabulary
    shallow = random_llama(vocab_size=V, hidden_size=H, num_hidden_layers=2, seed=1)
    _one_line_value_error(r"target_layer_ids \[2\] do not fit the target's 2 layers",
                          lambda: Engine(shallow, draft, SpecConfig(3)))


def _two_layers_in_config(cfg):
    cfg.update(num_hidden_layers=2, layer_types=["full_attention"] * 2)


def test_a_tensor_of_a_layer_the_config_lacks_is_a_one_line_value_error(target, tmp_path):
    """Weights of three layers under a config of two (a config written wrongly: the drafter would run without its
    last layer), or one stray tensor of layer 7 under the "model." prefix, name the tensor and the layer count."""
    zlab_dir(tmp_path / "cut", target, layers=3, layout=_two_layers_in_config)
    _one_line_value_error(r"tensor layers\.2\.[a-z_.]+weight is of layer 2, but config\.json has num_hidden_layers=2",
                          lambda: DFlashDraftModel.from_pretrained(tmp_path / "cut", target))
    zlab_dir(tmp_path / "stray", target, extra={"model.layers.7.mlp.up_proj.weight": torch.randn(48, H)})
    _one_line_value_error(r"tensor model\.layers\.7\.mlp\.up_proj\.weight is of layer 7, but config\.json has "
                          r"num_hidden_layers=2", lambda: DFlashDraftModel.from_pretrained(tmp_path / "stray", target))


def test_extras_of_zlabs_checkpoints_load_with_a_warning_naming_them(target, tmp_path):
    """The embedding and LM head z-lab's checkpoints carry (the drafter shares the target's) and a buffer of a layer
    the config has (an old transformers' rotary inv_freq) are skipped with one warning; the weights loaded are the
    checkpoint's own, tensor for tensor."""
    extra = dict(_EXTRA, **{"layers.0.self_attn.rotary_emb.inv_freq": torch.rand(4)})
    cfg, sd = zlab_dir(tmp_path, target, extra=extra)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = DFlashDraftModel.from_pretrained(tmp_path, target)
    notes = [str(w.message) for w in caught]
    assert len(notes) == 1 and "ignoring 3 tensor(s) the DFlash drafter does not use" in notes[0], notes
    assert all(f"'{name}'" in notes[0] for name in extra), notes[0]
    loaded = model.state_dict()
    assert set(loaded) == set(sd) and all(torch.equal(loaded[k], sd[k]) for k in sd)


# ---- every layout z-lab publishes -------------------------------------------------------------------------

TOKENS, BLOCK = [5, 9, 2, 44, 17, 3, 30], [11, 63, 63, 63]


def _context(target, layer_ids, tokens):
    """The context features computed one layer at a time: for each listed id i the output of target layer i (the
    input of layer i + 1), concatenated in the listed order -> (1, T, F * H)."""
    ids, positions = torch.tensor([tokens]), torch.arange(len(tokens))[None]
    with torch.no_grad():
        return torch.cat([target(ids, positions, features=(i + 1,)).features for i in layer_ids], dim=-1)


def _block_logits(model, feats, block):
    """The worker's path: the context written into a KV cache, the block as in-flight slots over it -> (bs, V)."""
    Tc, bs = feats.shape[1], len(block)
    cache = KVCache.for_model(model.config, model.config.num_hidden_layers, 1, 32, torch.float32, "cpu")
    slots = torch.tensor([0])
    model.write_context(feats, torch.arange(Tc)[None], cache,
                        AttentionMetadata(slots, torch.tensor([0]), attn_len=Tc, ops=reference))
    meta = AttentionMetadata(slots, torch.tensor([Tc]), attn_len=Tc + bs, ops=reference,
                             tree_mask=torch.ones(1, bs, bs, dtype=torch.bool))
    return model(torch.tensor([block]), Tc + torch.arange(bs)[None], cache, meta).logits[0]


def _block_size_inside(cfg):
    cfg["dflash_config"]["block_size"] = cfg.pop("block_size")


def _no_target_layer_ids(cfg):
    del cfg["dflash_config"]["target_layer_ids"]


def _no_head_shape(model_type):
    def rewrite(cfg):
        del cfg["head_dim"], cfg["num_key_value_heads"]
        cfg["model_type"] = model_type
    return rewrite


_EXTRA = {"lm_head.weight": torch.randn(V, H), "model.embed_tokens.weight": torch.randn(V, H)}

#: name -> (the canonical checkpoint's arguments, the layout's, what the loaded config must say). Values by hand:
#: transformers' Qwen3Config defaults head_dim to 128 and num_key_value_heads to 32, its LlamaConfig to
#: hidden_size // num_attention_heads (32 // 4) and num_attention_heads; z-lab's rule on a 4-layer target for 2
#: draft layers: start 1, end 4 - 3 = 1, so [1, 1].
LAYOUTS = {
    "block_size in dflash_config": ({}, {"layout": _block_size_inside}, {"block_size": 4}),
    "unused tensors": ({}, {"extra": _EXTRA}, {}),
    "no head_dim or num_key_value_heads (qwen3)": ({"heads": (32, 32, 128), "layers": 1},
                                                   {"layout": _no_head_shape("qwen3")},
                                                   {"head_dim": 128, "num_key_value_heads": 32}),
    "no head_dim or num_key_value_heads (llama)": ({"heads": (4, 4, 8)}, {"layout": _no_head_shape("llama")},
                                                   {"head_dim": 8, "num_key_value_heads": 4}),
    "no target_layer_ids": ({"layer_ids": (1, 1)}, {"layout": _no_target_layer_ids}, {"target_layer_ids": [1, 1]}),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_zlab_publishes_proposes_what_the_canonical_one_does(target, tmp_path, name):
    """The same weights in z-lab's canonical layout and in the layout: both load, their blocks are the same
    logits, and both equal the raw-tensor forward over the context computed one layer at a time."""
    canonical_kw, layout_kw, facts = LAYOUTS[name]
    cfg, sd = zlab_dir(tmp_path / "canonical", target, **canonical_kw)
    zlab_dir(tmp_path / "layout", target, **canonical_kw, **layout_kw)  # same seed: the same weights
    canonical = DFlashDraftModel.from_pretrained(tmp_path / "canonical", target)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = DFlashDraftModel.from_pretrained(tmp_path / "layout", target)
    notes = [str(w.message) for w in caught if "does not use" in str(w.message)]
    if "extra" in layout_kw:
        assert len(notes) == 1 and "ignoring 2 tensor(s)" in notes[0]
        assert "'lm_head.weight'" in notes[0] and "'model.embed_tokens.weight'" in notes[0]
    else:
        assert not notes
    for field_name, value in facts.items():
        assert getattr(model.config, field_name) == value, field_name
    feats = _context(target, cfg["dflash_config"]["target_layer_ids"], TOKENS)
    with torch.no_grad():  # the target's capture, a layer listed twice included, is the same context
        captured = target(torch.tensor([TOKENS]), torch.arange(len(TOKENS))[None],
                          features=model.feature_layers).features
    assert torch.equal(captured, feats)
    got = _block_logits(model, feats, BLOCK)
    assert torch.equal(got, _block_logits(canonical, feats, BLOCK))
    want = _oracle(target, sd, cfg, feats[0], BLOCK)
    assert (got.double() - want).abs().max() < 1e-4


def test_a_repeated_context_layer_changes_the_block(target, tmp_path):
    """[1, 1] reads layer 1's output twice: the second copy goes through its own half of fc, so reading another
    layer there (as deduplicating or sorting would) is a different block."""
    zlab_dir(tmp_path, target, layer_ids=(1, 1))
    model = DFlashDraftModel.from_pretrained(tmp_path, target)
    twice, other = _context(target, [1, 1], TOKENS), _context(target, [1, 2], TOKENS)
    assert (_block_logits(model, twice, BLOCK) - _block_logits(model, other, BLOCK)).abs().max() > 1e-3


@pytest.mark.parametrize("L, n, want", [(4, 2, [1, 1]), (4, 3, [1, 1, 1]), (7, 3, [1, 2, 4]), (8, 3, [1, 3, 5]),
                                        (9, 4, [1, 3, 4, 6]), (28, 1, [14]), (36, 5, [1, 9, 17, 25, 33])])
def test_derived_context_layers_follow_zlabs_rule(target, tmp_path, L, n, want):
    """Without target_layer_ids: z-lab's rule for the config's num_target_layers L and n draft layers, worked by
    hand: [L // 2] for one layer, else round(1 + i * (L - 4) / (n - 1)) (Python's round: 2.5 -> 2)."""
    def rewrite(cfg):
        cfg["num_target_layers"] = L
        del cfg["dflash_config"]["target_layer_ids"]

    zlab_dir(tmp_path, target, layers=n, layout=rewrite)
    assert read_dflash_config(tmp_path, target.config.num_hidden_layers).target_layer_ids == want
    assert build_target_layer_ids(L, n) == want


def test_without_num_target_layers_the_rule_reads_the_targets_depth(target, tmp_path):
    def rewrite(cfg):
        del cfg["num_target_layers"], cfg["dflash_config"]["target_layer_ids"]

    zlab_dir(tmp_path, target, layers=2, layout=rewrite)
    assert read_dflash_config(tmp_path, 8).target_layer_ids == [1, 5]
    assert DFlashDraftModel.from_pretrained(tmp_path, target).config.target_layer_ids == [1, 1]


def test_layouts_that_would_compute_wrongly_are_one_line_value_errors(target, tmp_path):
    def sliding_layer(cfg):
        cfg.update(layer_types=["sliding_attention", "full_attention"], sliding_window=16, use_sliding_window=True)

    zlab_dir(tmp_path / "swa", target, layout=sliding_layer)
    _one_line_value_error(r"layer_types marks draft layer\(s\) \[0\] 'sliding_attention': only full attention",
                          lambda: DFlashDraftModel.from_pretrained(tmp_path / "swa", target))

    def window_without_layer_types(cfg):
        del cfg["layer_types"]
        cfg.update(sliding_window=16, use_sliding_window=True)

    zlab_dir(tmp_path / "window", target, layout=window_without_layer_types)
    _one_line_value_error(r"sliding_window=16 is not implemented",
                          lambda: DFlashDraftModel.from_pretrained(tmp_path / "window", target))

    def two_block_sizes(cfg):
        cfg["dflash_config"]["block_size"] = 8

    zlab_dir(tmp_path / "two", target, layout=two_block_sizes)
    _one_line_value_error(r"block_size=4 and dflash_config.block_size=8 differ",
                          lambda: DFlashDraftModel.from_pretrained(tmp_path / "two", target))

    def no_block_size(cfg):
        del cfg["block_size"]

    zlab_dir(tmp_path / "none", target, layout=no_block_size)
    _one_line_value_error(r"no block_size, at the top level or in dflash_config",
                          lambda: DFlashDraftModel.from_pretrained(tmp_path / "none", target))


def test_a_window_on_no_layer_loads(target, tmp_path):
    """layer_types all full_attention: neither z-lab nor SGLang windows any layer, whatever sliding_window says."""
    def window_on_no_layer(cfg):
        cfg.update(sliding_window=16, use_sliding_window=True)

    cfg, sd = zlab_dir(tmp_path, target, layout=window_on_no_layer)
    feats = _context(target, [0, 2], TOKENS)
    got = _block_logits(DFlashDraftModel.from_pretrained(tmp_path, target), feats, BLOCK)
    assert (got.double() - _oracle(target, sd, cfg, feats[0], BLOCK)).abs().max() < 1e-4


def test_without_transformers_a_missing_head_dim_is_named(target, tmp_path, monkeypatch):
    zlab_dir(tmp_path, target, layout=_no_head_shape("qwen3"))
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    _one_line_value_error(r"no head_dim \(its default is transformers' qwen3 config's; install transformers or "
                          r"write head_dim into config.json\)",
                          lambda: DFlashDraftModel.from_pretrained(tmp_path, target))
