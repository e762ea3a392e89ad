"""Parity with transformers: Llama, Mistral, Qwen2 and Qwen3 targets and their rope types decode as transformers
does; SafeAILab EAGLE and MTP checkpoints load and run as written; fields that change the math are refused."""
import json

import pytest
import torch

from specdec.models import (EagleDraftHead, LlamaForCausalLM, random_llama, random_mtp)


def _hf_llama_dir(tmp_path, **overrides):
    """A random Llama written by transformers itself (its current config format)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   **overrides)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path)
    return model


def test_a_transformers_llama_with_another_rope_base_loads_exactly(tmp_path):
    """transformers 5.x writes `rope_parameters` and no top-level rope_theta: once ignored (theta 10000 used,
    logits off by 0.04), now read; a 4.x-style config (top-level rope_theta) gives the same model."""
    hf = _hf_llama_dir(tmp_path, rope_theta=11000.0)
    d = json.loads((tmp_path / "config.json").read_text())
    assert "rope_parameters" in d and "rope_theta" not in d
    ours = LlamaForCausalLM.from_pretrained(tmp_path)
    ids = torch.randint(0, 64, (2, 19), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits
        got = ours(ids, torch.arange(19).expand(2, 19)).logits
    assert (got - want).abs().max() <= 1e-4
    old = dict(d, rope_theta=11000.0)
    old.pop("rope_parameters")
    (tmp_path / "config.json").write_text(json.dumps(old))
    with torch.no_grad():
        again = LlamaForCausalLM.from_pretrained(tmp_path)(ids, torch.arange(19).expand(2, 19)).logits
    assert torch.equal(again, got)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}),
     r"rope_type='llama3' needs .*; missing \['high_freq_factor', 'low_freq_factor', "),
    (lambda d: d.update(rope_scaling={"type": "dynamic", "factor": 2.0}), "rope_type='dynamic' is not implemented"),
    (lambda d: d.update(rope_scaling={"type": "longrope", "factor": 2.0}), "rope_type='longrope' is not implemented"),
    (lambda d: d.update(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
     r"unknown \['partial_rotary_factor'\]"),
    (lambda d: d.update(rope_scaling={"rope_type": "linear", "factor": "2"}), "rope field factor must be a number"),
    (lambda d: d.update(partial_rotary_factor=0.5), "partial_rotary_factor=0.5 changes the computation"),
    (lambda d: d.update(rope_theta=5.0, rope_parameters={"rope_type": "default", "rope_theta": 7.0}), "differ"),
    (lambda d: d.update(model_type="gemma"), "model_type='gemma' is not supported"),
    (lambda d: d.update(layer_types=["full_attention", "sliding_attention"]), "only full attention"),
    (lambda d: d.update(mlp_bias=True), "mlp_bias=True changes the computation"),
    (lambda d: d.update(sliding_window=64), "sliding_window=64 is not implemented"),
    (lambda d: d.update(final_logit_softcapping=30.0), "final_logit_softcapping=30.0 changes the computation"),
    (lambda d: d.update(hidden_act="gelu"), "hidden_act='gelu' changes the computation"),
])
def test_fields_that_change_the_math_are_refused_not_ignored(tmp_path, edit, match):
    """Every field that changes the computation is implemented or refused by name: none is ignored."""
    random_llama().save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    edit(d)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=match):
        LlamaForCausalLM.from_pretrained(tmp_path)


ROPES = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 32},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "beta_fast": 16, "beta_slow": 2,
     "mscale": 1.0, "mscale_all_dim": 0.5},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16, "attention_factor": 1.3,
     "truncate": False},
]


def _assert_matches_transformers(hf, ours, ids, prompt_len, new_tokens):
    """The same logits over `ids` (B, T) within 1e-4, and the target-only engine decodes transformers' greedy
    tokens after ids[0, :prompt_len] -> our logits."""
    from specdec import Engine, SamplingParams
    B, T = ids.shape
    with torch.no_grad():
        want = hf(ids).logits
        got = ours(ids, torch.arange(T).expand(B, T)).logits
        prompt = ids[0, :prompt_len].tolist()
        hf_tokens = hf.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False)[0, prompt_len:]
    assert (got - want).abs().max() <= 1e-4
    engine = Engine(ours, impl="reference", max_seq_len=prompt_len + new_tokens + 16)
    assert engine.generate([prompt], SamplingParams(max_new_tokens=new_tokens))[0].token_ids == hf_tokens.tolist()
    return got


@pytest.mark.parametrize("rope", ROPES, ids=lambda r: r["rope_type"] + "-" + str(r["factor"]))
def test_rope_types_match_transformers(tmp_path, rope):
    """Each rope type, in a random Llama written by transformers: the same logits over positions past the
    original context (where scaling acts), and the same greedy tokens as transformers' generate."""
    hf = _hf_llama_dir(tmp_path, rope_parameters={"rope_theta": 5000.0, **rope})
    ours = LlamaForCausalLM.from_pretrained(tmp_path)
    assert ours.config.rope_scaling["rope_type"] == rope["rope_type"]
    ids = torch.randint(0, 64, (2, 100), generator=torch.Generator().manual_seed(2))
    got = _assert_matches_transformers(hf, ours, ids, prompt_len=40, new_tokens=24)
    ours.save_pretrained(tmp_path / "again")  # and it round-trips through our own (4.x-style) config
    assert LlamaForCausalLM.from_pretrained(tmp_path / "again").config == ours.config
    d = json.loads((tmp_path / "config.json").read_text())  # transformers 4.x's form of the same config
    params = d.pop("rope_parameters")
    d.update(rope_theta=params.pop("rope_theta"), rope_scaling=params)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with torch.no_grad():
        old_style = LlamaForCausalLM.from_pretrained(tmp_path)(ids, torch.arange(100).expand(2, 100)).logits
    assert torch.equal(old_style, got)


FAMILIES = {
    "llama-tied": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True, attention_bias=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None, head_dim=16)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_target_families_match_transformers(tmp_path, family):
    """A random model of each family, built and saved by transformers (sharded, with an index file): the same
    logits, and the target-only engine decodes transformers' greedy tokens."""
    transformers = pytest.importorskip("transformers")
    config_cls, model_cls, extra = FAMILIES[family]
    cfg = getattr(transformers, config_cls)(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                            rope_theta=20000.0, **extra)
    torch.manual_seed(3)
    hf = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # non-zero biases and norms, so that a missing one shows
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    ours = LlamaForCausalLM.from_pretrained(tmp_path)
    assert ours.config.model_type == cfg.model_type
    ids = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(4))
    _assert_matches_transformers(hf, ours, ids, prompt_len=12, new_tokens=20)
    ours.save_pretrained(tmp_path / "again")
    again = LlamaForCausalLM.from_pretrained(tmp_path / "again")
    assert again.config == ours.config
    for (k, a), (k2, b) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(a, b)


def _write_safeailab_eagle(path, target, prefix="", seed=0):
    """An EAGLE-1/2 head in SafeAILab's layout, as SGLang's LlamaForCausalLMEagle loads it: raw tensors by name."""
    from safetensors.torch import save_file
    c = target.config
    H, D, Hq, Hkv, F = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size
    g = torch.Generator().manual_seed(seed)
    shapes = {"fc.weight": (H, 2 * H), "fc.bias": (H,), "layers.0.self_attn.q_proj.weight": (Hq * D, H),
              "layers.0.self_attn.k_proj.weight": (Hkv * D, H), "layers.0.self_attn.v_proj.weight": (Hkv * D, H),
              "layers.0.self_attn.o_proj.weight": (H, Hq * D), "layers.0.post_attention_layernorm.weight": (H,),
              "layers.0.mlp.gate_proj.weight": (F, H), "layers.0.mlp.up_proj.weight": (F, H),
              "layers.0.mlp.down_proj.weight": (H, F)}
    sd = {k: (1 + 0.1 * torch.randn(s, generator=g)) if "norm" in k else 0.2 * torch.randn(s, generator=g)
          for k, s in shapes.items()}
    sd["embed_tokens.weight"] = target.model.embed_tokens.weight.detach().clone()
    path.mkdir(parents=True, exist_ok=True)
    save_file({prefix + k: v.contiguous() for k, v in sd.items()}, str(path / "model.safetensors"))
    cfg = dict(c.to_dict(), architectures=["LlamaForCausalLMEagle"], num_hidden_layers=1)
    (path / "config.json").write_text(json.dumps(cfg))
    return sd


def _safeailab_eagle_logits(sd, target, ids, hidden):
    """The head's forward written out from the raw tensors (cache-free, causal): fc over [embedding; hidden]
    with its bias, attention straight on that (no input norm), the MLP after the post-attention norm, no final
    norm, the target's LM head."""
    from specdec.models.layers import apply_rope
    c = target.config
    B, T = ids.shape
    D, Hq, Hkv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
    x = torch.cat([target.model.embed_tokens.weight[ids], hidden], -1) @ sd["fc.weight"].T + sd["fc.bias"]
    q = (x @ sd["layers.0.self_attn.q_proj.weight"].T).view(B, T, Hq, D)
    k = (x @ sd["layers.0.self_attn.k_proj.weight"].T).view(B, T, Hkv, D)
    v = (x @ sd["layers.0.self_attn.v_proj.weight"].T).view(B, T, Hkv, D)
    pos = torch.arange(T).expand(B, T).float()[..., None]
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, D, 2).float() / D))
    emb = torch.cat([pos * inv, pos * inv], -1)
    q, k = apply_rope(q, emb.cos(), emb.sin()), apply_rope(k, emb.cos(), emb.sin())
    rep = Hq // Hkv
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    scores = torch.einsum("bthd,bshd->bhts", q, k) / D ** 0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v).reshape(B, T, Hq * D)
    x = x + attn @ sd["layers.0.self_attn.o_proj.weight"].T
    norm_w = sd["layers.0.post_attention_layernorm.weight"]
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps) * norm_w
    gate, up = n @ sd["layers.0.mlp.gate_proj.weight"].T, n @ sd["layers.0.mlp.up_proj.weight"].T
    mlp = torch.nn.functional.silu(gate) * up
    x = x + mlp @ sd["layers.0.mlp.down_proj.weight"].T
    return x @ target.lm_head.weight.T


@pytest.mark.parametrize("prefix", ["", "model."])
def test_a_safeailab_eagle_checkpoint_loads_and_runs_as_written(tmp_path, prefix):
    t = random_llama(num_key_value_heads=2, seed=5)
    sd = _write_safeailab_eagle(tmp_path / "eagle", t, prefix)
    head = EagleDraftHead.from_pretrained(tmp_path / "eagle", t)
    assert head.config.eagle_layout == "eagle" and head.fc.bias is not None
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(6))
    hidden = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        got = head(ids, hidden, torch.arange(9).expand(2, 9)).logits
    assert (got - _safeailab_eagle_logits(sd, t, ids, hidden)).abs().max() <= 1e-4
    from specdec import Engine, SamplingParams, SpecConfig
    prompts = [[1, 2, 3, 4, 5], [9, 8]]
    want = Engine(t, max_seq_len=64).generate(prompts, SamplingParams(max_new_tokens=16))
    got = Engine(t, head, SpecConfig(3, 2, 6), max_seq_len=64).generate(prompts, SamplingParams(max_new_tokens=16))
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    head.save_pretrained(tmp_path / "ours")  # our own format keeps the layout
    again = EagleDraftHead.from_pretrained(tmp_path / "ours", t)
    assert again.config.eagle_layout == "eagle"


@pytest.mark.parametrize("break_it, match", [
    (lambda sd: sd.pop("fc.bias"), r"missing=\['fc.bias'\]"),
    (lambda sd: sd.update({"layers.0.mlp.down_proj.weight": torch.zeros(3, 3)}), "layers.0.mlp.down_proj.weight"),
    (lambda sd: sd.update({"layers.0.input_layernorm.weight": torch.ones(32)}), "unexpected=.*input_layernorm"),
])
def test_a_broken_safeailab_eagle_checkpoint_names_the_key(tmp_path, break_it, match):
    from safetensors.torch import load_file, save_file
    t = random_llama(num_key_value_heads=2, seed=5)
    _write_safeailab_eagle(tmp_path, t)
    sd = load_file(str(tmp_path / "model.safetensors"))
    break_it(sd)
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=match):
        EagleDraftHead.from_pretrained(tmp_path, t)


def _write_target_with_mtp(path, target, layout, S, seed=0):
    """A target directory whose safetensors also hold S MTP layers under the layout's real key names."""
    from safetensors.torch import load_file, save_file
    target.save_pretrained(path)
    donor = random_mtp(target, S, seed=seed)  # random weights, our names
    with torch.no_grad():
        for p in donor.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + 1)))
    sd = load_file(str(path / "model.safetensors"))
    L = target.config.num_hidden_layers
    rename = {"enorm": "token_layernorm", "hnorm": "hidden_layernorm", "eh_proj": "input_proj",
              "shared_head.norm": "final_layernorm"}
    for key, value in donor.state_dict().items():
        k, rest = int(key.split(".")[1]), key.split(".", 2)[2]
        if layout == "deepseek":
            sd[f"model.layers.{L + k}.{rest}"] = value.contiguous()
        else:
            for ours, theirs in rename.items():
                if rest.startswith(ours + "."):
                    rest = theirs + rest[len(ours):]
            sd[f"model.mtp_layers.{k}.{rest}"] = value.contiguous()
    if layout == "deepseek":  # NextN layers carry their own copy of the embedding and head
        for k in range(S):
            sd[f"model.layers.{L + k}.embed_tokens.weight"] = sd["model.embed_tokens.weight"].clone()
            sd[f"model.layers.{L + k}.shared_head.head.weight"] = sd["lm_head.weight"].clone()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path / "model.safetensors"))
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(cfg, num_nextn_predict_layers=S)))
    return donor


@pytest.mark.parametrize("layout, family", [("deepseek", "llama"), ("mimo", "qwen2")])
def test_mtp_layers_load_from_the_targets_directory(tmp_path, layout, family):
    from specdec import Engine, SamplingParams, SpecConfig
    from specdec.models.mtp import mtp_from_target_dir
    t0 = random_llama(num_key_value_heads=2, model_type=family, seed=8)
    if family == "qwen2":  # non-zero q/k/v biases, so a lost one shows
        with torch.no_grad():
            for layer in t0.model.layers:
                layer.self_attn.qkv_proj.bias.normal_(0, 0.3)
    donor = _write_target_with_mtp(tmp_path, t0, layout, S=2)
    target = LlamaForCausalLM.from_pretrained(tmp_path)  # the MTP keys beside it are not the target's
    mtp = mtp_from_target_dir(tmp_path, target, layout)
    assert mtp.num_layers == 2 and mtp.config.mtp_layout == layout and mtp.config.model_type == family
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(9))
    hidden = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(10))
    pos = torch.arange(7).expand(2, 7)
    with torch.no_grad():
        got = mtp.forward_layer(1, ids, hidden, pos).logits
        if layout == "deepseek":  # the same math as this project's layout: the donor is the oracle
            want = donor.forward_layer(1, ids, hidden, pos).logits
            assert (got - want).abs().max() <= 1e-5
        else:  # [hidden; embedding]: the donor's input_proj read the other way round differs...
            want = donor.forward_layer(1, ids, hidden, pos).logits
            assert (got - want).abs().max() > 1e-2
            swapped = random_mtp(target, 2)
            swapped.load_state_dict(donor.state_dict())
            H = 32
            w = swapped.layers[1].eh_proj.weight
            w.data = torch.cat([w.data[:, H:], w.data[:, :H]], 1)  # ...unless its halves are swapped
            later = pos + 1  # away from position 0, where MiMo drops the embedding
            want = swapped.forward_layer(1, ids, hidden, later).logits
            assert (mtp.forward_layer(1, ids, hidden, later).logits - want).abs().max() <= 1e-5
            other = ids.clone()
            other[:, 0] = (ids[:, 0] + 1) % 64  # and at position 0 the token is not read at all
            again = mtp.forward_layer(1, other, hidden, pos).logits
            assert torch.equal(again, got)
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8]]
    want = Engine(target, max_seq_len=64).generate(prompts, SamplingParams(max_new_tokens=15))
    got = Engine(target, mtp, SpecConfig(2), max_seq_len=64).generate(prompts, SamplingParams(max_new_tokens=15))
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
