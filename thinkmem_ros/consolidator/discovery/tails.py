"""Null probabilities of a pattern in one episode and exact tails of sums over episodes.

Why: the p-values are analytic (a permutation p-value cannot go below 1/(P+1)), built from
the per-episode null of a pattern and the upper tail of a sum of independent episodes.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np

# --------------------------------------------------------------------------- probability
KMAX = 24
"""Copies per code up to which the exact order probability is tabulated (beyond: 1)."""


@cache
def _p_contains(ra: int, rb: int, rc: int, state: int) -> float:
    """P(a random arrangement of the remaining copies completes a..b..c from ``state``)."""
    if state == 2:
        return 1.0 if rc > 0 else 0.0
    if state == 1 and rb == 0:
        return 0.0
    if state == 0 and (ra == 0 or rb == 0 or rc == 0):
        return 0.0
    total = ra + rb + rc
    out = 0.0
    if ra:
        out += ra / total * _p_contains(ra - 1, rb, rc, 1 if state == 0 else state)
    if rb:
        out += rb / total * _p_contains(ra, rb - 1, rc, 2 if state == 1 else state)
    if rc:
        out += rc / total * _p_contains(ra, rb, rc - 1, state)
    return out


@cache
def _order_table() -> np.ndarray:
    """P(subsequence a..b..c) for k_a, k_b, k_c copies in random order, indices < KMAX+1."""
    table = np.ones((KMAX + 2,) * 3)
    for ka, kb, kc in itertools.product(range(KMAX + 1), repeat=3):
        table[ka, kb, kc] = _p_contains(ka, kb, kc, 0)
    table[0, :, :] = table[:, 0, :] = table[:, :, 0] = 0.0
    return table


def _p_order3(ka: np.ndarray, kb: np.ndarray, kc: np.ndarray) -> np.ndarray:
    table = _order_table()
    cap = KMAX + 1
    return table[np.minimum(ka, cap), np.minimum(kb, cap), np.minimum(kc, cap)]


def _p_order2(ka: np.ndarray, kb: np.ndarray) -> np.ndarray:
    """P(some a before some b) = 1 - 1 / C(ka + kb, ka)."""
    ka, kb = np.asarray(ka, np.float64), np.asarray(kb, np.float64)
    log_binom = (_lgamma(ka + kb + 1) - _lgamma(ka + 1) - _lgamma(kb + 1))
    return np.where((ka > 0) & (kb > 0), -np.expm1(-log_binom), 0.0)


def _lgamma(x: np.ndarray) -> np.ndarray:
    """Log-Gamma of positive integer-valued x (a table of log factorials)."""
    x = np.asarray(x, np.float64)
    k = np.rint(x).astype(np.int64) - 1  # Gamma(x) = (x - 1)!
    if x.size == 0:
        return x.copy()
    table = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, max(int(k.max()), 1) + 1)))))
    return table[np.maximum(k, 0)]


def poisson_tail_bound(s: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """Upper bound on P(Poisson(lam) >= s): the first term times a geometric series.

    For a Poisson-binomial S of mean lam, P(S >= s) <= P(Poisson(lam) >= s) when
    s >= lam + 1 (Hoeffding 1956; Anderson & Samuels 1967), so this bounds its tail too.
    Returns 1 where s < lam + 1 (such a support is never significant).
    """
    s = np.asarray(s, np.float64)
    lam = np.maximum(np.asarray(lam, np.float64), 1e-300)
    ok = s >= lam + 1
    safe_s = np.where(ok, s, lam + 1)
    log_first = -lam + safe_s * np.log(lam) - _lgamma(safe_s + 1)
    bound = np.exp(log_first) * (safe_s + 1) / (safe_s + 1 - lam)
    return np.where(ok, np.minimum(bound, 1.0), 1.0)


def pb_tail(probs: list[np.ndarray] | np.ndarray, s: np.ndarray) -> np.ndarray:
    """Exact P(S >= s) for Poisson-binomial sums, one problem per row.

    ``probs`` is a (P, F) array padded with zeros (or a list of arrays); ``s`` (P,) the
    observed counts. The distribution below s is tracked explicitly and the mass that
    reaches s is accumulated, so tiny tails keep full relative precision.
    """
    if isinstance(probs, list):
        width = max((len(p) for p in probs), default=0)
        pad = np.zeros((len(probs), max(width, 1)))
        for i, p in enumerate(probs):
            pad[i, :len(p)] = p
        probs = pad
    probs = np.asarray(probs, np.float64)
    s = np.asarray(s, np.int64)
    n = probs.shape[0]
    out = np.ones(n)
    todo = np.flatnonzero(s > 0)
    if todo.size == 0:
        return out
    probs, s_t = probs[todo], s[todo]
    k = int(s_t.max())
    dist = np.zeros((todo.size, k))
    dist[:, 0] = 1.0
    live = np.arange(k)[None, :] < s_t[:, None]
    tail = np.zeros(todo.size)
    rows = np.arange(todo.size)
    for f in range(probs.shape[1]):
        p = probs[:, f:f + 1]
        tail += dist[rows, s_t - 1] * p[:, 0]
        moved = dist * p
        dist = dist * (1 - p)
        dist[:, 1:] += moved[:, :-1]
        dist *= live
    out[todo] = np.minimum(tail, 1.0)
    return out


STEPS_PER_BIT = 1
"""Score resolution: a level scores floor(-log2 P * STEPS_PER_BIT) steps.

Measured over 48 seeds per cell at 8 and 16 repetitions (sparse, heartbeat, shared, zipf):
4 steps per bit found the same rules with 16 false triples in 240 runs against 11 at 1 step;
in the paper world (300 codes, 200 s episodes, gaps 20-60 s) it found the rules of one seed
in 6 that 1 step misses (F1 at 8: 1.0 against 0.8), where the rule frames' tails (0.1-0.15)
and a chance order's (1/6) fall on the same whole bit."""
SCORE_CAP = 48 * STEPS_PER_BIT
"""Steps an episode can score at most (a tail of 2^-48 already outweighs any family here)."""


def _level_scores(pe: np.ndarray, steps: int = STEPS_PER_BIT) -> np.ndarray:
    """(R, L) bits each frame scores at level l = 1..L: floor(-log2 P(level >= l)), capped.

    ``steps`` per bit (the order check scores finer: ``order_test``).

    A frame's level is the number of scales its tightest occurrence fits in; what a level
    is worth depends on the episode: fitting 60 s in a sparse episode is rare, in a dense
    one common, and a pattern of codes that fill the episode holds by chance. Scoring each
    level by how improbable it is under the null (its surprise, in bits) weights tight,
    rare occurrences far above the chance frames that merely hold the pattern somewhere,
    which is close to the likelihood ratio of a rule whose gaps spread over orders of
    magnitude. The map is fixed by the null probabilities alone (the multiset and timing
    the null conditions on), so the exact tail of the summed score stays a valid p-value.
    """
    q = pe[:, ::-1]
    with np.errstate(divide="ignore"):
        bits = np.floor(-np.log2(np.maximum(q, 1e-300)) * steps + 1e-9)
    return np.clip(bits, 0, SCORE_CAP // STEPS_PER_BIT * steps).astype(np.int64)


def _score_tail(pes: list[np.ndarray], z: np.ndarray, bits: bool = True) -> np.ndarray:
    """Exact P(sum of frame scores >= z) under the null, one problem per list item.

    Item i is an (F_i, S) array of its frames' null probabilities per scale (as
    ``_null_probs`` returns them); a frame's level l = 0..S has probability
    P(level >= l) - P(level >= l + 1) and scores ``_level_scores`` steps. The distribution
    of the running sum below z is tracked explicitly and the mass that reaches z is
    accumulated, so tiny tails keep full relative precision. Each frame shifts the running
    distribution once per score some problem of the batch can take there (not once per
    possible score). ``bits=False``: a frame scores its level itself (the level count).

    Every problem's result is the same to the bit whichever problems share its batch: the
    sums run in a fixed order per problem, and the scores only other problems can take add
    exact zeros. So the callers may batch as suits the padding, and a log scanned in parts,
    on threads or on Ray, gets the tails a whole pass gets.
    """
    n = len(pes)
    out = np.ones(n)
    z = np.asarray(z, np.int64)
    top = int(z.max()) if n else 0
    if top <= 0:
        return out
    n_scales = pes[0].shape[1]
    width = max(p.shape[0] for p in pes)
    score = np.zeros((n, width, n_scales + 1), np.int64)  # level 0 scores 0
    prob = np.zeros((n, width, n_scales + 1))
    prob[:, :, 0] = 1.0  # a padding frame stays at level 0
    for i, pe in enumerate(pes):
        if not pe.shape[0]:
            continue
        q = np.concatenate((np.ones((pe.shape[0], 1)), pe[:, ::-1],
                            np.zeros((pe.shape[0], 1))), axis=1)
        prob[i, :pe.shape[0]] = q[:, :-1] - q[:, 1:]
        score[i, :pe.shape[0], 1:] = _level_scores(pe) if bits else np.arange(1, n_scales + 1)
    live = np.arange(top)[None, :] < z[:, None]
    rows = np.repeat(np.arange(n), n_scales + 1)
    dist = np.zeros((n, top))
    dist[:, 0] = 1.0
    tail = np.zeros(n)
    for f in range(width):
        # P(frame score = d) per problem, and the scores any problem can reach here
        law = np.bincount(rows * (SCORE_CAP + 1) + score[:, f].ravel(),
                          weights=prob[:, f].ravel(), minlength=n * (SCORE_CAP + 1)
                          ).reshape(n, SCORE_CAP + 1)
        values = np.flatnonzero(law.any(axis=0))
        # mass that reaches z: P(score = d) times the running mass at z - d or above
        above = np.concatenate((np.cumsum(dist[:, ::-1], axis=1)[:, ::-1],
                                np.zeros((n, 1))), axis=1)
        at = np.clip(z[:, None] - values[None, :], 0, top)
        reach = law[:, values] * np.take_along_axis(above, at, axis=1)
        for j in range(values.size):  # in order of d: the same sums whatever the batch
            tail += reach[:, j]
        new = np.zeros((n, top))
        for d in values.tolist():
            if d < top:
                new[:, d:] += dist[:, :top - d] * law[:, d:d + 1]
        dist = new * live
    out[:] = np.minimum(tail, 1.0)
    return out


def _sign_flip_tail(d: np.ndarray, law=None) -> float:
    """Exact P(sum of +-|d_e| >= sum d_e) with independent fair signs (integer d).

    ``law(mags, total)`` builds the distribution of the signed sum over -total..total
    (default ``_sign_flip_law``; the checks pass its compiled twin).
    """
    d = d[d != 0]
    observed = int(d.sum())
    if observed <= 0:
        return 1.0
    mags = np.abs(d)
    total = int(mags.sum())
    dist = (law or _sign_flip_law)(mags, total)
    return float(min(1.0, dist[total + observed:].sum()))


RELABEL_WORK = 300_000_000
"""Largest exact law of the relabelling test (episodes x states); above it, Hoeffding."""


def relabel_tail(diffs: np.ndarray) -> float:
    """P(forward's summed fit is at least as large) when each episode's orders are relabelled.

    ``diffs``: one row per episode holding every code, forward's fitted scales less each
    other order's. Under "no order is preferred" the codes' roles are exchangeable: the
    relabelling that makes order s forward is as likely as none, so forward's value in an
    episode is a uniform draw from the episode's values of all orders, independently per
    episode, and the tail of the sum is exact. Unlike permuting the labels over the codes'
    slots, it keeps one copy of each code in a cluster of one copy each, and it fits no
    scale to the data. The law saturates at the observed sum, so it holds only as many
    states as forward's lead; past ``RELABEL_WORK`` Hoeffding's bound stands in (valid,
    larger).
    """
    diffs = np.asarray(diffs, np.int64).reshape(len(diffs), -1)
    values = -np.concatenate((np.zeros((diffs.shape[0], 1), np.int64), diffs), axis=1)
    values = values[(values != 0).any(axis=1)]
    if not values.size:
        return 1.0
    shifted = values - values.min(axis=1, keepdims=True)
    need = int(-values.min(axis=1).sum())  # the sum of shifted values forward reached
    if need <= 0:
        return 1.0
    if values.shape[0] * (need + 1) > RELABEL_WORK:
        return _hoeffding(shifted, need)
    share = 1.0 / values.shape[1]
    dist = np.zeros(need + 1)
    dist[0] = 1.0
    for row in shifted:
        new = np.zeros(need + 1)
        for v in row.tolist():
            if v >= need:
                new[need] += share * dist.sum()
            else:
                new[v:need] += share * dist[:need - v]
                new[need] += share * dist[need - v:].sum()
        dist = new
    return float(min(1.0, dist[need]))


def _hoeffding(shifted: np.ndarray, need: int) -> float:
    """Hoeffding's bound on P(sum of uniform draws from each row >= need)."""
    mean = float(shifted.mean(axis=1).sum())
    spread = float(((shifted.max(axis=1) - shifted.min(axis=1)) ** 2).sum())
    if need <= mean or spread == 0:
        return 1.0
    return float(min(1.0, np.exp(-2.0 * (need - mean) ** 2 / spread)))


def _sign_flip_law(mags: np.ndarray, total: int) -> np.ndarray:
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0
    for m in mags.tolist():
        dist = 0.5 * (np.roll(dist, m) + np.roll(dist, -m))
    return dist


JOINT_CELLS = 200_000
"""Largest box (bits threshold x level threshold) worked out for the joint tail."""


def _frame_laws(pe: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per frame: P(level = l) for l = 0..S, the bits level l scores, and l itself."""
    n_scales = pe.shape[1]
    q = np.concatenate((np.ones((pe.shape[0], 1)), pe[:, ::-1],
                        np.zeros((pe.shape[0], 1))), axis=1)
    prob = q[:, :-1] - q[:, 1:]
    bits = np.concatenate((np.zeros((pe.shape[0], 1), np.int64), _level_scores(pe)), axis=1)
    return prob, bits, np.arange(n_scales + 1)


def _tail_function(prob: np.ndarray, score: np.ndarray) -> np.ndarray:
    """P(sum of frame scores >= z) for every z = 0..max: the whole law, added from the top.

    Every mass is a product of probabilities (no differences), so the smallest tails keep
    full relative precision.
    """
    top = int(score.max(axis=1).sum()) if score.size else 0
    dist = np.zeros(top + 1)
    dist[0] = 1.0
    reach = 0
    for f in range(prob.shape[0]):
        new = np.zeros(top + 1)
        for p, d in zip(prob[f].tolist(), score[f].tolist()):
            if p > 0.0:
                new[d:d + reach + 1] += p * dist[:reach + 1]
        reach += int(score[f].max())
        dist = new
    return np.cumsum(dist[::-1])[::-1]


def two_statistic_tail(pe: np.ndarray, z_bits: int, z_levels: int) -> float:
    """Exact p-value of the better of the two statistics (bits, level count) of one pattern.

    Why: each statistic's exact tail is a valid p-value, and twice the smaller of the two
    is one too (a union bound), but the two statistics rise together (both grow with
    every frame's level), so the union bound spends nearly a whole bit for nothing. The
    statistic here is M = min(P(Zb >= zb), P(Zl >= zl)) itself, and its p-value
    P(M <= m) = P(Zb >= tb or Zl >= tl), where tb and tl are the smallest totals whose
    tails are at most m, is worked out exactly: the joint law of the two sums stays inside
    the box [0, tb) x [0, tl), and the mass that leaves it, frame after frame, is the
    p-value (accumulated, never 1 minus something, so tiny tails keep their precision).
    It is never above twice the smaller tail, and at least the smaller tail.

    Returns NaN where the box would exceed ``JOINT_CELLS`` (the caller keeps the union
    bound there).
    """
    if not pe.shape[0]:
        return 1.0
    prob, bits, levels = _frame_laws(pe)
    tail_b = _tail_function(prob, bits)
    tail_l = _tail_function(prob, np.broadcast_to(levels, prob.shape))
    p_b = tail_b[z_bits] if z_bits < tail_b.size else 0.0
    p_l = tail_l[z_levels] if z_levels < tail_l.size else 0.0
    m = min(p_b, p_l)
    if m <= 0.0:
        return 0.0
    tb = int(np.argmax(tail_b <= m)) if np.any(tail_b <= m) else tail_b.size
    tl = int(np.argmax(tail_l <= m)) if np.any(tail_l <= m) else tail_l.size
    if tb * tl > JOINT_CELLS:
        return float("nan")
    if tb == 0 or tl == 0:
        return 1.0
    box = np.zeros((tb, tl))
    box[0, 0] = 1.0
    out = 0.0
    for f in range(prob.shape[0]):
        new = np.zeros((tb, tl))
        for p, db, dl in zip(prob[f].tolist(), bits[f].tolist(), levels.tolist()):
            if p <= 0.0:
                continue
            kb, kl = max(tb - db, 0), max(tl - dl, 0)
            # mass this level carries out of the box: rows past tb - db, or columns past
            # tl - dl within the rows that stay
            out += p * (box[kb:, :].sum() + box[:kb, kl:].sum())
            if kb and kl:
                new[db:, dl:] += p * box[:kb, :kl]
        box = new
    return float(min(out, 1.0))
