"""DSparkWorker: a DSpark drafter proposes a block in one forward, refines it token after token with its Markov head,
and sends the block to verification up to its confidence cap.

Alignment is DFlash's (`DFlashWorker`), but every block position proposes: with committed target length n and the
last verified token x_n, the block [x_n, mask * (S-1)] at positions n..n+S-1 attends to the context at 0..n-1 and to
itself; its output at n+j-1 (j = 1..S), refined by the Markov bias of the token before it (x_n, then d_1, ...; an rnn
head's bias also reads the state carried from the block positions before), gives d_j. The chain [x_n, d_1..d_S] goes
through the base worker's verify, commit, penalties, grammar masks and logprobs; after it the target's features of
the accepted nodes become the context at n..n+a, as DFlash's.

The confidence cap is a per-request length c (0..S) computed on the device: the number of leading block positions
whose estimated acceptance is at least the drafter's `confidence_threshold`. The chain is verified with its link
from node c to node c+1 cut (`retrieve_next_token` = -1 there), so the nodes past it are padding that no link
reaches, as a model-free draft's short proposal is padded: verification stops at node c and takes the target's
token there, and the step keeps the fixed shape W = S + 1 that a CUDA graph replays. Only where a tensor read costs
no device synchronisation (the CPU) and the step need not keep its shape (`fixed_step_shapes`) is the verify narrowed
to the batch's longest confident block, so that the cap saves the target the unconfident positions' compute.

Whether the cap depends on the drafted tokens does not change what is emitted: position j's cap decision reads
d_1..d_j only, all of them accepted when verification reaches node j, so stopping there is a rule on the emitted
prefix, and a chain's rejection sampling stays exact under such a stopping rule.
"""
from __future__ import annotations

import dataclasses

import torch

from .dflash import DFlashWorker
from .step import EagleVerifyInput


class DSparkWorker(DFlashWorker):
    """`DFlashWorker`'s step with DSpark's block (every position proposes, the Markov head chooses token after
    token, the confidence head caps the verified chain); no host sync on a device that queues work."""

    first_proposing = 0

    def __init__(self, target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob=False):
        super().__init__(target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob)
        #: the drafter's threshold when the worker was made: a step's cap never changes with the drafter afterwards
        self.confidence_threshold = draft.confidence_threshold
        rule = self.sampled_verify.rule
        if draft.confidence_head is not None and self.confidence_threshold > 0 and not rule.stopped_chains:
            raise ValueError(f"verify={rule.name!r} is not exact on a chain whose length the drafted tokens decide, "
                             f"as the DSpark confidence cap (confidence_threshold={self.confidence_threshold}) makes "
                             f"it: use 'rejection' or 'traversal', or set the drafter's confidence_threshold to 0")

    def check_block(self, S: int, block: int | None) -> None:
        if block is not None and S > block:
            raise ValueError(f"a block of num_steps={S} proposals exceeds the DSpark drafter's trained block_size="
                             f"{block}: its drafter and confidence head were trained on {block} block positions")

    @property
    def trims_verify(self) -> bool:
        """Whether this step's verify is narrowed to the longest confident block (see the module docstring)."""
        return torch.device(self.device).type == "cpu" and not self.fixed_step_shapes

    def draft(self) -> EagleVerifyInput:
        """DFlash's draft with DSpark's block (`_propose_block`), the chain cut after each request's cap."""
        tree = super().draft()
        W = tree.candidates.shape[1]
        confident = self._confident_lengths
        links = torch.where(torch.arange(W, device=self.device) < confident[:, None], tree.retrieve_next_token, -1)
        tree = dataclasses.replace(tree, retrieve_next_token=links)
        return self._narrowed(tree, confident) if self.trims_verify else tree

    def _propose_block(self, hidden, root):
        """hidden: (B, S, H), the block's outputs -> (proposals (B, S), q (B, S, V) or None), d_j chosen from the
        Markov-refined logits of position j - 1 given d_{j-1} (the root for j = 1) and, for a recurrent Markov head,
        the state it carries from the positions before (the chosen tokens'): their argmax, or a draw from their
        q for a sampled draft, after the draft's penalties and grammar masks along [root, d_1..d_{j-1}] where the
        SpecConfig asks. Leaves the confident lengths (B,) in `_confident_lengths` for `draft`."""
        d = self.draft_model
        base = d.compute_logits(hidden)
        B, S, _ = base.shape
        uniforms = self.proposer.uniforms(0, S)
        shaping = self.draft_penalties or self.draft_grammar
        chain, q_rows, markov_state = [root[:, None]], [], None
        for j in range(S):
            logits, markov_state = d.refine_step(base[:, j], chain[-1][:, 0], hidden[:, j], markov_state)
            if shaping:
                path = torch.ones(B, 1, j + 1, dtype=torch.bool, device=self.device)
                logits = self.shape_draft_logits(logits, torch.cat(chain, dim=1), path)
            if uniforms is None:
                chain.append(logits.argmax(-1)[:, None])
                continue
            _, drawn, q = self.proposer.propose(logits, 1, uniforms[:, j:j + 1])
            chain.append(drawn)
            q_rows.append(q)
        tokens = torch.cat(chain, dim=1)  # [root, d_1..d_S]: position j's previous token is tokens[:, j]
        confidence = d.confidence_logits(hidden, tokens[:, :S])
        self._confident_lengths = (torch.full((B,), S, dtype=torch.int64, device=self.device) if confidence is None
                                   else d.confident_length(confidence, S, self.confidence_threshold))
        return tokens[:, 1:], torch.stack(q_rows, dim=1) if q_rows else None

    def _narrowed(self, tree: EagleVerifyInput, confident) -> EagleVerifyInput:
        """The chain cut to the batch's longest confident block plus its root (a host read of `confident`)."""
        B, W = tree.candidates.shape
        Wv = int(confident.max()) + 1
        if Wv == W:
            return tree
        index = torch.arange(B * Wv, device=self.device).view(B, Wv)
        cut = [t[:, :Wv].contiguous() for t in (tree.candidates, tree.positions, tree.retrieve_next_token,
                                                 tree.retrieve_next_sibling)]
        return EagleVerifyInput(cut[0], tree.tree_mask[:, :Wv, :Wv], cut[1], index, cut[2], cut[3],
                                None if tree.draft_probs is None else tree.draft_probs[:, :Wv].contiguous())
