"""Score activations against ground truth: plain numpy, shared by the ROS and offline demos.

Both demo modes reduce to the same question: for each activation, which ground-truth
frame did the policy see last? The ROS path answers it by time stamps, the offline path
by construction; from there precision/recall/F1, latency percentiles and the timeline
are computed identically, so the two modes report comparable numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from thinkmem_ros.core.metrics import micro_scores

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


@dataclass
class Timeline:
    """Per-frame signals, truth and what the policy activated, ready to score and plot."""

    times_s: np.ndarray  # (T,) seconds from the first frame
    values: np.ndarray  # (T, F) float32, NaN = no sample
    truth: np.ndarray  # (T, L) {0, 1}
    predicted: np.ndarray  # (T, L) {0, 1}, the last activation matched to the frame
    evaluated: np.ndarray  # (T,) bool, frames that got at least one activation
    signal_names: tuple[str, ...]
    label_names: tuple[str, ...]
    rows_truth: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # (A, L)
    rows_predicted: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # (A, L)


def match_frames(activation_stamps_ns: np.ndarray, frame_ready_ns: np.ndarray) -> np.ndarray:
    """Index of the latest frame ready at or before each activation stamp (-1 = none yet).

    ``frame_ready_ns`` must be non-decreasing: the time each frame's last sample was
    published (wall clock) or its bag stamp (simulated time).
    """
    ready = np.asarray(frame_ready_ns, dtype=np.int64)
    if ready.size > 1 and np.any(np.diff(ready) < 0):
        raise ValueError("frame_ready_ns must be non-decreasing")
    stamps = np.asarray(activation_stamps_ns, dtype=np.int64)
    return np.searchsorted(ready, stamps, side="right") - 1


def label_matrix(active: list[list[str]], label_names: tuple[str, ...]) -> np.ndarray:
    """Rows of active label names -> (A, L) {0, 1}; labels outside the vocabulary are ignored.

    A retrained bundle may add discovered labels (``consider:...``) the ground truth does
    not know; they are neither hits nor misses against this ground truth.
    """
    index = {name: i for i, name in enumerate(label_names)}
    out = np.zeros((len(active), len(label_names)), dtype=np.float32)
    for row, names in enumerate(active):
        for name in names:
            if name in index:
                out[row, index[name]] = 1.0
    return out


def build_timeline(times_s: np.ndarray, values: np.ndarray, truth: np.ndarray,
                   frames: np.ndarray, predicted_rows: np.ndarray, *, min_frame: int,
                   signal_names: tuple[str, ...], label_names: tuple[str, ...]) -> Timeline:
    """Assemble a Timeline from activations already matched to ``frames``.

    Activations matched before ``min_frame`` (the policy's window was not yet full of
    recorded frames) or to no frame are left out of the score.
    """
    frames = np.asarray(frames, dtype=np.int64)
    keep = (frames >= min_frame) & (frames < truth.shape[0])
    frames, predicted_rows = frames[keep], np.asarray(predicted_rows)[keep]
    predicted = np.zeros_like(truth, dtype=np.float32)
    evaluated = np.zeros(truth.shape[0], dtype=bool)
    predicted[frames] = predicted_rows  # later activations of the same frame win
    evaluated[frames] = True
    return Timeline(times_s=np.asarray(times_s), values=np.asarray(values), truth=truth,
                    predicted=predicted, evaluated=evaluated, signal_names=signal_names,
                    label_names=label_names, rows_truth=truth[frames],
                    rows_predicted=predicted_rows)


def percentiles(samples, scale: float = 1.0) -> dict[str, float]:
    """p50/p90/p99/p99.9/max/mean/count of ``samples * scale`` (empty -> count 0 only)."""
    arr = np.asarray(samples, dtype=np.float64) * scale
    if arr.size == 0:
        return {"count": 0}
    out = {f"p{p:g}": float(np.percentile(arr, p)) for p in PERCENTILES}
    out.update(max=float(arr.max()), mean=float(arr.mean()), count=int(arr.size))
    return out


def score(timeline: Timeline) -> dict:
    """Micro and per-label precision/recall/F1 over every matched activation."""
    truth, pred = timeline.rows_truth, timeline.rows_predicted
    if truth.size == 0:
        raise ValueError("no activations matched a ground-truth frame; nothing to score")
    per_label = {}
    for j, name in enumerate(timeline.label_names):
        cell = micro_scores(truth[:, j:j + 1], pred[:, j:j + 1])
        cell["support"] = int(truth[:, j].sum())
        cell["predicted"] = int(pred[:, j].sum())
        per_label[name] = cell
    return {"micro": micro_scores(truth, pred), "per_label": per_label,
            "activations_scored": int(truth.shape[0]),
            "frames_scored": int(timeline.evaluated.sum()),
            "exact_match": float(np.mean(np.all((truth > 0.5) == (pred > 0.5), axis=1)))}
