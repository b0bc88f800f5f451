"""Physical ranges, sensor noise and waveform helpers shared by the families and streams.

One place states what "normal" looks like on this robot so every family and every stream
draws its nuisance channels from the same distributions (a baseline that learns the range
of one family then sees the same range in the others).
"""

from __future__ import annotations

import numpy as np

from thinkmem_ros.core.vocabulary import SIGNALS

NOMINAL: dict[str, tuple[float, float]] = {
    "temperature": (38.0, 45.0),  # degC, motor housing at work
    "current": (4.0, 6.0),  # A, drive current
    "vibration": (1.5, 2.5),  # mm/s RMS
    "distance": (6.5, 9.5),  # m, nearest object
    "visibility": (0.80, 0.95),  # 0..1, camera visibility score
    "motion": (0.5, 1.2),  # m/s, base speed
    "load": (10.0, 25.0),  # kg, payload
}
"""Uniform ranges of the nominal level of each channel."""

NOISE_STD: dict[str, float] = {
    "temperature": 0.3,
    "current": 0.08,
    "vibration": 0.15,
    "distance": 0.05,
    "visibility": 0.02,
    "motion": 0.03,
    "load": 0.3,
}
"""Gaussian sensor noise per channel (one standard deviation)."""

LIMITS: dict[str, tuple[float, float]] = {
    "temperature": (-40.0, 150.0),
    "current": (-50.0, 50.0),
    "vibration": (0.0, 50.0),
    "distance": (0.2, 10.0),
    "visibility": (0.0, 1.0),
    "motion": (0.0, 3.0),
    "load": (0.0, 200.0),
}
"""Physical limits a sensor can report (range finders saturate at 0.2 and 10 m)."""

NOISE_VECTOR = np.array([NOISE_STD[s] for s in SIGNALS], dtype=np.float64)
LOW_LIMITS = np.array([LIMITS[s][0] for s in SIGNALS], dtype=np.float64)
HIGH_LIMITS = np.array([LIMITS[s][1] for s in SIGNALS], dtype=np.float64)
CH = {name: i for i, name in enumerate(SIGNALS)}
"""Column of each signal name (shorthand for vocabulary.signal_index)."""


def nominal_levels(n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` nominal operating points, one level per channel: (n, F)."""
    low = np.array([NOMINAL[s][0] for s in SIGNALS])
    high = np.array([NOMINAL[s][1] for s in SIGNALS])
    return rng.uniform(low, high, size=(n, len(SIGNALS)))


def nominal_windows(n: int, window: int, rng: np.random.Generator,
                    noise: bool = True) -> np.ndarray:
    """Windows of normal operation: level, a mild random drift and sensor noise, (n, K, F).

    The drift is at most a tenth of the channel's nominal spread over the window, far below
    any rule threshold, so these channels carry variation but no information.
    """
    levels = nominal_levels(n, rng)
    spread = np.array([NOMINAL[s][1] - NOMINAL[s][0] for s in SIGNALS])
    drift = rng.uniform(-0.1, 0.1, size=(n, 1, len(SIGNALS))) * spread
    ramp = np.linspace(0.0, 1.0, window)[None, :, None]
    out = levels[:, None, :] + drift * ramp
    if noise:
        out = out + sensor_noise(out.shape, rng)
    return clip_physical(out)


def sensor_noise(shape: tuple[int, ...], rng: np.random.Generator,
                 scale: float = 1.0) -> np.ndarray:
    """Gaussian noise with each channel's standard deviation; last axis is the channel."""
    return rng.standard_normal(shape) * (NOISE_VECTOR * scale)


def clip_physical(values: np.ndarray) -> np.ndarray:
    """Clip to what the sensors can report; NaN (dropout) passes through."""
    return np.clip(values, LOW_LIMITS, HIGH_LIMITS)


def render_knots(times: np.ndarray, start: float, knot_t: np.ndarray,
                 knot_v: np.ndarray) -> tuple[slice, np.ndarray]:
    """Evaluate a piecewise-linear profile placed at ``start`` on the frames it covers.

    Returns the slice of ``times`` it covers and the values there, so callers add or take
    the minimum without touching the frames outside the profile.
    """
    lo = int(np.searchsorted(times, start + knot_t[0], side="left"))
    hi = int(np.searchsorted(times, start + knot_t[-1], side="right"))
    cover = slice(lo, hi)
    return cover, np.interp(times[cover] - start, knot_t, knot_v)
