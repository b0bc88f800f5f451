"""Labelling rules: each kind computes what its docstring says, causally; bad files are named."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from thinkmem_ros.core.label_rules import RulesError, load_rules, parse_rules, trend_slope

SIGNALS = ("speed", "vibration")


def _rules(text: str):
    return parse_rules(yaml.safe_load(text), signal_names=SIGNALS)


def test_threshold_absolute_and_hold():
    rules = _rules("labels: {fast: {threshold: {signal: speed, above: 1.0, absolute: true, "
                   "hold_s: 0.2}}}")
    speed = np.array([0.0, -2.0, 0.0, 0.0, 0.0, np.nan, 2.0, 0.5])
    values = np.stack([speed, np.zeros_like(speed)], axis=1)
    labels = rules.apply(values, SIGNALS, rate_hz=10.0)
    # |-2| > 1 at frame 1, held for 2 frames (0.2 s at 10 Hz); NaN never fires
    assert labels[:, 0].tolist() == [0, 1, 1, 1, 0, 0, 1, 1]


def test_threshold_below():
    rules = _rules("labels: {slow: {threshold: {signal: speed, below: 0.5}}}")
    values = np.array([[0.1, 0], [0.9, 0], [np.nan, 0]])
    assert rules.apply(values, SIGNALS, 10.0)[:, 0].tolist() == [1, 0, 0]


def test_trend_slope_matches_least_squares_and_is_causal():
    rate = 10.0
    x = np.r_[np.zeros(20), np.arange(20) * 0.1]  # ramps at 1 unit/s from frame 20
    slope = trend_slope(x, 5, rate)
    assert np.isnan(slope[:4]).all()  # no full window yet
    assert slope[10] == pytest.approx(0.0)
    assert slope[30] == pytest.approx(1.0)
    fit = np.polyfit(np.arange(5) / rate, x[21:26], 1)[0]
    assert slope[25] == pytest.approx(fit)
    changed = x.copy()
    changed[35:] = -100.0  # the future never changes an earlier slope
    assert trend_slope(changed, 5, rate)[:35] == pytest.approx(slope[:35], nan_ok=True)


def test_trend_needs_half_the_window_observed():
    x = np.arange(10, dtype=float)
    x[2:9] = np.nan
    assert np.isnan(trend_slope(x, 10, 10.0)[-1])
    x = np.arange(10, dtype=float)
    x[::3] = np.nan
    assert trend_slope(x, 10, 10.0)[-1] == pytest.approx(10.0)


def test_trend_rule_labels_rising_speed():
    rules = _rules("labels: {speeding_up: {trend: {signal: speed, window_s: 0.4, "
                   "slope_above: 0.5}}}")
    speed = np.r_[np.ones(10), 1 + np.arange(10) * 0.1, np.full(10, 2.0)]
    labels = rules.apply(np.stack([speed, speed], 1), SIGNALS, 10.0)[:, 0]
    assert labels[:10].sum() == 0 and labels[14:20].all() and labels[25:].sum() == 0


def test_co_occurrence_within_window():
    rules = _rules("""
labels:
  fast: {threshold: {signal: speed, above: 1.0}}
  rough: {threshold: {signal: vibration, above: 1.0}}
  rough_and_fast: {co_occurrence: {all: [fast, rough], within_s: 0.3}}
""")
    speed = np.array([2, 0, 0, 0, 0, 0, 0, 0], dtype=float)
    vib = np.array([0, 0, 0, 2, 0, 0, 2, 0], dtype=float)
    labels = rules.apply(np.stack([speed, vib], 1), SIGNALS, 10.0)
    assert rules.label_names == ("fast", "rough", "rough_and_fast")
    # fast at 0 and rough at 3 are 3 frames (0.3 s) apart: both seen within the window at 3
    assert labels[:, 2].tolist() == [0, 0, 0, 1, 0, 0, 0, 0]


@pytest.mark.parametrize("text, where", [
    ("labels: {a: {threshold: {signal: speed, above: 1, hold: 2}}}", "labels.a.threshold"),
    ("labels: {a: {threshhold: {signal: speed, above: 1}}}", "unknown rule kind"),
    ("labels: {a: {threshold: {signal: sped, above: 1}}}", "unknown signal 'sped'"),
    ("labels: {a: {threshold: {signal: speed, above: 1, below: 2}}}", "exactly one"),
    ("labels: {a: {threshold: {signal: speed, above: .nan}}}", "labels.a.threshold.above"),
    ("labels: {a: {threshold: {signal: speed, above: true}}}", "labels.a.threshold.above"),
    ("labels: {a: {trend: {signal: speed, slope_above: 1}}}", "missing 'window_s'"),
    ("labels: {a: {trend: {signal: speed, window_s: 0, slope_above: 1}}}", "window_s"),
    ("labels: {a: {co_occurrence: {all: [b, c]}}}", "not labels defined above"),
    ("labels: {a: {threshold: {signal: speed, above: 1}, trend: {signal: speed}}}",
     "exactly one"),
    ("label: {}", "unknown keys ['label']"),
    ("labels: {}", "non-empty"),
    ("labels: {'a b': {threshold: {signal: speed, above: 1}}}", "letters, digits"),
])
def test_bad_rules_are_refused_naming_the_key(text, where):
    with pytest.raises(RulesError, match=None) as info:
        _rules(text)
    assert where in str(info.value)


def test_load_rules_names_the_file(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text("labels: {a: {threshold: {signal: speed, abov: 1}}}\n")
    with pytest.raises(RulesError, match=str(path)):
        load_rules(path)
    path.write_text("labels: [unclosed\n")
    with pytest.raises(RulesError, match="cannot read rules"):
        load_rules(path)


def test_apply_checks_shapes():
    rules = _rules("labels: {a: {threshold: {signal: speed, above: 1}}}")
    with pytest.raises(ValueError, match="values must be"):
        rules.apply(np.zeros((5, 3)), SIGNALS, 10.0)
    with pytest.raises(ValueError, match="rate_hz"):
        rules.apply(np.zeros((5, 2)), SIGNALS, 0.0)


def test_a_label_defined_twice_is_refused_not_overwritten(tmp_path):
    """PyYAML keeps the last of two equal keys: the first definition was lost silently."""
    path = tmp_path / "rules.yaml"
    path.write_text("labels:\n  fast:\n    threshold: {signal: speed, above: 1.0}\n"
                    "  fast:\n    threshold: {signal: speed, below: 0.5}\n")
    with pytest.raises(RulesError, match="'fast' is defined twice") as err:
        load_rules(path)
    assert "\n" not in str(err.value)
    path.write_text("labels:\n  fast:\n    threshold: &t {signal: speed, above: 1.0}\n"
                    "  faster:\n    threshold: {<<: *t, above: 2.0}\n")
    assert load_rules(path) is not None  # a merge key may be overridden, as YAML allows
