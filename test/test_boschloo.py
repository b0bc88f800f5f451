"""Boschloo's one-sided test (``discovery/boschloo.py``): equal to scipy's with the groups
as columns, never above Fisher's, and of exact size at the level under the design the
contrasts have (two groups of fixed size, a common rate under the null)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom, boschloo_exact, hypergeom

from thinkmem_ros.consolidator.discovery.boschloo import boschloo_greater
from thinkmem_ros.consolidator.discovery.contrasts import _fisher_greater, _rate_greater


def _borderline_tables(count: int, seed: int) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        n1, n0 = (int(x) for x in rng.integers(1, 300, size=2))
        if rng.random() < 0.3:
            n0 = int(rng.integers(300, 2500))
        if rng.random() < 0.3:
            n1, n0 = n0, n1
        rate = rng.uniform(0.01, 0.9)
        k0 = int(rng.binomial(n0, rate))
        k1 = int(rng.binomial(n1, min(1.0, rate * rng.uniform(1.0, 2.5))))
        fisher = float(hypergeom.sf(k1 - 1, n1 + n0, k1 + k0, n1)) if k1 else 1.0
        if 0.005 < fisher <= 0.25 and (n1 + 1) * (n0 + 1) <= 60_000:
            out.append((k1, n1, k0, n0))
    return out


@pytest.mark.parametrize("table", _borderline_tables(16, seed=3))
def test_equals_scipy_with_the_groups_as_columns(table):
    k1, n1, k0, n0 = table
    want = boschloo_exact([[k1, k0], [n1 - k1, n0 - k0]], alternative="greater", n=64).pvalue
    got = boschloo_greater(k1, n1, k0, n0)
    assert got == pytest.approx(want, rel=1e-7)
    assert got <= _fisher_greater(k1, n1, k0, n0, 1.0)[0] * (1 + 1e-9)


def test_tables_with_nothing_to_test_give_one():
    assert boschloo_greater(0, 10, 3, 20) == 1.0  # no success in the first group
    assert boschloo_greater(3, 0, 3, 20) == 1.0
    assert boschloo_greater(3, 10, 3, 0) == 1.0
    # the first group all successes, the second none: as extreme as a table gets
    assert boschloo_greater(6, 6, 0, 6) < _fisher_greater(6, 6, 0, 6, 1.0)[0]


@pytest.mark.parametrize("n1,n0", [(9, 30), (5, 40), (20, 20), (40, 8), (3, 60), (12, 60)])
def test_the_refined_contrast_keeps_its_size_at_every_common_rate(n1, n0):
    """Every outcome (k1, k0) of two binomials with a common rate, weighted by its
    probability: the rate of p <= alpha never exceeds alpha, on a fine grid of rates.

    With the groups read as rows (successes' and failures' totals fixed, the design scipy
    was given before) groups of 9 and 30 reached 0.0205 at alpha 0.02.
    """
    alpha = 0.02
    p, fisher = np.ones((n1 + 1, n0 + 1)), np.ones((n1 + 1, n0 + 1))
    for k1 in range(n1 + 1):
        for k0 in range(n0 + 1):
            value, ok = _rate_greater(k1, n1, k0, n0, alpha)
            p[k1, k0] = value if ok else 1.0
            fisher[k1, k0] = _fisher_greater(k1, n1, k0, n0, alpha)[0] if ok else 1.0
    assert (p <= fisher + 1e-12).all()
    worst = 0.0
    for rate in np.linspace(0.005, 0.995, 199):
        weight = np.outer(binom.pmf(np.arange(n1 + 1), n1, rate),
                          binom.pmf(np.arange(n0 + 1), n0, rate))
        worst = max(worst, float(weight[p <= alpha].sum()))
    assert worst <= alpha * (1 + 1e-9)
    if n1 > 5 and n0 > 5:  # it rejects where Fisher's test does not (its point)
        assert ((p <= alpha) & (fisher > alpha)).any()
