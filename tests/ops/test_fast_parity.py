"""`fast` mirrors `reference`: same op names, same signatures, nothing exported that does not exist,
and the engine refuses a fast path that lacks an op the workers call."""
from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fast
import reference
from specdec.ops.contract import WORKER_OPS
from specdec.verify_rules import rule_ops
from tests.helpers.equivalence import NO_LAUNCH, TorchCalls, record_triton_launches

WORKER_CLASSES = {"EagleWorkerV2", "MultiLayerEagleWorkerV2", "TargetOnlyWorker"}
SHARED_OPS = sorted(set(reference.__all__) - WORKER_CLASSES & set(fast.__all__))


def test_fast_exports_only_what_exists():
    for name in fast.__all__:
        assert callable(getattr(fast, name)), name
    assert set(fast.__all__) - WORKER_CLASSES <= set(reference.__all__)
    assert SHARED_OPS, "fast exports no op at all"


@pytest.mark.parametrize("name", SHARED_OPS)
def test_same_signature_as_the_reference(name):
    ref, fst = inspect.signature(getattr(reference, name)), inspect.signature(getattr(fast, name))
    assert [(p.name, p.kind, p.default) for p in ref.parameters.values()] == \
        [(p.name, p.kind, p.default) for p in fst.parameters.values()]
    assert getattr(fast, name).__doc__, f"fast.{name} has no docstring"


@pytest.mark.parametrize("ops", [reference, fast], ids=["reference", "fast"])
def test_both_packages_export_every_worker_op(ops):
    """The contract's ops and every registered verify rule's named op."""
    needed = set(WORKER_OPS) | set(rule_ops())
    assert {"tree_speculative_sampling_target_only", "tree_speculative_sampling_traversal"} <= needed
    assert needed <= set(ops.__all__)
    assert all(callable(getattr(ops, name)) for name in needed)


def test_reference_never_imports_triton():
    code = "import sys, reference, specdec, specdec.workers; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


ROOT = Path(__file__).resolve().parents[2]
#: the only parts of specdec that the op packages (and the ops' contract itself) may import: the ground floor
OPS_MAY_IMPORT = ("specdec.ops", "specdec.checks")


def _imported_modules(source: str, package: str) -> set[str]:
    """Every module `source` imports, anywhere in it (function-local imports included), as absolute names:
    `from X import y` yields X.y as well as X, since y may be a module; `from specdec import y` only specdec.y."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found |= {f"{base}.{alias.name}" for alias in node.names} | ({base} - {"specdec"})
    return found


def _is_forbidden(name: str) -> bool:
    return (name == "specdec" or name.startswith("specdec.")) and \
        not any(name == a or name.startswith(a + ".") for a in OPS_MAY_IMPORT)


def test_the_import_rule_sees_function_local_and_relative_imports():
    source = ("import specdec\ndef f():\n    from specdec.engine import Engine\nfrom .. import workers, checks\n"
              "from ..checks import check_int\nfrom .contract import NO_NODE\n")
    names = _imported_modules(source, "specdec.ops")
    assert {n for n in names if _is_forbidden(n)} == {"specdec", "specdec.engine", "specdec.engine.Engine",
                                                       "specdec.workers"}
    assert _is_forbidden("specdec.models.ngram") and not _is_forbidden("specdec.ops.op_checks")


def test_reference_and_fast_import_from_specdec_only_the_ops_and_the_checks():
    """`reference`, `fast` and `specdec.ops` import nothing of specdec but `specdec.ops` and `specdec.checks`: no
    arrow runs from the ops up to the engine, the workers, the models, the benchmarks or the zoo."""
    bad = []
    for folder, package in (("reference", "reference"), ("fast", "fast"), ("specdec/ops", "specdec.ops")):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            sub = ".".join(rel.with_suffix("").parts[len(Path(folder).parts):-1])
            module_package = f"{package}.{sub}" if sub else package
            bad += [f"{rel}: {name}" for name in sorted(_imported_modules(path.read_text(), module_package))
                    if _is_forbidden(name)]
    assert not bad, "imports outside specdec.ops and specdec.checks:\n" + "\n".join(bad)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="counts launches through Triton's interpreter; compiled kernels never enter it")
def test_tree_build_verify_and_commit_are_single_launches(monkeypatch):
    """One Triton launch each, and no torch op beside it that would launch device work."""
    import torch

    from tests.helpers.oracles import DraftedTree

    launches = record_triton_launches(monkeypatch)
    tree = DraftedTree(B=2, K=4, S=3, W=12, V=50, seed=0)
    bonus, seq_lens = torch.tensor([1, 2]), torch.tensor([5, 6])
    build_args = (bonus, tree.parent_list, tree.top_scores_index, tree.draft_tokens, seq_lens, 4, 3, 12)
    _, _, ri, nt, ns, flat = fast.build_tree_kernel_efficient(*build_args)
    cand = flat.view(2, 12).contiguous()
    probs = torch.softmax(torch.randn(2, 12, 50), -1)
    u, u_final = torch.rand(2, 12), torch.rand(2)
    kv = torch.zeros(4, 3, 64, 2, 8)
    accept = torch.tensor([[0, 1, -1], [12, 14, 15]], dtype=torch.int32)
    slots = torch.tensor([0, 2])
    for name, call in [
        ("build_tree_kernel_efficient_kernel", lambda: fast.build_tree_kernel_efficient(*build_args)),
        ("verify_tree_greedy_kernel", lambda: fast.verify_tree_greedy(cand, ri, nt, ns, cand, 3)),
        ("tree_speculative_sampling_target_only_kernel",
         lambda: fast.tree_speculative_sampling_target_only(cand, ri, nt, ns, u, u_final, probs, 3)),
        ("commit_kv_cache_kernel", lambda: fast.commit_kv_cache(kv, slots, seq_lens, accept, 12)),
    ]:
        launches.clear()
        with TorchCalls() as calls:
            call()
        assert launches == [name]
        assert calls.names <= NO_LAUNCH, calls.names - NO_LAUNCH


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="counts launches through Triton's interpreter; compiled kernels never enter it")
@pytest.mark.parametrize("splits", [1, 4])
def test_the_logprob_op_is_one_launch_split_or_not(monkeypatch, splits):
    """Scaled, with top-k: one Triton launch whether the vocabulary is split or not (the last split merges), and
    beside it only allocations, views and the split path's zeroed done-counters."""
    import functools

    import fast.logprobs as fast_logprobs
    from specdec.ops.logprob_types import LogitsOutput, SamplingInfo, SpecBatch

    launches = record_triton_launches(monkeypatch)
    monkeypatch.setattr(fast_logprobs, "compute_spec_v2_logprobs_launch",
                        functools.partial(fast_logprobs.compute_spec_v2_logprobs_launch, _num_splits=splits))
    g = torch.Generator().manual_seed(3)
    B, T, V = 2, 3, 9000
    logits = torch.randn(B * T, V, generator=g)
    predict = torch.randint(V, (B * T,), generator=g)
    accept = torch.tensor([[0, 2, -1], [3, 4, 5]], dtype=torch.int32)
    batch = SpecBatch(torch.full((B,), 7), SamplingInfo(torch.tensor([[0.7], [1.3]]), False), [3, 0], None)
    lo = LogitsOutput(next_token_logits=logits)
    with TorchCalls() as calls:
        fast.compute_spec_v2_logprobs(batch, lo, predict, accept, T - 1)
    assert launches == ["compute_spec_v2_logprobs_kernel"]
    beside = {"zeros"} if splits > 1 else set()
    views = {"reshape", "unbind", "__getitem__", "__iter__", "__len__", "_set_grad_enabled"}
    assert calls.names <= NO_LAUNCH | views | beside, calls.names - NO_LAUNCH - views - beside
    rows = accept.reshape(-1).clamp(min=0).long()
    want = torch.log_softmax(logits.double() / torch.tensor([0.7, 1.3]).double().repeat_interleave(T)[:, None], -1)
    got = lo.next_token_logprobs.reshape(-1)
    want_lp = want[rows, predict[rows]]  # W = T here: logits row j belongs to request j // T
    valid = accept.reshape(-1) >= 0
    torch.testing.assert_close(got[valid].double(), want_lp[valid], rtol=0, atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_fast_runs_on_a_cpu_without_the_interpreter_variable():
    """A user on a CPU who never heard of TRITON_INTERPRET still gets a working `impl="fast"`."""
    code = "\n".join([
        "from specdec import Engine, SamplingParams",
        "from specdec.models import random_llama",
        "t, sp = random_llama(), SamplingParams(max_new_tokens=4)",
        "a = Engine(t, impl='fast').generate([[1, 2, 3]], sp)[0].token_ids",
        "b = Engine(t, impl='reference').generate([[1, 2, 3]], sp)[0].token_ids",
        "assert a == b, (a, b)",
    ])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)
