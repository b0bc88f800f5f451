"""Relabelled augmentation: transformed signals, labels the rules give them, nothing else."""

import numpy as np
import pytest

from thinkmem_ros.core.data import SignalStream
from thinkmem_ros.core.label_rules import parse_rules
from thinkmem_ros.core.rule_augment import (
    AugmentConfig,
    augmented_copies,
    scale_signals,
    stretch_time,
)
from thinkmem_ros.playback.recording import (
    AUGMENT_GROUP_STRIDE,
    recording_windows,
    training_windows,
)

RATE = 10.0
NAMES = ("yaw_rate", "vibration")
RULES = parse_rules({"labels": {
    "turning": {"threshold": {"signal": "yaw_rate", "above": 0.1, "absolute": True,
                              "hold_s": 1.0}},
    "left": {"threshold": {"signal": "yaw_rate", "above": 0.1}},
    "rough": {"threshold": {"signal": "vibration", "above": 0.6, "hold_s": 0.5}},
    "calming": {"trend": {"signal": "vibration", "window_s": 2.0, "slope_below": -0.05}},
}}, signal_names=NAMES)


def drive(seconds: float = 120.0, seed: int = 0) -> SignalStream:
    """Right turns only (yaw < 0) and a two-level vibration, with a few dropped samples."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    yaw = -0.2 * np.clip(np.sin(t / 4.0), 0.0, None) + rng.normal(0, 0.01, t.size)
    vib = np.abs(0.4 + 0.3 * np.sin(t / 3.0) + rng.normal(0, 0.05, t.size))
    values = np.stack([yaw, vib], axis=1).astype(np.float32)
    values[rng.choice(t.size, 20, replace=False), 1] = np.nan
    return SignalStream(rate_hz=RATE, values=values, labels=RULES.apply(values, NAMES, RATE),
                        label_names=RULES.label_names, signal_names=NAMES, scenario="drive")


def test_every_copy_is_labelled_exactly_as_the_rules_label_its_signals():
    stream = drive()
    copies = augmented_copies(stream, RULES, AugmentConfig(copies=6),
                              np.random.default_rng(1))
    assert len(copies) == 6
    for copy in copies:
        assert copy.labels.shape == (copy.values.shape[0], len(RULES.label_names))
        np.testing.assert_array_equal(copy.labels, RULES.apply(copy.values, NAMES, RATE))
        assert not np.array_equal(copy.values[:100], stream.values[:100])
        assert np.isnan(copy.values).any()  # a dropped sample stays dropped
    # the drive never turned left; some copies do, so the policy sees both signs
    assert stream.labels[:, RULES.label_names.index("left")].sum() == 0
    assert max(c.labels[:, RULES.label_names.index("left")].sum() for c in copies) > 0


def test_decorrelated_copies_shuffle_each_signal_on_its_own():
    stream = drive(300.0)
    cfg = AugmentConfig(copies=1, stretch=1.0, gain=1.0, flip_signs=False)
    joint = augmented_copies(stream, RULES, cfg, np.random.default_rng(3))[0].values
    apart = augmented_copies(stream, RULES, AugmentConfig(
        copies=1, stretch=1.0, gain=1.0, flip_signs=False, decorrelate=1.0),
        np.random.default_rng(3))[0].values

    def pairs(values):  # (yaw, vibration) rows, as a set: a joint shuffle keeps every pair
        return {tuple(np.round(row, 5)) for row in values if np.isfinite(row).all()}

    original = pairs(stream.values)
    assert pairs(joint) <= original
    assert len(pairs(apart) - original) > 0.5 * len(pairs(apart))


def test_only_two_signed_signals_flip_sign():
    stream = drive()
    cfg = AugmentConfig(gain=1.0)
    flipped = [scale_signals(stream.values, cfg, np.random.default_rng(s)) for s in range(20)]
    yaw_signs = {float(np.sign(np.nansum(f[:, 0] / stream.values[:, 0]))) for f in flipped}
    assert yaw_signs == {1.0, -1.0}
    for f in flipped:  # a magnitude never goes negative
        assert np.nanmin(f[:, 1]) >= 0.0
        np.testing.assert_allclose(f[:, 1], stream.values[:, 1])


def test_stretch_keeps_values_in_range_and_changes_the_length():
    values = np.arange(100, dtype=np.float64)[:, None]
    fast, slow = stretch_time(values, 1.25), stretch_time(values, 0.8)
    assert fast.shape[0] == 80 and slow.shape[0] == 124
    assert fast[0, 0] == 0.0 and fast[-1, 0] <= 99.0 and slow[-1, 0] <= 99.0
    assert np.all(np.diff(slow[:, 0]) > 0)


def test_training_windows_add_copies_under_their_own_groups_and_are_seeded():
    stream = drive()
    plain = recording_windows(stream, 32)
    cfg = AugmentConfig(copies=3)
    both = training_windows(stream, 32, rules=RULES, augment=cfg, seed=5)
    again = training_windows(stream, 32, rules=RULES, augment=cfg, seed=5)
    other = training_windows(stream, 32, rules=RULES, augment=cfg, seed=6)
    assert len(both) > 3 * len(plain)
    np.testing.assert_array_equal(both.signals[:len(plain)], plain.signals)
    np.testing.assert_array_equal(both.signals, again.signals)
    assert not np.array_equal(both.signals[len(plain):], other.signals[len(plain):])
    copy_groups = set(both.groups[len(plain):].tolist())
    assert not copy_groups & set(plain.groups.tolist())
    assert min(copy_groups) >= AUGMENT_GROUP_STRIDE
    # without rules (hindsight labels) nothing is invented
    assert len(training_windows(stream, 32, augment=cfg)) == len(plain)


@pytest.mark.parametrize("kw, name", [({"copies": -1}, "copies"), ({"stretch": 0.5}, "stretch"),
                                      ({"gain": float("nan")}, "gain"),
                                      ({"chunk_s": (5.0, 1.0)}, "chunk_s"),
                                      ({"decorrelate": 1.5}, "decorrelate")])
def test_config_names_the_bad_value(kw, name):
    with pytest.raises(ValueError, match=name):
        AugmentConfig(**kw)
