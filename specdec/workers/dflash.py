"""DFlashWorker: a DFlash drafter proposes a whole block in one forward; the target verifies it as a chain.

Alignment: with committed target length n (x_0..x_{n-1} have target KV and target features) and the last verified
token x_n, the drafter's cache holds the context features' keys and values at positions 0..n-1; the block is
[x_n, mask, ..., mask] at positions n..n+S (S = num_steps, block size S + 1), written as in-flight slots past the
context and attending to all of it and to itself (non-causal); its output at n+j (j >= 1) proposes x_{n+j}. Verify
is the chain [x_n, d_1..d_S] through the base worker's verify, commit, penalties, grammar masks and logprobs. After
it, the target's features of the accepted nodes n_0..n_a (x_n..x_{n+a}) are written as context at n..n+a (the
draft extend, padded to S+1: rows past a write slots the next block overwrites before anything reads them).
"""
from __future__ import annotations

import torch

from ..kv_cache import KVCache
from ..models.layers import AttentionMetadata
from .chain import chain_verify_input
from .speculative import SpeculativeWorkerBase
from .step import EagleVerifyInput, StepOutput
from .verification import DraftProposer, chain_draft_probs


class DFlashWorker(SpeculativeWorkerBase):
    """One block forward per step (`draft`), a context write of the accepted features after verify
    (`draft_extend_for_decode`); fixed shapes, no host sync (the draft's penalties and grammar masks, when asked,
    choose the block's proposals one position after another along the chain)."""

    #: the block position whose output proposes d_1: DFlash's block position 0 holds the root and proposes nothing
    first_proposing = 1

    def __init__(self, target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob=False):
        S = spec.num_steps
        if spec.topk != 1 or spec.num_draft_tokens != S + 1:
            raise ValueError(f"{type(self).__name__} drafts a block verified as a chain: it needs topk=1 and "
                             f"num_draft_tokens=num_steps+1={S + 1}, got topk={spec.topk}, "
                             f"num_draft_tokens={spec.num_draft_tokens}")
        self.check_block(S, getattr(getattr(draft, "config", None), "block_size", None))
        super().__init__(target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob)
        self.draft_cache = KVCache.for_model(draft.config, draft.config.num_hidden_layers, max_batch, max_seq_len,
                                             draft.dtype, self.device)
        self.target_features = draft.feature_layers
        W, Wb = S + 1, self.block_width
        self._chain = chain_verify_input(max_batch, W, self.device)
        self._block_mask = torch.ones(max_batch, Wb, Wb, dtype=torch.bool, device=self.device)
        self._mask_tokens = torch.full((max_batch, Wb - 1), draft.mask_token_id, dtype=torch.int64,
                                       device=self.device)
        self.proposer = DraftProposer(self, self.sampled_verify.samples)

    def check_block(self, S: int, block: int | None) -> None:
        """ValueError when S proposals need a longer block than the drafter was trained on."""
        if block is not None and S + 1 > block:
            raise ValueError(f"block size num_steps+1={S + 1} exceeds the DFlash drafter's trained block_size="
                             f"{block}")

    @property
    def block_width(self) -> int:
        """The drafter's block: the root, then mask tokens, up to the position that proposes d_S."""
        return self.num_steps + self.first_proposing

    @property
    def uniforms_per_step(self) -> int:
        """The verify's, then one draw per block position for a sampled draft."""
        return self.proposer.uniforms_per_step(super().uniforms_per_step, self.num_steps)

    def check_draft(self, target, draft) -> None:
        """The base checks (vocabulary, hidden size), then the drafter's context layers against this target."""
        super().check_draft(target, draft)
        L = target.config.num_hidden_layers
        bad = [i for i in draft.config.target_layer_ids if i > L - 2]
        if bad:
            raise ValueError(f"{draft.label} drafter target_layer_ids {bad} do not fit the target's {L} layers "
                             f"(ids {draft.config.LOWEST_LAYER_ID}..{L - 2})")

    # ---- stages ------------------------------------------------------------------------------
    def _write_context(self, features, start, T: int) -> None:
        """features: (B, T, F * H) the target's at positions start .. start + T - 1 (start (B,) int64)."""
        st = self.state
        positions = start[:, None] + torch.arange(T, device=self.device)
        meta = AttentionMetadata(st.slots, start, attn_len=min(self.len_bound + T, self.cache.max_seq_len),
                                 ops=self.ops)
        self.draft_model.write_context(features, positions, self.draft_cache, meta)

    def draft_extend_for_prefill(self, ids, hidden, positions, tokens) -> None:
        """The prompts' features x_0..x_{n-1} become the context at 0..n-1 (right padding writes past n, where the
        first block overwrites it); the first block is drafted by the first decode step."""
        self._write_context(hidden, torch.zeros_like(self.state.seq_lens), ids.shape[1])

    def draft(self) -> EagleVerifyInput:
        """One forward over the block [root, mask, ...] -> the chain [root, d_1..d_S] to verify."""
        st = self.state
        B, W, Wb = st.seq_lens.shape[0], self.num_draft_tokens, self.block_width
        with self.phase("draft"):
            block = torch.cat([st.last_tokens[:, None], self._mask_tokens[:B]], dim=1)
            positions = st.seq_lens[:, None] + torch.arange(max(W, Wb), device=self.device)
            meta = AttentionMetadata(st.slots, st.seq_lens, attn_len=self.attn_len(Wb), ops=self.ops,
                                     tree_mask=self._block_mask[:B])
            hidden = self.draft_model(block, positions[:, :Wb], self.draft_cache, meta, return_logits=False).hidden
            # block position first_proposing + j - 1 proposes x_{n+j}
            proposals, q_rows = self._propose_block(hidden[:, self.first_proposing:], st.last_tokens)
            candidates = torch.cat([st.last_tokens[:, None], proposals], dim=1)
        mask, retrieve_index, next_token, next_sibling = (t[:B] for t in self._chain)
        draft_probs = None if q_rows is None else chain_draft_probs(q_rows, W)
        return EagleVerifyInput(candidates, mask, positions[:, :W], retrieve_index, next_token, next_sibling,
                                draft_probs)

    def _propose_block(self, hidden, root):
        """hidden: (B, S, H) the outputs of the block positions that propose -> (proposals (B, S), q (B, S, V) or
        None): d_j is the argmax of its logits, or for a sampled draft a draw from its q (`DraftProposer`); where the
        SpecConfig asks, logits j are first shaped along [root, d_1..d_{j-1}] (the draft's penalties and grammar
        masks, `shape_draft_logits`)."""
        logits = self.draft_model.compute_logits(hidden)
        B, S, V = logits.shape
        uniforms = self.proposer.uniforms(0, S)
        if not (self.draft_penalties or self.draft_grammar):
            if uniforms is None:
                return logits.argmax(-1), None
            _, drawn, q = self.proposer.propose(logits.reshape(B * S, V), 1, uniforms)
            return drawn.view(B, S), q.view(B, S, V)
        chain, q_rows = [root[:, None]], []
        for j in range(S):
            path = torch.ones(B, 1, j + 1, dtype=torch.bool, device=self.device)
            shaped = self.shape_draft_logits(logits[:, j], torch.cat(chain, dim=1), path)
            if uniforms is None:
                chain.append(shaped.argmax(-1)[:, None])
                continue
            _, drawn, q = self.proposer.propose(shaped, 1, uniforms[:, j:j + 1])
            chain.append(drawn)
            q_rows.append(q)
        return torch.cat(chain[1:], dim=1), torch.stack(q_rows, dim=1) if q_rows else None

    def draft_extend_for_decode(self, step: StepOutput, target_hidden) -> None:
        """The target's features of the accepted nodes (padded to S+1) become the context at n..n+a."""
        nodes = step.accept_index.clamp_min(0).long()  # padded slots read a stand-in row: overwritten later
        self._write_context(target_hidden[nodes], self.state.seq_lens, self.num_steps + 1)
