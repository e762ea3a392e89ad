"""The CUDA shim that lets fast-op tests pass CPU tensors on a GPU (`tests.helpers.cuda_shim`, installed by the
conftest): it must reach every tensor an op takes or returns, including those of a frozen `TreeAttentionPlan` (held
in its `tensors` dict), without mutating the frozen plan. Checked on any machine with the `meta` device standing in
for CUDA."""
from __future__ import annotations

import dataclasses

import torch

import reference
from specdec.ops.logprob_types import LogitsOutput
from specdec.ops.contract import TreeAttentionPlan
from tests.helpers.cuda_shim import _back, _map_tensors, _to


def _plan() -> TreeAttentionPlan:
    slots, start = torch.tensor([0, 2]), torch.tensor([5, 9])
    mask = torch.ones(2, 3, 3, dtype=torch.bool).tril()
    return reference.plan_tree_attention(slots, start, 0, mask, 16, 3, 32)


def _tensors(plan: TreeAttentionPlan) -> list[torch.Tensor]:
    return [t for t in plan.tensors.values() if isinstance(t, torch.Tensor)]


def test_a_frozen_plan_moves_as_a_new_plan_with_every_tensor_of_its_dict():
    plan = _plan()
    assert dataclasses.is_dataclass(plan) and _tensors(plan), "the plan this test needs has no tensors"
    moved = []
    on_device = _to([plan, torch.zeros(2)], "meta", moved)[0]
    assert isinstance(on_device, TreeAttentionPlan) and on_device is not plan
    assert all(t.device.type == "meta" for t in _tensors(on_device))
    assert all(t.device.type == "cpu" for t in _tensors(plan))  # the caller's plan is untouched
    assert len(moved) == len(_tensors(plan)) + 1
    assert {id(original) for original, _ in moved} >= {id(t) for t in _tensors(plan)}
    assert (on_device.impl, on_device.batch, on_device.num_new, on_device.attn_len) == \
        (plan.impl, plan.batch, plan.num_new, plan.attn_len)


def test_a_plan_comes_back_equal():
    plan = _plan()
    back = _back(plan)
    assert isinstance(back, TreeAttentionPlan)
    assert back.tensors.keys() == plan.tensors.keys()
    for name, t in plan.tensors.items():
        assert torch.equal(back.tensors[name], t), name


def test_plain_objects_are_updated_in_place_and_nested_containers_walked():
    """An op writes its outputs into the LogitsOutput it was given: the caller's object must see them."""
    out = LogitsOutput(next_token_logits=torch.ones(2, 3))
    nested = {"a": [torch.ones(1), (torch.ones(2), out)], "n": 3}
    seen = []
    mapped = _map_tensors(nested, lambda t: seen.append(t.shape) or t * 2)
    assert mapped["n"] == 3 and torch.equal(mapped["a"][1][0], torch.full((2,), 2.0))
    assert mapped["a"][1][1] is out and torch.equal(out.next_token_logits, torch.full((2, 3), 2.0))
    assert len(seen) == 3
    moved = []
    assert _to(out, "meta", moved) is out and out.next_token_logits.device.type == "meta" and len(moved) == 1


def test_an_expanded_input_moves_but_is_not_copied_back():
    """A tree mask broadcast over the batch (MTP's chain mask) moved to the GPU: copying the op's result back
    into a stride-0 tensor raises, so the shim must not record it (found on the H200 run of 2026-12-04)."""
    mask = torch.ones(1, 3, 3, dtype=torch.bool).tril().expand(4, 3, 3)
    kv = torch.zeros(2, 3)
    moved = []
    on_device = _to([mask, kv], "meta", moved)
    assert [t.device.type for t in on_device] == ["meta", "meta"] and on_device[0].shape == (4, 3, 3)
    assert [id(original) for original, _ in moved] == [id(kv)]
