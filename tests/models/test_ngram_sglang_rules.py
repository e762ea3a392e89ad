"""NGRAM's trees follow SGLang 0.5.23's NgramCache rules, each against a trie worked by hand: parameters, BFS child
order, breadth, depth, PROB ties and heap order, every occurrence counted, indexing, the stateful matcher, and the
order SGLang's result lists nodes in. Each test fails when its rule is reverted to the toolkit's older one."""
import pytest

from specdec import Engine, SamplingParams, SpecConfig
from specdec.models.ngram import MatchState, NgramDraft, NgramTrie, _unordered_map_order, build_tree


def trie_of(*sequences, depth=4):
    trie = NgramTrie(depth, 10_000)
    for seq in sequences:
        trie.insert(seq)
    return trie


def tree_after(trie, context, draft, max_nodes, state=None):
    return build_tree(trie.match(context, len(context), state or MatchState()), draft, max_nodes)


# ---- rule 1: SGLang 0.5.23's parameters, names and defaults ----------------------------------------------------

def test_the_parameters_are_sglang_0_5_23s():
    """server_args' speculative_ngram_* defaults: max_trie_depth 18, min/max_bfs_breadth 1/10, BFS, capacity 10M;
    SGLang's worker keeps one trie for every request and indexes decode windows only."""
    d = NgramDraft()
    assert (d.max_trie_depth, d.min_bfs_breadth, d.max_bfs_breadth, d.match_type, d.capacity) == (
        18, 1, 10, "BFS", 10_000_000)
    assert (d.shared, d.indexing, d.child_order) == (True, "window", "recency")


@pytest.mark.parametrize("old", ["min_match_window_size", "max_match_window_size", "branch_length"])
def test_an_older_sglangs_parameter_is_refused_naming_the_new_ones(old):
    with pytest.raises(ValueError, match=f"{old} are an older SGLang's NGRAM parameters; SGLang 0.5.23's are "
                                         r"max_trie_depth \(.*\), min_bfs_breadth and max_bfs_breadth"):
        NgramDraft(**{old: 4})


@pytest.mark.parametrize("kw, match", [
    (dict(max_trie_depth=1), "max_trie_depth must be an int >= 2, got 1"),
    (dict(min_bfs_breadth=0), "min_bfs_breadth"),
    (dict(min_bfs_breadth=3, max_bfs_breadth=2), "max_bfs_breadth"),
    (dict(capacity=18), "capacity"),
    (dict(shared=1), "shared must be True or False"),
    (dict(match_type="prob"), r"match_type must be one of \('BFS', 'PROB'\), got 'prob'"),
    (dict(indexing="prompt"), r"indexing must be one of \('window', 'sequence'\), got 'prompt'"),
    (dict(child_order="count"), r"child_order must be one of \('recency', 'frequency'\)"),
])
def test_bad_ngram_drafts_are_value_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        NgramDraft(**kw)


# ---- rule 2: BFS takes the most recently inserted child first --------------------------------------------------

def test_bfs_takes_the_most_recent_child_first():
    """After 7: 1 twice, then 2 once. SGLang's recency list puts 2 first; descending count would put 1 first."""
    trie = trie_of([7, 1], [7, 1], [7, 2])
    draft = NgramDraft(max_trie_depth=4)
    assert tree_after(trie, [7], draft, 1) == [(2, 0)]
    assert tree_after(trie, [7], NgramDraft(max_trie_depth=4, child_order="frequency"), 1) == [(1, 0)]
    trie.insert([7, 1])  # met again: 1 is the most recent once more
    assert tree_after(trie, [7], draft, 1) == [(1, 0)]


# ---- rule 3: the breadth interpolates by match length and narrows per level ------------------------------------

def test_bfs_breadth_follows_the_match_length_and_narrows_per_level():
    """D = 5, breadth 1..5: the step is (5 - 1) / (5 - 1) = 1. A 1-token match starts at (4 - 1) * 1 + 1 = 4 children
    at the root, 3 under each of them; a 2-token match starts at 3. After 9: a = 1..5, after each a: 10a + 1..4."""
    trie = trie_of(*([9, a, 10 * a + b] for a in range(1, 6) for b in range(1, 5)), depth=5)
    draft = NgramDraft(max_trie_depth=5, min_bfs_breadth=1, max_bfs_breadth=5)
    nodes = tree_after(trie, [9], draft, 100)
    roots = [i for i, (_, parent) in enumerate(nodes, start=1) if parent == 0]
    assert sorted(nodes[i - 1][0] for i in roots) == [2, 3, 4, 5]  # the four most recent
    for r in roots:
        a = nodes[r - 1][0]
        assert sorted(t for t, parent in nodes if parent == r) == [10 * a + 2, 10 * a + 3, 10 * a + 4]
    assert len(nodes) == 4 + 4 * 3
    # a 2-token match (9, 5) starts at 3: 54, 53, 52; then the 1-token anchor 5 at 4 adds 51
    deeper = tree_after(trie, [9, 5], draft, 3)
    assert sorted(t for t, _ in deeper) == [52, 53, 54]


# ---- rule 4: n-grams of at most max_trie_depth tokens ----------------------------------------------------------

def test_a_d_token_match_continues_at_most_depth_minus_d_tokens():
    """D = 4 over 1..6: the anchor 1-2 continues 3-4 (4 - 2 tokens), the anchor 2 then adds 5 under 4 (4 - 1)."""
    trie = trie_of([1, 2, 3, 4, 5, 6])
    draft = NgramDraft(max_trie_depth=4)
    anchors = trie.match([1, 2], 2, MatchState())
    assert [d for _, d in anchors] == [2, 1]
    assert build_tree(anchors[:1], draft, 10) == [(3, 0), (4, 1)]
    assert build_tree(anchors, draft, 10) == [(3, 0), (4, 1), (5, 2)]  # never 6: no 5-gram is kept


# ---- rule 5: PROB ranks equal counts by token id, and takes equal probabilities in std::priority_queue's order ---

def test_prob_ranks_equal_counts_by_token_id():
    """After 7: 2 then 3, once each (3 the more recent). One child per node: the lower token id."""
    trie = trie_of([7, 2], [7, 3])
    assert tree_after(trie, [7], NgramDraft(max_trie_depth=4, max_bfs_breadth=1, match_type="PROB"), 1) == [(2, 0)]


def test_prob_takes_equal_probabilities_in_the_heap_order_of_libstdcxx():
    """Four children of 7 at 1/4 each, pushed 1, 2, 3, 4 (token order). libstdc++'s pop moves 4 into the hole and
    sifts it down: the heap [1, 2, 3, 4] pops 1, becomes [3, 2, 4] (equal keys never swap up), then pops 3, not 2.
    The tree's root children 1 and 3 are then listed as a 13-bucket unordered_map iterates them: 3, 1."""
    trie = trie_of([7, 1], [7, 2], [7, 3], [7, 4])
    assert tree_after(trie, [7], NgramDraft(max_trie_depth=4, max_bfs_breadth=4, match_type="PROB"), 2) == [
        (3, 0), (1, 0)]


# ---- rule 6: every occurrence counts ---------------------------------------------------------------------------

def test_every_occurrence_counts_however_long_ago():
    """7-5 once, then 7-1 seventy times: the trie keeps 5 under 7 (the older index read the latest 64 occurrences
    only, and 5 was the 71st), and PROB weighs 1 by its 70, 5 by its 1."""
    trie = trie_of([7, 5], *([[7, 1]] * 70))
    assert tree_after(trie, [7], NgramDraft(max_trie_depth=4, min_bfs_breadth=2, max_bfs_breadth=2), 2) == [
        (5, 0), (1, 0)]  # listed as SGLang's hash map iterates them
    # PROB with 50 early and 40 late: the counts decide (the latest 64 would have favoured 2, 40 to 24)
    trie = trie_of(*([[7, 1]] * 50), *([[7, 2]] * 40))
    assert tree_after(trie, [7], NgramDraft(max_trie_depth=4, max_bfs_breadth=1, match_type="PROB"), 1) == [(1, 0)]
    node = trie.root.children[7]
    assert (node.children[1].freq, node.children[2].freq) == (50, 40)


# ---- rule 7: one trie for every request, indexed with each decode step's window after its match ---------------

def small_target():
    from specdec.models import random_llama
    return random_llama(vocab_size=40, hidden_size=32, num_hidden_layers=2, seed=3)


def recorded_trees(monkeypatch):
    """The trees the worker builds, step by step (the NGRAM proposer's build_tree, recorded)."""
    import specdec.models.ngram as ngram_module
    trees = []
    build = ngram_module.build_tree
    monkeypatch.setattr(ngram_module, "build_tree", lambda *a: trees.append(build(*a)) or trees[-1])
    return trees


def test_each_decode_step_indexes_its_window_after_its_match(monkeypatch):
    """D = 3 over a prompt of distinct tokens: the first decode step finds an empty trie (a prompt that repeats
    itself proposes nothing yet), then inserts the last 3 tokens only, so no n-gram of the prompt's head is kept.
    With indexing="sequence" the prompt is indexed whole at the start."""
    target = small_target()
    prompt = [10, 11, 12, 13, 10, 11, 12, 13]
    trees = recorded_trees(monkeypatch)
    engine = Engine(target, draft=NgramDraft(max_trie_depth=3), spec=SpecConfig(2, 2, 4), max_seq_len=32)
    first = engine.generate([prompt], SamplingParams(max_new_tokens=2))[0].token_ids[0]
    assert trees == [[]]  # one decode step, nothing matched
    trie = engine.worker.proposer.shared_trie
    window = prompt[-2:] + [first]
    assert set(trie.root.children) == set(window)
    assert sum(1 for _ in _paths(trie.root)) == 6  # the window's 3 + 2 + 1 n-gram prefixes, nothing else

    engine = Engine(target, draft=NgramDraft(max_trie_depth=3, indexing="sequence"), spec=SpecConfig(2, 2, 4),
                    max_seq_len=32)
    engine.generate([prompt], SamplingParams(max_new_tokens=2))
    head = engine.worker.proposer.shared_trie.root.children[10]
    assert head.freq == 2 and 11 in head.children  # each occurrence counted once


def _paths(node):
    for child in node.children.values():
        yield child
        yield from _paths(child)


def test_one_trie_serves_every_request_and_outlives_the_call():
    """The shared trie (the default) is one object for the batch and the next generate call; shared=False gives
    each request its own, over its own windows only (D = 3: the prompt's last 2 tokens and what it decoded)."""
    target = small_target()
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]
    params = SamplingParams(max_new_tokens=3)
    engine = Engine(target, draft=NgramDraft(max_trie_depth=3), spec=SpecConfig(2, 2, 4), max_seq_len=32)
    outs = engine.generate(prompts, params)
    trie = engine.worker.proposer.shared_trie
    seen = [{*p[-2:], *o.token_ids[:-1]} for p, o in zip(prompts, outs)]  # the last token is never indexed
    assert set(trie.root.children) == seen[0] | seen[1]
    engine.generate([[9, 9]], SamplingParams(max_new_tokens=2))
    assert engine.worker.proposer.shared_trie is trie and seen[0] | seen[1] | {9} <= set(trie.root.children)

    own = Engine(target, draft=NgramDraft(max_trie_depth=3, shared=False), spec=SpecConfig(2, 2, 4), max_seq_len=32)
    tries = []
    start = own.worker.start
    own.worker.start = lambda *a, **k: (start(*a, **k), tries.extend(own.worker.proposer._tries))
    outs = own.generate(prompts, params)
    assert own.worker.proposer.shared_trie is None and tries[0] is not tries[1]
    assert [set(t.root.children) for t in tries] == seen


# ---- the stateful matcher and the result order ------------------------------------------------------------------

def test_a_suffix_that_was_no_path_is_not_looked_up_again():
    """SGLang's MatchState advances its anchors with the appended tokens: 5-1 was no path when matched, so 5-1-2 is
    not an anchor a step later although it is a path by then; a fresh state (a rebuild) finds it.
    Paths: 1-2 at the first match; then 5-1-2-9 and 1-2-8 inserted. Advanced: the deepest anchor is 1-2, whose
    most recent child is 8; rebuilt: 5-1-2, whose only child is 9."""
    trie = trie_of([1, 2])
    state = MatchState()
    assert [d for _, d in trie.match([5, 1], 2, state)] == [1]
    trie.insert([5, 1, 2, 9])
    trie.insert([1, 2, 8])
    draft = NgramDraft(max_trie_depth=4)
    assert build_tree(trie.match([5, 1, 2], 3, state), draft, 1) == [(8, 0)]
    assert build_tree(trie.match([5, 1, 2], 3, MatchState()), draft, 1) == [(9, 0)]


def test_siblings_are_listed_as_libstdcxx_iterates_an_unordered_map():
    """Worked by hand from libstdc++'s hash table (identity hash, load factor 1): the first insert makes 13
    buckets; a key into an empty bucket goes to the list's front, into a non-empty one first in that bucket's run
    (0 and 13 share bucket 0); the 14th key rehashes to 29 buckets, walking the list and inserting again."""
    def order(keys):
        return [k for k, _ in _unordered_map_order({k: 0 for k in keys})]
    assert order([5, 1, 9]) == [9, 1, 5]
    assert order([0, 13, 5]) == [5, 13, 0]
    assert order(list(range(13))) == list(range(12, -1, -1))
    assert order(list(range(14))) == [13] + list(range(13))
