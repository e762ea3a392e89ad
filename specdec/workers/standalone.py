"""StandaloneWorker: SGLang's STANDALONE speculative algorithm, a small causal LM of the target's vocabulary drafting
a chain or a top-K tree from its own tokens and its own KV cache (no target hidden states), through EagleWorkerV2's
tree drafting, tree build, verify, commit, penalties, grammar masks and logprobs."""
from __future__ import annotations

import torch

from ..models.layers import AttentionMetadata
from .eagle import EagleWorkerV2


class LMAsDraftHead:
    """A causal LM seen through a draft head's calling convention (`draft(ids, hidden, positions, cache, meta)`,
    `compute_logits`), the target's hidden states ignored: it reads its own tokens only."""

    def __init__(self, lm):
        self.lm = lm
        self.config = lm.config

    @property
    def dtype(self):
        return self.lm.dtype

    def __call__(self, ids, hidden, positions, cache, meta, return_logits=True):
        return self.lm(ids, positions, cache, meta, return_logits=return_logits)

    def compute_logits(self, hidden):
        return self.lm.compute_logits(hidden)

    def get_output_embeddings(self):
        return self.lm.lm_head


class StandaloneWorker(EagleWorkerV2):
    """The draft LM's slot t holds token x_t, so its committed length runs one ahead of the target's: it holds the
    root (the last verified token), whose KV the target computes only in the next verify. Its prefill reads the
    prompt and the first token; each draft extend reads the accepted tokens and the bonus one position later than an
    EAGLE head would (`draft_offset` = 1); the drafting loop is EagleWorkerV2's."""

    draft_offset = 1
    #: a draft LM reads tokens, not the target's hidden states: only the vocabularies must agree
    draft_matches_target = ("vocab_size",)

    def __init__(self, target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob=False,
                 token_map=None):
        self.draft_cache_layers = draft.config.num_hidden_layers
        super().__init__(target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob, token_map)

    @staticmethod
    def draft_view(draft):
        return LMAsDraftHead(draft)

    def draft_extend_for_prefill(self, ids, hidden, positions, tokens) -> None:
        """The draft LM over the prompt x_0..x_{n-1} and the sampled x_n at positions 0..n; its output at n gives the
        root's top-K children."""
        st = self.state
        B, T = ids.shape
        full = torch.cat([ids, ids[:, :1]], dim=1).scatter(1, st.seq_lens[:, None], tokens[:, None])
        at = torch.arange(T + 1, device=self.device).expand(B, T + 1)
        meta = AttentionMetadata(st.slots, torch.zeros_like(st.seq_lens), attn_len=T + 1, ops=self.ops)
        d_hidden = self.draft_model(full, None, at, self.draft_cache, meta, return_logits=False).hidden
        self._set_next_root_children(d_hidden[torch.arange(B, device=self.device), st.seq_lens])
        self.start_skipping(hidden)
