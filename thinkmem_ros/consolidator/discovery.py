"""Cross-experience discovery of long-range ordered relations A...B...C and A...B.

Two stages, as seed 000 §III-C describes. An over-complete *candidate* stage counts, for
every ordered pair and triple of event codes whose consecutive gaps satisfy the temporal
constraints, the number of independent episodes that contain it, and keeps all with at
least ``candidate_support`` episodes. A *scoring* stage then measures for each candidate:

- support: episodes containing the ordered pattern (each episode counts once);
- counterexamples: episodes with the antecedent (A...B for a triple, A for a pair) that
  the consequence does not follow;
- reverse-order evidence: episodes with B...A (the antecedent pair backwards);
- cross-partition stability: support per temporal partition of the history;
- enrichment over order-shuffled histories: a permutation test. The null history permutes
  the event codes over the history's time slots (episode boundaries, timestamps and every
  code's frequency are kept; order, and with it any A...B...C structure, is destroyed).
  False discoveries are controlled with the single-step max-statistic method (Westfall &
  Young): for each shuffled history the largest support reached by ANY pattern of the same
  length is recorded, and p_j = (1 + #{shuffles with max >= support_j}) / (1 + shuffles).
  This bounds the family-wise error rate over all patterns (hence also the FDR) at alpha.

Acceptance rule (every clause must hold):
  1. support >= ``accept_support`` independent episodes;
  2. p <= ``alpha`` (max-statistic, FWER over all patterns of that length);
  3. confidence = support / antecedent episodes >= ``min_confidence`` (C follows A...B at
     least that often);
  4. forward order beats reverse order: episodes with A...B > episodes with B...A;
  5. stable across time: support in >= ``min_partitions`` partitions and no partition holds
     more than ``max_partition_share`` of it (a burst in one period is not a regularity).
  6. triples only: the middle code is enriched between A and C, ``middle_lift`` > 1
     (``middle_lift``: see below).
Redundancy: a triple that shares its episodes with a stronger overlapping triple is dropped
(``_explain_away``). Accepted pairs that are sub-patterns of an accepted triple are folded
into the triple. Relations are predictive regularities, never claimed causes.

Middle enrichment. Episode counts alone cannot tell the rule's B from a frequent code X
that happens to fall between A and C: in the demo, ``coolant_low > payload_change >
overheat_alarm`` had exactly the support, antecedent support, reverse evidence and partition
spread of the planted ``coolant_low > duty_cycle_high > overheat_alarm`` (payload changes
occur several times in every mission, so one lands between A and C whenever A...C holds).
What differs is how surprising the middle is *given* A...C: in each episode with A...C, if
the middle code's k occurrences were placed at random among the episode's other slots, at
least one would land in the A...C span with probability P_e = 1 - C(n - s, k) / C(n, k)
(n free slots, s of them inside the span from the first A to the last C). The lift is the
number of episodes where it does, divided by sum P_e. A code several times per episode has
P_e near 1 and a lift near 1 (it is between A and C because it is everywhere); a code
placed there by a rule has a lift well above 1. Gap constraints are not re-applied here.
Overlapping triples of equal support are ranked by this lift.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np


@dataclass
class DiscoveryConfig:
    """Temporal constraints, candidate threshold and the documented acceptance rule."""

    min_gap: float = 0.0  # each consecutive step A->B, B->C must satisfy min_gap <= dt
    max_gap: float = math.inf  # ... and dt <= max_gap ("local" ablation: small)
    candidate_support: int = 2
    accept_support: int = 3
    alpha: float = 0.05
    permutations: int = 100
    min_confidence: float = 0.5
    min_partitions: int = 2
    max_partition_share: float = 0.75
    pairs: bool = True

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
        if self.permutations < 1:
            raise ValueError(f"permutations must be >= 1, got {self.permutations}")
        if not 0 <= self.min_confidence <= 1:
            raise ValueError(f"min_confidence must be in [0, 1], got {self.min_confidence}")
        if self.min_partitions < 1:
            raise ValueError(f"min_partitions must be >= 1, got {self.min_partitions}")
        if not 0 < self.max_partition_share <= 1:
            raise ValueError(f"max_partition_share must be in (0, 1], got "
                             f"{self.max_partition_share}")


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
    middle_lift: float = math.nan  # triples: B between A and C, observed / chance (see below)

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
    """Candidates, scored relations, the accepted set and the permutation nulls."""

    accepted: list[Relation]
    scored: list[Relation]  # patterns that passed the enrichment test, with all evidence
    candidates: dict[int, np.ndarray]  # length -> encoded keys of the over-complete set
    null_max: dict[int, np.ndarray]  # length -> max support in each shuffled history
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


# ----------------------------------------------------------------------------- counting
def _pair_slots(log: EventLog, cfg: DiscoveryConfig) -> tuple[np.ndarray, np.ndarray]:
    """Slot pairs (i < j) in one episode whose gap meets the constraints (codes ignored)."""
    n = len(log.code)
    ep, t = log.episode, log.time
    out_i, out_j = [], []
    for d in range(1, n):
        i = np.arange(n - d)
        j = i + d
        same = ep[i] == ep[j]
        gap = t[j] - t[i]
        within = same & (gap <= cfg.max_gap)
        if not within.any():  # times grow within an episode: larger d only widens gaps
            break
        ok = within & (gap >= cfg.min_gap)
        out_i.append(i[ok])
        out_j.append(j[ok])
    if not out_i:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(out_i), np.concatenate(out_j)


DENSE_LIMIT = 50_000_000
"""Key spaces up to this size are counted with bincount tables (O(n), no hashing)."""


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique by one sort (numpy's hash path is far slower on 10^7 int64 keys)."""
    values = np.sort(values)
    if values.size == 0:
        return values
    return values[np.concatenate(([True], values[1:] != values[:-1]))]


def _episode_support(episode: np.ndarray, keys: np.ndarray, space: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct-episode counts per key: (unique keys, counts, unique episode*space+key)."""
    if keys.size == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    combined = _sorted_unique(episode * space + keys)
    key_of = combined % space
    if space <= DENSE_LIMIT:
        dense = np.bincount(key_of, minlength=space)
        uk = np.flatnonzero(dense)
        return uk, dense[uk], combined
    key_of = np.sort(key_of)
    starts = np.flatnonzero(np.concatenate(([True], key_of[1:] != key_of[:-1])))
    counts = np.diff(np.concatenate((starts, [key_of.size])))
    return key_of[starts], counts, combined


def _lookup(keys: np.ndarray, counts: np.ndarray, query: np.ndarray,
            space: int | None = None) -> np.ndarray:
    """counts[key] for each query key, 0 where absent (dense table when the space is small)."""
    if keys.size == 0:
        return np.zeros(query.shape, np.int64)
    if space is not None and space <= DENSE_LIMIT:
        table = np.zeros(space, np.int64)
        table[keys] = counts
        return table[query]
    pos = np.clip(np.searchsorted(keys, query), 0, keys.size - 1)
    return np.where(keys[pos] == query, counts[pos], 0)


class _Slots:
    """Slot-level pair structure reused across shuffles (only codes change)."""

    def __init__(self, log: EventLog, cfg: DiscoveryConfig) -> None:
        self.pi, self.pj = _pair_slots(log, cfg)
        order = np.argsort(self.pi, kind="stable")
        self.pi, self.pj = self.pi[order], self.pj[order]
        self.n = len(log.code)

    def triples(self, code: np.ndarray, frequent_pair: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Slot triples (i, j, k) whose two consecutive code pairs are both frequent."""
        keep = frequent_pair
        pi, pj = self.pi[keep], self.pj[keep]
        if pi.size == 0:
            z = np.zeros(0, np.int64)
            return z, z, z
        start = np.searchsorted(pi, np.arange(self.n))
        count = np.bincount(pi, minlength=self.n)
        c = count[pj]
        total = int(c.sum())
        if total == 0:
            z = np.zeros(0, np.int64)
            return z, z, z
        rep = np.repeat(np.arange(pi.size), c)
        offs = np.arange(total) - np.repeat(np.cumsum(c) - c, c)
        k = pj[start[pj][rep] + offs]
        return pi[rep], pj[rep], k


def _count(log: EventLog, slots: _Slots, code: np.ndarray, threshold: int, want_triples: bool
           ) -> dict:
    """Pair and (pruned) triple supports for one code assignment of the slots."""
    v = log.n_codes
    ep = log.episode
    pair_keys = code[slots.pi] * v + code[slots.pj]
    pk, pc, pcomb = _episode_support(ep[slots.pi], pair_keys, v * v)
    out = {"pair": (pk, pc, pcomb)}
    if want_triples:
        frequent = _lookup(pk, pc, pair_keys, v * v) >= threshold
        i, j, k = slots.triples(code, frequent)
        tkeys = (code[i] * v + code[j]) * v + code[k]
        tk, tc, tcomb = _episode_support(ep[i], tkeys, v ** 3)
        out["triple"] = (tk, tc, tcomb)
        out["triple_slots"] = (i, j, k)
    return out


# ------------------------------------------------------------------------------ scoring
def _decode(key: int, length: int, v: int) -> tuple[int, ...]:
    out = []
    for _ in range(length):
        out.append(key % v)
        key //= v
    return tuple(reversed(out))


def _code_presence(log: EventLog) -> tuple[np.ndarray, np.ndarray]:
    """Episodes containing each code at least once: (codes, counts)."""
    keys, counts, _ = _episode_support(log.episode, log.code, log.n_codes)
    return keys, counts


def _partition_counts(log: EventLog, combined: np.ndarray, space: int, keys: np.ndarray
                      ) -> dict[int, np.ndarray]:
    """Per-partition support of each key in ``keys``."""
    parts = max(log.n_partitions, 1)
    key_of = combined % space
    sel = np.isin(key_of, keys)
    eps, ks = combined[sel] // space, key_of[sel]
    out = {int(k): np.zeros(parts, np.int64) for k in keys}
    np_part = log.partition[eps]
    for k, p in zip(ks.tolist(), np_part.tolist()):
        out[k][p] += 1
    return out


def _supporting(log: EventLog, combined: np.ndarray, space: int, keys: np.ndarray
                ) -> dict[int, tuple[int, ...]]:
    """Supporting episode ids of each key in ``keys`` (one sort, no per-key scans)."""
    key_of = combined % space
    sel = np.isin(key_of, keys)
    k, e = key_of[sel], combined[sel] // space
    order = np.argsort(k, kind="stable")
    k, e = k[order], log.episode_ids[e[order]]
    uk, first = np.unique(k, return_index=True)
    bounds = list(first[1:]) + [k.size]
    return {int(key): tuple(int(x) for x in e[lo:hi])
            for key, lo, hi in zip(uk.tolist(), first.tolist(), bounds)}


def _gaps(log: EventLog, slots: tuple[np.ndarray, ...], key_arr: np.ndarray, key: int
          ) -> tuple[tuple[float, float], ...]:
    sel = key_arr == key
    t = [log.time[s[sel]] for s in slots]
    return tuple((float((b - a).min()), float((b - a).max())) for a, b in zip(t, t[1:]))


def _reasons(support: int, p: float, confidence: float, forward: int, reverse: int,
             parts: np.ndarray, cfg: DiscoveryConfig) -> tuple[str, ...]:
    reasons = []
    if support < cfg.accept_support:
        reasons.append(f"support {support} < {cfg.accept_support}")
    if p > cfg.alpha:
        reasons.append(f"p {p:.3g} > alpha {cfg.alpha}")
    if confidence < cfg.min_confidence:
        reasons.append(f"confidence {confidence:.2f} < {cfg.min_confidence}")
    if forward <= reverse:
        reasons.append(f"reverse order {reverse} >= forward {forward}")
    spread = int((parts > 0).sum())
    if spread < cfg.min_partitions:
        reasons.append(f"support in {spread} partition(s) < {cfg.min_partitions}")
    share = float(parts.max() / parts.sum()) if parts.sum() else 1.0
    if share > cfg.max_partition_share:
        reasons.append(f"partition share {share:.2f} > {cfg.max_partition_share}")
    return tuple(reasons)


def _null_max(log: EventLog, slots: _Slots, cfg: DiscoveryConfig, rng: np.random.Generator,
              progress=None) -> dict[int, np.ndarray]:
    """Largest pair/triple support in each order-shuffled history (max-statistic null)."""
    pair_max = np.zeros(cfg.permutations, np.int64)
    triple_max = np.zeros(cfg.permutations, np.int64)
    for b in range(cfg.permutations):
        code = rng.permutation(log.code)
        counts = _count(log, slots, code, cfg.accept_support, want_triples=True)
        pc = counts["pair"][1]
        tc = counts["triple"][1]
        pair_max[b] = int(pc.max()) if pc.size else 0
        triple_max[b] = int(tc.max()) if tc.size else 0  # exact whenever >= accept_support
        if progress is not None:
            progress()
    return {2: pair_max, 3: triple_max}


def _enriched(counts: np.ndarray, null: np.ndarray, cfg: DiscoveryConfig) -> np.ndarray:
    """Mask of counts with support >= accept_support whose max-statistic p <= alpha."""
    ranked = np.sort(null)
    exceed = null.size - np.searchsorted(ranked, counts, side="left")  # null >= count
    p = (1 + exceed) / (1 + null.size)
    return (counts >= cfg.accept_support) & (p <= cfg.alpha)


def _p_value(null: np.ndarray, support: int) -> float:
    return float((1 + int((null >= support).sum())) / (1 + null.size))


def _episode_codes(log: EventLog) -> list[np.ndarray]:
    """Each episode's codes in time order (the log is sorted by episode, then time)."""
    bounds = np.searchsorted(log.episode, np.arange(len(log.episode_ids) + 1))
    return [log.code[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]


def middle_lift(sequences: list[np.ndarray], a: int, b: int, c: int) -> float:
    """Episodes with B between A and C, over the number expected if B's slots were random.

    Only episodes holding A...C count (the frame); each contributes its chance P_e that at
    least one of its B occurrences falls inside the span from the first A to the last C
    (see the module docstring). inf when the chance is 0 and B is there anyway.
    """
    observed, expected = 0, 0.0
    for seq in sequences:
        at_a, at_c = np.flatnonzero(seq == a), np.flatnonzero(seq == c)
        if at_a.size == 0 or at_c.size == 0 or at_c[-1] <= at_a[0]:
            continue
        first, last = int(at_a[0]), int(at_c[-1])
        at_b = np.flatnonzero(seq == b)
        if at_b.size == 0:
            continue
        free = len(seq) - 2  # the frame's A and C hold two slots
        inside = last - first - 1
        k = int(at_b.size)
        expected += 1.0 - math.comb(free - inside, k) / math.comb(free, k)
        observed += int(((at_b > first) & (at_b < last)).any())
    if expected == 0.0:
        return math.inf if observed else math.nan
    return observed / expected


def discover(log: EventLog, cfg: DiscoveryConfig, rng: np.random.Generator,
             progress=None) -> DiscoveryResult:
    """Run both stages over ``log``; ``rng`` drives the shuffles (seeded, passed in)."""
    import time as _time

    start = _time.perf_counter()
    v = log.n_codes
    slots = _Slots(log, cfg)
    obs = _count(log, slots, log.code, cfg.candidate_support, want_triples=True)
    pk, pc, pcomb = obs["pair"]
    tk, tc, tcomb = obs["triple"]
    ti, tj, tkk = obs["triple_slots"]
    tkey_slots = (log.code[ti] * v + log.code[tj]) * v + log.code[tkk]
    candidates = {2: pk[pc >= cfg.candidate_support], 3: tk[tc >= cfg.candidate_support]}
    null = _null_max(log, slots, cfg, rng, progress)
    present_k, present_c = _code_presence(log)

    scored: list[Relation] = []
    sequences = _episode_codes(log)
    # only patterns that pass the enrichment test become Relation objects (vectorised
    # filter: at 10^6 events there are ~10^5 patterns with support >= accept_support)
    score_t = tk[_enriched(tc, null[3], cfg)]
    t_parts = _partition_counts(log, tcomb, v ** 3, score_t)
    t_eps = _supporting(log, tcomb, v ** 3, score_t)
    for key in score_t.tolist():
        a, b, c = _decode(key, 3, v)
        support = int(_lookup(tk, tc, np.array([key]))[0])
        ab = int(_lookup(pk, pc, np.array([a * v + b]))[0])
        ba = int(_lookup(pk, pc, np.array([b * v + a]))[0])
        p = _p_value(null[3], support)
        parts = t_parts[key]
        conf = support / ab if ab else 0.0
        reasons = _reasons(support, p, conf, ab, ba, parts, cfg)
        lift = middle_lift(sequences, a, b, c)
        if not lift > 1.0:
            reasons += (f"middle {log.codes[b]} not enriched between {log.codes[a]} and "
                        f"{log.codes[c]} (lift {lift:.2f} <= 1)",)
        scored.append(Relation(
            pattern=(log.codes[a], log.codes[b], log.codes[c]), support=support,
            antecedent_support=ab, reverse=ba, partition_support=tuple(int(x) for x in parts),
            p_value=p, accepted=not reasons, reasons=reasons,
            episodes=t_eps[key],
            gaps=_gaps(log, (ti, tj, tkk), tkey_slots, key) if not reasons else (),
            middle_lift=lift))
    if cfg.pairs:
        score_p = pk[_enriched(pc, null[2], cfg)]
        p_parts = _partition_counts(log, pcomb, v * v, score_p)
        p_eps = _supporting(log, pcomb, v * v, score_p)
        pair_slot_keys = log.code[slots.pi] * v + log.code[slots.pj]
        for key in score_p.tolist():
            a, b = _decode(key, 2, v)
            support = int(_lookup(pk, pc, np.array([key]))[0])
            n_a = int(_lookup(present_k, present_c, np.array([a]))[0])
            ba = int(_lookup(pk, pc, np.array([b * v + a]))[0])
            p = _p_value(null[2], support)
            parts = p_parts[key]
            conf = support / n_a if n_a else 0.0
            reasons = _reasons(support, p, conf, support, ba, parts, cfg)
            scored.append(Relation(
                pattern=(log.codes[a], log.codes[b]), support=support, antecedent_support=n_a,
                reverse=ba, partition_support=tuple(int(x) for x in parts), p_value=p,
                accepted=not reasons, reasons=reasons,
                episodes=p_eps[key],
                gaps=_gaps(log, (slots.pi, slots.pj), pair_slot_keys, key)
                if not reasons else ()))
    scored = _explain_away(scored, cfg)
    accepted = _fold_subpatterns([r for r in scored if r.accepted])
    return DiscoveryResult(accepted=accepted, scored=scored, candidates=candidates,
                           null_max=null, config=cfg, n_events=len(log.code),
                           n_episodes=len(log.episode_ids),
                           seconds=_time.perf_counter() - start, codes=log.codes)


def _shares_ordered_pair(x: tuple[str, ...], y: tuple[str, ...]) -> bool:
    pairs = {(x[i], x[j]) for i in range(len(x)) for j in range(i + 1, len(x))}
    return any((y[i], y[j]) in pairs for i in range(len(y)) for j in range(i + 1, len(y)))


def _strength(rel: Relation) -> tuple[int, float]:
    """Rank of a triple in the redundancy step: support, then middle enrichment."""
    lift = rel.middle_lift
    return rel.support, (-1.0 if math.isnan(lift) else lift)


def _explain_away(scored: list[Relation], cfg: DiscoveryConfig) -> list[Relation]:
    """Reject triples whose evidence a stronger overlapping triple already explains.

    A chance code that happens to sit in several episodes of a real rule A...B...C forms
    triples such as X...A...B whose episodes are the rule's episodes. A triple is rejected
    when, after removing the episodes it shares with a stronger scored triple that has an
    ordered pair in common with it, fewer than ``accept_support`` episodes remain
    (closed-pattern style redundancy; two rules with their own episodes both survive).
    Stronger: more support, or equal support and a more enriched middle (``middle_lift``);
    without the tie-break two triples over the same episodes could never explain each
    other away, and a frequent code riding along a rule would stay.
    """
    triples = sorted((r for r in scored if len(r.pattern) == 3), key=_strength, reverse=True)
    out = []
    for rel in scored:
        if not rel.accepted or len(rel.pattern) != 3:
            out.append(rel)
            continue
        mine = set(rel.episodes)
        for other in triples:
            if _strength(other) <= _strength(rel):
                break
            if _shares_ordered_pair(rel.pattern, other.pattern):
                residual = len(mine - set(other.episodes))
                if residual < cfg.accept_support:
                    reason = (f"explained by {'>'.join(other.pattern)} "
                              f"(residual support {residual})")
                    rel = replace(rel, accepted=False, reasons=rel.reasons + (reason,))
                    break
        out.append(rel)
    return out


def _fold_subpatterns(accepted: list[Relation]) -> list[Relation]:
    """Drop accepted pairs that an accepted triple already contains (in the same order)."""
    covered = set()
    for r in accepted:
        if len(r.pattern) == 3:
            a, b, c = r.pattern
            covered |= {(a, b), (b, c), (a, c)}
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
