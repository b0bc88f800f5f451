from pathlib import Path

import pytest
import yaml

from thinkmem_ros.core.vocabulary import SIGNALS
from thinkmem_ros.robot.msg_fields import FieldError, FieldPath, canonical_type, extract_stamp
from thinkmem_ros.robot.node_config import (
    DEFAULT_SIGNAL_MAP,
    PARAMETERS,
    NodeConfig,
    SignalSource,
    parse_thresholds,
    signal_params,
)

REPO = Path(__file__).resolve().parent.parent


def test_defaults_are_valid_and_cover_every_signal():
    config = NodeConfig()
    assert set(config.signal_map) == set(SIGNALS)
    assert config.signal_map["temperature"].msg_type == "sensor_msgs/msg/Temperature"
    assert config.signal_map["distance"] == SignalSource(
        "/sensors/distance", "sensor_msgs/msg/Range", "range")
    assert config.signal_map["load"].msg_type == "std_msgs/msg/Float32"


def test_yaml_defaults_match_declared_parameters():
    data = yaml.safe_load((REPO / "config" / "thinkmem.yaml").read_text())
    params = data["/**"]["ros__parameters"]
    for spec in PARAMETERS:
        assert spec.name in params, spec.name
        assert params[spec.name] == spec.default, spec.name
        assert type(params[spec.name]) is type(spec.default), spec.name
    for name in SIGNALS:
        for spec in signal_params(name):
            _, _, key = spec.name.split(".")
            assert params["signals"][name][key] == spec.default, spec.name
    assert set(params) - {"signals"} == {spec.name for spec in PARAMETERS}


def test_from_parameters_copies_values_and_parses_thresholds():
    values = {"frame_rate_hz": 20.0, "thresholds": "hazard=0.3, trend=0.7",
              "signals.load.topic": "/robot/load", "signals.load.type": "std_msgs/Float64"}
    config = NodeConfig.from_parameters(values, SIGNALS)
    assert config.frame_rate_hz == 20.0
    assert config.thresholds == {"hazard": 0.3, "trend": 0.7}
    assert config.signal_map["load"] == SignalSource("/robot/load", "std_msgs/msg/Float64",
                                                     "data")
    assert config.effective_rate(5.0) == 20.0
    assert NodeConfig().effective_rate(5.0) == 5.0


@pytest.mark.parametrize("kwargs, key", [
    ({"frame_rate_hz": -1.0}, "frame_rate_hz"),
    ({"frame_rate_hz": float("nan")}, "frame_rate_hz"),
    ({"stale_after_s": 0.0}, "stale_after_s"),
    ({"qos": "fast"}, "qos"),
    ({"frame_trigger": "sometimes"}, "frame_trigger"),
    ({"qos_depth": 0}, "qos_depth"),
    ({"inference_threads": 1.5}, "inference_threads"),
    ({"robot_id": " "}, "robot_id"),
    ({"diagnostics_period_s": 0}, "diagnostics_period_s"),
    ({"thresholds": {"hazard": 1.5}}, "thresholds"),
    ({"events_topic": "/sensors/load"}, "events_topic"),
])
def test_invalid_values_are_refused_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        NodeConfig(**kwargs)


@pytest.mark.parametrize("source, key", [
    (SignalSource("/x", "sensor_msgs/msg/Temperature", "temp"), "signals.temperature.field"),
    (SignalSource("/x", "sensor_msgs/msg/Nope", "temperature"), "signals.temperature.type"),
    (SignalSource("/x", "nonexistent_msgs/msg/Foo", "data"), "signals.temperature.type"),
    (SignalSource("/x", "not a type", "data"), "signals.temperature.type"),
    (SignalSource("/x", "sensor_msgs/msg/Temperature", "header"), "signals.temperature.field"),
    (SignalSource("", "std_msgs/msg/Float32", "data"), "signals.temperature.topic"),
])
def test_bad_signal_source_names_the_parameter(source, key):
    signal_map = dict(DEFAULT_SIGNAL_MAP, temperature=source)
    with pytest.raises(ValueError, match=key):
        NodeConfig(signal_map=signal_map)


def test_signals_must_not_share_topics():
    signal_map = dict(DEFAULT_SIGNAL_MAP, load=DEFAULT_SIGNAL_MAP["current"])
    with pytest.raises(ValueError, match="share topics"):
        NodeConfig(signal_map=signal_map)


@pytest.mark.parametrize("text", ["hazard", "hazard=x", "=0.3", "hazard=1.2"])
def test_bad_threshold_entries(text):
    with pytest.raises(ValueError, match="thresholds"):
        parse_thresholds(text)


def test_field_paths_reach_nested_numbers_and_stamps():
    from geometry_msgs.msg import PoseStamped
    from sensor_msgs.msg import Temperature
    from std_msgs.msg import Float32MultiArray

    assert canonical_type("sensor_msgs/Range") == "sensor_msgs/msg/Range"
    pose = PoseStamped()
    pose.pose.position.y = 2.5
    pose.header.stamp.sec, pose.header.stamp.nanosec = 3, 500_000_000
    y = FieldPath.compile("geometry_msgs/msg/PoseStamped", "pose.position.y")
    assert y.extract(pose) == 2.5
    assert extract_stamp(pose) == 3.5
    assert extract_stamp(Temperature()) is None  # unset stamp means 'no stamp'
    arr = FieldPath.compile("std_msgs/msg/Float32MultiArray", "data.1")
    assert arr.extract(Float32MultiArray(data=[1.0, 4.0])) == 4.0
    with pytest.raises(FieldError):
        arr.extract(Float32MultiArray(data=[1.0]))
