"""HostProposalWorker: the model-free drafts, a tree of continuations proposed on the host and verified by the
same tree verify, commit, penalties, grammar masks and logprobs as EagleWorkerV2. Three proposers serve it, each
made by its draft (`draft.new_proposer()`): SGLang's NGRAM trie (`specdec.models.ngram.NgramProposer`),
suffix decoding's suffix trees (`specdec.models.suffix.SuffixProposer`) and the lab's scripted draft, the target's
own continuation at set agreement rates (`specdec.lab.scripted.ScriptedProposer`).

A proposer is an object with `start(prompts, params)` (a new batch and its requests' SamplingParams), `filter(keep)`
(the requests kept, in order),
`propose(seqs, new, max_nodes, depth, breadth)` (each request's tokens so far and those the last step emitted ->
its tree as (token, parent) nodes, parent 0 the root, node i >= 1 the i-th, every parent before its children) and
`clear()` (forget what it learned across requests: `Engine.flush_cache`). Its draft states the tree's bounds under a
SpecConfig (`draft.bounds(num_steps, topk)` -> depth, children per node)."""
from __future__ import annotations

import torch

from ..config import SpecConfig
from ..ops.contract import NO_DRAFT
from ..kv_cache import KVCache
from ..models.ngram import verify_input
from .base import RequestState
from .speculative import SpeculativeWorkerBase
from .step import EagleVerifyInput, StepOutput
from .graphs import batch_buckets

#: the state tensors of a step's verify input, built on the host by `prepare_decode`
VERIFY_INPUT = ("proposal_candidates", "proposal_tree_mask", "proposal_positions", "proposal_retrieve_index",
                "proposal_next_token", "proposal_next_sibling")


class HostProposalState(RequestState):
    proposal_tokens: torch.Tensor | None  # (B, S+1) int64: the last step's emitted tokens, not yet on the host
    proposal_lens: torch.Tensor | None  # (B,): how many of them were emitted
    # the step's verify tree, built on the host (`verify_input`), at the step's width W'
    proposal_candidates: torch.Tensor | None  # (B, W') int64
    proposal_tree_mask: torch.Tensor | None  # (B, W', W') bool
    proposal_positions: torch.Tensor | None  # (B, W') int64
    proposal_retrieve_index: torch.Tensor | None  # (B, W') int64
    proposal_next_token: torch.Tensor | None  # (B, W') int64
    proposal_next_sibling: torch.Tensor | None  # (B, W') int64


def tree_capacity(depth: int, breadth: int) -> int:
    """The most nodes (root excluded) a tree of `depth` levels with `breadth` children per node holds."""
    return sum(breadth ** d for d in range(1, depth + 1))


class HostProposalWorker(SpeculativeWorkerBase):
    """The draft is one of parameters only (`NgramDraft`, `SuffixDraft`): no model, no draft cache. Its work is host
    work in the step's prologue (`prepare_decode`): the last step's emitted tokens come down in one transfer and
    extend each request's sequence, its proposer indexes them and proposes a tree per request, and the trees go up
    in one transfer as state tensors.
    The body (verify, commit) reads only those, so it has fixed shapes (W nodes per request, proposals padded with
    nodes no link reaches) and replays as a CUDA graph like the other workers'."""

    #: The prologue reads the last step's tokens on the host, so a step enqueued before the engine reads the last
    #: one gains nothing, and a request that step ends would feed the index the tokens of a step that is dropped.
    decodes_ahead = False

    state_type = HostProposalState

    def __init__(self, target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob=False):
        super().__init__(target, draft, spec, ops, max_batch, max_seq_len, return_original_logprob)
        self._tree_bitmask = None  # a grammar batch's per-node masks, filled by the prologue
        self.allow_shapes([spec])
        self.use_shape((spec.num_steps, spec.topk, spec.num_draft_tokens))
        self.proposer = draft.new_proposer()
        self._seqs: list[list[int]] = []  # per request: its tokens, prompt and output

    # ---- step shapes (a tuned or adaptive engine's, as EagleWorkerV2's) -----------------------------------
    def check_shape(self, spec: SpecConfig) -> None:
        """ValueError when a tree of this draft cannot fill `spec`'s num_draft_tokens."""
        d = self.draft_model
        depth, breadth = d.bounds(spec.num_steps, spec.topk)
        room = tree_capacity(depth, breadth)
        if spec.num_draft_tokens - 1 > room:
            raise ValueError(
                f"num_draft_tokens={spec.num_draft_tokens} cannot be filled by a {type(d).__name__} tree of depth "
                f"{depth} with {breadth} children per node (num_steps and topk within the draft's own bounds): at "
                f"most {room + 1} nodes, the root included")

    def allow_shapes(self, specs: list[SpecConfig], no_draft: bool = False) -> None:
        """The shapes `use_shape` may switch among (the worker's own `spec` one of them), and `NO_DRAFT` (propose
        nothing: a one-node verify, and no draft to catch up afterwards) when `no_draft`. The cache margin, the
        host's length bound and the emitted tokens' width are the largest shape's. Call before `prefill`."""
        self.keep_shapes(specs, no_draft)
        self._max_steps = max(s.num_steps for s in specs)
        self._kv_margin = max(self.draft_kind.kv_margin(s) for s in specs)

    def use_shape(self, shape: tuple[int, int, int]) -> None:
        """The next step's (num_steps, topk, num_draft_tokens), one of `shapes` (ValueError otherwise); host side."""
        shape = self.allowed_shape(shape)
        if shape == NO_DRAFT:
            self.num_steps, self.topk, self.num_draft_tokens, self.depth, self.breadth = 1, 1, 1, 0, 1
        else:
            self.num_steps, self.topk, self.num_draft_tokens = shape
            self.depth, self.breadth = self.draft_model.bounds(self.num_steps, self.topk)
        self.verify_width = self.num_draft_tokens
        self.chains = True

    @property
    def kv_margin(self) -> int:
        return self._kv_margin

    @property
    def max_step_tokens(self) -> int:
        # the largest allowed shape's: the host's length bound stays valid whichever shape a step ran
        return self._max_steps + 1

    def check_draft(self, target, draft) -> None:
        if not callable(getattr(draft, "new_proposer", None)):
            raise ValueError(f"HostProposalWorker drafts with a draft that makes a proposer (NgramDraft, "
                             f"SuffixDraft, ScriptedDraft), got {type(draft).__name__}")
        if getattr(draft, "target", target) is not target:
            raise ValueError(f"{type(draft).__name__} was made for another target than the engine's (its `target`)")

    def caches(self) -> list[KVCache]:
        return [self.cache]

    def clear_cache_pool(self) -> None:
        """The proposer forgets what it learned across requests (SGLang's NGRAM worker's `clear_cache_pool`)."""
        self.proposer.clear()

    # ---- the requests' sequences ----------------------------------------------------------------------
    def start(self, prompts, params, seed, grammars=None) -> None:
        super().start(prompts, params, seed, grammars)
        self._seqs = [[int(t) for t in p] for p in prompts]
        self.proposer.start(self._seqs, self.params)

    def filter(self, keep: list[int]) -> None:
        super().filter(keep)
        self._seqs = [self._seqs[i] for i in keep]
        self.proposer.filter(keep)

    def count_emitted(self, tokens, num_emitted) -> None:
        super().count_emitted(tokens, num_emitted)
        # kept on the device until the next step's prologue brings them down with one transfer; the prefill's one
        # token padded to the largest allowed shape's S+1, so that the state keeps one shape (the CUDA graphs copy it)
        pad = self._max_steps + 1 - tokens.shape[1]
        self.state.proposal_tokens = torch.nn.functional.pad(tokens, (0, pad)) if pad else tokens
        self.state.proposal_lens = num_emitted

    # ---- stages --------------------------------------------------------------------------------------
    def draft_extend_for_prefill(self, ids, hidden, positions, tokens) -> None:
        """Nothing to run: the first token comes down with the next step's (SGLang indexes nothing at prefill)."""

    def prepare_decode(self) -> None:
        """Host prologue: the step's uniforms, then the last step's tokens down, each request's sequence extended,
        the proposer's trees built (it indexes the new tokens as its rules say), and the verify tree up (state
        tensors `VERIFY_INPUT`)."""
        super().prepare_decode()
        st = self.state
        T = st.proposal_tokens.shape[1]
        rows = torch.cat([st.proposal_tokens.long(), st.proposal_lens[:, None].long()], dim=1).tolist()
        with self.phase("draft"):
            new = [row[:row[T]] for row in rows]
            for seq, tokens in zip(self._seqs, new):
                seq.extend(tokens)
            trees = self.proposer.propose(self._seqs, new, self.num_draft_tokens - 1, self.depth, self.breadth)
            roots = [seq[-1] for seq in self._seqs]
            committed = [len(seq) - 1 for seq in self._seqs]  # the root (last token) is not committed yet
            self.verify_width = self.width_for(max(len(t) for t in trees) + 1)
            # a breadth-1 proposal can still branch (NGRAM's shorter anchor adds a sibling): whether the commit has
            # nothing to move is read from the trees
            self.chains = all(parent == i for t in trees for i, (_, parent) in enumerate(t))
            host = verify_input(roots, trees, committed, self.verify_width)
            for name, tensor in zip(VERIFY_INPUT, host):
                setattr(st, name, tensor.to(self.device, non_blocking=True))
        if self.grammar is not None:
            self._prepare_grammar(rows, T, host)

    def _prepare_grammar(self, rows, T, host) -> None:
        """A grammar batch's host work rides on the same transfers: the tokens that came down advance the matchers
        (they are the grammar's pending tokens too), and the tree's per-node masks are filled from the tree still
        on the host and go up beside it, so verify makes no round trip of its own."""
        st = self.state
        with self.phase("grammar"):
            st.grammar_tokens = st.grammar_lens = None
            self.grammar.advance([row[:T] for row in rows], [row[T] for row in rows])
            candidates, _, _, _, next_token, next_sibling = host
            self._tree_bitmask = self.grammar.fill_tree(candidates, next_token, next_sibling).to(
                self.device, non_blocking=True)

    def grammar_bitmask_tree(self, candidates, retrieve_next_token, retrieve_next_sibling):
        """The masks `prepare_decode` filled from the host tree (None without a grammar)."""
        return None if self.grammar is None else self._tree_bitmask

    def width_for(self, nodes: int) -> int:
        """The verify width of a step whose largest tree has `nodes` nodes (root included): the smallest of the
        widths 1, 2, 4, ... num_draft_tokens that holds it. A step with no proposal verifies the root alone (a
        one-token target forward); a short proposal pays for its own width, not the configured one. Each width is
        one fixed shape (one CUDA graph per batch bucket, width and whether every tree is a chain)."""
        return next(w for w in batch_buckets(self.num_draft_tokens) if w >= nodes)

    @property
    def step_shape(self) -> tuple:
        return (self.verify_width, self.chains)

    @property
    def accepts_in_place(self) -> bool:
        """Every request's proposal is a chain in index order (`prepare_decode` reads it from the host trees)."""
        return self.chains

    def draft(self) -> EagleVerifyInput:
        st = self.state
        return EagleVerifyInput(*(getattr(st, name) for name in VERIFY_INPUT))

    def draft_extend_for_decode(self, step: StepOutput, target_hidden) -> None:
        """Nothing to run: the accepted tokens reach the index in the next step's prologue."""
