"""Candidate frames, their null probabilities and the family-wide test (step 2).

Why: a frame is an episode holding a candidate's codes; its null probability at each scale
and the surprise of its observed level are all a candidate's test needs, summed exactly
(a dynamic programme) or bounded (Chernoff) where the sum is too large.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from thinkmem_ros.consolidator.discovery.arrays import (
    _candidate_codes,
    _expand,
    _lookup,
    _sorted_set_key,
)
from thinkmem_ros.consolidator.discovery.episodes import _Episodes
from thinkmem_ros.consolidator.discovery.tails import (
    SCORE_CAP,
    STEPS_PER_BIT,
    _level_scores,
    _p_order2,
    _p_order3,
    _score_tail,
    poisson_tail_bound,
    two_statistic_tail,
)


# ------------------------------------------------------------------------- significance
@dataclass
class _Tested:
    """Per candidate of one length: codes, frames and per-scale evidence."""

    keys: np.ndarray  # (P,) pattern keys
    codes: np.ndarray  # (P, L)
    p: np.ndarray  # (P,) p-value of the multi-scale score Z
    minp: np.ndarray  # (P,) smallest achievable p-value
    scale: np.ndarray  # (P,) index of the scale where the support is most surprising
    support: np.ndarray  # (P, S) support per scale
    expected: np.ndarray  # (P, S)
    frame_start: np.ndarray  # (P+1,) CSR into the frame rows
    frame_ep: np.ndarray  # frame rows: episode
    frame_m: np.ndarray  # tightest occurrence (nan when absent: never <= a scale)
    # (R, L) copies of each code in the frame's episode: with the episode, all the null
    # needs (``_null_probs``); 12 bytes a frame where the (R, S) probabilities took 152
    frame_k: np.ndarray
    weight: np.ndarray = field(default_factory=lambda: np.ones(0))  # weighted-BH weights
    # weighted smallest achievable p-values of candidates left out because they cannot be
    # significant (a scan in parts keeps only the others): they still count for Tarone
    other_minp: np.ndarray = field(default_factory=lambda: np.zeros(0))


_THETAS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)  # the Chernoff bound's grid
SUM_CHUNK = 131_072  # frames whose score temporaries are built at once


@dataclass
class _Frames:
    """Per frame (an episode holding a candidate's code set): candidate, episode, evidence."""

    cand: np.ndarray  # (R,) candidate index, ascending
    ep: np.ndarray  # (R,) episode row
    m: np.ndarray  # (R,) tightest occurrence (nan when absent: never <= a scale)
    pe: np.ndarray  # (R, S) null probability per scale
    k: np.ndarray  # (R, L) copies of each code in the episode (what ``pe`` is made from)


def _frame_rows(ctx: _Episodes, rows: dict, length: int, keys: np.ndarray,
                codes: np.ndarray, set_ep: np.ndarray, set_row_key: np.ndarray
                ) -> tuple[np.ndarray, ...]:
    """Per frame of the candidates ``keys`` in ``ctx``'s episodes: what its test reads.

    Returns (candidate index, episode row in ``ctx``, tightest occurrence (nan when
    absent), copies of each code (R, length)).
    """
    v = ctx.v
    order = np.argsort(set_row_key, kind="stable")
    srk, sep = set_row_key[order], set_ep[order]
    skey = _sorted_set_key(codes, v) if keys.size else np.zeros(0, np.int64)
    lo = np.searchsorted(srk, skey, side="left")
    hi = np.searchsorted(srk, skey, side="right")
    cand, off = _expand(hi - lo)
    f_ep = sep[lo[cand] + off]
    # tightest occurrence of the candidate in each frame episode (nan when absent)
    combined = rows["key"] * (ctx.n_ep + 1) + rows["ep"]
    order_o = np.argsort(combined, kind="stable")
    combined, occ_m = combined[order_o], rows["m"][order_o]
    f_m = _lookup(combined, occ_m, keys[cand] * (ctx.n_ep + 1) + f_ep, np.nan)
    k = np.stack([ctx.copies(f_ep, codes[cand, c]) for c in range(length)], axis=1) \
        if f_ep.size else np.zeros((0, length), np.int64)
    return cand, f_ep, f_m, k


def _null_probs(ctx: _Episodes, f_ep: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(R, S) probability that each frame holds its pattern at each scale under the null.

    ``f_ep`` indexes ``ctx``'s episodes, ``k`` (R, length) the copies of each code there.
    """
    length = k.shape[1]
    n_e = ctx.n[f_ep].astype(np.float64)
    kprod = np.prod(k.astype(np.float64), axis=1)
    if length == 3:
        falling = n_e * (n_e - 1) * (n_e - 2)
        slots = ctx.t3[f_ep]
    else:
        falling = n_e * (n_e - 1)
        slots = ctx.t2[f_ep]
    # in place: a test bucket holds a million frames, and each (R, S) temporary is 150 MB
    pe = slots  # a fresh array (fancy indexing copies), same operations in the same order
    pe *= kprod[:, None]
    pe /= np.maximum(falling, 1.0)[:, None]
    np.minimum(pe, 1.0, out=pe)
    if ctx.exact_infinite() and f_ep.size:
        pe[:, -1] = (_p_order3(k[:, 0], k[:, 1], k[:, 2]) if length == 3
                     else _p_order2(k[:, 0], k[:, 1]))
    np.clip(pe, 1e-300, 1.0, out=pe)
    # the true probability grows with the scale: a bound at g also bounds every g' < g
    flipped = pe[:, ::-1]
    np.minimum.accumulate(flipped, axis=1, out=flipped)
    return pe


def _frames(ctx: _Episodes, rows: dict, length: int, keys: np.ndarray, codes: np.ndarray,
            set_ep: np.ndarray, set_row_key: np.ndarray) -> _Frames:
    """Frames of the candidates ``keys`` in ``ctx``'s episodes, with null probabilities."""
    cand, f_ep, f_m, k = _frame_rows(ctx, rows, length, keys, codes, set_ep, set_row_key)
    return _Frames(cand, f_ep, f_m, _null_probs(ctx, f_ep, k), k.astype(np.int32))


def _observed_scores(m: np.ndarray, pe: np.ndarray, scales: np.ndarray,
                     scores: np.ndarray | None = None) -> np.ndarray:
    """(R,) bits each frame scored: its level's score, 0 where it does not hold."""
    level = np.searchsorted(scales, m, side="left")  # scales below m: the level is the rest
    level = scales.size - level
    scores = _level_scores(pe) if scores is None else scores
    padded = np.concatenate((np.zeros((scores.shape[0], 1), np.int64), scores), axis=1)
    return padded[np.arange(level.size), level]


def _column_sums(cand: np.ndarray, values: np.ndarray, n_cand: int) -> np.ndarray:
    """(n_cand, S) sums of ``values`` (R, S) rows per candidate.

    Frames come grouped by candidate (ascending), so one ``reduceat`` pass over the rows
    does what a ``bincount`` per scale would do in S passes over strided columns.
    """
    out = np.zeros((n_cand, values.shape[1]))
    if not cand.size:
        return out
    if np.any(cand[1:] < cand[:-1]):  # not grouped: per column
        for s in range(values.shape[1]):
            out[:, s] = np.bincount(cand, weights=values[:, s], minlength=n_cand)
        return out
    starts = np.flatnonzero(np.concatenate(([True], cand[1:] != cand[:-1])))
    out[cand[starts]] = np.add.reduceat(values, starts, axis=0)
    return out


@dataclass
class _Sums:
    """Per-candidate sums over frames: all the test needs except the exact refinement."""

    support: np.ndarray  # (P, S) frames whose tightest occurrence fits scale s
    expected: np.ndarray  # (P, S) sum of null probabilities
    score: np.ndarray  # (P,) observed bits, summed over frames
    log_mgf: np.ndarray  # (P, len(_THETAS)) sum of log E[exp(theta Z_e)], Z_e in bits
    log_mgf_levels: np.ndarray  # (P, len(_THETAS)) the same for Z_e = the level
    log_min: np.ndarray  # (P,) sum of log p_e at the smallest scale
    width: np.ndarray  # (P,) frames

    @classmethod
    def zeros(cls, n_cand: int, n_scales: int) -> _Sums:
        """Nothing seen yet."""
        return cls(np.zeros((n_cand, n_scales)), np.zeros((n_cand, n_scales)),
                   np.zeros(n_cand), np.zeros((n_cand, len(_THETAS))),
                   np.zeros((n_cand, len(_THETAS))), np.zeros(n_cand),
                   np.zeros(n_cand, np.int64))

    def add(self, f: _Frames, scales: np.ndarray) -> None:
        """Add one part's frames (sums over episodes: parts add up to the whole)."""
        n_cand = self.width.size
        self.support += _column_sums(f.cand, (f.m[:, None] <= scales[None, :]).astype(
            np.float64), n_cand)
        self.expected += _column_sums(f.cand, f.pe, n_cand)
        thetas = np.asarray(_THETAS)
        score_table = np.expm1(np.outer(thetas / STEPS_PER_BIT, np.arange(SCORE_CAP + 1)))
        level_table = np.expm1(np.outer(np.arange(1, scales.size + 1), thetas))  # (S, T)
        # the score's temporaries are (frames, scales) each: bounded by taking rows in chunks
        for lo in range(0, f.cand.size, SUM_CHUNK):
            rows = slice(lo, lo + SUM_CHUNK)
            cand, pe = f.cand[rows], f.pe[rows]
            scores = _level_scores(pe)
            self.score += np.bincount(cand, weights=_observed_scores(f.m[rows], pe, scales,
                                                                     scores),
                                      minlength=n_cand)
            tails = pe[:, ::-1]  # tails[:, l-1] = P(level >= l)
            exact = tails - np.concatenate((tails[:, 1:], np.zeros((tails.shape[0], 1))),
                                           axis=1)
            # E[exp(theta Z_e)] = P(level 0) + sum_l P(level = l) exp(theta score_l); the
            # exponentials of whole scores come from a table (a gather, not an expm1 per
            # frame and scale: this loop is most of a fleet log's test pass)
            mgf_levels = 1.0 + exact @ level_table
            for t in range(len(_THETAS)):
                mgf = 1.0 + np.einsum("ij,ij->i", exact, score_table[t][scores])
                self.log_mgf[:, t] += np.bincount(cand, weights=np.log(mgf),
                                                  minlength=n_cand)
                self.log_mgf_levels[:, t] += np.bincount(cand,
                                                         weights=np.log(mgf_levels[:, t]),
                                                         minlength=n_cand)
        self.log_min += np.bincount(f.cand, weights=np.log(f.pe[:, 0]), minlength=n_cand)
        self.width += np.bincount(f.cand, minlength=n_cand)

    def chernoff(self) -> tuple[np.ndarray, np.ndarray]:
        """Chernoff bounds on P(Z >= z) for the bits and the level count, from the sums."""
        levels = self.support.sum(axis=1)
        best, best_levels = np.zeros(self.score.size), np.zeros(self.score.size)
        for t, theta in enumerate(_THETAS):
            best = np.minimum(best, self.log_mgf[:, t] - theta / STEPS_PER_BIT * self.score)
            best_levels = np.minimum(best_levels, self.log_mgf_levels[:, t] - theta * levels)
        return np.minimum(np.exp(best), 1.0), np.minimum(np.exp(best_levels), 1.0)


def _tested(ctx: _Episodes, keys: np.ndarray, codes: np.ndarray, sums: _Sums,
            frames: _Frames) -> _Tested:
    """p-values from the sums, refined exactly where the frames allow; frames kept.

    ``frames`` must hold every frame of each candidate it holds any frame of (the
    exact refinement reads them all).
    """
    cfg = ctx.cfg
    n_cand = keys.size
    support, width = sums.support, sums.width
    z = np.rint(sums.score).astype(np.int64)
    z_levels = support.sum(axis=1).astype(np.int64)
    p_bits, p_levels = sums.chernoff()
    frame_start = np.concatenate(([0], np.cumsum(np.bincount(frames.cand,
                                                              minlength=n_cand))))
    held_frames = np.diff(frame_start) == width
    for bound, observed, bits in ((p_bits, z, True), (p_levels, z_levels, False)):
        _refine(bound, observed, bits, frames, frame_start, width, support, held_frames, ctx)
    p = np.minimum(1.0, 2.0 * np.minimum(p_bits, p_levels))
    _joint(p, z, z_levels, frames, frame_start, held_frames)
    p = np.where(support[:, -1] >= cfg.accept_support, p, 1.0)
    minp = np.minimum(1.0, 2.0 * np.exp(sums.log_min))
    # a candidate whose frames are fewer than accept_support can never be accepted
    minp = np.where(width >= cfg.accept_support, minp, 1.0)
    best = _check_scale(poisson_tail_bound(support, sums.expected), support,
                        cfg.accept_support, np.isfinite(ctx.scales))
    return _Tested(keys=keys, codes=codes, p=p, minp=minp, scale=best, support=support,
                   expected=sums.expected, frame_start=frame_start, frame_ep=frames.ep,
                   frame_m=frames.m, frame_k=frames.k)


JOINT_BELOW = 1e-3
"""Union-bound p-values at or below this are replaced by the exact two-statistic tail."""


def _joint(p: np.ndarray, z: np.ndarray, z_levels: np.ndarray, frames: _Frames,
           frame_start: np.ndarray, held_frames: np.ndarray) -> None:
    """The exact p-value of the better statistic (in place) where it can matter.

    Any p-value at least the exact one is valid, so keeping the union bound elsewhere
    (far from the level, or where the joint law would be too large) costs power there
    only, never validity.
    """
    for c in np.flatnonzero((p <= JOINT_BELOW) & held_frames).tolist():
        exact = two_statistic_tail(frames.pe[frame_start[c]:frame_start[c + 1]],
                                   int(z[c]), int(z_levels[c]))
        if exact == exact:  # not NaN: the box was small enough
            p[c] = min(p[c], exact)


def _refine(p: np.ndarray, z: np.ndarray, bits: bool, frames: _Frames,
            frame_start: np.ndarray, width: np.ndarray, support: np.ndarray,
            held_frames: np.ndarray, ctx: _Episodes) -> None:
    """Exact tails (in place) where the Chernoff bound leaves a candidate near the level."""
    refine = np.flatnonzero((p <= 0.05) & (support[:, -1] >= ctx.cfg.accept_support)
                            & (width <= 4096) & (z <= 4096) & held_frames)
    if refine.size:
        refine = refine[np.argsort(width[refine] * z[refine], kind="stable")]
        budget = 2_000_000  # cells of one padded array of the dynamic programme
        n_levels = ctx.scales.size
        chunk: list[int] = []
        widest = highest = smallest = 0  # the chunk's padded DP size, its first problem's
        for ci, w_ci, z_ci in zip(refine.tolist(), width[refine].tolist(),
                                  z[refine].astype(np.int64).tolist()):
            grown_w, grown_z = max(widest, w_ci), max(highest, z_ci)
            cells = max(grown_w * (n_levels + 1), grown_z, SCORE_CAP + 1)
            if chunk and ((len(chunk) + 1) * cells > budget
                          or grown_w * grown_z > PADDING * smallest):
                _refine_exact(p, chunk, frames.pe, frame_start, z, bits)
                chunk, grown_w, grown_z = [], w_ci, z_ci
            if not chunk:
                smallest = max(w_ci * z_ci, 1)
            chunk.append(ci)
            widest, highest = grown_w, grown_z
        _refine_exact(p, chunk, frames.pe, frame_start, z, bits)


PADDING = 2.0
"""A chunk of exact tails is cut before its padded size (widest frames x highest score)
exceeds this many times its first problem's: the problems are sorted by that size, so no
problem pays more than this for sharing a batch (each one's tail is the same either way,
``_score_tail``). One chunk for all cost ~3x its problems' own work on the rounds' logs."""


CHECK_SCALE_SLACK = 10.0
"""The checks run at the widest scale whose single-scale tail is within this factor of the
best one's."""


def _check_scale(single: np.ndarray, support: np.ndarray, accept: int, finite: np.ndarray
                 ) -> np.ndarray:
    """(P,) index of the scale the per-pattern checks and the relation's figures use.

    The scale where a pattern's support is most surprising is often a narrow one that
    holds a few of its tightest cases (gaps spread over 2-300 s put 3 of 8 under 46 s),
    and the contrasts that follow would then judge the rule on those few: too few cases
    to tell a rule from chance (heartbeat world at 8 repetitions: first-element contrast
    p 0.02-0.04 at 46 s, 0.0001-0.0004 at 261 s). Where a wider scale is nearly as
    surprising (its tail within ``CHECK_SCALE_SLACK`` of the best), it covers more of the
    rule's cases at little cost: the narrowest such scale that holds the most cases is
    used. Not wider: past the point where the support stops growing a wider window only
    adds chance (and, in short missions, lets a code at a fixed phase look bound to a
    natural pair). Only finite scales qualify: at an unbounded gap a code that repeats in an
    episode fits every order of the pattern at once, and the order test has nothing left to
    see there (the rounds' missions, where events repeat).
    """
    if not single.shape[0]:
        return np.zeros(0, np.int64)
    enough = support >= accept
    best = np.argmin(single + ~enough, axis=1)
    best_p = single[np.arange(best.size), best]
    near = (single <= CHECK_SCALE_SLACK * best_p[:, None]) & enough & finite[None, :]
    held = np.where(near, support, -1.0)
    most = np.argmax(held, axis=1)  # first (narrowest) scale with the largest support
    return np.where(near.any(axis=1) & (held.max(axis=1, initial=-1.0) >
                                        support[np.arange(best.size), best]), most, best)


def _refine_exact(p: np.ndarray, chunk: list[int], pe: np.ndarray, frame_start: np.ndarray,
                  z: np.ndarray, bits: bool) -> None:
    """Replace the Chernoff bounds of ``chunk`` by exact tails where smaller (in place)."""
    if chunk:
        exact = _score_tail([pe[frame_start[c]:frame_start[c + 1]] for c in chunk], z[chunk],
                            bits)
        p[chunk] = np.minimum(p[chunk], exact)


def _test_candidates(ctx: _Episodes, rows: dict, length: int, set_ep: np.ndarray,
                     set_row_key: np.ndarray) -> _Tested:
    """Within-episode null p-values at every scale for candidates with enough support."""
    keys = rows["uk"][rows["support"] >= ctx.cfg.accept_support]
    codes = _candidate_codes(keys, length, ctx.v)
    frames = _frames(ctx, rows, length, keys, codes, set_ep, set_row_key)
    sums = _Sums.zeros(keys.size, ctx.scales.size)
    sums.add(frames, ctx.scales)
    return _tested(ctx, keys, codes, sums, frames)
