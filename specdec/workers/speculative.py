"""What every drafting worker shares: the draft -> verify -> draft extend step, verify (greedy or sampled, per
request), the KV commit, and the switching among step shapes."""
from __future__ import annotations

import torch

from ..config import SpecConfig
from ..ops.contract import NO_DRAFT
from ..draft_kinds import kind_of
from ..kv_cache import KVCache
from ..ops.logprob_types import LogitsOutput
from ..models.layers import AttentionMetadata
from .base import WorkerBase
from .step import EagleVerifyInput, StepOutput
from .verification import SampledVerify


class SpeculativeWorkerBase(WorkerBase):
    """Verify, commit and logprobs: the part every drafting worker shares: EagleWorkerV2 (and StandaloneWorker,
    its subclass), MultiLayerEagleWorkerV2, HostProposalWorker and DFlashWorker."""

    def __init__(self, target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob=False):
        super().__init__(target, ops, max_batch, max_seq_len, return_original_logprob)
        self.check_draft(target, draft)
        self.draft_kind = kind_of(draft)
        self.draft_model = draft
        self.spec = spec
        self.num_steps = spec.num_steps
        self.topk = spec.topk
        self.num_draft_tokens = spec.num_draft_tokens
        self.penalty_mode = spec.penalty_mode
        self.draft_penalties = spec.draft_penalties
        self.draft_grammar = spec.draft_grammar
        self.sampled_verify = SampledVerify(spec, self.draft_kind, ops)  # the sampled requests' rule

    def caches(self) -> list[KVCache]:
        return [self.cache, self.draft_cache]

    # ---- step shapes (for the workers that switch them: `allow_shapes`, `use_shape`) ------------------------
    def keep_shapes(self, specs: list[SpecConfig], no_draft: bool) -> None:
        """`allow_shapes`' common part: each of `specs` checked (`check_shape`), the worker's own `spec` among them,
        and `shapes` set to theirs (and `NO_DRAFT` when `no_draft`)."""
        for s in specs:
            self.check_shape(s)
        shapes = [(s.num_steps, s.topk, s.num_draft_tokens) for s in specs]
        if (self.spec.num_steps, self.spec.topk, self.spec.num_draft_tokens) not in shapes:
            raise ValueError(f"allow_shapes: the worker's own shape {self.spec} must be among {shapes}")
        self.shapes = tuple(dict.fromkeys(shapes + ([NO_DRAFT] if no_draft else [])))

    def allowed_shape(self, shape) -> tuple:
        """`use_shape`'s argument as a tuple, ValueError unless it is one of `shapes`."""
        shape = tuple(shape)
        if shape not in self.shapes:
            raise ValueError(f"use_shape: {shape} is not among the allowed shapes {list(self.shapes)}")
        return shape

    #: the draft config fields that must equal the target's (a head reads the target's hidden states)
    draft_matches_target = ("vocab_size", "hidden_size")

    def check_draft(self, target, draft) -> None:
        """ValueError, before any compute, when `draft` cannot draft for `target`: on another device, or of another
        vocabulary or hidden size."""
        devices = {p.device for p in draft.parameters()} if isinstance(draft, torch.nn.Module) else set()
        if devices - {torch.device(target.device)}:
            raise ValueError(f"the draft's weights are on {', '.join(sorted(map(str, devices)))}, the target's on "
                             f"{target.device}: place both on one device (draft.to(target.device))")
        for name in self.draft_matches_target:
            t, d = getattr(target.config, name), getattr(draft.config, name)
            if t != d:
                raise ValueError(f"draft {name}={d} does not match the target's {name}={t}")

    @property
    def kv_margin(self) -> int:
        """The draft kind's rule (`DraftKind.kv_margin`)."""
        return self.draft_kind.kv_margin(self.spec)

    @property
    def max_step_tokens(self) -> int:
        return self.num_steps + 1

    def decode_body(self) -> StepOutput:
        """draft -> verify (target forward, accept, KV commit) -> draft_extend_for_decode, as SGLang's
        EagleWorkerV2 orders a step; the committed length advances last, since the extend reads the old one."""
        st = self.state
        step, target_hidden = self.verify(self.draft())
        with self.phase("draft_extend"):
            self.draft_extend_for_decode(step, target_hidden)
        st.seq_lens = st.seq_lens + step.accept_lens
        return step

    def draft(self) -> EagleVerifyInput:
        """This step's verify tree."""
        raise NotImplementedError

    def draft_extend_for_decode(self, step: StepOutput, target_hidden) -> None:
        """After verify: the draft's forward over the accepted path, leaving the next step's draft input in
        `state`. target_hidden: (B*W, H), the target's hidden states (or features) of every node."""
        raise NotImplementedError

    @property
    def accepts_in_place(self) -> bool:
        """Whether this step's verify tree is a chain in index order (every topk = 1 tree): its accepted path is nodes
        0..a, whose KV the verify wrote at seq_len + 0..a, so the commit has nothing to move (as SGLang at topk = 1).
        Fixed per step shape: a shape keeps one step body and one CUDA graph."""
        return self.topk == 1

    @property
    def uniforms_per_step(self) -> int:
        # a coin per tree node and one for the bonus token, drawn only when some request samples
        return 0 if self.sampling.all_greedy else self.num_draft_tokens + 1

    @property
    def logprob_steps(self) -> int:
        return self.num_steps

    def verify(self, tree: EagleVerifyInput):
        """Target forward over the W tree nodes, verify (greedy or sampling, per request), KV commit.

        Returns the StepOutput and the target hidden states (B*W, H) of every node. Sets last_tokens to the bonus
        token; seq_lens is left to the caller, whose draft extend still needs the old committed length.
        """
        candidates, tree_mask, retrieve_next_token = tree.candidates, tree.tree_mask, tree.retrieve_next_token
        B, W = candidates.shape  # W <= num_draft_tokens: NGRAM verifies a narrower tree when its proposals are short
        st = self.state
        with self.phase("grammar"):  # host work between drafting and verify; nothing without a grammar
            bitmask = self.grammar_bitmask_tree(candidates, retrieve_next_token, tree.retrieve_next_sibling)
        meta = AttentionMetadata(st.slots, st.seq_lens, attn_len=self.attn_len(W), tree_mask=tree_mask, ops=self.ops)
        with self.phase("verify_forward"):
            out = self.target(candidates, tree.positions, self.cache, meta, features=self.target_features)
            logits, hidden = out.logits, out.hidden if out.features is None else out.features  # or the draft's features
        with self.phase("verify"):
            step = self._verify_and_commit(logits, tree, bitmask)
        return step, hidden.view(B * W, -1)

    def _root_only_greedy(self, target_predict):
        """`verify_tree_greedy`'s result for one-node trees (no draft), without its ~70 ops: the root's argmax is the
        bonus. target_predict: (B, 1) -> (predict (B,), accept_index (B, S+1), accept_length (B,)), all int32."""
        B = target_predict.shape[0]
        accept_index = torch.full((B, self.num_steps + 1), -1, dtype=torch.int32, device=self.device)
        accept_index[:, 0] = torch.arange(B, dtype=torch.int32, device=self.device)
        return (target_predict.view(B).to(torch.int32), accept_index,
                torch.zeros(B, dtype=torch.int32, device=self.device))

    def _verify_and_commit(self, raw_logits, tree: EagleVerifyInput, bitmask=None):
        candidates, tree_mask, retrieve_index = tree.candidates, tree.tree_mask, tree.retrieve_index
        retrieve_next_token, retrieve_next_sibling = tree.retrieve_next_token, tree.retrieve_next_sibling
        (B, W), S = candidates.shape, self.num_steps
        st = self.state
        node_logits = raw_logits.view(B * W, -1)
        logits, empty = self.shape_target_logits(node_logits, candidates, tree_mask, bitmask)
        target_predict, finite = self.greedy_and_finite(logits, node_logits, B)
        target_predict = target_predict.view(B, W)
        logits = logits.view(B, W, -1)
        s = self.sampling
        if not s.all_greedy:
            uniforms = st.uniforms
            probs = s.probs(logits.view(B * W, -1), self.ops, W).view(B, W, -1)
            sampled = self.sampled_verify(tree, uniforms, probs, S)
        if s.any_greedy:
            greedy = self._root_only_greedy(target_predict) if W == 1 else self.ops.verify_tree_greedy(
                candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, target_predict, S)
        if s.all_greedy:
            predict, accept_index, accept_length = greedy
        elif not s.any_greedy:
            predict, accept_index, accept_length = sampled
        else:
            g = s.is_greedy
            predict = torch.where(g.repeat_interleave(W), greedy[0], sampled[0])
            accept_index = torch.where(g[:, None], greedy[1], sampled[1])
            accept_length = torch.where(g, greedy[2], sampled[2])
        if not self.accepts_in_place:
            self.cache.commit(self.ops, st.slots, st.seq_lens, accept_index, W)
        accept_lens = accept_length + 1
        step = StepOutput(predict, accept_index, accept_lens, LogitsOutput(next_token_logits=logits.view(B * W, -1)),
                          finite, empty)
        step.emitted = step.emitted_tokens()
        st.last_tokens = step.emitted.gather(1, accept_length[:, None].long())[:, 0].long()  # the bonus token
        self.count_emitted(step.emitted, accept_lens)
        return step
