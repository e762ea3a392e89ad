"""Contracts of the reference tree ops (reference/tree.py, reference/verify.py): the per-node naive loops keep
the vectorised ops' signatures, the argument names are SGLang's, the vectorised ops make no host sync, and bad
input is a ValueError naming the value, on every op, before any compute. The ladder and the distribution tests are
in test_tree_ops.py."""

from __future__ import annotations

import inspect

import pytest
import torch

from reference.naive import build_tree_naive, tree_speculative_sampling_target_only_naive, verify_tree_greedy_naive
from reference.tree import (build_tree_kernel_efficient, max_num_draft_tokens, organize_draft_results,
                            select_top_k_tokens)
from reference.verify import tree_speculative_sampling_target_only, verify_tree_greedy
from tests.helpers import assert_same_tensors
from tests.helpers.oracles import (DraftedTree, target_predict_for, target_probs_for, valid_build_args,
                                   valid_verify_inputs)

@pytest.mark.parametrize(
    "fast,naive",
    [
        (build_tree_kernel_efficient, build_tree_naive),
        (verify_tree_greedy, verify_tree_greedy_naive),
        (tree_speculative_sampling_target_only, tree_speculative_sampling_target_only_naive),
    ],
)
def test_naive_has_the_same_signature(fast, naive):
    assert inspect.signature(fast) == inspect.signature(naive)
    assert fast.__doc__ and naive.__doc__


def test_signatures_keep_their_sglang_style_argument_names():
    """Pins the argument names the ops use (listed here, not read from SGLang: its wheel is no test
    dependency). They follow SGLang's Python-level names with known differences, checked by hand against
    sglang 0.5.x's `speculative/eagle_utils.py` and sgl-kernel: `build_tree_kernel_efficient` has no
    `seq_lens_sum` (a host sum SGLang needs for its buffers) nor `tree_mask_mode` / preallocated
    `tree_mask_buf` / `position_buf` (it returns the full boolean mask), the verifies return their outputs
    instead of filling buffers, and `retrieve_*` is spelled out where SGLang writes `retrive_*`."""
    def names(f):
        return list(inspect.signature(f).parameters)

    assert names(select_top_k_tokens) == ["i", "topk_p", "topk_index", "hidden_states", "scores", "topk"]
    assert names(organize_draft_results) == ["score_list", "token_list", "parents_list", "num_draft_token"]
    assert names(build_tree_kernel_efficient) == [
        "bonus_tokens",
        "parent_list",
        "top_scores_index",
        "draft_tokens",
        "seq_lens",
        "topk",
        "spec_steps",
        "num_verify_tokens",
    ]
    assert names(verify_tree_greedy) == [
        "candidates",
        "retrieve_index",
        "retrieve_next_token",
        "retrieve_next_sibling",
        "target_predict",
        "num_steps",
    ]
    assert names(tree_speculative_sampling_target_only) == [
        "candidates",
        "retrieve_index",
        "retrieve_next_token",
        "retrieve_next_sibling",
        "uniform_samples",
        "uniform_samples_for_final_sampling",
        "target_probs",
        "num_steps",
        "threshold_single",
        "threshold_acc",
    ]


def test_vectorised_ops_make_no_host_sync():
    """On the meta device every value read (.item(), .tolist(), nonzero, a tensor-valued `if`,
    boolean-mask indexing) raises, so running the whole pipeline there proves the vectorised ops
    never read a tensor value on the host."""
    d = "meta"
    B, K, S, V, H = 3, 2, 3, 11, 4
    W = max_num_draft_tokens(K, S) - 1
    lists = ([], [], [])
    hidden = torch.empty(B, H, device=d)
    topk_p = torch.empty(B, K, device=d)
    topk_index = torch.empty(B, K, dtype=torch.long, device=d)
    ids, hidden, scores, info = select_top_k_tokens(0, topk_p, topk_index, hidden, None, K)
    for x, lst in zip(info, lists):
        lst.append(x)
    for i in range(1, S):
        topk_p = torch.empty(B * K, K, device=d)
        topk_index = torch.empty(B * K, K, dtype=torch.long, device=d)
        ids, hidden, scores, info = select_top_k_tokens(i, topk_p, topk_index, hidden, scores, K)
        assert ids.shape == (B * K,) and hidden.shape == (B * K, H) and scores.shape == (B, K)
        for x, lst in zip(info, lists):
            lst.append(x)
    parent_list, tsi, dt = organize_draft_results(*lists, W)
    assert parent_list.shape == (B, 1 + K * (S - 1)) and tsi.shape == (B, W - 1) and dt.shape == (B, W - 1)
    out = build_tree_kernel_efficient(
        torch.empty(B, dtype=torch.long, device=d),
        parent_list,
        tsi,
        dt,
        torch.empty(B, dtype=torch.long, device=d),
        K,
        S,
        W,
    )
    assert [tuple(t.shape) for t in out] == [(B, W, W), (B * W,), (B, W), (B, W), (B, W), (B * W,)]
    assert out[0].dtype == torch.bool and all(t.dtype == torch.int64 for t in out[1:])
    _mask, _positions, ri, nt, ns, tokens = out
    cand = tokens.view(B, W)
    g = verify_tree_greedy(cand, ri, nt, ns, torch.empty(B, W, dtype=torch.long, device=d), S)
    s = tree_speculative_sampling_target_only(
        cand,
        ri,
        nt,
        ns,
        torch.empty(B, W, device=d),
        torch.empty(B, device=d),
        torch.empty(B, W, V, device=d),
        S,
    )
    for res in (g, s):
        assert [tuple(t.shape) for t in res] == [(B * W,), (B, S + 1), (B,)]
        assert all(t.dtype == torch.int32 for t in res)
    with pytest.raises(
        (RuntimeError, NotImplementedError)
    ):  # the naive versions read values: the probe works
        build_tree_naive(
            torch.empty(B, dtype=torch.long, device=d),
            parent_list,
            tsi,
            dt,
            torch.empty(B, dtype=torch.long, device=d),
            K,
            S,
            W,
        )


@pytest.mark.parametrize(
    "index,value,match",
    [
        (5, 0, "topk"),
        (6, 0, "spec_steps"),
        (7, 1, "num_verify_tokens"),
        (7, 1 + 2 + 2 * 4 + 1, "num_verify_tokens=12"),
        (0, torch.zeros(3, dtype=torch.long), "parent_list"),
        (1, torch.zeros(2, 4, dtype=torch.long), "parent_list"),
        (2, torch.zeros(2, 6, dtype=torch.long), "top_scores_index"),
        (3, torch.zeros(2, 8, dtype=torch.long), "draft_tokens"),
        (4, torch.zeros(2, 1, dtype=torch.long), "seq_lens"),
    ],
)
def test_build_tree_bad_input(index, value, match):
    args = valid_build_args()
    args[index] = value
    for fn in (build_tree_kernel_efficient, build_tree_naive):
        with pytest.raises(ValueError, match=match):
            fn(*args)


def test_build_tree_bad_types():
    args = valid_build_args()
    args[2] = args[2].float()
    with pytest.raises(TypeError, match="top_scores_index"):
        build_tree_kernel_efficient(*args)
    args = valid_build_args()
    args[6] = 2.0
    with pytest.raises(TypeError, match="spec_steps"):
        build_tree_kernel_efficient(*args)


def test_select_top_k_bad_input():
    B, K, H = 2, 2, 3
    with pytest.raises(ValueError, match="topk"):
        select_top_k_tokens(
            0, torch.rand(B, K), torch.zeros(B, K, dtype=torch.long), torch.rand(B, H), None, 0
        )
    with pytest.raises(ValueError, match="topk"):
        select_top_k_tokens(
            0, torch.rand(B, K), torch.zeros(B, K, dtype=torch.long), torch.rand(B, H), None, 3
        )
    with pytest.raises(ValueError, match="i must be an int >= 0"):
        select_top_k_tokens(
            -1, torch.rand(B, K), torch.zeros(B, K, dtype=torch.long), torch.rand(B, H), None, K
        )
    with pytest.raises(ValueError, match="topk_index"):
        select_top_k_tokens(
            0, torch.rand(B, K), torch.zeros(B, K + 1, dtype=torch.long), torch.rand(B, H), None, K
        )
    with pytest.raises(ValueError, match="hidden_states"):
        select_top_k_tokens(
            0, torch.rand(B, K), torch.zeros(B, K, dtype=torch.long), torch.rand(B + 1, H), None, K
        )
    with pytest.raises(ValueError, match="B\\*K"):
        select_top_k_tokens(
            1, torch.rand(B, K), torch.zeros(B, K, dtype=torch.long), torch.rand(B, H), torch.rand(B, K), K
        )
    with pytest.raises(ValueError, match="scores"):
        select_top_k_tokens(
            1,
            torch.rand(B * K, K),
            torch.zeros(B * K, K, dtype=torch.long),
            torch.rand(B * K, H),
            torch.rand(B, K + 1),
            K,
        )
    with pytest.raises(TypeError, match="scores"):
        select_top_k_tokens(
            1, torch.rand(B * K, K), torch.zeros(B * K, K, dtype=torch.long), torch.rand(B * K, H), None, K
        )


def test_organize_bad_input():
    B, K = 2, 2
    s0 = (torch.rand(B, 1, K), torch.zeros(B, K, dtype=torch.long), torch.arange(-1, K).repeat(B, 1))
    s1 = (torch.rand(B, K, K), torch.zeros(B, K * K, dtype=torch.long), torch.zeros(B, K, dtype=torch.long))
    sl, tl, pl = [s0[0], s1[0]], [s0[1], s1[1]], [s0[2], s1[2]]
    organize_draft_results(sl, tl, pl, 7)  # valid: W max = 1 + 2 + 4
    with pytest.raises(ValueError, match="num_draft_token=8"):
        organize_draft_results(sl, tl, pl, 8)
    with pytest.raises(ValueError, match="num_draft_token"):
        organize_draft_results(sl, tl, pl, 1)
    with pytest.raises(ValueError, match="same length"):
        organize_draft_results(sl, tl[:1], pl, 3)
    with pytest.raises(ValueError, match="at least one"):
        organize_draft_results([], [], [], 3)
    with pytest.raises(ValueError, match="token_list\\[1\\]"):
        organize_draft_results(sl, [tl[0], tl[1][:, :3]], pl, 3)
    with pytest.raises(ValueError, match="parents_list\\[0\\]"):
        organize_draft_results(sl, tl, [pl[0][:, :2], pl[1]], 3)
    with pytest.raises(ValueError, match="score_list\\[0\\]"):
        organize_draft_results([s1[0], s1[0]], tl, pl, 3)


def test_verify_bad_input():
    cand, ri, nt, ns, tp, u, uf, probs = valid_verify_inputs()
    for fn in (verify_tree_greedy, verify_tree_greedy_naive):
        with pytest.raises(ValueError, match="num_steps"):
            fn(cand, ri, nt, ns, tp, 0)
        with pytest.raises(ValueError, match="target_predict"):
            fn(cand, ri, nt, ns, tp[:, :5], 2)
        with pytest.raises(ValueError, match="retrieve_next_sibling"):
            fn(cand, ri, nt, ns[:1], tp, 2)
        with pytest.raises(ValueError, match="candidates"):
            fn(cand.flatten(), ri, nt, ns, tp, 2)
        with pytest.raises(TypeError, match="target_predict"):
            fn(cand, ri, nt, ns, tp.float(), 2)
    for fn in (tree_speculative_sampling_target_only, tree_speculative_sampling_target_only_naive):
        fn(cand, ri, nt, ns, u, uf, probs, 2)  # valid
        with pytest.raises(ValueError, match="uniform_samples must"):
            fn(cand, ri, nt, ns, u[:, :5], uf, probs, 2)
        with pytest.raises(ValueError, match="uniform_samples_for_final_sampling"):
            fn(cand, ri, nt, ns, u, uf[:1], probs, 2)
        with pytest.raises(ValueError, match="target_probs"):
            fn(cand, ri, nt, ns, u, uf, probs[:, :5], 2)
        with pytest.raises(ValueError, match="threshold_single"):
            fn(cand, ri, nt, ns, u, uf, probs, 2, threshold_single=1.5)
        with pytest.raises(ValueError, match="threshold_acc"):
            fn(cand, ri, nt, ns, u, uf, probs, 2, threshold_acc=-0.5)
        with pytest.raises(ValueError, match="num_steps"):
            fn(cand, ri, nt, ns, u, uf, probs, 0)
        with pytest.raises(TypeError, match="target_probs"):
            fn(cand, ri, nt, ns, u, uf, probs.long(), 2)


def test_ops_refuse_tensors_on_another_device():
    """The `meta` device stands in for a second device on a CPU-only machine."""
    cand, ri, nt, ns, tp, u, uf, probs = valid_verify_inputs()
    with pytest.raises(ValueError, match="retrieve_index is on meta"):
        verify_tree_greedy(cand, ri.to("meta"), nt, ns, tp, 2)
    with pytest.raises(ValueError, match="target_predict is on meta"):
        verify_tree_greedy(cand, ri, nt, ns, tp.to("meta"), 2)
    with pytest.raises(ValueError, match="target_probs is on meta"):
        tree_speculative_sampling_target_only(cand, ri, nt, ns, u, uf, probs.to("meta"), 2)
    with pytest.raises(ValueError, match="uniform_samples is on meta"):
        tree_speculative_sampling_target_only(cand, ri, nt, ns, u.to("meta"), uf, probs, 2)
    tree = DraftedTree(2, 2, 3, 6, 16, seed=0)
    args = list(tree.build_args())
    args[4] = args[4].to("meta")  # seq_lens
    with pytest.raises(ValueError, match="seq_lens is on meta"):
        build_tree_kernel_efficient(*args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    """The vectorised ops on CUDA give the CPU results (the naive loops are the CPU oracle)."""
    for seed, (S, K, W) in enumerate([(3, 2, 9), (5, 4, 69), (4, 1, 5), (1, 4, 5), (3, 4, 30)]):
        tree = DraftedTree(4, K, S, W, 16, seed=seed)
        cpu = build_tree_kernel_efficient(*tree.build_args())
        gpu = build_tree_kernel_efficient(
            *[a.cuda() if isinstance(a, torch.Tensor) else a for a in tree.build_args()]
        )
        assert all(g.is_cuda for g in gpu)
        assert_same_tensors(cpu, tuple(g.cpu() for g in gpu))
        _mask, _positions, ri, nt, ns, tokens = cpu
        cand = tokens.view(4, W)
        paths_per_b = [tree.node_paths(b) for b in range(4)]
        tp = target_predict_for(tree, paths_per_b, 0.7, tree.gen)
        probs = target_probs_for(tree, paths_per_b, tree.gen)
        u, uf = torch.rand(4, W), torch.rand(4)
        ref_g = verify_tree_greedy_naive(cand, ri, nt, ns, tp, S)
        ref_s = tree_speculative_sampling_target_only_naive(cand, ri, nt, ns, u, uf, probs, S)
        got_g = verify_tree_greedy(*[x.cuda() for x in (cand, ri, nt, ns, tp)], S)
        got_s = tree_speculative_sampling_target_only(
            *[x.cuda() for x in (cand, ri, nt, ns, u, uf, probs)], S
        )
        assert_same_tensors(ref_g, tuple(x.cpu() for x in got_g))
        assert_same_tensors(ref_s, tuple(x.cpu() for x in got_s))
