"""Where a pattern's codes sit in one episode: fits, tightest occurrence, levels, slots.

Why: the checks ask these about one episode's few copies of two or three codes ~10^5 times
a round; small cases loop in Python (``SMALL_SLOTS``), larger ones build gap matrices.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import math

import numpy as np

from thinkmem_ros.consolidator.discovery.episodes import _Episodes
from thinkmem_ros.consolidator.discovery.model import DiscoveryConfig


# ------------------------------------------------------------------ per-pattern checks
def _episode_slots(ctx: _Episodes, e: int, codes: tuple[int, ...]
                   ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    lo, hi = ctx.start[e], ctx.start[e + 1]
    t = ctx.log.time[lo:hi]
    c = ctx.log.code[lo:hi]
    return t, c, [np.flatnonzero(c == x) for x in codes]


def _fits(t: np.ndarray, first: np.ndarray, second: np.ndarray, g: float,
          cfg: DiscoveryConfig) -> np.ndarray:
    """(len(first), len(second)) matrix: second comes after first within [min_gap, g]."""
    d = t[second][None, :] - t[first][:, None]
    later = second[None, :] > first[:, None]
    span = np.abs(second[None, :] - first[:, None]) <= cfg.max_lookback
    return later & span & (d >= cfg.min_gap) & (d <= g)


SMALL_SLOTS = 12
"""Slots below which ``_tightest`` and ``_fits_any`` loop in Python (``_eligible``: an
episode of up to twice as many events). The per-pattern checks ask them about one
episode's few copies of two or three codes ~10^5 times a round, where building gap
matrices with numpy cost ~40 us a call, mostly call overhead; the loops give the same
result (the same float subtractions and comparisons)."""


def _fits_any(t: np.ndarray, first: np.ndarray, second: np.ndarray, g: float,
              cfg: DiscoveryConfig) -> bool:
    """``_fits(...).any()``: some copy of ``second`` follows some copy of ``first`` at g."""
    if first.size + second.size > SMALL_SLOTS:
        return bool(_fits(t, first, second, g, cfg).any())
    back, lo = cfg.max_lookback, cfg.min_gap
    for i in first.tolist():
        for j in second.tolist():
            if i < j and j - i <= back and lo <= float(t[j]) - float(t[i]) <= g:
                return True
    return False




def _step_gaps(t: np.ndarray, first: np.ndarray, second: np.ndarray,
               cfg: DiscoveryConfig) -> np.ndarray:
    """Gap matrix of valid steps first -> second (inf where the step is not allowed)."""
    d = t[second][None, :] - t[first][:, None]
    ok = (second[None, :] > first[:, None]) & (d >= cfg.min_gap) & (d <= cfg.max_gap) \
        & (second[None, :] - first[:, None] <= cfg.max_lookback)
    return np.where(ok, d, np.inf)


def _tightest(t: np.ndarray, pos: list[np.ndarray], cfg: DiscoveryConfig) -> float:
    """Smallest largest-step gap over the pattern's occurrences (inf when it is absent)."""
    if any(p.size == 0 for p in pos):
        return math.inf
    if sum(p.size for p in pos) <= SMALL_SLOTS:
        return _tightest_small(t, [p.tolist() for p in pos], cfg)
    ab = _step_gaps(t, pos[0], pos[1], cfg)
    if len(pos) == 2:
        return float(ab.min())
    bc = _step_gaps(t, pos[1], pos[2], cfg)
    return float(np.maximum(ab.min(axis=0), bc.min(axis=1)).min())


def _tightest_small(t: np.ndarray, pos: list[list[int]], cfg: DiscoveryConfig) -> float:
    """``_tightest`` for a few slots, step by step as ``_step_gaps`` allows them."""
    at = {i: float(t[i]) for p in pos for i in p}
    lo, hi, back = cfg.min_gap, cfg.max_gap, cfg.max_lookback

    def step(i: int, j: int) -> float:
        if j <= i or j - i > back:
            return math.inf
        d = at[j] - at[i]
        return d if lo <= d <= hi else math.inf

    if len(pos) == 2:
        return min(step(i, j) for i in pos[0] for j in pos[1])
    best = math.inf
    for j in pos[1]:
        into = min(step(i, j) for i in pos[0])
        if into >= best:
            continue
        best = min(best, max(into, min(step(j, k) for k in pos[2])))
    return best




def _eligible(t: np.ndarray, pos: list[np.ndarray], which: int, n: int, g: float,
              cfg: DiscoveryConfig) -> int:
    """Slots (not holding the other codes) where the element ``which`` completes it."""
    if n <= 2 * SMALL_SLOTS:
        return _eligible_small(t, [p.tolist() for p in pos], which, n, g, cfg)
    taken = np.zeros(n, bool)
    for i, p in enumerate(pos):
        if i != which:
            taken[p] = True
    free = np.flatnonzero(~taken)
    if free.size == 0:
        return 0
    if len(pos) == 2:
        if which == 1:
            ok = _fits(t, pos[0], free, g, cfg).any(axis=0)
        else:
            ok = _fits(t, free, pos[1], g, cfg).any(axis=1)
        return int(ok.sum())
    a, b, c = pos
    if which == 2:  # C after a valid A..B
        mids = b[_fits(t, a, b, g, cfg).any(axis=0)]
        ok = _fits(t, mids, free, g, cfg).any(axis=0) if mids.size else np.zeros(free.size)
    elif which == 0:  # A before a valid B..C
        mids = b[_fits(t, b, c, g, cfg).any(axis=1)]
        ok = _fits(t, free, mids, g, cfg).any(axis=1) if mids.size else np.zeros(free.size)
    else:  # B between A and C
        ok = _fits(t, a, free, g, cfg).any(axis=0) & _fits(t, free, c, g, cfg).any(axis=1)
    return int(np.count_nonzero(ok))


def _eligible_small(t: np.ndarray, pos: list[list[int]], which: int, n: int, g: float,
                    cfg: DiscoveryConfig) -> int:
    """``_eligible`` for a short episode, slot by slot as ``_fits`` allows the steps."""
    at = t.tolist()
    lo, back = cfg.min_gap, cfg.max_lookback

    def fits(i: int, j: int) -> bool:
        return i < j and j - i <= back and lo <= at[j] - at[i] <= g

    taken = {s for i, p in enumerate(pos) if i != which for s in p}
    free = [s for s in range(n) if s not in taken]
    if len(pos) == 2:
        if which == 1:
            return sum(any(fits(i, f) for i in pos[0]) for f in free)
        return sum(any(fits(f, j) for j in pos[1]) for f in free)
    a, b, c = pos
    if which == 2:  # C after a valid A..B
        mids = [j for j in b if any(fits(i, j) for i in a)]
        return sum(any(fits(m, f) for m in mids) for f in free)
    if which == 0:  # A before a valid B..C
        mids = [j for j in b if any(fits(j, k) for k in c)]
        return sum(any(fits(f, m) for m in mids) for f in free)
    return sum(any(fits(i, f) for i in a) and any(fits(f, k) for k in c) for f in free)


def _fit_levels(t: np.ndarray, pos: list[np.ndarray], scales: np.ndarray,
                cfg: DiscoveryConfig) -> int:
    """How many of ``scales`` the pattern fits at in one episode (0 when absent)."""
    return int(np.count_nonzero(scales >= _tightest(t, pos, cfg)))




def _episodes_with(ctx: _Episodes, codes: tuple[int, ...]) -> np.ndarray:
    """Episode rows holding every code in ``codes``."""
    out = None
    for x in codes:
        eps = ctx.code_episodes[ctx.code_start[x]:ctx.code_start[x + 1]]
        out = eps if out is None else np.intersect1d(out, eps, assume_unique=True)
    return out if out is not None else np.zeros(0, np.int64)
