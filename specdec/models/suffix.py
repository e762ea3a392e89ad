"""Suffix decoding (SuffixDecoding, arXiv 2411.04975; vLLM's `method="suffix"`): no model, suffix trees on the host.

By default every rule is arctic-inference 0.3.0's (`csrc/suffix_decoding/suffix_tree.cc` and
`arctic_inference/suffix_decoding/cache.py`, which vLLM's `SuffixDecodingProposer` calls), so that a proposal made
here is the one its `SuffixDecodingCache` makes for the same histories, token for token:

- two kinds of tree: each running request's own, over its prompt and its output so far, and one global tree over the
  outputs of the last `max_cached_requests` requests started (running ones included: a request's output enters it as
  it is decoded, vLLM's in-flight updates), the oldest request's output evicted first once more are cached;
- a tree holds every substring of at most `max_tree_depth` (D) tokens of its sequences, each with its count: how many
  times it occurs in them. A token t after a string s has the probability count(s t) / count(s) (an occurrence of s
  at a sequence's end continues nowhere); a path multiplies them;
- a decode step matches the request's last m tokens for m = 1, 2, ... up to D - 1 (while they occur) and, from each
  match, speculates: along the most frequent child (a chain; arctic's `use_tree_spec=False`, vLLM's choice), or best
  first by path probability (a tree), stopping at a token whose probability falls below `min_token_prob` and after
  `floor(max_spec_factor * m)` tokens; a proposal's score is the sum of its tokens' probabilities, and the best score
  wins (a longer match on a tie), the request's own tree's over the global tree's on a tie;
- equal counts are ordered as arctic's sibling lists order them (a new child last; a child whose count changed moves
  in front of the children of its new count, or behind them when it came from inside its old group), and the
  probabilities and scores are float32, computed in arctic's order, so that ties break as there.

arctic keeps the trees path-compressed (O(N) nodes); here every node is one token (O(N D) nodes), which changes
no count and no order: a compressed edge is a run of only children of equal count, along which arctic multiplies
nothing, and this code multiplies nothing either (`_on_edge`).

A SpecConfig's num_steps caps a proposal's depth (a chain's length: vLLM's num_speculative_tokens; at S = D, the
default shape, it binds nothing) and num_draft_tokens - 1 a tree's node count (arctic's max_spec_tokens for a
tree); its topk caps the children a tree takes per node, a bound of the toolkit's (arctic takes every child above
min_token_prob). `SuffixProposer` is what the host-proposal worker calls
(`specdec.workers.host_proposal`).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..checks import check_int, check_real
from .ngram import _heap_pop, _heap_push

F32 = np.float32


@dataclass(frozen=True)
class SuffixDraft:
    """The suffix-decoding draft: vLLM's `suffix_decoding_*` parameters and defaults. Pass it as
    `Engine(target, draft=SuffixDraft(...), spec=SpecConfig(num_steps=S))` (a chain of at most S tokens, vLLM's
    num_speculative_tokens), or with topk > 1 for a tree of at most num_draft_tokens - 1 nodes.

    max_tree_depth: the longest substring a tree holds (a match of m tokens continues at most D - m);
    max_cached_requests: the requests whose outputs the global tree keeps (0: no global tree, each request's own
    only); max_spec_factor: a match of m tokens speculates at most floor(max_spec_factor * m) tokens;
    min_token_prob: the least estimated probability of a speculated token."""

    max_tree_depth: int = 24
    max_cached_requests: int = 10_000
    max_spec_factor: float = 1.0
    min_token_prob: float = 0.1

    def __post_init__(self):
        check_int("max_tree_depth", self.max_tree_depth, 1)
        # arctic's sequence ids are int32
        check_int("max_cached_requests", self.max_cached_requests, 0, 2**31 - 1)
        check_real("max_spec_factor", self.max_spec_factor, 0.0)
        check_real("min_token_prob", self.min_token_prob, 0.0, 1.0)

    def new_proposer(self) -> "SuffixProposer":
        return SuffixProposer(self)

    def bounds(self, num_steps: int, topk: int) -> tuple[int, int]:
        """A proposal's depth and children per node under a SpecConfig: the tree's D levels (a match of m >= 1
        tokens leaves D - m, so S = D, vLLM's default num_speculative_tokens, bounds nothing)."""
        return min(num_steps, self.max_tree_depth), topk


def suffix_draft_for(target) -> SuffixDraft:
    """The suffix draft a speed run on `target` uses: vLLM's defaults (no model: any target)."""
    return SuffixDraft()


# ---- the tree ----------------------------------------------------------------------------------------------------

class SuffixNode:
    """One token of a suffix tree: its count (occurrences of the string from the root to it) and its children, by
    token and in arctic's sibling order (`order`: by count, descending)."""

    __slots__ = ("token", "count", "children", "order")

    def __init__(self, token: int):
        self.token, self.count, self.children, self.order = token, 1, {}, []


def _increment(siblings: list[SuffixNode], node: SuffixNode) -> None:
    """node.count += 1, moved as arctic moves it: where the sibling before it has a count above the new one, it
    stays; else it goes before the first sibling of that sibling's count (front of its new count's group when it
    headed its old group, behind that group when it was inside it)."""
    i = siblings.index(node)
    if i == 0 or siblings[i - 1].count > node.count + 1:
        node.count += 1
        return
    run = siblings[i - 1].count
    j = i - 1
    while j > 0 and siblings[j - 1].count == run:
        j -= 1
    del siblings[i]
    node.count += 1
    siblings.insert(j, node)


def _decrement(siblings: list[SuffixNode], node: SuffixNode) -> None:
    """node.count -= 1 (a sequence removed), moved as arctic moves it: behind the last sibling of its old count, so
    in front of those of its new count."""
    i = siblings.index(node)
    n = len(siblings)
    if i + 1 == n or siblings[i + 1].count != node.count:
        node.count -= 1
        return
    k = i + 1
    while k < n and siblings[k].count == node.count:
        k += 1
    del siblings[i]
    node.count -= 1
    siblings.insert(k - 1, node)


def _on_edge(node: SuffixNode, child: SuffixNode) -> bool:
    """Whether arctic's compressed tree holds `child` on `node`'s edge (an only child that every occurrence of
    `node` continues to), so that it multiplies nothing and pops nothing between them. The root ends every edge."""
    return child.count == node.count and len(node.order) == 1 and node.token >= 0


def _edge_child(node: SuffixNode) -> SuffixNode | None:
    """`node`'s child on its edge, or None at an edge's end."""
    return node.order[0] if node.order and _on_edge(node, node.order[0]) else None


class SuffixTree:
    """Every substring of at most `max_depth` tokens of its sequences (each a list of tokens under a key), with
    counts, as arctic's SuffixTree holds them."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = SuffixNode(-1)
        self.root.count = 0
        self.seqs: dict[object, list[int]] = {}
        self._active: dict[object, deque[SuffixNode]] = {}  # per sequence: the nodes of its last D - 1 suffixes

    def __len__(self) -> int:
        """The nodes it holds, the root excluded."""
        stack, n = [self.root], -1
        while stack:
            node = stack.pop()
            n += 1
            stack.extend(node.order)
        return n

    def extend(self, key, tokens) -> None:
        """Append `tokens` to sequence `key` (a new one when unknown): every suffix of at most D tokens that ends at
        one of them is counted once."""
        seq = self.seqs.setdefault(key, [])
        active = self._active.setdefault(key, deque())
        root, depth = self.root, self.max_depth
        for t in tokens:
            t = int(t)
            active.append(root)
            root.count += 1
            if len(active) > depth:
                active.popleft()
            seq.append(t)
            for k, node in enumerate(active):
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = SuffixNode(t)
                    node.order.append(child)
                else:
                    _increment(node.order, child)
                active[k] = child

    def remove(self, key) -> None:
        """Forget sequence `key`: each of its suffixes uncounted, nodes no other sequence holds dropped."""
        seq = self.seqs.pop(key)
        del self._active[key]
        root = self.root
        for start in range(len(seq)):
            root.count -= 1
            node = root
            for t in seq[start:start + self.max_depth]:
                child = node.children[t]
                if child.count > 1:
                    _decrement(node.order, child)
                    node = child
                else:
                    del node.children[t]
                    node.order.remove(child)
                    break

    def match(self, context) -> SuffixNode | None:
        """The node of `context` (a path from the root), or None when it occurs nowhere."""
        node = self.root
        for t in context:
            node = node.children.get(t)
            if node is None:
                return None
        return node

    def speculate(self, context: list[int], max_spec_tokens: int, max_spec_factor: float, min_token_prob: float,
                  tree: bool = False, max_depth: int | None = None, max_breadth: int | None = None) -> "Draft":
        """arctic's SuffixTree.speculate: the best-scoring proposal over the matches of context's last 1, 2, ...,
        len(context) - 1 tokens (`Draft`). `max_depth` and `max_breadth` bound a tree further (the toolkit's)."""
        best = Draft()
        factor, min_prob = F32(max_spec_factor), F32(min_token_prob)
        n = len(context)
        for match_len in range(1, n):
            node = self.match(context[n - match_len:])
            if node is None:
                break
            # float32 product, then a double sum and truncation, as arctic's C++ does
            budget = max(0, min(max_spec_tokens, int(float(F32(match_len) * factor) + 1e-6)))
            grow = _speculate_tree if tree else _speculate_path
            draft = grow(node, budget, min_prob, max_depth, max_breadth)
            if draft.score >= best.score:
                best = draft
                best.match_len = match_len
        return best


@dataclass
class Draft:
    """A proposal: token_ids[i]'s parent is token_ids[parents[i]] (-1: the root), probs its estimated probability,
    score their float32 sum, match_len the context match it came from."""

    token_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: np.float32 = F32(0.0)
    match_len: int = 0

    def add(self, token: int, parent: int, prob) -> int:
        self.token_ids.append(token)
        self.parents.append(parent)
        self.probs.append(float(prob))
        self.score = F32(self.score + prob)
        return len(self.token_ids) - 1


def _speculate_path(node: SuffixNode, budget: int, min_prob, max_depth, max_breadth) -> Draft:
    """Along the first child in sibling order (the most frequent), while the path's probability stays at least
    min_prob."""
    draft, prob = Draft(), F32(1.0)
    limit = budget if max_depth is None else min(budget, max_depth)
    while len(draft.token_ids) < limit:
        if not node.order:
            break
        child = node.order[0]
        if not _on_edge(node, child):
            prob = F32(prob * F32(F32(child.count) / F32(node.count)))
        if prob < min_prob:
            break
        draft.add(child.token, len(draft.token_ids) - 1, prob)
        node = child
    return draft


def _speculate_tree(node: SuffixNode, budget: int, min_prob, max_depth, max_breadth) -> Draft:
    """Best first by path probability, in std::priority_queue's order (libstdc++'s heap, as arctic's). An item
    either emits its node's token (a node on its parent's edge, or a child just offered) or offers its node's
    children (the end of an edge): the pops arctic's compressed edges make."""
    draft = Draft()
    heap: list = []  # (node, parent index, probability, emits, depth)
    first = _edge_child(node)
    if first is not None:  # the match ends inside an edge: its next token is emitted first
        _heap_push(heap, (first, -1, F32(1.0), True, 1))
    else:
        _heap_push(heap, (node, -1, F32(1.0), False, 0))
    while heap and len(draft.token_ids) < budget:
        node, parent, prob, emits, depth = _heap_pop(heap)
        if emits:
            if max_depth is not None and depth > max_depth:
                continue
            index = draft.add(node.token, parent, prob)
            nxt = _edge_child(node)
            if nxt is not None:
                _heap_push(heap, (nxt, index, prob, True, depth + 1))
            else:
                _heap_push(heap, (node, index, prob, False, depth))
        else:
            for taken, child in enumerate(node.order):
                p = F32(F32(prob * F32(child.count)) / F32(node.count))
                if p < min_prob or (max_breadth is not None and taken >= max_breadth):
                    break
                _heap_push(heap, (child, parent, p, True, depth + 1))
    return draft


# ---- the cache: each request's tree and the global one -----------------------------------------------------------

class SuffixCache:
    """arctic's SuffixDecodingCache: a tree per running request over its prompt and output, and one global tree
    over the outputs of the last `max_cached_requests` requests started (FIFO)."""

    def __init__(self, max_tree_depth: int, max_cached_requests: int):
        self.max_tree_depth, self.max_cached_requests = max_tree_depth, max_cached_requests
        self.global_tree = SuffixTree(max_tree_depth)
        self.local_trees: dict[object, SuffixTree] = {}
        self.cached: dict[object, None] = {}  # requests whose output the global tree holds, oldest first

    def start_request(self, key, prompt) -> None:
        if key in self.local_trees:
            raise ValueError(f"request {key!r} is already running")
        tree = self.local_trees[key] = SuffixTree(self.max_tree_depth)
        tree.extend(0, prompt)
        if self.max_cached_requests:
            if key in self.cached:
                self.evict(key)
            self.cached[key] = None
            self.global_tree.extend(key, ())
            while len(self.cached) > self.max_cached_requests:
                self.evict(next(k for k in self.cached if k != key))

    def stop_request(self, key) -> None:
        del self.local_trees[key]

    def add_active_response(self, key, tokens) -> None:
        self.local_trees[key].extend(0, tokens)
        if key in self.cached:
            self.global_tree.extend(key, tokens)

    def evict(self, key) -> None:
        del self.cached[key]
        self.global_tree.remove(key)

    def speculate(self, key, context, max_spec_tokens: int, max_spec_factor: float, min_token_prob: float,
                  tree: bool = False, max_depth: int | None = None, max_breadth: int | None = None) -> Draft:
        context = list(context[-self.max_tree_depth:])
        args = (context, max_spec_tokens, max_spec_factor, min_token_prob, tree, max_depth, max_breadth)
        own = self.local_trees[key].speculate(*args)
        cached = self.global_tree.speculate(*args)
        return own if own.score >= cached.score else cached


class SuffixProposer:
    """What the host-proposal worker calls for a `SuffixDraft`: one SuffixCache for every request the worker
    serves, kept across generate calls until `clear` (`Engine.flush_cache`), as vLLM's proposer keeps its cache."""

    def __init__(self, draft: SuffixDraft):
        self.draft = draft
        self.clear()

    def clear(self) -> None:
        d = self.draft
        self.cache = SuffixCache(d.max_tree_depth, d.max_cached_requests)
        self._next_key = 0
        self._keys: list[int] = []

    def bounds(self, num_steps: int, topk: int) -> tuple[int, int]:
        return self.draft.bounds(num_steps, topk)

    def start(self, prompts: list[list[int]], params=None) -> None:
        """A new batch: the last batch's requests stopped, each new one's tree built over its prompt."""
        for key in self._keys:
            self.cache.stop_request(key)
        self._keys = list(range(self._next_key, self._next_key + len(prompts)))
        self._next_key += len(prompts)
        for key, prompt in zip(self._keys, prompts):
            self.cache.start_request(key, prompt)

    def filter(self, keep: list[int]) -> None:
        kept = set(keep)
        for i, key in enumerate(self._keys):
            if i not in kept:
                self.cache.stop_request(key)
        self._keys = [self._keys[i] for i in keep]

    def propose(self, seqs: list[list[int]], new: list[list[int]], max_nodes: int, depth: int,
                breadth: int) -> list[list[tuple[int, int]]]:
        """Each request's new tokens into its trees, then its proposal: (token, parent) nodes, parent 0 the root,
        node i >= 1 the i-th. A chain when breadth is 1 (vLLM's), else a tree of at most max_nodes nodes."""
        d = self.draft
        trees = []
        for key, seq, tokens in zip(self._keys, seqs, new):
            self.cache.add_active_response(key, tokens)
            if depth == 0 or max_nodes == 0:
                trees.append([])
                continue
            chain = breadth == 1
            draft = self.cache.speculate(key, seq[-d.max_tree_depth:], depth if chain else max_nodes,
                                         d.max_spec_factor, d.min_token_prob, tree=not chain, max_depth=depth,
                                         max_breadth=breadth)
            # in arctic's order (a parent before its children): node i + 1 is token_ids[i]
            trees.append([(t, p + 1) for t, p in zip(draft.token_ids, draft.parents)])
        return trees
