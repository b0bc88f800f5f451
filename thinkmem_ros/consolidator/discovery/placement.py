"""The placement check: a pattern must be tighter than where its codes usually sit.

Why: the family-wide test and the other checks take an episode's slots as exchangeable.
Where codes keep to a phase of the episode (start-up, docking, a shift change), codes of
different phases then look ordered and close in every episode that holds them, and
chance triples of such codes reached significance (1.3-1.6 per run in the ``phased``
world). This check's null keeps each code's place. A code's *placement* in an episode is
where its copies sit, as fractions of the episode's span (first to last event), or
nothing where the episode lacks the code. Under the null, each element's placement is
drawn independently of the other codes, from that code's placements over all episodes.
A rule binds its codes to each other, in time and in which episodes they share; a phase
is kept by every draw, so it earns nothing.

The statistic is the number of scales the tightest occurrence fits, summed over the
episodes that hold the other codes (what the rival-order test sums), one element at a
time, the others staying where they are. Given those, each episode's level is a function
of the element's drawn placement alone, so its law is the histogram of the levels every
episode's placement would give there (episodes without the code give 0), and the sum's
law is their convolution: an exact tail, no Monte Carlo floor, no random draws.

That null draws presence too, and presence is what the family's weights selected on:
they favour code sets that share more episodes than independent codes would, so among
codes that each keep a phase of their own, the chance sets that shared the most episodes
reached this check and passed it on that excess (0.75 false triples per run on streams
written apart from the project, 0.42 on the same streams without rules). Each element
must therefore also be bound in one of two ways the selection cannot supply alone: in
time given that it is there (the same statistic, its placement drawn only from the
episodes that hold it, over the episodes that hold every code), or in presence itself
(Fisher's exact test: the element turns up in the episodes that hold the others more
often than elsewhere), twice the smaller p-value. A rule whose codes sit anywhere has
the first; the rounds' missions, whose codes keep fixed phases and whose C comes only
with A...B, have the second. The element's p-value is the larger of the drawn test and
that one; the check's is the largest over the elements.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from thinkmem_ros.consolidator.discovery.boschloo import fisher_greater_p
from thinkmem_ros.consolidator.discovery.episodes import _Episodes
from thinkmem_ros.consolidator.discovery.occurrences import _episodes_with


@dataclass(frozen=True)
class _Placements:
    """One code's placement in every episode (a ragged array by episode row; most empty)."""

    frac: np.ndarray  # every copy's time as a fraction of its episode's span
    offset: np.ndarray  # (E+1,) the copies in episode e are frac[offset[e]:offset[e+1]]
    rows: np.ndarray  # episode rows holding the code, ascending


def _spans(ctx: _Episodes) -> tuple[np.ndarray, np.ndarray]:
    """Each episode's first event time and span (0 for an episode of one instant)."""
    t, start = ctx.log.time, ctx.start
    first = t[np.minimum(start[:-1], max(t.size - 1, 0))] if t.size else np.zeros(ctx.n_ep)
    last = t[np.maximum(start[1:] - 1, 0)] if t.size else np.zeros(ctx.n_ep)
    return first.astype(np.float64), np.maximum(last - first, 0.0).astype(np.float64)


def _placements(ctx: _Episodes, code: int, first: np.ndarray, span: np.ndarray
                ) -> _Placements:
    """Where ``code`` sits in each episode (nowhere in most)."""
    log_rows = ctx._code_rows[ctx._code_row_start[code]:ctx._code_row_start[code + 1]]
    ep = ctx.log.episode[log_rows]
    frac = np.where(span[ep] > 0, (ctx.log.time[log_rows] - first[ep])
                    / np.where(span[ep] > 0, span[ep], 1.0), 0.0)
    offset = np.searchsorted(ep, np.arange(ctx.n_ep + 1)).astype(np.int64)
    rows = ctx.code_episodes[ctx.code_start[code]:ctx.code_start[code + 1]]
    return _Placements(frac.astype(np.float64), offset, rows.astype(np.int64))


def placement_p(ctx: _Episodes, codes: tuple[int, ...], kernel=None) -> float:
    """Exact p-value of the pattern's summed levels under the placement null.

    Each element in turn is given a placement drawn from its code's (possibly none)
    while the others stay where they are; the largest of these p-values is the check's:
    every element must be bound to the rest beyond its usual place and frequency.
    ``kernel``: ``check_kernels`` (compiled) or None for the Python loop (the same
    levels). 1.0 where no episode holds the other codes.
    """
    first, span = _spans(ctx)
    places = [_placements(ctx, x, first, span) for x in codes]
    worst = 0.0
    for moved in range(len(codes)):
        target = _episodes_with(ctx, tuple(x for i, x in enumerate(codes) if i != moved))
        if target.size == 0:
            return 1.0
        target = target.astype(np.int64)
        rows = places[moved].rows
        # a frequent code's placements are read at evenly spread episodes, at most MAX_POOL
        pool = rows[np.unique(np.linspace(0, rows.size - 1, MAX_POOL).astype(np.int64))] \
            if rows.size > MAX_POOL else rows
        holding = np.intersect1d(target, rows, assume_unique=True)
        levels = _levels(ctx, places, target, pool, moved, (first, span), kernel)
        own = sum(int(_levels(ctx, places, np.array([e]), np.array([e]), moved,
                              (first, span), kernel)[0, 0]) for e in holding.tolist())
        top = ctx.scales.size
        drawn = _tail(_laws(levels, top, 1.0 - rows.size / ctx.n_ep), own)
        held = _tail(_laws(levels[np.searchsorted(target, holding)], top), own)
        present = float(fisher_greater_p(holding.size, rows.size - holding.size,
                                         target.size, ctx.n_ep - target.size))
        worst = max(worst, drawn, min(1.0, 2.0 * min(held, present)))
    return worst


MAX_POOL = 1000
"""Placements of one code read per target episode, at most (evenly spread over the
episodes holding it): bounds the work for a code in thousands of episodes."""
EXACT_UP_TO = 400
"""Target episodes up to which the sum's law is convolved exactly; a Chernoff bound on
the same sum beyond (valid, a little conservative)."""


def _laws(levels: np.ndarray, top: int, absent: float = 0.0) -> np.ndarray:
    """(T, top+1): each target episode's law of levels over the code's placements.

    ``levels[k, j]``: target k's level with pool placement j (the pool spreads evenly over
    the episodes holding the code); ``absent``: the share of episodes without the code,
    drawn as level 0 (0 where presence is held fixed).
    """
    laws = np.zeros((levels.shape[0], top + 1))
    for k in range(levels.shape[0]):
        laws[k] = np.bincount(levels[k], minlength=top + 1) / max(levels.shape[1], 1)
    laws *= 1.0 - absent
    laws[:, 0] += absent
    return laws


def _tail(laws: np.ndarray, observed: int) -> float:
    """P(sum of independent levels >= ``observed``), each row of ``laws`` one episode's."""
    if observed <= 0:
        return 1.0
    if laws.shape[0] > EXACT_UP_TO:
        return _chernoff(laws, observed)
    law = np.ones(1)
    for row in laws:
        law = np.convolve(law, row)
    return float(min(1.0, law[observed:].sum()))


def _chernoff(laws: np.ndarray, observed: int) -> float:
    """The Chernoff bound, min over theta of exp(-theta s) prod_k E[exp(theta X_k)]."""
    values = np.arange(laws.shape[1], dtype=np.float64)
    best = 0.0  # log of the bound at theta = 0: 1
    for theta in np.linspace(0.02, 4.0, 200):
        log_mgf = np.log(laws @ np.exp(theta * values)).sum()
        best = min(best, log_mgf - theta * observed)
    return float(math.exp(best))


def _levels(ctx: _Episodes, places, target, pool, moved, where, kernel) -> np.ndarray:
    """``levels[k, j]``: target k's level with pool episode j's placement of ``moved``.

    Compiled where ``kernel`` is given, else in Python (the same levels).
    """
    if kernel is None:
        return _levels_python(ctx, places, target, pool, moved, where)
    return _levels_compiled(ctx, places, target, pool, moved, where, kernel)


def _levels_python(ctx: _Episodes, places, target, pool, moved, where) -> np.ndarray:
    """``_levels`` episode by episode in Python.

    ``where``: every episode's first event time and span (``_spans``).
    """
    first, span = where
    cfg = ctx.cfg
    out = np.zeros((target.size, pool.size), np.int64)
    for k, e in enumerate(target.tolist()):
        for j, source in enumerate(pool.tolist()):
            times = [_times(p, source if w == moved else e, float(first[e]), float(span[e]))
                     for w, p in enumerate(places)]
            m = _tightest_times(times, float(cfg.min_gap), float(cfg.max_gap))
            out[k, j] = int(np.count_nonzero(ctx.scales >= m))
    return out


def _times(place: _Placements, pick: int, first: float, span: float) -> list[float]:
    """A placement laid onto an episode starting at ``first`` and lasting ``span``."""
    return [first + f * span
            for f in place.frac[place.offset[pick]:place.offset[pick + 1]].tolist()]


def _tightest_times(times: list[list[float]], lo: float, hi: float) -> float:
    """The smallest largest step over the occurrences of the codes at ``times``.

    Steps go strictly forward in time, within [lo, hi]; the lookback in events is not
    applied (a placement moved to another episode has no slot there).
    """
    def step(x: float, y: float) -> float:
        d = y - x
        return d if d > 0 and lo <= d <= hi else math.inf

    if len(times) == 2:
        return min((step(x, y) for x in times[0] for y in times[1]), default=math.inf)
    best = math.inf
    for y in times[1]:
        into = min((step(x, y) for x in times[0]), default=math.inf)
        out = min((step(y, z) for z in times[2]), default=math.inf)
        best = min(best, max(into, out))
    return best


def _levels_compiled(ctx: _Episodes, places, target, pool, moved, where, kernel
                     ) -> np.ndarray:
    cfg = ctx.cfg
    p0, p1 = places[0], places[1]
    p2 = places[2] if len(places) == 3 else p1
    return kernel.placement_levels(
        where[0], where[1], len(places), p0.frac, p0.offset, p1.frac, p1.offset,
        p2.frac, p2.offset, target.astype(np.int64), pool, moved, ctx.scales,
        float(cfg.min_gap), float(cfg.max_gap))
