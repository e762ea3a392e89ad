"""The exact law of the first n emitted tokens of an engine configuration: every draft draw and every coin
enumerated, each path weighted by its probability, summed in float64.

The engine runs as it always does (its worker, its drafting, the rule's op through `SampledVerify`); the checker
watches the three places where randomness enters a step, and supplies their uniforms itself:

* ``tokens``: `WorkerBase.sample_tokens`, the prefill's first token (and a target-only step's): one coin per request;
* ``draws``: the ops module's `sample_without_replacement`, a sampled draft's proposals: R nodes per request (the
  rows of the call), K coins each, read in draw order;
* ``verify``: the worker's `sampled_verify`, the rule's op: W coins (one per node) then the bonus token's.

At a call a path has not reached yet, the coins of each of its rows are partitioned into cells of one outcome
(`specdec.lab.coins`, calling the site itself); the request goes on with the most probable cell and the others are
queued as new paths. Paths run side by side as the requests of one batch; a path replayed in a later batch must meet
the outcomes it recorded, or the run stops (`LabError`). A path's probability is the product of its cells'.

The sites that emit tokens (a verify, a sampled token) end paths: a cell that ends the request (n tokens, or a stop
id) has a known outcome, so the cells that end alike are merged and counted at once and only those that go on are
queued; the request the checker runs closes there too (the draws after it, such as the next root's, change nothing
emitted, and are neither partitioned nor counted), and its end must be the one foreseen. With `steps=k` a path also
closes after its k-th decode step, its tokens so far completed by the target's own law (`target_law` given them):
the law of what k speculative steps emit, each shorter emission finished by target-only decoding, which equals the
target's own law exactly when those k steps are lossless; it spares enumerating every later step's draft trees.

Where a row can be left with no token (a -inf logit bias, min_new_tokens under a grammar), which ends a request in
error mid-step, nothing is foreseen: every cell runs to its end, and `steps` is refused.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..config import SamplingParams, SpecConfig
from .coins import GRID, PROBE, partition
from .report import LawReport
from .setup import Setup
from .target import ERROR, target_law


class LabError(RuntimeError):
    """The engine did not behave as the enumeration assumes (a replayed path met another outcome, a site's coins
    were not of the shape recorded), or there were more paths than allowed."""


#: an emitting site's outcome for a cell that closes its path: (CLOSED, the tokens, whether the target completes them)
CLOSED = "closed"


@dataclass(frozen=True)
class _Choice:
    """A path's cell at one site call: the site, its request's coins (R rows of d lattice points), the cell's
    probability and the outcome of each of its rows."""

    site: str
    coins: tuple[tuple[int, ...], ...]
    prob: float
    key: tuple


def _closing(key: tuple) -> tuple | None:
    """(tokens, open) when a choice's key closes its path (an emitting site's single row), else None."""
    row = key[0]
    return row[1:] if isinstance(row, tuple) and len(row) == 3 and row[0] == CLOSED else None


@dataclass
class _Path:
    choices: list[_Choice]
    # what one run of it found and where it stands (reset by `_Watch.begin`)
    cursor: int = 0
    branches: list = field(default_factory=list)  # (call index, the cells there that go on)
    weight: float = 1.0  # the probability of its cells before `cursor`
    emitted: tuple = ()  # the tokens its calls emitted before `cursor`
    steps: int = 0  # its emitting calls before `cursor` (the prefill's first)
    last_emit: int = -1  # the index of its last emitting call
    emit_weight: float = 1.0  # the probability of its cells up to that call
    closed: tuple | None = None  # (tokens, open) once a cell closed it


def _coin_tensor(coins, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(coins, dtype=torch.float64).div_(GRID).to(dtype=torch.float32, device=like.device)


class _Ops:
    """The worker's ops module with `sample_without_replacement` watched; every other op is the module's own."""

    def __init__(self, ops, watch: "_Watch"):
        self._ops, self._watch = ops, watch
        self.__name__ = getattr(ops, "__name__", "ops")

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def sample_without_replacement(self, probs, uniforms):
        return self._watch.draws(self._ops.sample_without_replacement, probs, uniforms)


class _Watch:
    """The three draw sites of one worker, watched (see the module docstring), and the paths of its rows.

    n, stops: the outcome's length and the ids that end a request; steps: the decode steps after which a path closes
    (None: none); foresee: whether a cell's end may be foreseen; counted: where the cells that close a path at a call
    other than the run's own are added ({(tokens, open): probability})."""

    def __init__(self, worker, n: int, stops: set[int], steps: int | None, foresee: bool, counted: dict):
        self.n, self.stops, self.steps, self.foresee, self.counted = n, stops, steps, foresee, counted
        self.paths: list[_Path] = []
        self.rows: list[int] = []  # the path of each of the worker's rows
        self._sample_tokens = worker.sample_tokens
        worker.sample_tokens = self.tokens
        worker.ops = _Ops(worker.ops, self)
        self._verify = getattr(worker, "sampled_verify", None)
        if self._verify is not None:
            worker.sampled_verify = self.verify
        self._filter = worker.filter
        worker.filter = self.filter

    def begin(self, paths: list[_Path]) -> None:
        self.paths, self.rows = paths, list(range(len(paths)))
        for p in paths:
            p.cursor, p.branches, p.weight, p.emitted, p.steps, p.closed = 0, [], 1.0, (), 0, None
            p.last_emit, p.emit_weight = -1, 1.0

    def filter(self, keep):
        self._filter(keep)
        self.rows = [self.rows[i] for i in keep]

    def closing(self, path: _Path, new: tuple) -> tuple | None:
        """(tokens, open) when emitting `new` closes `path`: its request ends (n tokens, a stop id; open False), or
        this is its `steps`-th decode step (open True: the target completes it); else None."""
        out = path.emitted
        for t in new:
            out += (t,)
            if t in self.stops or len(out) >= self.n:
                return out, False
        if self.steps is not None and path.steps >= self.steps:
            return out, True
        return None

    def canonical(self, rows: list[int], keys: list, tokens_of: Callable) -> list:
        """An emitting site's outcomes for batch `rows`: (CLOSED, tokens, open) where the cell closes the path."""
        if not self.foresee:
            return keys
        out = []
        for b, key in zip(rows, keys):
            closes = self.closing(self.paths[self.rows[b]], tokens_of(key))
            out.append(key if closes is None else (CLOSED, *closes))
        return out

    # ---- the sites --------------------------------------------------------------------------------------------
    def tokens(self, logits, uniforms, greedy):
        if uniforms is None:
            return self._sample_tokens(logits, uniforms, greedy)

        def site(rows, coins):
            keys, rows = [None] * len(rows), rows.tolist()
            pending = list(range(len(rows)))
            while pending:  # one call evaluates each row once: a row asked twice waits for the next call
                seen, now, later = set(), [], []
                for q in pending:
                    (later if rows[q] in seen else now).append(q)
                    seen.add(rows[q])
                full = uniforms.clone()
                full.index_copy_(0, torch.tensor([rows[q] for q in now], device=full.device),
                                 coins[:, 0].index_select(0, torch.tensor(now)).to(full.device))
                out = self._sample_tokens(logits, full, greedy).tolist()
                for q in now:
                    keys[q] = out[rows[q]]
                pending = later
            return keys

        return self._site("tokens", 1, uniforms[:, None], [[0]], site,
                          lambda coins: self._sample_tokens(logits, coins[:, 0].contiguous(), greedy),
                          lambda out: out.tolist(), tokens_of=lambda key: (key,))

    def draws(self, op, probs, uniforms):
        R = probs.shape[0] // len(self.rows)

        def site(rows, coins):
            # index_select: a tensor index costs a thousand times more on a CPU
            return list(map(tuple, op(probs.index_select(0, rows.to(probs.device)), coins.to(probs.device)).tolist()))

        return self._site("draws", R, uniforms, [[k] for k in range(uniforms.shape[1])], site,
                          lambda coins: op(probs, coins), lambda out: list(map(tuple, out.tolist())))

    def verify(self, tree, uniforms, target_probs, num_steps):
        B, W = tree.candidates.shape
        flat = torch.arange(B * W, device=tree.candidates.device).view(B, W)
        if not torch.equal(tree.retrieve_index.to(flat.dtype), flat):
            raise LabError("the verify tree's retrieve_index is not the flat index b*W + i the checker replays")

        def emitted(out, M):
            """Each row's outcome: its accepted nodes, then the tokens it emits (-1 past its accepted length)."""
            predict, accept_index, accept_length = out
            index = accept_index.long()
            on = torch.arange(index.shape[1], device=index.device)[None, :] <= accept_length[:, None]
            nodes = torch.where(on, index - torch.arange(M, device=index.device)[:, None] * W, -1)
            tokens = torch.where(on, predict.long().take(index.clamp(min=0)), -1)
            return list(map(tuple, torch.cat([nodes, tokens], dim=1).tolist()))

        def site(rows, coins):
            rows = rows.to(tree.candidates.device)
            M = rows.shape[0]
            # the rows asked, side by side: the fields the verify reads (not the mask and positions of its forward)
            asked = dataclasses.replace(
                tree, candidates=tree.candidates.index_select(0, rows),
                retrieve_index=torch.arange(M * W, device=rows.device, dtype=tree.retrieve_index.dtype).view(M, W),
                retrieve_next_token=tree.retrieve_next_token.index_select(0, rows),
                retrieve_next_sibling=tree.retrieve_next_sibling.index_select(0, rows),
                draft_probs=None if tree.draft_probs is None else tree.draft_probs.index_select(0, rows))
            return emitted(self._verify(asked, coins.to(uniforms.device), target_probs.index_select(0, rows),
                                        num_steps), M)

        def run(coins):
            full = uniforms.clone()
            full[:, :W + 1] = coins
            return self._verify(tree, full, target_probs, num_steps)

        S1 = num_steps + 1
        return self._site("verify", 1, uniforms[:, :W + 1], [list(range(W)), [W]], site, run,
                          lambda out: emitted(out, B), tokens_of=lambda key: tuple(t for t in key[S1:] if t >= 0))

    def _site(self, name: str, R: int, uniforms, groups, raw_site: Callable, run: Callable, keys_of: Callable,
              tokens_of: Callable | None = None):
        """One call of a site: each row's coins replayed from its path, partitioned where its path ends (the other
        cells queued or, where they close the path, counted), or the lattice's middle for a closed path; the site
        run on them; each open row's outcome checked against its path's. An emitting site (`tokens_of`: an outcome
        -> the tokens it emits) closes the paths whose cells end there (`canonical`)."""
        if tokens_of is None:
            site = raw_site
        else:
            def site(rows, coins):
                return self.canonical(rows.tolist(), raw_site(rows, coins), tokens_of)
        d = uniforms.shape[1]
        chosen = uniforms.clone()
        frontier = []
        for b, r in enumerate(self.rows):
            path = self.paths[r]
            if path.closed is not None:
                chosen[b * R:(b + 1) * R] = PROBE / GRID
            elif path.cursor < len(path.choices):
                choice = path.choices[path.cursor]
                if choice.site != name or len(choice.coins) != R or len(choice.coins[0]) != d:
                    raise LabError(f"path {r}: call {path.cursor} is a {name} site of {R} x {d} coins, recorded as a "
                                   f"{choice.site} site of {len(choice.coins)} x {len(choice.coins[0])}")
                chosen[b * R:(b + 1) * R] = _coin_tensor(choice.coins, chosen)
            else:
                frontier.append(b)
        if frontier:
            rows = [b * R + j for b in frontier for j in range(R)]
            cells, _ = partition(site, rows, d, groups)
            for k, b in enumerate(frontier):
                combos = itertools.product(*cells[k * R:(k + 1) * R])  # a request's rows: every cell of each
                choices = [_Choice(name, tuple(c.point for c in combo), math.prod(c.prob for c in combo),
                                   tuple(c.key for c in combo)) for combo in combos]
                choices.sort(key=lambda c: -c.prob)
                path = self.paths[self.rows[b]]
                going = []
                for c in choices[1:]:
                    closes = _closing(c.key)
                    if closes is None:
                        going.append(c)
                    else:  # its outcome is known: counted now, never run
                        self.counted[closes] = self.counted.get(closes, 0.0) + path.weight * c.prob
                path.branches.append((path.cursor, going))
                path.choices.append(choices[0])
                chosen[b * R:(b + 1) * R] = _coin_tensor(choices[0].coins, chosen)
        out = run(chosen)
        raw = keys_of(out)
        keys = raw if tokens_of is None else self.canonical(list(range(len(raw))), raw, tokens_of)
        for b, r in enumerate(self.rows):
            path = self.paths[r]
            if path.closed is not None:
                continue
            choice = path.choices[path.cursor]
            got = tuple(keys[b * R:(b + 1) * R])
            if got != choice.key:
                raise LabError(f"path {r}: its {name} call {path.cursor} gave {got} where the path recorded "
                               f"{choice.key} (a cell moved between batches)")
            path.weight *= choice.prob
            if tokens_of is not None:
                path.emitted += tokens_of(raw[b])
                path.steps += 1
                path.closed = _closing(got)
                path.last_emit, path.emit_weight = path.cursor, path.weight
            path.cursor += 1
        return out


def exact_law(target, draft=None, spec: SpecConfig | None = None, params: SamplingParams | None = None,
              prompt=(0,), n: int = 2, tokenizer=None, impl: str = "reference", steps: int | None = None,
              batch: int = 256, max_paths: int = 200_000) -> LawReport:
    """The exact law of the first `n` tokens that `Engine(target, draft, spec, impl=impl)` emits after `prompt` under
    `params` (default: temperature 1), beside the target's own (`target_law`), every draft draw and coin enumerated
    through the engine's own code (see the module docstring). `steps`: close each path after that many decode steps,
    the target completing its tokens. `batch` paths run side by side; more than `max_paths` paths is a `LabError`
    (use `steps`, smaller shapes, or `monte_carlo_law`)."""
    setup = Setup(target, draft, spec, params if params is not None else SamplingParams(temperature=1.0), prompt, n,
                  tokenizer, impl)
    p = setup.params
    # a row left with nothing to decode ends its request in error mid-step: no cell's end is foreseen then
    foresee = not ((p.logit_bias and -math.inf in p.logit_bias.values()) or (p.min_new_tokens and p.has_grammar))
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1 or not foresee):
        raise ValueError(f"steps must be an int >= 1 (decode steps before the target completes a path), for a request "
                         f"no row of which can be left with no token (no -inf logit bias, no min_new_tokens under a "
                         f"grammar); got steps={steps!r}")
    t0 = time.perf_counter()
    engine = setup.engine(batch)
    counted: dict[tuple, float] = {}  # (tokens, open) -> probability
    watch = _Watch(engine.worker, n, setup.stop_ids(), steps, foresee, counted)
    queue, runs = [_Path([])], 0
    while queue:
        chunk, queue = queue[:batch], queue[batch:]
        watch.begin(chunk)
        outs = engine.generate([list(setup.prompt)] * len(chunk), setup.params)
        for path, out in zip(chunk, outs):
            outcome = tuple(out.token_ids) + ((ERROR,) if out.finish_reason == "error" else ())
            if path.closed is None:  # nothing foreseen: its request's own end
                closes = (outcome, False)
            else:
                closes = path.closed
                tokens, open_ = closes
                if (outcome[:len(tokens)] if open_ else outcome) != tokens:
                    raise LabError(f"a path foreseen to close on {tokens} ended as {outcome}")
            # a call after its last emitting one (the next root's draws) changed nothing it emitted
            counted[closes] = counted.get(closes, 0.0) + path.emit_weight
            for index, going in path.branches:
                if index <= path.last_emit:
                    queue += [_Path(path.choices[:index] + [c]) for c in going]
        runs += len(chunk)
        if runs + len(queue) > max_paths:
            raise LabError(f"more than max_paths={max_paths} paths to enumerate ({runs} run, {len(queue)} queued): "
                           f"use steps=, a smaller vocabulary, tree or n, or monte_carlo_law")
    law: dict[tuple, float] = {}
    for (tokens, open_), weight in counted.items():
        completions = target_law(target, list(setup.prompt), n, p, tokenizer, given=tokens) if open_ else {tokens: 1.0}
        for outcome, q in completions.items():
            law[outcome] = law.get(outcome, 0.0) + weight * q
    target_side = target_law(target, list(setup.prompt), n, p, tokenizer)
    return LawReport.of("exact", law, target_side, runs, seconds=time.perf_counter() - t0)
