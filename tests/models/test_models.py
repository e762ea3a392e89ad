"""The target model's forward: incremental decoding against the full forward, tree attention against each
branch alone, the KV commit, the attention plan's checks, and the CPU linear backend."""

import importlib

import pytest
import torch

import reference

from specdec.kv_cache import KVCache
from specdec.models import (AttentionMetadata, random_llama)


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


def test_a_model_built_under_inference_mode_runs_on_either_backend():
    """Weights made under torch.inference_mode are inference tensors, which keep no version counter: the oneDNN
    path's packed copy must not ask for one (a RuntimeError before)."""
    from specdec.models import linear
    try:
        for mode in ("onednn", "mkl"):
            linear.set_cpu_linear_backend(mode)
            with torch.inference_mode():
                lin = linear.Linear(48, 37, bias=False)
                x = torch.randn(4, 48)
                torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight), rtol=1e-5, atol=1e-5)
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
        for rows in (3, 4, 3, 1, 9, 16, 2, 1500, 5000):
            x = torch.randn(rows, 40)
            torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias), rtol=1e-5,
                                       atol=1e-5)
    # buckets 4 (3, 4, 3), 1, 16 (9, 16), 2, and the largest measured for every longer product (1500, 5000)
    assert measured == [4, 1, 16, 2, linear.MEASURED_ROWS_MAX]
    assert set(linear.cpu_linear_choices()) == {(24, 40, True, b) for b in (1, 2, 4, 16, linear.MEASURED_ROWS_MAX)}
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


@pytest.mark.parametrize("out_features,in_features", [(8, 16), (384, 128), (128, 344), (3, 1000), (258, 5)])
def test_one_row_without_bias_is_bitwise_f_linear(out_features, in_features, monkeypatch):
    """A decode step's products (one row, no bias) take torch.mv: the same bits as F.linear, 1-D to 3-D inputs."""
    from specdec.models import linear
    torch.manual_seed(out_features)
    lin = linear.Linear(in_features, out_features, bias=False)
    calls = []
    mv = torch.mv
    monkeypatch.setattr(torch, "mv", lambda *a: calls.append(1) or mv(*a))
    linear.set_cpu_linear_backend("mkl")
    try:
        with torch.inference_mode():
            for shape in ((in_features,), (1, in_features), (1, 1, in_features)):
                x = torch.randn(shape)
                ref = torch.nn.functional.linear(x, lin.weight)
                y = lin(x)
                assert y.shape == ref.shape and torch.equal(y, ref)
    finally:
        linear.set_cpu_linear_backend("auto")
    assert len(calls) == 3


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


def _attention_per_token(q, kc, vc, slot, start, write_offset, tree_mask, scale):
    """One request's attention written out token by token: q (T, Hq, D) over its committed keys and the in-flight
    ones its tree row (or causality) lets it see -> (T, Hq, D)."""
    T, Hq, D = q.shape
    group = Hq // kc.shape[2]
    out = torch.empty_like(q)
    for t in range(T):
        seen = [r for r in range(write_offset + T)
                if (tree_mask[t, r] if tree_mask is not None else r <= write_offset + t)]
        cols = list(range(start)) + [start + r for r in seen]
        for h in range(Hq):
            keys, values = kc[slot, cols, h // group], vc[slot, cols, h // group]
            out[t, h] = torch.softmax(keys @ q[t, h] * scale, 0) @ values
    return out


@pytest.mark.parametrize("T, tree, spare", [(1, False, 0), (1, False, 3), (4, True, 0), (4, False, 2), (1, True, 0)])
def test_one_requests_attention_equals_it_written_out_per_token(T, tree, spare):
    """reference.tree_attention for one request, causal or over a tree, with an exact attn_len or one `spare` keys
    too long: the output equals attention written out per token, and the NaN the cache holds past the request and
    in the other slots does not reach it."""
    Hq, Hkv, D, S, start, wo = 4, 2, 8, 24, 6, 1
    g = torch.Generator().manual_seed(T + spare)
    kc, vc = torch.full((3, S, Hkv, D), float("nan")), torch.full((3, S, Hkv, D), float("nan"))
    slot = 2
    n = start + wo + T
    kc[slot, :n], vc[slot, :n] = torch.randn(n, Hkv, D, generator=g), torch.randn(n, Hkv, D, generator=g)
    q = torch.randn(1, T, Hq, D, generator=g)
    mask = None
    if tree:  # random ancestors; every token sees itself
        mask = torch.rand(1, T, wo + T, generator=g) < 0.6
        mask[0, torch.arange(T), wo + torch.arange(T)] = True
    slots, starts = torch.tensor([slot]), torch.tensor([start])
    out = reference.tree_attention(q, kc, vc, slots, starts, wo, mask, n + spare, 0.3)
    expected = _attention_per_token(q[0], kc, vc, slot, start, wo, None if mask is None else mask[0], 0.3)
    torch.testing.assert_close(out[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_a_plan_checks_each_new_argument_signature(impl):
    """A plan remembers the argument shapes its ops were checked with (each layer of a forward repeats them); a call
    whose tensors differ in shape, dtype or device is checked again, after any number of good calls."""
    ops = importlib.import_module(impl)
    B, T, Hq, Hkv, D, S = 2, 3, 4, 2, 8, 16
    kc, vc = torch.zeros(B, S, Hkv, D), torch.zeros(B, S, Hkv, D)
    slots, start = torch.arange(B), torch.tensor([2, 5])
    q, k, v = torch.randn(B, T, Hq, D), torch.randn(B, T, Hkv, D), torch.randn(B, T, Hkv, D)
    cos, sin = torch.ones(B, T, D), torch.zeros(B, T, D)
    plan = ops.plan_tree_attention(slots, start, 0, None, 8, T, S)
    for _ in range(2):
        ops.apply_rope_and_write_kv(q, k, v, cos, sin, kc, vc, slots, start, 0, plan=plan)
        ops.tree_attention(q, kc, vc, slots, start, 0, None, 8, 0.5, plan=plan)
    assert set(plan.checked) == {"apply_rope_and_write_kv", "tree_attention"}
    with pytest.raises(ValueError, match="k must have shape"):
        ops.apply_rope_and_write_kv(q, k[:, :, :1], v, cos, sin, kc, vc, slots, start, 0, plan=plan)
    with pytest.raises(TypeError, match="sin must have a floating"):
        ops.apply_rope_and_write_kv(q, k, v, cos, sin.long(), kc, vc, slots, start, 0, plan=plan)
    with pytest.raises(TypeError, match="float"):
        ops.tree_attention(q, kc.long(), vc.long(), slots, start, 0, None, 8, 0.5, plan=plan)
    with pytest.raises(ValueError, match="scale must be a positive"):
        ops.tree_attention(q, kc, vc, slots, start, 0, None, 8, -1.0, plan=plan)
    ops.tree_attention(q, kc, vc, slots, start, 0, None, 8, 0.5, plan=plan)  # the remembered signature still passes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_rope_is_rotate_half_bit_for_bit(dtype):
    """The reference op's roll-and-signed-sine rotation against Hugging Face's rotate-half formula written out
    (cat(-x2, x1); x·cos + rotated·sin as one addcmul, which may fuse the multiply-add as the op's does), q and
    the k it writes to the cache, fp32 math cast back; and a second forward's new angles are not served from the
    first's."""
    torch.manual_seed(0)
    B, T, Hq, Hkv, D, S = 2, 3, 4, 2, 16, 12

    def rotate_half(x, cos, sin):
        xf, half = x.float(), x.shape[-1] // 2
        rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
        return torch.addcmul(xf * cos[:, :, None], rotated, sin[:, :, None]).to(x.dtype)

    slots, start = torch.tensor([1, 0]), torch.tensor([4, 2])
    plan = reference.plan_tree_attention(slots, start, 0, None, 8, T, S)
    for _ in range(2):
        q, k, v = (torch.randn(B, T, H, D).to(dtype) for H in (Hq, Hkv, Hkv))
        angles = torch.randn(B, T, D // 2) * 3
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
        kc, vc = torch.zeros(B, S, Hkv, D, dtype=dtype), torch.zeros(B, S, Hkv, D, dtype=dtype)
        q_rot = reference.apply_rope_and_write_kv(q, k, v, cos, sin, kc, vc, slots, start, 0, plan=plan)
        assert torch.equal(q_rot, rotate_half(q, cos, sin))
        for b in range(B):
            rows = slice(int(start[b]), int(start[b]) + T)
            assert torch.equal(kc[slots[b], rows], rotate_half(k, cos, sin)[b])
            assert torch.equal(vc[slots[b], rows], v[b])
