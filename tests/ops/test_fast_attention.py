"""fast.tree_attention against reference.tree_attention: trees, draft steps, GQA, ragged lengths, dtypes."""
from __future__ import annotations

import pytest
import torch

import reference
from fast.attention import _launch_tree_attention, pack_tree_mask, tree_attention
from tests.helpers.equivalence import assert_equivalent, no_host_sync


def _case(seed, B=2, T=3, Hq=4, Hkv=2, D=64, max_seq=70, write_offset=0, tree=True, dtype=torch.float32):
    """Random cache rows and queries; each request's committed length is random (rarely a multiple of
    a key block); a random tree mask in which every token sees itself."""
    gen = torch.Generator().manual_seed(seed)
    max_batch = 4
    k_cache = torch.randn(max_batch, max_seq, Hkv, D, generator=gen).to(dtype)
    v_cache = torch.randn(max_batch, max_seq, Hkv, D, generator=gen).to(dtype)
    q = torch.randn(B, T, Hq, D, generator=gen).to(dtype)
    slots = torch.randperm(max_batch, generator=gen)[:B]
    L = write_offset + T
    cache_start = torch.randint(0, max_seq - L + 1, (B,), generator=gen)
    mask = None
    if tree:
        mask = torch.rand(B, T, L, generator=gen) < 0.5
        mask[:, torch.arange(T), write_offset + torch.arange(T)] = True
    attn_len = int(cache_start.max()) + L
    return q, k_cache, v_cache, slots, cache_start, write_offset, mask, attn_len, D ** -0.5


CASES = {
    "verify tree": dict(T=16, write_offset=0),
    "draft step": dict(T=4, write_offset=8),
    "draft step, wide in-flight": dict(T=8, write_offset=40, max_seq=120),
    "causal chain": dict(T=5, tree=False),
    "decode T=1, MQA": dict(T=1, Hq=4, Hkv=1, D=128, tree=False),
    "MHA, head_dim 40": dict(Hq=2, Hkv=2, D=40, T=6, max_seq=100),
    "GQA 4, head_dim 128": dict(Hq=8, Hkv=2, D=128, T=3),
    "prefill": dict(T=40, Hq=8, Hkv=2, max_seq=64, tree=False),
    "one request": dict(B=1, T=2),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(CASES))
def test_fast_equals_reference(name, dtype):
    args = _case(list(CASES).index(name), dtype=dtype, **CASES[name])
    ref = reference.tree_attention(*args)
    with no_host_sync():
        out = tree_attention(*args)
    assert_equivalent(ref, out, "attention", dtype)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 8])
def test_key_splits_merge_to_the_same_result(num_splits):
    q, kc, vc, slots, start, wo, mask, attn_len, scale = _case(5, T=4, write_offset=3, max_seq=150)
    ref = reference.tree_attention(q, kc, vc, slots, start, wo, mask, attn_len, scale)
    out = _launch_tree_attention(q, kc, vc, slots, start, wo, mask, scale, num_splits=num_splits)
    assert_equivalent(ref, out, "attention")


@pytest.mark.parametrize("op", [reference.tree_attention, tree_attention])
def test_keys_past_a_requests_length_never_reach_the_output(op):
    """NaN in cache slots past cache_start + write_offset + T (a stale, longer request) stays out."""
    q, kc, vc, slots, start, wo, mask, _, scale = _case(6, T=3, write_offset=2)
    attn_len = kc.shape[1]  # a loose bound: the stale slots are inside the span the op may read
    clean = op(q, kc, vc, slots, start, wo, mask, attn_len, scale)
    for b in range(q.shape[0]):
        end = int(start[b]) + wo + q.shape[1]
        kc[slots[b], end:] = float("nan")
        vc[slots[b], end:] = float("nan")
    out = op(q, kc, vc, slots, start, wo, mask, attn_len, scale)
    assert torch.isfinite(out).all() and torch.equal(out, clean)


def test_the_grid_does_not_depend_on_lengths():
    """The host bound attn_len is not read: a stale (too small) or loose bound gives the same output."""
    q, kc, vc, slots, start, wo, mask, attn_len, scale = _case(7, T=3)
    ref = tree_attention(q, kc, vc, slots, start, wo, mask, attn_len, scale)
    for bound in (1, kc.shape[1]):  # far too small, and the whole cache
        assert torch.equal(tree_attention(q, kc, vc, slots, start, wo, mask, bound, scale), ref)


def test_pack_tree_mask_bits():
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(2, 3, 70, generator=gen) < 0.5
    bits = pack_tree_mask(mask)
    assert bits.shape == (2, 3, 3) and bits.dtype == torch.int32
    unpacked = ((bits.long().unsqueeze(-1) >> torch.arange(32)) & 1).flatten(-2)[..., :70].bool()
    assert torch.equal(unpacked, mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("Hq,Hkv,D,T,write_offset", [(4, 2, 64, 3, 0), (8, 2, 128, 1, 5), (2, 2, 40, 6, 2),
                                                    (4, 1, 64, 16, 0)])
def test_rope_and_kv_write_equal_the_reference(Hq, Hkv, D, T, write_offset, dtype):
    from fast.attention import apply_rope_and_write_kv
    from specdec.models.layers import rope_cos_sin

    gen = torch.Generator().manual_seed(D + T)
    B, max_batch, max_seq = 3, 4, 40
    q = torch.randn(B, T, Hq, D, generator=gen).to(dtype)
    k = torch.randn(B, T, Hkv, D, generator=gen).to(dtype)
    v = torch.randn(B, T, Hkv, D, generator=gen).to(dtype)
    slots = torch.tensor([3, 0, 2])
    cache_start = torch.tensor([0, 7, 21])
    positions = cache_start[:, None] + write_offset + torch.arange(T) + torch.tensor([[0], [3], [1]])
    cos, sin = rope_cos_sin(positions, D, 10000.0)
    caches = [torch.randn(max_batch, max_seq, Hkv, D, generator=gen).to(dtype) for _ in range(2)]
    ref_k, ref_v, fast_k, fast_v = (c.clone() for c in caches + caches)
    ref_q = reference.apply_rope_and_write_kv(q, k, v, cos, sin, ref_k, ref_v, slots, cache_start, write_offset)
    with no_host_sync():
        fast_q = apply_rope_and_write_kv(q, k, v, cos, sin, fast_k, fast_v, slots, cache_start, write_offset)
    assert_equivalent(ref_q, fast_q, "rope", dtype, "q")
    assert_equivalent(ref_k, fast_k, "rope", dtype, "k_cache")
    assert torch.equal(ref_v, fast_v)
    assert not torch.equal(ref_k, caches[0])  # something was written


def _strided(t):
    """The same values through a view of stride 2."""
    return torch.stack([t, torch.zeros_like(t)], -1)[..., 0]


def test_strided_slots_and_cache_start_read_as_the_reference_reads_them():
    """The kernels read slots and cache_start by position: strided views of them must give the reference's
    outputs (they once read the neighbouring elements instead)."""
    from fast.attention import apply_rope_and_write_kv
    from specdec.models.layers import rope_cos_sin

    q, kc, vc, slots, start, wo, mask, attn_len, scale = _case(3, T=4, write_offset=2)
    ref = reference.tree_attention(q, kc, vc, slots, start, wo, mask, attn_len, scale)
    out = tree_attention(q, kc, vc, _strided(slots), _strided(start), wo, mask, attn_len, scale)
    assert_equivalent(ref, out, "attention")

    B, T, Hkv, D = q.shape[0], q.shape[1], kc.shape[2], q.shape[3]
    k, v = torch.randn(B, T, Hkv, D), torch.randn(B, T, Hkv, D)
    cos, sin = rope_cos_sin(start[:, None] + wo + torch.arange(T), D, 10000.0)
    ref_k, ref_v, fast_k, fast_v = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    ref_q = reference.apply_rope_and_write_kv(q, k, v, cos, sin, ref_k, ref_v, slots, start, wo)
    fast_q = apply_rope_and_write_kv(q, k, v, cos, sin, fast_k, fast_v, _strided(slots), _strided(start), wo)
    assert_equivalent(ref_q, fast_q, "rope", torch.float32, "q")
    assert_equivalent(ref_k, fast_k, "rope", torch.float32, "k_cache")
    assert torch.equal(ref_v, fast_v)


def test_a_cache_whose_last_dimension_is_strided_is_a_value_error():
    q, kc, vc, slots, start, wo, mask, attn_len, scale = _case(4)
    strided_cache = kc.transpose(-1, -2).contiguous().transpose(-1, -2)
    with pytest.raises(ValueError, match=r"k_cache's last dimension must be contiguous"):
        tree_attention(q, strided_cache, vc, slots, start, wo, mask, attn_len, scale)


@pytest.mark.parametrize("op", [reference.tree_attention, tree_attention])
def test_attention_bad_input(op):
    q, kc, vc, slots, start, wo, mask, attn_len, scale = _case(0, T=3, write_offset=2)
    good = (q, kc, vc, slots, start, wo, mask, attn_len, scale)

    def call(**change):
        args = dict(zip(["q", "k_cache", "v_cache", "slots", "cache_start", "write_offset", "tree_mask", "attn_len",
                         "scale"], good))
        args.update(change)
        return op(*args.values())

    for change, match in [
        (dict(q=q[0]), "q must have shape"),
        (dict(k_cache=kc[..., :32], v_cache=vc[..., :32]), "head_dim 32 differs"),
        (dict(v_cache=vc[:, :10]), "differ in shape"),
        (dict(q=q[:, :, :3]), "not a multiple of the cache's 2 KV heads"),
        (dict(slots=slots[:1]), "slots must have shape"),
        (dict(cache_start=start.float()), "cache_start must have an integer dtype"),
        (dict(tree_mask=mask[:, :, :-1]), "tree_mask must have shape"),
        (dict(tree_mask=mask.int()), "tree_mask must have a bool dtype"),
        (dict(attn_len=10_000), "attn_len=10000 exceeds"),
        (dict(write_offset=-1), "write_offset must be an int >= 0"),
        (dict(scale=0.0), "scale must be a positive float"),
    ]:
        with pytest.raises((ValueError, TypeError), match=match):
            call(**change)


@pytest.mark.parametrize("op", [reference.apply_rope_and_write_kv, "fast"])
def test_rope_and_kv_write_bad_input(op):
    from fast.attention import apply_rope_and_write_kv
    from specdec.models.layers import rope_cos_sin
    op = apply_rope_and_write_kv if op == "fast" else op
    q, k = torch.zeros(2, 3, 4, 8), torch.zeros(2, 3, 2, 8)
    cos, sin = rope_cos_sin(torch.zeros(2, 3, dtype=torch.long), 8, 10000.0)
    caches = [torch.zeros(4, 16, 2, 8) for _ in range(2)]
    slots, start = torch.tensor([0, 1]), torch.tensor([0, 2])
    with pytest.raises(ValueError, match="k must have shape"):
        op(q, k[:, :, :1], k, cos, sin, *caches, slots, start, 0)
    with pytest.raises(ValueError, match="cos must have shape"):
        op(q, k, k, cos[:, :2], sin, *caches, slots, start, 0)
    with pytest.raises(ValueError, match="exceed the cache's 16 slots"):
        op(q, k, k, cos, sin, *caches, slots, start, 14)
    with pytest.raises(ValueError, match="cache_start must have shape"):
        op(q, k, k, cos, sin, *caches, slots, start[:1], 0)
