"""Synthetic event histories with hidden long-range A...B...C rules (seed 000, Experiment 6).

Event codes (``E016``, ``E176`` ...) carry no meaning, so nothing but repeated evidence
across independent episodes can reveal a rule. Every rule is planted ``repetitions`` times,
each time in its own episode, with long random gaps between A, B and C and background
events in between. The history also holds the paper's counter-evidence: isolated A, B and
C; A...B not followed by C; reversed B...A; neutral episodes; and decoy triples that repeat
strongly but only inside ONE temporal partition (a burst, not a stable regularity). A null
stream holds background events only, so any relation found there is a false discovery.

Episodes are laid out one after another in time; partition p holds the p-th contiguous
block of the timeline, which is what cross-partition stability is measured over.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

KINDS: tuple[str, ...] = (
    "rule", "isolated_a", "isolated_b", "isolated_c", "ab_without_c", "reversed_ba",
    "neutral", "decoy",
)
"""Episode kinds; every kind but ``rule``/``decoy``/``neutral`` is counter-evidence."""

COUNTER_KINDS: tuple[str, ...] = (
    "isolated_a", "isolated_b", "isolated_c", "ab_without_c", "reversed_ba")


@dataclass
class EventWorldConfig:
    """Size and difficulty of one generated history (defaults used by ``bench exp6``)."""

    n_codes: int = 300
    n_rules: int = 3
    repetitions: int = 8
    n_partitions: int = 4
    episode_duration: float = 200.0
    background_rate: float = 0.1  # background events per time unit (~20 per episode)
    gap_min: float = 20.0  # A->B and B->C gaps are drawn from [gap_min, gap_max]
    gap_max: float = 60.0
    counter_per_kind: int = 2  # episodes of each counter-evidence kind, per rule
    n_neutral: int = 30
    n_decoys: int = 2
    decoy_repetitions: int = 8  # all inside one partition
    null_stream: bool = False

    def __post_init__(self) -> None:
        positive_ints = ("n_codes", "n_partitions")
        for key in positive_ints:
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("n_rules", "repetitions", "counter_per_kind", "n_neutral", "n_decoys",
                    "decoy_repetitions"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        if not 0 < self.gap_min <= self.gap_max:
            raise ValueError(f"need 0 < gap_min <= gap_max, got {self.gap_min}, {self.gap_max}")
        if 2 * self.gap_max >= self.episode_duration:
            raise ValueError(f"episode_duration {self.episode_duration} must exceed "
                             f"2 * gap_max = {2 * self.gap_max}")
        if self.background_rate < 0:
            raise ValueError(f"background_rate must be >= 0, got {self.background_rate}")
        if 3 * (self.n_rules + self.n_decoys) > self.n_codes:
            raise ValueError(f"n_codes {self.n_codes} too small for {self.n_rules} rules and "
                             f"{self.n_decoys} decoys (3 distinct codes each)")


@dataclass
class Episode:
    """One independent episode: time-sorted (time, code) events and where it sits in time."""

    episode_id: int
    partition: int
    start_time: float
    kind: str
    rule: int  # index into rules (or decoys for kind "decoy"); -1 when none
    events: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class EventHistory:
    """A generated history plus its ground truth (rules are (A, B, C) code triples)."""

    episodes: list[Episode]
    rules: list[tuple[str, str, str]]
    decoys: list[tuple[str, str, str]]
    codes: tuple[str, ...]
    config: EventWorldConfig

    @property
    def n_events(self) -> int:
        """Total number of events over all episodes."""
        return sum(len(ep.events) for ep in self.episodes)

    def kinds(self) -> dict[str, int]:
        """How many episodes of each kind the history holds."""
        out = {kind: 0 for kind in KINDS}
        for ep in self.episodes:
            out[ep.kind] += 1
        return out


def code_names(n_codes: int) -> tuple[str, ...]:
    """Meaningless event codes ``E000``..``E{n-1}`` (three digits at least)."""
    width = max(3, len(str(n_codes - 1)))
    return tuple(f"E{i:0{width}d}" for i in range(n_codes))


def _background(cfg: EventWorldConfig, codes: tuple[str, ...],
                rng: np.random.Generator) -> list[tuple[float, str]]:
    n = int(rng.poisson(cfg.background_rate * cfg.episode_duration))
    times = rng.uniform(0.0, cfg.episode_duration, size=n)
    picks = rng.integers(0, len(codes), size=n)
    return [(float(t), codes[int(c)]) for t, c in zip(times, picks)]


def _chain(cfg: EventWorldConfig, items: tuple[str, ...],
           rng: np.random.Generator) -> list[tuple[float, str]]:
    """Place ``items`` in order with long random gaps, starting anywhere that still fits."""
    span = cfg.gap_max * (len(items) - 1)
    t = float(rng.uniform(0.0, cfg.episode_duration - span))
    out = [(t, items[0])]
    for item in items[1:]:
        t += float(rng.uniform(cfg.gap_min, cfg.gap_max))
        out.append((t, item))
    return out


def _planted(kind: str, triple: tuple[str, str, str], cfg: EventWorldConfig,
             rng: np.random.Generator) -> list[tuple[float, str]]:
    a, b, c = triple
    if kind in ("rule", "decoy"):
        return _chain(cfg, (a, b, c), rng)
    if kind == "ab_without_c":
        return _chain(cfg, (a, b), rng)
    if kind == "reversed_ba":
        return _chain(cfg, (b, a), rng)
    single = {"isolated_a": a, "isolated_b": b, "isolated_c": c}[kind]
    return [(float(rng.uniform(0.0, cfg.episode_duration)), single)]


def generate_event_history(cfg: EventWorldConfig, rng: np.random.Generator) -> EventHistory:
    """Draw rules, decoys and episodes from ``rng``; the same seed gives the same history."""
    codes = code_names(cfg.n_codes)
    n_rules = 0 if cfg.null_stream else cfg.n_rules
    n_decoys = 0 if cfg.null_stream else cfg.n_decoys
    picks = rng.choice(cfg.n_codes, size=3 * (n_rules + n_decoys), replace=False)
    triples = [tuple(codes[int(i)] for i in picks[3 * j:3 * j + 3]) for j in
               range(n_rules + n_decoys)]
    rules, decoys = triples[:n_rules], triples[n_rules:]

    specs: list[tuple[str, int]] = []  # (kind, rule index) of non-decoy episodes
    for r in range(n_rules):
        specs += [("rule", r)] * cfg.repetitions
        for kind in COUNTER_KINDS:
            specs += [(kind, r)] * cfg.counter_per_kind
    specs += [("neutral", -1)] * cfg.n_neutral
    if cfg.null_stream:  # same size as the stream with rules, but background only
        size = (cfg.n_rules * (cfg.repetitions + len(COUNTER_KINDS) * cfg.counter_per_kind)
                + cfg.n_neutral + cfg.n_decoys * cfg.decoy_repetitions)
        specs = [("neutral", -1)] * size
    order = rng.permutation(len(specs))
    blocks = [list(chunk) for chunk in np.array_split(order, cfg.n_partitions)]
    timeline: list[list[tuple[str, int]]] = [[specs[int(i)] for i in blk] for blk in blocks]
    for d in range(n_decoys):  # a decoy bursts inside one partition only
        part = int(rng.integers(0, cfg.n_partitions))
        for _ in range(cfg.decoy_repetitions):
            pos = int(rng.integers(0, len(timeline[part]) + 1))
            timeline[part].insert(pos, ("decoy", d))

    episodes: list[Episode] = []
    for part, block in enumerate(timeline):
        for kind, idx in block:
            events = _background(cfg, codes, rng)
            if kind != "neutral":
                source = decoys[idx] if kind == "decoy" else rules[idx]
                events += _planted(kind, source, cfg, rng)
            events.sort(key=lambda e: e[0])
            eid = len(episodes)
            episodes.append(Episode(episode_id=eid, partition=part,
                                    start_time=eid * cfg.episode_duration, kind=kind,
                                    rule=idx, events=events))
    return EventHistory(episodes=episodes, rules=rules, decoys=decoys, codes=codes,
                        config=cfg)
