"""The coins' partition (specdec.lab.coins) against laws written out here: an inverse-CDF draw's cells are its
probabilities, accept tests whose thresholds depend on another coin's cell give the products of their intervals, and
draws without replacement read column after column give the Plackett-Luce law."""
from __future__ import annotations

import pytest
import torch

from reference import sample_without_replacement
from specdec.lab import GRID, partition
from tests.helpers.oracles import plackett_luce

#: one lattice step: the largest error of a cell's probability on the engine's own uniforms
STEP = 1.0 / GRID


def by_key(cells) -> dict:
    return {c.key: c.prob for c in cells}


def test_an_inverse_cdf_draw_has_the_cells_of_its_probabilities():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.25, 0.25]])

    def site(rows, coins):  # the first token whose cumulative mass exceeds u (strictly)
        cdf = probs[rows].cumsum(-1)
        return (cdf <= coins[:, :1]).sum(-1).clamp_max(3).tolist()

    cells, calls = partition(site, [0, 1], 1, [[0]])
    for r, (row, found) in enumerate(zip(probs, cells)):
        law = by_key(found)
        assert set(law) == {v for v in range(4) if row[v] > 0}  # a token of no mass has no cell
        assert all(abs(law[v] - float(row[v])) <= 2 * STEP for v in law)
        assert found[0].prob == max(c.prob for c in found)  # the most probable first
        for c in found:  # each cell's representative coin gives its outcome
            assert site(torch.tensor([r]), torch.tensor([[c.point[0] / GRID]]))[0] == c.key
    assert calls <= 8  # each change located by 16-way cuts, all rows at once


def test_accept_tests_whose_thresholds_depend_on_another_coin():
    """Coin 0 below 1/2: coin 1 below 0.2 gives A, else B; coin 0 above: coin 1 below 0.7 gives C, else D. Neither
    coin alone shows where coin 1 changes: the grid is refined until no line through a box changes."""
    def site(rows, coins):
        u0, u1 = coins[:, 0].tolist(), coins[:, 1].tolist()
        return [("A" if b < 0.2 else "B") if a < 0.5 else ("C" if b < 0.7 else "D") for a, b in zip(u0, u1)]

    law = by_key(partition(site, [0], 2, [[0, 1]])[0][0])
    want = {"A": 0.5 * 0.2, "B": 0.5 * 0.8, "C": 0.5 * 0.7, "D": 0.5 * 0.3}
    assert set(law) == set(want) and all(abs(law[k] - want[k]) <= 2 * STEP for k in want)


def test_a_coin_read_after_the_others_is_partitioned_per_cell():
    """A later group's breakpoints depend on the earlier one's cell: coin 1 is read only where coin 0 stopped."""
    def site(rows, coins):
        u0, u1 = coins[:, 0].tolist(), coins[:, 1].tolist()
        return [("stop", 0 if b < 0.25 else 1) if a < 0.4 else ("go", 0 if b < 0.9 else 1) for a, b in zip(u0, u1)]

    law = by_key(partition(site, [0], 2, [[0], [1]])[0][0])
    want = {("stop", 0): 0.4 * 0.25, ("stop", 1): 0.4 * 0.75, ("go", 0): 0.6 * 0.9, ("go", 1): 0.6 * 0.1}
    assert set(law) == set(want) and all(abs(law[k] - want[k]) <= 2 * STEP for k in want)


@pytest.mark.parametrize("K", [1, 2, 3])
def test_draws_without_replacement_column_after_column_are_the_plackett_luce_law(K):
    q = torch.tensor([[0.05, 0.4, 0.25, 0.2, 0.1]])

    def site(rows, coins):
        return list(map(tuple, sample_without_replacement(q[rows], coins).tolist()))

    law = by_key(partition(site, [0], K, [[k] for k in range(K)])[0][0])
    want = plackett_luce(q[0].tolist(), K)
    assert set(law) == set(want)
    assert max(abs(law[k] - want[k]) for k in want) < 1e-6
    assert abs(sum(law.values()) - 1.0) < 1e-12
