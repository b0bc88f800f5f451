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

Round fits are robust to the fleet (``fit_round_memctl``): within each class of each probe
no robot carries more than ``values.ROBOT_SHARE`` of the weight (max(share, 1/m) with m
robots in the class), nor of the whole fit after the classes are balanced, and the
label-set frequencies of the rare rule are counted with the same cap, so one robot
flooding one kind of label (``required=[]`` everywhere) moves the probes by its share
only. Targets are computed from each record's frame position with the gap between two
records capped at the longest span a rule reads (window + horizon, transition), which
leaves every target as it was and bounds memory by the records, whatever their stamps. A
row whose embedding is not finite is left out and counted, not allowed to fail the fit.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from thinkmem_ros.consolidator.values import ROBOT_SHARE, finite_embeddings, robot_weights
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


def set_frequencies(labels: np.ndarray, weights: np.ndarray | None = None) -> dict[int, float]:
    """Frequency of each label set among reference windows (``weights``: each row's say)."""
    keys, index = np.unique(label_set_keys(labels), return_inverse=True)
    counts = np.bincount(index.reshape(-1), weights, minlength=keys.size)
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
              threshold: float = 0.5, weight: np.ndarray | None = None) -> ProbeHead:
    """Fit one logistic probe and fold the standardisation into its weights.

    Without ``weight`` the classes are balanced by sklearn; with it, ``weight`` is the
    final per-row sample weight (``probe_weights`` balances the classes itself).
    """
    y = np.asarray(y).astype(int)
    if np.unique(y).size < 2:
        raise ValueError("a probe needs both classes in its training labels")
    scaler = StandardScaler().fit(x)
    model = LogisticRegression(C=c, max_iter=2000,
                               class_weight="balanced" if weight is None else None,
                               random_state=seed).fit(scaler.transform(x), y,
                                                      sample_weight=weight)
    scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)
    w = model.coef_[0] / scale
    b = float(model.intercept_[0] - np.sum(model.coef_[0] * scaler.mean_ / scale))
    return ProbeHead(w, b, threshold)


def probe_weights(y: np.ndarray, robots, share: float = ROBOT_SHARE) -> np.ndarray:
    """Balanced-class sample weights in which no robot carries more than its share.

    Why: balanced class weights magnify a rare class, so one robot filling it (every record
    ``required=[]``: COMPRESS 1, RECALL 0) would steer the probe for every robot. Each
    robot is capped within each class, the classes are balanced, each robot is capped
    again over all rows, and the weights are scaled to sum to the row count (as sklearn's
    balanced weights do, so one robot's fit is unchanged).
    """
    y = np.asarray(y).astype(int).reshape(-1)
    w = robot_weights(y, robots, share)
    total = w.sum()
    for cls in np.unique(y):
        w[y == cls] *= total / (2.0 * w[y == cls].sum())
    w = robot_weights(np.zeros(y.size), robots, share, base=w)
    return w * (y.size / w.sum())


def precision_threshold(p: np.ndarray, y: np.ndarray, min_precision: float,
                        weight: np.ndarray | None = None) -> float:
    """Lowest threshold whose precision on (p, y) reaches ``min_precision`` (1.0 if none).

    Why: a wrong COMPRESS releases frames a pending pattern still needs, so the deployed
    threshold is set for precision, not at 0.5 (balanced class weights put 0.5 at equal
    error rates, which at an 8 % base rate means most compressions are wrong). ``weight``
    counts each row's say in the precision (robot caps), 1 each without it.
    """
    if not 0.0 < min_precision <= 1.0:
        raise ValueError(f"min_precision must be in (0, 1], got {min_precision}")
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y).astype(bool)
    weight = np.ones(p.size) if weight is None else np.asarray(weight, dtype=np.float64)
    order = np.argsort(-p, kind="stable")
    hits = np.cumsum((weight * y)[order])
    precision = hits / np.cumsum(weight[order])
    ok = np.flatnonzero(precision >= min_precision)
    if not ok.size:
        return 1.0
    return float(p[order][ok[-1]])


def fit_memctl_heads(embeddings: np.ndarray, compress: np.ndarray, recall: np.ndarray, *,
                     seed: int = 0, c: float = 1.0, compress_precision: float | None = 0.9,
                     info: dict | None = None, robots=None,
                     share: float = ROBOT_SHARE) -> MemctlHeads:
    """Fit both probes on (n, d) embeddings and their COMPRESS / RECALL labels.

    The COMPRESS threshold is calibrated on the training rows for ``compress_precision``
    (None keeps 0.5); RECALL keeps 0.5 (a needless recall costs one request, no data).
    ``robots`` (n,): who sent each row; each robot's weight is then capped at ``share``
    in the fit (``probe_weights``) and in the calibration (capped within each class but
    not class-balanced: precision is counted at the rows' own base rate).
    """
    w_c, w_r = ((None, None) if robots is None else
                (probe_weights(compress, robots, share), probe_weights(recall, robots, share)))
    head_c = fit_probe(embeddings, compress, seed=seed, c=c, weight=w_c)
    if compress_precision is not None:
        say = None if robots is None else robot_weights(compress, robots, share)
        head_c.threshold = precision_threshold(head_c.probability(embeddings), compress,
                                               compress_precision, say)
    return MemctlHeads(head_c, fit_probe(embeddings, recall, seed=seed, c=c, weight=w_r),
                       info={"n": int(len(embeddings)), "compress_rate": float(np.mean(compress)),
                             "recall_rate": float(np.mean(recall)),
                             "compress_precision_target": compress_precision, **(info or {})})


MIN_JUDGED = 200
"""Experiences with hindsight ``required`` a round needs before it fits the probes."""


def episode_frames(stamps: np.ndarray, rate_hz: float, max_gap: int) -> np.ndarray:
    """Frame of each record of an episode (stamp order), gaps capped at ``max_gap`` frames.

    Why: a gap longer than every span a rule reads (``max_gap``) changes no target, so
    capping it keeps the targets and keeps frame numbers small whatever the stamps.
    """
    at = np.maximum.accumulate(np.round((np.asarray(stamps, np.float64) - stamps[0])
                                        * rate_hz))
    gaps = np.minimum(np.diff(at), max_gap)
    return np.concatenate([[0], np.cumsum(gaps)]).astype(np.int64)


def _sparse_compress(at: np.ndarray, rows: np.ndarray, span: int,
                     temporal: np.ndarray) -> np.ndarray:
    """``compress_targets`` of records at frames ``at`` without building the per-frame array.

    A frame holds the set of the last record at or before it; a record sharing its frame
    with a later one owns no frame. The window [t - span + 1, t] is owned by the records
    from the owner of its first frame to the owner of t.
    """
    owns = np.append(at[1:] != at[:-1], True)
    active = (rows[:, temporal].max(axis=1) > 0 if temporal.any()
              else np.zeros(len(at), bool)) & owns
    csum = np.concatenate([[0], np.cumsum(active)])
    first = np.searchsorted(at, np.maximum(at - span + 1, 0), side="right") - 1
    last = np.searchsorted(at, at, side="right") - 1
    return (csum[last + 1] - csum[first] == 0).astype(np.int64)


def _frame_rows(at: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Label set of the frame each record sits at (its frame's owner's set)."""
    return rows[np.searchsorted(at, at, side="right") - 1]


def _sparse_recall(at: np.ndarray, rows: np.ndarray, rate_hz: float,
                   frequencies: dict[int, float], rare_frac: float,
                   transition_s: float) -> np.ndarray:
    """``recall_targets`` of records at frames ``at`` from the frames where the set changes."""
    keys = label_set_keys(_frame_rows(at, rows))
    rare = np.array([frequencies.get(k, 0.0) < rare_frac for k in keys.tolist()], bool)
    owner = np.flatnonzero(np.append(at[1:] != at[:-1], True))
    owner_keys = keys[owner]
    changes = at[owner][1:][owner_keys[1:] != owner_keys[:-1]]
    w = int(round(transition_s * rate_hz))
    lo = np.maximum(at - w + 1, 0)
    hi = np.minimum(at + w, at[-1])
    near = np.searchsorted(changes, hi, side="right") - np.searchsorted(changes, lo) > 0
    return (rare | near).astype(np.int64)


def _required_rows(episode: list, index: dict[str, int]) -> np.ndarray:
    """(n, L) indicator of each record's hindsight ``required`` labels."""
    rows = np.zeros((len(episode), len(index)), np.float32)
    for i, exp in enumerate(episode):
        for name in exp.required:
            if name in index:
                rows[i, index[name]] = 1.0
    return rows


def experience_targets(experiences: list, label_names: list[str] | tuple[str, ...],
                       rate_hz: float, window: int, *, rare_frac: float = 0.02,
                       transition_s: float = 0.5, share: float = ROBOT_SHARE,
                       ) -> tuple[list, np.ndarray, np.ndarray]:
    """COMPRESS / RECALL labels of stored experiences, by the module docstring's rules.

    The per-frame ground truth is each experience's hindsight ``required`` set; an
    episode's experiences (sorted by stamp) sit at frame ``round((stamp - first) *
    rate_hz)`` and frames nothing was shipped for repeat the previous set, so thinned
    shipping (``ship_every_n_frames``) keeps the spans right. Gaps longer than any span a
    rule reads are shortened to it (``episode_frames``) and the rules are evaluated on the
    records alone, so memory follows the record count, not the stamps. Label-set
    frequencies for the rare rule are counted over all judged experiences with each robot
    capped at ``share`` of the count. Returns (experiences in the order of the targets,
    compress, recall); experiences without ``required`` are left out.
    """
    judged = [e for e in experiences if e.required is not None]
    index = {name: j for j, name in enumerate(label_names)}
    episodes: dict[tuple[str, str], list] = {}
    for exp in judged:
        episodes.setdefault((exp.robot_id, exp.episode_id), []).append(exp)
    span = 2 * window  # the window and its default horizon (one window span)
    max_gap = max(span, int(round(transition_s * rate_hz))) + 1
    ordered, per_episode = [], []
    for key in sorted(episodes):
        episode = sorted(episodes[key], key=lambda e: (e.stamp, e.seq or 0))
        at = episode_frames(np.array([e.stamp for e in episode]), rate_hz, max_gap)
        ordered += episode
        per_episode.append((at, _required_rows(episode, index)))
    if not ordered:
        return [], np.zeros(0, np.int64), np.zeros(0, np.int64)
    say = robot_weights(np.zeros(len(ordered)), [e.robot_id for e in ordered], share)
    frequencies = set_frequencies(np.concatenate([_frame_rows(at, rows)
                                                  for at, rows in per_episode]), say)
    temporal = temporal_columns(label_names)
    compress = np.concatenate([_sparse_compress(at, rows, span, temporal)
                               for at, rows in per_episode])
    recall = np.concatenate([_sparse_recall(at, rows, rate_hz, frequencies, rare_frac,
                                            transition_s) for at, rows in per_episode])
    return ordered, compress, recall


def fit_round_memctl(experiences: list, runtime, folder, *, min_judged: int = MIN_JUDGED,
                     seed: int = 0, share: float = ROBOT_SHARE) -> dict:
    """Fit the COMPRESS / RECALL probes a round ships with its candidate, save into ``folder``.

    ``runtime`` is the candidate's (the probes read the embedding of the policy the robot
    will run). Returns the round report's ``artefacts["memctl"]``: ``{"status":
    "fitted", ...}`` or ``{"status": "missing", "reason": ...}`` when the store has too few
    judged experiences or a probe would see one class only. Rows whose embedding is not
    finite are left out (``dropped_nonfinite``); each robot's say is capped at ``share``.
    """
    m = runtime.manifest
    ordered, compress, recall = experience_targets(experiences, list(m.labels),
                                                   float(m.frame_rate_hz), m.window,
                                                   share=share)
    dropped = 0
    if len(ordered) >= min_judged:  # (fewer: no need to embed them to say so)
        embeddings, finite = finite_embeddings(runtime, ordered)
        dropped = int((~finite).sum())
        ordered = [e for e, ok in zip(ordered, finite, strict=True) if ok]
        embeddings, compress, recall = embeddings[finite], compress[finite], recall[finite]
    if len(ordered) < min_judged:
        return {"status": "missing", "reason": f"{len(ordered)} experiences with hindsight "
                f"'required' (< {min_judged})" + _dropped_note(dropped)}
    for name, target in (("COMPRESS", compress), ("RECALL", recall)):
        if np.unique(target).size < 2:
            return {"status": "missing", "reason": f"every {name} label is {int(target[0])} "
                    f"in {len(ordered)} judged experiences: nothing to fit"}
    heads = fit_memctl_heads(embeddings, compress, recall, seed=seed,
                             robots=[e.robot_id for e in ordered], share=share,
                             info={"source": "consolidation round", "judged": len(ordered)})
    heads.save(folder)
    return {"status": "fitted", "judged": len(ordered), "dropped_nonfinite": dropped,
            "compress_rate": float(np.mean(compress)), "recall_rate": float(np.mean(recall))}


def _dropped_note(dropped: int) -> str:
    """Reason suffix naming rows left out for a non-finite embedding (empty when none)."""
    return f"; {dropped} left out for a non-finite embedding" if dropped else ""
