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
        "sensors/distance", "sensor_msgs/msg/Range", "range")
    assert config.signal_map["load"].msg_type == "std_msgs/msg/Float32"


def test_yaml_defaults_match_declared_parameters():
    data = yaml.safe_load((REPO / "config" / "thinkmem.yaml").read_text())
    params = data["/**"]["ros__parameters"]
    for spec in PARAMETERS:
        assert spec.name in params, spec.name
        assert params[spec.name] == spec.default, spec.name
        assert type(params[spec.name]) is type(spec.default), spec.name
    for name in SIGNALS:
        declared = {spec.name.split(".")[2]: spec.default for spec in signal_params(name)}
        for key in ("topic", "type", "field"):  # adapter keys are optional in the file
            assert key in params["signals"][name], (name, key)
        for key, value in params["signals"][name].items():
            assert value == declared[key], (name, key)
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
    ({"executor": "multi"}, "executor"),
    ({"qos_depth": 0}, "qos_depth"),
    ({"inference_threads": 1.5}, "inference_threads"),
    ({"robot_id": " "}, "robot_id"),
    ({"diagnostics_period_s": 0}, "diagnostics_period_s"),
    ({"thresholds": {"hazard": 1.5}}, "thresholds"),
    ({"events_topic": "/sensors/load"}, "events_topic"),
    ({"recall_endpoint": "tcp://127.0.0.1:*"}, "recall_endpoint .*'\\*' only binds"),
    ({"recall_endpoint": "tcp://127.0.0.1:99999"}, "recall_endpoint"),
    ({"recall_endpoint": "tcp://*:5756"}, "recall_endpoint"),
    ({"recall_endpoint": "10.0.0.5:5756"}, "recall_endpoint"),
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


def test_signals_may_share_a_topic_of_one_type():
    """Speed and yaw rate from one Odometry: one topic, two fields, no republisher."""
    odom = "nav_msgs/msg/Odometry"
    signal_map = dict(DEFAULT_SIGNAL_MAP,
                      current=SignalSource("/odom", odom, "twist.twist.linear.x"),
                      load=SignalSource("odom", odom, "twist.twist.angular.z"))
    config = NodeConfig(signal_map=signal_map)
    assert config.signal_map["load"].field == "twist.twist.angular.z"


def test_signals_reading_one_topic_as_two_types_are_refused():
    signal_map = dict(DEFAULT_SIGNAL_MAP,
                      load=SignalSource("/sensors/current", "sensor_msgs/msg/Imu",
                                        "angular_velocity.z"))
    with pytest.raises(ValueError, match="'current' and 'load' read topic.*one type"):
        NodeConfig(signal_map=signal_map)


@pytest.mark.parametrize("kwargs, key", [
    ({"events_topic": "thinking/activation"}, "events_topic"),
    ({"events_topic": "/thinking/evidence"}, "events_topic"),
    ({"feedback_topic": "thinking/activation"}, "feedback_topic"),
], ids=["events-own-activation", "events-own-evidence", "feedback-own-activation"])
def test_inputs_must_not_be_the_nodes_own_outputs(kwargs, key):
    """The node would read what it publishes: an event of 588 characters every frame."""
    with pytest.raises(ValueError, match=f"{key} .* one of the node's own outputs"):
        NodeConfig(**kwargs)
    current = DEFAULT_SIGNAL_MAP["current"]
    own = SignalSource("thinking/probabilities", "std_msgs/msg/Float32MultiArray", "data.2")
    with pytest.raises(ValueError, match="signals.current.topic .* own outputs"):
        NodeConfig(signal_map=dict(DEFAULT_SIGNAL_MAP, current=own))
    assert current.topic != own.topic


@pytest.mark.parametrize("text", ["hazard", "hazard=x", "=0.3", "hazard=1.2",
                                  "hazard=0.1,hazard=0.9"])
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


# ------------------------------------------------------------------ params files and names

from thinkmem_ros.robot.node_config import (  # noqa: E402
    SIGNAL_MAP_KEYS,
    ParamsFileError,
    check_parameter_names,
    node_fqn_from_args,
    params_files_from_args,
    read_params_file,
    selector_matches,
    unknown_parameters,
    validate_ros_args,
)


def test_signal_map_keys_are_the_declared_signal_parameters():
    assert tuple(spec.name.rsplit(".", 1)[1] for spec in signal_params("load")) == \
        SIGNAL_MAP_KEYS


def test_default_topics_are_relative_and_resolve_to_the_documented_names():
    for src in DEFAULT_SIGNAL_MAP.values():
        assert not src.topic.startswith("/") and src.topic.startswith("sensors/")
    config = NodeConfig()
    assert config.events_topic == "sensors/events"
    assert config.feedback_topic == "thinking/feedback"


def test_the_shipped_params_file_passes_the_checks():
    params = read_params_file(REPO / "config" / "thinkmem.yaml")
    assert unknown_parameters(params, SIGNALS) == []
    validate_ros_args(["x", "--ros-args", "--params-file", str(REPO / "config" / "thinkmem.yaml")])


@pytest.mark.parametrize("name, says", [
    ("frame_rate", "did you mean 'frame_rate_hz'"),
    ("signals.vibrations.topic", "unknown signal 'vibrations'"),
    ("signals.temperature.scael", "unknown key 'scael'"),
    ("signals.temperature", "signals.<signal>.<key>"),
    ("signals.temperature.topic.x", "signals.<signal>.<key>"),
])
def test_unknown_parameter_names_are_named(name, says):
    errors = unknown_parameters([name, "frame_rate_hz", "use_sim_time"], SIGNALS)
    assert len(errors) == 1 and says in errors[0]
    with pytest.raises(ValueError, match="parameters: "):
        check_parameter_names([name], SIGNALS, source="parameters")


def test_signal_names_of_the_bundle_are_known_even_outside_the_vocabulary():
    assert unknown_parameters(["signals.wheel_speed.topic"], ["wheel_speed"]) == []
    assert unknown_parameters(["signals.wheel_speed.topic"], None) == []  # checked later
    assert unknown_parameters(["signals.wheel_speed.topic"], SIGNALS) != []


@pytest.mark.parametrize("selector, fqn, matches", [
    ("/**", "/thinking_node", True), ("/**", "/a/b/thinking_node", True),
    ("thinking_node", "/thinking_node", True), ("/thinking_node", "/ns/thinking_node", False),
    ("/*", "/thinking_node", True), ("/*", "/ns/thinking_node", False),
    ("/**/thinking_node", "/ns/thinking_node", True), ("/ns/*", "/ns/thinking_node", True),
    ("other", "/thinking_node", False), ("thinking_*", "/thinking_node", True),
])
def test_node_selectors_follow_rcl(selector, fqn, matches):
    assert selector_matches(selector, fqn) is matches


def test_node_name_and_files_come_from_the_ros_arguments():
    argv = ["prog", "--ros-args", "-r", "__ns:=/robot1", "--params-file", "a.yaml", "--",
            "--params-file", "ignored.yaml", "--ros-args", "-r", "thinking_node:__node:=tn",
            "--params-file", "b.yaml"]
    assert node_fqn_from_args(argv) == "/robot1/tn"
    assert params_files_from_args(argv) == ["a.yaml", "b.yaml"]
    with pytest.raises(ParamsFileError, match="needs a file"):
        params_files_from_args(["prog", "--ros-args", "--params-file"])


# What rcl itself accepts or refuses, checked against the real parser: the pre-check must
# refuse everything rcl refuses (or the node ends in an RCLError) and accept what it reads.
RCL_CASES = {
    "ok": ("/**:\n  ros__parameters:\n    a: 1\n", True),
    "bare_name": ("thinking_node:\n  ros__parameters:\n    a: 4\n", True),
    "nested": ("/**:\n  ros__parameters:\n    a: {b: {c: 2}}\n", True),
    "other_node": ("other:\n  ros__parameters:\n    a: 7\n", True),
    "namespaces": ("ns:\n  thinking_node:\n    ros__parameters:\n      a: 3\n", True),
    "null_word": ("/**:\n  ros__parameters:\n    a: null\n", True),
    "nested_list": ("/**:\n  ros__parameters:\n    a: [[1]]\n", True),
    "empty_file": ("", True),
    "not_yaml": ("{{{", False),
    "list_top": ("[1, 2]\n", False),
    "no_ros_parameters": ("/**:\n  params:\n    a: 1\n", False),
    "value_beside": ("/**:\n  ros__parameters:\n    a: 1\n  other: 2\n", False),
    "no_value": ("/**:\n  ros__parameters:\n    a:\n", False),
    "scalar_params": ("/**:\n  ros__parameters: 5\n", False),
    "no_node_name": ("ros__parameters:\n  a: 1\n", False),
    "flat": ("a: 1\n", False),
    "sequence_key": ("/**:\n  ros__parameters:\n    ? [a]\n    : 1\n", False),
}


@pytest.mark.parametrize("case", sorted(RCL_CASES))
def test_params_file_structure_agrees_with_rcl(case, tmp_path):
    rclpy = pytest.importorskip("rclpy")
    from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy

    text, expected = RCL_CASES[case]
    path = tmp_path / "p.yaml"
    path.write_text(text)
    context = rclpy.Context()
    try:
        context.init(["x", "--ros-args", "--params-file", str(path)])
        rcl_accepts = True
    except _rclpy.RCLError:
        rcl_accepts = False
    finally:
        if context.ok():
            context.shutdown()
    assert rcl_accepts is expected, "the case table is wrong about rcl"
    try:
        read_params_file(path)
        ours = True
    except ParamsFileError:
        ours = False
    assert ours is expected


def test_missing_and_huge_params_files_are_refused(tmp_path):
    with pytest.raises(ParamsFileError, match="cannot read"):
        read_params_file(tmp_path / "nope.yaml")
    huge = tmp_path / "huge.yaml"
    huge.write_text("/**:\n  ros__parameters:\n" + "    a: 1\n" * 200_000)
    with pytest.raises(ParamsFileError, match="larger than"):
        read_params_file(huge)
