"""Streams: determinism, speed-independent rule labels, dropouts, events and windowing."""

import numpy as np
import pytest

from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
from thinkmem_ros.world import streams
from thinkmem_ros.world.streams import (
    EVENT_VOCABULARY,
    SCENARIOS,
    generate_stream,
    resample_stream,
    simulate_stream,
    stream_windows,
    window_labels,
)

L = {name: i for i, name in enumerate(THINKING)}
C = {name: i for i, name in enumerate(SIGNALS)}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_stream_is_deterministic_and_shaped(scenario):
    a = generate_stream(scenario, 60.0, 10.0, np.random.default_rng(3))
    b = generate_stream(scenario, 60.0, 10.0, np.random.default_rng(3))
    assert a.values.shape == (600, len(SIGNALS)) and a.labels.shape == (600, len(THINKING))
    assert np.array_equal(a.values, b.values, equal_nan=True)
    assert np.array_equal(a.labels, b.labels) and a.events == b.events
    assert a.scenario == scenario
    times = [t for t, _ in a.events]
    assert times == sorted(times) and all(0 <= t < 60.0 for t in times)
    assert {n for _, n in a.events} <= set(EVENT_VOCABULARY)


def test_unknown_scenario_names_the_valid_ones():
    with pytest.raises(ValueError, match="overheat"):
        generate_stream("volcano", 10.0, 10.0, np.random.default_rng(0))


def test_labels_rederive_from_clean_windows():
    stream, clean = simulate_stream("mixed", 300.0, 10.0, np.random.default_rng(11))
    ends = np.arange(31, clean.shape[0])
    windows = np.stack([clean[e - 31:e + 1] for e in ends])
    np.testing.assert_array_equal(window_labels(windows), stream.labels[ends])
    # the labels are about the clean signal, not the noisy one
    assert not np.array_equal(stream.values[~np.isnan(stream.values)],
                              clean[~np.isnan(stream.values)])


def test_labels_do_not_depend_on_the_frame_rate():
    fast = generate_stream("mixed", 120.0, 100.0, np.random.default_rng(5))
    slow = resample_stream(fast, 10.0)
    _, clean = simulate_stream("mixed", 120.0, 100.0, np.random.default_rng(5))
    clean10 = clean[::10]
    ends = np.arange(31, clean10.shape[0])
    windows = np.stack([clean10[e - 31:e + 1] for e in ends])
    np.testing.assert_array_equal(window_labels(windows), slow.labels[ends])


def test_scenarios_raise_the_thinking_they_are_about():
    def active(scenario):
        s = generate_stream(scenario, 200.0, 10.0, np.random.default_rng(1))
        return {THINKING[i] for i in np.flatnonzero(s.labels.sum(0))}

    assert active("nominal") == set()
    assert {"temp_current_inconsistency", "trend", "hazard", "cause"} <= active("overheat")
    assert "temp_current_inconsistency" not in active("recovery")
    assert "recovery_confirmation" in active("recovery")
    assert {"vibration_load_comparison", "hazard"} <= active("overload")
    assert {"visibility_distance_check", "hazard", "information_seeking"} \
        <= active("fog_obstacle")
    assert active("late_current_change") == {"late_change_inspection"}
    assert {"future_impact", "late_change_inspection"} <= active("rare_onset")


def test_late_current_change_fires_only_just_after_a_step():
    stream, clean = simulate_stream("late_current_change", 200.0, 10.0,
                                    np.random.default_rng(2))
    jump = np.abs(np.diff(clean[:, C["current"]])) > 2.0
    steps = np.flatnonzero(jump) + 1  # first frame after each step
    late = stream.labels[:, L["late_change_inspection"]] > 0
    assert len(steps) >= 4
    expected = np.zeros_like(late)
    for s in steps:
        expected[s:s + 8] = True  # the step lies in the last quarter (8 frames) of the window
    np.testing.assert_array_equal(late, expected)


def test_mixed_has_nan_dropouts_masked_in_windows():
    stream = generate_stream("mixed", 300.0, 10.0, np.random.default_rng(4))
    missing = np.isnan(stream.values)
    assert 0.001 < missing.mean() < 0.05
    assert missing.any(axis=0).sum() >= 3  # bursts hit several channels
    data = stream_windows(stream, 32, stride=4)
    assert np.isfinite(data.signals).all()
    assert (data.mask == 0).any()
    assert np.all(data.signals[data.mask == 0] == 0.0)
    ends = data.meta["end_frames"]
    np.testing.assert_array_equal(data.mask[:, -1, :] == 0, missing[ends])
    for name in ("overheat", "nominal"):
        assert not np.isnan(generate_stream(name, 60.0, 10.0, np.random.default_rng(0))
                            .values).any()


def test_stream_windows_align_signals_labels_and_events():
    stream = generate_stream("mixed", 120.0, 10.0, np.random.default_rng(9))
    data = stream_windows(stream, 32, stride=3, max_events=5)
    ends = np.arange(31, 1200, 3)
    assert len(data) == len(ends) and data.signals.shape == (len(ends), 32, len(SIGNALS))
    np.testing.assert_array_equal(data.labels, stream.labels[ends])
    row = 10
    window = stream.values[ends[row] - 31:ends[row] + 1]
    np.testing.assert_array_equal(data.signals[row], np.nan_to_num(window, nan=0.0))
    assert len(set(data.groups)) == 1
    # events: the last 5 at or before the window end, oldest first, 0-padded on the left
    for row in (0, 50, len(ends) - 1):
        t_end = ends[row] / stream.rate_hz
        past = [n for t, n in stream.events if t <= t_end][-5:]
        ids = [data.event_vocabulary.index(n) + 1 for n in past]
        assert list(data.events[row]) == [0] * (5 - len(ids)) + ids
    assert (data.events[-1] > 0).all()


def test_threshold_events_follow_the_clean_signal():
    stream, clean = simulate_stream("overheat", 200.0, 10.0, np.random.default_rng(6))
    highs = [t for t, n in stream.events if n == "temperature_high"]
    normals = [t for t, n in stream.events if n == "temperature_normal"]
    assert len(highs) >= 2 and len(highs) - len(normals) in (0, 1)
    for t in highs:
        i = int(round(t * 10))
        assert clean[i, C["temperature"]] >= 65.0 > clean[i - 1, C["temperature"]]


def test_long_fast_mixed_stream_is_physical():
    stream = generate_stream("mixed", 600.0, 100.0, np.random.default_rng(0))
    assert stream.values.shape == (60000, len(SIGNALS))
    v = stream.values
    lo, hi = np.nanmin(v, axis=0), np.nanmax(v, axis=0)
    assert 20 <= lo[C["temperature"]] and hi[C["temperature"]] <= 95
    assert 0.2 <= lo[C["distance"]] and hi[C["distance"]] <= 10
    assert 0 <= lo[C["visibility"]] and hi[C["visibility"]] <= 1
    # several signals are abnormal at the same time somewhere in the stream
    busy = (stream.labels[:, L["vibration_load_comparison"]] > 0) & \
        (stream.labels[:, L["visibility_distance_check"]] > 0)
    assert busy.any() or ((stream.labels[:, L["temp_current_inconsistency"]] > 0)
                          & (stream.labels[:, L["vibration_load_comparison"]] > 0)).any()


def test_stream_windows_rejects_bad_arguments():
    stream = generate_stream("nominal", 2.0, 10.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="window"):
        stream_windows(stream, 32)
    with pytest.raises(ValueError, match="stride"):
        stream_windows(stream, 4, stride=0)
    with pytest.raises(ValueError, match="rate"):
        resample_stream(stream, 3.0)
    assert streams.RULE_WINDOW == 32
