"""Every coin as intervals: the uniforms a draw site consumes, partitioned into cells on which its outcome is constant.

The engine's uniforms are `torch.rand`'s float32 values, the multiples k / 2^24 of [0, 1) (`GRID`): a coin is a
lattice point k, an interval [a, b) of them has probability (b - a) / 2^24, and a cell's probability is the product
over its coins. The cells are found by calling the site itself (the op, as the engine runs it) on chosen coins: the
breakpoints of a coin along a line are located exactly on the lattice, by searches that cut each bracket of a change
into `FAN` pieces per call.

What the search assumes of a site, true of every op the engine draws through (inverse-CDF draws and accept tests):

* along any line parallel to one coin's axis, the outcome never returns to a value it left (an accept test changes
  it once, an inverse-CDF draw moves through distinct tokens in order), so a line whose two ends agree holds no
  breakpoint, and a box whose lines through its middle agree at their ends is one cell;
* the coins come in groups read one after another (`groups`): the breakpoints of a group's coins depend on the
  earlier groups' cells only, never on a later group's coins (the bonus token's coin is read after the verify's
  coins decided the path; draw k of a node after draws 0..k-1). Within a group, a coin's breakpoints may depend on
  the other coins' cells: the group's grid is refined until no line through a cell's middle changes.

A site that breaks them is not enumerated exactly; `specdec.lab.monte_carlo_law` checks any site by sampling.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

#: the lattice of the engine's uniforms: torch.rand's float32 values are k / GRID, k in [0, GRID)
GRID = 1 << 24
#: where a coin of a later group sits while an earlier group is partitioned
PROBE = GRID // 2


@dataclass(frozen=True)
class Cell:
    """Coins on which a site's outcome is `key`: `point` a representative (lattice integers, one per coin, the
    middle of the cell's largest box), `prob` the probability of all the coins giving `key`."""

    point: tuple[int, ...]
    prob: float
    key: Hashable


class Evaluator:
    """A site's outcome at lattice points, each asked once: `site(rows, uniforms)` evaluates rows (M,) int64 of the
    site's batch at uniforms (M, d) float32 and returns M hashable outcomes."""

    def __init__(self, site: Callable[[torch.Tensor, torch.Tensor], list]):
        self.site = site
        self.known: dict[tuple[int, tuple[int, ...]], Hashable] = {}
        self.calls = 0

    def __call__(self, queries: Sequence[tuple[int, tuple[int, ...]]]) -> list[Hashable]:
        missing = list(dict.fromkeys(q for q in queries if q not in self.known))
        if missing:
            rows = torch.tensor([r for r, _ in missing], dtype=torch.int64)
            coins = torch.tensor([p for _, p in missing], dtype=torch.float64).div_(GRID).to(torch.float32)
            keys = self.site(rows, coins)
            self.calls += 1
            self.known.update(zip(missing, keys))
        return [self.known[q] for q in queries]


def _at(point: tuple[int, ...], i: int, x: int) -> tuple[int, ...]:
    return point[:i] + (x,) + point[i + 1:]


#: points a bracket is split into per round of the search: 2^24 lattice points take 6 rounds
FAN = 16


def segments(ev: Evaluator, lines: Sequence[tuple[int, tuple[int, ...], int, int, int]]) -> list[list[tuple]]:
    """lines: (row, point, coin i, a, b): coin i along [a, b) with the other coins at `point`. -> per line, its
    segments [(a_j, b_j, key_j)] covering [a, b) in order, each of one outcome. Every bracket of a change (two points
    of different outcomes) is cut into `FAN` pieces per round, all lines at once, until each change is located to one
    lattice step."""
    ends = ev([(r, _at(p, i, a)) for r, p, i, a, b in lines] + [(r, _at(p, i, b - 1)) for r, p, i, a, b in lines])
    first, last = ends[:len(lines)], ends[len(lines):]
    changes: list[dict[int, Hashable]] = [{} for _ in lines]  # per line: where the outcome changes -> the new one
    brackets = [(j, a, k0, b - 1, k1) for j, ((_, _, _, a, b), k0, k1) in enumerate(zip(lines, first, last))
                if k0 != k1]
    while brackets:
        cuts = [sorted({lo + (hi - lo) * m // FAN for m in range(1, FAN)} - {lo, hi})
                for _, lo, _, hi, _ in brackets]
        keys = ev([(lines[j][0], _at(lines[j][1], lines[j][2], x))
                   for (j, *_), xs in zip(brackets, cuts) for x in xs])
        going, k = [], 0
        for (j, lo, klo, hi, khi), xs in zip(brackets, cuts):
            points = [(lo, klo)] + list(zip(xs, keys[k:k + len(xs)])) + [(hi, khi)]
            k += len(xs)
            for (x0, k0), (x1, k1) in zip(points, points[1:]):
                if k0 == k1:
                    continue  # no change inside: the outcome never returns to a value it left
                if x1 == x0 + 1:
                    changes[j][x1] = k1
                else:
                    going.append((j, x0, k0, x1, k1))
        brackets = going
    found = []
    for (_, _, _, a, b), k0, where in zip(lines, first, changes):
        edges = [a] + sorted(where) + [b]
        outcomes = [k0] + [where[x] for x in sorted(where)]
        found.append([(x0, x1, key) for x0, x1, key in zip(edges, edges[1:], outcomes)])
    return found


def _intervals(breaks: list[int]) -> list[tuple[int, int]]:
    edges = [0] + sorted(breaks) + [GRID]
    return list(zip(edges[:-1], edges[1:]))


def _middle(a: int, b: int) -> int:
    return (a + b - 1) // 2


def grid_cells(ev: Evaluator, tasks: Sequence[tuple[int, tuple[int, ...]]], coins: Sequence[int]) -> list[list]:
    """A group of several coins, for each task (row, point: the other coins' values): the boxes of a grid on which the
    outcome is constant -> per task, [{coin: (a, b)}]. The grid starts whole and gains every breakpoint a line
    through a box's middle crosses, until none does."""
    breaks: list[dict[int, set[int]]] = [{i: set() for i in coins} for _ in tasks]
    while True:
        lines, owners = [], []
        boxes_of = []
        for t, (row, point) in enumerate(tasks):
            axes = [_intervals(list(breaks[t][i])) for i in coins]
            boxes = [dict(zip(coins, box)) for box in itertools.product(*axes)]
            boxes_of.append(boxes)
            for box in boxes:
                middle = point
                for i, (a, b) in box.items():
                    middle = _at(middle, i, _middle(a, b))
                for i, (a, b) in box.items():
                    if b - a > 1:
                        lines.append((row, middle, i, a, b))
                        owners.append((t, i))
        new = False
        for (t, i), found in zip(owners, segments(ev, lines)):
            for a, _, _ in found[1:]:
                if a not in breaks[t][i]:
                    breaks[t][i].add(a)
                    new = True
        if not new:
            return boxes_of


def partition(site: Callable[[torch.Tensor, torch.Tensor], list], rows: Sequence[int], width: int,
              groups: Sequence[Sequence[int]]) -> tuple[list[list[Cell]], int]:
    """The cells of a site's coins for each of `rows`: `width` coins per row, read in `groups` (see the module
    docstring). -> (per row, its cells by outcome, the most probable first; the site calls made). Cells of one
    outcome are merged (their probabilities summed, the largest box's middle kept as the representative)."""
    ev = Evaluator(site)
    # partial cells: (row index, point, probability, the largest box's probability)
    partial = [(k, (PROBE,) * width, 1.0) for k in range(len(rows))]
    for group in groups:
        tasks = [(rows[k], point) for k, point, _ in partial]
        grown = []
        if len(group) == 1:
            i = group[0]
            for (k, point, prob), found in zip(partial, segments(ev, [(r, p, i, 0, GRID) for r, p in tasks])):
                grown += [(k, _at(point, i, _middle(a, b)), prob * (b - a) / GRID) for a, b, _ in found]
        else:
            for (k, point, prob), boxes in zip(partial, grid_cells(ev, tasks, group)):
                for box in boxes:
                    p, q = point, prob
                    for i, (a, b) in box.items():
                        p, q = _at(p, i, _middle(a, b)), q * (b - a) / GRID
                    grown.append((k, p, q))
        partial = grown
    keys = ev([(rows[k], point) for k, point, _ in partial])
    merged: list[dict] = [{} for _ in rows]
    for (k, point, prob), key in zip(partial, keys):
        total, best, best_prob = merged[k].get(key, (0.0, point, -1.0))
        merged[k][key] = (total + prob, point, prob) if prob > best_prob else (total + prob, best, best_prob)
    cells = [sorted((Cell(point, total, key) for key, (total, point, _) in m.items()), key=lambda c: -c.prob)
             for m in merged]
    return cells, ev.calls
