"""How sampled requests are verified, and how the draft proposes for them: the one component every speculative
worker calls (`SpecConfig.verify`, `SpecConfig.draft_sampling`).

The rule is a record of `specdec.verify_rules` (`VERIFY_RULES`): the built-in ones, each lossless (the emitted tokens
are distributed as the target's), and any registered from outside:

* ``target_only``: SGLang's ``tree_speculative_sampling_target_only``: the draft's proposals are accepted
  against the target's distribution alone (exact for any draft, deterministic or sampled);
* ``rejection``: recursive rejection sampling with the draft's distribution q
  (``tree_speculative_sampling_rejection``): token-wise min(1, p/q) on a chain, over a node's children in their
  drawn order on a tree;
* ``block``: block verification of a chain (``chain_speculative_sampling_block``);
* ``traversal``: Traversal Verification (``tree_speculative_sampling_traversal``): the tree decided from its leaves
  up with sequence-level weights; block verification on a chain, recursive rejection on a tree of depth one, and
  more accepted tokens than recursive rejection on the same draws of a deeper tree.

`SampledVerify` runs the rule's op with the arguments its signature names (`verify_rules.VERIFY_ARGUMENTS`). A rule
that reads q (`VerifyRule.reads_draft`) needs ``draft_sampling="sample"``: each node's proposals are drawn from q, the
draft's distribution after the request's temperature, top-k and top-p (and the draft's penalties and grammar
masks where the SpecConfig asks), without replacement, with uniforms drawn on the host like every other random
number (`sample_without_replacement`). Greedy requests always take greedy verification and propose the draft's
top-K, whatever the SpecConfig says. NGRAM has no distribution: a rule or drafting that needs one is refused.

Why sampled trees have a fixed shape: recursive rejection (and traversal) is exact only when whether a node keeps a
drawn child does not depend on the drawn tokens. EAGLE's dynamic tree keeps the candidates of the largest product of
probabilities, which looks at the draws; a sampled draft's candidate is scored instead by the product, along its
path, of a weight of its draw rank (`SAMPLED_RANK_WEIGHTS`), so every request's tree has the same shape (that of
SpecInfer's and Sequoia's static trees), children kept in draw order.
"""
from __future__ import annotations

import torch

from ..config import SpecConfig
from ..verify_rules import op_arguments, verify_rule

#: a sampled draft's tree score of the m-th child drawn at a node (m = 0, 1, ...), multiplied along the path. Only the
#: ratio of log(first) to log(decay) shapes the tree (depth against breadth); 0.6 and 0.25 gave the most accepted
#: tokens of the ratios tried on the deep pair's EAGLE tree S5 K4 W16 at T = 1 (8 held-out prompts x 64 tokens:
#: 4.02 per step, 3.71-3.94 for the other ratios, 3.04 verified target-only from its dynamic top-K tree)
SAMPLED_RANK_WEIGHTS = tuple(0.6 * 0.25 ** m for m in range(64))


def check_spec_for_kind(spec: SpecConfig, kind) -> None:
    """ValueError when the draft kind `kind` (a `DraftKind`) cannot run `spec`'s drafting or verify rule."""
    if kind.samples_drafts:
        return
    if spec.draft_sampling != "topk":
        raise ValueError(f"draft_sampling={spec.draft_sampling!r}: a {kind.label} draft has no distribution to "
                         f"sample from (use 'topk')")
    if verify_rule(spec.verify).reads_draft:
        raise ValueError(f"verify={spec.verify!r} needs the draft's distribution, which a {kind.label} draft does "
                         f"not have (use 'target_only')")


class SampledVerify:
    """The sampled requests' verify of one worker: the op of the rule its SpecConfig selects (`VerifyRule.op_for` the
    worker's ops module), called with the arguments its signature names."""

    def __init__(self, spec: SpecConfig, kind, ops):
        check_spec_for_kind(spec, kind)
        self.rule = verify_rule(spec.verify)
        self.op = self.rule.op_for(ops)
        self.arguments = op_arguments(self.op, self.rule.name)
        # a step whose draft kept no q (a batch that drafted by top-K) is verified against the target alone
        fallback = verify_rule("target_only")
        self.target_only = fallback.op_for(ops)
        self.target_only_arguments = op_arguments(self.target_only, fallback.name)
        #: whether the draft samples its proposals (and keeps q for the verify)
        self.samples = spec.draft_sampling == "sample"

    def __call__(self, tree, uniforms, target_probs, num_steps: int):
        """tree: the step's `EagleVerifyInput` (its `draft_probs` (B, W, V) set when the draft sampled);
        uniforms: (B, >= W + 1), the verify's coins then the bonus token's; target_probs: (B, W, V).
        -> (predict (B*W,), accept_index (B, S+1), accept_length (B,)), int32."""
        W = tree.candidates.shape[1]
        values = dict(candidates=tree.candidates, retrieve_index=tree.retrieve_index,
                      retrieve_next_token=tree.retrieve_next_token, retrieve_next_sibling=tree.retrieve_next_sibling,
                      uniform_samples=uniforms[:, :W].contiguous(),
                      uniform_samples_for_final_sampling=uniforms[:, W].contiguous(), target_probs=target_probs,
                      draft_probs=tree.draft_probs, num_steps=num_steps)
        if self.rule.reads_draft and tree.draft_probs is None:
            op, arguments = self.target_only, self.target_only_arguments
        else:
            op, arguments = self.op, self.arguments
        return op(**{name: values[name] for name in arguments})


class DraftProposer:
    """A node's K proposals: SGLang's top-K of the draft's logits (`softmax_topk`), or, with sampled drafting, K
    draws from q without replacement for the sampled requests (greedy ones keep the top-K in the same batch).

    worker: the speculative worker (its `sampling`, `ops` and `device` are read at each call: a CUDA graph swaps
    `sampling` for its static copy); draft_to_target: (Vd,) int64 on the device, each draft id's target id, for a
    reduced draft vocabulary (EAGLE-3's d2t), else None."""

    def __init__(self, worker, samples: bool, draft_to_target: torch.Tensor | None = None):
        self.worker = worker
        self.samples = samples
        self.draft_to_target = draft_to_target
        self._ranks: dict = {}

    def active(self) -> bool:
        """Whether this step samples proposals (sampled drafting, and some request samples)."""
        return self.samples and not self.worker.sampling.all_greedy

    def uniforms(self, start: int, count: int):
        """(B, count) of the step's uniforms from `start` past the verify's (its W coins and the bonus's), or None
        when this step does not sample proposals."""
        if not self.active():
            return None
        first = self.worker.num_draft_tokens + 1 + start
        return self.worker.state.uniforms[:, first:first + count]

    def uniforms_per_step(self, verify: int, draws: int) -> int:
        """The step's uniform count: the verify's (`verify`, 0 for an all-greedy batch), then `draws` for a
        sampled draft."""
        return verify + draws if verify and self.samples else verify

    def propose(self, logits, K: int, uniforms):
        """logits: (B*R, V') the draft's at R nodes per request, request-major (V' its vocabulary); uniforms:
        (B, R*K) or None when not `active`. -> (scores (B*R, K) fp32, tokens (B*R, K) int64 in draft ids,
        q (B*R, V') fp32 or None): the top-K's probabilities and ids best first, or for a sampled request the
        draws in draw order, their rank weights as scores, and q (the rows of greedy requests are not read)."""
        w = self.worker
        if not self.active():
            p, index = w.ops.softmax_topk(logits, K)
            return p, index, None
        N = logits.shape[0]
        R = N // w.sampling.temperatures.shape[0]
        q = w.sampling.probs(logits, w.ops, R)
        drawn = w.ops.sample_without_replacement(q, uniforms.reshape(N, K).contiguous())
        ranks = self._rank_weights(K, logits.device).expand(N, K)
        if not w.sampling.any_greedy:
            return ranks, drawn, q
        p, index = w.ops.softmax_topk(logits, K)
        greedy = w.sampling.is_greedy.repeat_interleave(R)[:, None] if R > 1 else w.sampling.is_greedy[:, None]
        return torch.where(greedy, p, ranks), torch.where(greedy, index, drawn), q

    def _rank_weights(self, K: int, device) -> torch.Tensor:
        """(K,) fp32 `SAMPLED_RANK_WEIGHTS`, made once per (K, device)."""
        key = (K, str(device))
        if key not in self._ranks:
            self._ranks[key] = torch.tensor(SAMPLED_RANK_WEIGHTS[:K], dtype=torch.float32, device=device)
        return self._ranks[key]

    def in_target_vocab(self, q):
        """q (N, V') over the draft's vocabulary -> (N, V) over the target's (a reduced vocabulary's ids scattered
        to their target ids, the rest 0)."""
        if q is None or self.draft_to_target is None:
            return q
        full = q.new_zeros(q.shape[0], self.worker.vocab_size)
        return full.index_copy_(1, self.draft_to_target, q)


def chain_draft_probs(q_rows, W: int):
    """q_rows: (B, S, V) the distribution each chain node's child was drawn from, node 0 (the root) first ->
    (B, W, V) `draft_probs` with W = S + 1 (the last node's row, never read, repeats the one before)."""
    return torch.cat([q_rows, q_rows[:, -1:]], dim=1)[:, :W]


def tree_draft_probs(q_expanded, parent_list, top_scores_index):
    """q_expanded: (B, 1 + K(S-1), V), the q row of every expanded node in `parent_list` order (the root, then each
    draft step's K frontier nodes); parent_list (B, 1 + K(S-1)) for S > 1, (B, 0) for S = 1, top_scores_index
    (B, W-1): as `organize_draft_results` returns them. -> (B, W, V) `draft_probs`: node n's row is the one its
    children were drawn from (a node that was never expanded reads the root's row, which nothing reads)."""
    B, W1 = top_scores_index.shape
    if parent_list.shape[1] <= 1:  # a one-step tree (S = 1, an empty parent_list): only the root was expanded
        pos = torch.zeros(B, W1, dtype=torch.int64, device=top_scores_index.device)
    else:  # node n >= 1 was expanded at position j where parent_list[j] equals its candidate index
        match = parent_list[:, None, 1:] == top_scores_index[:, :, None]  # (B, W-1, K(S-1))
        pos = torch.where(match.any(-1), match.to(torch.int8).argmax(-1) + 1, 0)
    pos = torch.cat([torch.zeros(B, 1, dtype=pos.dtype, device=pos.device), pos], dim=1)  # the root: row 0
    return q_expanded.gather(1, pos[:, :, None].expand(B, W1 + 1, q_expanded.shape[-1]))
