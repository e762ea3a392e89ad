"""NGRAM drafting (SGLang's NGRAM speculative algorithm): no model, a trie of n-grams on the host.

By default every rule is SGLang 0.5.23's (`sglang/kernels/jit/csrc/ngram_corpus`: trie.cpp, result.cpp; the worker
`sglang/srt/speculative/ngram_worker.py`), so that a tree proposed here is the one SGLang's `NgramCorpus` proposes
for the same history, token for token and mask for mask:

- one trie for every request (`NgramDraft.shared`), holding n-grams of at most `max_trie_depth` (D) tokens, each
  node with a count and its parent's children in recency order (the child inserted or met last first); past
  `capacity` nodes the least recently touched leaves are dropped;
- a decode step first matches, then indexes: the last D tokens of the request (the root included) are matched
  against the trie (every suffix that is a trie path is an anchor; a request's anchors advance with the tokens its
  steps emit, as SGLang's `MatchState` does, and a suffix that was no path when last matched is not looked up
  again), then those D tokens are inserted (every start, up to D tokens each). A prompt is not indexed as a whole;
  only what passes through a decode step's window is;
- the tree takes up to W - 1 nodes from the anchors that have children, deepest first, a path already in the tree
  reusing its nodes. "BFS" (`match_type`): breadth first, each node's children in recency order, as many as its
  breadth: a d-token match starts at min_bfs_breadth + (max_bfs_breadth - min_bfs_breadth)(D - 1 - d)/(D - 1),
  loses (max_bfs_breadth - min_bfs_breadth)/(D - 1) per level, and takes the integer part (at least 1) at each
  node. "PROB": best first by path probability (a
  child's count over the counts of its parent's first `max_bfs_breadth` children by count, ties by lower token id,
  times its parent's), SGLang's heap order for equal probabilities included;
- node order is SGLang's result order: breadth first, siblings in the order its hash map of token ids yields them.

The toolkit's own choices stay as options: `indexing="sequence"` (each request's prompt indexed at its start and
every committed token once, before the step's match), `child_order="frequency"` (BFS takes each node's children by
descending count) and `shared=False` (one trie per request). A SpecConfig bounds a tree further: depth at most
`num_steps`, children per node at most `topk`; at S >= D - 1 and K >= max_bfs_breadth neither binds, as in SGLang
(which sets topk to max_bfs_breadth and ignores num_steps for NGRAM).

Everything here is host work on Python objects: the host-proposal worker (`specdec.workers.host_proposal`) brings
the last step's tokens down once, calls `NgramProposer`, and sends the tree up once.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..checks import check_int

#: SGLang's speculative_ngram_match_type values (`NgramDraft.match_type`)
MATCH_TYPES = ("BFS", "PROB")
#: where a request's n-grams enter the trie (`NgramDraft.indexing`)
INDEXINGS = ("window", "sequence")
#: BFS's order of a node's children (`NgramDraft.child_order`)
CHILD_ORDERS = ("recency", "frequency")
#: an older SGLang's NGRAM parameters, which SGLang 0.5.23 replaced by max_trie_depth, min/max_bfs_breadth
RETIRED_PARAMETERS = ("min_match_window_size", "max_match_window_size", "branch_length")


@dataclass(frozen=True)
class NgramDraft:
    """The NGRAM draft: SGLang 0.5.23's `speculative_ngram_*` parameters and defaults. Pass it as
    `Engine(target, draft=NgramDraft(...), spec=SpecConfig(num_steps=S, topk=K, num_draft_tokens=W))`: W - 1 bounds
    a proposal's node count, S its depth, K each node's children (SGLang's own bounds are the trie's).

    max_trie_depth: the longest n-gram kept (a d-token match continues at most D - d tokens); min_bfs_breadth,
    max_bfs_breadth: the ends of BFS's breadth, interpolated by match length (module docstring); PROB's children
    per node (max_bfs_breadth); capacity: trie nodes kept
    (the least recently touched leaves dropped first). The toolkit's options (module docstring): shared, indexing,
    child_order."""

    max_trie_depth: int = 18
    min_bfs_breadth: int = 1
    max_bfs_breadth: int = 10
    #: how a step's tree is taken from the trie, SGLang's speculative_ngram_match_type: "BFS" breadth first with a
    #: breadth that narrows with match length and depth; "PROB" best first by the estimated probability of the
    #: node's path, so a node count goes where the earlier continuations agree
    match_type: str = "BFS"
    capacity: int = 10_000_000
    #: one trie for every request this draft serves, kept across generate calls until `Engine.flush_cache`
    #: (SGLang's); False: one per request, over its own tokens only
    shared: bool = True
    #: "window": each decode step inserts the last max_trie_depth tokens after its match (SGLang's); "sequence":
    #: each request's prompt is indexed at its start and every committed token once, before the step's match
    indexing: str = "window"
    #: BFS's order of a node's children: "recency" (SGLang's) or "frequency" (descending count, ties by token id)
    child_order: str = "recency"
    #: named when a tuned file made for them is refused (`TunedSpec.check_pair`)
    RETIRED_PARAMETERS: ClassVar[tuple[str, ...]] = RETIRED_PARAMETERS

    def __new__(cls, *args, **kwargs):
        retired = [name for name in RETIRED_PARAMETERS if name in kwargs]
        if retired:
            raise ValueError(f"NgramDraft: {', '.join(retired)} are an older SGLang's NGRAM parameters; SGLang "
                             f"0.5.23's are max_trie_depth (a d-token match continues at most D - d tokens), "
                             f"min_bfs_breadth and max_bfs_breadth")
        return super().__new__(cls)

    def __post_init__(self):
        # SGLang refuses a depth of 1: a 1-token n-gram has no continuation to propose
        check_int("max_trie_depth", self.max_trie_depth, 2)
        check_int("min_bfs_breadth", self.min_bfs_breadth, 1)
        check_int("max_bfs_breadth", self.max_bfs_breadth, self.min_bfs_breadth)
        # one insert walk takes up to max_trie_depth new nodes beside the root
        check_int("capacity", self.capacity, self.max_trie_depth + 1)
        for name, value, allowed in (("match_type", self.match_type, MATCH_TYPES),
                                     ("indexing", self.indexing, INDEXINGS),
                                     ("child_order", self.child_order, CHILD_ORDERS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if not isinstance(self.shared, bool):
            raise ValueError(f"shared must be True or False, got {type(self.shared).__name__} {self.shared!r}")

    def new_proposer(self) -> "NgramProposer":
        return NgramProposer(self)

    def bounds(self, num_steps: int, topk: int) -> tuple[int, int]:
        """A tree's depth and children per node under a SpecConfig: a match of at least one token continues at most
        D - 1, and BFS takes at most max_bfs_breadth children."""
        return min(num_steps, self.max_trie_depth - 1), min(topk, self.max_bfs_breadth)


def ngram_draft_for(target) -> NgramDraft:
    """The NGRAM draft a speed run on `target` uses: SGLang's defaults (no model: any target)."""
    return NgramDraft()


# ---- the trie ----------------------------------------------------------------------------------------------------

class TrieNode:
    """A trie node: its token, count, parent, and children by token in recency order (the most recent last)."""

    __slots__ = ("token", "parent", "children", "freq", "alive", "depth")

    def __init__(self, token: int, parent: "TrieNode | None"):
        self.token, self.parent, self.children, self.freq, self.alive = token, parent, {}, 1, True
        self.depth = 0 if parent is None else parent.depth + 1

    def by_recency(self):
        return reversed(self.children.values())

    def by_frequency(self) -> list["TrieNode"]:
        return sorted(self.children.values(), key=lambda n: (-n.freq, n.token))


class MatchState:
    """A request's anchors: `anchors[d - 1]` the trie node of its last d tokens (None: no path when matched), as of
    `processed` tokens, valid while the trie's `epoch` is the one recorded."""

    __slots__ = ("epoch", "processed", "anchors")

    def __init__(self):
        self.epoch, self.processed, self.anchors = 0, 0, []


class NgramTrie:
    """SGLang's n-gram trie: n-grams of at most `max_depth` tokens, at most `capacity` nodes (the root included)."""

    def __init__(self, max_depth: int, capacity: int):
        self.max_depth, self.capacity = max_depth, capacity
        self.epoch = 0
        self.reset()

    def reset(self) -> None:
        """Empty; every request's match state is stale."""
        self.epoch += 1
        self.root = TrieNode(-1, None)
        self.lru: OrderedDict[TrieNode, None] = OrderedDict()  # every node but the root, the most recent last
        self.free = self.capacity - 1

    def __len__(self) -> int:
        return len(self.lru)

    def _child(self, node: TrieNode, token: int) -> TrieNode:
        """`node`'s child `token`, created or counted once more, now its most recent child."""
        child = node.children.pop(token, None)
        if child is None:
            child = TrieNode(token, node)
            self.lru[child] = None
            self.free -= 1
        else:
            child.freq += 1
        node.children[token] = child
        return child

    def _make_room(self, nodes: int) -> None:
        if nodes > self.free:
            for _ in range(nodes - self.free):
                # the least recently touched node is a leaf: a path touches its nodes deepest first
                node, _ = self.lru.popitem(last=False)
                del node.parent.children[node.token]
                node.alive = False
            self.free = nodes

    def _touch(self, path: list[TrieNode]) -> None:
        for node in reversed(path):  # the shallowest ends the most recent
            self.lru.move_to_end(node)

    def insert(self, tokens) -> None:
        """SGLang's insert: from every start of `tokens`, the next (up to) max_depth tokens as one path."""
        n = len(tokens)
        for i in range(n):
            end = min(n, i + self.max_depth)
            self._make_room(end - i)
            cursor, path = self.root, []
            for t in tokens[i:end]:
                cursor = self._child(cursor, t)
                path.append(cursor)
            self._touch(path)

    def extend(self, open_paths: list[TrieNode], token: int) -> list[TrieNode]:
        """Index one more token of a sequence (`indexing="sequence"`): `open_paths` are the nodes of its suffixes
        shorter than max_depth (longest first); each n-gram ending at the new token is counted once. -> the new
        open paths."""
        self._make_room(len(open_paths) + 1)
        grown = [self._child(node, token) for node in open_paths if node.alive]
        grown.append(self._child(self.root, token))
        self._touch(grown[::-1])
        return [node for node in grown if node.depth < self.max_depth]

    # ---- matching: SGLang's stateful matcher --------------------------------------------------------------------
    def match(self, context: list[int], total_len: int, state: MatchState) -> list[tuple[TrieNode, int]]:
        """The anchors with children, deepest first, of a request whose last `len(context)` (<= max_depth) of its
        `total_len` tokens are `context`: its cached anchors advanced by the tokens appended since they were
        matched, or all rebuilt from `context` when they cannot be (a new request, a reset trie, a dropped node)."""
        forward = total_len >= state.processed
        appended = total_len - state.processed if forward else 0
        if not (state.epoch == self.epoch and forward and appended <= len(context)
                and len(state.anchors) == min(state.processed, self.max_depth)
                and self._advance(state, context[len(context) - appended:], total_len)):
            self._rebuild(context, state, total_len)
        return [(node, d) for d in range(len(state.anchors), 0, -1)
                if (node := state.anchors[d - 1]) is not None and node.alive and node.children]

    def _rebuild(self, context: list[int], state: MatchState, total_len: int) -> None:
        state.epoch, state.processed = self.epoch, total_len
        state.anchors = []
        for d in range(1, min(len(context), self.max_depth) + 1):
            node = self.root
            for t in context[len(context) - d:]:
                node = node.children.get(t)
                if node is None:
                    break
            state.anchors.append(node)

    def _advance(self, state: MatchState, tokens: list[int], total_len: int) -> bool:
        if any(node is not None and not node.alive for node in state.anchors):
            return False
        anchors = state.anchors
        for t in tokens:
            # a suffix that was no path stays None: SGLang looks up only the extensions of the anchors it has
            nxt = [self.root.children.get(t)]
            for prev in anchors[:min(len(anchors) + 1, self.max_depth) - 1]:
                nxt.append(None if prev is None else prev.children.get(t))
            anchors = nxt
        state.anchors, state.processed = anchors, total_len
        return True


# ---- a step's tree -----------------------------------------------------------------------------------------------

def build_tree(anchors: list[tuple[TrieNode, int]], draft: NgramDraft, max_nodes: int, max_depth: int | None = None,
               max_breadth: int | None = None) -> list[tuple[int, int]]:
    """A step's proposal from its anchors (`NgramTrie.match`): up to `max_nodes` nodes (token, parent), parent 0
    the root, node i >= 1 the i-th of the list, in SGLang's result order (`_result_order`). `max_depth` and
    `max_breadth` (a SpecConfig's num_steps and topk) bound it further where they are smaller than the trie's."""
    max_depth = max_depth if max_depth is not None else draft.max_trie_depth
    max_breadth = max_breadth if max_breadth is not None else draft.max_bfs_breadth
    grow = _grow_by_probability if draft.match_type == "PROB" else _grow_breadth_first
    children: list[dict[int, int]] = [{}]  # per tree node (0 the root): token -> tree node, in insertion order
    depths = [0]
    grow(anchors, draft, children, depths, max_nodes, max_depth, max_breadth)
    return _result_order(children)


def _place(children, depths, parent: int, token: int) -> int:
    node = children[parent].get(token)
    if node is None:
        node = children[parent][token] = len(children)
        children.append({})
        depths.append(depths[parent] + 1)
    return node


def _grow_breadth_first(anchors, draft, children, depths, max_nodes, max_depth, max_breadth) -> None:
    longest = max(1, draft.max_trie_depth - 1)
    # the breadth falls by `step` per match token and per level: max_bfs_breadth after a 1-token match,
    # min_bfs_breadth after a (D-1)-token one; computed in SGLang's order so that truncation agrees
    step = (draft.max_bfs_breadth - draft.min_bfs_breadth) / longest
    ordered = TrieNode.by_frequency if draft.child_order == "frequency" else TrieNode.by_recency
    for anchor, match_len in anchors:
        queue = deque([(0, (longest - match_len) * step + draft.min_bfs_breadth, anchor)])
        while queue and len(children) <= max_nodes:
            parent, breadth, node = queue.popleft()
            if depths[parent] >= max_depth:
                continue
            taken = min(max_breadth, max(1, int(breadth)))
            for child in ordered(node):
                if taken == 0 or len(children) > max_nodes:
                    break
                taken -= 1
                queue.append((_place(children, depths, parent, child.token), breadth - step, child))


def _grow_by_probability(anchors, draft, children, depths, max_nodes, max_depth, max_breadth) -> None:
    heap: list = []  # (tree node, trie node, path probability), in std::priority_queue's layout
    top = min(draft.max_bfs_breadth, max_breadth)

    def offer(parent: int, node: TrieNode, prob: float) -> None:
        if depths[parent] >= max_depth:
            return
        kids = node.by_frequency()[:top]
        total = float(sum(k.freq for k in kids)) or 1.0
        for k in kids:
            _heap_push(heap, (parent, k, k.freq / total * prob))

    # one heap for every anchor, as SGLang's: once the tree is full the later anchors add nothing
    for anchor, _ in anchors:
        offer(0, anchor, 1.0)
        while heap and len(children) <= max_nodes:
            parent, node, prob = _heap_pop(heap)
            offer(_place(children, depths, parent, node.token), node, prob)


def _heap_push(heap: list, item) -> None:
    """std::push_heap (libstdc++) on a max-heap by probability: where equal probabilities land decides which is
    taken first, so SGLang's order is kept exactly rather than a stable one."""
    heap.append(item)
    hole = len(heap) - 1
    while hole > 0 and heap[(hole - 1) // 2][2] < item[2]:
        heap[hole] = heap[(hole - 1) // 2]
        hole = (hole - 1) // 2
    heap[hole] = item


def _heap_pop(heap: list):
    """std::pop_heap (libstdc++) then pop_back: the top item."""
    top, value = heap[0], heap.pop()
    n = len(heap)
    if n == 0:
        return top
    hole = child = 0
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        if heap[child][2] < heap[child - 1][2]:
            child -= 1
        heap[hole] = heap[child]
        hole = child
    if n % 2 == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        heap[hole] = heap[child - 1]
        hole = child - 1
    while hole > 0 and heap[(hole - 1) // 2][2] < value[2]:
        heap[hole] = heap[(hole - 1) // 2]
        hole = (hole - 1) // 2
    heap[hole] = value
    return top


def _result_order(children: list[dict[int, int]]) -> list[tuple[int, int]]:
    """The tree breadth first from the root, each node's children in the order SGLang's result reads them: the
    iteration order of a libstdc++ `std::unordered_map<int32_t, int32_t>` filled in insertion order. That order
    decides which sibling a sampled verify tries first, so it is reproduced rather than canonicalised."""
    out: list[tuple[int, int]] = []
    queue = deque((token, node, 0) for token, node in _unordered_map_order(children[0]))
    while queue:
        token, node, parent = queue.popleft()
        out.append((token, parent))
        here = len(out)
        queue.extend((t, n, here) for t, n in _unordered_map_order(children[node]))
    return out


#: libstdc++'s bucket counts: `_Prime_rehash_policy`'s small-size table, then the primes it grows through
_FAST_BUCKETS = (2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13)
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 103, 109,
           113, 127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257, 277, 293, 313, 337, 359, 383, 409,
           439, 467, 503, 541, 577, 619, 661, 709, 761, 823, 887, 953, 1031, 1109, 1193, 1289, 1381, 1493, 1613, 1741,
           1879, 2029, 2179, 2357, 2549, 2753, 2971, 3209, 3469, 3739, 4027, 4349, 4703, 5087, 5503, 5953, 6427, 6949)


def _next_bucket_count(n: int) -> tuple[int, int]:
    """_Prime_rehash_policy::_M_next_bkt(n) -> (bucket count, element count that triggers the next rehash)."""
    if n < len(_FAST_BUCKETS):
        return _FAST_BUCKETS[n], _FAST_BUCKETS[n]
    prime = next(p for p in _PRIMES if p >= n)
    return prime, prime


def _unordered_map_order(entries: dict[int, int]) -> list[tuple[int, int]]:
    """The (key, value) pairs of `entries` (insertion-ordered, non-negative int keys) in the order a libstdc++
    unordered_map with std::hash<int> (identity) and load factor 1 iterates them after the same insertions."""
    order: list[int] = []  # the singly linked node list, front first
    buckets, next_resize = 1, 0
    for key in entries:
        if len(order) + 1 > next_resize:
            smallest = max(len(order) + 1, 0 if next_resize else 11)
            if smallest >= buckets:
                buckets, next_resize = _next_bucket_count(max(smallest + 1, buckets * 2))
                # a rehash walks the list and re-inserts each node as an insertion does
                relaid: list[int] = []
                for k in order:
                    _bucket_insert(relaid, k, buckets)
                order = relaid
            else:
                next_resize = buckets
        _bucket_insert(order, key, buckets)
    return [(k, entries[k]) for k in order]


def _bucket_insert(order: list[int], key: int, buckets: int) -> None:
    """A node into a non-empty bucket goes first in that bucket's run, one into an empty bucket first in the list."""
    bucket = key % buckets
    first = next((i for i, k in enumerate(order) if k % buckets == bucket), None)
    order.insert(0 if first is None else first, key)


# ---- the verify input --------------------------------------------------------------------------------------------

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


# ---- what the worker calls ---------------------------------------------------------------------------------------

class NgramProposer:
    """What the host-proposal worker calls for an `NgramDraft`: each request's trie (the shared one, kept across
    generate calls until `clear`, or its own), its match state, and with indexing="sequence" the trie nodes of its
    suffixes still growing."""

    def __init__(self, draft: NgramDraft):
        self.draft = draft
        self.shared_trie: NgramTrie | None = None
        self.clear()
        self._tries: list[NgramTrie] = []
        self._match_states: list[MatchState] = []
        self._open_paths: list[list] = []

    def clear(self) -> None:
        """A shared draft's trie starts empty again (SGLang's NGRAM worker's `clear_cache_pool`)."""
        d = self.draft
        if d.shared:
            self.shared_trie = NgramTrie(d.max_trie_depth, d.capacity)

    def start(self, prompts: list[list[int]], params=None) -> None:
        d = self.draft
        shared = self.shared_trie
        self._tries = [shared if shared is not None else NgramTrie(d.max_trie_depth, d.capacity) for _ in prompts]
        self._match_states = [MatchState() for _ in prompts]
        self._open_paths = [[] for _ in prompts]
        if d.indexing == "sequence":
            for i, (trie, seq) in enumerate(zip(self._tries, prompts)):
                for t in seq:
                    self._open_paths[i] = trie.extend(self._open_paths[i], t)

    def filter(self, keep: list[int]) -> None:
        for name in ("_tries", "_match_states", "_open_paths"):
            setattr(self, name, [getattr(self, name)[i] for i in keep])

    def propose(self, seqs: list[list[int]], new: list[list[int]], max_nodes: int, depth: int,
                breadth: int) -> list[list[tuple[int, int]]]:
        """Each request's tree from its last max_trie_depth tokens (`build_tree`); the trie indexed as `indexing`
        says (SGLang's: every request's window after every request's match)."""
        d = self.draft
        D, by_sequence = d.max_trie_depth, d.indexing == "sequence"
        trees, windows = [], []
        for i, (trie, seq, tokens) in enumerate(zip(self._tries, seqs, new)):
            if by_sequence:
                for t in tokens:
                    self._open_paths[i] = trie.extend(self._open_paths[i], t)
            window = seq[-D:]
            windows.append(window)
            anchors = trie.match(window, len(seq), self._match_states[i]) if depth else []
            trees.append(build_tree(anchors, d, max_nodes, depth, breadth))
        if not by_sequence:
            # after every request's match, as SGLang inserts the batch's windows after its verify
            for trie, window in zip(self._tries, windows):
                trie.insert(window)
        return trees
