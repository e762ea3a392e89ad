"""Tree test inputs and their oracles: trees drafted through ``select_top_k_tokens`` + ``organize_draft_results``
with every candidate's path and score tracked independently (``DraftedTree``), the node structure from token
paths, and the fixed tree with the exact law of the sampling verify, node by node."""
from __future__ import annotations


import itertools
import random

import torch
from hypothesis import strategies as st

from reference.tree import build_tree_kernel_efficient, organize_draft_results, select_top_k_tokens
from specdec.ops.contract import max_num_draft_tokens


def _draft_probs(gen: torch.Generator, rows: int, V: int, mode: str) -> torch.Tensor:
    """Draft probabilities, (rows, V) float32. ``ties`` mixes one-hot rows (exact 1.0 / 0.0) and
    rows with many exactly equal probabilities."""
    if mode == "random":
        return torch.softmax(torch.randn(rows, V, generator=gen) * 2.0, dim=-1)
    out = []
    for _ in range(rows):
        kind = int(torch.randint(3, (1,), generator=gen))
        if kind == 0:  # one-hot: children with probability exactly 1.0 and 0.0
            row = torch.zeros(V)
            row[int(torch.randint(V, (1,), generator=gen))] = 1.0
        elif kind == 1:  # uniform: all children tie
            row = torch.full((V,), 1.0 / V)
        else:  # two levels: many ties
            row = torch.softmax(torch.randint(2, (V,), generator=gen).float() * 3.0, dim=-1)
        out.append(row)
    return torch.stack(out)


class DraftedTree:
    """Drafts B trees through select_top_k_tokens + organize_draft_results.

    The hidden state of a node is its id, so the test knows which path every re-parented hidden
    state belongs to; ``cand_path[b][c]`` and ``cand_score[b][c]`` (fp32 path score) are tracked
    by the test itself, from the draft probabilities it generated.
    """

    def __init__(self, B: int, K: int, S: int, W: int, V: int, seed: int, mode: str = "random"):
        gen = torch.Generator().manual_seed(seed)
        self.B, self.K, self.S, self.W, self.V = B, K, S, W, V
        # node_paths[b]: node id -> token path (the root is id 0; an id names the same draft call
        # in every request); a node id travels as column 0 of its hidden state, the request as column 1
        node_paths: list[dict[int, tuple]] = [{0: ()} for _ in range(B)]
        next_id = [1]

        def new_id(path_per_b):
            i = next_id[0]
            next_id[0] += 1
            for b in range(B):
                node_paths[b][i] = path_per_b[b]
            return i

        self.cand_path = [[] for _ in range(B)]
        self.cand_score = [[] for _ in range(B)]
        score_list, token_list, parents_list = [], [], []

        # step 0: the root's children
        probs = _draft_probs(gen, B, V, mode)
        topk_p, topk_index = torch.topk(probs, K, dim=-1)
        hidden = torch.zeros(B, 3)  # column 0: node id (root 0), column 1: request, column 2: spare
        hidden[:, 1] = torch.arange(B, dtype=torch.float32)
        input_ids, hidden_out, scores, info = select_top_k_tokens(0, topk_p, topk_index, hidden, None, K)
        assert input_ids.shape == (B * K,) and hidden_out.shape == (B * K, 3) and scores.shape == (B, K)
        assert torch.equal(input_ids, topk_index.flatten())
        assert torch.equal(hidden_out[:, 0], torch.zeros(B * K))
        assert torch.equal(hidden_out[:, 1], torch.arange(B).repeat_interleave(K).float())
        assert torch.equal(info[2], torch.arange(-1, K).repeat(B, 1)) and info[2].dtype == torch.int64
        for b in range(B):
            for m in range(K):
                self.cand_path[b].append((int(topk_index[b, m]),))
                self.cand_score[b].append(topk_p[b, m])
        score_list.append(info[0])
        token_list.append(info[1])
        parents_list.append(info[2])

        for i in range(1, S):
            # the frontier, as the test selects it: the K best candidates of the previous step
            start = 0 if i == 1 else K + (i - 2) * K * K
            count = K if i == 1 else K * K
            frontier = []  # frontier[b] = list of K candidate indices, best first (ties: lower index)
            for b in range(B):
                cands = list(range(start, start + count))
                cands.sort(key=lambda c: (-float(self.cand_score[b][c]), c))
                frontier.append(cands[:K])
            # the returned input_ids / hidden states must describe this frontier
            exp_ids = torch.tensor([self.cand_path[b][c][-1] for b in range(B) for c in frontier[b]])
            assert torch.equal(input_ids, exp_ids), (i, input_ids, exp_ids)
            for b in range(B):
                for f, c in enumerate(frontier[b]):
                    parent_id = int(hidden_out[b * K + f, 0])
                    assert node_paths[b][parent_id] == self.cand_path[b][c][:-1]  # re-parented hidden state
                    assert int(hidden_out[b * K + f, 1]) == b
                    assert torch.equal(scores[b, f], self.cand_score[b][c])
            if i > 1:  # the previous step's parents are this frontier's candidate indices
                assert torch.equal(info[2], torch.tensor(frontier))
            # the draft runs on the frontier: each frontier node gets an id (its output hidden state)
            hidden = torch.zeros(B * K, 3)
            for f in range(K):
                nid = new_id([self.cand_path[b][frontier[b][f]] for b in range(B)])
                hidden[torch.arange(B) * K + f, 0] = float(nid)
            hidden[:, 1] = torch.arange(B).repeat_interleave(K).float()
            probs = _draft_probs(gen, B * K, V, mode)
            topk_p, topk_index = torch.topk(probs, K, dim=-1)
            input_ids, hidden_out, scores, info = select_top_k_tokens(
                i, topk_p, topk_index, hidden, scores, K
            )
            for b in range(B):
                for f in range(K):
                    c_parent = frontier[b][f]
                    for m in range(K):
                        self.cand_path[b].append(
                            self.cand_path[b][c_parent] + (int(topk_index[b * K + f, m]),)
                        )
                        self.cand_score[b].append(self.cand_score[b][c_parent] * topk_p[b * K + f, m])
            score_list.append(info[0])
            token_list.append(info[1])
            parents_list.append(info[2])
            if i == S - 1:  # the last step's selection is checked too
                last = K + (i - 1) * K * K
                for b in range(B):
                    cands = sorted(
                        range(last, last + K * K), key=lambda c: (-float(self.cand_score[b][c]), c)
                    )
                    assert torch.equal(info[2][b], torch.tensor(cands[:K]))

        self.num_cands = K + (S - 1) * K * K
        assert all(len(p) == self.num_cands for p in self.cand_path)
        self.parent_list, self.top_scores_index, self.draft_tokens = organize_draft_results(
            score_list, token_list, parents_list, W
        )
        self.seq_lens = torch.randint(0, 50, (B,), generator=gen)
        self.bonus = torch.randint(V, (B,), generator=gen)
        self.gen = gen

    # -- the test's own expectations -----------------------------------------------------------

    def expected_selection(self, b: int) -> list[int]:
        order = sorted(range(self.num_cands), key=lambda c: (-float(self.cand_score[b][c]), c))
        return sorted(order[: self.W - 1])

    def node_paths(self, b: int) -> list[tuple]:
        """Token path of every tree node, root () first."""
        return [()] + [self.cand_path[b][c] for c in self.expected_selection(b)]

    def build_args(self):
        return (
            self.bonus,
            self.parent_list,
            self.top_scores_index,
            self.draft_tokens,
            self.seq_lens,
            self.K,
            self.S,
            self.W,
        )


def tree_structure(paths: list[tuple]):
    """parent, depth, first child and next sibling of every node, from the token paths alone."""
    index = {p: i for i, p in enumerate(paths)}
    assert len(index) == len(paths)  # paths are unique
    W = len(paths)
    parent = [-1] + [index[p[:-1]] for p in paths[1:]]
    depth = [len(p) for p in paths]
    children = [[j for j in range(1, W) if parent[j] == i] for i in range(W)]
    first = [ch[0] if ch else -1 for ch in children]
    sibling = [-1] * W
    for ch in children:
        for a, c in itertools.pairwise(ch):
            sibling[a] = c
    return parent, depth, first, sibling


def target_predict_for(tree: DraftedTree, paths_per_b, p_follow: float, gen: torch.Generator):
    """(B, W) target predictions: at each node a random child's token with prob p_follow."""
    B, W, V = tree.B, tree.W, tree.V
    tp = torch.randint(V, (B, W), generator=gen)
    for b in range(B):
        parent, _, _, _ = tree_structure(paths_per_b[b])
        for i in range(W):
            kids = [j for j in range(1, W) if parent[j] == i]
            if kids and float(torch.rand((), generator=gen)) < p_follow:
                j = kids[int(torch.randint(len(kids), (1,), generator=gen))]
                tp[b, i] = paths_per_b[b][j][-1]
    return tp


def target_probs_for(tree: DraftedTree, paths_per_b, gen: torch.Generator, sharp: float = 2.0):
    """(B, W, V) float32 target rows with extra mass on the children's tokens (so that some paths
    get accepted), some exact zeros, and occasional one-hot rows."""
    B, W, V = tree.B, tree.W, tree.V
    logits = torch.randn(B, W, V, generator=gen) * sharp
    for b in range(B):
        for j in range(1, W):
            path = paths_per_b[b][j]
            parent = paths_per_b[b].index(path[:-1])
            logits[b, parent, path[-1]] += float(torch.rand((), generator=gen)) * 4.0
    probs = torch.softmax(logits, dim=-1)
    keep = (torch.rand(B, W, V, generator=gen) > 0.15) | torch.nn.functional.one_hot(
        probs.argmax(-1), V
    ).bool()
    probs = probs * keep  # exact zeros, never a whole row (unnormalised is fine)
    onehot = torch.rand(B, W, generator=gen) < 0.1
    hot = torch.nn.functional.one_hot(probs.argmax(-1), V).float()
    return torch.where(onehot.unsqueeze(-1), hot, probs)


def sampling_inputs(tree, paths_per_b, gen, rng):
    """-> target_probs (B, W, V) over the tree's paths, coins (B, W) and final coins (B,) for a sampling verify;
    sometimes coins of exactly 0, which must not accept a zero-probability child."""
    B, W = tree.B, tree.W
    probs = target_probs_for(tree, paths_per_b, gen)
    u = torch.rand(B, W, generator=gen)
    uf = torch.rand(B, generator=gen)
    if rng.random() < 0.3:
        u[:, 0] = 0.0
        uf[0] = 0.0
    return probs, u, uf


def _w_values(K: int, S: int, full: bool) -> list[int]:
    hi = max_num_draft_tokens(K, S)
    if full:
        return list(range(2, hi + 1))
    return sorted({2, min(3, hi), (2 + hi) // 2, hi - 1, hi} - {1})


def _grid(full: bool):
    cases = []
    for S, K in itertools.product(range(1, 6), (1, 2, 4)):
        for W in _w_values(K, S, full):
            cases.append((S, K, W))
    return cases


FAST_GRID = _grid(full=False)
FULL_GRID = _grid(full=True)


def drafted_case(S: int, K: int, W: int, seed: int, mode: str) -> tuple[DraftedTree, random.Random]:
    """A DraftedTree of a seeded random batch size (1..4) and vocabulary (K+1, 8 or 32; small in "ties"),
    and the generator that chose them (the caller draws the rest of its case from it)."""
    rng = random.Random(seed)
    B = rng.randint(1, 4)
    V = rng.choice([K + 1, 8, 32]) if mode == "random" else rng.choice([max(K, 2), 6])
    return DraftedTree(B, K, S, W, max(V, K), seed, mode), rng


@st.composite
def tree_shapes(draw):
    """(S, K, W) of a valid tree, W anywhere from 2 to its maximum, a seed and a vocabulary mode."""
    S = draw(st.integers(1, 5))
    K = draw(st.integers(1, 4))
    W = S + 1 if K == 1 else draw(st.integers(2, max_num_draft_tokens(K, S)))
    return S, K, W, draw(st.integers(0, 2 ** 31 - 1)), draw(st.sampled_from(["random", "ties"]))


def valid_build_args(B=2, K=2, S=3, W=8):
    """Valid arguments of build_tree_kernel_efficient, as a list a test can corrupt one at a time."""
    tree = DraftedTree(B, K, S, W, 10, seed=3)
    return list(tree.build_args())


# ----------------------------------------------------------------------------------------------------
# the fixed tree: the exact law of the sampling verify
# ----------------------------------------------------------------------------------------------------


# A fixed tree (K=2, S=2, W=6) over V=5 tokens:
#   root(0) -> node1 (tok 1), node2 (tok 3);  node1 -> node3 (tok 0), node4 (tok 2);  node2 -> node5 (tok 4)
FIXED_PARENT_LIST = torch.tensor([[-1, 0, 1]])
FIXED_TOP_SCORES_INDEX = torch.tensor([[0, 1, 2, 3, 4]])
FIXED_DRAFT_TOKENS = torch.tensor([[1, 3, 0, 2, 4]])
FIXED_PARENT = [-1, 0, 0, 1, 1, 2]
FIXED_TARGET = torch.tensor(
    [
        [0.10, 0.30, 0.05, 0.25, 0.30],  # root: children 1 (0.30) and 3 (0.25)
        [0.20, 0.00, 0.40, 0.15, 0.25],  # node1: children 0 (0.20) and 2 (0.40)
        [0.50, 0.10, 0.00, 0.10, 0.30],  # node2: child 4 (0.30)
        [0.25, 0.25, 0.00, 0.25, 0.25],  # leaves: the bonus row
        [0.00, 0.00, 0.70, 0.30, 0.00],
        [0.60, 0.00, 0.00, 0.00, 0.40],
    ]
)


def fixed_tree(B: int, S: int = 2):
    """(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling) of the fixed tree, B requests."""
    args = (
        torch.zeros(1, dtype=torch.long),
        FIXED_PARENT_LIST,
        FIXED_TOP_SCORES_INDEX,
        FIXED_DRAFT_TOKENS,
        torch.tensor([4]),
        2,
        2,
        6,
    )
    _mask, _positions, ri, nt, ns, tokens = build_tree_kernel_efficient(*args)
    assert nt[0].tolist() == [1, 3, 5, -1, -1, -1] and ns[0].tolist() == [-1, 2, -1, 4, -1, -1]
    W = 6
    cand = tokens.view(1, W).expand(B, W).contiguous()
    ri = torch.arange(B * W).view(B, W)
    return cand, ri, nt.expand(B, W).contiguous(), ns.expand(B, W).contiguous()


def exact_fixed_tree_distribution(target: torch.Tensor, S: int, residual_from_full_row: bool = False) -> dict:
    """Exact law of the emitted token sequence under sequential target sampling on the fixed tree:
    the first token ~ p(root); while the sampled token is a child c of the current node (and fewer
    than S tokens were accepted) continue from p(c); the first token that is not a child (or sampled
    at depth S) ends the sequence. ``residual_from_full_row`` gives the law of a BUGGY sampler that
    draws the bonus from the full row instead of the residual (to show the test has power)."""
    p = target.double()
    children = {i: [j for j in range(6) if FIXED_PARENT[j] == i] for i in range(6)}
    tok = [None] + FIXED_DRAFT_TOKENS[0].tolist()
    dist: dict[tuple, float] = {}

    def walk(node, depth, prefix, mass):
        kids = children[node] if depth < S else []
        row = p[node] / p[node].sum()
        kid_tok = {tok[c]: c for c in kids}
        if residual_from_full_row:
            stop = 1.0 - sum(float(row[tok[c]]) for c in kids)
            for c in kids:
                walk(c, depth + 1, prefix + (tok[c],), mass * float(row[tok[c]]))
            for v in range(p.shape[1]):
                if row[v] > 0:
                    key = prefix + (v,)
                    dist[key] = dist.get(key, 0.0) + mass * stop * float(row[v])
            return
        for v in range(p.shape[1]):
            if row[v] == 0:
                continue
            if v in kid_tok:
                walk(kid_tok[v], depth + 1, prefix + (v,), mass * float(row[v]))
            else:
                key = prefix + (v,)
                dist[key] = dist.get(key, 0.0) + mass * float(row[v])

    walk(0, 0, (), 1.0)
    assert abs(sum(dist.values()) - 1.0) < 1e-12
    return dist


def emitted_sequences(predict, accept_index, accept_length) -> list[tuple]:
    """The token sequence each request of a verify emits: its accepted draft tokens, then the bonus."""
    pred = predict.tolist()
    idx = accept_index.tolist()
    lens = accept_length.tolist()
    return [tuple(pred[i] for i in idx[b][: lens[b] + 1]) for b in range(len(lens))]


def valid_verify_inputs(B=2, V=7):
    """Valid inputs of both verifies on the fixed tree: cand, ri, nt, ns, target_predict, coins, final coins,
    target_probs."""
    cand, ri, nt, ns = fixed_tree(B)
    return (
        cand,
        ri,
        nt,
        ns,
        torch.zeros(B, 6, dtype=torch.long),
        torch.rand(B, 6),
        torch.rand(B),
        torch.rand(B, 6, V),
    )


def tree_links(parents: list[int]):
    """(retrieve_next_token, retrieve_next_sibling) lists of a tree given by parent indices (parents before their
    children, the root -1), siblings in node order, through `tree_structure`."""
    paths = []
    for i, parent in enumerate(parents):
        paths.append(() if parent < 0 else paths[parent] + (i,))
    _parent, _depth, first, sibling = tree_structure(paths)
    return first, sibling


def random_prob_rows(B, W, V, gen, positive=None):
    """(B, W, V) unnormalised probability rows with exact zeros (at least one positive entry per row);
    ``positive`` caps the tokens of positive mass per row. The verify ops' inputs with the draft's distribution."""
    rows = torch.softmax(torch.randn(B, W, V, generator=gen) * 2.0, -1) * (torch.rand(B, W, V, generator=gen) > 0.25)
    if positive is not None:
        rank = torch.rand(B, W, V, generator=gen).argsort(-1).argsort(-1)
        rows = torch.where(rank < positive, rows + 0.05, 0.0)
    rows[..., 0] += (rows.sum(-1) == 0).float()
    return rows * (0.5 + 3.0 * torch.rand(B, W, 1, generator=gen))
