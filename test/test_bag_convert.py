"""Real robots' recordings: ROS 1 bags (info, convert, direct play) and types not installed.

The ROS 1 bag is written in the test by ``rosbags.rosbag1.Writer`` (the real format, with
message definitions inside), converted by ``thinkmem bag convert`` and played by the real
player into real subscribers; one topic carries a vendor type no package here provides.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_checks import unprivileged
from conftest import spinning_node

from thinkmem_ros.playback.bag_files import (
    BagError,
    BagStream,
    bag_info,
    convert_ros1,
    is_ros1_bag,
    read_bag,
)

ROOT = Path(__file__).resolve().parent.parent
DOMAIN = str(random.randint(1, 200))
IMU_N = 30  # 1 s at 30 Hz
START_NS = 1_420_000_000 * 10**9  # a 2015 recording
GAUGE_TYPE = "vendor_msgs/msg/Gauge"


def _env() -> dict[str, str]:
    return dict(os.environ, ROS_DOMAIN_ID=DOMAIN, ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
                PYTHONPATH=str(ROOT))


def write_ros1_bag(path: Path) -> Path:
    """Imu at 30 Hz, Odometry at 10 Hz and a vendor Gauge type, as a ROS 1 driver records."""
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    store.register(get_types_from_msg("float64 level\nstring note", GAUGE_TYPE))
    t = store.types
    time_cls, header_cls = t["builtin_interfaces/msg/Time"], t["std_msgs/msg/Header"]
    vec, quat = t["geometry_msgs/msg/Vector3"], t["geometry_msgs/msg/Quaternion"]

    def header(i: int, stamp_ns: int, frame: str):
        return header_cls(seq=i, stamp=time_cls(sec=stamp_ns // 10**9,
                                                nanosec=stamp_ns % 10**9), frame_id=frame)

    with Writer(path) as writer:
        imu = writer.add_connection("/imu/data", "sensor_msgs/msg/Imu", typestore=store)
        odom = writer.add_connection("/odom", "nav_msgs/msg/Odometry", typestore=store)
        gauge = writer.add_connection("/gauge", GAUGE_TYPE, typestore=store)
        for i in range(IMU_N):
            stamp = START_NS + round(i * 1e9 / 30)
            msg = t["sensor_msgs/msg/Imu"](
                header=header(i, stamp, "imu"), orientation=quat(0.0, 0.0, 0.0, 1.0),
                orientation_covariance=np.zeros(9), angular_velocity=vec(0.0, 0.0, 0.1),
                angular_velocity_covariance=np.zeros(9),
                linear_acceleration=vec(0.1 * i, 0.0, 9.81),
                linear_acceleration_covariance=np.zeros(9))
            writer.write(imu, stamp, store.serialize_ros1(msg, "sensor_msgs/msg/Imu"))
            if i % 3 == 0:
                pose = t["geometry_msgs/msg/PoseWithCovariance"](
                    pose=t["geometry_msgs/msg/Pose"](
                        position=t["geometry_msgs/msg/Point"](float(i), 0.0, 0.0),
                        orientation=quat(0.0, 0.0, 0.0, 1.0)), covariance=np.zeros(36))
                twist = t["geometry_msgs/msg/TwistWithCovariance"](
                    twist=t["geometry_msgs/msg/Twist"](linear=vec(-0.5, 0.0, 0.0),
                                                       angular=vec(0.0, 0.0, 0.0)),
                    covariance=np.zeros(36))
                msg = t["nav_msgs/msg/Odometry"](header=header(i, stamp, "odom"),
                                                 child_frame_id="base", pose=pose, twist=twist)
                writer.write(odom, stamp, store.serialize_ros1(msg, "nav_msgs/msg/Odometry"))
                writer.write(gauge, stamp, store.serialize_ros1(
                    t[GAUGE_TYPE](level=float(i), note="ok"), GAUGE_TYPE))
    return path


@pytest.fixture(scope="module")
def ros1_bag(tmp_path_factory) -> Path:
    return write_ros1_bag(tmp_path_factory.mktemp("ros1") / "drive.bag")


def _cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "thinkmem_ros.cli", "bag", *args],
                          env=_env(), capture_output=True, text=True, timeout=timeout)


def test_ros1_bag_info_is_read_directly(ros1_bag):
    assert is_ros1_bag(ros1_bag) and not is_ros1_bag(ros1_bag.parent)
    info = bag_info(ros1_bag)
    assert info.storage == "rosbag1"
    assert info.topics == {"/imu/data": ("sensor_msgs/msg/Imu", IMU_N),
                           "/odom": ("nav_msgs/msg/Odometry", 10),
                           "/gauge": (GAUGE_TYPE, 10)}
    assert info.start_ns == START_NS
    assert info.duration_s == pytest.approx((IMU_N - 1) / 30, abs=1e-6)
    done = _cli("info", str(ros1_bag))
    assert done.returncode == 0 and "rosbag1" in done.stdout and "/odom" in done.stdout


def test_convert_writes_a_rosbag2_that_rclpy_decodes(ros1_bag, tmp_path):
    from nav_msgs.msg import Odometry
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import Imu

    done = _cli("convert", str(ros1_bag), str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    info, messages = read_bag(tmp_path / "out")
    assert info.storage == "mcap" and info.message_count == IMU_N + 20
    imus = [deserialize_message(m.data, Imu) for m in messages if m.topic == "/imu/data"]
    assert [m.linear_acceleration.x for m in imus] == pytest.approx(
        [0.1 * i for i in range(IMU_N)])
    assert imus[3].header.stamp.sec == START_NS // 10**9 and imus[3].header.frame_id == "imu"
    odoms = [deserialize_message(m.data, Odometry) for m in messages if m.topic == "/odom"]
    assert [o.pose.pose.position.x for o in odoms] == pytest.approx(range(0, IMU_N, 3))
    assert odoms[0].twist.twist.linear.x == -0.5 and odoms[0].child_frame_id == "base"
    with pytest.raises(BagError, match="already exists"):
        convert_ros1(ros1_bag, tmp_path / "out")
    assert convert_ros1(ros1_bag, tmp_path / "out", storage="sqlite3",
                        overwrite=True).storage == "sqlite3"
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("x")
    with pytest.raises(BagError, match="not a rosbag2 folder"):
        convert_ros1(ros1_bag, tmp_path / "notes", overwrite=True)
    assert (tmp_path / "notes" / "keep.txt").exists()


@pytest.mark.parametrize("make_args, message", [
    (lambda bag, tmp: ["convert", str(tmp / "nope.bag"), str(tmp / "o")], "bag not found"),
    (lambda bag, tmp: ["convert", str(tmp), str(tmp / "o")], "not a ROS 1 bag file"),
    (lambda bag, tmp: ["convert", str(bag), str(tmp / "o.bag")], "must be a folder name"),
    (lambda bag, tmp: ["convert", str(bag), str(tmp / "o"), "--storage", "zip"], "--storage"),
], ids=["missing", "not-ros1", "bag-output", "storage"])
def test_bad_convert_input_is_one_line(ros1_bag, tmp_path, make_args, message):
    done = _cli(*make_args(ros1_bag, tmp_path))
    assert done.returncode != 0 and message in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 3


def test_rosbag2_readers_point_a_ros1_bag_to_convert(ros1_bag, tmp_path):
    with pytest.raises(BagError, match="thinkmem bag convert"):
        BagStream(ros1_bag)
    truncated = tmp_path / "broken.bag"
    truncated.write_bytes(ros1_bag.read_bytes()[:200])
    done = _cli("info", str(truncated))
    assert done.returncode == 1 and "cannot open ROS 1 bag" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_ros1_bag_check_that_cannot_read_the_file_says_why():
    """/proc/self/mem is a regular file whose first read fails (EIO), as root or not."""
    with pytest.raises(BagError, match="cannot read /proc/self/mem: Input/output error"):
        is_ros1_bag("/proc/self/mem")




REAL = ROOT / "test" / "data" / "real"


@pytest.mark.parametrize("argv", [
    ["bag", "info", "BAG"], ["bag", "convert", "BAG", "OUT"], ["bag", "play", "BAG"],
    ["calibrate", "BAG", "--params", "PARAMS"],
    ["train", "--bag", "BAG", "--params", "PARAMS", "--labels", "RULES", "--out", "OUT"],
], ids=["info", "convert", "play", "calibrate", "train"])
def test_an_unreadable_ros1_bag_is_named_unreadable_not_no_bag(tmp_path, argv):
    """A chmod 000 ROS 1 bag read as "no '#ROSBAG V2.0' header" or "not a bag"."""
    bag = tmp_path / "h.bag"
    shutil.copyfile(REAL / "husky_outdoor.bag", bag)
    names = {"BAG": bag, "OUT": tmp_path / "out", "PARAMS": REAL / "husky_params.yaml",
             "RULES": REAL / "husky_rules.yaml"}
    bag.chmod(0)
    done = subprocess.run([*unprivileged(), sys.executable, "-m", "thinkmem_ros.cli",
                           *[str(names.get(a, a)) for a in argv]], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"cannot read {bag}: Permission denied" in done.stderr, done.stderr


# ------------------------------------------------------------------- playing it for real

@pytest.fixture(scope="module")
def listener():
    with spinning_node("ros1_play_test", DOMAIN) as node:
        yield node


@pytest.mark.ros
def test_unknown_type_refused_naming_it_and_the_flag(ros1_bag):
    done = _cli("play", str(ros1_bag))
    assert done.returncode == 1
    assert GAUGE_TYPE in done.stderr and "--skip-unknown" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.ros
def test_ros1_bag_plays_directly_skipping_the_unknown_type(ros1_bag, listener):
    from nav_msgs.msg import Odometry
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Imu

    qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
    got: dict[str, list] = {"/imu/data": [], "/odom": []}
    subs = [listener.create_subscription(Imu, "/imu/data", got["/imu/data"].append, qos),
            listener.create_subscription(Odometry, "/odom", got["/odom"].append, qos)]
    try:
        done = _cli("play", str(ros1_bag), "--skip-unknown", "--wait-for-subscribers", "30",
                    "--delay", "0.3")
        time.sleep(0.3)
    finally:
        for sub in subs:
            listener.destroy_subscription(sub)
    assert done.returncode == 0, done.stderr
    assert "/gauge" in done.stderr and GAUGE_TYPE in done.stderr  # the warning names it
    assert f"published {IMU_N + 10} messages" in done.stdout
    assert [m.linear_acceleration.x for m in got["/imu/data"]] == pytest.approx(
        [0.1 * i for i in range(IMU_N)])
    assert len(got["/odom"]) == 10 and got["/odom"][-1].pose.pose.position.x == 27.0
