"""NGRAM drafting (SGLang's NGRAM speculative algorithm): no model, a trie of continuations on the host.

Each request's prompt and output (and, with `shared=True`, every sequence any request of this draft has decoded,
as SGLang's cache keeps them across requests) is indexed by its n-grams of `min_match_window_size` to
`max_match_window_size` tokens. A step matches the longest suffix of the request's sequence that occurred before,
collects what followed each earlier occurrence (up to `branch_length` tokens, and the step's depth), merges those
continuations into a trie weighted by how often each prefix occurred, and takes up to W - 1 nodes of it breadth
first, each node's children by descending frequency, at most `max_bfs_breadth` of them (and at most the
SpecConfig's topk). When that trie leaves room, the next shorter suffix that occurred before fills it the same way,
and so on down to `min_match_window_size` (SGLang's match anchors, deepest first), a path already in the tree
keeping its node. The target verifies the tree with the same tree verify as EAGLE's; a request whose suffix
never occurred before proposes nothing and decodes one token that step.

Everything here is host work on Python lists: the worker brings the last step's tokens down once and sends the
tree up once (`specdec.workers.ngram`).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import torch

from .checks import check_int

#: the earlier occurrences of a matched suffix a step reads (the most recent ones): bounds a step's host time
MAX_OCCURRENCES = 64
#: SGLang's speculative_ngram_match_type values (`NgramDraft.match_type`)
MATCH_TYPES = ("BFS", "PROB")


@dataclass(frozen=True)
class NgramDraft:
    """The NGRAM draft: SGLang's `speculative_ngram_*` parameters. Pass it as `Engine(target, draft=NgramDraft(...),
    spec=SpecConfig(num_steps=S, topk=K, num_draft_tokens=W))`: S bounds a proposal's depth, W - 1 its node count,
    min(K, max_bfs_breadth) each node's children.

    min_match_window_size <= max_match_window_size: the suffix lengths matched (longest first); max_bfs_breadth:
    children per node; branch_length: the longest continuation read after an occurrence; shared: one index over
    every sequence this draft has seen (kept across generate calls, up to `capacity` tokens, oldest dropped first)
    instead of one per request over its own prompt and output."""

    min_match_window_size: int = 1
    max_match_window_size: int = 12
    max_bfs_breadth: int = 10
    branch_length: int = 18
    shared: bool = False
    capacity: int = 1_000_000
    #: how a step's tree is taken from the trie, SGLang's speculative_ngram_match_type: "BFS" breadth first, each
    #: node's children by descending count; "PROB" best first by the estimated probability of the node's path
    #: (each child's count over its counted siblings', times its parent's), so a node count goes where the
    #: earlier continuations agree, deep along one that always recurred rather than wide over ones seen once
    match_type: str = "BFS"

    def __post_init__(self):
        check_int("min_match_window_size", self.min_match_window_size, 1)
        check_int("max_match_window_size", self.max_match_window_size, self.min_match_window_size)
        check_int("max_bfs_breadth", self.max_bfs_breadth, 1)
        check_int("branch_length", self.branch_length, 1)
        check_int("capacity", self.capacity, 1)
        if self.match_type not in MATCH_TYPES:
            raise ValueError(f"match_type must be one of {MATCH_TYPES}, got {self.match_type!r}")
        if not isinstance(self.shared, bool):
            raise ValueError(f"shared must be True or False, got {type(self.shared).__name__} {self.shared!r}")


class NgramIndex:
    """Sequences of token ids and, for every n-gram of n in [min_n, max_n] in them, where it ended."""

    def __init__(self, min_n: int, max_n: int, capacity: int | None = None):
        self.min_n, self.max_n, self.capacity = min_n, max_n, capacity
        self.seqs: dict[int, list[int]] = {}
        self.ends: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        self._next_id = 0
        self._size = 0
        #: the sequences still growing (requests in flight): never dropped to make room
        self.active: set[int] = set()

    def add(self, tokens) -> int:
        """A new sequence holding `tokens` -> its id."""
        sid = self._next_id
        self._next_id += 1
        self.seqs[sid] = []
        self.extend(sid, tokens)
        return sid

    def extend(self, sid: int, tokens) -> None:
        seq = self.seqs[sid]
        for t in tokens:
            seq.append(int(t))
            end = len(seq)
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.ends.setdefault(tuple(seq[end - n:end]), []).append((sid, end))
        self._size += len(tokens)
        if self.capacity is not None:
            idle = sorted(set(self.seqs) - self.active)
            while self._size > self.capacity and idle:
                self.drop(idle.pop(0))

    def drop(self, sid: int) -> None:
        """Forget sequence `sid` (its n-grams too)."""
        seq = self.seqs.pop(sid)
        self._size -= len(seq)
        for end in range(1, len(seq) + 1):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(seq[end - n:end])
                rows = [e for e in self.ends.get(key, ()) if e[0] != sid]
                if rows:
                    self.ends[key] = rows
                else:
                    self.ends.pop(key, None)

    def continuations(self, suffix: list[int], sid: int, length: int) -> list[list[int]]:
        """The tokens (up to `length`) that followed each earlier occurrence of the longest matchable suffix of
        `suffix`, most recent first; [] when none occurred (the occurrence ending the sequence `sid` itself is not
        an earlier one)."""
        return next(iter(self.anchored_continuations(suffix, sid, length)), [])

    def anchored_continuations(self, suffix: list[int], sid: int, length: int):
        """For each suffix length of `suffix` that occurred before, longest first (SGLang's match anchors): the
        tokens (up to `length`) that followed each of its earlier occurrences, most recent first, at most
        `MAX_OCCURRENCES` of them. A generator: a tree that is full after the longest stops reading."""
        here = len(self.seqs[sid]) if sid in self.seqs else -1
        for n in range(min(self.max_n, len(suffix)), self.min_n - 1, -1):
            found = []
            for s, end in reversed(self.ends.get(tuple(suffix[-n:]), ())):
                if s == sid and end == here:
                    continue
                follow = self.seqs[s][end:end + length]
                if follow:
                    found.append(follow)
                    if len(found) == MAX_OCCURRENCES:
                        break
            if found:
                yield found


def ngram_draft_for(target) -> NgramDraft:
    """The NGRAM draft a speed run on `target` uses: SGLang's defaults (no model: any target)."""
    return NgramDraft()


def _trie(continuations: list[list[int]]) -> dict:
    """Continuations -> their trie: token -> [count, rank of the first continuation through it, children]."""
    trie: dict = {}
    for rank, path in enumerate(continuations):
        level = trie
        for t in path:
            entry = level.setdefault(t, [0, rank, {}])
            entry[0] += 1
            level = entry[2]
    return trie


def _ranked_children(level: dict, breadth: int) -> list:
    """A trie level's first `breadth` children by descending count (ties: the more recent continuation first)."""
    return sorted(level.items(), key=lambda kv: (-kv[1][0], kv[1][1]))[:breadth]


def continuation_tree(continuations: list[list[int]], max_nodes: int, breadth: int,
                      match_type: str = "BFS") -> list[tuple[int, int]]:
    """Continuations -> up to `max_nodes` nodes (token, parent) of their trie (parent 0 is the root, node i >= 1 is
    the i-th of the list, and parents precede children); each node's children ranked by descending count (ties: the
    more recent continuation first), at most `breadth` of them. "BFS" takes them breadth first; "PROB" best first by
    path probability, a child's count over the counts of its parent's ranked children times its parent's (ties: the
    node reached first)."""
    return anchored_tree([continuations], max_nodes, breadth, match_type)


def anchored_tree(anchors, max_nodes: int, breadth: int, match_type: str = "BFS") -> list[tuple[int, int]]:
    """One tree from several anchors' continuations (`NgramIndex.anchored_continuations`, longest match first), as
    SGLang builds it: each anchor's trie in turn adds its nodes as `continuation_tree` takes them, a path already in
    the tree reusing its nodes, until `max_nodes`. The first anchor's nodes are `continuation_tree`'s; a later
    anchor's only fill what the earlier ones left."""
    nodes: list[tuple[int, int]] = []
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> node

    def place(token: int, parent: int) -> int | None:
        """The node for `token` under `parent`: the one already there, a new one, or None when the tree is full."""
        node = index.get((parent, token))
        if node is None and len(nodes) < max_nodes:
            nodes.append((token, parent))
            node = index[(parent, token)] = len(nodes)
        return node

    grow = _grow_by_probability if match_type == "PROB" else _grow_breadth_first
    for continuations in anchors:
        if len(nodes) == max_nodes:
            break
        grow(_trie(continuations), place, breadth)
    return nodes


def _grow_breadth_first(trie: dict, place, breadth: int) -> None:
    frontier = [(0, trie)]
    while frontier:
        nxt = []
        for parent, level in frontier:
            for token, (_, _, children) in _ranked_children(level, breadth):
                node = place(token, parent)
                if node is None:
                    return
                nxt.append((node, children))
        frontier = nxt


def _grow_by_probability(trie: dict, place, breadth: int) -> None:
    heap: list = []  # (-path probability, order pushed, token, parent node, children)
    pushed = 0

    def offer(parent: int, level: dict, prob: float) -> None:
        nonlocal pushed
        kids = _ranked_children(level, breadth)
        total = sum(entry[0] for _, entry in kids)
        for token, (count, _, children) in kids:
            # rounded so that paths equal in exact arithmetic tie, and the one reached first wins
            heapq.heappush(heap, (-round(prob * count / total, 12), pushed, token, parent, children))
            pushed += 1

    offer(0, trie, 1.0)
    while heap:
        neg_prob, _, token, parent, children = heapq.heappop(heap)
        node = place(token, parent)
        if node is None:
            return
        offer(node, children, -neg_prob)


def verify_input(roots: list[int], trees: list[list[tuple[int, int]]], committed: list[int], W: int):
    """Host tensors of a verify tree per request (node 0 the root; nodes 1..m its proposal, the rest padding that no
    link reaches, so verify never visits it) -> candidates (B, W) int64, tree_mask (B, W, W) bool, positions (B, W)
    int64 (committed length + depth), retrieve_index, retrieve_next_token, retrieve_next_sibling (B, W) int64."""
    # numpy on the host: element writes cost a tenth of torch's, and this runs every step for every request
    B = len(roots)
    candidates = np.repeat(np.asarray(roots, dtype=np.int64)[:, None], W, axis=1)  # padding repeats the root
    tree_mask = np.zeros((B, W, W), dtype=bool)
    tree_mask[:, :, 0] = True  # every node attends the root; each row is its parent's plus itself
    idx = np.arange(W)
    tree_mask[:, idx, idx] = True  # padding: the root and itself
    depth = np.ones((B, W), dtype=np.int64)
    depth[:, 0] = 0
    next_token = np.full((B, W), -1, dtype=np.int64)
    next_sibling = np.full((B, W), -1, dtype=np.int64)
    for b, nodes in enumerate(trees):
        mask, dep, nxt, sib = tree_mask[b], depth[b], next_token[b], next_sibling[b]
        last_child = [-1] * W
        for i, (token, parent) in enumerate(nodes, start=1):
            candidates[b, i] = token
            dep[i] = dep[parent] + 1
            mask[i] = mask[parent]
            mask[i, i] = True
            if last_child[parent] < 0:
                nxt[parent] = i
            else:
                sib[last_child[parent]] = i
            last_child[parent] = i
    positions = np.asarray(committed, dtype=np.int64)[:, None] + depth
    retrieve_index = torch.arange(B * W, dtype=torch.int64).view(B, W)
    return (torch.from_numpy(candidates), torch.from_numpy(tree_mask), torch.from_numpy(positions), retrieve_index,
            torch.from_numpy(next_token), torch.from_numpy(next_sibling))
