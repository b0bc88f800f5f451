"""Cross-experience discovery of long-range ordered relations A...B...C and A...B.

``docs/discovery.md`` gives the reasoning and the measured figures; in short, four steps,
every statistic a sum over episodes (counts and null expectations), so a history split into
partitions can be scored from per-partition sums.

1. Candidates. For every episode, every ordered triple of DISTINCT codes (a, b, c) that
   occurs as slots i < j < k with each step's gap in [min_gap, max_gap] (and at most
   ``max_lookback`` events apart) is recorded once per episode, with its tightest
   occurrence: m_e = min over occurrences of max(t_j - t_i, t_k - t_j). Only the nearest
   a before and the nearest c after each b can be tightest, so an episode yields at most
   n * u^2 rows (n events, u distinct codes) however often a code repeats; a triple whose
   pairs (a, b) or (b, c) occur in fewer than ``candidate_support`` episodes is never built.

2. Significance (family-wide, FDR). Null hypothesis: within each episode the codes are
   arranged at random over that episode's own time slots (the episode's multiset of codes
   and its timing are kept; which code sits in which slot is random). Under it, episode e
   holds the pattern at scale g with probability p_e(g) <= k_a k_b k_c T_e(g) / n(n-1)(n-2)
   (k_x copies of each code, T_e(g) slot triples whose two gaps fit in [min_gap, g]); at
   g = infinity with min_gap = 0 p_e is exact (a small dynamic programme over the copies).
   Scales: ``scales`` times the median gap between consecutive events (a sqrt(2) ladder),
   plus max_gap. An episode's level is the number of scales its tightest occurrence fits
   in, P(level >= l) is p_e at the l-th largest scale, and the episode scores the surprise
   of its level in bits, Z_e = floor(-log2 P(level >= l)) (0 when absent): a tight, rare
   occurrence weighs far more than a chance frame that merely holds the pattern somewhere.
   The map from level to bits depends only on the null probabilities, episodes are
   independent, so the exact upper tail of Z = sum_e Z_e (a dynamic programme; a Chernoff
   bound where that would be too large) is a p-value - no permutation floor, no
   Bonferroni over scales. The same tail of the summed level itself (suits short missions
   where a rule's and a chance frame's tails differ by less than a bit) is the second
   statistic; the pattern's p-value is twice the smaller of the two.
   Family: every ordered pattern whose codes co-occur in >= ``accept_support`` episodes,
   less Tarone's untestable ones (smallest achievable p-value above the level);
   Benjamini-Hochberg at q = ``alpha``, weighted (mean weight 1) by how much more often the
   code set co-occurs than independent codes would - a statistic of the multisets the null
   holds fixed, so the weights keep the FDR guarantee while bringing in the between-episode
   evidence the within-episode test cannot see.

3. Per-pattern checks on the significant set, each an exact conditional test; Holm's
   step-down at ``alpha`` over that set on the largest of their p-values:
   - order: given where the pattern's codes sit in an episode, the labels a/b/c are
     permuted among those slots; the forward order must win more often than that allows
     (A...B...C against B...A...C, A...C...B and the rest at once);
   - each element adds: with the other two codes where they are, the element's own
     occurrences are treated as landing on slots at its base rate f_x (its share of all
     events): P(x on one of the m_e slots that would complete the pattern) =
     1 - (1 - f_x)^m_e. C must follow A...B more often than C's base rate allows (kills a
     real pair A...B plus a common C), B must sit between A and C more often than chance
     (kills a heartbeat or a frequent middle), A must precede B...C (kills Y...B...C);
   - productivity (Webb): each element needs evidence that position alone cannot earn
     (the tests above take slots as exchangeable, so a code at a fixed phase of most
     episodes gains from its position): its contrast with real cases without it (first
     element: C follows a B that A preceded more often than a B no A preceded; middle
     element: the pattern completes from an A followed by B more often than C follows an A
     no B followed, stratified by the room left in the episode) or its binding to its
     neighbours (B follows A in A's episodes more often than B turns up without A), twice
     the smaller p-value (Fisher's exact test, refined by Boschloo's where borderline); a
     test that cannot reach the level is no evidence and is left out, and with neither the
     element stands on the tests above (a pair is then refused); rules that share B...C
     shield each other's cases from the first element's "without" side;
   - stability: support in >= ``min_partitions`` temporal partitions, no partition holding
     more than ``max_partition_share`` of it (a burst is not a regularity);
   - support >= ``accept_support`` and confidence >= ``min_confidence``.

4. Redundancy (self-sufficiency). Triples are taken strongest first (their weakest
   p-value); the episodes where a stronger accepted triple sharing two codes occurs are
   removed, and the triple must stay significant at the family cutoff on what is left
   (unless the stronger one is explained by it in turn and weaker family-wide: then the
   stronger one gives way).
   Accepted pairs inside an accepted triple are folded into it. Relations are predictive
   regularities, never causes.

Relation fields are measured at the scale g* where the checks run: the scale where the
pattern's support is most surprising, widened while a wider finite scale holds more cases
at nearly the same surprise (``_check_scale``): support, antecedent (A...B within g*),
confidence = support / antecedent, gaps (``max_gap`` = g*). ``scored`` holds every
pattern with p <= alpha before correction, with the reasons it was or was not accepted.
"""

from __future__ import annotations

import itertools
import math
import time as _time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cache

import numpy as np

from thinkmem_ros.consolidator.bucket_files import BucketFiles, ParkedArray
from thinkmem_ros.consolidator.engine import (
    EmbeddedEngine,
    ordered_map,
    release_free_memory,
)
from thinkmem_ros.consolidator.key_tally import KeyTally


@dataclass
class DiscoveryConfig:
    """Temporal constraints, candidate thresholds, scales and the error-control level."""

    min_gap: float = 0.0  # each consecutive step A->B, B->C must satisfy min_gap <= dt
    max_gap: float = math.inf  # ... and dt <= max_gap ("local" ablation: small)
    candidate_support: int = 2  # episodes a pair needs before triples are built on it
    accept_support: int = 3  # supporting episodes a relation needs (also: testable family)
    alpha: float = 0.02  # FDR level q (Benjamini-Hochberg), family-wide and per check
    permutations: int = 0  # unused: p-values are analytic (kept so older configs load)
    min_confidence: float = 0.0  # the lift tests replace an absolute confidence floor
    min_partitions: int = 2
    max_partition_share: float = 0.75
    pairs: bool = True
    # x median gap: a sqrt(2) ladder from 1/8 to 64 (a coarser one loses a frame up to a
    # factor 4 of evidence between two rungs; a finer one measured no better)
    scales: tuple[float, ...] = tuple(2.0 ** (k / 2) for k in range(-6, 13))
    max_lookback: int = 256  # events between two steps of a pattern, at most
    max_checked: int = 2000  # significant patterns examined in step 3 (strongest first)
    # a log with more events is scanned in parts of about this many events (whole episodes):
    # the candidate tests then hold one part's pairs and triples at a time, not the log's;
    # 0 = always one pass over the whole log
    part_events: int = 50_000
    # the pair family's frames (episodes x orders each code pair's test reads), at most
    # this many per event of the log, and never fewer than ``min_family_frames``: past it
    # the pairs whose co-occurrence is most surprising are kept (a statistic the null
    # holds fixed, so the error control stays valid); 0 = every co-occurring pair
    family_frames_per_event: float = 2.0
    min_family_frames: int = 2_000_000

    def __post_init__(self) -> None:
        if self.min_gap < 0 or self.max_gap < self.min_gap:
            raise ValueError(f"need 0 <= min_gap <= max_gap, got {self.min_gap}, {self.max_gap}")
        if self.candidate_support < 1:
            raise ValueError(f"candidate_support must be >= 1, got {self.candidate_support}")
        if self.accept_support < self.candidate_support:
            raise ValueError(f"accept_support {self.accept_support} must be >= "
                             f"candidate_support {self.candidate_support}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.permutations < 0:
            raise ValueError(f"permutations must be >= 0, got {self.permutations}")
        if not 0 <= self.min_confidence <= 1:
            raise ValueError(f"min_confidence must be in [0, 1], got {self.min_confidence}")
        if self.min_partitions < 1:
            raise ValueError(f"min_partitions must be >= 1, got {self.min_partitions}")
        if not 0 < self.max_partition_share <= 1:
            raise ValueError(f"max_partition_share must be in (0, 1], got "
                             f"{self.max_partition_share}")
        self.scales = tuple(float(s) for s in self.scales)
        if any(not s > 0 for s in self.scales):
            raise ValueError(f"scales must be > 0, got {self.scales}")
        if self.part_events < 0:
            raise ValueError(f"part_events must be >= 0, got {self.part_events}")
        if self.family_frames_per_event < 0 or self.min_family_frames < 0:
            raise ValueError(f"family_frames_per_event and min_family_frames must be >= 0, "
                             f"got {self.family_frames_per_event}, {self.min_family_frames}")
        if self.max_lookback < 1 or self.max_checked < 1:
            raise ValueError(f"max_lookback and max_checked must be >= 1, got "
                             f"{self.max_lookback}, {self.max_checked}")


@dataclass
class EventLog:
    """Events of many episodes as flat arrays sorted by (episode, time)."""

    episode: np.ndarray  # (N,) int64 row index 0..E-1 into episode_ids/partition
    time: np.ndarray  # (N,) float64, time within the episode
    code: np.ndarray  # (N,) int64, index into codes
    partition: np.ndarray  # (E,) int64 temporal partition of each episode
    episode_ids: np.ndarray  # (E,) int64 experience/episode identifiers
    codes: tuple[str, ...]

    @property
    def n_codes(self) -> int:
        """Size of the event vocabulary."""
        return len(self.codes)

    @property
    def n_partitions(self) -> int:
        """Number of temporal partitions (max index + 1)."""
        return int(self.partition.max()) + 1 if self.partition.size else 0

    @classmethod
    def from_episodes(cls, episodes: Iterable, codes: tuple[str, ...] | None = None
                      ) -> EventLog:
        """Build from objects with ``episode_id``, ``partition`` and ``events`` [(t, name)]."""
        episodes = list(episodes)
        if codes is None:
            codes = tuple(sorted({name for ep in episodes for _, name in ep.events}))
        lookup = {name: i for i, name in enumerate(codes)}
        rows, times, ids = [], [], []
        for row, ep in enumerate(episodes):
            ordered = sorted(ep.events, key=lambda e: e[0])
            rows += [row] * len(ordered)
            times += [float(t) for t, _ in ordered]
            try:
                ids += [lookup[name] for _, name in ordered]
            except KeyError as err:
                raise ValueError(f"event {err.args[0]!r} of episode {ep.episode_id} is not "
                                 f"in the event vocabulary") from None
        return cls(episode=np.asarray(rows, dtype=np.int64),
                   time=np.asarray(times, dtype=np.float64),
                   code=np.asarray(ids, dtype=np.int64),
                   partition=np.asarray([ep.partition for ep in episodes], dtype=np.int64),
                   episode_ids=np.asarray([ep.episode_id for ep in episodes], dtype=np.int64),
                   codes=tuple(codes))

    def with_codes(self, code: np.ndarray) -> EventLog:
        """The same slots (episodes, times) holding other codes."""
        return EventLog(self.episode, self.time, np.asarray(code, dtype=np.int64),
                        self.partition, self.episode_ids, self.codes)

    def slice(self, first: int, last: int) -> EventLog:
        """Episodes ``first`` .. ``last - 1`` (renumbered from 0): a view, no copy of events."""
        lo, hi = np.searchsorted(self.episode, [first, last])
        return EventLog(self.episode[lo:hi] - first, self.time[lo:hi], self.code[lo:hi],
                        self.partition[first:last], self.episode_ids[first:last], self.codes)

    def select(self, rows: np.ndarray) -> EventLog:
        """Only the episodes whose row index is in ``rows`` (renumbered, order kept)."""
        rows = np.asarray(rows, dtype=np.int64)
        keep = np.isin(self.episode, rows)
        remap = np.full(len(self.episode_ids), -1, dtype=np.int64)
        remap[rows] = np.arange(len(rows))
        return EventLog(remap[self.episode[keep]], self.time[keep], self.code[keep],
                        self.partition[rows], self.episode_ids[rows], self.codes)


@dataclass(frozen=True)
class Relation:
    """A scored candidate: ordered pattern plus every piece of evidence for and against."""

    pattern: tuple[str, ...]
    support: int
    antecedent_support: int
    reverse: int
    partition_support: tuple[int, ...]
    p_value: float
    accepted: bool
    reasons: tuple[str, ...]  # failed acceptance clauses, empty when accepted
    episodes: tuple[int, ...]  # supporting episode ids (E_j)
    gaps: tuple[tuple[float, float], ...]  # observed (min, max) gap per step
    middle_lift: float = math.nan  # triples: B between A and C, observed / base-rate expected
    max_gap: float = math.inf  # the scale g* the evidence was measured at
    expected: float = math.nan  # support expected under the within-episode null at g*
    p_order: float = math.nan  # order test (labels permuted among the pattern's slots)
    p_adds: tuple[float, ...] = ()  # per element: does it add to the rest (base-rate test)
    p_contrast: tuple[float, ...] = ()  # per element: against the pattern without it

    @property
    def relation(self) -> str:
        """Relation type: ``sequence3`` (A...B...C) or ``sequence2`` (A...B)."""
        return f"sequence{len(self.pattern)}"

    @property
    def counterexamples(self) -> int:
        """Antecedent episodes the consequence did not follow."""
        return self.antecedent_support - self.support

    @property
    def confidence(self) -> float:
        """Share of antecedent episodes followed by the consequence."""
        return self.support / self.antecedent_support if self.antecedent_support else 0.0

    @property
    def thinking(self) -> str:
        """Thinking requirement the relation induces: consider the consequence early."""
        return f"consider:{self.pattern[-1]}"


@dataclass
class DiscoveryResult:
    """Candidates, scored relations and the accepted set, with the family sizes used."""

    accepted: list[Relation]
    scored: list[Relation]  # patterns nominally significant (p <= alpha), with all evidence
    candidates: dict[int, np.ndarray]  # length -> encoded keys of the over-complete set
    null_max: dict[int, np.ndarray]  # unused since the tests are analytic (kept for callers)
    config: DiscoveryConfig
    n_events: int
    n_episodes: int
    seconds: float = 0.0
    codes: tuple[str, ...] = ()
    notes: dict = field(default_factory=dict)

    def candidate_set(self, length: int) -> set[tuple[str, ...]]:
        """Decoded over-complete candidate patterns of ``length`` codes (can be large)."""
        v = len(self.codes)
        return {tuple(self.codes[c] for c in _decode(int(k), length, v))
                for k in self.candidates.get(length, np.zeros(0, np.int64))}

    def is_candidate(self, pattern: tuple[str, ...]) -> bool:
        """Whether ``pattern`` reached the candidate stage (no full decode)."""
        lookup = {name: i for i, name in enumerate(self.codes)}
        if any(p not in lookup for p in pattern):
            return False
        key = 0
        for p in pattern:
            key = key * len(self.codes) + lookup[p]
        keys = self.candidates.get(len(pattern), np.zeros(0, np.int64))
        pos = np.searchsorted(keys, key)
        return bool(pos < keys.size and keys[pos] == key)

    def accepted_patterns(self, length: int | None = None) -> set[tuple[str, ...]]:
        """Accepted patterns, optionally only those of ``length`` codes."""
        return {r.pattern for r in self.accepted if length is None or len(r.pattern) == length}


def _decode(key: int, length: int, v: int) -> tuple[int, ...]:
    out = []
    for _ in range(length):
        out.append(key % v)
        key //= v
    return tuple(reversed(out))


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


def _score_tail(pes: list[np.ndarray], z: np.ndarray, bits: bool = True) -> np.ndarray:
    """Exact P(sum of frame scores >= z) under the null, one problem per list item.

    Item i is an (F_i, S) array of its frames' null probabilities per scale (as
    ``_null_probs`` returns them); a frame's level l = 0..S has probability
    P(level >= l) - P(level >= l + 1) and scores ``_level_scores`` steps. The distribution
    of the running sum below z is tracked explicitly and the mass that reaches z is
    accumulated, so tiny tails keep full relative precision. Each frame shifts the running
    distribution once per score some problem of the batch can take there (not once per
    possible score). ``bits=False``: a frame scores its level itself (the level count).
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
        tail += (law[:, values] * np.take_along_axis(above, at, axis=1)).sum(axis=1)
        new = np.zeros((n, top))
        for d in values.tolist():
            if d < top:
                new[:, d:] += dist[:, :top - d] * law[:, d:d + 1]
        dist = new * live
    out[:] = np.minimum(tail, 1.0)
    return out


# ------------------------------------------------------------------------------ helpers
def _group_min(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique keys (sorted) and the smallest value of each."""
    order = np.argsort(keys)
    keys, values = keys[order], values[order]
    if keys.size == 0:
        return keys, values
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    return keys[starts], np.minimum.reduceat(values, starts)


def _counts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique sorted keys and their counts (one sort)."""
    if keys.size == 0:
        return keys, np.zeros(0, np.int64)
    keys = np.sort(keys)
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    return keys[starts], np.diff(np.concatenate((starts, [keys.size])))


LOOKUP_BLOCK = 1 << 21
"""Queries looked up at once: a fleet log's ~2x10^7 candidates at once made five
temporaries of their size (0.7 GB), the peak of its whole discovery."""


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray, default=0):
    """values[key] for each query key (keys sorted), ``default`` where absent."""
    query = np.asarray(query)
    values = np.asarray(values)
    if keys.size == 0:
        return np.full(query.shape, default, dtype=values.dtype)
    if query.ndim != 1 or query.size <= LOOKUP_BLOCK:
        pos = _positions(keys, query)
        return np.where(keys[pos] == query, values[pos], default)
    out = np.empty(query.size, np.result_type(values.dtype, np.asarray(default).dtype))
    for lo in range(0, query.size, LOOKUP_BLOCK):
        block = query[lo:lo + LOOKUP_BLOCK]
        pos = _positions(keys, block)
        out[lo:lo + block.size] = np.where(keys[pos] == block, values[pos], default)
    return out


BITMAP_KEYS = 1 << 26  # key ranges up to this are looked up in a bitmap (<= 64 MB)


def _member(sorted_keys: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Elementwise ``query in sorted_keys`` (keys sorted, unique, >= 0).

    Pair keys (< V^2) are looked up in a bitmap: a binary search per query over millions of
    keys misses the cache on every step, and this runs for every slot pair of the log.
    """
    query = np.asarray(query)
    if sorted_keys.size == 0:
        return np.zeros(query.shape, bool)
    top = int(sorted_keys[-1])
    if top < BITMAP_KEYS and query.size * 64 > top:
        bitmap = np.zeros(top + 1, bool)
        bitmap[sorted_keys] = True
        inside = (query >= 0) & (query <= top)
        out = np.zeros(query.shape, bool)
        out[inside] = bitmap[query[inside]]
        return out
    pos = _positions(sorted_keys, query)
    return sorted_keys[pos] == query


def _positions(sorted_keys: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``searchsorted`` clipped to valid indices; large random queries are searched sorted.

    Sorted queries let each search start where the last one ended: 4-5x faster on millions
    of keys, where a random binary search misses the cache at every step.
    """
    if query.ndim == 1 and query.size > 4096 and sorted_keys.size > 65536:
        order = np.argsort(query)
        pos = np.empty(query.size, np.int64)
        pos[order] = np.searchsorted(sorted_keys, query[order])
    else:
        pos = np.searchsorted(sorted_keys, query)
    return np.clip(pos, 0, sorted_keys.size - 1)


def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For groups of ``counts`` items: (group index, offset within group) per item."""
    total = int(counts.sum())
    group = np.repeat(np.arange(counts.size), counts)
    offset = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    return group, offset


class _Episodes:
    """Per-episode slot structure: pairs within the gap window, presence, slot counts."""

    def __init__(self, log: EventLog, cfg: DiscoveryConfig, *, pairs: bool = True,
                 whole: _Episodes | None = None) -> None:
        """Index ``log``; see the flags for a log scanned in parts.

        ``pairs=False``: no slot pairs (the O(events) index the checks need, for a log
        scanned in parts); ``whole``: this log is a part of ``whole``'s and takes its
        median gap, scales and completeness, so per-episode sums match a whole-log pass.
        """
        self.log, self.cfg = log, cfg
        self.pass_s: dict[str, float] = {}  # seconds per pass of a scan in parts
        self.family: dict[str, float] = {}  # the pair family's budget, when it bound
        # each ordered code pair's binding test (``_pair_binding``), asked for by every
        # triple that holds the pair: hundreds of checks share a few dozen pairs
        self.bindings: dict[tuple[int, int], tuple[float, bool]] = {}
        self.n_ep = len(log.episode_ids)
        self.v = log.n_codes
        ep, t = log.episode, log.time
        self.start = np.searchsorted(ep, np.arange(self.n_ep + 1))
        self.n = np.diff(self.start)
        n = ep.size
        if whole is None:
            gaps = np.diff(t)[ep[1:] == ep[:-1]] if n > 1 else np.zeros(0)
            positive = gaps[gaps > 0]
            self.delta = float(np.median(positive)) if positive.size else 1.0
            del gaps, positive
        else:
            self.delta = whole.delta
        longest = int(self.n.max()) if self.n.size else 0
        self.complete = longest <= cfg.max_lookback if whole is None else whole.complete
        scales = sorted({s * self.delta for s in cfg.scales if s * self.delta < cfg.max_gap}
                        | {cfg.max_gap})
        self.scales = np.asarray(scales, np.float64)
        self.t2 = np.zeros((self.n_ep, self.scales.size))
        self.t3 = np.zeros((self.n_ep, self.scales.size))
        if pairs:
            self._slot_pairs(longest)
        self._index_codes()

    def _slot_pairs(self, longest: int) -> None:
        """Slot pairs within the gap window, and per episode the slot-pair/triple counts."""
        log, cfg = self.log, self.cfg
        ep, t, n = log.episode, log.time, log.episode.size
        out_i, out_j = [], []
        for d in range(1, min(longest, cfg.max_lookback + 1)):
            i = np.arange(n - d)
            j = i + d
            same = ep[i] == ep[j]
            gap = t[j] - t[i]
            within = same & (gap <= cfg.max_gap)
            if not within.any():
                break
            ok = within & (gap >= cfg.min_gap)
            out_i.append(i[ok])
            out_j.append(j[ok])
        self.pi = np.concatenate(out_i) if out_i else np.zeros(0, np.int64)
        self.pj = np.concatenate(out_j) if out_j else np.zeros(0, np.int64)
        self.pgap = t[self.pj] - t[self.pi]
        # slot-pair and slot-triple counts per episode and scale (code-independent)
        for s, g in enumerate(self.scales):
            sel = self.pgap <= g
            left = np.bincount(self.pj[sel], minlength=n).astype(np.float64)
            right = np.bincount(self.pi[sel], minlength=n).astype(np.float64)
            self.t2[:, s] = np.bincount(ep, weights=left, minlength=self.n_ep)
            self.t3[:, s] = np.bincount(ep, weights=left * right, minlength=self.n_ep)

    def _index_codes(self) -> None:
        """Which codes each episode holds and where each code sits (what the checks read)."""
        log = self.log
        ep, n = log.episode, log.episode.size
        # code presence: key = episode * V + code, with copies per episode
        self.pres_key, self.pres_count = _counts(ep * self.v + log.code)
        by_code = np.argsort(self.pres_key % self.v, kind="stable")
        self.code_episodes = (self.pres_key // self.v)[by_code]  # sorted within a code
        self.code_start = np.searchsorted((self.pres_key % self.v)[by_code],
                                          np.arange(self.v + 1))
        self.code_total = np.bincount(log.code, minlength=self.v)
        self.freq = self.code_total.astype(np.float64) / max(n, 1)
        by_code_rows = np.argsort(log.code, kind="stable")  # rows ascending within a code
        self._code_rows = by_code_rows
        self._code_row_start = np.searchsorted(log.code[by_code_rows], np.arange(self.v + 1))
        self._order_key: np.ndarray | None = None

    @property
    def order_key(self) -> np.ndarray:
        """A time that ascends over the whole log (episode after episode).

        Built on first use: only a positive ``min_gap`` needs it.
        """
        if self._order_key is None:
            t, ep, n = self.log.time, self.log.episode, self.log.episode.size
            span = float(t.max() - t.min()) + self.cfg.min_gap + 1.0 if n else 1.0
            self._order_key = (t - (t.min() if n else 0.0)) + ep * span
        return self._order_key

    def rows_of(self, code: int) -> np.ndarray:
        """Log rows holding ``code``, ascending."""
        return self._code_rows[self._code_row_start[code]:self._code_row_start[code + 1]]

    def copies(self, episodes: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Copies of ``codes`` in ``episodes`` (elementwise)."""
        return _lookup(self.pres_key, self.pres_count, episodes * self.v + codes)

    def exact_infinite(self) -> bool:
        """Whether p_e at the largest scale has the exact closed form."""
        return (self.cfg.min_gap == 0 and math.isinf(self.cfg.max_gap) and self.complete)


# --------------------------------------------------------------------------- candidates
def _pair_rows(ctx: _Episodes) -> dict:
    """Per (episode, ordered code pair): the tightest gap, plus each code pair's support."""
    log, v = ctx.log, ctx.v
    ci, cj = log.code[ctx.pi], log.code[ctx.pj]
    keep = ci != cj
    key = ci[keep] * v + cj[keep]
    gap = ctx.pgap[keep]
    ep = log.episode[ctx.pi[keep]]
    # one row per (episode, key) with its tightest gap: one sort of a combined key
    combined = ep * (v * v) + key
    order = np.argsort(combined)
    combined, gap = combined[order], gap[order]
    starts = np.flatnonzero(np.concatenate(([True], combined[1:] != combined[:-1]))) \
        if combined.size else np.zeros(0, np.int64)
    uniq = combined[starts]
    rows = {"ep": uniq // (v * v), "key": uniq % (v * v),
            "m": np.minimum.reduceat(gap, starts) if gap.size else gap}
    rows["uk"], rows["support"] = _counts(rows["key"])
    return rows


def _neighbours(ctx: _Episodes, frequent: np.ndarray) -> tuple[dict, dict]:
    """Nearest a before and nearest c after each slot j, per code, with (a, b) frequent."""
    log, v = ctx.log, ctx.v
    ci, cj = log.code[ctx.pi], log.code[ctx.pj]
    keep = (ci != cj) & _member(frequent, ci * v + cj)
    pi, pj, gap = ctx.pi[keep], ctx.pj[keep], ctx.pgap[keep]
    # left: for slot j and code a, the latest i (smallest gap)
    lk, lgap = _group_min(pj * v + log.code[pi], gap)
    # right: for slot i and code c, the earliest j
    rk, rgap = _group_min(pi * v + log.code[pj], gap)
    return ({"slot": lk // v, "code": lk % v, "gap": lgap},
            {"slot": rk // v, "code": rk % v, "gap": rgap})


def _triple_slots(ctx: _Episodes, left: dict, right: dict, with_gaps: bool
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (nearest a, middle slot j, nearest c) combination of distinct codes.

    Returns (episode, triple key, largest step gap) per combination, in ascending episode
    order (the gaps are empty unless ``with_gaps``).
    """
    log, v = ctx.log, ctx.v
    # group left by middle slot j; right (entries with slot == j) by j
    lo = np.argsort(left["slot"], kind="stable")
    ro = np.argsort(right["slot"], kind="stable")
    n = log.code.size
    lcount = np.bincount(left["slot"], minlength=n)
    rcount = np.bincount(right["slot"], minlength=n)
    lstart = np.concatenate(([0], np.cumsum(lcount)))
    rstart = np.concatenate(([0], np.cumsum(rcount)))
    pairs = lcount * rcount
    mids = np.flatnonzero(pairs)
    if mids.size == 0:
        z = np.zeros(0, np.int64)
        return z, z, np.zeros(0)
    g, off = _expand(pairs[mids])
    j = mids[g]
    del g
    li = lo[lstart[j] + off // rcount[j]]
    ri = ro[rstart[j] + off % rcount[j]]
    del off
    a, c = left["code"][li], right["code"][ri]
    ok = a != c
    j, a, c = j[ok], a[ok], c[ok]
    m = np.maximum(left["gap"][li[ok]], right["gap"][ri[ok]]) if with_gaps else np.zeros(0)
    del li, ri, ok
    return log.episode[j], (a * v + log.code[j]) * v + c, m


def _episode_key_order(ep: np.ndarray, key: np.ndarray, span: int) -> np.ndarray:
    """Order of rows by (episode, key), ``ep`` non-decreasing and keys below ``span``.

    One sort of a combined integer where it fits in 63 bits (3-10x faster than a lexsort
    of millions of rows), a lexsort otherwise.
    """
    if ep.size == 0:
        return np.zeros(0, np.int64)
    combined = _combined_key(ep, key, span)
    return np.argsort(combined) if combined is not None else np.lexsort((key, ep))


def _combined_key(ep: np.ndarray, key: np.ndarray, span: int) -> np.ndarray | None:
    """(episode - first episode) * span + key, or None where it would not fit in 63 bits."""
    base = int(ep[0])
    if (int(ep[-1]) - base + 1) * span < 2 ** 62:
        return (ep - base) * span + key
    return None


def _triple_rows(ctx: _Episodes, left: dict, right: dict) -> dict:
    """Per (episode, ordered triple of distinct codes): the tightest largest step gap."""
    ep, key, m = _triple_slots(ctx, left, right, with_gaps=True)
    order = _episode_key_order(ep, key, ctx.v ** 3)
    ep, key, m = ep[order], key[order], m[order]
    starts = np.flatnonzero(np.concatenate(([True], (ep[1:] != ep[:-1])
                                            | (key[1:] != key[:-1])))) \
        if ep.size else np.zeros(0, np.int64)
    rows = {"ep": ep[starts], "key": key[starts],
            "m": np.minimum.reduceat(m, starts) if m.size else m}
    rows["uk"], rows["support"] = _counts(rows["key"])
    return rows


def _triple_support_keys(ctx: _Episodes, left: dict, right: dict) -> np.ndarray:
    """Triple keys once per episode that holds them (what a support count needs): no gaps."""
    ep, key, _ = _triple_slots(ctx, left, right, with_gaps=False)
    if ep.size == 0:
        return key
    span = ctx.v ** 3
    combined = _combined_key(ep, key, span)
    if combined is not None:
        del ep, key
        combined.sort()  # a plain sort: no order array needed, only distinct values
        distinct = np.concatenate(([True], combined[1:] != combined[:-1]))
        return combined[distinct] % span
    order = np.lexsort((key, ep))
    ep, key = ep[order], key[order]
    return key[np.concatenate(([True], (ep[1:] != ep[:-1]) | (key[1:] != key[:-1])))]


def _presence_pairs(ctx: _Episodes) -> tuple[np.ndarray, ...]:
    """Per episode, every pair of the distinct codes it holds, as presence-row indices.

    Returns (episode of each presence row, its code, first row, second row, each row's
    episode end); rows of one episode are consecutive and ordered by code.
    """
    v = ctx.v
    ep, code = ctx.pres_key // v, ctx.pres_key % v
    starts = np.searchsorted(ep, np.arange(ctx.n_ep + 1))
    ends = starts[1:][ep] if ep.size else np.zeros(0, np.int64)
    g, off = _expand(np.maximum(ends - np.arange(ep.size) - 1, 0))
    return ep, code, g, g + 1 + off, ends


def _copresent_pairs(ctx: _Episodes) -> tuple[np.ndarray, np.ndarray]:
    """(episode, code-pair key) rows: every pair of distinct codes an episode holds."""
    ep, code, first, second, _ = _presence_pairs(ctx)
    return ep[first], code[first] * ctx.v + code[second]


def _copresent_triples(ctx: _Episodes, frequent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(episode, code-triple key) rows for triples whose three pairs are all ``frequent``."""
    v = ctx.v
    ep, code, g, second, ends = _presence_pairs(ctx)
    sel = _member(frequent, code[g] * v + code[second])
    p_first, p_second = g[sel], second[sel]
    g2, off2 = _expand(np.maximum(ends[p_second] - p_second - 1, 0))
    third = p_second[g2] + 1 + off2
    a, b, c = code[p_first[g2]], code[p_second[g2]], code[third]
    ok = _member(frequent, b * v + c) & _member(frequent, a * v + c)
    return ep[third[ok]], (a[ok] * v + b[ok]) * v + c[ok]


def _copresent_sets(ctx: _Episodes, length: int, minimum: int,
                    pairs: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Code sets present together in >= ``minimum`` episodes.

    Returns the sorted set keys, their episode counts and the (episode, key) rows; triples
    are only built from pairs that co-occur that often (or from ``pairs``, sorted pair
    set keys, when given: the pair family after its budget).
    """
    pair_ep, pair_key = _copresent_pairs(ctx)
    if length == 2:
        set_ep, set_key = pair_ep, pair_key
    else:
        if pairs is None:
            pk, pc = _counts(pair_key)
            pairs = pk[pc >= minimum]
        set_ep, set_key = _copresent_triples(ctx, pairs)
    keys, counts = _counts(set_key)
    keep = counts >= minimum
    sel = _member(keys[keep], set_key)
    return keys[keep], counts[keep], set_ep[sel], set_key[sel]


def _sorted_set_key(codes: np.ndarray, v: int) -> np.ndarray:
    """Key of the sorted code set of each row of ``codes`` (P, L)."""
    s = np.sort(codes, axis=1)
    key = np.zeros(s.shape[0], np.int64)
    for col in range(s.shape[1]):
        key = key * v + s[:, col]
    return key


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


def _candidate_codes(keys: np.ndarray, length: int, v: int) -> np.ndarray:
    """(P, L) codes of pattern keys."""
    if not keys.size:
        return np.zeros((0, length), np.int64)
    return np.stack([(keys // v ** (length - 1 - c)) % v for c in range(length)], axis=1)


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


STEPS_PER_BIT = 1
"""Score resolution: a level scores floor(-log2 P * STEPS_PER_BIT) steps.

Measured over 48 seeds per cell at 8 and 16 repetitions (sparse, heartbeat, shared, zipf):
4 steps per bit found the same rules with 16 false triples in 240 runs against 11 at 1 step;
in the paper world (300 codes, 200 s episodes, gaps 20-60 s) it found the rules of one seed
in 6 that 1 step misses (F1 at 8: 1.0 against 0.8), where the rule frames' tails (0.1-0.15)
and a chance order's (1/6) fall on the same whole bit."""
SCORE_CAP = 48 * STEPS_PER_BIT
"""Steps an episode can score at most (a tail of 2^-48 already outweighs any family here)."""


def _level_scores(pe: np.ndarray) -> np.ndarray:
    """(R, L) bits each frame scores at level l = 1..L: floor(-log2 P(level >= l)), capped.

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
        bits = np.floor(-np.log2(np.maximum(q, 1e-300)) * STEPS_PER_BIT + 1e-9)
    return np.clip(bits, 0, SCORE_CAP).astype(np.int64)


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
    p = np.where(support[:, -1] >= cfg.accept_support, p, 1.0)
    minp = np.minimum(1.0, 2.0 * np.exp(sums.log_min))
    # a candidate whose frames are fewer than accept_support can never be accepted
    minp = np.where(width >= cfg.accept_support, minp, 1.0)
    best = _check_scale(poisson_tail_bound(support, sums.expected), support,
                        cfg.accept_support, np.isfinite(ctx.scales))
    return _Tested(keys=keys, codes=codes, p=p, minp=minp, scale=best, support=support,
                   expected=sums.expected, frame_start=frame_start, frame_ep=frames.ep,
                   frame_m=frames.m, frame_k=frames.k)


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
        widest = highest = 0  # running maxima of the chunk (its padded DP size)
        for ci, w_ci, z_ci in zip(refine.tolist(), width[refine].tolist(),
                                  z[refine].astype(np.int64).tolist()):
            grown_w, grown_z = max(widest, w_ci), max(highest, z_ci)
            cells = max(grown_w * (n_levels + 1), grown_z, SCORE_CAP + 1)
            if chunk and (len(chunk) + 1) * cells > budget:
                _refine_exact(p, chunk, frames.pe, frame_start, z, bits)
                chunk, grown_w, grown_z = [], w_ci, z_ci
            chunk.append(ci)
            widest, highest = grown_w, grown_z
        _refine_exact(p, chunk, frames.pe, frame_start, z, bits)


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


def _holds(t: np.ndarray, pos: list[np.ndarray], g: float, cfg: DiscoveryConfig) -> bool:
    return _tightest(t, pos, cfg) <= g


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


def _order_p_e(t: np.ndarray, pos: list[np.ndarray], g: float, cfg: DiscoveryConfig) -> float:
    """P(forward order holds at g) when the labels are permuted among the pattern's slots."""
    counts = [len(p) for p in pos]
    union = np.sort(np.concatenate(pos))
    total = union.size
    if total <= 9:
        hits = n = 0
        idx = range(total)
        for first in itertools.combinations(idx, counts[0]):
            rest = [i for i in idx if i not in first]
            for second in itertools.combinations(rest, counts[1]):
                third = [i for i in rest if i not in second]
                groups = [union[list(first)], union[list(second)]]
                if len(pos) == 3:
                    groups.append(union[third])
                n += 1
                hits += _holds(t, groups, g, cfg)
        return hits / n
    # many copies: union bound over position tuples
    valid = _fits(t, union, union, g, cfg)
    if len(pos) == 2:
        tuples = float(valid.sum())
        return min(1.0, counts[0] * counts[1] * tuples / (total * (total - 1)))
    tuples = float((valid.sum(axis=0) * valid.sum(axis=1)).sum())
    return min(1.0, counts[0] * counts[1] * counts[2] * tuples
               / (total * (total - 1) * (total - 2)))


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


def _check(ctx: _Episodes, codes: tuple[int, ...], g: float, support_rows: np.ndarray
           ) -> _Check:
    """Order and element-adds tests, antecedent and reverse counts at scale ``g``."""
    cfg = ctx.cfg
    length = len(codes)
    order_p, order_obs = [], 0
    add_p: list[list[float]] = [[] for _ in range(length)]
    add_obs = [0] * length
    antecedent = reverse = 0
    contrast = _Contrast()
    gap_lists: list[list[float]] = [[] for _ in range(length - 1)]
    supp = set(support_rows.tolist())
    others = [perm for perm in itertools.permutations(range(length))
              if perm != tuple(range(length))]
    diffs: list[list[int]] = [[] for _ in others]
    # every episode holding all codes but (at most) one: the element tests of code w run
    # over the episodes where the other codes are in place, whether or not w is there
    rows = np.unique(np.concatenate([
        _episodes_with(ctx, tuple(x for i, x in enumerate(codes) if i != w))
        for w in range(length)]))
    for e in rows.tolist():
        t, _, pos = _episode_slots(ctx, e, codes)
        n = t.size
        if length == 3:
            antecedent += _fits_any(t, pos[0], pos[1], g, cfg)
            reverse += _fits_any(t, pos[1], pos[0], g, cfg)
            contrast.add(t, pos, g, cfg)
        elif pos[0].size:
            antecedent += 1
            reverse += bool(pos[1].size and _fits_any(t, pos[1], pos[0], g, cfg))
        present = all(p.size for p in pos)
        held = e in supp
        if present and _order_relevant(t, pos, g, cfg):
            order_p.append(_order_p_e(t, pos, g, cfg))
            order_obs += held
        if present:  # forward against each other order: how many scales each one fits
            fwd = _fit_levels(t, pos, ctx.scales, cfg)
            for o, perm in enumerate(others):
                diffs[o].append(fwd - _fit_levels(t, [pos[i] for i in perm], ctx.scales, cfg))
        for w in range(length):
            if any(pos[i].size == 0 for i in range(length) if i != w):
                continue
            m = _eligible(t, pos, w, n, g, cfg)
            if m == 0:
                continue
            add_p[w].append(1.0 - (1.0 - ctx.freq[codes[w]]) ** m)
            add_obs[w] += held
        if held:
            for s, (x, y) in enumerate(zip(pos[:-1], pos[1:])):
                ok = _fits(t, x, y, g, cfg)
                xs, ys = np.nonzero(ok)
                if xs.size:
                    gap_lists[s].append(float((t[y[ys]] - t[x[xs]]).min()))
    p_order = float(pb_tail([np.asarray(order_p)], np.array([order_obs]))[0]) \
        if order_p else 1.0
    # forward must also beat every other order outright (scales fitted, summed over the
    # episodes); the sign-flip p-value of the closest one is kept as evidence
    margins = [int(np.sum(d)) for d in diffs]
    closest = int(np.argmin(margins)) if margins else -1
    dominated = bool(margins) and margins[closest] <= 0
    p_pair = _sign_flip_tail(np.asarray(diffs[closest], np.int64)) if margins else 1.0
    p_adds = tuple(float(pb_tail([np.asarray(ps)], np.array([obs]))[0]) if ps else 1.0
                   for ps, obs in zip(add_p, add_obs))
    middle = 1 if length == 3 else length - 1
    lift = (add_obs[middle] / sum(add_p[middle])) if add_p[middle] else math.nan
    gaps = tuple((min(gl), max(gl)) if gl else (0.0, 0.0) for gl in gap_lists)
    ab = _pair_binding(ctx, (codes[0], codes[1])) if length == 3 else None
    p_contrast = _contrast_p(ctx, codes, g, contrast if length == 3 else None, ab)
    unbound = ab is not None and not ab[1]
    return _Check(p_order=p_order, p_adds=p_adds, lift=lift, antecedent=antecedent,
                  reverse=reverse, episodes=support_rows, gaps=gaps,
                  rival=tuple(codes[i] for i in others[closest]) if margins else (),
                  dominated=dominated, p_rival=p_pair, p_contrast=p_contrast,
                  first_unbound=unbound)


def _fisher_greater(k1: int, n1: int, k0: int, n0: int, alpha: float
                    ) -> tuple[float, bool]:
    """One-sided Fisher exact p that the rate k1/n1 exceeds k0/n0, and whether it can.

    The second value is False when the table cannot reach ``alpha`` whatever its cells
    (Tarone: the smallest p-value its margins allow is above the level, e.g. B almost
    never seen without A): such a contrast holds no evidence either way, and the caller
    asks for other evidence instead of reading its p-value as a refutation.
    """
    from scipy.stats import hypergeom

    total, successes = n1 + n0, k1 + k0
    if n1 <= 0 or n0 <= 0 or successes <= 0:
        return 1.0, False
    floor = float(hypergeom.sf(min(successes, n1) - 1, total, successes, n1))
    if floor > alpha:
        return 1.0, False
    if k1 <= 0:
        return 1.0, True
    return float(min(1.0, hypergeom.sf(k1 - 1, total, successes, n1))), True


BOSCHLOO_BELOW = 0.25
"""Fisher p-values between alpha/2 and this are refined by Boschloo's test (see below)."""


BOSCHLOO_CELLS = 250_000
"""Tables with more outcomes than this keep Fisher's p: Boschloo's test enumerates every
(k1, k0) outcome (a 10^7-event log's episode-level binding table asked for 7 GB), and with
that many units the two tests agree anyway."""


def _rate_greater(k1: int, n1: int, k0: int, n0: int, alpha: float) -> tuple[float, bool]:
    """``_fisher_greater``, refined by Boschloo's test where Fisher's p is borderline."""
    p, ok = _fisher_greater(k1, n1, k0, n0, alpha)
    if ok and alpha / 2 < p <= BOSCHLOO_BELOW and (n1 + 1) * (n0 + 1) <= BOSCHLOO_CELLS:
        p = min(p, _boschloo_greater(k1, n1, k0, n0))
    return p, ok


def _boschloo_greater(k1: int, n1: int, k0: int, n0: int) -> float:
    """Boschloo's exact unconditional one-sided p-value for the same table.

    Fisher's test conditions on both margins and is conservative for small tables;
    Boschloo's uses Fisher's p-value as its statistic and is exact over the unknown common
    rate, never less powerful than Fisher's. On the contrast tables of rules that share
    B...C (8 of 12 against 8 of 37, 3 of 9 against 1 of 37) it halves the p-value (0.0064
    to 0.0032, 0.020 to 0.008). Only borderline tables pay for it (a few ms each).
    """
    from scipy.stats import boschloo_exact

    table = [[k1, n1 - k1], [k0, n0 - k0]]
    p = boschloo_exact(table, alternative="greater", n=64).pvalue
    return float(p) if np.isfinite(p) else 1.0


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

    def add(self, t: np.ndarray, pos: list[np.ndarray], g: float, cfg: DiscoveryConfig
            ) -> None:
        """Count one episode holding at least two of the three codes."""
        a, b, c = pos
        if a.size:
            stratum = _room_strata(t[-1] - t[a], g)
            then_b = _fits(t, a, b, g, cfg) if b.size else np.zeros((a.size, 0), bool)
            b_to_c = _fits(t, b, c, g, cfg).any(axis=1) if b.size and c.size \
                else np.zeros(b.size, bool)
            exposed = then_b.any(axis=1)
            completes = (then_b & b_to_c[None, :]).any(axis=1)
            a_to_c = _fits(t, a, c, g, cfg).any(axis=1) if c.size else np.zeros(a.size, bool)
            np.add.at(self.a_exposed, stratum, exposed)
            np.add.at(self.a_exposed_c, stratum, completes)
            np.add.at(self.a_unexposed_c, stratum, ~exposed & a_to_c)

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
                ab: tuple[float, bool] | None = None) -> tuple[float, ...]:
    """Per element, the evidence that it adds to the rest of the pattern (a p-value).

    Two kinds of evidence, either enough (Bonferroni over the two: twice the smaller
    p-value). The element's contrast: the pattern completes more often with it than in real
    cases without it; it needs such cases, and with only a handful of them one chance
    completion refutes a real rule. Or its binding to its neighbours: B follows A in A's
    episodes more often than B turns up in the episodes without A (the first element: A to
    B; the middle one: A to B and B to C); an element independent of its neighbours is not
    bound to them. A test that cannot reach the level whatever its counts (Tarone) is no
    evidence either way and is left out; when neither can, the history is too small to
    judge the element against real cases (a few missions), and the element stands on the
    within-episode tests alone (0 here; the pattern's ``reasons`` stay empty of it). A pair
    has only its binding, and an untestable one is refused: a pair has no other element
    test to stand on.
    """
    if len(codes) == 2:
        p, ok = _pair_binding(ctx, (codes[0], codes[1]))
        return (p if ok else 1.0,)
    a, b, c = codes
    ab = _pair_binding(ctx, (a, b)) if ab is None else ab  # the caller may have it already
    first = _rate_greater(*_first_table(ctx, (a, b, c), g, ()), ctx.cfg.alpha)
    middle = _stratified_greater(*counts.middle_tables(_per_stratum(ctx, a, g)),
                                 ctx.cfg.alpha)
    bc = _pair_binding(ctx, (b, c))
    return _either(first, ab), _either(middle, _both_bound(ab, bc))


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


def _either(contrast: tuple[float, bool], binding: tuple[float, bool]) -> float:
    """Twice the smaller of two testable p-values; the testable one alone; 0 if none."""
    usable = [p for p, ok in (contrast, binding) if ok]
    if not usable:
        return 0.0
    return min(1.0, len(usable) * min(usable))


def _fit_levels(t: np.ndarray, pos: list[np.ndarray], scales: np.ndarray,
                cfg: DiscoveryConfig) -> int:
    """How many of ``scales`` the pattern fits at in one episode (0 when absent)."""
    return int(np.count_nonzero(scales >= _tightest(t, pos, cfg)))


def _sign_flip_tail(d: np.ndarray) -> float:
    """Exact P(sum of +-|d_e| >= sum d_e) with independent fair signs (integer d)."""
    d = d[d != 0]
    observed = int(d.sum())
    if observed <= 0:
        return 1.0
    mags = np.abs(d)
    total = int(mags.sum())
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0
    for m in mags.tolist():
        dist = 0.5 * (np.roll(dist, m) + np.roll(dist, -m))
    return float(min(1.0, dist[total + observed:].sum()))


def _order_relevant(t: np.ndarray, pos: list[np.ndarray], g: float,
                    cfg: DiscoveryConfig) -> bool:
    """Whether some order of the pattern's codes fits at g in this episode."""
    union = np.sort(np.concatenate(pos))
    valid = _fits(t, union, union, g, cfg)
    if len(pos) == 2:
        return bool(valid.any())
    return bool((valid.any(axis=0) & valid.any(axis=1)).any())


def _episodes_with(ctx: _Episodes, codes: tuple[int, ...]) -> np.ndarray:
    """Episode rows holding every code in ``codes``."""
    out = None
    for x in codes:
        eps = ctx.code_episodes[ctx.code_start[x]:ctx.code_start[x + 1]]
        out = eps if out is None else np.intersect1d(out, eps, assume_unique=True)
    return out if out is not None else np.zeros(0, np.int64)


def _stability(ctx: _Episodes, rows: np.ndarray) -> np.ndarray:
    parts = max(ctx.log.n_partitions, 1)
    return np.bincount(ctx.log.partition[rows], minlength=parts)


def _reasons(support: int, p: float, cutoff: float, parts: np.ndarray, confidence: float,
             cfg: DiscoveryConfig) -> list[str]:
    reasons = []
    if support < cfg.accept_support:
        reasons.append(f"support {support} < {cfg.accept_support}")
    if not p <= cutoff:
        reasons.append(f"weighted p {p:.3g} above the FDR cutoff {cutoff:.3g}")
    spread = int((parts > 0).sum())
    if spread < cfg.min_partitions:
        reasons.append(f"support in {spread} partition(s) < {cfg.min_partitions}")
    share = float(parts.max() / parts.sum()) if parts.sum() else 1.0
    if share > cfg.max_partition_share:
        reasons.append(f"partition share {share:.2f} > {cfg.max_partition_share}")
    if confidence < cfg.min_confidence:
        reasons.append(f"confidence {confidence:.2f} < {cfg.min_confidence}")
    return reasons


# ----------------------------------------------------------------------------- discover
def discover(log: EventLog, cfg: DiscoveryConfig, rng: np.random.Generator,
             progress=None, engine=None) -> DiscoveryResult:
    """Find the relations of ``log`` (see the module docstring for the four steps).

    ``rng`` is accepted for a stable signature; the tests are analytic and deterministic.
    ``engine`` runs the passes over a log's parts (``consolidator/engine.py``; default: in
    this process).
    """
    del rng
    start = _time.perf_counter()
    parts = _parts(log, cfg.part_events)
    if len(parts) < 2:
        ctx, candidates, by_length = _scan_whole(log, cfg, parts)
    else:
        engine = engine or EmbeddedEngine()
        # parts that run side by side in this process are smaller, so that together they
        # hold what one part did (the sums do not depend on where parts are cut)
        share = max(1, getattr(engine, "concurrent_parts", 1))
        parts = _parts(log, max(1, cfg.part_events // share))
        ctx, candidates, by_length = _scan_parts(log, cfg, parts, engine)
    v = ctx.v
    notes: dict = {"scales": ctx.scales.tolist(), "median_gap": ctx.delta,
                   "parts": len(parts), "pass_s": dict(ctx.pass_s),
                   "family_budget": dict(ctx.family)}
    if progress is not None:
        progress()
    scored: list[Relation] = []
    accepted_triples: list[Relation] = []
    for length, (tested, set_keys, set_counts) in by_length.items():
        if tested.weight.size != tested.keys.size:  # a scan in parts brings them looked up
            set_weight = _cooccurrence_weights(ctx, set_keys, set_counts, length)
            tested.weight = _lookup(set_keys, set_weight, _sorted_set_key(tested.codes, v),
                                    1.0) if tested.keys.size else np.ones(0)
        family = math.factorial(length) * int(set_keys.size)
        cutoff, k_star, m = tarone_bh(tested.p / tested.weight, tested.minp / tested.weight,
                                      family, cfg.alpha, tested.other_minp)
        notes[f"family_{length}"] = {"sets": int(set_keys.size), "hypotheses": family,
                                     "tarone_k": k_star, "testable": m, "cutoff": cutoff}
        relations = _examine(ctx, tested, length, cutoff)
        if length == 3:
            accepted_triples, relations = _self_sufficient(ctx, tested, relations, cutoff)
        scored += relations
    accepted = _fold(accepted_triples + [r for r in scored if len(r.pattern) == 2
                                         and r.accepted])
    accepted_keys = {r.pattern for r in accepted}
    scored = [r if r.pattern in accepted_keys or not r.accepted else
              replace(r, accepted=False, reasons=r.reasons + ("folded into an accepted "
                                                              "triple",))
              for r in scored]
    return DiscoveryResult(accepted=accepted, scored=scored, candidates=candidates,
                           null_max={}, config=cfg, n_events=int(log.code.size),
                           n_episodes=int(len(log.episode_ids)),
                           seconds=_time.perf_counter() - start, codes=log.codes, notes=notes)


_Scan = tuple["_Episodes", dict[int, np.ndarray],
              dict[int, tuple["_Tested", np.ndarray, np.ndarray]]]


def _parts(log: EventLog, part_events: int) -> list[tuple[int, int]]:
    """Consecutive episode ranges of about ``part_events`` events each (whole episodes)."""
    n_ep = len(log.episode_ids)
    if part_events <= 0 or log.code.size <= part_events:
        return [(0, n_ep)]
    ends = np.searchsorted(log.episode, np.arange(1, n_ep + 1))  # events up to each episode
    cuts = np.searchsorted(ends, np.arange(part_events, log.code.size, part_events))
    bounds = np.unique(np.concatenate(([0], cuts + 1, [n_ep])).clip(0, n_ep))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _scan_whole(log: EventLog, cfg: DiscoveryConfig, parts: list) -> _Scan:
    """Candidates and their tests in one pass over the whole log (small logs)."""
    del parts
    ctx = _Episodes(log, cfg)
    pair_rows = _pair_rows(ctx)
    pair_sets = _copresent_sets(ctx, 2, cfg.accept_support)
    keep = _surprising_sets(ctx, pair_sets[0], pair_sets[1],
                            _family_budget(cfg, log.code.size))
    if keep is not None:
        pair_sets = _within_budget(ctx, keep, *pair_sets)
        inside = _member(pair_sets[0], _candidate_set_keys(pair_rows["uk"], 2, ctx.v))
        pair_rows["uk"], pair_rows["support"] = (pair_rows["uk"][inside],
                                                 pair_rows["support"][inside])
    frequent = pair_rows["uk"][pair_rows["support"] >= cfg.candidate_support]
    left, right = _neighbours(ctx, frequent)
    triple_rows = _triple_rows(ctx, left, right)
    candidates = {2: frequent,
                  3: triple_rows["uk"][triple_rows["support"] >= cfg.candidate_support]}
    by_length = {}
    for length, rows in ({3: triple_rows, 2: pair_rows} if cfg.pairs
                         else {3: triple_rows}).items():
        set_keys, set_counts, set_ep, set_row_key = (
            pair_sets if length == 2 else
            _copresent_sets(ctx, 3, cfg.accept_support, pairs=pair_sets[0]))
        by_length[length] = (_test_candidates(ctx, rows, length, set_ep, set_row_key),
                             set_keys, set_counts)
    return ctx, candidates, by_length


def _within_budget(ctx: _Episodes, keep: np.ndarray, keys: np.ndarray, counts: np.ndarray,
                   *rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """The pair sets ``keep`` selects (and their (episode, key) rows); noted in ``ctx``."""
    ctx.family = {"budget_frames": _family_budget(ctx.cfg, ctx.log.code.size),
                  "sets": int(keys.size), "sets_kept": int(keep.sum()),
                  "frames": int(2 * counts.sum()), "frames_kept": int(2 * counts[keep].sum())}
    kept = keys[keep], counts[keep]
    if not rows:
        return kept
    sel = _member(kept[0], rows[1])
    return (*kept, rows[0][sel], rows[1][sel])


FRAME_BLOCK = 1_000_000  # frames built at once in a partitioned scan (~100 MB)
TEST_BLOCK = 250_000
"""Frames tested at once: a bucket's (frames, scales) probabilities and their temporaries
are its peak (~40 MB each on the sqrt(2) ladder; a million frames made 3x10^6 events
peak at 1.44 GB)."""


def _set_index(cand_sets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidates grouped by code set: (sorted set keys, candidate index of each)."""
    by_set = np.argsort(cand_sets, kind="stable")
    return cand_sets[by_set], by_set


def _blocks(set_index: tuple[np.ndarray, np.ndarray], set_key: np.ndarray):
    """The candidates with frames in this part, in blocks of at most ~``FRAME_BLOCK`` frames.

    ``set_index`` is ``_set_index`` of every candidate; ``set_key`` this part's (episode,
    set) rows. A frame is an episode holding the candidate's code set, so the candidates
    here are found from the part's sets (not by visiting every candidate: tens of millions
    on a fleet log); with a small vocabulary every set is in many episodes, and one part's
    frames of all candidates would not fit at once. Yields ascending candidate indices.
    """
    sorted_sets, by_set = set_index
    if sorted_sets.size == 0 or set_key.size == 0:
        return
    uniq, per_set = _counts(set_key)
    lo = np.searchsorted(sorted_sets, uniq, side="left")
    hi = np.searchsorted(sorted_sets, uniq, side="right")
    g, off = _expand(hi - lo)
    cand = by_set[lo[g] + off]
    order = np.argsort(cand, kind="stable")
    cand, ends = cand[order], np.cumsum(per_set[g][order])
    start = 0
    while start < cand.size:
        base = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + FRAME_BLOCK, side="right")))
        yield cand[start:stop]
        start = stop


def _candidate_set_keys(keys: np.ndarray, length: int, v: int) -> np.ndarray:
    """The sorted code-set key of each ordered candidate (decoded a slice at a time)."""
    out = np.empty(keys.size, np.int64)
    step = 1 << 20
    for lo in range(0, keys.size, step):
        out[lo:lo + step] = _sorted_set_key(_candidate_codes(keys[lo:lo + step], length, v), v)
    return out


def _inner_pairs(triples: np.ndarray, sets: np.ndarray, v: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Ordered pairs (a, b), (b, c) of candidate triples; the code pairs of their sets.

    Rebuilding triples from only these pairs gives every candidate the same tightest
    occurrence (its nearest a before b and c after b are among them) and every candidate
    set the same episodes, at a fraction of the cost once most pairs are frequent.
    """
    a, b, c = (triples[:, i] for i in range(3)) if triples.size else (np.zeros(0, np.int64),) * 3
    ordered = np.unique(np.concatenate((a * v + b, b * v + c)))
    x, y, z = sets // (v * v), (sets // v) % v, sets % v
    unordered = np.unique(np.concatenate((x * v + y, y * v + z, x * v + z)))
    return ordered, unordered


@dataclass(frozen=True)
class _WholeScale:
    """What a part takes from the whole log so its per-episode sums match a whole pass."""

    delta: float
    complete: bool


def _part(log: EventLog, cfg: DiscoveryConfig, whole: _WholeScale, first: int, last: int
          ) -> _Episodes:
    return _Episodes(log.slice(first, last), cfg, whole=whole)


def _part_pairs(log: EventLog, first: int, last: int, cfg: DiscoveryConfig,
                whole: _WholeScale) -> tuple[np.ndarray, ...]:
    """Pass 1 on one part: slot counts, ordered-pair support, co-present pair counts."""
    part = _part(log, cfg, whole, first, last)
    rows = _pair_rows(part)
    return (part.t2, part.t3, rows["uk"], rows["support"],
            *_counts(_copresent_pairs(part)[1]))


def _part_triples(log: EventLog, first: int, last: int, cfg: DiscoveryConfig,
                  whole: _WholeScale, frequent: np.ndarray, co_frequent: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Pass 2 on one part: triple keys once per episode, co-present triple keys."""
    part = _part(log, cfg, whole, first, last)
    support = _triple_support_keys(part, *_neighbours(part, frequent))
    return support, _copresent_triples(part, co_frequent)[1]


def _part_frames(log: EventLog, first: int, last: int, cfg: DiscoveryConfig,
                 whole: _WholeScale, keys: dict, set_index: dict, set_keys: dict,
                 inner: tuple | None) -> dict[int, tuple[np.ndarray, ...]]:
    """Pass 3 on one part: every frame of every candidate (global candidate and episode)."""
    part = _part(log, cfg, whole, first, last)
    rows = {2: _pair_rows(part)}
    if inner is not None:
        rows[3] = _triple_rows(part, *_neighbours(part, inner[0]))
    out = {}
    for n in keys:
        set_ep, set_key = (_copresent_pairs(part) if n == 2
                           else _copresent_triples(part, inner[1]))
        sel = _member(set_keys[n], set_key)
        set_ep, set_key = set_ep[sel], set_key[sel]
        got = []
        for block in _blocks(set_index[n], set_key):
            cand, f_ep, f_m, k = _frame_rows(part, rows[n], n, keys[n][block],
                                             _candidate_codes(keys[n][block], n, part.v),
                                             set_ep, set_key)
            got.append((block[cand], f_ep + first, f_m, k))
        out[n] = tuple(np.concatenate(col) for col in zip(*got)) if got else \
            (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0),
             np.zeros((0, n), np.int64))
    return out


def _scan_parts(log: EventLog, cfg: DiscoveryConfig, parts: list[tuple[int, int]],
                engine=None) -> _Scan:
    """The same candidates and tests as ``_scan_whole``, one part of the log at a time.

    Every statistic is a sum over episodes, so parts add up: pass 1 counts pairs (and fills
    the per-episode slot counts), pass 2 triples built on the pairs frequent over the whole
    log, pass 3 writes each candidate's frames to disk by candidate bucket
    (``_FrameSpill``), which are then tested a bucket at a time. Memory: one part's rows,
    one bucket's frames, the counted keys above their floors, and the candidates that can
    still be significant; key counts past ``key_tally.MEMORY_ROWS`` go to disk too.
    ``engine`` (``consolidator/engine.py``) runs each pass's parts: on this process's
    threads, or as Ray tasks; the sums and the tests stay here (the key counts and the test
    buckets on this process's threads, in order), so every engine gives the same result.
    """
    engine = engine or EmbeddedEngine()
    threads = getattr(engine, "threads", 1)  # for the work that stays in this process
    ctx = _Episodes(log, cfg, pairs=False)
    whole = _WholeScale(ctx.delta, ctx.complete)
    lengths = (3, 2) if cfg.pairs else (3,)
    clock = _time.perf_counter
    started = clock()
    pair_support, pair_sets = (KeyTally(span=ctx.v ** 2, threads=threads),
                               KeyTally(span=ctx.v ** 2, threads=threads))
    for (first, last), (t2, t3, *counted) in zip(parts, engine.map(
            _part_pairs, log, parts, cfg, whole)):
        ctx.t2[first:last], ctx.t3[first:last] = t2, t3
        pair_support.add(counted[0], counted[1])
        pair_sets.add(counted[2], counted[3])
    frequent, frequent_counts = pair_support.counted(cfg.candidate_support)
    # what pass 3 needs of the pair tallies, taken now so the tallies (hundreds of MB of
    # keys and counts on a fleet log) are gone before pass 2 builds its own
    # (the pairs pass 3 tests, as a mask over the frequent ones: an int64 copy of ~2 x 10^7
    # keys held through pass 2 was 0.16 GB of a 10^7 log's peak)
    pair_tested = frequent_counts >= cfg.accept_support
    del frequent_counts
    pair_set_keys, pair_set_counts = pair_sets.counted(cfg.accept_support)
    del pair_support, pair_sets
    release_free_memory()
    keep = _surprising_sets(ctx, pair_set_keys, pair_set_counts,
                            _family_budget(cfg, log.code.size))
    if keep is not None:  # triples, frames and tests only on the pairs within the budget
        pair_set_keys, pair_set_counts = _within_budget(ctx, keep, pair_set_keys,
                                                        pair_set_counts)
        inside = _member(pair_set_keys, _candidate_set_keys(frequent, 2, ctx.v))
        frequent, pair_tested = frequent[inside], pair_tested[inside]
        del inside
    del keep
    ctx.pass_s["pairs"], started = clock() - started, clock()
    triple_support, triple_sets = (KeyTally(span=ctx.v ** 3, threads=threads),
                                   KeyTally(span=ctx.v ** 3, threads=threads))
    for support_keys, set_keys_part in engine.map(_part_triples, log, parts, cfg, whole,
                                                  frequent, pair_set_keys):
        triple_support.add(support_keys, np.ones(support_keys.size, np.int64))
        triple_sets.add(set_keys_part, np.ones(set_keys_part.size, np.int64))
        del support_keys, set_keys_part
    candidates = {3: triple_support.at_least(cfg.candidate_support)}
    triple_set_keys, triple_set_counts = triple_sets.counted(cfg.accept_support)
    keys = {3: triple_support.at_least(cfg.accept_support)}
    set_keys = {2: pair_set_keys, 3: triple_set_keys}
    set_counts = {2: pair_set_counts, 3: triple_set_counts}
    del pair_set_keys, pair_set_counts, triple_support, triple_sets
    del triple_set_keys, triple_set_counts
    release_free_memory()
    if 2 in lengths:  # without pairs, pass 3 builds no pair frames
        keys[2] = frequent[pair_tested]  # once the triple tallies are gone
    del pair_tested
    # the frequent pairs are the caller's from here on: on disk through pass 3's peak
    parked, frequent = ParkedArray(frequent), None
    cand_sets, weights, spills = {}, {}, {}
    for n in lengths:
        cand_sets[n] = _candidate_set_keys(keys[n], n, ctx.v)
        weights[n] = _lookup(set_keys[n], _cooccurrence_weights(
            ctx, set_keys[n], set_counts[n], n), cand_sets[n], 1.0)
    # later passes only rebuild what the candidates are made of: the pairs inside them
    inner = _inner_pairs(_candidate_codes(keys[3], 3, ctx.v), set_keys[3], ctx.v) \
        if 3 in lengths else None
    ctx.pass_s["triples"], started = clock() - started, clock()
    try:
        for n in lengths:
            spills[n] = _FrameSpill(ctx, keys[n], n, _lookup(set_keys[n], set_counts[n],
                                                             cand_sets[n], 0), threads)
        set_index = {n: _set_index(cand_sets[n]) for n in lengths}
        del cand_sets
        for frames in engine.map(_part_frames, log, parts, cfg, whole, keys, set_index,
                                 set_keys, inner):
            for n, (cand, f_ep, f_m, k) in frames.items():
                spills[n].add(cand, f_ep, f_m, k)
            del frames
        # the candidates' set index (two arrays per candidate) and the inner pairs served
        # pass 3 only; held through the tests they were ~0.3 GB of a 10^7 log's peak
        del set_index, inner
        release_free_memory()
        ctx.pass_s["frames"], started = clock() - started, clock()
        by_length = {n: (spills[n].tested(keys[n], weights[n], cfg.alpha, threads),
                         set_keys[n], set_counts[n]) for n in lengths}
        release_free_memory()
        ctx.pass_s["tests"] = clock() - started
        ctx.pass_s["frames_spilled"] = sum(spill.files.rows for spill in spills.values())
    finally:
        for spill in spills.values():
            spill.close()
    candidates[2] = parked.load()  # on a failure its file goes with the object
    return ctx, candidates, by_length


class _FrameSpill:
    """Every frame of a scan in parts, shuffled to disk by candidate, then tested by bucket.

    A candidate's test needs all of its frames at once, and a part holds only some of
    them; rather than keep per-candidate sums for every candidate in memory (tens of
    millions of pairs on a fleet log), each part's frames go to the file of their
    candidate's bucket: consecutive candidates holding about ``TEST_BLOCK`` frames
    together (a candidate's frames are its code set's episodes, known from the set counts).
    A bucket is then tested alone, and only candidates that can still be significant keep
    their frames; the others leave only their smallest achievable p-value (for Tarone).
    """

    def __init__(self, ctx: _Episodes, keys: np.ndarray, length: int, width: np.ndarray,
                 threads: int = 1) -> None:
        """Buckets for ``keys``, the candidates of ``length`` codes.

        ``width``: each candidate's frames; ``threads``: buckets tested at once (each is
        that many times smaller, so the buckets in flight hold what one did).
        """
        self.ctx, self.length = ctx, length
        ends = np.cumsum(width)
        block = max(1, TEST_BLOCK // max(1, threads))
        # bucket b holds candidates bounds[b] .. bounds[b + 1] - 1
        cuts = np.searchsorted(ends, np.arange(block, int(ends[-1]) if ends.size
                                               else 0, block), side="right")
        self.bounds = np.unique(np.concatenate(([0], cuts, [keys.size])))
        index = np.int32 if max(keys.size, ctx.n_ep) < 2 ** 31 else np.int64
        self.files = BucketFiles(max(self.bounds.size - 1, 1), np.dtype(
            [("cand", index), ("ep", index), ("m", np.float64), ("k", np.int32, (length,))]))

    def add(self, cand: np.ndarray, ep: np.ndarray, m: np.ndarray, k: np.ndarray) -> None:
        """Frames of one part: global candidate index, global episode row, gap, copies."""
        bucket = np.searchsorted(self.bounds, cand, side="right") - 1
        self.files.append(bucket, cand=cand, ep=ep, m=m, k=k)

    def tested(self, keys: np.ndarray, weight: np.ndarray, alpha: float, threads: int = 1
               ) -> _Tested:
        """Test each bucket's candidates; keep those that may be significant.

        ``threads`` buckets are tested at once and gathered in order, so the result is the
        same for any thread count.
        """
        kept = []
        # the left-out candidates' minp, filled in place (a list of parts concatenated at
        # the end held them twice: tens of millions of values on a fleet log)
        other, n_other = np.empty(keys.size), 0
        for t, dropped in ordered_map(
                lambda b: self._test_bucket(b, keys, weight, alpha, trim=threads > 1),
                range(self.bounds.size - 1), threads):
            kept.append(t)
            other[n_other:n_other + dropped.size] = dropped
            n_other += dropped.size
        out = _concat_tested(kept, self.length, self.ctx.scales.size)
        out.other_minp = other[:n_other]
        return out

    def _test_bucket(self, b: int, keys: np.ndarray, weight: np.ndarray, alpha: float,
                     trim: bool = False) -> tuple[_Tested, np.ndarray]:
        """Bucket ``b``'s candidates that may be significant, and the others' minp.

        ``trim``: hand the bucket's freed temporaries back to the OS (on several threads
        each thread's heap arena would otherwise keep a bucket's worth).
        """
        ctx = self.ctx
        lo, hi = int(self.bounds[b]), int(self.bounds[b + 1])
        rec = self.files.read(b)
        self.files.drop(b)
        rec = rec[np.argsort(rec["cand"], kind="stable")]  # parts in order: episodes too
        ep = rec["ep"].astype(np.int64)
        frames = _Frames(rec["cand"].astype(np.int64) - lo, ep, rec["m"],
                         _null_probs(ctx, ep, rec["k"]), rec["k"])
        del rec
        sums = _Sums.zeros(hi - lo, ctx.scales.size)
        sums.add(frames, ctx.scales)
        t = _tested(ctx, keys[lo:hi], _candidate_codes(keys[lo:hi], self.length, ctx.v),
                    sums, frames)
        del frames, sums
        w = weight[lo:hi]
        keep = (t.p <= alpha) | (t.p / w <= alpha)
        out = _subset(t, keep), t.minp[~keep] / w[~keep]
        out[0].weight = w[keep]  # the weights travel with the candidates (no second lookup)
        del t
        if trim:
            release_free_memory()
        return out

    def close(self) -> None:
        """Delete the spilled frames."""
        self.files.close()


def _subset(t: _Tested, keep: np.ndarray) -> _Tested:
    """The candidates ``keep`` of ``t``, with their frames."""
    idx = np.flatnonzero(keep)
    lo, hi = t.frame_start[idx], t.frame_start[idx + 1]
    g, off = _expand(hi - lo)
    rows = lo[g] + off
    return _Tested(keys=t.keys[idx], codes=t.codes[idx], p=t.p[idx], minp=t.minp[idx],
                   scale=t.scale[idx], support=t.support[idx], expected=t.expected[idx],
                   frame_start=np.concatenate(([0], np.cumsum(hi - lo))),
                   frame_ep=t.frame_ep[rows], frame_m=t.frame_m[rows],
                   frame_k=t.frame_k[rows])


def _concat_tested(parts: list[_Tested], length: int, n_scales: int) -> _Tested:
    """Candidates of consecutive buckets as one ``_Tested`` (key order kept)."""
    if not parts:
        z = np.zeros(0, np.int64)
        return _Tested(keys=z, codes=np.zeros((0, length), np.int64), p=np.zeros(0),
                       minp=np.zeros(0), scale=z, support=np.zeros((0, n_scales)),
                       expected=np.zeros((0, n_scales)), frame_start=np.zeros(1, np.int64),
                       frame_ep=z, frame_m=np.zeros(0),
                       frame_k=np.zeros((0, length), np.int32))
    offsets = np.cumsum([0] + [t.frame_ep.size for t in parts[:-1]])
    return _Tested(
        keys=np.concatenate([t.keys for t in parts]),
        codes=np.concatenate([t.codes for t in parts]),
        p=np.concatenate([t.p for t in parts]), minp=np.concatenate([t.minp for t in parts]),
        scale=np.concatenate([t.scale for t in parts]),
        support=np.concatenate([t.support for t in parts]),
        expected=np.concatenate([t.expected for t in parts]),
        frame_start=np.concatenate([[0]] + [t.frame_start[1:] + o
                                            for t, o in zip(parts, offsets)]),
        frame_ep=np.concatenate([t.frame_ep for t in parts]),
        frame_m=np.concatenate([t.frame_m for t in parts]),
        frame_k=np.concatenate([t.frame_k for t in parts]),
        weight=np.concatenate([t.weight for t in parts]))


MUTUAL_SHIELD_BELOW = 0.15
"""A triple held back only by its first contrast shields others if that p is at most this."""


def _reconsider_shared(ctx: _Episodes, tested: _Tested, significant: list[int],
                       checks: dict[int, _Check]) -> None:
    """Redo the first element's contrast of triples that share B...C with a passing one.

    A triple whose checks all pass is taken as a rule here; every other significant triple
    X...B...C whose first contrast failed gets it again with the Bs that such rules' first
    codes opened left out (``_first_table``'s ``shield``). Rules that share B...C (A...B...C
    and X...B...C) then stop hiding each other, and a code that only rides along with a
    rule gains nothing: its cases are the rule's and leave with them.

    Two such rules can also hold each other back before either passes: each one's "B...C
    without A" holds the other's cases (the ``shared`` world at 8 repetitions: both
    first contrasts at 0.07-0.11; F1 0.82 over 6 seeds, 1.0 with this). Triples sharing
    B...C whose first contrast is the only check they fail, and fails narrowly (p at most
    ``MUTUAL_SHIELD_BELOW``), therefore shield each other too. A rider Y of a rule X loses
    X's cases from its own side when X is shielded, and X keeps the cases Y does not ride
    on. The bound matters where several codes sit at a fixed phase before a natural pair
    (the rounds' missions: each planted rule's first code before payload_change ...
    vibration_high): shielding each other, they remove the later-phase cases from one
    another's "without" side and one of them passed; their own contrasts are far from the
    level (0.39, 0.92), and the bound keeps them out.
    """
    alpha = ctx.cfg.alpha

    def passes(i: int) -> bool:
        ch = checks[i]
        return max((ch.p_order,) + ch.p_adds + ch.p_contrast) <= alpha and not ch.dominated

    def only_first_fails(i: int) -> bool:
        ch = checks[i]
        return (max((ch.p_order,) + ch.p_adds + ch.p_contrast[1:]) <= alpha
                and not ch.dominated and bool(ch.p_contrast)
                and alpha < ch.p_contrast[0] <= MUTUAL_SHIELD_BELOW)

    rules: dict[tuple[int, int], set[int]] = {}
    stuck: dict[tuple[int, int], set[int]] = {}
    for i in significant:
        a, b, c = (int(x) for x in tested.codes[i])
        if passes(i):
            rules.setdefault((b, c), set()).add(a)
        elif only_first_fails(i):
            stuck.setdefault((b, c), set()).add(a)
    for i in significant:
        a, b, c = (int(x) for x in tested.codes[i])
        shield = tuple(sorted((rules.get((b, c), set()) | stuck.get((b, c), set())) - {a}))
        ch = checks[i]
        if not shield or not ch.p_contrast or ch.p_contrast[0] <= alpha:
            continue
        g = float(ctx.scales[tested.scale[i]])
        first = _rate_greater(*_first_table(ctx, (a, b, c), g, shield), alpha)
        p_first = _either(first, _pair_binding(ctx, (a, b)))
        checks[i] = replace(ch, p_contrast=(p_first,) + ch.p_contrast[1:])


def _holm(p: np.ndarray, family: int | None = None) -> np.ndarray:
    """Holm-adjusted p-values (step-down, monotone) of one family.

    ``family``: the family's size when it holds more hypotheses than ``p`` (the others
    were tried and not examined; they rank last), at least ``p.size``.
    """
    order = np.argsort(p, kind="stable")
    m = p.size if family is None else max(family, p.size)
    adjusted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(p.size)) * p[order]))
    out = np.empty(p.size)
    out[order] = adjusted
    return out


def _pair_rivals(tested: _Tested, significant: list[int], checks: dict[int, _Check]) -> None:
    """Holm over the bindings of significant pairs that share their consequence.

    A pair's binding (C follows A in A's episodes more often than C turns up without A) is
    its only element evidence, and every code X that happens to precede a frequent C is
    one more try at it: of ~20 such riders one passes at the per-check level by chance,
    and an accepted pair X...C makes the robot consider C after every X. The pairs ending
    in the same C are therefore one family, Holm-adjusted, so a rider needs the evidence
    its number of rivals asks for; a pair alone in its family keeps its p-value. Triples
    get the same only where their first element has no other evidence
    (``_unbound_riders``).
    """
    families: dict[tuple[int, ...], list[int]] = {}
    for i in significant:
        if checks[i].p_contrast:
            families.setdefault((int(tested.codes[i][1]),), []).append(i)
    _holm_first_element(families, checks)


def _holm_first_element(families: dict[tuple[int, ...], list[int]],
                        checks: dict[int, _Check],
                        sizes: dict[tuple[int, ...], int] | None = None) -> None:
    """Holm-adjust the first element's evidence within each family (of two or more).

    ``sizes``: how many hypotheses each family holds, where more were tried than examined.
    """
    for key, members in families.items():
        size = len(members) if sizes is None else max(sizes.get(key, 0), len(members))
        if size > 1:
            adjusted = _holm(np.array([checks[i].p_contrast[0] for i in members]), size)
            for i, q in zip(members, adjusted.tolist(), strict=True):
                checks[i] = replace(checks[i], p_contrast=(q,) + checks[i].p_contrast[1:])


def _unbound_riders(ctx: _Episodes, tested: _Tested, significant: list[int],
                    checks: dict[int, _Check], nominal: list[int]) -> None:
    """Holm over the first contrasts of triples X...B...C whose X cannot be bound to B.

    Where B turns up in nearly every episode, whether X binds B cannot be judged, every
    code that happens to precede a natural B...C becomes a significant X...B...C, and each
    X's first contrast is its only element evidence: one of ~20 such riders passes at the
    per-check level by chance. The rounds' histories show it: ``dust_alert`` (planted at
    a fixed phase of its missions) before the natural ``payload_change ...
    vibration_normal``, contrast p 0.007, promoted for three rounds. Those contrasts,
    among triples sharing B...C, are one family, Holm-adjusted. A first element whose
    binding could be judged has two kinds of evidence and is left as it is: a planted
    rule's first contrast is weak by design where its own counter-evidence holds B...C
    without A (0.01 at 16 repetitions in exp6), and Holm over every code tried in front
    of B...C lost such a rule (``zipf``, 16 repetitions, F1 1.0 -> 0.9).

    Two selections make such a contrast look better than it is, and both are paid for.
    The scale: the contrast is read at the scale where the pattern's support was most
    surprising, chosen from the data among every finite scale of the ladder, so it is
    Bonferroni-multiplied by their number (a bound first element has a scale-free binding
    beside it and needs no such factor). The family: every nominally significant X...B...C
    (p <= alpha before the family-wide cutoff), not only the riders that passed the
    cutoff, which the same chance closeness of X to B decides. Replayed round histories
    (``bench rounds``, seed 0, round 3): ``dust_alert`` before ``payload_change ...
    vibration_normal`` had contrast p 0.001 at the best of 19 scales (2 positions), 9
    nominal riders of that B...C, and no other evidence; across 30 seeds of the same
    missions a planted code is followed by that pair no more often than a random moment
    at the same phase (24 of 309 against 26 of 360). The natural ``vibration_high ...
    payload_change ... vibration_normal`` (contrast p ~1e-6) passes both factors, and no
    planted rule of the exp6 worlds has an unbound first element.
    """
    searched = max(int(np.isfinite(ctx.scales).sum()), 1)
    families: dict[tuple[int, ...], list[int]] = {}
    for i in significant:
        ch = checks[i]
        if ch.first_unbound and ch.p_contrast and ch.p_contrast[0] > 0:
            families.setdefault((int(tested.codes[i][1]), int(tested.codes[i][2])),
                                []).append(i)
            checks[i] = replace(ch, p_contrast=(min(1.0, searched * ch.p_contrast[0]),)
                                + ch.p_contrast[1:])
    sizes: dict[tuple[int, ...], int] = {}
    for i in nominal:
        key = (int(tested.codes[i][1]), int(tested.codes[i][2]))
        if key in families:
            sizes[key] = sizes.get(key, 0) + 1
    _holm_first_element(families, checks, sizes)


def _examine(ctx: _Episodes, tested: _Tested, length: int, cutoff: float
             ) -> list[Relation]:
    """Relations for the nominally significant candidates; checks for the significant ones."""
    cfg, log = ctx.cfg, ctx.log
    wp = tested.p / tested.weight
    nominal = np.flatnonzero(tested.p <= cfg.alpha)
    nominal = nominal[np.argsort(tested.p[nominal], kind="stable")]
    significant = [i for i in nominal.tolist() if wp[i] <= cutoff][:cfg.max_checked]
    checks: dict[int, _Check] = {}
    for i in significant:
        g = float(ctx.scales[tested.scale[i]])
        lo, hi = tested.frame_start[i], tested.frame_start[i + 1]
        held = tested.frame_ep[lo:hi][tested.frame_m[lo:hi] <= g]
        checks[i] = _check(ctx, tuple(int(c) for c in tested.codes[i]), g, held)
    if length == 3:
        _reconsider_shared(ctx, tested, significant, checks)
        _unbound_riders(ctx, tested, significant, checks, nominal.tolist())
    else:
        _pair_rivals(tested, significant, checks)
    # Holm over the significant set on the largest of the per-pattern checks: a real pair
    # A...B makes every X near it significant in step 2, so this family is mostly such
    # riders; controlling its family-wise error keeps them from leaking through by chance
    worst = np.array([max((checks[i].p_order,) + checks[i].p_adds) for i in significant])
    passed = set()
    if worst.size:
        ranked = np.argsort(worst, kind="stable")
        fails = np.flatnonzero(worst[ranked] > cfg.alpha / (worst.size - np.arange(worst.size)))
        stop = int(fails[0]) if fails.size else worst.size
        passed = {significant[r] for r in ranked[:stop]}
    out = []
    for i in nominal.tolist():
        names = tuple(log.codes[c] for c in tested.codes[i])
        s = int(tested.scale[i])
        g = float(ctx.scales[s])
        lo, hi = tested.frame_start[i], tested.frame_start[i + 1]
        held = tested.frame_ep[lo:hi][tested.frame_m[lo:hi] <= g]
        # stability over every supporting episode (largest scale): a burst stays a burst
        parts = _stability(ctx, tested.frame_ep[lo:hi][tested.frame_m[lo:hi]
                                                       <= ctx.scales[-1]])
        support = int(held.size)
        check = checks.get(i)
        if check is None:
            antecedent = reverse = 0
            confidence = 0.0
        else:
            antecedent, reverse = check.antecedent, check.reverse
            confidence = support / antecedent if antecedent else 0.0
        reasons = _reasons(support, float(wp[i]), cutoff, parts, confidence, cfg)
        if check is not None and check.dominated:
            rival = ">".join(log.codes[c] for c in check.rival)
            reasons.append(f"order not specific: reverse/other order {rival} fits as well "
                           f"as forward")
        if check is not None and i not in passed:
            labels = ("first", "middle", "last") if length == 3 else ("first", "second")
            if not check.p_order <= cfg.alpha:
                reasons.append(f"order not specific: p_order {check.p_order:.3g} "
                               f"(reverse {reverse})")
            for lab, pa in zip(labels, check.p_adds):
                if not pa <= cfg.alpha:
                    reasons.append(f"{lab} element does not add beyond its base rate "
                                   f"(p {pa:.3g})")
            if not any("order" in r or "add" in r for r in reasons):
                named = (("order", check.p_order),) + tuple(
                    (f"{lab} element adds", pa) for lab, pa in zip(labels, check.p_adds))
                lab, pw = max(named, key=lambda x: x[1])
                reasons.append(f"per-pattern checks fail Holm over the significant set "
                               f"(weakest: {lab}, p {pw:.3g})")
        if check is not None:
            labels = ("first", "middle") if length == 3 else ("pair",)
            for lab, pc in zip(labels, check.p_contrast):
                if not pc <= cfg.alpha:
                    reasons.append(f"{lab} element: the pattern completes no more often "
                                   f"with it than without it (contrast p {pc:.3g})")
        if check is None and wp[i] <= cutoff:
            reasons.append("not examined: more significant patterns than max_checked")
        out.append(Relation(
            pattern=names, support=support, antecedent_support=antecedent, reverse=reverse,
            partition_support=tuple(int(x) for x in parts), p_value=float(tested.p[i]),
            accepted=not reasons and check is not None, reasons=tuple(reasons),
            episodes=tuple(int(x) for x in log.episode_ids[held]),
            gaps=check.gaps if check is not None else (),
            middle_lift=check.lift if check is not None else math.nan,
            max_gap=g, expected=float(tested.expected[i, s]),
            p_order=check.p_order if check is not None else math.nan,
            p_adds=check.p_adds if check is not None else (),
            p_contrast=check.p_contrast if check is not None else ()))
    return out


def _self_sufficient(ctx: _Episodes, tested: _Tested, relations: list[Relation],
                     cutoff: float) -> tuple[list[Relation], list[Relation]]:
    """Keep a triple only if it stays significant without stronger overlapping triples.

    Strongest first (weakest link: the largest of its p-values, then support): the episodes
    where an accepted triple sharing two codes with it occurs (at any gap) are removed and
    its multi-scale within-episode test is redone on the remaining frames; it must still
    pass the family cutoff. Strength can mislead when two triples explain each other: a
    code that by chance sits before A in several of a rule's episodes makes Y...A...B, whose
    checks may all be a little stronger than the rule's own. So a triple that fails against
    the kept ones is asked the question back: where every kept triple that explains it is
    itself explained by it (fails without its episodes), keeps less evidence of its own
    (a larger residual p-value) and is weaker in the family-wide test, the kept ones give
    way to it. (Without that last condition a frequent code's triple, which occurs at some
    gap in nearly every episode of a rule, displaced the rule itself.)
    Returns (accepted, all scored).
    """
    lookup = {name: c for c, name in enumerate(ctx.log.codes)}

    def index(pattern: tuple[str, ...]) -> int:
        key = 0
        for name in pattern:
            key = key * ctx.v + lookup[name]
        return int(np.searchsorted(tested.keys, key))

    def occurring(i: int) -> set[int]:
        """Episodes where candidate i occurs at all (any gap up to max_gap)."""
        lo, hi = tested.frame_start[i], tested.frame_start[i + 1]
        return set(tested.frame_ep[lo:hi][tested.frame_m[lo:hi] <= ctx.scales[-1]].tolist())

    def residual(i: int, explained: set[int]) -> tuple[float, int]:
        """Weighted p-value and support of candidate i without the ``explained`` episodes."""
        lo, hi = tested.frame_start[i], tested.frame_start[i + 1]
        keep = ~np.isin(tested.frame_ep[lo:hi], np.fromiter(explained, np.int64))
        m = tested.frame_m[lo:hi][keep]
        pe = _null_probs(ctx, tested.frame_ep[lo:hi][keep], tested.frame_k[lo:hi][keep])
        obs = int((m <= ctx.scales[-1]).sum())
        if obs < ctx.cfg.accept_support:
            return 1.0, obs
        z = int(_observed_scores(m, pe, ctx.scales).sum())
        z_levels = int((m[:, None] <= ctx.scales[None, :]).sum())
        p = min(float(_score_tail([pe], np.array([z]))[0]),
                float(_score_tail([pe], np.array([z_levels]), bits=False)[0]))
        return min(2.0 * p, 1.0) / tested.weight[i], obs

    order = sorted(range(len(relations)), key=lambda r: (_weakest_link(relations[r]),
                                                        -relations[r].support))
    kept: list[int] = []
    out = list(relations)
    for r in order:
        rel = relations[r]
        if not rel.accepted:
            continue
        overlapping = [k for k in kept
                       if len(set(relations[k].pattern) & set(rel.pattern)) >= 2]
        if overlapping:
            i = index(rel.pattern)
            explained = set().union(*(occurring(index(relations[k].pattern))
                                      for k in overlapping))
            p_rel, obs = residual(i, explained)
            if not p_rel <= cutoff:
                mine = occurring(i)
                back = [residual(index(relations[k].pattern), mine)[0] for k in overlapping]
                if all(not pk <= cutoff and pk > p_rel and relations[k].p_value > rel.p_value
                       for k, pk in zip(overlapping, back)):
                    for k in overlapping:
                        kept.remove(k)
                        out[k] = replace(relations[k], accepted=False, reasons=relations[
                            k].reasons + (f"explained by the overlapping triple "
                                          f"{'>'.join(rel.pattern)}, which keeps more "
                                          f"evidence without it",))
                else:
                    out[r] = replace(rel, accepted=False, reasons=rel.reasons + (
                        f"explained by stronger overlapping triples (residual support {obs}, "
                        f"p {p_rel:.3g})",))
                    continue
        kept.append(r)
    return [out[k] for k in kept], out


def _weakest_link(rel: Relation) -> float:
    """A pattern is as strong as its least significant necessary part."""
    parts = [rel.p_value, rel.p_order, *rel.p_adds]
    return max(p for p in parts if not math.isnan(p))


def pairs_inside(triples: Iterable[tuple[str, ...]]) -> set[tuple[str, ...]]:
    """The ordered pairs the given triples contain (A...B, B...C, A...C of each)."""
    covered: set[tuple[str, ...]] = set()
    for a, b, c in triples:
        covered |= {(a, b), (b, c), (a, c)}
    return covered


def _fold(accepted: list[Relation]) -> list[Relation]:
    """Drop accepted pairs that an accepted triple already contains (in the same order)."""
    covered = pairs_inside(r.pattern for r in accepted if len(r.pattern) == 3)
    kept = [r for r in accepted if len(r.pattern) == 3 or r.pattern not in covered]
    return sorted(kept, key=lambda r: (-len(r.pattern), r.p_value, -r.support, r.pattern))


def relation_f1(found: set[tuple[str, ...]], truth: set[tuple[str, ...]]) -> dict[str, float]:
    """Precision/recall/F1 of found ordered patterns against the planted ones."""
    tp = len(found & truth)
    fp = len(found - truth)
    fn = len(truth - found)
    precision = tp / (tp + fp) if tp + fp else (1.0 if not truth else 0.0)
    recall = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0
    return {"precision": precision, "recall": recall, "f1": f1}
