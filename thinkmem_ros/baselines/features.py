"""Aggregate summary features: what a summary-based memory keeps of a window.

A summary memory stores per-channel statistics instead of the sequence. These are the
statistics the paper's Summary-RAG and RF-Summary use (mean, std, min, max, start, end and
global change). They are deliberately blind to the *order* of intermediate observations,
which is exactly what the order-only family tests. A least-squares slope is left out on
purpose: it weights each value by its time index, so it encodes order, and with it a
"summary" memory quietly became a sequence memory (Summary-RAG reached F1 1.0 on Exp 1's
order-only histories, where the paper's order-insensitive summary gets ~0.5).
"""

from __future__ import annotations

import numpy as np

from thinkmem_ros.core.data import SituationSet

FEATURE_NAMES: tuple[str, ...] = ("mean", "std", "min", "max", "start", "end", "change")
"""Statistics per channel, in the order they appear in the feature vector."""


def _first_last(values: np.ndarray, observed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and last observed value per (row, channel); 0 where a channel is never seen."""
    k = values.shape[1]
    any_seen = observed.any(axis=1)  # (N, F)
    first_idx = np.argmax(observed, axis=1)  # (N, F)
    last_idx = k - 1 - np.argmax(observed[:, ::-1, :], axis=1)
    first = np.take_along_axis(values, first_idx[:, None, :], axis=1)[:, 0, :]
    last = np.take_along_axis(values, last_idx[:, None, :], axis=1)[:, 0, :]
    return np.where(any_seen, first, 0.0), np.where(any_seen, last, 0.0)


def summary_features(data: SituationSet) -> np.ndarray:
    """(N, F * 7) float64 statistics over the observed frames of each channel.

    Masked frames are ignored; a channel never observed in a window yields zeros, so the
    feature vector is always finite.
    """
    values = data.signals.astype(np.float64)  # (N, K, F)
    observed = data.mask > 0.5  # (N, K, F)
    weight = observed.astype(np.float64)
    count = weight.sum(axis=1)  # (N, F)
    safe = np.maximum(count, 1.0)
    mean = (values * weight).sum(axis=1) / safe
    centred = (values - mean[:, None, :]) * weight
    std = np.sqrt((centred ** 2).sum(axis=1) / safe)
    big = np.finfo(np.float64).max
    vmin = np.where(observed, values, big).min(axis=1)
    vmax = np.where(observed, values, -big).max(axis=1)
    seen = count > 0
    vmin = np.where(seen, vmin, 0.0)
    vmax = np.where(seen, vmax, 0.0)
    start, end = _first_last(values, observed)
    change = end - start
    stats = np.stack([mean, std, vmin, vmax, start, end, change], axis=2)  # (N, F, 7)
    return stats.reshape(stats.shape[0], -1)
