"""When to consolidate: the paper's chi_t = period OR |B_t| >= B OR novelty OR repeated failure.

The consolidator keeps a bounded temporary buffer B_t of the last L experiences. Running
discovery and retraining on every experience would be wasteful, and waiting for a fixed
period alone would react slowly to a burst of novel situations or a run of failures, so
any one of four conditions fires a consolidation round.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class TriggerConfig:
    """Thresholds of the consolidation trigger; validated so a typo cannot disable it."""

    period_s: float = 300.0
    buffer_limit: int = 2000  # B: consolidate once this many new experiences arrived
    buffer_capacity: int = 10000  # L: the temporary buffer keeps the last L experiences
    novelty_threshold: float = 0.5  # novelty score of one experience that counts as novel
    novelty_count: int = 50  # this many novel experiences since the last round fire it
    failure_count: int = 5  # this many consecutive failures (reward < 0) fire it
    min_new: int = 1  # never consolidate with fewer new experiences than this

    def __post_init__(self) -> None:
        for name in ("period_s", "novelty_threshold"):
            if not getattr(self, name) > 0:  # NaN too: it would never fire, never fail
                raise ValueError(f"TriggerConfig.{name} must be > 0, got {getattr(self, name)}")
        for name in ("buffer_limit", "buffer_capacity", "novelty_count", "failure_count",
                     "min_new"):
            if not 1 <= getattr(self, name) <= COUNT_MAX:  # past it: an OverflowError later
                raise ValueError(f"TriggerConfig.{name} must be in [1, {COUNT_MAX:g}], got "
                                 f"{getattr(self, name)}")
        if self.buffer_limit > self.buffer_capacity:
            raise ValueError(
                f"TriggerConfig.buffer_limit ({self.buffer_limit}) cannot exceed "
                f"buffer_capacity ({self.buffer_capacity})")


COUNT_MAX = 1e9
"""Largest count a trigger takes (10^9 experiences is more than a day of a fleet's rows)."""


@dataclass
class ConsolidationTrigger:
    """Tracks the temporary buffer and says whether, and why, to consolidate now."""

    config: TriggerConfig = field(default_factory=TriggerConfig)
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.buffer: deque = deque(maxlen=self.config.buffer_capacity)
        self._last_round = self.clock()
        self._new = 0
        self._novel = 0
        self._failures = 0

    def observe(self, item: object, *, novelty: float = 0.0, reward: float | None = None) -> None:
        """Add one experience (any object) with its novelty score and optional reward."""
        self.buffer.append(item)
        self._new += 1
        if novelty >= self.config.novelty_threshold:
            self._novel += 1
        if reward is not None:
            self._failures = self._failures + 1 if reward < 0 else 0

    def reason(self) -> str | None:
        """Name of the condition that fires now ('period', 'buffer', 'novelty', 'failure')."""
        cfg = self.config
        if self._new < cfg.min_new:
            return None
        if self._failures >= cfg.failure_count:
            return "failure"
        if self._novel >= cfg.novelty_count:
            return "novelty"
        if self._new >= cfg.buffer_limit:
            return "buffer"
        if self.clock() - self._last_round >= cfg.period_s:
            return "period"
        return None

    def consolidated(self) -> None:
        """Reset the counters after a round; the buffer keeps its last L items."""
        self._last_round = self.clock()
        self._new = self._novel = self._failures = 0
