"""The tested family: co-occurrence weights, the family budget, Tarone-pruned BH.

Why apart: these decide how much evidence a pattern needs (the FDR step of step 2), from
statistics the within-episode null holds fixed, so the weights keep the FDR guarantee.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import numpy as np

from thinkmem_ros.consolidator.discovery.episodes import _Episodes
from thinkmem_ros.consolidator.discovery.model import DiscoveryConfig

COOCCURRENCE_TILT = 2.0
"""Weight of a code set = exp(tilt * z), z its co-occurrence excess in standard units."""


def _cooccurrence_weights(ctx: _Episodes, set_keys: np.ndarray, frames: np.ndarray,
                          length: int) -> np.ndarray:
    """Weighted-BH weights (mean 1 over the family) from how often a code set co-occurs.

    They depend only on which codes each episode holds, which the within-episode null takes
    as given, so weighting by them keeps the FDR control (Genovese, Roeder & Wasserman
    2006) while steering power to code sets that co-occur more often than independent
    codes would: E[frames] = sum_e prod_x (1 - (1 - f_x)^n_e), z = (frames - E) / sqrt(E).
    """
    if set_keys.size == 0:
        return np.ones(0)
    weight = _cooccurrence_z(ctx, set_keys, frames, length)
    np.clip(weight, -3.0, 3.0, out=weight)  # in place: ~2 x 10^7 sets on a fleet log
    weight *= COOCCURRENCE_TILT
    np.exp(weight, out=weight)
    weight /= weight.mean()
    return weight


def _cooccurrence_z(ctx: _Episodes, set_keys: np.ndarray, frames: np.ndarray,
                    length: int) -> np.ndarray:
    """Co-occurrence excess of each code set in standard units (see the weights above)."""
    v = ctx.v
    lengths, per_length = np.unique(ctx.n, return_counts=True)
    z = np.empty(set_keys.size)
    step = 1 << 20  # a slice of sets at a time: a fleet log has ~10^7 of them
    for lo in range(0, set_keys.size, step):
        keys = set_keys[lo:lo + step]
        expected = np.zeros(keys.size)
        codes = [(keys // v ** (length - 1 - c)) % v for c in range(length)]
        for n_e, count in zip(lengths.tolist(), per_length.tolist()):
            prod = np.ones(keys.size)
            for x in codes:
                prod *= 1.0 - (1.0 - ctx.freq[x]) ** n_e
            expected += count * prod
        z[lo:lo + step] = (frames[lo:lo + step] - expected) / np.sqrt(
            np.maximum(expected, 1.0))
    return z


def _family_budget(cfg: DiscoveryConfig, n_events: int) -> int:
    """Frames the pair family may hold (0: no limit)."""
    if cfg.family_frames_per_event <= 0:
        return 0
    return max(cfg.min_family_frames, int(cfg.family_frames_per_event * n_events))


def _surprising_sets(ctx: _Episodes, set_keys: np.ndarray, set_counts: np.ndarray,
                     budget: int) -> np.ndarray | None:
    """Which code pairs stay in the family when their frames exceed ``budget``.

    Independent filtering (Bourgon, Gentleman & Huber 2010): the family may be chosen by
    any statistic the null holds fixed, and the within-episode null holds every episode's
    code multiset fixed, so which codes co-occur, and how surprisingly often, says nothing
    about the order and timing the tests read; the error control over the chosen family
    stays valid. Without a bound a fleet log tests every code pair it holds (~2 x 10^7 at
    10^7 events, 8 frames each, and every triple built on them): the cost grows faster
    than the log until the vocabulary saturates. Kept: the pairs whose co-occurrence
    excess ``z`` is largest (more frames, then the key, at ties), as many as fit; a pair's
    two orders read its co-occurring episodes each. Returns a mask over ``set_keys``, or
    None when every pair fits.
    """
    frames = 2 * set_counts.astype(np.int64)
    if budget <= 0 or int(frames.sum()) <= budget:
        return None
    z = _cooccurrence_z(ctx, set_keys, set_counts, 2)
    order = np.lexsort((set_keys, -frames, -z))
    del z
    fits = int(np.searchsorted(np.cumsum(frames[order]), budget, side="right"))
    keep = np.zeros(set_keys.size, bool)
    keep[order[:fits]] = True
    return keep


def tarone_bh(p: np.ndarray, minp: np.ndarray, family: int, q: float,
              other_minp: np.ndarray | None = None) -> tuple[float, int, int]:
    """Benjamini-Hochberg over Tarone's testable family.

    ``family`` hypotheses could be tested; ``p`` / ``minp`` are the p-values and smallest
    achievable p-values of those that were computed (the rest count as testable).
    ``other_minp``: smallest achievable p-values of hypotheses whose p-values cannot pass
    (a scan in parts drops them early); they count for Tarone only. It is sorted in
    place: on a fleet log it holds tens of millions of values, and a sorted copy, or one
    concatenated with ``minp``, was the peak of the whole run (10^7 events, 2.7 GB).
    K is the smallest k with m(q / k) <= k, m(d) = #{testable at level d}; BH then runs
    over the m(q / K) testable hypotheses. Returns (cutoff, K, testable); cutoff 0 when
    nothing passes.
    """
    if family <= 0:
        return 0.0, 0, 0
    sorted_minp = np.sort(minp)
    other = np.zeros(0) if other_minp is None else other_minp
    other.sort()

    def testable(level: float) -> int:
        untestable = (minp.size - np.searchsorted(sorted_minp, level, side="right")
                      + other.size - np.searchsorted(other, level, side="right"))
        return int(family - untestable)

    lo, hi = 1, max(family, 1)
    while lo < hi:  # m(q / k) is non-increasing in k: the smallest k with m(q/k) <= k
        mid = (lo + hi) // 2
        if testable(q / mid) <= mid:
            hi = mid
        else:
            lo = mid + 1
    k_star = lo
    level = q / k_star
    m = max(testable(level), 1)
    in_family = np.sort(p[minp <= level])
    ranks = np.arange(1, in_family.size + 1)
    passing = np.flatnonzero(in_family <= ranks * q / m)
    cutoff = float(ranks[passing[-1]] * q / m) if passing.size else 0.0
    return cutoff, k_star, m


def checked_cutoff(passing: np.ndarray, q: float, testable: int) -> float:
    """BH's cutoff over the same family when it counts only the patterns that pass every check.

    ``passing``: the weighted p-values of the patterns every per-pattern check accepted.
    Why: BH loosens its cutoff with every rejection it counts (R q / m). Riders of a real
    pair and sets of codes that keep to phases of the episode reject the within-episode
    null without being relations; the checks refuse them, but counting them loosened the
    cutoff for every chance set that got through the checks. A refused pattern's p-value
    taken as 1 is still a valid p-value (never below its test's), so BH over those values
    keeps its guarantee while counting only what it accepts.
    """
    m = max(int(testable), 1)
    wp = np.sort(passing)
    ranks = np.arange(1, wp.size + 1)
    ok = np.flatnonzero(wp <= ranks * q / m)
    return float(ranks[ok[-1]] * q / m) if ok.size else 0.0
