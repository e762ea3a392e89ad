"""Preallocated, static-shape KV cache with reusable request slots."""
from __future__ import annotations

import torch


class KVCache:
    """Per layer, k and v of shape (max_batch + 1, max_seq_len, num_kv_heads, head_dim) (the last row: scratch).

    A request owns one row (its slot) from `alloc` until `free`; rows are reused. Writes happen in
    the model's attention at given positions; `commit` moves an accepted path's KV to contiguous
    positions after a tree verify. One extra row, `scratch_slot`, is never handed out: the padded rows
    of a batch replayed at a larger size (CUDA graphs) write there.
    """

    def __init__(self, num_layers, max_batch, max_seq_len, num_kv_heads, head_dim, dtype=torch.float32,
                 device="cpu"):
        # One buffer for every layer's k and v, so a commit is one op over all of them.
        shape = (2, num_layers, max_batch + 1, max_seq_len, num_kv_heads, head_dim)
        try:
            self.kv = torch.zeros(shape, dtype=dtype, device=device)
        except (RuntimeError, MemoryError) as e:  # the allocator speaks in bytes; say which settings asked for them
            gib = torch.Size(shape).numel() * dtype.itemsize / 2 ** 30
            raise ValueError(f"a KV cache for max_batch={max_batch}, max_seq_len={max_seq_len} ({num_layers} layers, "
                             f"{gib:.1f} GiB on {device}) could not be allocated: {str(e).splitlines()[0]}") from None
        self.k = [self.kv[0, i] for i in range(num_layers)]
        self.v = [self.kv[1, i] for i in range(num_layers)]
        self.max_batch = max_batch
        self.scratch_slot = max_batch
        self.max_seq_len = max_seq_len
        self._free = list(range(max_batch))

    @classmethod
    def for_model(cls, config, num_layers, max_batch, max_seq_len, dtype, device):
        return cls(num_layers, max_batch, max_seq_len, config.num_key_value_heads, config.head_dim, dtype, device)

    def layer(self, i):
        return self.k[i], self.v[i]

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise ValueError(f"a batch of {n} requests does not fit: {len(self._free)} of "
                             f"{self.max_batch} cache slots are free")
        taken, self._free = self._free[:n], self._free[n:]
        return taken

    def free(self, slots) -> None:
        for s in slots:
            if s in self._free or not 0 <= s < self.max_batch:
                raise ValueError(f"cache slot {s} is not allocated")
            self._free.append(s)
        self._free.sort()

    def commit(self, ops, slots, seq_lens, accept_index, num_draft_tokens: int) -> None:
        """Move accepted nodes' KV (B, S+1 flat node indices) to slots seq_len .. seq_len + S, every layer."""
        ops.commit_kv_cache(self.kv.flatten(0, 1), slots, seq_lens, accept_index, num_draft_tokens)
