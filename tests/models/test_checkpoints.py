"""Checkpoints: save / load round trips in Hugging Face names, the int8 storage of the drafts, and every bad
config, file or weight a clear ValueError naming it."""
import json

import pytest
import torch

from specdec.models import (EagleDraftHead, LlamaConfig, LlamaForCausalLM, MTPDraftModel,
                            random_eagle_head, random_llama, random_mtp)


@pytest.mark.parametrize("kw", [dict(seed=1, num_key_value_heads=2),  # GQA
                                dict(seed=2, num_key_value_heads=1, tie_word_embeddings=True)])  # MQA, tied
def test_save_load_round_trip_is_bit_exact(tmp_path, kw):
    m = random_llama(**kw)
    m.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    m2 = LlamaForCausalLM.from_pretrained(tmp_path)
    for (k, a), (k2, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    ids = torch.randint(0, 64, (1, 7))
    assert torch.equal(m(ids, torch.arange(7)[None]).logits, m2(ids, torch.arange(7)[None]).logits)


def test_state_dict_uses_hugging_face_llama_names():
    keys = set(random_llama(num_hidden_layers=1).state_dict())
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} | {
        f"model.layers.0.{k}.weight" for k in (
            "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
            "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert keys == expected


def test_drafts_round_trip_without_the_shared_tensors(tmp_path):
    t = random_llama(seed=0)
    for draft, cls in [(random_eagle_head(t, seed=1), EagleDraftHead), (random_mtp(t, 3, True, seed=2), MTPDraftModel)]:
        draft.save_pretrained(tmp_path / cls.__name__)
        from safetensors.torch import load_file
        keys = load_file(str(tmp_path / cls.__name__ / "model.safetensors")).keys()
        assert not any("embed_tokens" in k or "lm_head" in k for k in keys)
        loaded = cls.from_pretrained(tmp_path / cls.__name__, t)
        assert loaded.config == draft.config
        for a, b in zip(draft.state_dict().values(), loaded.state_dict().values()):
            assert torch.equal(a, b)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.pop("hidden_size"), "missing required field.*hidden_size"),
    (lambda d: d.update(num_hidden_layers="two"), "num_hidden_layers"),
    (lambda d: d.update(num_attention_heads=3), "num_attention_heads=3"),
    (lambda d: d.update(rope_theta=-1.0), "rope_theta"),
    (lambda d: d.update(rope_scaling={"type": "yarn"}), "rope_scaling"),
    (lambda d: d.update(tie_word_embeddings="false"), "tie_word_embeddings must be true or false, got str 'false'"),
    (lambda d: d.update(attention_bias=0), "attention_bias must be true or false, got int 0"),
    (lambda d: d.update(rope_theta=True), "rope_theta must be a number, got bool True"),
    (lambda d: d.update(rms_norm_eps=float("inf")), "rms_norm_eps must be a number > 0, got inf"),
    (lambda d: d.update(num_key_value_heads=True), "num_key_value_heads must be an int >= 1, got bool True"),
])
def test_bad_config_is_a_clear_error(tmp_path, edit, match):
    m = random_llama()
    m.save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    edit(d)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=match):
        LlamaForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(chain_hidden_states="false"), "chain_hidden_states must be true or false, got str"),
    (lambda d: d.update(architectures=[]), r"architectures=\[\], expected \['MTPDraftModel'\]"),
    (lambda d: d.update(architectures="MTPDraftModel"), "architectures='MTPDraftModel', expected"),
])
def test_bad_draft_config_is_a_clear_error(tmp_path, edit, match):
    t = random_llama()
    random_mtp(t, 2).save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    edit(d)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=match):
        MTPDraftModel.from_pretrained(tmp_path, t)


def test_integer_weights_are_refused_not_cast(tmp_path):
    from safetensors.torch import save_file
    m = random_llama(num_hidden_layers=1)
    m.save_pretrained(tmp_path)
    sd = m.state_dict_for_save()
    sd["model.norm.weight"] = sd["model.norm.weight"].to(torch.int32)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"weights must be floating point, got \['model.norm.weight: torch.int32'\]"):
        LlamaForCausalLM.from_pretrained(tmp_path)


def test_int8_stored_matrices_load_within_half_a_step_of_their_scale(tmp_path):
    """A draft saved with int8 matrices (one scale per output row) loads as fp32 with every element within
    half a quantisation step of the original and keeps its 1-D weights as they were."""
    from safetensors.torch import load_file

    from specdec.models.io import quantize_int8_matrices, save_dir
    target = random_llama(num_hidden_layers=2, seed=1)
    head = random_eagle_head(target, seed=2)
    with torch.no_grad():
        head.fc.weight[3].zero_()  # an all-zero row: scale 0, stored and loaded as zeros
    cfg, sd = head.checkpoint()
    save_dir(tmp_path, cfg, quantize_int8_matrices(sd))
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert stored["fc.weight"].dtype == torch.int8 and stored["fc.weight_scale"].shape == (head.fc.weight.shape[0], 1)
    assert stored["norm.weight"].dtype == torch.float32
    loaded = EagleDraftHead.from_pretrained(tmp_path, target)
    own = dict(head.named_parameters())
    for name, p in loaded.named_parameters():
        if p.dim() == 2:
            step = own[name].abs().amax(1, keepdim=True).half().float() / 127
            assert ((p - own[name]).abs() <= step / 2 + 1e-3 * step).all(), name
            assert not torch.equal(p, own[name])  # it was rounded
        else:
            assert torch.equal(p, own[name]), name
    assert (loaded.fc.weight[3] == 0).all()


@pytest.mark.parametrize("break_it, match", [
    (lambda sd: sd.pop("fc.weight_scale"), "int8 tensor 'fc.weight' has no floating-point 'fc.weight_scale'"),
    (lambda sd: sd.update({"fc.weight_scale": torch.ones(3, 1)}), r"'fc.weight_scale' has shape \(3, 1\)"),
])
def test_a_broken_int8_matrix_names_the_key(tmp_path, break_it, match):
    from specdec.models.io import quantize_int8_matrices, save_dir
    target = random_llama(num_hidden_layers=1, seed=1)
    cfg, sd = random_eagle_head(target, seed=2).checkpoint()
    sd = quantize_int8_matrices(sd)
    break_it(sd)
    save_dir(tmp_path, cfg, sd)
    with pytest.raises(ValueError, match=match):
        EagleDraftHead.from_pretrained(tmp_path, target)


def test_missing_files_and_mismatched_weights_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        LlamaForCausalLM.from_pretrained(tmp_path)
    random_llama(hidden_size=32).save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    d["intermediate_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="shape mismatches"):
        LlamaForCausalLM.from_pretrained(tmp_path)


def test_draft_must_match_target_sizes():
    t = random_llama(vocab_size=64, hidden_size=32)
    other = random_llama(vocab_size=80, hidden_size=32)
    from specdec.models.draft_common import draft_config_like
    with pytest.raises(ValueError, match="vocab_size=80.*vocab_size=64"):
        EagleDraftHead(draft_config_like(other, 1), t)
    with pytest.raises(ValueError, match="hidden_size=48.*hidden_size=32"):
        MTPDraftModel(draft_config_like(t, 2, hidden_size=48, num_attention_heads=4), t)


def test_config_accepts_real_llama_fields():
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
          "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
          "num_key_value_heads": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
          "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "float16",
          "bos_token_id": 1, "eos_token_id": 2, "rope_scaling": None, "attention_bias": False}
    c = LlamaConfig.from_dict(hf)
    assert c.head_dim == 128 and c.dtype == torch.float16


def test_fused_projections_load_hugging_face_names_in_order():
    """q/k/v and gate/up stack in Hugging Face's order: a state dict with distinct per-projection values
    loads into the fused rows where the forward reads them, and saves back unchanged."""
    m = random_llama(num_hidden_layers=1, num_key_value_heads=2)
    sd = {k: torch.full_like(v, float(i)) for i, (k, v) in enumerate(m.state_dict().items())}
    m.load_state_dict(sd)
    attn, mlp = m.model.layers[0].self_attn, m.model.layers[0].mlp
    names = list(sd)
    q, k, v = (sd[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    assert torch.equal(attn.qkv_proj.weight, torch.cat([q, k, v]))
    assert attn.qkv_proj.weight[0, 0] == names.index("model.layers.0.self_attn.q_proj.weight")
    gate, up = sd["model.layers.0.mlp.gate_proj.weight"], sd["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(mlp.gate_up_proj.weight, torch.cat([gate, up]))
    for key, value in m.state_dict().items():
        assert torch.equal(value, sd[key]), key


@pytest.mark.parametrize("corrupt", ["empty", "truncated", "garbled", "non-finite"])
def test_corrupt_checkpoint_is_a_value_error_naming_the_file(tmp_path, corrupt):
    m = random_llama(num_hidden_layers=1)
    m.save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    data = f.read_bytes()
    if corrupt == "empty":
        f.write_bytes(b"")
    elif corrupt == "truncated":
        f.write_bytes(data[: len(data) // 2])
    elif corrupt == "garbled":
        f.write_bytes(bytes(b ^ 0x5A for b in data[:64]) + data[64:])
    else:  # valid file, tensor bytes overwritten with NaN / inf (fp32: 0x7fc00000, 0x7f800000)
        from safetensors.torch import save_file
        sd = m.state_dict_for_save()
        sd["model.layers.0.mlp.down_proj.weight"] = sd["model.layers.0.mlp.down_proj.weight"].clone()
        sd["model.layers.0.mlp.down_proj.weight"][0, :3] = torch.tensor([float("nan"), float("inf"), 1.0])
        save_file({k: v.contiguous() for k, v in sd.items()}, str(f))
    match = "down_proj.weight.*2 non-finite" if corrupt == "non-finite" else "not a readable safetensors file"
    with pytest.raises(ValueError, match=match) as err:
        LlamaForCausalLM.from_pretrained(tmp_path)
    assert str(f) in str(err.value)


def test_from_pretrained_loads_fp32_unless_asked_for_the_checkpoint_dtype(tmp_path):
    """One default everywhere (zoo.load too): fp32, where the exactness claims hold; "auto" keeps the
    checkpoint's torch_dtype."""
    random_llama(num_hidden_layers=1, dtype=torch.float16).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "float16"
    assert LlamaForCausalLM.from_pretrained(tmp_path).dtype == torch.float32
    assert LlamaForCausalLM.from_pretrained(tmp_path, dtype="auto").dtype == torch.float16
    with pytest.raises(ValueError, match="dtype must be a floating-point torch.dtype or 'auto', got 'fp16'"):
        LlamaForCausalLM.from_pretrained(tmp_path, dtype="fp16")
