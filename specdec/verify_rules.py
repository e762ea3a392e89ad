"""The verify rules: one record per rule by which sampled requests are verified (`SpecConfig.verify`), read by every
place whose behaviour depends on the rule: SpecConfig's checks, the verification component
(`specdec.workers.verification`), `specdec bench --verify` and its suite, the differential tests and the exact-law
checker (`specdec.lab`).

A record (`VerifyRule`) names the rule's op, the tree shapes it runs on, whether it reads the draft's distribution,
whether it is lossless, and the small shapes its tests check it on. The op has SGLang's calling convention: it takes
any of `VERIFY_ARGUMENTS` by name (the verification component passes those its signature names) and returns
``(predict (B*W,) int32, accept_index (B, S+1) int32, accept_length (B,) int32)`` as
``tree_speculative_sampling_target_only`` does. A rule of the package names its op as a string, an op that
`reference` and `fast` both export (a worker looks it up in its ops module); a plugin passes the op itself (a
PyTorch function, which both paths then run) and may add a Triton one (`fast_op`).

Adding a rule to the package is its op in `reference` and `fast` and one `_register_built_in(VerifyRule(...))` at the
end of this module; from outside, `specdec.register_verify_rule(VerifyRule(...))`. A registered rule cannot be
replaced or removed (a plugin cannot change what a built-in rule does); `unregister` removes a plugin's.

This module imports nothing of specdec: `config` reads it (a SpecConfig names its rule), so it sits below config.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

#: the arguments a rule's op may take, by name (SGLang's names; `uniform_samples` (B, W) holds one coin per node,
#: `uniform_samples_for_final_sampling` (B,) the bonus token's)
VERIFY_ARGUMENTS = ("candidates", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling", "uniform_samples",
                    "uniform_samples_for_final_sampling", "target_probs", "draft_probs", "num_steps")
#: what a rule runs on: a chain (topk = 1) or a tree (topk > 1)
SHAPES = ("chain", "tree")


def shape_of(topk: int) -> str:
    """"chain" for topk = 1, "tree" otherwise."""
    return "chain" if topk == 1 else "tree"


@dataclass(frozen=True, eq=False)
class VerifyRule:
    """One verify rule.

    name: `SpecConfig.verify`'s value, the label suffix of its benchmark rows (a Python identifier);
    label: what the docs and tables call it ("recursive rejection sampling");
    op: the op (see the module docstring): the name of an op `reference` and `fast` both export, or a callable;
    fast_op: for a callable `op`, the fast path's own op (None: the fast path runs `op`);
    shapes: what it runs on, of `SHAPES`;
    reads_draft: whether its op reads the draft's distribution (`draft_probs`): it then needs
    `draft_sampling="sample"` and a draft kind that has a distribution;
    lossless: whether the emitted tokens follow the target's law (the tests check every lossless rule exactly with
    `specdec.lab`, and that the checker flags a lossy one);
    bench_shapes: the shapes `specdec bench --verify` runs it on (None: all of `shapes`);
    check_shapes: the tests' parameters: small (num_steps, topk, num_draft_tokens) shapes on which the exact-law
    checker runs the rule through every drafting kind (each among `shapes`; none: the tests pick one per shape);
    stopped_chains: whether it stays exact on a chain that ends where the drafted tokens decide (a tree whose links
    stop at a node chosen from the draws before it: DSpark's confidence cap). Rules that follow the tree's links
    node by node do; block verification weighs the whole chain against a length fixed before the draws, and the
    exact-law checker finds it lossy on such a chain."""

    name: str
    label: str
    op: str | Callable
    fast_op: Callable | None = None
    shapes: tuple[str, ...] = SHAPES
    reads_draft: bool = True
    lossless: bool = True
    bench_shapes: tuple[str, ...] | None = None
    check_shapes: tuple[tuple[int, int, int], ...] = ()
    stopped_chains: bool = True

    def runs_on(self, topk: int) -> bool:
        """Whether the rule verifies the shape of a SpecConfig with this topk (1: a chain)."""
        return shape_of(topk) in self.shapes

    def benched_on(self, topk: int) -> bool:
        """Whether `specdec bench --verify` runs the rule on a case of this topk."""
        return shape_of(topk) in (self.shapes if self.bench_shapes is None else self.bench_shapes)

    def op_for(self, ops) -> Callable:
        """The op this rule runs through the ops module `ops` (`reference` or `fast`); ValueError naming the op
        when the module lacks it."""
        if isinstance(self.op, str):
            op = getattr(ops, self.op, None)
            if op is None:
                raise ValueError(f"verify rule {self.name!r}: the ops module {getattr(ops, '__name__', ops)!r} has no "
                                 f"op {self.op!r}")
            return op
        if self.fast_op is not None and getattr(ops, "__name__", None) == "fast":
            return self.fast_op
        return self.op


def op_arguments(op: Callable, rule: str = "?") -> tuple[str, ...]:
    """The `VERIFY_ARGUMENTS` that `op`'s signature names, in its order; ValueError naming a parameter the
    verification component cannot fill (one without a default that is not among them)."""
    try:
        params = inspect.signature(op).parameters.values()
    except (TypeError, ValueError):
        raise ValueError(f"verify rule {rule!r}: its op {op!r} has no signature to bind by name") from None
    params = list(params)
    if all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        raise ValueError(f"verify rule {rule!r}: its op {getattr(op, '__name__', op)!r} names no parameter to bind by "
                         "(a wrapper taking *args, **kwargs: wrap it with functools.wraps)")
    names = []
    for p in params:
        if p.name in VERIFY_ARGUMENTS:
            names.append(p.name)
        elif p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(f"verify rule {rule!r}: its op's parameter {p.name!r} is none of "
                             f"{', '.join(VERIFY_ARGUMENTS)} and has no default")
    return tuple(names)


_RULES: dict[str, VerifyRule] = {}
#: every registered rule by name, read-only (`register` adds, `unregister` removes a plugin's), in registration order
VERIFY_RULES = MappingProxyType(_RULES)


def _check(rule: VerifyRule) -> None:
    """ValueError naming the field of a record the registry refuses (see `register`)."""
    if not isinstance(rule, VerifyRule):
        raise ValueError(f"register takes a VerifyRule, got {type(rule).__name__}")
    if not isinstance(rule.name, str) or not rule.name.isidentifier():
        raise ValueError(f"verify rule name must be a Python identifier, got {rule.name!r}")
    if rule.name in _RULES:
        raise ValueError(f"verify rule {rule.name!r} is already registered")
    if rule.name == "sampled":  # the benchmarks' label for a sampled draft verified target-only
        raise ValueError("verify rule name 'sampled' is reserved: it labels a sampled draft verified target_only")
    if not (isinstance(rule.op, str) and rule.op.isidentifier()) and not callable(rule.op):
        raise ValueError(f"verify rule {rule.name!r}: op must be the name of a reference op or a callable (its "
                         f"reference op), got {rule.op!r}")
    if rule.fast_op is not None and (isinstance(rule.op, str) or not callable(rule.fast_op)):
        raise ValueError(f"verify rule {rule.name!r}: fast_op must be a callable beside a callable op (a named op "
                         f"is looked up in each ops module), got {rule.fast_op!r}")
    if not rule.shapes or any(s not in SHAPES for s in rule.shapes):
        raise ValueError(f"verify rule {rule.name!r}: shapes must be a non-empty subset of {SHAPES}, got "
                         f"{rule.shapes!r}")
    if rule.bench_shapes is not None and any(s not in rule.shapes for s in rule.bench_shapes):
        raise ValueError(f"verify rule {rule.name!r}: bench_shapes must be among its shapes {rule.shapes}, got "
                         f"{rule.bench_shapes!r}")
    for shape in rule.check_shapes:
        if not (isinstance(shape, tuple) and len(shape) == 3 and all(isinstance(v, int) for v in shape)):
            raise ValueError(f"verify rule {rule.name!r}: check_shapes holds (num_steps, topk, num_draft_tokens) "
                             f"tuples, got {shape!r}")
        if not rule.runs_on(shape[1]):
            raise ValueError(f"verify rule {rule.name!r}: check shape {shape} is a {shape_of(shape[1])}, not among "
                             f"its shapes {rule.shapes}")
    for what in ("reads_draft", "lossless"):
        if not isinstance(getattr(rule, what), bool):
            raise ValueError(f"verify rule {rule.name!r}: {what} must be True or False, got {getattr(rule, what)!r}")


def _check_op(rule: VerifyRule) -> None:
    """A plugin's op: a named one must be a `reference` op, a callable one must bind by name; either must read the
    draft's distribution exactly when the record says so."""
    if isinstance(rule.op, str):
        # lazy: reference imports specdec.ops, whose package import runs specdec's, which imports this module
        import reference
        op = getattr(reference, rule.op, None) if rule.op in reference.__all__ else None
        if op is None:
            raise ValueError(f"verify rule {rule.name!r}: reference has no op {rule.op!r} (a plugin passes its "
                             f"reference op itself)")
    else:
        op = rule.op
    for candidate in (op, rule.fast_op):
        if candidate is None:
            continue
        names = op_arguments(candidate, rule.name)
        if ("draft_probs" in names) != rule.reads_draft:
            raise ValueError(f"verify rule {rule.name!r}: reads_draft={rule.reads_draft} but its op "
                             f"{'takes' if 'draft_probs' in names else 'does not take'} draft_probs")


def register(rule: VerifyRule) -> VerifyRule:
    """Add `rule` to `VERIFY_RULES`; ValueError naming the field when its name is taken or not an identifier, it has
    no reference op (a named op `reference` lacks, or neither a name nor a callable), its op takes an argument the
    verification component cannot fill or disagrees with `reads_draft`, or its shapes are not `SHAPES`."""
    _check(rule)
    _check_op(rule)
    _RULES[rule.name] = rule
    return rule


def register_plugin(rule: VerifyRule | None = None, **fields) -> VerifyRule:
    """A rule from outside the package (`specdec.register_verify_rule`): `rule` a `VerifyRule`, or its fields by name
    (`register_verify_rule(name="typical", label=..., op=my_op, reads_draft=False, lossless=False)`); `register`'s
    checks, and a one-line ValueError naming the fields a record cannot be without (name, label, op)."""
    if rule is None:
        missing = [what for what in ("name", "label", "op") if fields.get(what) is None]
        if missing:
            raise ValueError(f"verify rule {fields.get('name', '?')!r} lacks {', '.join(missing)}")
        try:
            rule = VerifyRule(**fields)
        except TypeError as e:
            raise ValueError(f"verify rule {fields.get('name', '?')!r}: {e}") from None
    elif fields:
        raise ValueError("register_verify_rule takes a VerifyRule or its fields, not both")
    return register(rule)


def unregister(name: str) -> None:
    """Remove the plugin rule `name`; ValueError for a built-in rule or a name not registered."""
    if name in BUILT_IN:
        raise ValueError(f"verify rule {name!r} is built in: it cannot be removed")
    if name not in _RULES:
        raise ValueError(f"unknown verify rule {name!r}; registered: {', '.join(_RULES)}")
    del _RULES[name]


def verify_rule(name: str) -> VerifyRule:
    """The rule named `name`; ValueError naming the registered rules otherwise."""
    try:
        return _RULES[name]
    except (KeyError, TypeError):
        raise ValueError(f"verify must be one of the registered rules ({', '.join(_RULES)}), got {name!r}") from None


def rule_ops() -> tuple[str, ...]:
    """The op names of the registered rules that name theirs: ops `reference` and `fast` must both export, beside
    `specdec.ops.contract.WORKER_OPS`."""
    return tuple(dict.fromkeys(r.op for r in _RULES.values() if isinstance(r.op, str)))


def _register_built_in(rule: VerifyRule) -> None:
    """A rule the package ships (`BUILT_IN`): `register`'s record checks."""
    # the package's ops are checked by its tests (both modules export them, with the signatures the records claim):
    # importing reference here would run before specdec's own import is done
    _check(rule)
    _RULES[rule.name] = rule


_register_built_in(VerifyRule(
    name="target_only", label="target-only verification (SGLang's)", op="tree_speculative_sampling_target_only",
    reads_draft=False, check_shapes=((2, 1, 3), (1, 2, 3), (2, 2, 4))))
_register_built_in(VerifyRule(
    name="rejection", label="recursive rejection sampling", op="tree_speculative_sampling_rejection",
    check_shapes=((2, 1, 3), (1, 2, 3), (2, 2, 4))))
_register_built_in(VerifyRule(
    name="block", label="block verification", op="chain_speculative_sampling_block", shapes=("chain",),
    check_shapes=((2, 1, 3),), stopped_chains=False))
# on a chain traversal verification is block verification: the bench runs it on trees only
_register_built_in(VerifyRule(
    name="traversal", label="Traversal Verification", op="tree_speculative_sampling_traversal", bench_shapes=("tree",),
    check_shapes=((1, 2, 3), (2, 2, 4), (2, 1, 3))))

#: the rules the package ships, registered above; `unregister` refuses them
BUILT_IN: tuple[str, ...] = tuple(_RULES)
