"""commit_kv_cache: reference against an independent per-entry loop, fast against reference (bit-equal)."""
from __future__ import annotations

import inspect
import random

import pytest
import torch

import reference
from fast.kv import commit_kv_cache as fast_commit
from tests.helpers.equivalence import assert_equivalent, no_host_sync


def _case(seed, B=3, S=4, W=9, N=4, max_batch=5, max_seq=40, Hkv=2, D=6, dtype=torch.float32):
    """A cache of distinct values and, per request, a random accepted path: strictly increasing node
    indices starting at the root (node i_j >= j, as a tree whose parents precede children gives), padded."""
    rng = random.Random(seed)
    kv = torch.randn(N, max_batch, max_seq, Hkv, D, generator=torch.Generator().manual_seed(seed)).to(dtype)
    slots = torch.tensor(rng.sample(range(max_batch), B), dtype=torch.int64)
    seq_lens = torch.tensor([rng.randrange(0, max_seq - W) for _ in range(B)], dtype=torch.int64)
    accept = torch.full((B, S + 1), -1, dtype=torch.int32)
    for b in range(B):
        a = rng.randrange(0, S + 1)
        nodes = [0] + sorted(rng.sample(range(1, W), a))
        for j, i in enumerate(nodes):
            accept[b, j] = b * W + i
    return kv, slots, seq_lens, accept, W


def _loop_commit(kv, slots, seq_lens, accept, W):
    """Independent definition: read every accepted node's entry first, then write it at seq_len + j."""
    out = kv.clone()
    for b in range(accept.shape[0]):
        moves = [(j, int(i) - b * W) for j, i in enumerate(accept[b].tolist()) if i >= 0]
        saved = {j: kv[:, int(slots[b]), int(seq_lens[b]) + i].clone() for j, i in moves}
        for j, value in saved.items():
            out[:, int(slots[b]), int(seq_lens[b]) + j] = value
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", range(4))
def test_commit_reference_and_fast_equal_an_entry_loop(seed, dtype):
    kv, slots, seq_lens, accept, W = _case(seed, dtype=dtype)
    expected = _loop_commit(kv, slots, seq_lens, accept, W)
    ref, fst = kv.clone(), kv.clone()
    reference.commit_kv_cache(ref, slots, seq_lens, accept, W)
    with no_host_sync():
        fast_commit(fst, slots, seq_lens, accept, W)
    assert torch.equal(ref, expected)
    assert_equivalent(ref, fst, "kv", dtype)
    moved = sum(int(i) - b * W != j for b in range(accept.shape[0]) for j, i in enumerate(accept[b].tolist())
                if i >= 0)
    assert moved > 0 and not torch.equal(expected, kv)  # the case moves something


def test_chain_of_overlapping_moves():
    """Node j+1 moves onto node j's old slot, for every j: only ascending order gets this right."""
    kv, slots, seq_lens, _, _ = _case(7, B=1, S=5, W=12)
    accept = torch.tensor([[0, 2, 3, 4, 5, 6]], dtype=torch.int32)
    expected = _loop_commit(kv, slots, seq_lens, accept, 12)
    fst = kv.clone()
    fast_commit(fst, slots, seq_lens, accept, 12)
    assert torch.equal(fst, expected)


def test_strided_slots_seq_lens_and_accept_index():
    """The kernel reads slots, seq_lens and accept_index by position: strided views of each must commit what the
    entry loop commits (slots and seq_lens once read their neighbours)."""
    kv, slots, seq_lens, accept, W = _case(7)

    def strided(t):
        return torch.stack([t, torch.zeros_like(t)], -1)[..., 0]

    want = _loop_commit(kv, slots, seq_lens, accept, W)
    fast_commit(kv, strided(slots), strided(seq_lens), strided(accept), W)
    assert torch.equal(kv, want)


def test_large_rows_and_a_strided_cache():
    """(Hkv, D) rows larger than one block, and a cache that is a batch-sliced view of a bigger buffer."""
    big = torch.randn(2, 6, 20, 4, 320)
    outside = big[:, [0, 5]].clone()
    kv = big[:, 1:5]
    slots = torch.tensor([3, 0])
    seq_lens = torch.tensor([4, 9])
    accept = torch.tensor([[0, 3, -1], [5, 7, 8]], dtype=torch.int32)
    expected = _loop_commit(kv, slots, seq_lens, accept, 5)
    fast_commit(kv, slots, seq_lens, accept, 5)
    assert torch.equal(kv, expected)
    assert torch.equal(big[:, [0, 5]], outside)  # rows outside the view are untouched


@pytest.mark.parametrize("op", [reference.commit_kv_cache, fast_commit])
def test_commit_bad_input(op):
    kv, slots, seq_lens, accept, W = _case(0)
    with pytest.raises(ValueError, match="kv must have shape"):
        op(kv[0], slots, seq_lens, accept, W)
    with pytest.raises(ValueError, match="seq_lens must have shape"):
        op(kv, slots, seq_lens[:2], accept, W)
    with pytest.raises(TypeError, match="accept_index must have an integer dtype"):
        op(kv, slots, seq_lens, accept.float(), W)
    with pytest.raises(ValueError, match="num_draft_tokens must be an int >= 1"):
        op(kv, slots, seq_lens, accept, 0)
    with pytest.raises(TypeError, match="num_draft_tokens must be an int"):
        op(kv, slots, seq_lens, accept, 9.0)


def test_same_signature():
    assert inspect.signature(fast_commit) == inspect.signature(reference.commit_kv_cache)
