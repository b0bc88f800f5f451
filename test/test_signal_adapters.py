"""Signal adapters: real message types in, the bundle's units out, strict validation."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from thinkmem_ros.core.signal_adapters import (
    ADAPTER_KEYS,
    SIGNAL_ENTRY_KEYS,
    STANDARD_GRAVITY,
    SignalAdapter,
    parse_adapter,
)
from thinkmem_ros.core.vocabulary import SIGNALS
from thinkmem_ros.robot.msg_fields import check_adapter
from thinkmem_ros.robot.node_config import (
    SIGNAL_MAP_KEYS,
    NodeConfig,
    SignalSource,
    source_from_entry,
    unknown_parameters,
)

REPO = Path(__file__).resolve().parent.parent


def _imu(x: float, y: float, z: float):
    from sensor_msgs.msg import Imu

    msg = Imu()
    msg.linear_acceleration.x, msg.linear_acceleration.y, msg.linear_acceleration.z = x, y, z
    return msg


def test_the_order_is_select_norm_gravity_absolute_scale_offset():
    msg = _imu(3.0, 0.0, 4.0)  # |a| = 5
    adapter = parse_adapter("vibration", {
        "field": "linear_acceleration", "norm": True, "remove_gravity": 7.0,
        "absolute": True, "scale": 10.0, "offset": 1.0})
    assert adapter.read(msg) == pytest.approx(abs(5.0 - 7.0) * 10.0 + 1.0)  # 21, not -19
    no_abs = parse_adapter("vibration", {"field": "linear_acceleration", "norm": True,
                                         "remove_gravity": 7.0, "scale": 10.0, "offset": 1.0})
    assert no_abs.read(msg) == pytest.approx(-19.0)
    rest = parse_adapter("vibration", {"field": "linear_acceleration", "norm": True,
                                       "remove_gravity": True})
    assert rest.remove_gravity == STANDARD_GRAVITY
    assert rest.read(_imu(0.0, 0.0, STANDARD_GRAVITY)) == pytest.approx(0.0, abs=1e-12)
    assert SignalAdapter("linear_acceleration.z").read(msg) == 4.0


def test_odometry_quaternion_jointstate_battery_range_temperature():
    from nav_msgs.msg import Odometry
    from sensor_msgs.msg import BatteryState, JointState, Range, Temperature

    odom = Odometry()
    odom.twist.twist.linear.x, odom.twist.twist.linear.y = -0.3, 0.4
    speed = parse_adapter("motion", {"field": "twist.twist.linear", "norm": True,
                                     "scale": 1000.0, "unit": "mm/s"})
    assert speed.read(odom) == pytest.approx(500.0) and speed.unit == "mm/s"
    assert parse_adapter("x", {"field": "pose.pose.orientation", "norm": True}).read(
        odom) == pytest.approx(1.0)  # default quaternion w=1
    joints = JointState(name=["a", "wheel_left_joint", "c"], effort=[1.0, -2.5, 3.0])
    by_name = parse_adapter("load", {"field": "effort", "element": "wheel_left_joint",
                                     "absolute": True})
    assert by_name.read(joints) == 2.5
    assert parse_adapter("load", {"field": "effort", "index": 2}).read(joints) == 3.0
    reordered = JointState(name=["wheel_left_joint", "a"], effort=[7.0, 1.0])
    assert by_name.read(reordered) == 7.0  # looked up per message, not cached
    battery = BatteryState(temperature=31.5, current=-2.0)
    assert parse_adapter("current", {"field": "current", "absolute": True}).read(
        battery) == 2.0
    assert parse_adapter("distance", {"field": "range", "scale": 1000.0}).read(
        Range(range=1.25)) == 1250.0
    assert parse_adapter("temperature", {"field": "temperature", "offset": -273.15}).read(
        Temperature(temperature=300.0)) == pytest.approx(26.85)


def test_rosbags_dataclasses_read_like_rclpy_messages():
    from rclpy.serialization import serialize_message
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    imu = store.deserialize_cdr(serialize_message(_imu(3.0, 4.0, 0.0)), "sensor_msgs/msg/Imu")
    adapter = parse_adapter("vibration", {"field": "linear_acceleration", "norm": True})
    assert adapter.read(imu) == pytest.approx(5.0) == adapter.read(_imu(3.0, 4.0, 0.0))
    t = store.types
    joints = t["sensor_msgs/msg/JointState"](
        header=t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=0, nanosec=0),
                                        frame_id=""),
        name=["a", "b"], position=np.zeros(2), velocity=np.zeros(2),
        effort=np.array([1.0, -2.0]))  # numpy arrays, as rosbags deserialises them
    assert parse_adapter("load", {"field": "effort", "element": "b"}).read(joints) == -2.0
    assert parse_adapter("load", {"field": "effort", "index": 0}).read(joints) == 1.0


def test_ranger_infinities_read_as_the_messages_limits():
    """REP 117: +inf is 'nothing within max_range', -inf 'closer than min_range'."""
    from sensor_msgs.msg import LaserScan, Range
    from std_msgs.msg import Float32

    mm = parse_adapter("distance", {"field": "range", "scale": 1000.0})
    sonar = {"min_range": 0.02, "max_range": 4.0}
    assert mm.read(Range(range=math.inf, **sonar)) == pytest.approx(4000.0)
    assert mm.read(Range(range=-math.inf, **sonar)) == pytest.approx(20.0)
    assert math.isnan(mm.read(Range(range=math.nan, **sonar)))  # an error stays invalid
    scan = LaserScan(range_min=0.1, range_max=30.0, ranges=[1.0, math.inf, -math.inf])
    assert parse_adapter("distance", {"field": "ranges", "index": 1}).read(scan) == \
        pytest.approx(30.0)
    assert SignalAdapter("ranges.2").read(scan) == pytest.approx(0.1)
    # an infinity in any other field is no ranger reading: still invalid
    assert math.isnan(SignalAdapter("data").read(Float32(data=math.inf)))
    assert math.isnan(SignalAdapter("field_of_view").read(Range(field_of_view=math.inf)))


def test_bad_data_is_nan_never_an_exception():
    from sensor_msgs.msg import JointState

    joints = JointState(name=["a"], effort=[1.0])
    assert math.isnan(parse_adapter("l", {"field": "effort", "element": "zz"}).read(joints))
    assert math.isnan(parse_adapter("l", {"field": "effort", "index": 5}).read(joints))
    assert math.isnan(SignalAdapter("nothing.here").read(joints))
    assert math.isnan(SignalAdapter("header.frame_id").read(joints))  # a string
    assert math.isnan(SignalAdapter("linear_acceleration.x", scale=1e308).read(
        _imu(1e308, 0, 0)))  # overflow to inf
    assert math.isnan(SignalAdapter("linear_acceleration", norm=True).read(object()))
    from std_msgs.msg import Float64MultiArray
    # an empty array is a missing sample, not a norm of 0
    assert math.isnan(SignalAdapter("data", norm=True).read(Float64MultiArray()))
    assert SignalAdapter("data", norm=True).read(Float64MultiArray(data=[3.0, 4.0])) == 5.0


def _joints(**kwargs):
    """A JointState as rosbags deserialises it from a recording (arrays are numpy)."""
    from rosbags.typesys import Stores, get_typestore

    t = get_typestore(Stores.ROS2_KILTED).types
    stamp = t["builtin_interfaces/msg/Time"](sec=0, nanosec=0)
    fields = {"name": ["a", "b", "c", "d"], "position": np.arange(4.0),
              "velocity": np.zeros(4), "effort": np.zeros(0), **kwargs}
    return t["sensor_msgs/msg/JointState"](
        header=t["std_msgs/msg/Header"](stamp=stamp, frame_id=""), **fields)


@pytest.mark.parametrize("raw, why", [
    ({"field": "position", "index": 7}, "index 7 is past the end of position (4 elements)"),
    ({"field": "position", "element": "rotor_9"}, "element 'rotor_9' is missing from name"),
    ({"field": "effort", "element": "c"},
     "element 'c' (position 2 in name) is past the end of effort (0 elements)"),
    ({"field": "position.9"}, "position 9 is past the end of position (4 elements)"),
    ({"field": "positon", "index": 1}, "the message has no field 'positon'"),
    ({"field": "header.stmp.sec"}, "header has no field 'stmp'"),
    ({"field": "header.frame_id"}, "header.frame_id is not a number (str is not a number)"),
    ({"field": "name", "index": 0},
     "the selected element of name is not a number (str is not a number)"),
    ({"field": "header", "index": 0}, "header is std_msgs/msg/Header, not an array"),
    ({"field": "position", "index": 1, "scale": 1e308, "offset": 1e308},
     "the selected element of position is 1, not finite after remove_gravity, scale and "
     "offset"),
    ({"field": "velocity", "norm": True, "element": "b"},
     "the selected element of velocity is not a vector (float64 is not a vector)"),
], ids=["index-past-end", "element-unnamed", "element-past-end", "dotted-past-end",
        "field-typo", "nested-typo", "string", "string-element", "not-an-array",
        "overflow", "norm-of-a-number"])
def test_why_nan_says_which_key_gave_no_number(raw, why):
    """Calibrate said only "no usable sample" for an index past the end of the array or an
    element no message names; the adapter now says why, without ``read`` doing more."""
    adapter = parse_adapter("rotor3", raw)
    msg = _joints()
    assert math.isnan(adapter.read(msg))
    assert adapter.why_nan(msg) == why


def test_why_nan_names_a_sensor_that_sends_nan():
    msg = _joints(position=np.array([0.0, math.nan, math.inf, 1.0]))
    assert SignalAdapter("position.1").why_nan(msg) == "position.1 is nan, not a finite number"
    assert parse_adapter("r", {"field": "position", "element": "c"}).why_nan(msg) == \
        "the selected element of position is inf, not a finite number"


@pytest.mark.parametrize("raw, says", [
    ({"field": "data", "scael": 2.0}, "signals.s: unknown key 'scael' (did you mean 'scale'?)"),
    ({"field": "data", "scale": "2"}, "signals.s.scale must be a finite number, got '2'"),
    ({"field": "data", "scale": 0}, "signals.s.scale must not be 0"),
    ({"field": "data", "offset": float("nan")}, "signals.s.offset must be a finite number"),
    ({"field": "data", "absolute": "yes"}, "signals.s.absolute must be true or false"),
    ({"field": "data", "norm": 1}, "signals.s.norm must be true or false"),
    ({"field": "data", "index": 1.5}, "signals.s.index must be an integer >= 0"),
    ({"field": "data", "index": True}, "signals.s.index must be an integer >= 0"),
    ({"field": "data", "index": -2}, "signals.s.index must be an integer >= 0"),
    ({"field": "data", "element": 3}, "signals.s.element must be an element name"),
    ({"field": "data", "index": 1, "element": "a"}, "signals.s.element: give index or element"),
    ({"field": "data", "name_field": "names"}, "signals.s.name_field is only used with element"),
    ({"field": "data", "remove_gravity": -1.0}, "signals.s.remove_gravity must be in [0, 100]"),
    ({"field": "data", "unit": "m s"}, "signals.s.unit must be a unit name"),
    ({"field": "data", "unit": 5}, "signals.s.unit must be a unit name"),
    ({"scale": 2.0}, "signals.s.field is required"),
    ({"field": "a..b"}, "signals.s.field: field path 'a..b': bad segment ''"),
    ({"field": "position[2]"}, "bad segment 'position[2]' (an element is a segment of its "
     "own: position.2)"),
    ({"field": 3}, "signals.s.field: field path 3 must be a non-empty dotted path"),
])
def test_parse_adapter_is_strict_and_names_the_key(raw, says):
    with pytest.raises(ValueError) as exc:
        parse_adapter("s", raw)
    assert says in str(exc.value)


def test_unset_forms_of_ros_parameters_mean_unset():
    adapter = parse_adapter("s", {"field": "data", "index": -1, "element": "", "unit": "",
                                  "name_field": "name", "remove_gravity": False})
    assert adapter == SignalAdapter("data") and adapter.is_plain
    assert SIGNAL_ENTRY_KEYS == ADAPTER_KEYS | {"topic", "type", "absent"}
    assert set(SIGNAL_MAP_KEYS) == SIGNAL_ENTRY_KEYS


@pytest.mark.parametrize("msg_type, raw, key, says", [
    ("sensor_msgs/msg/Imu", {"field": "linear_acceleration"}, "field", "not a number"),
    ("sensor_msgs/msg/Imu", {"field": "linear_acceleration.x", "norm": True}, "norm",
     "not a vector"),
    ("sensor_msgs/msg/Imu", {"field": "header", "index": 0}, "index", "not an array"),
    ("sensor_msgs/msg/JointState", {"field": "effort"}, "field", "not a number"),
    ("sensor_msgs/msg/JointState", {"field": "effort", "element": "j",
                                    "name_field": "position"}, "name_field",
     "not an array of names"),
    ("sensor_msgs/msg/JointState", {"field": "effort", "index": 0, "norm": True}, "norm",
     "not vectors"),
    ("sensor_msgs/msg/JointState", {"field": "efort", "index": 0}, "field", "no field 'efort'"),
])
def test_adapters_are_checked_against_the_message_type(msg_type, raw, key, says):
    with pytest.raises(ValueError) as exc:
        check_adapter(msg_type, parse_adapter("s", raw))
    assert exc.value.key == key and says in str(exc.value)
    source = SignalSource("t", msg_type, raw["field"], parse_adapter("s", raw))
    with pytest.raises(ValueError, match=re.escape(f"signals.motion.{key}:")):
        NodeConfig(signal_map={"motion": source})


def test_from_parameters_builds_adapters_and_keeps_plain_maps_plain():
    values = {"signals.vibration.topic": "imu/data",
              "signals.vibration.type": "sensor_msgs/msg/Imu",
              "signals.vibration.field": "linear_acceleration",
              "signals.vibration.norm": True, "signals.vibration.remove_gravity": True,
              "signals.vibration.scale": 2,  # an int is a number too (dynamic typing)
              "signals.vibration.unit": "m/s^2", "signals.visibility.absent": True,
              "signals.visibility.type": "camera_msgs/msg/NotInstalled"}
    config = NodeConfig.from_parameters(values, SIGNALS)
    vib = config.signal_map["vibration"]
    assert vib.adapter == SignalAdapter("linear_acceleration", norm=True, scale=2.0,
                                        remove_gravity=STANDARD_GRAVITY, unit="m/s^2")
    assert config.signal_map["load"].adapter is None  # nothing set: read as before
    assert config.absent_signals == ("visibility",)  # its type need not be installed
    with pytest.raises(ValueError, match=re.escape("signals.vibration.scale must be a finite "
                                                   "number, got 'x'")):
        NodeConfig.from_parameters({**values, "signals.vibration.scale": "x"}, SIGNALS)
    with pytest.raises(ValueError, match="signals.visibility.absent must be true or false"):
        NodeConfig.from_parameters({**values, "signals.visibility.absent": "yes"}, SIGNALS)


def test_absent_signals_free_their_topic_but_not_all_may_be_absent():
    entry = {"topic": "sensors/motion", "absent": True}
    motion = source_from_entry("load", entry)  # same topic as motion's, but never read
    NodeConfig(signal_map={"motion": source_from_entry("motion", {}), "load": motion})
    with pytest.raises(ValueError, match="every signal .* is declared absent"):
        NodeConfig(signal_map={"load": motion})
    with pytest.raises(ValueError, match="signals.load: unknown key 'topc'"):
        source_from_entry("load", {"topc": "x"})


def test_params_file_names_are_checked_for_adapter_keys():
    names = ["signals.vibration.scale", "signals.vibration.remove_gravity",
             "signals.load.absent", "signals.vibration.scael", "signals.vibrations.scale"]
    errors = unknown_parameters(names, SIGNALS)
    assert len(errors) == 2
    assert "unknown key 'scael'" in errors[0] and "did you mean 'scale'" in errors[0]
    assert "unknown signal 'vibrations'" in errors[1]


# ---------------------------------------------------------------------- the documentation

def _doc_blocks() -> list[dict]:
    text = (REPO / "docs" / "adapters.md").read_text(encoding="utf-8")
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def test_every_documented_example_validates():
    blocks = _doc_blocks()
    types = set()
    for block in blocks:
        assert set(block) == {"signals"}, block
        signal_map = {}
        for name, entry in block["signals"].items():
            assert name in SIGNALS, name
            signal_map[name] = source_from_entry(name, entry)
            if not signal_map[name].absent:
                types.add(signal_map[name].msg_type)
        if any(not s.absent for s in signal_map.values()):
            NodeConfig(signal_map=signal_map)  # the node's own validation, message types too
    assert {"sensor_msgs/msg/Imu", "nav_msgs/msg/Odometry", "sensor_msgs/msg/JointState",
            "sensor_msgs/msg/BatteryState", "sensor_msgs/msg/Range",
            "sensor_msgs/msg/Temperature"} <= types


def test_the_documented_imu_example_reads_zero_at_rest():
    imu = next(b for b in _doc_blocks() if "vibration" in b["signals"])["signals"]["vibration"]
    adapter = source_from_entry("vibration", imu).reader()
    assert adapter.read(_imu(0.0, 0.0, 9.80665)) == pytest.approx(0.0, abs=1e-9)
    assert adapter.read(_imu(0.0, 0.0, 8.80665)) == pytest.approx(1.0)


# ------------------------------------------------------------------ the node as a process

def _params(tmp_path: Path, signals: dict) -> Path:
    path = tmp_path / "robot.yaml"
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": {"signals": signals}}}))
    return path


@pytest.mark.ros
@pytest.mark.parametrize("signals, says", [
    ({"vibration": {"topic": "imu", "type": "sensor_msgs/msg/Imu",
                    "field": "linear_acceleration", "norm": True, "scale": "2"}},
     "signals.vibration.scale must be a finite number, got '2'"),
    ({"motion": {"topic": "odom", "type": "nav_msgs/msg/Odometry",
                 "field": "twist.twist.linear.x", "norm": True}},
     "signals.motion.norm: field 'twist.twist.linear.x' of nav_msgs/msg/Odometry is double"),
    ({"vibration": {"field": "data", "scael": 2.0}}, "unknown key 'scael'"),
    ({"vibrations": {"field": "data"}}, "unknown signal 'vibrations'"),
], ids=["type", "norm-of-number", "unknown-key", "unknown-signal"])
def test_the_node_refuses_a_bad_adapter_with_one_line_and_exit_2(
        signals, says, tmp_path, ros_env, source_bundle):
    cmd = [sys.executable, "-m", "thinkmem_ros.robot.node", "--ros-args", "--params-file",
           str(_params(tmp_path, signals)), "-p", f"bundle_path:={source_bundle}"]
    done = subprocess.run(cmd, cwd=REPO, env=ros_env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to start" in lines[0] and says in lines[0], lines


def test_the_shipped_wheeled_robot_example_is_valid():
    from thinkmem_ros.robot.node_config import read_params_file

    path = REPO / "config" / "wheeled_robot.yaml"
    params = read_params_file(path)
    assert unknown_parameters(params, SIGNALS) == []
    data = yaml.safe_load(path.read_text())["/**"]["ros__parameters"]
    signal_map = {name: source_from_entry(name, entry)
                  for name, entry in data["signals"].items()}
    config = NodeConfig(signal_map=signal_map)
    assert set(config.absent_signals) == set(SIGNALS) - {"motion", "vibration"}
    assert config.signal_map["motion"].msg_type == "nav_msgs/msg/Odometry"


@pytest.mark.ros
def test_the_node_starts_with_the_wheeled_robot_example(tmp_path, ros_env, source_bundle):
    import signal as signals

    cmd = [sys.executable, "-m", "thinkmem_ros.robot.node", "--ros-args", "--params-file",
           str(REPO / "config" / "wheeled_robot.yaml"), "-p", f"bundle_path:={source_bundle}"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=ros_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "ready:" in line:
                proc.send_signal(signals.SIGINT)
                break
        # what it printed while stopping too: a native crash leaves faulthandler's stacks
        rest, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, "".join(lines) + (rest or "")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    assert any("ready:" in line for line in lines) and "Traceback" not in "".join(lines)
