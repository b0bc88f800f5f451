"""Scenario families: labelled situation sets whose hidden rule each experiment probes.

Every family is ``(n, rng, **kw) -> SituationSet`` and states its hidden rule in its
docstring. All seven signals are present in every window; channels a rule does not use
carry nominal variation (``shapes.nominal_windows``) whose distribution does not depend on
the class, so nothing but the documented rule separates the classes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
from thinkmem_ros.world.shapes import CH, NOMINAL, clip_physical, nominal_windows, sensor_noise
from thinkmem_ros.world.streams import generate_stream, stream_windows


def _label_rows(label_sets: Sequence[Sequence[str]], classes: np.ndarray) -> np.ndarray:
    """Multi-hot (N, L) rows from a per-class tuple of label names."""
    table = np.zeros((len(label_sets), len(THINKING)), dtype=np.float32)
    for c, names in enumerate(label_sets):
        for name in names:
            table[c, THINKING.index(name)] = 1.0
    return table[classes]


def _balanced_classes(n: int, n_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Class indices with counts differing by at most one, in random order."""
    return rng.permutation(np.arange(n) % n_classes)


# --------------------------------------------------------------------------- Exp 2

ORDER_CLASSES: tuple[tuple[str, tuple[int, ...], tuple[str, ...]], ...] = (
    ("ascending", (0, 1, 2, 3, 4, 5, 6, 7, 8, 9), ("trend", "cause")),
    ("descending", (9, 8, 7, 6, 5, 4, 3, 2, 1, 0), ("trend", "hazard", "future_impact")),
    ("peak", (0, 2, 4, 6, 8, 9, 7, 5, 3, 1), ("trend", "late_change_inspection")),
    ("valley", (9, 7, 5, 3, 1, 0, 2, 4, 6, 8),
     ("cause", "recovery_confirmation", "information_seeking")),
    ("zigzag", (0, 9, 1, 8, 2, 7, 3, 6, 4, 5), ("trend", "cause", "temp_current_inconsistency")),
    ("halves_swapped", (5, 6, 7, 8, 9, 0, 1, 2, 3, 4), ("hazard", "vibration_load_comparison")),
)
"""(name, rank order of the 10 reference intermediates, labels) per order class."""


def _order_pattern(ranks: Sequence[int], length: int) -> np.ndarray:
    """Stretch a 10-step rank pattern to ``length`` distinct ranks (a permutation)."""
    ref = np.asarray(ranks, dtype=np.float64)
    # position of each of the `length` steps along the reference pattern, then ranked
    pos = np.interp(np.linspace(0, len(ref) - 1, length), np.arange(len(ref)), ref)
    jitter = np.linspace(0.0, 1e-3, length)  # ties broken by time, same for every identity
    return np.argsort(np.argsort(pos + jitter, kind="stable"), kind="stable")


def identity_profile(identity: int, n_intermediate: int) -> tuple[float, float, np.ndarray]:
    """Start value, end value and sorted intermediate values of one component identity.

    Drawn from a Generator seeded by the identity itself, so an identity always has the
    same range and unseen identities have ranges no training identity had.
    """
    g = np.random.default_rng([0x0DE5, int(identity)])
    base = g.uniform(25.0, 70.0)  # degC: the component's operating level
    scale = g.uniform(3.0, 15.0)  # degC: its swing
    values = np.sort(base + scale * g.uniform(0.0, 1.0, n_intermediate))
    while np.min(np.diff(values)) < 1e-3 * scale:  # distinct values keep orders distinct
        values = np.sort(base + scale * g.uniform(0.0, 1.0, n_intermediate))
    start, end = base + scale * g.uniform(0.0, 1.0, 2)
    return float(start), float(end), values


def order_only(n: int, rng: np.random.Generator, identities: Sequence[int] | None = None,
               window: int = 12, nuisance: float = 1.0) -> SituationSet:
    """Exp 2: classes differ ONLY in the order of the intermediate temperature readings.

    Hidden rule. Each component identity fixes a start value, an end value and a multiset
    of ``window - 2`` intermediate temperatures (``identity_profile``). Every class of that
    identity uses exactly these values, so start, end, value set, mean, std and global
    change are identical across classes; the temperature channel is noise-free to keep them
    identical. The class is the order in which the intermediates are visited, and the
    order -> thinking mapping is an arbitrary rule of this environment:

    ==============  ===========================  =========================================
    class           intermediate order (ranks)   thinking
    ==============  ===========================  =========================================
    ascending       0 1 2 3 4 5 6 7 8 9          trend, cause
    descending      9 8 7 6 5 4 3 2 1 0          trend, hazard, future_impact
    peak            0 2 4 6 8 9 7 5 3 1          trend, late_change_inspection
    valley          9 7 5 3 1 0 2 4 6 8          cause, recovery_confirmation,
                                                 information_seeking
    zigzag          0 9 1 8 2 7 3 6 4 5          trend, cause, temp_current_inconsistency
    halves_swapped  5 6 7 8 9 0 1 2 3 4          hazard, vibration_load_comparison
    ==============  ===========================  =========================================

    ``trend`` is active in 4 of 6 classes and ``cause`` in 3, as in a real log where a few
    kinds of thinking dominate; a model blind to order can only predict those majorities
    (micro-F1 about 0.4), while the order itself determines every label.
    (For ``window != 12`` the 10-step pattern is stretched to ``window - 2`` steps.) The
    other six channels are nominal operation independent of the class. ``groups`` is the
    identity; ``meta["classes"]`` the class index per row (names in
    ``meta["class_names"]``). Without ``identities`` 16 fresh ones are drawn from ``rng``.

    ``nuisance`` scales how far the six other channels stray from the middle of their
    nominal range (1 = ``nominal_windows`` as drawn, 0 = every row holds the same constant
    mid-range values). Exp 1 uses 0: there histories repeat situations met before, and
    class-independent noise on six channels would otherwise dominate a whole-window
    distance and hide the repeats from explicit retrieval.
    """
    if window < 4:
        raise ValueError(f"window must be >= 4 for order_only, got {window}")
    if not 0.0 <= nuisance <= 1.0:
        raise ValueError(f"nuisance must be in [0, 1], got {nuisance!r}")
    if identities is None:
        identities = rng.choice(2**31 - 1, size=16, replace=False)
    identities = np.asarray(identities, dtype=np.int64)
    if identities.size == 0:
        raise ValueError("order_only needs at least one identity")
    k_mid = window - 2
    classes = _balanced_classes(n, len(ORDER_CLASSES), rng)
    groups = identities[rng.permutation(np.arange(n) % identities.size)]
    patterns = np.stack([_order_pattern(c[1], k_mid) for c in ORDER_CLASSES])
    signals = nominal_windows(n, window, rng)
    if nuisance != 1.0:
        middle = np.array([sum(NOMINAL[s]) / 2.0 for s in SIGNALS])
        signals = middle + nuisance * (signals - middle)
    profiles = {int(i): identity_profile(int(i), k_mid) for i in np.unique(identities)}
    temps = np.empty((n, window))
    for row, (ident, cls) in enumerate(zip(groups, classes, strict=True)):
        start, end, values = profiles[int(ident)]
        temps[row, 0], temps[row, -1] = start, end
        temps[row, 1:-1] = values[patterns[cls]]
    signals[:, :, CH["temperature"]] = temps
    return SituationSet(
        signals=signals.astype(np.float32), labels=_label_rows([c[2] for c in ORDER_CLASSES],
                                                               classes),
        groups=groups, meta={"family": "order_only", "classes": classes,
                             "class_names": tuple(c[0] for c in ORDER_CLASSES)})


def order_only_split(n_train: int, n_test: int, rng: np.random.Generator,
                     n_train_ids: int = 24, n_test_ids: int = 8,
                     window: int = 12) -> tuple[SituationSet, SituationSet]:
    """Exp 2 train/test sets over DISJOINT component identities (unseen at test time)."""
    if n_train_ids < 1 or n_test_ids < 1:
        raise ValueError(f"n_train_ids and n_test_ids must be >= 1, got "
                         f"{n_train_ids}, {n_test_ids}")
    ids = rng.choice(2**31 - 1, size=n_train_ids + n_test_ids, replace=False)
    train = order_only(n_train, rng, identities=ids[:n_train_ids], window=window)
    test = order_only(n_test, rng, identities=ids[n_train_ids:], window=window)
    return train, test


# --------------------------------------------------------------------------- Exp 3

FINAL_STATE_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("rising", ("trend", "cause", "hazard")),
    ("falling", ("recovery_confirmation",)),
    ("steady_hot", ("hazard", "information_seeking")),
)


def same_final_state(n: int, rng: np.random.Generator, window: int = 16) -> SituationSet:
    """Exp 3: the same final state is reached by rising or by falling histories.

    Hidden rule. Rows come in pairs sharing one final frame (all seven channels exactly
    equal; temperature 50-60 degC, current 6-9 A). In the ``rising`` row temperature and
    current climb towards it (thinking: trend, cause, hazard); in the ``falling`` row they
    fall towards it from above (recovery_confirmation). The third class,
    ``steady_hot``, holds 68-80 degC (hazard, information_seeking), so the final state is
    informative for some rows and a last-frame-only model lands between chance and 1: for
    the moderate rows it can only guess one history for both (a random forest on the last
    frame scores about 0.65 micro-F1), while a sequence model sees the direction. About a
    third of the rows belong to each class; ``groups`` is the pair (or steady row) id and
    ``meta["classes"]`` the class index.
    """
    if window < 4:
        raise ValueError(f"window must be >= 4 for same_final_state, got {window}")
    n_pairs = n // 3
    n_steady = n - 2 * n_pairs
    classes = np.concatenate([np.zeros(n_pairs, int), np.ones(n_pairs, int),
                              np.full(n_steady, 2)])
    groups = np.concatenate([np.arange(n_pairs), np.arange(n_pairs),
                             n_pairs + np.arange(n_steady)])
    signals = nominal_windows(n, window, rng)
    final = signals[:, -1, :].copy()
    final[:, CH["temperature"]] = rng.uniform(50.0, 60.0, n)
    final[:, CH["current"]] = rng.uniform(6.0, 9.0, n)
    hot = classes == 2
    final[hot, CH["temperature"]] = rng.uniform(68.0, 80.0, int(hot.sum()))
    final[n_pairs:2 * n_pairs] = final[:n_pairs]  # the pair shares its last frame exactly
    # shift every row's nuisance history so it ends exactly on its final frame (no jump)
    signals += (final - signals[:, -1, :])[:, None, :]
    # histories: exponential approach to the final value from 8-20 degC (1.5-3 A) away
    t = np.linspace(0.0, 1.0, window)[None, :]
    rate = rng.uniform(2.0, 4.0, (n, 1))
    shape = (np.exp(-rate * t) - np.exp(-rate)) / (1.0 - np.exp(-rate))  # 1 -> 0
    sign = np.where(classes == 0, -1.0, np.where(classes == 1, 1.0, 0.0))[:, None]
    for name, span in (("temperature", (8.0, 20.0)), ("current", (1.5, 3.0))):
        col = CH[name]
        gap = rng.uniform(*span, (n, 1)) * sign
        noise = sensor_noise((n, window, len(CH)), rng)[:, :, col]
        signals[:, :, col] = final[:, col:col + 1] + gap * shape + noise
    signals = clip_physical(signals)
    signals[:, -1, :] = final  # exact, noise-free final frame (shared within a pair)
    order = rng.permutation(n)
    return SituationSet(
        signals=signals[order].astype(np.float32),
        labels=_label_rows([c[1] for c in FINAL_STATE_CLASSES], classes[order]),
        groups=groups[order],
        meta={"family": "same_final_state", "classes": classes[order],
              "class_names": tuple(c[0] for c in FINAL_STATE_CLASSES)})


# --------------------------------------------------------------------------- Exp 5

RARE_LABELS = ("trend", "hazard", "cause", "future_impact", "information_seeking",
               "late_change_inspection")
DECOYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("early_rise_settles", ("trend", "recovery_confirmation")),
    ("linear_drift", ("trend", "future_impact")),
    ("mid_spike", ("cause", "information_seeking")),
    ("noise", ()),
)


def _rare_windows(n: int, window: int, rng: np.random.Generator) -> np.ndarray:
    """Draw a normal prefix, then a temperature/vibration acceleration in the last quarter."""
    sig = nominal_windows(n, window, rng)
    onset = rng.integers(int(0.70 * window), int(0.78 * window) + 1, n)
    k = np.arange(window)[None, :]
    tau = np.clip(k - onset[:, None], 0, None) / (window - 1 - onset[:, None])  # 0 -> 1
    amp_t = rng.uniform(20.0, 35.0, (n, 1))
    amp_v = rng.uniform(3.0, 6.0, (n, 1))
    sig[:, :, CH["temperature"]] += amp_t * tau**2
    sig[:, :, CH["vibration"]] += amp_v * tau**2
    return sig


def _decoy_windows(kind: str, n: int, window: int, rng: np.random.Generator) -> np.ndarray:
    """Normal-looking situations that share some shape with the rare one."""
    sig = nominal_windows(n, window, rng)
    x = np.linspace(0.0, 1.0, window)[None, :]
    col = CH["temperature"]
    if kind == "early_rise_settles":
        amp = rng.uniform(8.0, 20.0, (n, 1))
        stop = rng.uniform(0.25, 0.45, (n, 1))
        sig[:, :, col] += amp * np.clip(x / stop, 0.0, 1.0)
    elif kind == "linear_drift":
        sig[:, :, col] += rng.uniform(4.0, 10.0, (n, 1)) * x * rng.choice([-1, 1], (n, 1))
    elif kind == "mid_spike":
        centre = rng.uniform(0.3, 0.6, (n, 1))
        sig[:, :, col] += rng.uniform(8.0, 15.0, (n, 1)) * np.exp(-((x - centre) / 0.06)**2)
    return sig


def _rare_mix(n_rare: int, n_normal: int, window: int,
              rng: np.random.Generator) -> SituationSet:
    """Rows of the rare pattern plus decoys spread evenly, shuffled, with meta['rare']."""
    decoy_cls = _balanced_classes(n_normal, len(DECOYS), rng)
    parts = [_rare_windows(n_rare, window, rng)]
    labels = [_label_rows([RARE_LABELS], np.zeros(n_rare, int))]
    kinds = [np.full(n_rare, "rare_onset", dtype=object)]
    for c, (kind, names) in enumerate(DECOYS):
        count = int((decoy_cls == c).sum())
        parts.append(_decoy_windows(kind, count, window, rng))
        labels.append(_label_rows([names], np.zeros(count, int)))
        kinds.append(np.full(count, kind, dtype=object))
    order = rng.permutation(n_rare + n_normal)
    kind_arr = np.concatenate(kinds)[order]
    return SituationSet(
        signals=clip_physical(np.concatenate(parts))[order].astype(np.float32),
        labels=np.concatenate(labels)[order], groups=np.arange(n_rare + n_normal),
        meta={"family": "rare_onset", "rare": kind_arr == "rare_onset", "kinds": kind_arr})


def rare_onset(n: int, rng: np.random.Generator, rare_fraction: float = 0.05,
               window: int = 32) -> SituationSet:
    """Exp 5 history: a rare delayed-onset pattern among normal situations and decoys.

    Hidden rule. ``rare_onset`` rows stay nominal for a long prefix, then temperature
    (+20-35 degC) and vibration (+3-6 mm/s) accelerate quadratically from an onset in frame
    0.70-0.78 K to the end (thinking: trend, hazard, cause, future_impact,
    information_seeking, late_change_inspection). Decoys: ``early_rise_settles`` (a rise
    in the first half that levels off: trend, recovery_confirmation), ``linear_drift``
    (mild straight drift up or down: trend, future_impact), ``mid_spike`` (a transient bump
    mid-window: cause, information_seeking) and ``noise`` (nothing). At least two rows are
    rare even for tiny ``n``. ``meta["rare"]`` marks rare rows.
    """
    if not 0.0 <= rare_fraction <= 1.0:
        raise ValueError(f"rare_fraction must be in [0, 1], got {rare_fraction}")
    if window < 8:
        raise ValueError(f"window must be >= 8 for rare_onset, got {window}")
    n_rare = min(n, max(2, int(round(rare_fraction * n))))
    return _rare_mix(n_rare, n - n_rare, window, rng)


def rare_onset_split(n_histories: int, n_test: int, rng: np.random.Generator,
                     rare_fraction: float = 0.05,
                     window: int = 32) -> tuple[SituationSet, SituationSet]:
    """Exp 5: a training history with the rare pattern rare, a test set about half rare."""
    train = rare_onset(n_histories, rng, rare_fraction=rare_fraction, window=window)
    test = _rare_mix(n_test // 2 + n_test % 2, n_test // 2, window, rng)
    test.groups = test.groups + n_histories  # never shares an id with a training row
    return train, test


# --------------------------------------------------------------------------- streams

def mixed_windows(n: int, rng: np.random.Generator, window: int = 32,
                  stream_s: float = 120.0, scenario: str = "mixed") -> SituationSet:
    """Windows sampled from several 10 Hz ``scenario`` streams (default ``mixed``).

    Hidden rule: the stream rule table in ``streams`` (labels of the window's last frame
    from its clean signal). ``groups`` is the stream, so group splits never share a stream;
    at least four streams are used and at most a quarter of any stream's windows.
    """
    per_stream = int(stream_s * 10) - window + 1
    if per_stream < 1:
        raise ValueError(f"stream_s={stream_s} is shorter than window={window} frames")
    n_streams = max(4, int(np.ceil(n / (0.25 * per_stream))))
    parts = []
    for g in range(n_streams):
        stream = generate_stream(scenario, stream_s, 10.0, rng)
        parts.append(stream_windows(stream, window, group=g))
    pooled = SituationSet.concat(parts)
    pick = np.sort(rng.choice(len(pooled), size=n, replace=False))
    out = pooled.subset(pick)
    out.meta = {"family": "mixed_windows", "scenario": scenario}
    return out


FAMILIES: dict[str, Callable[..., SituationSet]] = {
    "order_only": order_only,
    "same_final_state": same_final_state,
    "rare_onset": rare_onset,
    "mixed_windows": mixed_windows,
}
"""Registry of scenario families: name -> ``(n, rng, **kw) -> SituationSet``."""
