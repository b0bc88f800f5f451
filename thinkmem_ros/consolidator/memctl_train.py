"""Offboard fitting of the COMPRESS and RECALL probes, and their ground-truth label rules.

Why: the probes must learn from situations whose answer is known. The synthetic world gives
per-frame thinking ground truth, from which these documented rules derive the labels of a
window ending at frame t (K frames, stream rate r):

COMPRESS(t) = 1  iff no *temporal* thinking label is active in any frame of
    [t - K - H + 1, t], the window plus ``horizon_s`` behind it (H = horizon_s * r frames;
    default one window span, K / r). Temporal labels are every label except
    ``STATE_LABELS`` (hazard, vibration_load_comparison, visibility_distance_check), which
    the world's rule table reads from the current values alone. A temporal label active in
    that span means a change whose evidence lies in the older frames is still unfolding (a
    pending long-range pattern); otherwise at most a state condition holds, whose evidence
    is the window itself, and the raw frames behind the window can be summarised and
    released. (Counting every label made COMPRESS almost only "the first seconds of a
    stream" in ``mixed``, where some thinking is active 78 % of the time: measured, a step
    counter alone scored AUROC 0.976 on it.)
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

from thinkmem_ros.core.data import SignalStream, SituationSet
from thinkmem_ros.policy.memctl_heads import MemctlHeads, ProbeHead

STATE_LABELS: frozenset[str] = frozenset(
    {"hazard", "vibration_load_comparison", "visibility_distance_check"})
"""Labels the world's rule table derives from the current values alone (no history)."""


def temporal_columns(label_names: list[str] | tuple[str, ...]) -> np.ndarray:
    """Boolean mask of the labels that depend on history (all but ``STATE_LABELS``)."""
    return np.array([name not in STATE_LABELS for name in label_names], dtype=bool)


def compress_targets(frame_labels: np.ndarray, end_frames: np.ndarray, window: int,
                     rate_hz: float, horizon_s: float | None = None,
                     label_names: list[str] | tuple[str, ...] | None = None) -> np.ndarray:
    """COMPRESS labels (n,) for windows ending at ``end_frames`` (module docstring rule).

    ``label_names`` selects the temporal columns; without it every column counts.
    ``horizon_s`` None = one window span (window / rate_hz).
    """
    if horizon_s is None:
        horizon_s = window / rate_hz
    labels = np.asarray(frame_labels)
    if label_names is not None:
        labels = labels[:, temporal_columns(label_names)]
    any_active = labels.max(axis=1) > 0 if labels.shape[1] else np.zeros(len(labels), bool)
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


BASELINE_FEATURES = ("log1p_step_count", "steps_since_start_s", "observed_fraction",
                     "observed_frames_per_signal", "events_in_history")
"""What the length/metadata baseline sees, PaMER's "window length/step count and
metadata" (PaMER's length/turn-count and metadata baselines): how long the session has run,
how much of the window is actually observed (its effective length, per signal), and how
many discrete events (turns) the history holds. It sees no signal values and no event
*kinds*: the world's threshold events (temperature_high, obstacle_near...) are content, and
the time since / kind of the last event would hand the baseline the labels' own thresholds."""


def metadata_features(stream: SignalStream, windows: SituationSet) -> np.ndarray:
    """Length/step-count and metadata features for the baselines (``BASELINE_FEATURES``)."""
    ends = np.asarray(windows.meta["end_frames"], dtype=np.float64)
    observed = windows.mask.sum(axis=1)  # (n, F) observed frames per signal
    return np.column_stack([np.log1p(ends), ends / stream.rate_hz,
                            windows.mask.mean(axis=(1, 2)), observed,
                            (windows.events > 0).sum(axis=1)])


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


def precision_threshold(p: np.ndarray, y: np.ndarray, min_precision: float) -> float:
    """Lowest threshold whose precision on (p, y) reaches ``min_precision`` (1.0 if none).

    Why: a wrong COMPRESS releases frames a pending pattern still needs, so the deployed
    threshold is set for precision, not at 0.5 (balanced class weights put 0.5 at equal
    error rates, which at an 8 % base rate means most compressions are wrong).
    """
    if not 0.0 < min_precision <= 1.0:
        raise ValueError(f"min_precision must be in (0, 1], got {min_precision}")
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y).astype(bool)
    order = np.argsort(-p, kind="stable")
    hits = np.cumsum(y[order])
    precision = hits / np.arange(1, p.size + 1)
    ok = np.flatnonzero(precision >= min_precision)
    if not ok.size:
        return 1.0
    return float(p[order][ok[-1]])


def fit_memctl_heads(embeddings: np.ndarray, compress: np.ndarray, recall: np.ndarray, *,
                     seed: int = 0, c: float = 1.0, compress_precision: float | None = 0.9,
                     info: dict | None = None) -> MemctlHeads:
    """Fit both probes on (n, d) embeddings and their COMPRESS / RECALL labels.

    The COMPRESS threshold is calibrated on the training rows for ``compress_precision``
    (None keeps 0.5); RECALL keeps 0.5 (a needless recall costs one request, no data).
    """
    head_c = fit_probe(embeddings, compress, seed=seed, c=c)
    if compress_precision is not None:
        head_c.threshold = precision_threshold(head_c.probability(embeddings), compress,
                                               compress_precision)
    return MemctlHeads(head_c, fit_probe(embeddings, recall, seed=seed, c=c),
                       info={"n": int(len(embeddings)), "compress_rate": float(np.mean(compress)),
                             "recall_rate": float(np.mean(recall)),
                             "compress_precision_target": compress_precision, **(info or {})})


MIN_JUDGED = 200
"""Experiences with hindsight ``required`` a round needs before it fits the probes."""


def experience_targets(experiences: list, label_names: list[str] | tuple[str, ...],
                       rate_hz: float, window: int, *, rare_frac: float = 0.02,
                       transition_s: float = 0.5) -> tuple[list, np.ndarray, np.ndarray]:
    """COMPRESS / RECALL labels of stored experiences, by the module docstring's rules.

    The per-frame ground truth is each experience's hindsight ``required`` set; an
    episode's experiences (sorted by stamp) sit at frame ``round((stamp - first) *
    rate_hz)`` and frames nothing was shipped for repeat the previous set, so thinned
    shipping (``ship_every_n_frames``) keeps the spans right. Label-set frequencies for the
    rare rule are counted over all judged experiences. Returns (experiences in the order
    of the targets, compress, recall); experiences without ``required`` are left out.
    """
    judged = [e for e in experiences if e.required is not None]
    index = {name: j for j, name in enumerate(label_names)}
    episodes: dict[tuple[str, str], list] = {}
    for exp in judged:
        episodes.setdefault((exp.robot_id, exp.episode_id), []).append(exp)
    ordered, per_episode = [], []
    for key in sorted(episodes):
        episode = sorted(episodes[key], key=lambda e: (e.stamp, e.seq or 0))
        at = np.round((np.array([e.stamp for e in episode]) - episode[0].stamp)
                      * rate_hz).astype(np.int64)
        at = np.maximum.accumulate(at)
        dense = np.zeros((int(at[-1]) + 1, len(label_names)), np.float32)
        rows = np.zeros((len(episode), len(label_names)), np.float32)
        for i, exp in enumerate(episode):
            for name in exp.required:
                if name in index:
                    rows[i, index[name]] = 1.0
        owner = np.searchsorted(at, np.arange(dense.shape[0]), side="right") - 1
        dense[:] = rows[owner]
        ordered += episode
        per_episode.append((dense, at))
    if not ordered:
        return [], np.zeros(0, np.int64), np.zeros(0, np.int64)
    frequencies = set_frequencies(np.concatenate([d[a] for d, a in per_episode]))
    compress = np.concatenate([compress_targets(d, a, window, rate_hz, label_names=label_names)
                               for d, a in per_episode])
    recall = np.concatenate([recall_targets(d, a, rate_hz, frequencies, rare_frac,
                                            transition_s) for d, a in per_episode])
    return ordered, compress, recall


def fit_round_memctl(experiences: list, runtime, folder, *, min_judged: int = MIN_JUDGED,
                     seed: int = 0) -> dict:
    """Fit the COMPRESS / RECALL probes a round ships with its candidate, save into ``folder``.

    ``runtime`` is the candidate's (the probes read the embedding of the policy the robot
    will run). Returns the round report's ``artefacts["memctl"]``: ``{"status":
    "fitted", ...}`` or ``{"status": "missing", "reason": ...}`` when the store has too few
    judged experiences or a probe would see one class only.
    """
    from thinkmem_ros.consolidator.values import embed_experiences

    m = runtime.manifest
    ordered, compress, recall = experience_targets(experiences, list(m.labels),
                                                   float(m.frame_rate_hz), m.window)
    if len(ordered) < min_judged:
        return {"status": "missing", "reason": f"{len(ordered)} experiences with hindsight "
                f"'required' (< {min_judged})"}
    for name, target in (("COMPRESS", compress), ("RECALL", recall)):
        if np.unique(target).size < 2:
            return {"status": "missing", "reason": f"every {name} label is {int(target[0])} "
                    f"in {len(ordered)} judged experiences: nothing to fit"}
    embeddings = np.concatenate([embed_experiences(runtime, ordered[i:i + 512])
                                 for i in range(0, len(ordered), 512)])
    heads = fit_memctl_heads(embeddings, compress, recall, seed=seed,
                             info={"source": "consolidation round", "judged": len(ordered)})
    heads.save(folder)
    return {"status": "fitted", "judged": len(ordered),
            "compress_rate": float(np.mean(compress)), "recall_rate": float(np.mean(recall))}
