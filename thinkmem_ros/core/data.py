"""Containers for labelled situations and continuous signal streams.

Two shapes of data flow through the project: *situations* (fixed-length windows with
their thinking labels, what the policy and the baselines learn from) and *streams*
(continuous frames at a fixed rate with per-frame labels and discrete events, what bags,
the node and the demo replay). Both are plain numpy so the robot side can use them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from thinkmem_ros.core.vocabulary import SIGNALS, THINKING


@dataclass
class SituationSet:
    """N labelled situations: windows of K frames over F signals plus recent events.

    ``mask`` is 1 where a value was observed and 0 where it was missing or stale; masked
    entries in ``signals`` are 0 and carry no information. ``events`` holds the ids of the
    last M discrete events (0 = padding, ids index ``event_vocabulary`` from 1), oldest
    first, so order survives. ``groups`` names the independent unit each row came from
    (component identity or episode) so splits never leak one unit across train/test.
    """

    signals: np.ndarray  # (N, K, F) float32
    labels: np.ndarray  # (N, L) float32 in {0, 1}
    mask: np.ndarray | None = None  # (N, K, F) float32, None = all observed
    events: np.ndarray | None = None  # (N, M) int64, None = no events
    groups: np.ndarray | None = None  # (N,) int64
    label_names: tuple[str, ...] = THINKING
    signal_names: tuple[str, ...] = SIGNALS
    event_vocabulary: tuple[str, ...] = ()
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.signals = np.asarray(self.signals, dtype=np.float32)
        self.labels = np.asarray(self.labels, dtype=np.float32)
        if self.signals.ndim != 3:
            raise ValueError(f"signals must be (N, K, F), got shape {self.signals.shape}")
        n, k, f = self.signals.shape
        if f != len(self.signal_names):
            raise ValueError(f"signals have {f} channels but {len(self.signal_names)} names")
        if self.labels.shape != (n, len(self.label_names)):
            raise ValueError(
                f"labels must be ({n}, {len(self.label_names)}), got {self.labels.shape}")
        if self.mask is None:
            self.mask = np.ones_like(self.signals)
        self.mask = np.asarray(self.mask, dtype=np.float32)
        if self.mask.shape != self.signals.shape:
            raise ValueError(f"mask shape {self.mask.shape} != signals {self.signals.shape}")
        if self.events is None:
            self.events = np.zeros((n, 1), dtype=np.int64)
        self.events = np.asarray(self.events, dtype=np.int64)
        if self.events.ndim != 2 or self.events.shape[0] != n:
            raise ValueError(f"events must be (N, M) with N={n}, got {self.events.shape}")
        if self.groups is None:
            self.groups = np.arange(n, dtype=np.int64)
        self.groups = np.asarray(self.groups, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.signals.shape[0])

    @property
    def window(self) -> int:
        """Frames per situation (K)."""
        return int(self.signals.shape[1])

    def subset(self, index: np.ndarray) -> SituationSet:
        """Rows ``index`` as a new set sharing names and vocabulary."""
        return SituationSet(
            signals=self.signals[index], labels=self.labels[index], mask=self.mask[index],
            events=self.events[index], groups=self.groups[index],
            label_names=self.label_names, signal_names=self.signal_names,
            event_vocabulary=self.event_vocabulary, meta=_slice_meta(self.meta, index, len(self)))

    @staticmethod
    def concat(parts: list[SituationSet]) -> SituationSet:
        """Stack sets with equal window and names; events are right-aligned to the widest M."""
        if not parts:
            raise ValueError("concat needs at least one SituationSet")
        first = parts[0]
        width = max(p.events.shape[1] for p in parts)
        events = [np.pad(p.events, ((0, 0), (width - p.events.shape[1], 0))) for p in parts]
        return SituationSet(
            signals=np.concatenate([p.signals for p in parts]),
            labels=np.concatenate([p.labels for p in parts]),
            mask=np.concatenate([p.mask for p in parts]),
            events=np.concatenate(events),
            groups=np.concatenate([p.groups for p in parts]),
            label_names=first.label_names, signal_names=first.signal_names,
            event_vocabulary=first.event_vocabulary, meta=_concat_meta(parts))


def _slice_meta(meta: dict, index: np.ndarray, n: int) -> dict:
    """Per-row meta entries (arrays or lists of length N) follow the rows; the rest is kept."""
    out = {}
    for key, value in meta.items():
        if isinstance(value, (np.ndarray, list)) and len(value) == n:
            out[key] = np.asarray(value)[index]
        else:
            out[key] = value
    return out


def _concat_meta(parts: list[SituationSet]) -> dict:
    """Per-row meta present in every part is concatenated; anything else comes from the first."""
    out = dict(parts[0].meta)
    for key in parts[0].meta:
        values = [p.meta.get(key) for p in parts]
        if all(isinstance(v, (np.ndarray, list)) and len(v) == len(p)
               for v, p in zip(values, parts)):
            out[key] = np.concatenate([np.asarray(v) for v in values])
    return out


@dataclass
class SignalStream:
    """A continuous recording: T frames at ``rate_hz`` with per-frame ground truth.

    ``values`` holds NaN where a sensor dropped out. ``labels[t]`` is the thinking the
    situation ending at frame t requires. ``events`` are (time_s, name) pairs of discrete
    events, sorted by time.
    """

    rate_hz: float
    values: np.ndarray  # (T, F) float32, NaN = dropout
    labels: np.ndarray  # (T, L) float32
    events: list[tuple[float, str]] = field(default_factory=list)
    label_names: tuple[str, ...] = THINKING
    signal_names: tuple[str, ...] = SIGNALS
    scenario: str = ""

    @property
    def times(self) -> np.ndarray:
        """Frame timestamps in seconds from the start of the stream."""
        return np.arange(self.values.shape[0], dtype=np.float64) / self.rate_hz

    @property
    def duration_s(self) -> float:
        """Length of the stream in seconds."""
        return self.values.shape[0] / self.rate_hz


def signal_drop_mask(rows: int, signals: int, probability: float,
                     rng: np.random.Generator) -> np.ndarray:
    """(rows, 1, signals) float32 keep-mask: each signal of a row dropped with ``probability``.

    A dropped signal is masked for the whole window, the way a robot without that sensor
    (or one that declares it absent) fills its windows. Training with it makes permanent
    absence part of the training distribution instead of an input the policy never saw;
    at least one signal of every row is always kept, since a window with nothing
    observed carries no situation to label.
    """
    if not 0.0 <= probability < 1.0:
        raise ValueError(f"signal drop probability must be in [0, 1), got {probability!r}")
    if rows < 0 or signals < 1:
        raise ValueError(f"rows must be >= 0 and signals >= 1, got {rows}, {signals}")
    keep = rng.random((rows, signals)) >= probability
    empty = ~keep.any(axis=1)
    if empty.any():
        keep[np.flatnonzero(empty), rng.integers(0, signals, int(empty.sum()))] = True
    return keep.astype(np.float32)[:, None, :]
