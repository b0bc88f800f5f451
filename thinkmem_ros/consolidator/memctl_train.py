"""Offboard fitting of the COMPRESS and RECALL probes, and their ground-truth label rules.

Why: the probes must learn from situations whose answer is known. The synthetic world gives
per-frame thinking ground truth, from which these documented rules derive the labels of a
window ending at frame t (K frames, stream rate r):

COMPRESS(t) = 1  iff no thinking label is active in any frame of [t - K - H + 1, t], the
    window plus ``horizon_s`` (H = horizon_s * r frames, default 10 s) behind it. Then no
    pattern is pending: nothing that is happening now or has just ended began in the older
    frames, so the raw frames behind the window can be summarised and released.
RECALL(t) = 1    iff the ground-truth label set at t is rare (frequency below ``rare_frac``,
    default 2 %, in the reference windows the frequencies are counted on) or the label set
    changes within ``transition_s`` (default 0.5 s) either side of t. Rare situations are
    novel to the policy, transitions are where it is uncertain; both are where explicit
    episodic evidence helps.

The probes are scikit-learn ``LogisticRegression`` fits on standardised embeddings (balanced
class weights); the standardisation is folded into the weights so the robot applies
``sigmoid(w . e + b)`` with numpy alone.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from ..data import SignalStream, SituationSet
from ..memctl import MemctlHeads, ProbeHead


def compress_targets(frame_labels: np.ndarray, end_frames: np.ndarray, window: int,
                     rate_hz: float, horizon_s: float = 10.0) -> np.ndarray:
    """COMPRESS labels (n,) for windows ending at ``end_frames`` (module docstring rule)."""
    any_active = frame_labels.max(axis=1) > 0  # (T,)
    csum = np.concatenate([[0], np.cumsum(any_active)])
    span = window + int(round(horizon_s * rate_hz))
    start = np.maximum(end_frames - span + 1, 0)
    return (csum[end_frames + 1] - csum[start] == 0).astype(np.int64)


def label_set_keys(labels: np.ndarray) -> np.ndarray:
    """One integer key per label set (bit mask over columns)."""
    bits = (np.asarray(labels) > 0).astype(np.int64)
    return bits @ (1 << np.arange(bits.shape[1], dtype=np.int64))


def set_frequencies(labels: np.ndarray) -> dict[int, float]:
    """Frequency of each label set among reference windows."""
    keys, counts = np.unique(label_set_keys(labels), return_counts=True)
    return dict(zip(keys.tolist(), (counts / counts.sum()).tolist(), strict=True))


def recall_targets(frame_labels: np.ndarray, end_frames: np.ndarray, rate_hz: float,
                   frequencies: dict[int, float], rare_frac: float = 0.02,
                   transition_s: float = 0.5) -> np.ndarray:
    """RECALL labels (n,) for windows ending at ``end_frames`` (module docstring rule)."""
    keys = label_set_keys(frame_labels)  # (T,)
    rare = np.array([frequencies.get(k, 0.0) < rare_frac for k in keys[end_frames]])
    change = np.concatenate([[False], keys[1:] != keys[:-1]])  # change into frame i
    csum = np.concatenate([[0], np.cumsum(change)])
    w = int(round(transition_s * rate_hz))
    lo = np.maximum(end_frames - w + 1, 0)
    hi = np.minimum(end_frames + w, keys.size - 1)
    near = csum[hi + 1] - csum[lo] > 0
    return (rare | near).astype(np.int64)


def metadata_features(stream: SignalStream, windows: SituationSet) -> np.ndarray:
    """Length/step-count and metadata features for the baselines (no signal content).

    Columns: log1p(step count since start), observed fraction of the window, number of
    events in the history, log1p(seconds since the last event), one-hot of the last event.
    """
    ends = np.asarray(windows.meta["end_frames"])
    times = ends / stream.rate_hz
    ev_t = np.array([t for t, _ in stream.events], dtype=np.float64)
    seen = np.searchsorted(ev_t, times, side="right")
    since = np.where(seen > 0, times - ev_t[np.maximum(seen - 1, 0)], times)
    last = windows.events[:, -1]
    onehot = np.zeros((len(ends), len(windows.event_vocabulary) + 1))
    onehot[np.arange(len(ends)), last] = 1.0
    return np.column_stack([np.log1p(ends), windows.mask.mean(axis=(1, 2)),
                            (windows.events > 0).sum(axis=1), np.log1p(since), onehot])


def fit_probe(x: np.ndarray, y: np.ndarray, *, seed: int = 0, c: float = 1.0,
              threshold: float = 0.5) -> ProbeHead:
    """Fit one logistic probe and fold the standardisation into its weights."""
    y = np.asarray(y).astype(int)
    if np.unique(y).size < 2:
        raise ValueError("a probe needs both classes in its training labels")
    scaler = StandardScaler().fit(x)
    model = LogisticRegression(C=c, max_iter=2000, class_weight="balanced",
                               random_state=seed).fit(scaler.transform(x), y)
    scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)
    w = model.coef_[0] / scale
    b = float(model.intercept_[0] - np.sum(model.coef_[0] * scaler.mean_ / scale))
    return ProbeHead(w, b, threshold)


def fit_memctl_heads(embeddings: np.ndarray, compress: np.ndarray, recall: np.ndarray, *,
                     seed: int = 0, c: float = 1.0, info: dict | None = None) -> MemctlHeads:
    """Fit both probes on (n, d) embeddings and their COMPRESS / RECALL labels."""
    return MemctlHeads(fit_probe(embeddings, compress, seed=seed, c=c),
                       fit_probe(embeddings, recall, seed=seed, c=c),
                       info={"n": int(len(embeddings)), "compress_rate": float(np.mean(compress)),
                             "recall_rate": float(np.mean(recall)), **(info or {})})
