"""The DFlash drafter: a checkpoint in z-lab's layout loads; its forward (the worker's cached path and the trainer's
dense path) equals z-lab's computation written out from the raw tensors; the trainer's mask shows each block what
inference shows it; a drafter that does not fit is a one-line ValueError before any compute."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import reference
from specdec import Engine, SpecConfig
from specdec.kv_cache import KVCache
from specdec.models import random_llama
from specdec.models.dflash import DFlashDraftModel, build_target_layer_ids, random_dflash
from specdec.models.layers import AttentionMetadata
from specdec.zoo.train.stages import dflash_blocks
from tests.oracles import dflash_logits_from_tensors

H, V, L = 32, 64, 4


@pytest.fixture(scope="module")
def target():
    return random_llama(vocab_size=V, hidden_size=H, num_hidden_layers=L, seed=7)


def zlab_dir(path, target, layers=2, layer_ids=(0, 2), block=4, mask=63, seed=0, drop=None):
    """A checkpoint directory as z-lab's trainer writes one: a Qwen3 config with `block_size`,
    `num_target_layers` and `dflash_config`, tensors under z-lab's names (random) -> (config, tensors)."""
    Hq, Hkv, D, inter = 4, 2, 8, 48
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
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(sd, str(path / "model.safetensors"))
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
