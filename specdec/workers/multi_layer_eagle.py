"""MultiLayerEagleWorkerV2: S MTP layers draft a chain (K = 1, W = S + 1), layer k at draft step k."""
from __future__ import annotations

import torch

from ..kv_cache import KVCache
from ..models.layers import AttentionMetadata
from .base import RequestState
from .chain import chain_verify_input
from .speculative import SpeculativeWorkerBase
from .step import EagleVerifyInput, StepOutput
from .verification import DraftProposer, chain_draft_probs


class ChainState(RequestState):
    stream: torch.Tensor | None  # (B, stream_len) int64: tokens by position, the guesses rotated in past the bonus
    hidden_ring: torch.Tensor | None  # (B, 2S+2, H): the target's last hidden states, by position mod 2S+2
    draft_tokens: torch.Tensor | None  # (B, S) int64: the chain d_1..d_S after the bonus token
    chain_probs: torch.Tensor | None  # (B, S, V) fp32: the law each d_k was drawn from (sampled drafting)


class MultiLayerEagleWorkerV2(SpeculativeWorkerBase):
    """Layer k at position t reads (hidden_t, x_{t+k+1}) and predicts x_{t+k+2}.

    Per request the worker keeps, on the device, the token stream by position (committed tokens,
    the bonus, then the current guesses d_1..d_S rotated in past it) and a ring of the target's last
    hidden states. A layer's last k positions consumed guesses, so every draft extend recomputes a
    window that starts S-1 positions before the old committed length: whatever a rejected guess
    made stale is redone (SGLang keeps a pool of past hidden states for the same reason).
    """

    state_type = ChainState

    def __init__(self, target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob=False):
        S = spec.num_steps
        if spec.topk != 1 or spec.num_draft_tokens != S + 1:
            raise ValueError(
                f"MultiLayerEagleWorkerV2 drafts a chain: it needs topk=1 and num_draft_tokens=num_steps+1={S + 1}, "
                f"got topk={spec.topk}, num_draft_tokens={spec.num_draft_tokens}")
        if draft.num_layers != S:
            raise ValueError(f"MultiLayerEagleWorkerV2 uses MTP layer k at draft step k, so the draft needs "
                             f"num_steps={S} layers, got {draft.num_layers}")
        super().__init__(target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob)
        self.draft_cache = KVCache.for_model(draft.config, S, max_batch, max_seq_len, draft.dtype, self.device)
        self.ring_size = 2 * S + 2
        self.stream_len = max_seq_len + 2 * S + 2
        W = S + 1
        # The chain's tree is the same every step: built once for the largest batch, sliced to B.
        (chain_mask, self._chain_retrieve_index, self._chain_next_token,
         self._chain_next_sibling) = chain_verify_input(max_batch, W, self.device)
        self._chain_mask = chain_mask[0]
        self.proposer = DraftProposer(self, self.sampled_verify.samples)

    @property
    def uniforms_per_step(self) -> int:
        """The verify's, then one draw per layer for the next chain (the draft extend draws it) for a sampled draft."""
        return self.proposer.uniforms_per_step(super().uniforms_per_step, self.num_steps)

    # ---- stages ------------------------------------------------------------------------------
    def _write_ring(self, positions, hidden):
        """positions: (B, T) int64; hidden: (B, T, H)."""
        ring = self.state.hidden_ring
        slots = (positions % self.ring_size)[:, :, None].expand_as(hidden)
        ring.scatter_(1, slots, hidden.to(ring.dtype))

    def run_draft_layers(self, start, last, T: int, hidden0, attn_len: int) -> None:
        """Run the S layers over positions start .. start+T-1 (valid up to `last`, per request),
        layer k over the stream shifted by k+1, rotating in each layer's guess at `last`.

        start, last: (B,) int64; hidden0: (B, T, H), the target's hidden states at those positions.
        Sets draft_tokens (B, S): d_1..d_S, the chain after the token at last + 1.
        """
        st = self.state
        B, S = start.shape[0], self.num_steps
        positions = start[:, None] + torch.arange(T, device=self.device)
        meta = AttentionMetadata(st.slots, start, attn_len=attn_len, ops=self.ops)
        rows = torch.arange(B, device=self.device)
        at_last = last - start
        hidden = hidden0
        guesses, q_rows = [], []
        uniforms = self.proposer.uniforms(0, S) if self.state.uniforms is not None else None
        if uniforms is None and self.proposer.active():  # the prefill's extend: drawn here, on the host
            uniforms = self.rng.uniforms(S, self.device)
        for k in range(S):
            ids = st.stream.gather(1, positions + k + 1)
            out = self.draft_model.forward_layer(k, ids, hidden, positions, self.draft_cache, meta,
                                           return_logits=False).hidden
            logits = self.draft_model.layer_logits(k, out[rows, at_last])
            if self.draft_penalties or self.draft_grammar:  # layer k's guess follows d_1 .. d_k on the chain
                chain = torch.cat([st.last_tokens[:, None]] + [g[:, None] for g in guesses], dim=1)
                path = self._chain_mask[None, k:k + 1, :k + 1].expand(B, 1, k + 1)  # the root and d_1 .. d_k
                logits = self.shape_draft_logits(logits, chain, path)
            _, guess, q = self.proposer.propose(logits, 1, None if uniforms is None else uniforms[:, k:k + 1])
            guess = guess[:, 0]
            q_rows.append(q)
            st.stream.scatter_(1, (last + k + 2)[:, None], guess[:, None])
            guesses.append(guess)
            if self.draft_model.chain_hidden_states:
                hidden = out
        st.draft_tokens = torch.stack(guesses, dim=1)
        st.chain_probs = torch.stack(q_rows, dim=1) if q_rows[0] is not None else None

    def draft_extend_for_prefill(self, ids, hidden, positions, tokens) -> None:
        """The stream and the hidden ring start from the prompt and the sampled token; the S layers run over
        the whole prompt."""
        st = self.state
        B, T = ids.shape
        st.stream = torch.zeros(B, self.stream_len, dtype=torch.int64, device=self.device)
        st.stream[:, :T] = ids
        st.stream.scatter_(1, st.seq_lens[:, None], tokens[:, None])
        st.hidden_ring = torch.zeros(B, self.ring_size, hidden.shape[-1], dtype=hidden.dtype, device=self.device)
        R = min(self.ring_size, T)
        recent = (st.seq_lens[:, None] - R + torch.arange(R, device=self.device)).clamp_min(0)
        self._write_ring(recent, hidden.gather(1, recent[:, :, None].expand(-1, -1, hidden.shape[-1])))
        self.run_draft_layers(torch.zeros_like(st.seq_lens), st.seq_lens - 1, T, hidden, attn_len=T)

    def draft(self):
        """The chain: the root, then the S guesses the last extend rotated in."""
        st = self.state
        B, W = st.seq_lens.shape[0], self.num_draft_tokens
        candidates = torch.cat([st.last_tokens[:, None], st.draft_tokens], dim=1)
        positions = st.seq_lens[:, None] + torch.arange(W, device=self.device)
        draft_probs = chain_draft_probs(st.chain_probs, W) if self.proposer.active() else None
        return EagleVerifyInput(candidates, self._chain_mask.expand(B, W, W), positions,
                                self._chain_retrieve_index[:B], self._chain_next_token[:B],
                                self._chain_next_sibling[:B], draft_probs)

    def draft_extend_for_decode(self, step: StepOutput, target_hidden) -> None:
        """Rotate the accepted tokens and target hidden states in, then rerun the S layers over the window."""
        st = self.state
        S, n = self.num_steps, st.seq_lens
        nodes = step.accept_index.clamp_min(0).long()
        j = torch.arange(S + 1, device=self.device)
        # Accepted tokens and the bonus go to positions n+1 .. n+a+1, hidden states to n .. n+a
        # (padded slots write garbage past the committed length, overwritten before being read).
        st.stream.scatter_(1, n[:, None] + 1 + j, step.predict.long()[nodes])
        self._write_ring(n[:, None] + j, target_hidden[nodes])
        start = (n - S + 1).clamp_min(0)
        window = start[:, None] + torch.arange(2 * S, device=self.device)
        ring_index = (window % self.ring_size)[:, :, None].expand(-1, -1, st.hidden_ring.shape[-1])
        hidden0 = st.hidden_ring.gather(1, ring_index)
        last = n + step.accept_lens - 1
        self.run_draft_layers(start, last, 2 * S, hidden0, attn_len=max(self.attn_len(S + 1), 2 * S))
