"""Each element against real cases without it (Webb's productivity), and pair bindings.

Why: the within-episode tests take slots as exchangeable, so a code at a fixed phase of
every episode gains from its position alone; comparing with real cases without the element
cannot be fooled that way. Exact 2x2 tests (Fisher, Boschloo) and their stratified form.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from thinkmem_ros.consolidator.discovery.boschloo import boschloo_greater, fisher_greater_p
from thinkmem_ros.consolidator.discovery.episodes import _Episodes
from thinkmem_ros.consolidator.discovery.model import DiscoveryConfig
from thinkmem_ros.consolidator.discovery.occurrences import (
    _episode_slots,
    _episodes_with,
    _fits,
    _fits_any,
)


def _fisher_greater(k1: int, n1: int, k0: int, n0: int, alpha: float
                    ) -> tuple[float, bool]:
    """One-sided Fisher exact p that the rate k1/n1 exceeds k0/n0, and whether it can.

    The second value is False when the table cannot reach ``alpha`` whatever its cells
    (Tarone: the smallest p-value its margins allow is above the level, e.g. B almost
    never seen without A): such a contrast holds no evidence either way, and the caller
    asks for other evidence instead of reading its p-value as a refutation.
    """
    successes = k1 + k0
    if n1 <= 0 or n0 <= 0 or successes <= 0:
        return 1.0, False
    best = min(successes, n1)  # every success in the first group
    if float(fisher_greater_p(best, successes - best, n1, n0)) > alpha:
        return 1.0, False
    if k1 <= 0:
        return 1.0, True
    return float(min(1.0, fisher_greater_p(k1, k0, n1, n0))), True


BOSCHLOO_BELOW = 0.25
"""Fisher p-values between alpha/2 and this are refined by Boschloo's test (see below)."""


BOSCHLOO_CELLS = 250_000
"""Tables with more outcomes (n1 + 1)(n0 + 1) than this keep Fisher's p. Boschloo's cost
grows with the smaller group times the larger one's binomial terms (``boschloo.py``: 0.14 s
at 498 against 498 units, 4 s at 1,000 against 100,000), while its gain shrinks with
the table (p 0.93-0.95 of Fisher's at 500-1,000 units a side)."""


def _rate_greater(k1: int, n1: int, k0: int, n0: int, alpha: float) -> tuple[float, bool]:
    """``_fisher_greater``, refined by Boschloo's test where Fisher's p is borderline."""
    p, ok = _fisher_greater(k1, n1, k0, n0, alpha)
    if ok and alpha / 2 < p <= BOSCHLOO_BELOW and (n1 + 1) * (n0 + 1) <= BOSCHLOO_CELLS:
        p = min(p, _boschloo_greater(k1, n1, k0, n0))
    return p, ok


@functools.lru_cache(maxsize=65_536)
def _boschloo_greater(k1: int, n1: int, k0: int, n0: int) -> float:
    """Boschloo's exact unconditional one-sided p-value for the same table.

    Fisher's test conditions on both margins and is conservative for small tables;
    Boschloo's uses Fisher's p-value as its statistic and is exact over the unknown common
    rate of the two groups (their sizes fixed, as the contrasts' units are), never less
    powerful than Fisher's. On the contrast tables of rules that share B...C (8 of 12
    against 8 of 37, 3 of 9 against 1 of 37) it halves the p-value or better (0.0064 to
    0.0029, 0.020 to 0.0087). A table seen before, in this round or an earlier one, is not
    worked out again.
    """
    return boschloo_greater(k1, n1, k0, n0)


@dataclass
class _Contrast:
    """Counts for the element-contrast tests of a triple A...B...C at the pattern's scale g.

    Each element must change how often the pattern completes, compared with real cases where
    the rest of it is there without that element (Webb's productive rules), so an event that
    sits at the same place in every episode (a start-of-mission code, a planted event at a
    fixed phase) gains nothing from its position alone, which a test against uniform
    placement credits it with. Counts add over partitions. Both tables are laid out so that
    where an occurrence sits in its episode can only work against the pattern:

    * first (does A add to B...C): the units are B's occurrences, counted over the whole
      history by ``_first_table``; C must follow (within g) a B that A preceded (within g)
      more often than a B that no A preceded at any allowed gap. A B preceded by A sits
      later and has less room left for C, so any bias of position is against the pattern.
    * middle (does B add to A...C): the units are A's occurrences; the pattern must
      complete from an A followed by B (within g) more often than C follows (within g) an A
      that no B followed. A late A has little room for either B or C, so the units are
      compared within strata of the room left in their episode (``ROOM_STRATA`` bands of
      g/4, the last one "g or more"), an exact stratified test; without the strata, late
      As would make "no B" and "no C" go together and credit any B.

    C has no contrast of its own: the episodes without A...B that hold C include every
    other rule ending in C, so "C more often with A...B" has no power where rules share
    a consequence; C is judged by its base-rate test and by the first element's contrast,
    which already asks whether C follows B more often after A.
    """

    # per room stratum: A occurrences followed by B within g; of those, the ones the
    # pattern completes from (C within g of such a B); A occurrences without B, C within g
    a_exposed: np.ndarray = field(default_factory=lambda: np.zeros(ROOM_STRATA + 1, np.int64))
    a_exposed_c: np.ndarray = field(default_factory=lambda: np.zeros(ROOM_STRATA + 1,
                                                                     np.int64))
    a_unexposed_c: np.ndarray = field(default_factory=lambda: np.zeros(ROOM_STRATA + 1,
                                                                       np.int64))

    @staticmethod
    def terms(t: np.ndarray, pos: list[np.ndarray], g: float, cfg: DiscoveryConfig
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """One episode's counts per room stratum (None without A): what ``add_terms`` adds.

        Apart from adding: the checks gather every episode's terms first (``checks``).
        """
        a, b, c = pos
        if not a.size:
            return None
        stratum = _room_strata(t[-1] - t[a], g)
        then_b = _fits(t, a, b, g, cfg) if b.size else np.zeros((a.size, 0), bool)
        b_to_c = _fits(t, b, c, g, cfg).any(axis=1) if b.size and c.size \
            else np.zeros(b.size, bool)
        exposed = then_b.any(axis=1)
        completes = (then_b & b_to_c[None, :]).any(axis=1)
        a_to_c = _fits(t, a, c, g, cfg).any(axis=1) if c.size else np.zeros(a.size, bool)
        size = ROOM_STRATA + 1
        return (np.bincount(stratum, weights=exposed, minlength=size).astype(np.int64),
                np.bincount(stratum, weights=completes, minlength=size).astype(np.int64),
                np.bincount(stratum, weights=~exposed & a_to_c,
                            minlength=size).astype(np.int64))

    def add_terms(self, terms: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> None:
        """Count one episode holding at least two of the three codes (``terms``)."""
        if terms is not None:
            self.a_exposed += terms[0]
            self.a_exposed_c += terms[1]
            self.a_unexposed_c += terms[2]

    def middle_tables(self, a_per_stratum: np.ndarray) -> tuple[np.ndarray, ...]:
        """The middle element's tables per room stratum (k1, n1, k0, n0), every A counted."""
        return (self.a_exposed_c, self.a_exposed, self.a_unexposed_c,
                a_per_stratum - self.a_exposed)


def _gap_to(ctx: _Episodes, code: int, rows: np.ndarray, after: bool) -> np.ndarray:
    """Per row, the gap to the nearest allowed ``code`` event after (or before) it.

    Same episode, at least min_gap away, no more than ``max_lookback`` events apart; inf
    where there is none.
    """
    t, ep = ctx.log.time, ctx.log.episode
    mine = ctx.rows_of(code)
    out = np.full(rows.size, np.inf)
    if not mine.size or not rows.size:
        return out
    if ctx.cfg.min_gap > 0:  # nearest by time at least min_gap away, in (episode, time) order
        key = ctx.order_key
        if after:
            at = np.searchsorted(key[mine], key[rows] + ctx.cfg.min_gap, side="left")
        else:
            at = np.searchsorted(key[mine], key[rows] - ctx.cfg.min_gap, side="right") - 1
    else:  # nearest in log order
        at = np.searchsorted(mine, rows, side="right") if after \
            else np.searchsorted(mine, rows, side="left") - 1
    found = (at >= 0) & (at < mine.size)
    other = mine[np.clip(at, 0, mine.size - 1)]
    ok = found & (ep[other] == ep[rows]) & (np.abs(other - rows) <= ctx.cfg.max_lookback)
    out[ok] = np.abs(t[other[ok]] - t[rows[ok]])
    return out


def _first_table(ctx: _Episodes, codes: tuple[int, int, int], g: float,
                 shield: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The first element's 2x2 table (k1, n1, k0, n0) over every B in the history.

    Exposed: an A within g before the B; unexposed: no A before it at any allowed gap (a B
    with an A only farther back counts on neither side). Outcome: C within g after the B.
    A B that one of ``shield`` preceded within g counts on neither side: ``shield`` holds
    the first codes of accepted rules X...B...C, and such a B is explained by X. Where
    rules share B...C this keeps X's cases from counting as "B...C without A" (which would
    credit neither rule with C); it also takes them from A's side, so a code that merely
    rides along with X's rule keeps no evidence of its own.

    Not stratified by where the B sits in its episode: quarters of the episode's span
    were tried against codes planted at a fixed mission phase (the rounds' histories) and
    left strata without unexposed Bs, where the element then stood on nothing; more such
    riders passed (3 of 9 replayed histories against 1).
    """
    a, b, c = codes
    rows = ctx.rows_of(b)
    before = _gap_to(ctx, a, rows, after=False)
    explained = np.zeros(rows.size, bool)
    for x in shield:
        explained |= _gap_to(ctx, x, rows, after=False) <= g
    near = (before <= g) & ~explained
    unexposed = np.isinf(before) & ~explained
    followed = _gap_to(ctx, c, rows, after=True) <= g
    return (int(np.count_nonzero(near & followed)), int(np.count_nonzero(near)),
            int(np.count_nonzero(unexposed & followed)), int(np.count_nonzero(unexposed)))


ROOM_STRATA = 4
"""Bands of g/4 of room left after an occurrence (plus one for g or more)."""


def _room_strata(room: np.ndarray, g: float) -> np.ndarray:
    """Stratum of each room value: floor(4 room / g), capped at ROOM_STRATA."""
    if not math.isfinite(g) or g <= 0:
        return np.full(np.shape(room), ROOM_STRATA, np.int64)
    return np.minimum((np.asarray(room) * ROOM_STRATA / g).astype(np.int64), ROOM_STRATA)


def _per_stratum(ctx: _Episodes, code: int, g: float) -> np.ndarray:
    """Occurrences of ``code`` per room stratum (room: how much of the episode is left)."""
    rows = ctx.rows_of(code)
    last = ctx.log.time[ctx.start[ctx.log.episode[rows] + 1] - 1]
    return np.bincount(_room_strata(last - ctx.log.time[rows], g), minlength=ROOM_STRATA + 1)


def _stratified_greater(k1: np.ndarray, n1: np.ndarray, k0: np.ndarray, n0: np.ndarray,
                        alpha: float) -> tuple[float, bool]:
    """Exact stratified one-sided p-value, and whether it can reach ``alpha``.

    Tarone's reachability as in ``_fisher_greater``. Conditional on each stratum's
    margins, k1 in stratum s is hypergeometric; the strata
    are independent, so the distribution of their sum is the convolution of those laws.
    """
    from scipy.stats import hypergeom

    dist = np.ones(1)
    best = 1.0
    observed = 0
    for a1, m1, a0, m0 in zip(k1.tolist(), n1.tolist(), k0.tolist(), n0.tolist(),
                              strict=True):
        total, successes = m1 + m0, a1 + a0
        if m1 <= 0 or m0 <= 0 or successes <= 0:
            continue  # no comparison in this stratum
        lo, hi = max(0, successes - m0), min(successes, m1)
        pmf = hypergeom.pmf(np.arange(hi + 1), total, successes, m1)
        pmf[:lo] = 0.0
        dist = np.convolve(dist, pmf)
        best *= float(pmf[hi])
        observed += a1
    if dist.size == 1 or best > alpha:
        return 1.0, False
    return float(min(1.0, dist[observed:].sum())), True


def _pair_binding(ctx: _Episodes, codes: tuple[int, int]) -> tuple[float, bool]:
    """A...B in A's episodes against B's presence in the episodes without A (Fisher).

    With whether the table can reach the level at all (not when A is in nearly every
    episode, or B too rare). It reads only the log, so it is worked out once per pair.
    """
    if codes not in ctx.bindings:
        ctx.bindings[codes] = _pair_binding_of(ctx, codes)
    return ctx.bindings[codes]


def _pair_binding_of(ctx: _Episodes, codes: tuple[int, int]) -> tuple[float, bool]:
    a, b = codes
    n_a = int(ctx.code_start[a + 1] - ctx.code_start[a])
    n_b = int(ctx.code_start[b + 1] - ctx.code_start[b])
    both = _episodes_with(ctx, codes)
    g = float(ctx.scales[-1])
    ab = 0
    for e in both.tolist():
        t, _, pos = _episode_slots(ctx, e, codes)
        ab += _fits_any(t, pos[0], pos[1], g, ctx.cfg)
    return _rate_greater(ab, n_a, n_b - int(both.size), ctx.n_ep - n_a, ctx.cfg.alpha)


def _contrast_p(ctx: _Episodes, codes: tuple[int, ...], g: float, counts: _Contrast | None,
                ab: tuple[float, bool] | None = None) -> tuple[tuple[float, ...], bool]:
    """Per element, the evidence that it adds to the pattern; whether A could be judged.

    Returned: a p-value per element, and whether the first element of a triple could be
    judged at all (True for a pair).

    Two kinds of evidence, either enough (Bonferroni over the two: twice the smaller
    p-value). The element's contrast: the pattern completes more often with it than in real
    cases without it; it needs such cases, and with only a handful of them one chance
    completion refutes a real rule. Or its binding to its neighbours: B follows A in A's
    episodes more often than B turns up in the episodes without A (the first element: A to
    B; the middle one: A to B and B to C); an element independent of its neighbours is not
    bound to them. A test that cannot reach the level whatever its counts (Tarone) is no
    evidence either way and is left out; when neither can, the history is too small to
    judge the element against real cases (a few missions). The middle element then stands
    on the within-episode tests alone (0 here; the pattern's ``reasons`` stay empty of it).
    The first element does not: it waits for more evidence (1 here, and False). A code at
    a fixed phase of nearly every mission, in front of a natural pair B...C, has no Bs
    without it to be compared with and cannot be bound to a B that turns up everywhere, and
    its phase fools the within-episode tests; in 9 replayed round histories such riders
    were promoted in 5, in 3 once they had to wait, with every planted rule still promoted
    in its round and every exp6 cell unchanged. A pair has only its binding, and an
    untestable one is refused: a pair has no other element test to stand on.
    """
    if len(codes) == 2:
        p, ok = _pair_binding(ctx, (codes[0], codes[1]))
        return (p if ok else 1.0,), True
    a, b, c = codes
    ab = _pair_binding(ctx, (a, b)) if ab is None else ab  # the caller may have it already
    first = _rate_greater(*_first_table(ctx, (a, b, c), g, ()), ctx.cfg.alpha)
    middle = _stratified_greater(*counts.middle_tables(_per_stratum(ctx, a, g)),
                                 ctx.cfg.alpha)
    bc = _pair_binding(ctx, (b, c))
    return ((_either(first, ab, unjudged=1.0), _either(middle, _both_bound(ab, bc))),
            first[1] or ab[1])


REFUTED_ABOVE = 0.5
"""A testable binding with a p-value above this says the element is not bound (its point
estimate goes the wrong way), which is evidence, not its absence."""


def _both_bound(ab: tuple[float, bool], bc: tuple[float, bool]) -> tuple[float, bool]:
    """The middle element's binding: bound to A and to C, both (an intersection-union test).

    Testable only when both parts are, except that one testable part that is refuted
    (p above ``REFUTED_ABOVE``) settles it: the conjunction cannot hold. A code planted in
    one rule's missions sat between a natural pair (door_open ... door_close) in the
    rounds' first history: its contrast and its binding to door_close could not be judged
    on 48 missions, and it stood on the within-episode tests, although door_open is
    followed by it no more often than anywhere else (binding p 0.9998).
    """
    if ab[1] and bc[1]:
        return max(ab[0], bc[0]), True
    refuted = [p for p, ok in (ab, bc) if ok and p > REFUTED_ABOVE]
    return (max(refuted), True) if refuted else (max(ab[0], bc[0]), False)


def _either(contrast: tuple[float, bool], binding: tuple[float, bool],
            unjudged: float = 0.0) -> float:
    """Twice the smaller of two testable p-values, or the testable one alone.

    ``unjudged`` when neither is testable: 0, the element stands on the other tests; 1, it
    waits for more evidence.
    """
    usable = [p for p, ok in (contrast, binding) if ok]
    if not usable:
        return unjudged
    return min(1.0, len(usable) * min(usable))
