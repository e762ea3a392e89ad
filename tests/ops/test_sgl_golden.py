"""SGLang's golden values for `tree_speculative_sampling_target_only`, run against both implementations.

The tree, the target logits and the expected outputs are those of sgl-kernel's unit test of the op (two
requests, six nodes each, a near one-hot target at temperature 0.01), at thresholds 1 (lossless) and at
thresholds 0, SGLang's most relaxed acceptance, where every first child is accepted. SGLang's accept_index
is (B, num_spec_step) = (B, S + 1), so its num_spec_step 4 is num_steps 3 here.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import fast
import reference
from reference.naive import tree_speculative_sampling_target_only_naive

CANDIDATES = [[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]]
RETRIEVE_INDEX = [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
RETRIEVE_NEXT_TOKEN = [[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]]
RETRIEVE_NEXT_SIBLING = [[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]]

GOLDEN = {  # (threshold_single, threshold_acc): (predict, accept_index, accept_length)
    (1.0, 1.0): ([3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18], [[0, 3, 4, 5], [6, 10, 11, -1]], [3, 2]),
    (0.0, 0.0): ([1, 2, 18, -1, -1, -1, 11, -1, -1, -1, 12, 18], [[0, 1, 2, -1], [6, 10, 11, -1]], [2, 2]),
}

IMPLEMENTATIONS = {
    "reference": reference.tree_speculative_sampling_target_only,
    "naive": tree_speculative_sampling_target_only_naive,
    "fast": fast.tree_speculative_sampling_target_only,
}


def _golden_case(seed):
    logits = torch.full((2, 6, 20), 1.0)
    for b, n, v in ((0, 0, 3), (0, 3, 4), (0, 4, 5), (1, 0, 11), (1, 4, 12)):
        logits[b, n, v] = 10.0
    rows_without_a_peak = logits.amax(-1) < 10
    logits[..., 18] = torch.where(rows_without_a_peak, 10.0, logits[..., 18])
    probs = torch.softmax(logits / 0.01, dim=-1)
    g = torch.Generator().manual_seed(seed)
    coins = torch.rand(2, 6, generator=g)
    final_coins = torch.rand(2, generator=g)
    tree = [torch.tensor(t, dtype=torch.int32) for t in (CANDIDATES, RETRIEVE_INDEX, RETRIEVE_NEXT_TOKEN,
                                                          RETRIEVE_NEXT_SIBLING)]
    return (*tree, coins, final_coins, probs)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("thresholds", GOLDEN, ids=["thresholds-1", "thresholds-0"])
@pytest.mark.parametrize("seed", [0, 1])
def test_sglang_golden_tree_sampling(impl, thresholds, seed):
    threshold_single, threshold_acc = thresholds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        predict, accept_index, accept_length = IMPLEMENTATIONS[impl](
            *_golden_case(seed), 3, threshold_single=threshold_single, threshold_acc=threshold_acc)
    want_predict, want_index, want_length = GOLDEN[thresholds]
    assert predict.tolist() == want_predict
    assert accept_index.tolist() == want_index
    assert accept_length.tolist() == want_length


def test_thresholds_below_one_warn_that_they_are_lossy():
    import specdec.ops.op_checks as op_checks
    op_checks._warned_lossy_thresholds = False
    with pytest.warns(UserWarning, match="no longer distributed as the target"):
        reference.tree_speculative_sampling_target_only(*_golden_case(0), 3, threshold_single=0.0, threshold_acc=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: the second call is silent
        reference.tree_speculative_sampling_target_only(*_golden_case(0), 3, threshold_single=0.5)
        reference.tree_speculative_sampling_target_only(*_golden_case(0), 3)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
@pytest.mark.parametrize("name", ["threshold_single", "threshold_acc"])
def test_thresholds_outside_the_closed_unit_interval_are_refused(name, bad):
    for op in IMPLEMENTATIONS.values():
        with pytest.raises(ValueError, match=f"{name} must be a number in \\[0.0, 1.0\\], got {bad}"):
            op(*_golden_case(0), 3, **{name: bad})
