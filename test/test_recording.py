"""Recordings as frames: signal maps, ROS 1 and rosbag2 bags, the node's resampling."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from thinkmem_ros.core.data import SignalStream
from thinkmem_ros.playback.bag_files import BagError, write_stream
from thinkmem_ros.playback.recording import (
    Samples,
    load_signal_map,
    parse_signal_map,
    read_recording,
    read_samples,
    recording_windows,
    resample,
    split_stream,
    summarise,
)

REAL = Path(__file__).parent / "data" / "real"
BAG = REAL / "husky_outdoor.bag"
PARAMS = REAL / "husky_params.yaml"


def _map(signals: dict, **extra):
    return parse_signal_map({"/**": {"ros__parameters": {"signals": signals, **extra}}})


def test_signal_map_is_strict_and_names_the_key():
    ok = _map({"speed": {"topic": "odom", "type": "nav_msgs/Odometry",
                         "field": "twist.twist.linear.x", "unit": "m/s"}}, frame_rate_hz=5.0)
    assert ok.names == ("speed",) and ok.frame_rate_hz == 5.0
    assert ok.bindings["speed"].topic == "/odom"
    assert ok.bindings["speed"].msg_type == "nav_msgs/msg/Odometry"
    assert ok.units == {"speed": "m/s"}
    with pytest.raises(ValueError, match="signals.speed: unknown key 'scael'"):
        _map({"speed": {"topic": "odom", "type": "nav_msgs/Odometry", "field": "a",
                        "scael": 2}})
    with pytest.raises(ValueError, match="signals.speed.topic must be a non-empty string"):
        _map({"speed": {"topic": "", "type": "nav_msgs/Odometry", "field": "a"}})
    with pytest.raises(ValueError, match="signals.speed must be a mapping"):
        _map({"speed": "odom"})


def test_a_signal_is_read_as_the_node_reads_it():
    """Topic, type and field left out take the node's defaults for the signal (a params
    file the robot runs was refused by train --bag and calibrate: topic is required)."""
    from thinkmem_ros.robot.node_config import DEFAULT_SIGNAL_MAP

    got = _map({"temperature": {}, "vibration": {"field": "data", "scale": 2.0},
                "own_signal": {"topic": "/own"}})
    for name in ("temperature", "vibration"):
        node = DEFAULT_SIGNAL_MAP[name]
        assert got.bindings[name].topic == "/" + node.topic
        assert got.bindings[name].msg_type == node.msg_type
        assert not got.bindings[name].absent
    assert got.bindings["own_signal"].msg_type == "std_msgs/msg/Float32"
    assert got.bindings["vibration"].adapter.scale == 2.0
    with pytest.raises(ValueError, match="signals.speed.absent"):
        _map({"speed": {"topic": "o", "type": "a/B", "field": "a", "absent": "yes"}})
    with pytest.raises(ValueError, match="frame_rate_hz"):
        _map({"speed": {"topic": "o", "type": "a/B", "field": "a"}}, frame_rate_hz=-1)
    with pytest.raises(ValueError, match="no 'signals' mapping"):
        parse_signal_map({"/**": {"ros__parameters": {"robot_id": "x"}}})


def test_real_ros1_bag_reads_through_the_adapters():
    signal_map = load_signal_map(PARAMS)
    samples = read_samples(BAG, signal_map)
    stats = summarise(samples, signal_map.names)
    assert stats["speed"]["samples"] == 3952 and stats["vibration"]["samples"] == 11865
    assert stats["speed"]["rate_hz"] == pytest.approx(10.0, rel=0.01)
    assert stats["vibration"]["rate_hz"] == pytest.approx(30.0, rel=0.01)
    # gravity removed from |a|: a driving robot's jolts are tenths of m/s^2, not 9.8
    assert 0.05 < stats["vibration"]["p50"] < 0.5
    assert stats["vibration"]["min"] >= 0.0  # absolute
    assert 0.9 < stats["speed"]["p50"] < 1.1  # the Husky drives at about 1 m/s
    assert samples.duration_s == pytest.approx(395.3, abs=0.1)


def test_real_bag_wrong_topic_or_type_is_named():
    signal_map = _map({"speed": {"topic": "/odom", "type": "nav_msgs/msg/Odometry",
                                 "field": "twist.twist.linear.x"}})
    with pytest.raises(BagError, match="signals.speed.topic: '/odom' is not in"):
        read_samples(BAG, signal_map)
    signal_map = _map({"speed": {"topic": "/imu/data", "type": "nav_msgs/msg/Odometry",
                                 "field": "twist.twist.linear.x"}})
    with pytest.raises(BagError, match="signals.speed.type: .* as 'sensor_msgs/msg/Imu'"):
        read_samples(BAG, signal_map)


def test_absent_signal_is_never_read_and_stays_nan():
    raw = yaml.safe_load(PARAMS.read_text())
    raw["/**"]["ros__parameters"]["signals"]["gyro"]["absent"] = True
    signal_map = parse_signal_map(raw)
    stream = read_recording(BAG, signal_map, 10.0)
    column = signal_map.names.index("gyro")
    assert np.isnan(stream.values[:, column]).all()
    assert np.isfinite(stream.values[50:, signal_map.names.index("speed")]).all()


def test_resample_takes_the_latest_sample_and_masks_stale():
    samples = Samples(times={"a": np.array([0.0, 0.25, 0.31, 1.5])},
                      values={"a": np.array([1.0, 2.0, math.nan, 4.0])},
                      start_ns=0, duration_s=2.0)
    frames = resample(samples, ("a",), rate_hz=5.0, stale_after_s=0.5)[:, 0]
    # ticks 0, .2, .4, ..., 2.0: the latest finite sample (the NaN at .31 is skipped),
    # NaN once it is older than 0.5 s (the sample of .25 at tick .8) until 1.5 arrives
    expected = [1, 1, 2, 2, np.nan, np.nan, np.nan, np.nan, 4, 4, 4]
    np.testing.assert_array_equal(frames, np.array(expected, dtype=np.float32))


def test_rosbag2_round_trip_frame_for_frame(tmp_path):
    rng = np.random.default_rng(3)
    values = rng.normal(size=(40, 2)).astype(np.float32)
    values[7, 1] = np.nan  # a dropout: the previous sample is held (fresh within 0.5 s)
    stream = SignalStream(rate_hz=10.0, values=values, labels=np.zeros((40, 0)),
                          label_names=(), signal_names=("current", "distance"))
    write_stream(stream, tmp_path / "bag")
    signal_map = _map({
        "current": {"topic": "sensors/current", "type": "std_msgs/msg/Float32",
                    "field": "data", "scale": 2.0},
        "distance": {"topic": "sensors/distance", "type": "sensor_msgs/msg/Range",
                     "field": "range"}})
    out = read_recording(tmp_path / "bag", signal_map, 10.0)
    assert out.values.shape == (40, 2)
    np.testing.assert_allclose(out.values[:, 0], 2.0 * values[:, 0], rtol=1e-6)
    held = values[:, 1].copy()
    held[7] = held[6]
    np.testing.assert_allclose(out.values[:, 1], held, rtol=1e-6)


def test_windows_and_time_split():
    values = np.arange(100, dtype=np.float32).reshape(50, 2)
    values[10, 0] = np.nan
    labels = (np.arange(50) % 2).astype(np.float32)[:, None]
    stream = SignalStream(rate_hz=10.0, values=values, labels=labels, label_names=("odd",),
                          signal_names=("a", "b"))
    head, tail = split_stream(stream, 0.7)
    assert head.values.shape[0] == 35 and tail.values.shape[0] == 15
    np.testing.assert_array_equal(tail.values, values[35:])
    data = recording_windows(head, 8, group_seconds=1.0)
    assert data.signals.shape == (28, 8, 2) and data.event_vocabulary == ()
    np.testing.assert_array_equal(data.labels[:, 0], labels[7:35, 0])
    assert data.mask[3, 7, 0] == 0 and data.signals[3, 7, 0] == 0  # frame 10, masked
    assert data.groups.tolist() == (np.arange(7, 35) // 10).tolist()
    with pytest.raises(ValueError, match="fewer than window"):
        recording_windows(tail, 16)
