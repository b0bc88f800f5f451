"""The per-pattern checks of a significant candidate (step 3).

Why: family-wide significance says only that the codes sit closer than chance; each check
here is an exact conditional test of one way a pattern can be significant without being a
rule (wrong order, a frequent element, a rider of a real pair).
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from thinkmem_ros.consolidator.discovery.contrasts import _Contrast, _contrast_p, _pair_binding
from thinkmem_ros.consolidator.discovery.episodes import _Episodes
from thinkmem_ros.consolidator.discovery.model import DiscoveryConfig
from thinkmem_ros.consolidator.discovery.occurrences import (
    _eligible,
    _episode_slots,
    _episodes_with,
    _fit_levels,
    _fits,
    _fits_any,
)
from thinkmem_ros.consolidator.discovery.order_test import order_p, orders
from thinkmem_ros.consolidator.discovery.tails import _sign_flip_tail, pb_tail


@dataclass
class _Check:
    p_order: float
    p_adds: tuple[float, ...]
    lift: float
    antecedent: int
    reverse: int
    episodes: np.ndarray  # supporting episode rows at g*
    gaps: tuple[tuple[float, float], ...]
    rival: tuple[int, ...] = ()  # the other order of the same codes closest to forward
    dominated: bool = False  # the rival fits at least as well as forward, summed
    p_rival: float = 1.0  # sign-flip test of forward against the rival
    p_contrast: tuple[float, ...] = ()  # each element against the pattern without it
    # the first element's binding to B could not be judged: its contrast is all it has
    first_unbound: bool = False
    # neither its contrast nor its binding could be judged: the pattern waits (p 1)
    first_unjudged: bool = False
    # the codes' places and frequencies explain the pattern (``placement``, exact tail);
    # None: not run (``examine`` runs it only where Holm passed the other checks)
    p_placement: float | None = None


USE_KERNEL = True
"""Whether the checks gather their terms in the compiled kernel (off: the Python reference,
for comparisons)."""


_KERNEL_ERROR: list[str] = []  # why the compiled kernels could not be loaded, once


def _kernel():
    """The compiled terms (``check_kernels``); None where they cannot be loaded.

    Imported on first use: numba costs ~1 s to import, and the robot side imports
    discovery's types without running a check. Where numba is missing or cannot set up
    its cache (a read-only install with no writable cache dir), the checks run the Python
    reference instead, ~30 times slower, with a warning: the same relations either way.
    """
    if _KERNEL_ERROR:
        return None
    try:
        from thinkmem_ros.consolidator.discovery import check_kernels
    except Exception as exc:  # noqa: BLE001 - any failure to load: the Python terms run
        _KERNEL_ERROR.append(f"{type(exc).__name__}: {exc}")
        logging.getLogger(__name__).warning(
            "discovery's compiled checks unavailable (%s); running them in Python",
            _KERNEL_ERROR[0])
        return None
    return check_kernels


@dataclass(frozen=True)
class _Terms:
    """What the checks read of one episode for one pattern at one scale.

    A function of the episode's own events, the pattern, g and the configuration only
    (``check_kernels`` works out the same numbers for many episodes in one call).
    """

    antecedent: int  # A...B fits at g (a pair: A is there)
    reverse: int  # B...A fits at g
    contrast: tuple | None  # ``_Contrast.terms`` (triples)
    level: int | None  # forward's fitted scales, where every code is there
    diffs: tuple[int, ...] | None  # forward's fitted scales less each other order's
    eligible: tuple[int, ...]  # per element, slots that would complete the pattern (0: none)
    gaps: tuple[float | None, ...]  # per step, the tightest fitting gap (all codes there)


def _episode_terms(ctx: _Episodes, e: int, codes: tuple[int, ...], g: float,
                   others: list[tuple[int, ...]]) -> _Terms:
    """One episode's terms in Python, from ``occurrences``.

    The reference ``check_kernels`` is held to, and what runs without numba.
    """
    cfg = ctx.cfg
    length = len(codes)
    t, _, pos = _episode_slots(ctx, e, codes)
    n = t.size
    antecedent = reverse = 0
    contrast = None
    if length == 3:
        antecedent = int(_fits_any(t, pos[0], pos[1], g, cfg))
        reverse = int(_fits_any(t, pos[1], pos[0], g, cfg))
        contrast = _Contrast.terms(t, pos, g, cfg)
    elif pos[0].size:
        antecedent = 1
        reverse = int(bool(pos[1].size and _fits_any(t, pos[1], pos[0], g, cfg)))
    present = all(p.size for p in pos)
    level = diffs = None
    gaps: tuple[float | None, ...] = (None,) * (length - 1)
    if present:
        # forward against each other order: how many scales each one fits
        fwd = level = _fit_levels(t, pos, ctx.scales, cfg)
        diffs = tuple(fwd - _fit_levels(t, [pos[i] for i in perm], ctx.scales, cfg)
                      for perm in others)
        gaps = tuple(_tightest_step(t, x, y, g, cfg) for x, y in zip(pos[:-1], pos[1:]))
    eligible = tuple(
        0 if any(pos[i].size == 0 for i in range(length) if i != w)
        else _eligible(t, pos, w, n, g, cfg) for w in range(length))
    return _Terms(antecedent, reverse, contrast, level, diffs, eligible, gaps)


def _tightest_step(t: np.ndarray, x: np.ndarray, y: np.ndarray, g: float,
                   cfg: DiscoveryConfig) -> float | None:
    """The smallest gap of a step x -> y that fits at g (None when none does)."""
    xs, ys = np.nonzero(_fits(t, x, y, g, cfg))
    return float((t[y[ys]] - t[x[xs]]).min()) if xs.size else None


@dataclass
class _Gathered:
    """The terms of every episode a check reads, combined (episodes in ascending order)."""

    antecedent: int
    reverse: int
    contrast: _Contrast
    present: list[int]  # episodes holding every code
    levels: list[int]  # forward's fitted scales there
    diffs: list[list[int]]  # per other order, over ``present``
    add_p: list[list[float]]  # per element
    add_obs: list[int]
    gap_lists: list[list[float]]  # per step, over the supporting episodes


def _gather_each(ctx: _Episodes, codes: tuple[int, ...], g: float, rows: np.ndarray,
                 held: np.ndarray, others: list[tuple[int, ...]]) -> _Gathered:
    """Episode by episode in Python (``USE_KERNEL`` off, or no numba)."""
    length = len(codes)
    out = _Gathered(0, 0, _Contrast(), [], [], [[] for _ in others],
                    [[] for _ in range(length)], [0] * length, [[] for _ in range(length - 1)])
    for e, is_held in zip(rows.tolist(), held.tolist()):
        terms = _episode_terms(ctx, e, codes, g, others)
        out.antecedent += terms.antecedent
        out.reverse += terms.reverse
        out.contrast.add_terms(terms.contrast)
        if terms.level is not None:
            out.present.append(e)
            out.levels.append(terms.level)
        if terms.diffs is not None:
            for o, d in enumerate(terms.diffs):
                out.diffs[o].append(d)
        for w, m in enumerate(terms.eligible):
            if m:
                out.add_p[w].append(1.0 - (1.0 - ctx.freq[codes[w]]) ** m)
                out.add_obs[w] += is_held
        if is_held:
            for s, gap in enumerate(terms.gaps):
                if gap is not None:
                    out.gap_lists[s].append(gap)
    return out


def check_kernel():
    """The compiled kernels where they load and are switched on (``USE_KERNEL``), else None."""
    return _kernel() if USE_KERNEL else None


def _gather_rows(ctx: _Episodes, codes: tuple[int, ...], g: float, rows: np.ndarray,
                 held: np.ndarray, others: list[tuple[int, ...]]) -> _Gathered | None:
    """All episodes in one compiled call (None without numba): the same sums and lists."""
    kernel = check_kernel()
    if kernel is None:
        return None
    got = kernel.gathered_terms(ctx.log, ctx.start, rows, codes, g, ctx.cfg, ctx.scales,
                                np.asarray(others, np.int64).reshape(len(others), len(codes)))
    ant, rev, strata, present, level, diffs, elig, gaps = got
    contrast = _Contrast()
    if len(codes) == 3:
        contrast.add_terms((strata[0], strata[1], strata[2]))
    adds = [elig[:, w][elig[:, w] > 0].tolist() for w in range(len(codes))]
    return _Gathered(
        int(ant.sum()), int(rev.sum()), contrast, rows[present].tolist(),
        level[present].tolist(),
        [diffs[present, o].tolist() for o in range(len(others))],
        # Python floats, as episode by episode (numpy's pow may differ in the last bit)
        [[1.0 - (1.0 - ctx.freq[codes[w]]) ** m for m in ms] for w, ms in enumerate(adds)],
        [int(np.count_nonzero(held & (elig[:, w] > 0))) for w in range(len(codes))],
        [gaps[held & ~np.isnan(gaps[:, s]), s].tolist() for s in range(len(codes) - 1)])


def _one_tail(probs: list[float], observed: int) -> float:
    """``pb_tail`` of one problem (1 without trials); compiled where numba is."""
    if not probs:
        return 1.0
    kernel = check_kernel()
    if kernel is None:
        return float(pb_tail([np.asarray(probs)], np.array([observed]))[0])
    return float(kernel.pb_tail_one(np.asarray(probs, np.float64), int(observed)))


def _flip_tail(d: np.ndarray) -> float:
    """``_sign_flip_tail``, its law built compiled where numba is (summed as there)."""
    kernel = check_kernel()
    return _sign_flip_tail(d, None if kernel is None else kernel.sign_flip_law)


def _check(ctx: _Episodes, codes: tuple[int, ...], g: float, support_rows: np.ndarray
           ) -> _Check:
    """Order and element-adds tests, antecedent and reverse counts at scale ``g``.

    The placement check is left unrun: ``examine`` runs it where Holm passed the rest.
    """
    length = len(codes)
    others = orders(length)
    # every episode holding all codes but (at most) one: the element tests of code w run
    # over the episodes where the other codes are in place, whether or not w is there
    rows = np.unique(np.concatenate([
        _episodes_with(ctx, tuple(x for i, x in enumerate(codes) if i != w))
        for w in range(length)]))
    held = np.isin(rows, support_rows)
    got = _gather_rows(ctx, codes, g, rows, held, others)
    if got is None:
        got = _gather_each(ctx, codes, g, rows, held, others)
    contrast, diffs = got.contrast, got.diffs
    add_p, add_obs, gap_lists = got.add_p, got.add_obs, got.gap_lists
    antecedent, reverse = got.antecedent, got.reverse
    p_order = order_p(ctx, codes, np.asarray(got.present, np.int64),
                      np.asarray(got.levels, np.int64),
                      np.asarray(diffs, np.int64).T.reshape(len(got.present), len(others)))
    # forward must also beat every other order outright (scales fitted, summed over the
    # episodes); the sign-flip p-value of the closest one is kept as evidence
    margins = [int(np.sum(d)) for d in diffs]
    closest = int(np.argmin(margins)) if margins else -1
    dominated = bool(margins) and margins[closest] <= 0
    p_pair = _flip_tail(np.asarray(diffs[closest], np.int64)) if margins else 1.0
    p_adds = tuple(_one_tail(ps, obs) for ps, obs in zip(add_p, add_obs))
    middle = 1 if length == 3 else length - 1
    lift = (add_obs[middle] / sum(add_p[middle])) if add_p[middle] else math.nan
    gaps = tuple((min(gl), max(gl)) if gl else (0.0, 0.0) for gl in gap_lists)
    ab = _pair_binding(ctx, (codes[0], codes[1])) if length == 3 else None
    p_contrast, judged = _contrast_p(ctx, codes, g, contrast if length == 3 else None, ab)
    unbound = ab is not None and not ab[1]
    return _Check(p_order=p_order, p_adds=p_adds, lift=lift, antecedent=antecedent,
                  reverse=reverse, episodes=support_rows, gaps=gaps,
                  rival=tuple(codes[i] for i in others[closest]) if margins else (),
                  dominated=dominated, p_rival=p_pair, p_contrast=p_contrast,
                  first_unbound=unbound, first_unjudged=not judged)
