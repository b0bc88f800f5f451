"""Fixed-rate situation windows assembled from the latest sample of each signal.

Sensors publish at their own rates, drop out, repeat stamps and arrive out of order; the
policy wants a clean (K, F) window at the bundle's frame rate plus the last M events. This
buffer is the only place that turns the first into the second, with plain numpy and no
ROS, so every rule below is unit-tested without DDS:

- a frame takes the latest accepted sample of each signal;
- a signal whose latest sample arrived more than ``stale_after_s`` ago (or never) is
  masked (value 0, mask 0) and counted: a dead sensor is never reused forever;
- NaN/inf samples, and finite ones beyond float32 range (the window's type, where they
  would become inf and fail every inference while they stay in it), are dropped and
  counted as invalid;
- a stamped sample whose stamp is not newer than the signal's latest accepted stamp is
  dropped and counted as a duplicate or out-of-order: the window only moves forward;
- except when a signal's stamps restarted without a clock jump (a bag looped without
  ``--clock``, a driver whose clock restarts): once the signal has gone stale and at least
  ``RESTART_RUN`` out-of-order samples in a row moved forward among themselves, the newest
  of them is accepted as the start of a new timeline and counted in ``stamp_restarts``.
  Refusing them forever would lock the signal out until a restart; a single stray old
  sample is still refused, and so is any while the signal is fresh;
- a stamp more than ``future_tolerance_s`` ahead of ``now`` is dropped and counted as
  ``future`` and never becomes the high-water mark, so one sample stamped in 2038 cannot
  make every later genuine sample "out of order"; old stamps (a recording played without
  sim time) stay legitimate;
- a backward step of the clock (a looped bag or a restarted simulation with sim time) by
  more than ``JUMP_BACK_S`` resets the window: latest samples, stamps, the ring and the
  events belong to the abandoned timeline and would otherwise blind or fake freshness;
- events keep their arrival order; the last M known events form the event history.

Times: ``now`` is the node clock (ROS time, so sim time works with bag playback) and
decides staleness; ``stamp`` is the message header stamp (ordering only); ``arrival`` is a
``time.perf_counter()`` reading used solely to measure latency.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

FLOAT32_MAX = float(np.finfo(np.float32).max)
RESTART_RUN = 3
"""Out-of-order samples in a row, each newer than the one before, that (once the signal
is stale) start a new timeline for it: one or two stray old samples never do."""
JUMP_BACK_S = 0.1
"""A clock step backwards larger than this resets the window (smaller steps only delay
stamps by at most that much, which the staleness limit already tolerates)."""


class Verdict(enum.Enum):
    """What happened to one offered sample or event."""

    ACCEPTED = "accepted"
    INVALID = "invalid"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"
    FUTURE = "future"
    UNKNOWN_EVENT = "unknown_event"


@dataclass
class BufferConfig:
    """Shape and rules of the window; validated so a bad bundle or parameter fails early."""

    signals: tuple[str, ...]
    window: int
    stale_after_s: float
    max_events: int = 1
    event_vocabulary: tuple[str, ...] = ()
    event_horizon_s: float = 0.0  # 0 = events never expire, only the last M are kept
    future_tolerance_s: float = 1.0  # stamps further ahead of the clock are refused

    def __post_init__(self) -> None:
        self.signals = tuple(self.signals)
        self.event_vocabulary = tuple(self.event_vocabulary)
        if not self.signals:
            raise ValueError("signals must name at least one signal")
        if len(set(self.signals)) != len(self.signals):
            raise ValueError(f"signals has duplicates: {list(self.signals)}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if not (self.stale_after_s > 0.0 and math.isfinite(self.stale_after_s)):
            raise ValueError(f"stale_after_s must be > 0, got {self.stale_after_s}")
        if self.max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {self.max_events}")
        if not (self.event_horizon_s >= 0.0 and math.isfinite(self.event_horizon_s)):
            raise ValueError(f"event_horizon_s must be >= 0, got {self.event_horizon_s}")
        if not self.future_tolerance_s > 0.0:  # math.inf turns the check off
            raise ValueError(f"future_tolerance_s must be > 0, got {self.future_tolerance_s}")


@dataclass
class Frame:
    """One assembled situation, ready for ``PolicyRuntime.predict_one``."""

    seq: int
    stamp: float  # node clock at assembly (s)
    signals: np.ndarray  # (K, F) float32, oldest row first
    mask: np.ndarray  # (K, F) float32, 1 = observed and fresh
    events: np.ndarray  # (M,) int64, oldest first, 0 = padding
    stale: tuple[str, ...]  # signals masked in the newest row (stale or never seen)
    last_arrival: float | None  # perf_counter of the newest sample in the newest row
    inputs_stamp: float | None  # newest header stamp among the newest row's samples
    assembled_at: float | None = None  # perf_counter when the frame was assembled


@dataclass
class BufferCounters:
    """Cumulative counts a diagnostic reports; per-signal where an operator needs the name."""

    accepted: dict[str, int] = field(default_factory=dict)
    invalid: dict[str, int] = field(default_factory=dict)
    duplicate: dict[str, int] = field(default_factory=dict)
    out_of_order: dict[str, int] = field(default_factory=dict)
    stale_frames: dict[str, int] = field(default_factory=dict)
    future: dict[str, int] = field(default_factory=dict)
    events_accepted: int = 0
    unknown_events: int = 0
    frames: int = 0
    time_jumps: int = 0
    stamp_restarts: dict[str, int] = field(default_factory=dict)  # new timelines taken

    def copy(self) -> BufferCounters:
        """Independent snapshot for a reader on another thread."""
        return BufferCounters(dict(self.accepted), dict(self.invalid), dict(self.duplicate),
                              dict(self.out_of_order), dict(self.stale_frames),
                              dict(self.future), self.events_accepted, self.unknown_events,
                              self.frames, self.time_jumps, dict(self.stamp_restarts))


class SituationBuffer:
    """Latest-sample store plus a K-row ring of assembled frames; thread-safe."""

    def __init__(self, config: BufferConfig) -> None:
        self.config = config
        n = len(config.signals)
        self._lock = threading.Lock()
        self._value = np.zeros(n, dtype=np.float32)
        self._received_at = np.full(n, -math.inf)  # node clock of the latest accepted sample
        self._stamp = np.full(n, -math.inf)  # header stamp of the latest stamped sample
        self._has_stamp = np.zeros(n, dtype=bool)
        self._behind_run = [0] * n  # out-of-order samples in a row, each newer than the last
        self._behind_last = [-math.inf] * n  # stamp of the newest of them
        self._arrival = np.full(n, math.nan)
        self._updated = np.zeros(n, dtype=bool)  # new sample since the last frame
        self._n_updated = 0  # count of True in _updated (complete() runs once per sample)
        self._ring_values = np.zeros((config.window, n), dtype=np.float32)
        self._ring_mask = np.zeros((config.window, n), dtype=np.float32)
        self._head = 0  # next row to write; rows before it (cyclically) are older
        self._rows = np.arange(config.window)  # (rows + head) % K: oldest row first
        self._events: deque[tuple[str, float]] = deque(maxlen=config.max_events)
        self._event_ids = {name: i + 1 for i, name in enumerate(config.event_vocabulary)}
        self._last_event: tuple[str, float | None] | None = None
        self._last_now = -math.inf  # newest clock reading seen, to notice backward steps
        self.counters = BufferCounters(
            **{key: {s: 0 for s in config.signals}
               for key in ("accepted", "invalid", "duplicate", "out_of_order", "stale_frames",
                           "future", "stamp_restarts")})

    @property
    def signals(self) -> tuple[str, ...]:
        """Signal names in window column order."""
        return self.config.signals

    def offer(self, index: int, value: float, *, now: float, stamp: float | None = None,
              arrival: float | None = None) -> Verdict:
        """Offer one sample of signal ``index``; only ACCEPTED samples change the window."""
        name = self.config.signals[index]
        with self._lock:
            self._see_clock(now)
            if not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
                self.counters.invalid[name] += 1
                return Verdict.INVALID
            if stamp is not None and not stamp <= now + self.config.future_tolerance_s:
                self.counters.future[name] += 1  # NaN stamps land here too
                return Verdict.FUTURE
            if stamp is not None and self._has_stamp[index]:
                if stamp == self._stamp[index]:
                    self.counters.duplicate[name] += 1
                    return Verdict.DUPLICATE
                if stamp < self._stamp[index] and not self._restarted(index, stamp, now):
                    self.counters.out_of_order[name] += 1
                    return Verdict.OUT_OF_ORDER
            if stamp is not None:
                self._stamp[index] = stamp
                self._has_stamp[index] = True
            self._behind_run[index] = 0
            self._value[index] = value
            self._received_at[index] = now
            self._arrival[index] = math.nan if arrival is None else arrival
            if not self._updated[index]:
                self._updated[index] = True
                self._n_updated += 1
            self.counters.accepted[name] += 1
            return Verdict.ACCEPTED

    def _restarted(self, index: int, stamp: float, now: float) -> bool:
        """Whether this out-of-order sample starts a new timeline (counted); see the module."""
        if stamp > self._behind_last[index]:
            self._behind_run[index] += 1
        else:
            self._behind_run[index] = 1  # not moving forward: a new run starts here
        self._behind_last[index] = stamp
        if (self._behind_run[index] < RESTART_RUN
                or now - self._received_at[index] <= self.config.stale_after_s):
            return False
        self.counters.stamp_restarts[self.config.signals[index]] += 1
        return True

    def offer_event(self, name: str, *, now: float, stamp: float | None = None) -> Verdict:
        """Append a discrete event; unknown names and exact repeats (same stamp) are dropped."""
        with self._lock:
            self._see_clock(now)
            if name not in self._event_ids:
                self.counters.unknown_events += 1
                return Verdict.UNKNOWN_EVENT
            if stamp is not None and self._last_event == (name, stamp):
                return Verdict.DUPLICATE
            self._last_event = (name, stamp)
            self._events.append((name, now))
            self.counters.events_accepted += 1
            return Verdict.ACCEPTED

    def reset_time(self, now: float) -> None:
        """Forget everything tied to the old timeline after the clock jumped backwards.

        Latest samples, their stamps and clock readings, the ring and the events all refer
        to times the clock has left: kept, the stamps would refuse every genuine sample as
        out of order and the clock readings would keep dead signals "fresh". Counters stay.
        """
        with self._lock:
            self._reset(now)

    def _reset(self, now: float) -> None:
        self._value[:] = 0.0
        self._received_at[:] = -math.inf
        self._stamp[:] = -math.inf
        self._has_stamp[:] = False
        self._behind_run = [0] * len(self._behind_run)
        self._behind_last = [-math.inf] * len(self._behind_last)
        self._arrival[:] = math.nan
        self._updated[:] = False
        self._n_updated = 0
        self._ring_values[:] = 0.0
        self._ring_mask[:] = 0.0
        self._head = 0
        self._events.clear()
        self._last_event = None
        self._last_now = now
        self.counters.time_jumps += 1

    def _see_clock(self, now: float) -> None:
        """Reset on a backward clock step the node's jump callback did not report first."""
        if now < self._last_now - JUMP_BACK_S:
            self._reset(now)
        elif now > self._last_now:
            self._last_now = now

    def set_event_vocabulary(self, vocabulary: tuple[str, ...]) -> None:
        """Adopt a new bundle's event ids; held events are re-mapped by name, not by id."""
        with self._lock:
            self._event_ids = {name: i + 1 for i, name in enumerate(vocabulary)}
            self.config.event_vocabulary = tuple(vocabulary)

    def fresh(self, now: float) -> np.ndarray:
        """Boolean (F,) of signals whose latest sample is within the staleness limit."""
        with self._lock:
            return self._fresh(now)

    def _fresh(self, now: float) -> np.ndarray:
        return (now - self._received_at) <= self.config.stale_after_s

    def complete(self, now: float) -> bool:
        """Whether every fresh signal has a new sample since the last frame (sample trigger).

        Asked once per accepted sample, so it stops at the first fresh signal still
        waiting rather than building arrays over all of them.
        """
        with self._lock:
            if self._n_updated == 0:
                return False
            if self._n_updated == len(self._updated):
                return True
            limit = self.config.stale_after_s
            received = self._received_at
            for i, done in enumerate(self._updated.tolist()):
                if not done and now - received[i] <= limit:
                    return False  # a fresh signal has no new sample yet
            return True

    def assemble(self, now: float) -> Frame:
        """Write the newest row from the latest samples and return the whole window."""
        cfg = self.config
        with self._lock:
            self._see_clock(now)
            fresh = self._fresh(now)
            row = self._head
            self._ring_values[row] = np.where(fresh, self._value, 0.0)
            self._ring_mask[row] = fresh.astype(np.float32)
            self._head = (row + 1) % cfg.window
            order = (self._rows + self._head) % cfg.window  # oldest row first
            stale = tuple(s for s, ok in zip(cfg.signals, fresh, strict=True) if not ok)
            for name in stale:
                self.counters.stale_frames[name] += 1
            arrivals = self._arrival[fresh & self._updated]
            arrivals = arrivals[~np.isnan(arrivals)]
            stamps = self._stamp[fresh & self._has_stamp]
            self._updated[:] = False
            self._n_updated = 0
            self.counters.frames += 1
            return Frame(  # fancy indexing copies: the frame owns its window
                seq=self.counters.frames, stamp=now,
                signals=self._ring_values[order], mask=self._ring_mask[order],
                events=self._event_array(now), stale=stale,
                last_arrival=float(arrivals.max()) if arrivals.size else None,
                inputs_stamp=float(stamps.max()) if stamps.size else None,
                assembled_at=time.perf_counter())

    def _event_array(self, now: float) -> np.ndarray:
        horizon = self.config.event_horizon_s
        ids = [self._event_ids[name] for name, at in self._events
               if name in self._event_ids and (horizon == 0.0 or now - at <= horizon)]
        out = np.zeros(self.config.max_events, dtype=np.int64)
        if ids:
            out[-len(ids):] = ids  # right-aligned: the newest event is always last
        return out

    def snapshot(self) -> BufferCounters:
        """Counters copied under the lock."""
        with self._lock:
            return self.counters.copy()
