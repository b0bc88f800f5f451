"""More training data from one recording: transform its signals, let the rules relabel them.

A robot's own recording is short (a few minutes make a few thousand overlapping windows)
and covers only what that drive happened to do: the Husky's first 70 % turned one way
and braked gently, so a policy fitted to it learned the drive instead of the rules
(hold-out micro-F1 0.74 against 0.98 on its own training part). When the labels come
from a rules file they are a function of the signals, so any transform of the signals
comes with exact labels for free: apply the rules again to the transformed stream.
Nothing here assumes what the rules say; a transform only has to produce signals a robot
could plausibly see, and the rules decide what they mean.

Each augmented copy of a stream, drawn from a seeded generator:

- **time stretch** by a factor in [1/``stretch``, ``stretch``] (linear interpolation, a
  missing sample stays missing): the same manoeuvre done faster or slower, so trend
  slopes and hold times land on both sides of their thresholds;
- **chunk shuffle**: the stream is cut into ``chunk_s`` pieces put back in a random
  order, so each manoeuvre is seen after other histories than the one it had; in a
  ``decorrelate`` share of the copies each signal is shuffled on its own, so a jolt meets
  turns it never met in the drive and the policy has to read each label from the signals
  its rule reads, not from what happened to coincide in one recording (on the Husky
  drive this lifted the hold-out F1 by about as much as doubling the copies did);
- **gain** per signal, log-uniform in [1/``gain``, ``gain``]: levels cross thresholds
  that the drive itself only approached;
- **sign flip** per signal with probability 1/2, only for signals that take both signs
  in the stream (a yaw rate, not a vector norm): a left turn where the drive had a
  right one.

Labels of hindsight feedback are not a function of the signals, so they are never
augmented this way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from thinkmem_ros.core.data import SignalStream

MAX_COPIES = 256
"""Relabelled copies of a recording at most: each is a full copy of its windows in memory
(the default 8 already adds most of what the transforms can vary)."""


@dataclass(frozen=True)
class AugmentConfig:
    """How many relabelled copies to add and how far each transform may go."""

    copies: int = 8
    decorrelate: float = 0.5
    stretch: float = 1.4
    gain: float = 1.7
    chunk_s: tuple[float, float] = (10.0, 30.0)
    flip_signs: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.copies, int) or not 0 <= self.copies <= MAX_COPIES:
            raise ValueError(f"copies must be an integer in [0, {MAX_COPIES}], got "
                             f"{self.copies!r}")
        if not 0.0 <= self.decorrelate <= 1.0:
            raise ValueError(f"decorrelate must be in [0, 1], got {self.decorrelate!r}")
        for name in ("stretch", "gain"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 1.0:
                raise ValueError(f"{name} must be a finite number >= 1, got {value!r}")
        low, high = self.chunk_s
        if not (math.isfinite(low) and math.isfinite(high) and 0 < low <= high):
            raise ValueError(f"chunk_s must be 0 < low <= high seconds, got {self.chunk_s!r}")


def stretch_time(values: np.ndarray, factor: float) -> np.ndarray:
    """Resample (T, F) frames ``factor`` times faster (> 1 shortens), NaN kept as NaN."""
    count = values.shape[0]
    src = np.arange(max(2, int(count / factor))) * factor
    src = src[src <= count - 1]
    low = np.floor(src).astype(np.int64)
    high = np.minimum(low + 1, count - 1)
    weight = (src - low)[:, None]
    return values[low] * (1.0 - weight) + values[high] * weight


def shuffle_chunks(values: np.ndarray, frames: int, rng: np.random.Generator) -> np.ndarray:
    """(T, F) frames cut into ``frames``-long pieces, concatenated in a random order."""
    pieces = [values[i:i + frames] for i in range(0, values.shape[0], max(1, frames))]
    return np.concatenate([pieces[i] for i in rng.permutation(len(pieces))])


def scale_signals(values: np.ndarray, config: AugmentConfig,
                  rng: np.random.Generator) -> np.ndarray:
    """Per-signal random gain, and a random sign for signals that take both signs."""
    out = values.copy()
    for j in range(values.shape[1]):
        column = values[:, j]
        seen = column[np.isfinite(column)]
        gain = math.exp(rng.uniform(-math.log(config.gain), math.log(config.gain)))
        two_signed = seen.size > 0 and seen.min() < 0.0 < seen.max()
        if config.flip_signs and two_signed and rng.random() < 0.5:
            gain = -gain
        out[:, j] = column * gain
    return out


def augmented_copy(stream: SignalStream, rules, config: AugmentConfig,
                   rng: np.random.Generator) -> SignalStream:
    """One transformed copy of ``stream`` with labels recomputed by ``rules``."""
    values = np.asarray(stream.values, dtype=np.float64)
    factor = math.exp(rng.uniform(-math.log(config.stretch), math.log(config.stretch)))
    values = stretch_time(values, factor)
    chunk = int(round(rng.uniform(*config.chunk_s) * stream.rate_hz))
    if rng.random() < config.decorrelate:
        values = np.concatenate([shuffle_chunks(values[:, j:j + 1], chunk, rng)
                                 for j in range(values.shape[1])], axis=1)
    else:
        values = shuffle_chunks(values, chunk, rng)
    values = scale_signals(values, config, rng)
    values = values.astype(np.float32)
    labels = rules.apply(values, stream.signal_names, stream.rate_hz)
    return replace(stream, values=values, labels=labels, events=[],
                   scenario=f"{stream.scenario}:augmented")


def augmented_copies(stream: SignalStream, rules, config: AugmentConfig,
                     rng: np.random.Generator) -> list[SignalStream]:
    """``config.copies`` relabelled copies of ``stream`` (see the module for the transforms)."""
    if tuple(rules.label_names) != tuple(stream.label_names):
        raise ValueError(f"the rules label {list(rules.label_names)} but the stream has "
                         f"{list(stream.label_names)}")
    return [augmented_copy(stream, rules, config, rng) for _ in range(config.copies)]
