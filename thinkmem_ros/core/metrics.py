"""Multi-label metrics every benchmark and the demo report the same way."""

from __future__ import annotations

import numpy as np


def micro_scores(truth: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """Micro precision, recall and F1 over all (row, label) cells.

    An empty prediction on an empty truth counts as perfect, so a quiet stretch of a
    stream scores 1.0 rather than 0/0.
    """
    truth = np.asarray(truth) > 0.5
    predicted = np.asarray(predicted) > 0.5
    if truth.shape != predicted.shape:
        raise ValueError(f"truth {truth.shape} and prediction {predicted.shape} differ")
    tp = float(np.logical_and(truth, predicted).sum())
    fp = float(np.logical_and(~truth, predicted).sum())
    fn = float(np.logical_and(truth, ~predicted).sum())
    precision = tp / (tp + fp) if tp + fp else (1.0 if fn == 0 else 0.0)
    recall = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0
    return {"precision": precision, "recall": recall, "f1": f1}


def mean_std(values: list[float] | np.ndarray) -> dict[str, float]:
    """The ``{"mean", "std"}`` cell of the benchmark JSON (population std, as numpy)."""
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), "std": float(arr.std())}
