"""The kernel counter (`specdec.bench.suites.kernel_count`): it counts what its rule says on functions whose launches
are known by hand, it sees the fast ops' Triton launches, and every budgeted worker's decode step stays within its
budget (`KERNEL_BUDGETS`), and issues at most `EAGER_OPS_GOAL` of them outside its CUDA graph: the tests that fail
when a change adds kernels to a step."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

import fast
from specdec.bench.suites import kernel_count as kc
from specdec.bench.cases import CASES

#: the fast ops are counted on CPU tensors, under Triton's interpreter (a CUDA machine compiles them instead)
interpreted = pytest.mark.skipif(not fast.INTERPRETED, reason="counts the fast ops under Triton's CPU interpreter")


def counted(fn, *args):
    with torch.inference_mode(), kc.KernelCounter() as counter:
        fn(*args)
    return counter


def test_counts_exactly_the_computing_ops():
    x = torch.randn(4, 6)

    def step(x):
        y = x + 1  # a kernel
        x.view(6, 4)  # a view
        torch.empty(3, 5)  # an allocation
        return y.sum()  # a kernel

    c = counted(step, x)
    assert c.num_kernels == 2
    assert c.kernels == {"aten.add.Tensor": 1, "aten.sum": 1}
    assert c.skipped == {"view": 1, "allocation": 1}


def test_views_metadata_and_allocations_count_zero():
    x = torch.randn(2, 3, 4)

    def views(x):
        x.view(6, 4), x.reshape(6, 4), x.flatten(), x.permute(2, 0, 1), x.transpose(0, 1), x[0].t()
        x.unsqueeze(0), x[:, :1].squeeze(1), x[None].expand(5, 2, 3, 4), x.select(1, 2), x.narrow(2, 1, 2)
        x.split(1), x.unbind(0), x.detach(), x.as_strided((2, 2), (1, 1))
        x.to(torch.float32), x.float(), x.contiguous(), x.size(), x.stride(), x.dim()  # no-ops on fp32
        torch.empty_like(x), x.new_empty(3), torch.empty_strided((2, 2), (1, 2))
        x[:, :0] + 1  # no elements: nothing to launch

    c = counted(views, x)
    assert c.num_kernels == 0, c.kernels
    assert c.host_reads == {}


def test_casts_copies_and_writing_factories_are_kernels():
    """The cases a schema's "may alias" would hide (a cast, the copy of a reshape that cannot view), and the
    factories and in-place ops that write memory: one kernel each."""
    b = torch.randn(4, 6, dtype=torch.bfloat16)
    x = torch.randn(4, 6)
    calls = [lambda: b.float(), lambda: b.to(torch.float32), lambda: x.t().reshape(24), lambda: x.t().contiguous(),
             lambda: torch.zeros(3), lambda: torch.ones(3), lambda: torch.full((3,), 2.0), lambda: torch.arange(5),
             lambda: x.clone().fill_(1.0), lambda: x.clone().zero_(), lambda: x.clone().copy_(x),
             lambda: x.clone().add_(1)]
    counts = [counted(call).num_kernels for call in calls]
    assert counts[:8] == [1] * 8
    assert counts[8:] == [2] * 4  # the clone, then the write


def test_host_reads_are_reported_not_counted():
    x = torch.randn(3)
    c = counted(lambda: (x.sum().item(), torch.equal(x, x)))
    assert c.num_kernels == 1  # the sum
    assert sum(c.host_reads.values()) == 2


@interpreted
def test_a_fast_op_counts_its_triton_launch_not_the_interpreters_copies():
    from triton.runtime.jit import JITFunction

    run_before = JITFunction.run
    logits = torch.randn(2, 8)
    c = counted(fast.softmax_topk, logits, 3)
    assert c.triton == {"softmax_topk_kernel": 1}
    assert c.kernels == {}  # its two outputs are allocations; the interpreter's host copies are not counted
    assert JITFunction.run is run_before  # the hook is gone afterwards
    assert counted(fast.softmax_topk, logits, 3).triton == {"softmax_topk_kernel": 1}


def test_nested_counters_see_the_inner_ops_too():
    x = torch.randn(3)
    with torch.inference_mode(), kc.KernelCounter() as outer:
        x + 1
        with kc.KernelCounter() as inner:
            x * 2
    assert (outer.num_kernels, inner.num_kernels) == (2, 1)


def budgeted_case(label):
    cases = [c for c in CASES if c.label == label]
    assert cases, f"KERNEL_BUDGETS names {label!r}, which no case of cases.CASES is"
    return cases[0]


PER_LAYER = ("total_kernels", "aten_kernels", "triton_launches", "body_kernels")


def at_e2e_depth(one: dict, two: dict) -> dict:
    """The counts of one step on 1 and 2 target layers -> its counts at the e2e model's depth (`E2E_LAYERS`): the
    second layer's launches repeated, as `test_a_step_adds_the_same_launches_with_each_layer` checks they are.
    (Counting under the interpreter costs CPU seconds per layer.)"""
    deep = dict(two)
    deep.update({k: two[k] + (kc.E2E_LAYERS - 2) * (two[k] - one[k]) for k in PER_LAYER})
    deep["by_op"] = two["by_op"] + Counter({op: (kc.E2E_LAYERS - 2) * (n - one["by_op"][op])
                                            for op, n in two["by_op"].items() if n > one["by_op"][op]})
    return deep


@interpreted
def test_a_step_adds_the_same_launches_with_each_layer():
    one, two, three = (kc.count_step_kernels("target-only", 1, "fast", num_layers=n) for n in (1, 2, 3))
    assert {k: two[k] - one[k] for k in PER_LAYER} == {k: three[k] - two[k] for k in PER_LAYER}, (one, two, three)
    assert two["by_op"] - one["by_op"] == three["by_op"] - two["by_op"]
    assert one["eager_ops"] == two["eager_ops"] == three["eager_ops"] and one["eager_by_op"] == three["eager_by_op"]


@interpreted
@pytest.mark.parametrize("label", sorted(kc.KERNEL_BUDGETS))
def test_decode_step_stays_within_its_kernel_budget(label):
    case = budgeted_case(label)
    c = at_e2e_depth(*(kc.count_step_kernels(case.kind, 1, "fast", spec=case.spec, num_layers=n) for n in (1, 2)))
    assert c["label"] == label
    assert c["total_kernels"] == c["aten_kernels"] + c["triton_launches"] == c["body_kernels"] + c["eager_ops"]
    assert c["host_reads"] == 0, "a decode body must not read a device value on the host"
    assert c["triton_launches"] >= 3 * kc.E2E_LAYERS  # rope + attention + its merge, per target layer
    budget = kc.KERNEL_BUDGETS[label]
    assert c["total_kernels"] <= budget, (
        f"{label}: one decode step issues {c['total_kernels']} kernels, over its budget of {budget}; most issued: "
        f"{kc.top_ops(c['by_op'])}")
    assert "aten.clone" not in c["eager_by_op"], "the step is read from the graph's outputs, not copied out"
    assert c["eager_ops"] <= kc.EAGER_OPS_GOAL, (
        f"{label}: one decode step issues {c['eager_ops']} eager ops outside its CUDA graph, over the goal of "
        f"{kc.EAGER_OPS_GOAL}: {kc.top_ops(c['eager_by_op'])}")
