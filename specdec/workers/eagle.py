"""EagleWorkerV2: one draft layer, top-K tree drafting, tree verification (K >= 1, general trees)."""
from __future__ import annotations

import torch

from ..config import SpecConfig
from ..ops.contract import NO_DRAFT
from ..kv_cache import KVCache
from ..models.layers import AttentionMetadata
from .base import RequestState
from .speculative import SpeculativeWorkerBase
from .step import EagleVerifyInput, StepOutput
from .hot_vocab import HotVocabDraft
from .verification import DraftProposer, tree_draft_probs

#: how a NO_DRAFT step runs: a one-node tree, its accepted path padded to the one draft step it cannot take
_ROOT_ONLY = (1, 1, 1)


class EagleState(RequestState):
    """The first draft step's input, left by the last extend: the root's children and the draft's output there."""

    topk_p: torch.Tensor | None  # (B, K) fp32: the K most probable draft tokens' probabilities, best first
    topk_index: torch.Tensor | None  # (B, K) int64: those tokens (K: the largest topk of the allowed shapes)
    draft_hidden: torch.Tensor | None  # (B, H): the draft's output hidden state at the last committed position
    root_probs: torch.Tensor | None  # (B, V') fp32: the law the root's children were drawn from (sampled drafting)
    # NO_DRAFT steps leave the draft behind; what its catch-up extend reads (`catch_up_draft`), newest last:
    skipped_hidden: torch.Tensor | None  # (B, P, H') the target's hidden states (or features) at those steps' roots
    skipped_tokens: torch.Tensor | None  # (B, P) int64: the token each of those steps committed


class EagleWorkerV2(SpeculativeWorkerBase):
    """Per request the draft keeps the same committed length as the target. Draft step i writes its
    K frontier nodes into draft-cache slots past the committed length (slot i*K + k), each attending
    only its true ancestors; the verify tree's W nodes go to target slots by node index."""

    #: how many positions the draft's committed length runs ahead of the target's: an EAGLE head's slot t holds
    #: (h_t, x_{t+1}), so 0; a draft LM's slot t holds x_t, the root included, so 1 (StandaloneWorker)
    draft_offset = 0
    state_type = EagleState
    #: the draft's decoder layers, each with its own KV cache layer
    draft_cache_layers = 1
    #: the most NO_DRAFT steps in a row the draft skips before one catch-up extend over them all (`catch_up_draft`):
    #: a catch-up's cost grows slowly with k (the small pair at B = 1, one thread:
    #: `results/no-draft-20261204/catchup_cost.txt`), so a long run of no-draft steps pays little per step for it
    max_skipped_steps = 32

    def __init__(self, target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob=False,
                 token_map: torch.Tensor | None = None):
        super().__init__(target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob)
        self.draft_cache = KVCache.for_model(draft.config, self.draft_cache_layers, max_batch,
                                             max_seq_len + self.draft_offset, draft.dtype, self.device)
        self.draft_model = self.draft_view(draft)
        if token_map is not None:  # (n,) int64 checked target ids (`specdec.token_map`): a hot-vocabulary LM head
            self.draft_model = HotVocabDraft(self.draft_model, token_map)
        # EAGLE-3 heads read target features from several layers; they and a token map's head propose ids of a
        # reduced vocabulary: the same algorithm, with the features asked of the target and the ids mapped after
        # each top-K
        self.target_features = getattr(draft, "feature_layers", None)
        self._draft_to_target = getattr(self.draft_model, "draft_to_target", None)
        to_target = None
        self.draft_vocab_size = getattr(self.draft_model, "draft_vocab_size", draft.config.vocab_size)
        if self._draft_to_target is not None:
            to_target = self._draft_to_target(torch.arange(self.draft_vocab_size, device=self.device))
            self.draft_vocab_ids = to_target.cpu()  # for masking its proposals by a grammar
        self.proposer = DraftProposer(self, self.sampled_verify.samples, to_target)
        self.max_batch = max_batch
        self.skipped_steps = 0  # host: NO_DRAFT steps since the draft's last extend
        self.allow_shapes([spec])

    @staticmethod
    def draft_view(draft):
        """What the worker calls as its draft: the head itself (`draft(ids, hidden, positions, cache, meta)`,
        `compute_logits`)."""
        return draft

    # ---- step shapes -------------------------------------------------------------------------

    def allow_shapes(self, specs: list[SpecConfig], no_draft: bool = False) -> None:
        """The shapes `use_shape` may switch among between steps (a tuned or adaptive engine's; the worker's own
        `spec` must be one of them), and `NO_DRAFT` when `no_draft`. Sizes what depends on the largest of them:
        the root's children (the largest topk, best first: a smaller topk reads their head), the in-flight draft
        slots, the cache margin and the host's length bound. Call before `prefill`."""
        self.keep_shapes(specs, no_draft)
        self.max_topk = max(s.topk for s in specs)
        self._max_step_tokens = max(s.num_steps for s in specs) + 1
        self._kv_margin = max(self.draft_kind.kv_margin(s) for s in specs)
        # Row j marks in-flight draft slot j itself; a frontier node's ancestry is its parent's | its own row.
        inflight = max(max(s.num_steps - 1, 1) * s.topk for s in specs)
        self._own_slot = torch.eye(inflight, dtype=torch.bool, device=self.device)
        # every frontier node's path starts at the root (the drafts' penalties and grammar masks read it)
        self._root_column = torch.ones(self.max_batch, self.max_topk, 1, dtype=torch.bool, device=self.device)
        if no_draft:  # a NO_DRAFT step's one-node tree: its mask, its row of the verify, no child nor sibling
            self._root_only = (torch.ones(self.max_batch, 1, 1, dtype=torch.bool, device=self.device),
                               torch.arange(self.max_batch, device=self.device)[:, None],
                               torch.full((self.max_batch, 1), -1, dtype=torch.int64, device=self.device))

    def check_shape(self, spec: SpecConfig) -> None:
        """ValueError when this draft cannot draft `spec` (a topk beyond the draft's vocabulary)."""
        if spec.topk > self.draft_vocab_size:
            raise ValueError(f"topk={spec.topk} exceeds the draft's vocabulary of {self.draft_vocab_size} ids")

    def use_shape(self, shape: tuple[int, int, int]) -> None:
        """The next decode step's (num_steps, topk, num_draft_tokens), one of `shapes` (ValueError otherwise).
        Host side, between steps: each shape is one fixed-shape step body (one CUDA graph per batch bucket)."""
        shape = self.allowed_shape(shape)
        self.num_steps, self.topk, self.num_draft_tokens = _ROOT_ONLY if shape == NO_DRAFT else shape

    @property
    def step_shape(self) -> tuple:
        return (self.num_steps, self.topk, self.num_draft_tokens)

    @property
    def kv_margin(self) -> int:
        return self._kv_margin

    @property
    def max_step_tokens(self) -> int:
        # the largest allowed shape's: the host's length bound stays valid whichever shape a step ran
        return self._max_step_tokens

    # ---- stages ------------------------------------------------------------------------------

    def draft_extend_for_prefill(self, ids, hidden, positions, tokens) -> None:
        """The prompt shifted left by one, the sampled token appended at n-1, paired with h_0..h_{n-1}; the
        output at n-1 gives the root's top-K children."""
        st = self.state
        last = st.seq_lens - 1
        B, T = ids.shape
        shifted = torch.cat([ids[:, 1:], ids[:, :1]], dim=1).scatter(1, last[:, None], tokens[:, None])
        meta = AttentionMetadata(st.slots, torch.zeros_like(st.seq_lens), attn_len=T, ops=self.ops)
        d_hidden = self.draft_model(shifted, hidden, positions, self.draft_cache, meta, return_logits=False).hidden
        self._set_next_root_children(d_hidden[torch.arange(B, device=self.device), last])
        self.start_skipping(hidden)

    def start_skipping(self, hidden: torch.Tensor) -> None:
        """After the prefill extend: nothing skipped yet, and where NO_DRAFT is allowed, the buffers its steps fill
        (set before the first decode step: a CUDA graph's static copy carries the state's fields as they are then).
        hidden: (B, T, H') the prefill's target hidden states (or features), whose width and dtype the buffer takes."""
        st = self.state
        self.skipped_steps = 0
        if NO_DRAFT in self.shapes:
            B, P = st.seq_lens.shape[0], self.max_skipped_steps
            st.skipped_hidden = hidden.new_zeros(B, P, hidden.shape[-1])
            st.skipped_tokens = torch.zeros(B, P, dtype=torch.int64, device=self.device)

    def _draft_lens(self):
        """(B,) int64: the draft's committed length (the target's, plus `draft_offset`)."""
        return self.state.seq_lens + self.draft_offset if self.draft_offset else self.state.seq_lens

    def _set_next_root_children(self, hidden, uniforms=None):
        """hidden: (B, H), the draft's output at each request's last committed position; uniforms: (B, max_topk)
        for the draws of a sampled draft (`DraftProposer.active`), None otherwise (then drawn here, on the host:
        the prefill's and a catch-up's extend run outside the captured step)."""
        st = self.state
        if uniforms is None and self.proposer.active():
            uniforms = self.rng.uniforms(self.max_topk, self.device)
        logits = self.shape_draft_logits(self.draft_model.compute_logits(hidden), st.last_tokens[:, None], None)
        st.topk_p, st.topk_index, st.root_probs = self._draft_topk(logits, self.max_topk, uniforms)
        st.draft_hidden = hidden

    def _draft_topk(self, logits, K, uniforms):
        """The draft's K proposals per row (`DraftProposer.propose`), ids mapped to target ids (EAGLE-3's d2t) when
        it has a map -> (scores, target ids, q over the draft's vocabulary or None)."""
        p, index, q = self.proposer.propose(logits, K, uniforms)
        return p, index if self._draft_to_target is None else self._draft_to_target(index), q

    # ---- the step's uniforms: the verify's (base), then a sampled draft's: the frontier's, the next root's ----
    @property
    def uniforms_per_step(self) -> int:
        return self.proposer.uniforms_per_step(super().uniforms_per_step, self._frontier_draws + self.max_topk)

    @property
    def _frontier_draws(self) -> int:
        """A sampled draft's draws at the frontier nodes (K per node, K nodes per draft step after the first); the
        next root's `max_topk` draws follow them in the step's uniforms."""
        return max(self.num_steps - 1, 0) * self.topk * self.topk

    def draft_forward(self, q_list: list | None = None):
        """S draft steps of select_top_k_tokens + draft forward -> the lists organize_draft_results takes. q_list: a
        list that a sampled draft fills with each expanded node's q ((B, R, V') rows, the root first), or None."""
        st = self.state
        B, K, S = st.seq_lens.shape[0], self.topk, self.num_steps
        draft_lens = self._draft_lens()
        topk_p, topk_index, hidden, scores = st.topk_p, st.topk_index, st.draft_hidden, None
        if K < self.max_topk:  # the root's K best children: the head of the largest topk's, best first
            topk_p, topk_index = topk_p[:, :K].contiguous(), topk_index[:, :K].contiguous()
        score_list, token_list, parents_list = [], [], []
        if q_list is not None and self.proposer.active():
            q_list.append(st.root_probs[:, None])
        own = self._own_slot
        n_inflight = own.shape[0]
        ancestry = None  # (B, K, n_inflight): in-flight draft slots each frontier node attends
        slot_tokens = [st.last_tokens[:, None]]  # the root, then each step's frontier tokens by in-flight slot
        for i in range(S):
            input_ids, hidden, scores, (step_scores, step_tokens, parents) = self.ops.select_top_k_tokens(
                i, topk_p, topk_index, hidden, scores, K)
            slot_tokens.append(input_ids.view(B, K))
            score_list.append(step_scores)
            token_list.append(step_tokens)
            parents_list.append(parents)
            if i == S - 1:
                break
            mine = own[i * K:(i + 1) * K][None].expand(B, K, n_inflight)
            if i == 0:
                ancestry = mine
            else:
                parent_frontier = (parents - (K * K * (i - 1) + K)) // K  # (B, K) index into last frontier
                ancestry = ancestry.gather(1, parent_frontier[:, :, None].expand(B, K, n_inflight)) | mine
            meta = AttentionMetadata(st.slots, draft_lens, attn_len=self.attn_len((i + 1) * K + self.draft_offset),
                                     ops=self.ops, write_offset=i * K,
                                     tree_mask=ancestry[:, :, :(i + 1) * K].contiguous())
            positions = (draft_lens + i)[:, None].expand(B, K)
            out = self.draft_model(input_ids.view(B, K), hidden.view(B, K, -1), positions, self.draft_cache, meta)
            logits, hidden = out.logits.view(B * K, -1), out.hidden
            if self.draft_penalties or self.draft_grammar:  # each frontier node's path: the root, its ancestry
                path = torch.cat([self._root_column[:B], ancestry[:, :, :(i + 1) * K]], dim=2)
                tokens = torch.cat(slot_tokens, dim=1)
                logits = self.shape_draft_logits(logits, tokens, path)
            topk_p, topk_index, q = self._draft_topk(logits, K, self.proposer.uniforms(i * K * K, K * K))
            if q is not None and q_list is not None:
                q_list.append(q.view(B, K, -1))
            hidden = hidden.reshape(B * K, -1)
        return score_list, token_list, parents_list

    def draft_extend_for_decode(self, step: StepOutput, target_hidden) -> None:
        """Draft forward over the accepted path (padded to S+1): (h[n_j], predict[n_j]) at position n+j. Its output
        at n+a gives the next root's top-K children. A NO_DRAFT step runs none: it keeps its root's (h, token) for
        `catch_up_draft`."""
        st = self.state
        B = st.seq_lens.shape[0]
        if self.num_draft_tokens == 1:
            # no draft: keep the root's (h, token) for one catch-up extend when drafting resumes, since a one-token
            # draft forward per step would make a no-draft step dearer than target-only decoding's
            st.skipped_hidden = torch.cat([st.skipped_hidden[:, 1:], target_hidden.view(B, 1, -1)], dim=1)
            st.skipped_tokens = torch.cat([st.skipped_tokens[:, 1:], step.predict.long().view(B, 1)], dim=1)
            return
        n = self.num_steps + 1
        nodes = step.accept_index[:, :n].clamp_min(0).long()  # padded slots reuse the root: garbage past n+a
        ids = step.predict.long()[nodes]
        hidden = target_hidden[nodes]
        draft_lens = self._draft_lens()
        positions = draft_lens[:, None] + torch.arange(n, device=self.device)
        meta = AttentionMetadata(st.slots, draft_lens, attn_len=self.attn_len(n + self.draft_offset), ops=self.ops)
        d_hidden = self.draft_model(ids, hidden, positions, self.draft_cache, meta, return_logits=False).hidden
        last = (step.accept_lens - 1).long()
        self._set_next_root_children(d_hidden[torch.arange(B, device=self.device), last],
                                     self.proposer.uniforms(self._frontier_draws, self.max_topk))

    def prepare_decode(self) -> None:
        """Host side, before the body: the draft catches up on the skipped NO_DRAFT steps before a drafting step, or
        when `max_skipped_steps` of them fill the buffers; then the step's randomness."""
        drafting = self.num_draft_tokens > 1
        if self.skipped_steps and (drafting or self.skipped_steps == self.max_skipped_steps):
            self.catch_up_draft()
        super().prepare_decode()
        if not drafting:
            self.skipped_steps += 1

    def catch_up_draft(self) -> None:
        """The draft extend the last `skipped_steps` NO_DRAFT steps skipped, as one forward over their k tokens at the
        draft's k last committed positions (each step committed one token per request): the draft cache and the next
        root's children are then as k one-token extends would leave them. Eager, outside any CUDA graph: the host
        alone knows k."""
        st = self.state
        k = self.skipped_steps
        with self.phase("draft_extend"):
            ids = st.skipped_tokens[:, -k:].contiguous()
            hidden = st.skipped_hidden[:, -k:].contiguous()
            start = self._draft_lens() - k
            positions = start[:, None] + torch.arange(k, device=self.device)
            meta = AttentionMetadata(st.slots, start, attn_len=self.attn_len(self.draft_offset), ops=self.ops)
            d_hidden = self.draft_model(ids, hidden, positions, self.draft_cache, meta, return_logits=False).hidden
            self._set_next_root_children(d_hidden[:, -1])
        self.skipped_steps = 0

    def draft(self):
        """draft_forward, organize_draft_results, build_tree_kernel_efficient -> the verify input."""
        st = self.state
        B, W = st.seq_lens.shape[0], self.num_draft_tokens
        if W == 1:
            return self.root_only_tree()
        with self.phase("draft"):
            q_list: list = []
            score_list, token_list, parents_list = self.draft_forward(q_list)
            parent_list, top_scores_index, draft_tokens = self.ops.organize_draft_results(
                score_list, token_list, parents_list, W)
            (tree_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling,
             flat_tokens) = self.ops.build_tree_kernel_efficient(
                st.last_tokens, parent_list, top_scores_index, draft_tokens, st.seq_lens, self.topk,
                self.num_steps, W)
            draft_probs = None
            if q_list:  # a sampled draft: each node's q, over the target's vocabulary
                draft_probs = self.proposer.in_target_vocab(
                    tree_draft_probs(torch.cat(q_list, dim=1), parent_list, top_scores_index).flatten(0, 1))
                draft_probs = draft_probs.view(B, W, -1)
        return EagleVerifyInput(flat_tokens.view(B, W), tree_mask, positions.view(B, W), retrieve_index,
                                retrieve_next_token, retrieve_next_sibling, draft_probs)

    def root_only_tree(self) -> EagleVerifyInput:
        """The verify input of a `NO_DRAFT` step: each request's root alone."""
        st = self.state
        B = st.seq_lens.shape[0]
        mask, rows, none = (t[:B] for t in self._root_only)
        return EagleVerifyInput(st.last_tokens[:, None], mask, st.seq_lens[:, None], rows, none, none)
