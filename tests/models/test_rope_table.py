"""The cached rope table: its rows are `rope_cos_sin`'s values bit for bit, its build does not depend on the thread
count, a forward with a KV cache looks its positions up in the table of the cache's length (the last position
included) in one kernel, and the result is the cache-free forward's."""
import pytest
import torch

import reference
from specdec.bench.suites.kernel_count import KernelCounter
from specdec.kv_cache import KVCache
from specdec.models import AttentionMetadata, random_eagle3_head, random_eagle_head, random_llama, random_mtp
from specdec.models import rope
from specdec.models.dflash import random_dflash
from specdec.models.rope import normalize_rope_scaling, rope_cos_sin, rope_table

#: (head_dim, theta, rope_scaling): odd and even head dims, each rope type (yarn scales cos and sin)
ROPES = [
    (8, 10000.0, None),
    (6, 10000.0, None),
    (64, 10000.0, None),
    (128, 500000.0, None),
    (16, 10000.0, {"rope_type": "linear", "factor": 2.0}),
    (32, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64}),
    (64, 10000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}),
]


def _bits(t):
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("head_dim, theta, scaling", ROPES)
@pytest.mark.parametrize("length", [7, 96, 4097])
def test_a_lookup_is_rope_cos_sin_bit_for_bit(head_dim, theta, scaling, length):
    """Positions spread over the whole table, in batches of several shapes and one at a time (a short tensor
    could take another code path than the long one the table was built as): no bit differs."""
    scaling = normalize_rope_scaling(scaling, "test")
    g = torch.Generator().manual_seed(length)
    batches = [torch.randint(0, length, (B, T), generator=g) for B, T in [(1, 1), (3, 1), (2, 5), (4, 17)]]
    batches.append(torch.tensor([[0, length - 1], [length // 2, length - 2]]).clamp(min=0))
    batches += [torch.tensor([[p]]) for p in range(0, length, max(1, length // 40))] + [torch.tensor([[length - 1]])]
    for positions in batches:
        want = rope_cos_sin(positions, head_dim, theta, scaling)
        got = rope_cos_sin(positions, head_dim, theta, scaling, table_len=length)
        for w, x in zip(want, got):
            assert x.shape == w.shape and x.dtype == torch.float32
            assert torch.equal(_bits(x), _bits(w)), (positions, (x - w).abs().max())


def test_cos_and_sin_are_views_of_one_gather_with_the_same_strides():
    """The fused rope kernel reads sin at cos's strides."""
    positions = torch.tensor([[3, 1, 4], [1, 5, 9]])
    with torch.inference_mode():
        rope_cos_sin(positions, 16, 10000.0, table_len=32)  # the table, built outside the count
        with KernelCounter() as counter:
            cos, sin = rope_cos_sin(positions, 16, 10000.0, table_len=32)
    assert counter.num_kernels == 1, counter.kernels
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1
    assert cos.untyped_storage().data_ptr() == sin.untyped_storage().data_ptr()


def test_a_position_past_the_table_is_refused():
    with pytest.raises(IndexError):
        rope_cos_sin(torch.tensor([[0, 12]]), 8, 10000.0, table_len=12)


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="needs several threads to split the build among")
def test_the_build_does_not_depend_on_the_thread_count():
    """A table long enough to be split among threads equals the one built on one thread."""
    build = rope_table.__wrapped__  # uncached
    key = tuple(sorted(normalize_rope_scaling({"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 256}, "test").items()))
    many = build(64, 10000.0, key, torch.device("cpu"), 20000)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = build(64, 10000.0, key, torch.device("cpu"), 20000)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(_bits(many), _bits(one))


def test_the_table_is_cached_once_per_length():
    a = rope_table(8, 10000.0, None, torch.device("cpu"), 40)
    assert rope_table(8, 10000.0, None, torch.device("cpu"), 40) is a
    assert rope_table(8, 10000.0, None, torch.device("cpu"), 41).shape == (41, 16)


# ---- the models' cached forwards -----------------------------------------------------------------------------

N = 11  # the cache's max_seq_len: a prefill of N tokens puts its last one at the table's last row


@pytest.fixture
def lengths(monkeypatch):
    """The table lengths the forwards look up, in order."""
    seen = []
    build = rope.rope_table

    def recording(head_dim, theta, scaling, device, length):
        seen.append(length)
        return build(head_dim, theta, scaling, device, length)

    monkeypatch.setattr(rope, "rope_table", recording)
    return seen


@pytest.fixture(scope="module")
def target():
    return random_llama(vocab_size=64, hidden_size=32, num_hidden_layers=4, seed=3)


def _prefill_meta():
    return AttentionMetadata(torch.tensor([1, 0]), torch.zeros(2, dtype=torch.long), attn_len=N, ops=reference)


def _inputs(V, H=32):
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, V, (2, N), generator=g), torch.arange(N).expand(2, N),
            torch.randn(2, N, H, generator=g))


def _close(a, b):
    assert (a - b).abs().max() <= 1e-4


def test_the_target_reads_the_table_of_its_caches_length(target, lengths):
    ids, positions, _ = _inputs(64)
    cache = KVCache.for_model(target.config, target.config.num_hidden_layers, 2, N, torch.float32, "cpu")
    with torch.inference_mode():
        cached = target(ids, positions, cache, _prefill_meta())
        free = target(ids, positions)
    assert lengths == [N]
    _close(cached.logits, free.logits)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_a_heads_cached_forward_reads_the_table_of_its_caches_length(target, lengths, kind):
    head = random_eagle_head(target, seed=1) if kind == "eagle" else random_eagle3_head(target, seed=1)
    ids, positions, hidden = _inputs(64)
    if kind == "eagle3":
        hidden = hidden.repeat(1, 1, len(head.feature_layers))
    cache = KVCache.for_model(head.config, 1, 2, N, torch.float32, "cpu")
    with torch.inference_mode():
        cached = head(ids, hidden, positions, cache, _prefill_meta())
        free = head(ids, hidden, positions)
    assert lengths == [N]
    _close(cached.hidden, free.hidden)


def test_an_mtp_layers_cached_forward_reads_the_table_of_its_caches_length(target, lengths):
    mtp = random_mtp(target, 2, seed=2)
    ids, positions, hidden = _inputs(64)
    cache = KVCache.for_model(mtp.config, 2, 2, N, torch.float32, "cpu")
    with torch.inference_mode():
        cached = mtp.forward_layer(1, ids, hidden, positions, cache, _prefill_meta())
        free = mtp.forward_layer(1, ids, hidden, positions)
    assert lengths == [N]
    _close(cached.hidden, free.hidden)


def test_dflash_reads_the_table_of_its_caches_length(target, lengths):
    """The context write and the block, whose last slot is the cache's last: both look up the cache's table."""
    model = random_dflash(target, num_layers=1, block_size=4, seed=4)
    Tc, W = N - 4, 4
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(1, Tc, len(model.feature_layers) * 32, generator=g)
    cache = KVCache.for_model(model.config, 1, 1, N, torch.float32, "cpu")
    slots = torch.tensor([0])
    block = torch.tensor([[5, 0, 0, 0]])
    with torch.inference_mode():
        model.write_context(feats, torch.arange(Tc)[None], cache,
                            AttentionMetadata(slots, torch.tensor([0]), attn_len=Tc, ops=reference))
        meta = AttentionMetadata(slots, torch.tensor([Tc]), attn_len=N, ops=reference,
                                 tree_mask=torch.ones(1, W, W, dtype=torch.bool))
        cached = model(block, Tc + torch.arange(W)[None], cache, meta).hidden
        mask = torch.ones(1, W, Tc + W, dtype=torch.bool)
        dense = model.forward_dense(feats, torch.arange(Tc)[None], block, Tc + torch.arange(W)[None], mask)
    assert lengths == [N, N]
    _close(cached, dense)
