"""Target model, KV cache, tree attention and checkpoints."""
import json

import pytest
import torch

import reference

from specdec.kv_cache import KVCache
from specdec.models import (AttentionMetadata, EagleDraftHead, LlamaConfig, LlamaForCausalLM, MTPDraftModel,
                            random_eagle_head, random_llama, random_mtp)

MODELS = [
    dict(seed=0),
    dict(seed=1, num_key_value_heads=2),  # GQA
    dict(seed=2, num_key_value_heads=1, tie_word_embeddings=True),  # MQA, tied
    dict(seed=3, hidden_size=48, num_attention_heads=3, num_hidden_layers=3, rope_theta=500000.0),
]


def _meta(slots, start, attn_len, **kw):
    return AttentionMetadata(slots, start, attn_len=attn_len, ops=reference, **kw)


@pytest.mark.parametrize("kw", MODELS)
def test_incremental_decoding_matches_full_forward(kw):
    m = random_llama(**kw)
    B, L, P = 3, 13, 5
    ids = torch.randint(0, m.config.vocab_size, (B, L), generator=torch.Generator().manual_seed(0))
    full_logits = m(ids, torch.arange(L).expand(B, L)).logits
    cache = KVCache.for_model(m.config, m.config.num_hidden_layers, 5, 32, torch.float32, "cpu")
    slots = torch.tensor([4, 0, 2])  # cache rows need not be 0..B-1
    logits = m(ids[:, :P], torch.arange(P).expand(B, P), cache,
               _meta(slots, torch.zeros(B, dtype=torch.long), P)).logits
    steps = [logits]
    for t in range(P, L):
        start = torch.full((B,), t)
        lg = m(ids[:, t:t + 1], start[:, None], cache, _meta(slots, start, t + 1)).logits
        steps.append(lg)
    inc = torch.cat(steps, dim=1)
    assert (inc - full_logits).abs().max() <= 1e-4


def test_tree_attention_matches_each_branch_alone():
    """Each tree node's logits equal a causal forward over prefix + its root-to-node path."""
    m = random_llama(seed=5, num_key_value_heads=2)
    V = m.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, V, (2, 6), generator=g)
    parents = [-1, 0, 0, 1, 1, 2, 4]  # node 0 is the root
    W = len(parents)
    tokens = torch.randint(0, V, (2, W), generator=g)
    depth, anc = [], torch.zeros(W, W, dtype=torch.bool)
    for i, p in enumerate(parents):
        depth.append(0 if p < 0 else depth[p] + 1)
        anc[i, i] = True
        if p >= 0:
            anc[i] |= anc[p]
    cache = KVCache.for_model(m.config, m.config.num_hidden_layers, 2, 32, torch.float32, "cpu")
    slots = torch.tensor([0, 1])
    seq_lens = torch.tensor([6, 4])  # ragged committed prefixes
    m(prefix, torch.arange(6).expand(2, 6), cache, _meta(slots, torch.zeros(2, dtype=torch.long), 6))
    positions = seq_lens[:, None] + torch.tensor(depth)
    tree_logits = m(tokens, positions, cache, _meta(slots, seq_lens, 6 + W, tree_mask=anc.expand(2, W, W))).logits
    for b in range(2):
        n = int(seq_lens[b])
        for i in range(W):
            path = [j for j in range(W) if anc[i, j]]
            seq = torch.cat([prefix[b, :n], tokens[b, path]])[None]
            ref = m(seq, torch.arange(seq.shape[1])[None]).logits
            assert (tree_logits[b, i] - ref[0, -1]).abs().max() <= 1e-4


def test_kv_commit_moves_accepted_path_to_contiguous_slots():
    import reference
    W = 5
    kv_all = torch.arange(3 * 2 * 16 * 1 * 1, dtype=torch.float32).view(3, 2, 16, 1, 1).clone()
    before_all = kv_all.clone()
    seq_lens = torch.tensor([3, 7])
    accept = torch.tensor([[0, 2, 4, -1], [W + 0, W + 1, -1, -1]])
    reference.commit_kv_cache(kv_all, torch.tensor([1, 0]), seq_lens, accept, W)
    assert torch.equal(kv_all[1] - kv_all[0], before_all[1] - before_all[0])  # every cache moved alike
    kv, before = kv_all[2], before_all[2]
    # request 0 lives in row 1, request 1 in row 0
    assert kv[1, 3:6, 0, 0].tolist() == before[1, [3, 5, 7], 0, 0].tolist()
    assert kv[0, 7:9, 0, 0].tolist() == before[0, [7, 8], 0, 0].tolist()
    assert torch.equal(kv[1, :3], before[1, :3]) and torch.equal(kv[0, :7], before[0, :7])


@pytest.mark.parametrize("kw", MODELS[1:3])
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


@pytest.mark.parametrize("shape", [(2, 48), (5, 48), (3, 11, 48)])
@pytest.mark.parametrize("bias", [False, True])
def test_prepacked_cpu_linear_equals_f_linear(shape, bias):
    """The oneDNN-prepacked product (forced) against F.linear, and its copy follows in-place changes of the
    weight."""
    from specdec.models import linear
    torch.manual_seed(0)
    lin = linear.Linear(48, 37, bias=bias)
    x = torch.randn(shape)
    linear.set_cpu_linear_backend("onednn")
    try:
        with torch.inference_mode():
            ref = torch.nn.functional.linear(x, lin.weight, lin.bias)
            torch.testing.assert_close(lin(x), ref, rtol=1e-5, atol=1e-5)
            assert lin._packed is not None  # the oneDNN path ran
            with torch.no_grad():
                lin.weight.mul_(-2.0)
            torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias), rtol=1e-5,
                                       atol=1e-5)
    finally:
        linear.set_cpu_linear_backend("auto")


def test_auto_cpu_linear_measures_once_per_shape_and_row_bucket(monkeypatch):
    """"auto" times both backends at the first use of a (shape, row bucket), caches the winner, and every
    choice computes F.linear's product; "mkl" never packs; a bad mode is a ValueError."""
    from specdec.models import linear
    monkeypatch.setattr(linear, "_choices", {})
    measured = []
    original = linear.Linear._measure
    monkeypatch.setattr(linear.Linear, "_measure", lambda self, rows: measured.append(rows) or original(self, rows))
    lin = linear.Linear(40, 24)
    with torch.inference_mode():
        for rows in (3, 4, 3, 1, 9, 16, 2):
            x = torch.randn(rows, 40)
            torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias), rtol=1e-5,
                                       atol=1e-5)
    assert measured == [4, 1, 16, 2]  # buckets 4 (3, 4, 3), 1, 16 (9, 16), 2
    assert set(linear.cpu_linear_choices()) == {(24, 40, True, b) for b in (1, 2, 4, 16)}
    assert set(linear.cpu_linear_choices().values()) <= {"mkl", "onednn"}
    assert linear.cpu_linear_summary().startswith("auto (onednn ")
    fresh = linear.Linear(40, 24)
    linear.set_cpu_linear_backend("mkl")
    try:
        with torch.inference_mode():
            fresh(torch.randn(64, 40))
        assert fresh._packed is None and linear.cpu_linear_summary() == "mkl"
    finally:
        linear.set_cpu_linear_backend("auto")
    with pytest.raises(ValueError, match="'blas'"):
        linear.set_cpu_linear_backend("blas")


def test_linear_keeps_autograd_and_single_rows_on_f_linear():
    from specdec.models.linear import Linear
    lin = Linear(16, 8)
    x = torch.randn(4, 16)
    y = lin(x)
    assert y.grad_fn is not None  # training takes F.linear, with gradients
    y.sum().backward()
    assert lin.weight.grad is not None
    with torch.inference_mode():
        row = torch.randn(1, 16)
        assert torch.equal(lin(row), torch.nn.functional.linear(row, lin.weight, lin.bias))


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


def test_attention_plan_must_match_its_call():
    import fast  # noqa: F401  (its plan type is the shared one; only the ops that built a plan may read it)
    B, T, Hq, Hkv, D, S = 2, 3, 4, 2, 8, 16
    kc, vc = torch.zeros(B, S, Hkv, D), torch.zeros(B, S, Hkv, D)
    slots, start = torch.arange(B), torch.tensor([2, 5])
    q = torch.randn(B, T, Hq, D)
    plan = reference.plan_tree_attention(slots, start, 0, None, 8, T, S)
    out = reference.tree_attention(q, kc, vc, slots, start, 0, None, 8, 0.5, plan=plan)
    assert torch.equal(out, reference.tree_attention(q, kc, vc, slots, start, 0, None, 8, 0.5))
    with pytest.raises(ValueError, match="plan was built for"):
        reference.tree_attention(q, kc, vc, slots, start, 0, None, 9, 0.5, plan=plan)
    with pytest.raises(ValueError, match="plan was built for"):
        reference.tree_attention(q[:, :2], kc, vc, slots, start, 0, None, 8, 0.5, plan=plan)
    fast_plan = fast.plan_tree_attention(slots, start, 0, None, 8, T, S)
    with pytest.raises(ValueError, match="built by 'fast'"):
        reference.tree_attention(q, kc, vc, slots, start, 0, None, 8, 0.5, plan=fast_plan)
    with pytest.raises(TypeError, match="TreeAttentionPlan"):
        reference.tree_attention(q, kc, vc, slots, start, 0, None, 8, 0.5, plan={"visible": None})
    with pytest.raises(ValueError, match="attn_len=17 exceeds"):
        reference.plan_tree_attention(slots, start, 0, None, 17, T, S)


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
