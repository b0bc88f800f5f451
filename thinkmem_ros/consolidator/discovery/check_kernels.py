"""The per-pattern checks' loops compiled (numba): the same numbers as their Python.

Why: the per-pattern checks ask ~10^5 small questions a round (does some A precede some B
within g, how many slots would complete the pattern, under how many label permutations
does the forward order hold), each about a handful of copies of two or three codes in one
episode. In Python that was ~0.3 ms per episode and pattern, most of a round's discovery
on the rounds' histories. The loops below make the same float subtractions and
comparisons as ``occurrences`` and ``contrasts.terms`` (``test_check_terms`` holds every
term equal on worlds of every shape), so a relation's figures do not change. The checks'
own tails (the Poisson-binomial one of the order and element tests, the sign-flip law of
the rival order) are here too, with the same products and sums in the same order.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

ROOM_STRATA = 4  # as ``contrasts.ROOM_STRATA`` (checked by a test)


@njit(cache=True)
def fits(t, i, j, g, lo, back):
    if j <= i or j - i > back:
        return False
    d = t[j] - t[i]
    return lo <= d <= g


@njit(cache=True)
def fits_any(t, first, second, g, lo, back):
    for i in first:
        for j in second:
            if fits(t, i, j, g, lo, back):
                return True
    return False


@njit(cache=True)
def step(t, i, j, lo, hi, back):
    if j <= i or j - i > back:
        return math.inf
    d = t[j] - t[i]
    return d if lo <= d <= hi else math.inf


@njit(cache=True)
def tightest(t, p0, p1, p2, length, lo, hi, back):
    if p0.size == 0 or p1.size == 0 or (length == 3 and p2.size == 0):
        return math.inf
    best = math.inf
    if length == 2:
        for i in p0:
            for j in p1:
                best = min(best, step(t, i, j, lo, hi, back))
        return best
    for j in p1:
        into = math.inf
        for i in p0:
            into = min(into, step(t, i, j, lo, hi, back))
        out = math.inf
        for k in p2:
            out = min(out, step(t, j, k, lo, hi, back))
        best = min(best, max(into, out))
    return best


@njit(cache=True)
def fit_levels(t, p0, p1, p2, length, scales, lo, hi, back):
    m = tightest(t, p0, p1, p2, length, lo, hi, back)
    count = 0
    for s in scales:
        if s >= m:
            count += 1
    return count












@njit(cache=True)
def through_b(t, f, b, other, f_after, g, lo, back):
    """Whether slot f completes a step with some B whose other step fits too.

    ``f_after``: f follows that B, whose step from ``other`` fits (C after a valid A..B);
    else f precedes it, and its step to ``other`` fits (A before a valid B..C).
    """
    for j in b:
        if fits(t, j, f, g, lo, back) if f_after else fits(t, f, j, g, lo, back):
            for x in other:
                if fits(t, x, j, g, lo, back) if f_after else fits(t, j, x, g, lo, back):
                    return True
    return False


@njit(cache=True)
def eligible(t, p0, p1, p2, length, which, g, lo, back):
    """``occurrences._eligible``: slots not holding the other codes that complete it."""
    n = t.size
    taken = np.zeros(n, np.bool_)
    if which != 0:
        taken[p0] = True
    if which != 1:
        taken[p1] = True
    if length == 3 and which != 2:
        taken[p2] = True
    count = 0
    for f in range(n):
        if taken[f]:
            continue
        ok = False
        if length == 2:
            if which == 1:
                for i in p0:
                    if fits(t, i, f, g, lo, back):
                        ok = True
                        break
            else:
                for j in p1:
                    if fits(t, f, j, g, lo, back):
                        ok = True
                        break
        elif which == 2:  # C after a valid A..B
            ok = through_b(t, f, p1, p0, True, g, lo, back)
        elif which == 0:  # A before a valid B..C
            ok = through_b(t, f, p1, p2, False, g, lo, back)
        else:  # B between A and C
            before = False
            for i in p0:
                if fits(t, i, f, g, lo, back):
                    before = True
                    break
            if before:
                for k in p2:
                    if fits(t, f, k, g, lo, back):
                        ok = True
                        break
        count += ok
    return count


@njit(cache=True)
def contrast(t, a, b, c, g, lo, back):
    """``_Contrast.terms``: per room stratum, As exposed to B, completing, C without B."""
    out = np.zeros((3, ROOM_STRATA + 1), np.int64)
    finite = math.isfinite(g) and g > 0
    b_to_c = np.zeros(b.size, np.bool_)
    for jj in range(b.size):
        for k in c:
            if fits(t, b[jj], k, g, lo, back):
                b_to_c[jj] = True
                break
    for i in a:
        stratum = min(int((t[t.size - 1] - t[i]) * ROOM_STRATA / g), ROOM_STRATA) \
            if finite else ROOM_STRATA
        exposed = completes = False
        for jj in range(b.size):
            if fits(t, i, b[jj], g, lo, back):
                exposed = True
                if b_to_c[jj]:
                    completes = True
        a_to_c = False
        for k in c:
            if fits(t, i, k, g, lo, back):
                a_to_c = True
                break
        out[0, stratum] += exposed
        out[1, stratum] += completes
        out[2, stratum] += (not exposed) and a_to_c
    return out


@njit(cache=True)
def tightest_step(t, x, y, g, lo, back):
    best = math.nan
    for i in x:
        for j in y:
            if fits(t, i, j, g, lo, back):
                d = t[j] - t[i]
                if not d >= best:  # NaN at first
                    best = d
    return best


@njit(cache=True)
def positions(c, code):
    count = 0
    for x in c:
        count += x == code
    out = np.empty(count, np.int64)
    k = 0
    for i in range(c.size):
        if c[i] == code:
            out[k] = i
            k += 1
    return out




@njit(cache=True)
def terms(t, c, codes, g, lo, hi, back, scales, others):
    length = codes.size
    p0 = positions(c, codes[0])
    p1 = positions(c, codes[1])
    p2 = positions(c, codes[2]) if length == 3 else np.zeros(0, np.int64)
    pos = (p0, p1, p2)
    antecedent = reverse = 0
    strata = np.zeros((3, ROOM_STRATA + 1), np.int64)
    has_contrast = False
    if length == 3:
        antecedent = int(fits_any(t, p0, p1, g, lo, back))
        reverse = int(fits_any(t, p1, p0, g, lo, back))
        if p0.size:
            has_contrast = True
            strata = contrast(t, p0, p1, p2, g, lo, back)
    elif p0.size:
        antecedent = 1
        reverse = int(p1.size > 0 and fits_any(t, p1, p0, g, lo, back))
    present = p0.size > 0 and p1.size > 0 and (length == 2 or p2.size > 0)
    fwd = 0
    diffs = np.zeros(others.shape[0], np.int64)
    gaps = np.full(length - 1, math.nan)
    if present:
        fwd = fit_levels(t, p0, p1, p2, length, scales, lo, hi, back)
        for o in range(others.shape[0]):
            q = others[o]
            third = pos[q[2]] if length == 3 else p2
            diffs[o] = fwd - fit_levels(t, pos[q[0]], pos[q[1]], third, length,
                                        scales, lo, hi, back)
        gaps[0] = tightest_step(t, p0, p1, g, lo, back)
        if length == 3:
            gaps[1] = tightest_step(t, p1, p2, g, lo, back)
    elig = np.zeros(length, np.int64)
    for w in range(length):
        others_there = True
        for i in range(length):
            if i != w and pos[i].size == 0:
                others_there = False
        if others_there:
            elig[w] = eligible(t, p0, p1, p2, length, w, g, lo, back)
    return (antecedent, reverse, has_contrast, strata, present, fwd, diffs, elig, gaps)


@njit(cache=True)
def rows_terms(time, code, start, rows, codes, g, lo, hi, back, scales, others):
    """``terms`` of every episode in ``rows``, one row each (contrasts summed)."""
    n, length, n_other = rows.size, codes.size, others.shape[0]
    ant = np.zeros(n, np.int64)
    rev = np.zeros(n, np.int64)
    strata = np.zeros((3, ROOM_STRATA + 1), np.int64)
    present = np.zeros(n, np.bool_)
    level = np.zeros(n, np.int64)
    diffs = np.zeros((n, n_other), np.int64)
    elig = np.zeros((n, length), np.int64)
    gaps = np.full((n, length - 1), math.nan)
    for r in range(n):
        e = rows[r]
        got = terms(time[start[e]:start[e + 1]], code[start[e]:start[e + 1]], codes, g,
                    lo, hi, back, scales, others)
        ant[r], rev[r] = got[0], got[1]
        if got[2]:
            strata += got[3]
        present[r], level[r] = got[4], got[5]
        diffs[r], elig[r], gaps[r] = got[6], got[7], got[8]
    return ant, rev, strata, present, level, diffs, elig, gaps


def gathered_terms(log, start: np.ndarray, rows: np.ndarray, codes: tuple[int, ...],
                   g: float, cfg, scales: np.ndarray, others: np.ndarray):
    """``episode_terms`` of every episode in ``rows`` in one call, as arrays (one row each).

    (antecedent, reverse, contrast strata summed (3, 5), present, forward's fitted scales,
    diffs, eligible, gaps).
    """
    return rows_terms(log.time, log.code, start, np.asarray(rows, np.int64),
                      np.asarray(codes, np.int64), float(g), float(cfg.min_gap),
                      float(cfg.max_gap), int(cfg.max_lookback), scales, others)


@njit(cache=True)
def pb_tail_one(probs, s):
    """``tails.pb_tail`` of one problem: the same products and sums, in the same order."""
    if s <= 0:
        return 1.0
    dist = np.zeros(s)
    dist[0] = 1.0
    tail = 0.0
    for p in probs:
        tail += dist[s - 1] * p
        q = 1 - p
        for j in range(s - 1, 0, -1):  # high to low: dist[j - 1] is still the old one
            dist[j] = dist[j] * q + dist[j - 1] * p
        dist[0] = dist[0] * q
    return min(tail, 1.0)


@njit(cache=True)
def sign_flip_law(mags, total):
    """The law of sum(+-m) with fair signs, as ``tails._sign_flip_tail`` builds it."""
    size = 2 * total + 1
    dist = np.zeros(size)
    dist[total] = 1.0
    new = np.empty(size)
    for m in mags:
        for i in range(size):
            new[i] = 0.5 * (dist[(i - m) % size] + dist[(i + m) % size])
        dist, new = new, dist
    return dist


@njit(cache=True)
def _laid(frac, offset, pick, first, span):
    """``placement._times``: a placement laid onto an episode's span."""
    lo, hi = offset[pick], offset[pick + 1]
    out = np.empty(hi - lo)
    for i in range(hi - lo):
        out[i] = first + frac[lo + i] * span
    return out


@njit(cache=True)
def _forward(x, y, lo, hi):
    d = y - x
    return d if d > 0 and lo <= d <= hi else math.inf


@njit(cache=True)
def tightest_times(ta, tb, tc, length, lo, hi):
    """``placement._tightest_times`` (``tc`` unused for a pair)."""
    best = math.inf
    if length == 2:
        for x in ta:
            for y in tb:
                best = min(best, _forward(x, y, lo, hi))
        return best
    for y in tb:
        into = math.inf
        for x in ta:
            into = min(into, _forward(x, y, lo, hi))
        out = math.inf
        for z in tc:
            out = min(out, _forward(y, z, lo, hi))
        best = min(best, max(into, out))
    return best


@njit(cache=True)
def placement_levels(first, span, length, f0, o0, f1, o1, f2, o2, target, pool, moved,
                     scales, lo, hi):
    """``placement._levels_python``: target episodes' levels by pool placement.

    ``out[k, j]``: target episode k's level with pool episode j's placement of ``moved``.
    """
    out = np.zeros((target.size, pool.size), np.int64)
    for k in range(target.size):
        e = target[k]
        at, sp = first[e], span[e]
        for j in range(pool.size):
            src = pool[j]
            ta = _laid(f0, o0, src if moved == 0 else e, at, sp)
            tb = _laid(f1, o1, src if moved == 1 else e, at, sp)
            tc = _laid(f2, o2, src if moved == 2 else e, at, sp) if length == 3 else tb
            m = tightest_times(ta, tb, tc, length, lo, hi)
            count = 0
            for s in scales:
                if s >= m:
                    count += 1
            out[k, j] = count
    return out
