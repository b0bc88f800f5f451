"""What discovery takes and gives: configuration, event log, relations, the result.

Why apart: the knowledge life cycle, the LLM layer and the benches use these types without
the statistics behind them.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from thinkmem_ros.consolidator.discovery.arrays import _decode


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
    # factor 4 of evidence between two rungs; a finer one measured no better), continued
    # at its last ratio up to the median episode span where 64 falls short (bursts)
    scales: tuple[float, ...] = tuple(2.0 ** (k / 2) for k in range(-6, 13))
    max_lookback: int = 256  # events between two steps of a pattern, at most
    max_checked: int = 2000  # significant patterns examined in step 3 (strongest first)
    # the placement check (``placement.py``): off only to measure what it costs or saves
    placement: bool = True
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
    # an episode holding more distinct codes than this is left out of discovery: its
    # candidate rows grow with their square (``density.py``); 0 = keep every episode
    max_episode_codes: int = 64

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
        if self.max_episode_codes < 0 or 0 < self.max_episode_codes < 3:
            raise ValueError(f"max_episode_codes must be 0 (off) or >= 3, got "
                             f"{self.max_episode_codes}")
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
    # (E,) int64 independent source of each episode (the robot), or None where unknown:
    # a pattern whose support is all recent can still replicate across robots
    source: np.ndarray | None = None
    # (V,) bool: the codes patterns may be built from, or None for every code; set once on
    # the whole log (``fleet_vocabulary``) and carried by its parts
    eligible: np.ndarray | None = None

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
                        self.partition, self.episode_ids, self.codes, self.source,
                        self.eligible)

    def slice(self, first: int, last: int) -> EventLog:
        """Episodes ``first`` .. ``last - 1`` (renumbered from 0): a view, no copy of events."""
        lo, hi = np.searchsorted(self.episode, [first, last])
        return EventLog(self.episode[lo:hi] - first, self.time[lo:hi], self.code[lo:hi],
                        self.partition[first:last], self.episode_ids[first:last], self.codes,
                        None if self.source is None else self.source[first:last],
                        self.eligible)

    def select(self, rows: np.ndarray) -> EventLog:
        """Only the episodes whose row index is in ``rows`` (renumbered, order kept)."""
        rows = np.asarray(rows, dtype=np.int64)
        keep = np.isin(self.episode, rows)
        remap = np.full(len(self.episode_ids), -1, dtype=np.int64)
        remap[rows] = np.arange(len(rows))
        return EventLog(remap[self.episode[keep]], self.time[keep], self.code[keep],
                        self.partition[rows], self.episode_ids[rows], self.codes,
                        None if self.source is None else self.source[rows], self.eligible)


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
    p_placement: float = math.nan  # beyond the codes' usual places (nan: not run)
    significant: bool | None = None  # passed the family-wide FDR test (None: not known)

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

    @property
    def waiting(self) -> bool:
        """Refused only until the history can judge it (an element no real case tests yet)."""
        return any(WAITING in reason for reason in self.reasons)


WAITING = "waits for more evidence"
"""The tail of a refusal that more history can lift (``Relation.waiting``)."""


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
    # the episodes the discovery read: a unit it re-read in full and did not accept is refuted
    episode_ids: np.ndarray | None = None

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


def pairs_inside(triples: Iterable[tuple[str, ...]]) -> set[tuple[str, ...]]:
    """The ordered pairs the given triples contain (A...B, B...C, A...C of each)."""
    covered: set[tuple[str, ...]] = set()
    for a, b, c in triples:
        covered |= {(a, b), (b, c), (a, c)}
    return covered


def relation_f1(found: set[tuple[str, ...]], truth: set[tuple[str, ...]]) -> dict[str, float]:
    """Precision/recall/F1 of found ordered patterns against the planted ones."""
    tp = len(found & truth)
    fp = len(found - truth)
    fn = len(truth - found)
    precision = tp / (tp + fp) if tp + fp else (1.0 if not truth else 0.0)
    recall = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0
    return {"precision": precision, "recall": recall, "f1": f1}
