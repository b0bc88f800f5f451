"""Boschloo's exact unconditional test, one-sided, for two independent binomial groups.

Why our own and not ``scipy.stats.boschloo_exact``: the contrasts' tables have two groups
of fixed size (units with and without an element) and a random outcome, and scipy reads
the table's *columns* as the groups; the table this package used to pass it had the
groups in rows, so scipy tested a design with the successes' and failures' totals fixed,
whose size under the real design is not guaranteed (measured: 0.0205 at alpha 0.02 for
groups of 9 and 30). And scipy works out Fisher's p-value of every outcome, (n1 + 1)(n0 + 1)
of them, 25-600 ms on the contrast tables of a few missions' history. The rejection region
of Fisher's statistic is a staircase (an outcome is more extreme with one more success in
the first group, less with one more in the second), so here it is found per outcome of the
smaller group by bisection, and its probability under a common rate pi is a sum over that
group alone: O(min(n1, n0)) binomial terms per pi instead of the whole table.
"""

from __future__ import annotations

import numpy as np

TIE = 1e-13
"""Outcomes whose Fisher p-value is within this relative distance of the observed one
count as at least as extreme (ties are common in a discrete test; scipy uses the same)."""

GRID = np.unique(np.concatenate((np.geomspace(1e-6, 0.01, 40), np.linspace(0.0, 1.0, 401)[1:-1],
                                 1.0 - np.geomspace(1e-6, 0.01, 40))))
"""Common rates the region's probability is evaluated at before refining the best ones:
evenly spaced, denser towards 0 and 1 where rare outcomes put their peak."""

REFINED = 3
"""How many of the best grid rates are refined by a bounded scalar search."""


def fisher_greater_p(x1, x0, n1: int, n0: int):
    """One-sided Fisher p-value of outcomes (x1 of n1, x0 of n0): P(H >= x1), elementwise.

    H is hypergeometric: x1 + x0 successes drawn into the groups of n1 and n0.
    """
    from scipy.stats import hypergeom

    return hypergeom.sf(x1 - 1, n1 + n0, x1 + x0, n1)


def _region_edges(k1: int, n1: int, k0: int, n0: int) -> tuple[bool, np.ndarray]:
    """The rejection region as one edge per outcome of the smaller group.

    Returned ``(by_first, edge)``: when ``by_first``, outcome x1 rejects with every x0 up to
    ``edge[x1]`` (-1: none); otherwise outcome x0 rejects with every x1 from ``edge[x0]``
    (n1 + 1: none). Fisher's p-value falls with x1 and rises with x0, so each edge is found
    by bisection over the other group.
    """
    level = float(fisher_greater_p(np.array(k1), np.array(k0), n1, n0)) * (1.0 + TIE)
    by_first = n1 <= n0
    outer = np.arange((n1 if by_first else n0) + 1)
    inner_max = n0 if by_first else n1
    # invariant: ``good`` rejects (or is the virtual end), ``bad`` does not
    good = np.full(outer.size, -1 if by_first else inner_max + 1)
    bad = np.full(outer.size, inner_max + 1 if by_first else -1)
    while True:
        open_ = np.abs(bad - good) > 1
        if not open_.any():
            return by_first, good
        mid = (good + bad) // 2
        mid = np.where(open_, mid, 0)
        x1, x0 = (outer, mid) if by_first else (mid, outer)
        rejects = fisher_greater_p(x1, x0, n1, n0) <= level
        good = np.where(open_ & rejects, mid, good)
        bad = np.where(open_ & ~rejects, mid, bad)


def _log_pmf(n: int, r: np.ndarray) -> np.ndarray:
    """Binomial log-probabilities of x = 0..n (columns) at each rate (rows).

    scipy's special functions directly: the distribution objects' per-call checks cost more
    than the sums here.
    """
    from scipy.special import gammaln, xlog1py, xlogy

    x = np.arange(n + 1)[None, :]
    comb = gammaln(n + 1) - gammaln(x + 1) - gammaln(n - x + 1)
    return comb + xlogy(x, r) + xlog1py(n - x, -r)


def _size(rates: np.ndarray, by_first: bool, edge: np.ndarray, n1: int, n0: int
          ) -> np.ndarray:
    """Probability of the region at each common rate (rows of ``rates``)."""
    from scipy.special import bdtr, bdtrc

    r = np.asarray(rates, np.float64)[:, None]
    if by_first:  # sum over x1 of P(x1) P(x0 <= edge)
        inner = np.where(edge >= 0, bdtr(np.maximum(edge, 0)[None, :], n0, r), 0.0)
        return (np.exp(_log_pmf(n1, r)) * inner).sum(axis=1)
    # sum over x0 of P(x0) P(x1 >= edge)
    inner = np.where(edge <= 0, 1.0,
                     np.where(edge > n1, 0.0, bdtrc(np.clip(edge - 1, 0, n1)[None, :], n1, r)))
    return (np.exp(_log_pmf(n0, r)) * inner).sum(axis=1)


def boschloo_greater(k1: int, n1: int, k0: int, n0: int) -> float:
    """One-sided p-value that the rate k1/n1 exceeds k0/n0 (groups of fixed size).

    Fisher's one-sided p-value is the statistic; the p-value is the largest probability,
    over the unknown common rate, of an outcome at least as extreme. Never above Fisher's.
    """
    from scipy.optimize import minimize_scalar

    if n1 <= 0 or n0 <= 0 or k1 <= 0:
        return 1.0
    by_first, edge = _region_edges(k1, n1, k0, n0)
    values = _size(GRID, by_first, edge, n1, n0)
    best = float(values.max())
    for i in np.argsort(values)[::-1][:REFINED]:
        lo = GRID[i - 1] if i > 0 else 0.0
        hi = GRID[i + 1] if i + 1 < GRID.size else 1.0
        found = minimize_scalar(lambda r: -_size(np.array([r]), by_first, edge, n1, n0)[0],
                                bounds=(lo, hi), method="bounded",
                                options={"xatol": 1e-12 + 1e-9 * (hi - lo)})
        best = max(best, -float(found.fun))
    return float(min(1.0, max(best, 0.0)))
