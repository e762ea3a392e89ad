"""The logits' shaping, target side and draft side: penalties, logit bias and min_new_tokens (`apply_penalties_tree`),
then the grammar masks (`apply_token_bitmask`), with a grammar batch's one host round trip per step.

`LogitShaping` is a mixin of every worker (`WorkerBase`): it reads the worker's `sampling` tensors, `state`
(counts, pending grammar tokens), `grammar` (`specdec.grammar.GrammarBatch` or None), `ops`, `vocab_size`, `device`
and `phase`. Its two entry points are `shape_target_logits` (what verify, sampling and the logprobs read) and
`shape_draft_logits` (what a draft proposes from, where the SpecConfig asks). It reads `sampling` and `state` at each
call rather than holding them, because the CUDA-graph path (`workers.graphs.DecodeGraphs`) swaps both for its padded
static buffers around a replay.
"""
from __future__ import annotations

import torch

#: `StepOutput.empty` codes: what left a node's logits with no token to decode
EMPTY_BY_PENALTIES = 1  # the logit bias (-inf) and min_new_tokens (holding the stop ids back)
EMPTY_BY_GRAMMAR = 2  # the grammar's mask, applied after the penalties


def empty_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits: (N, V) -> (N,) bool, True where no logit is above -inf (nothing left to decode)."""
    return logits.amax(-1) == float("-inf")


class LogitShaping:
    """Penalties and grammar masks of a worker's logits (a mixin: see the module's docstring)."""

    #: "exact": every tree node's logits are penalised along its own path; "sglang": as the root's
    penalty_mode = "exact"

    def penalize(self, logits, candidates, tree_mask):
        """logits: (B*W, V); candidates: (B, W) int64; tree_mask: (B, W, W) bool or None -> the logits that
        plain decoding would sample each node's next token from (`apply_penalties_tree`), or `logits`
        itself when no request has penalties."""
        if not self.sampling.penalized:
            return logits
        return self._apply_penalties(logits, candidates, tree_mask if self.penalty_mode == "exact" else None)

    def _apply_penalties(self, logits, candidates, tree_mask):
        """`apply_penalties_tree` with this batch's counts and parameters."""
        s, st = self.sampling, self.state
        return self.ops.apply_penalties_tree(
            logits, candidates, tree_mask, st.output_counts, st.prompt_mask, st.output_lens, s.frequency_penalties,
            s.presence_penalties, s.repetition_penalties, s.min_new_tokens, s.stop_mask, s.logit_bias)

    def shape_target_logits(self, raw_logits, candidates, tree_mask, bitmask):
        """The target's logits (N, V) -> (logits every node decodes from, empty (N,) int8 or None).

        Penalties, logit bias and min_new_tokens (`penalize`), then the grammar mask (`constrain`). A row that a
        stage leaves all -inf is marked in `empty` with the stage's code and decoded as a uniform row (no NaN
        reaches verify, sampling or the logprobs); the engine stops its request there. `empty` is None when
        neither stage ran (a finite raw row cannot be empty)."""
        logits = self.penalize(raw_logits, candidates, tree_mask)
        empty = None
        if logits is not raw_logits:
            empty = empty_rows(logits).to(torch.int8) * EMPTY_BY_PENALTIES
        if bitmask is not None:
            logits = self.constrain(logits, bitmask)
            by_grammar = empty_rows(logits).to(torch.int8) * EMPTY_BY_GRAMMAR
            empty = by_grammar if empty is None else torch.where(empty > 0, empty, by_grammar)
        if empty is not None:
            logits = logits.masked_fill((empty > 0)[:, None], 0.0)
        return logits, empty

    def shape_draft_logits(self, logits, candidates, tree_mask):
        """The draft's logits (B*R, V), penalised (`penalize_draft`) and masked (`constrain_draft`) along each row's
        path where the SpecConfig asks; a row left all -inf proposes from a uniform row instead (a draft that
        proposes nothing useful only costs acceptance). candidates (B, L), tree_mask (B, R, L) or None: as
        `constrain_draft`."""
        shaped = self.constrain_draft(self.penalize_draft(logits, candidates, tree_mask), candidates, tree_mask)
        if shaped is logits:
            return logits
        return shaped.masked_fill(empty_rows(shaped)[:, None], 0.0)

    #: whether the draft's proposals are penalised too (SpecConfig.draft_penalties)
    draft_penalties = False

    def penalize_draft(self, logits, candidates, tree_mask):
        """The draft's logits (B*R, V) penalised along their rows' paths when `draft_penalties` is on, some
        request has penalties and the draft's vocabulary is the target's; else `logits` itself."""
        if not (self.draft_penalties and self.sampling.penalized and logits.shape[-1] == self.vocab_size):
            return logits
        return self._apply_penalties(logits, candidates, tree_mask)

    # ---- grammars: host matchers, one transfer down and one bitmask up per step ---------------------
    def advance_grammar_and_fetch(self, *tensors) -> list[torch.Tensor]:
        """A grammar step's one device-to-host transfer, and the matchers' advance: the last step's emitted tokens
        (pending in `state` until now) and `tensors` ((B, W) int each, this step's tree) come down packed together;
        the pending tokens advance the matchers (once per step: a later call finds none) -> `tensors` on the host."""
        st = self.state
        pending = [st.grammar_tokens, st.grammar_lens[:, None]] if st.grammar_tokens is not None else []
        B = len(self.grammar.matchers)
        if not pending and not tensors:
            return []
        flat = torch.cat([t.reshape(B, -1).long() for t in pending + list(tensors)], dim=1).cpu()
        pos = 0
        if pending:  # once: a draft that masks its proposals may have advanced the matchers already this step
            T = pending[0].shape[1]
            self.grammar.advance(flat[:, :T].tolist(), flat[:, T].tolist())
            st.grammar_tokens = st.grammar_lens = None
            pos = T + 1
        out = []
        for t in tensors:
            w = t.reshape(B, -1).shape[1]
            out.append(flat[:, pos:pos + w])
            pos += w
        return out

    def grammar_bitmask_roots(self):
        """-> (B, ceil(V/32)) int32 on the device, each request's mask after its committed output, or None
        when no request has a grammar (a one-token step: prefill, target-only decode)."""
        if self.grammar is None:
            return None
        self.advance_grammar_and_fetch()
        return self.grammar.fill_roots().to(self.device)

    def grammar_bitmask_tree(self, candidates, retrieve_next_token, retrieve_next_sibling):
        """A verify tree ((B, W) each) -> (B*W, ceil(V/32)) int32 on the device: node i's mask after its
        root-to-node path, or None when no request has a grammar."""
        if self.grammar is None:
            return None
        cand, next_token, next_sibling = self.advance_grammar_and_fetch(candidates, retrieve_next_token,
                                                                        retrieve_next_sibling)
        return self.grammar.fill_tree(cand, next_token, next_sibling).to(self.device)

    #: whether the draft's proposals are masked by the grammar too (SpecConfig.draft_grammar)
    draft_grammar = False
    #: (draft vocabulary,) int64 on the host: the target id of each draft id, for a reduced draft vocabulary
    draft_vocab_ids = None

    def constrain_draft(self, logits, candidates, tree_mask):
        """The draft's logits (B*R, V), each row masked by the grammar after its path (candidates (B, L), node 0
        the root; tree_mask (B, R, L) bool, or None for the root alone) when `draft_grammar` is on, some request
        has a grammar; else `logits` itself. A reduced draft vocabulary (EAGLE-3) reads its ids' bits through
        `draft_vocab_ids`. A host round trip per call: the path tokens down, the bitmask up."""
        remap = self.draft_vocab_ids is not None
        if not (self.draft_grammar and self.grammar is not None) or (logits.shape[-1] != self.vocab_size
                                                                     and not remap):
            return logits
        if tree_mask is None:
            tree_mask = torch.ones(candidates.shape[0], 1, 1, dtype=torch.bool, device=self.device)
        B, R, L = tree_mask.shape
        with self.phase("grammar"):
            tokens, paths = self.advance_grammar_and_fetch(candidates, tree_mask)
            bitmask = self.grammar.fill_paths(tokens, paths.view(B, R, L).bool())
            if remap:  # a reduced draft vocabulary (EAGLE-3): draft id d reads target id draft_vocab_ids[d]'s bit
                bitmask = self.grammar.remap(bitmask, self.draft_vocab_ids)
        return self.ops.apply_token_bitmask(logits, bitmask.to(self.device))

    def constrain(self, logits, bitmask):
        """logits (N, V) after the penalties -> -inf where the grammar forbids a token (`apply_token_bitmask`),
        or `logits` itself when `bitmask` is None."""
        return logits if bitmask is None else self.ops.apply_token_bitmask(logits, bitmask)
