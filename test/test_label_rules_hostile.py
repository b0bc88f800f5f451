"""Hostile labelling rules files: each is refused in one line naming the file and the key."""

from __future__ import annotations

import pytest

from thinkmem_ros.core.label_rules import RulesError, load_rules

SIGNALS = ("yaw_rate", "vibration")


def _write(tmp_path, body: str):
    path = tmp_path / "rules.yaml"
    path.write_text("labels:\n" + body, encoding="utf-8")
    return path


def test_an_integer_too_large_for_a_float_names_the_file_and_key(tmp_path):
    """math.isfinite of a 400-digit integer raised OverflowError, naming neither."""
    path = _write(tmp_path, "  turning:\n    threshold: {signal: yaw_rate, above: "
                  + "9" * 400 + ", absolute: true}\n")
    with pytest.raises(RulesError) as err:
        load_rules(path, SIGNALS)
    message = str(err.value)
    assert message.startswith(f"{path}: labels.turning.threshold.above must be a finite number")
    assert "\n" not in message and len(message) < 300


def test_an_integer_past_the_digit_limit_names_the_file(tmp_path):
    """Past 4300 digits the YAML reader itself fails, with a ValueError about sys settings."""
    path = _write(tmp_path, "  turning:\n    threshold: {signal: yaw_rate, hold_s: "
                  + "9" * 5000 + ", above: 0.1}\n")
    with pytest.raises(RulesError) as err:
        load_rules(path, SIGNALS)
    message = str(err.value)
    assert message == f"{path}: cannot read rules: a number has too many digits"


def test_a_co_occurrence_of_one_label_repeated_is_refused(tmp_path):
    """``all: [turning, turning]`` passed the 'at least 2 labels' check: a copy of turning."""
    path = _write(tmp_path, "  turning:\n    threshold: {signal: yaw_rate, above: 0.1}\n"
                  "  rough:\n    threshold: {signal: vibration, above: 0.6}\n"
                  "  again:\n    co_occurrence: {all: [turning, rough, turning]}\n")
    with pytest.raises(RulesError) as err:
        load_rules(path, SIGNALS)
    message = str(err.value)
    assert message.startswith(f"{path}: labels.again.co_occurrence: 'all' names ['turning'] "
                              "more than once")
    assert "\n" not in message
    path = _write(tmp_path, "  turning:\n    threshold: {signal: yaw_rate, above: 0.1}\n"
                  "  rough:\n    threshold: {signal: vibration, above: 0.6}\n"
                  "  both:\n    co_occurrence: {all: [turning, rough]}\n")
    assert load_rules(path, SIGNALS).label_names == ("turning", "rough", "both")


@pytest.mark.parametrize("rule, key", [
    ("threshold: {signal: yaw_rate, above: 0.1, absolute: true, hold_s: 1e300}", "hold_s"),
    ("trend: {signal: yaw_rate, window_s: 1.0e7, slope_above: 0.1}", "window_s"),
    ("co_occurrence: {all: [turning, rough], within_s: 604801}", "within_s"),
])
def test_seconds_past_a_week_are_refused_naming_the_key(tmp_path, rule, key):
    """``hold_s: 1e300`` kept the label on for every frame and trained without a word."""
    path = _write(tmp_path, "  turning:\n    threshold: {signal: yaw_rate, above: 0.1}\n"
                  "  rough:\n    threshold: {signal: vibration, above: 0.6}\n"
                  f"  odd:\n    {rule}\n")
    kind = rule.split(":")[0]
    with pytest.raises(RulesError) as err:
        load_rules(path, SIGNALS)
    message = str(err.value)
    assert message.startswith(f"{path}: labels.odd.{kind}.{key} must be at most 604800 "
                              "seconds (a week)")
    assert "\n" not in message
    path = _write(tmp_path, "  turning:\n    threshold: {signal: yaw_rate, above: 0.1, "
                  "hold_s: 604800}\n")
    assert load_rules(path, SIGNALS).label_names == ("turning",)


@pytest.mark.parametrize("bound, says", [("above: -1.0", "never off"),
                                         ("below: 0", "never on")])
def test_an_absolute_threshold_that_cannot_change_is_refused(tmp_path, bound, says):
    """``above: -1.0, absolute: true`` labelled every frame positive and trained rc 0."""
    path = _write(tmp_path, f"  turning:\n    threshold: {{signal: yaw_rate, {bound}, "
                  "absolute: true}\n")
    key = bound.split(":")[0]
    with pytest.raises(RulesError) as err:
        load_rules(path, SIGNALS)
    message = str(err.value)
    assert message.startswith(f"{path}: labels.turning.threshold.{key}: with absolute: true")
    assert says in message and "\n" not in message
    path = _write(tmp_path, "  turning:\n    threshold: {signal: yaw_rate, above: -1.0}\n")
    assert load_rules(path, SIGNALS).label_names == ("turning",)  # a signed signal may dip
