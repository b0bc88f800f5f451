"""``thinkmem calibrate`` judges header stamps as the node's situation buffer will.

It read receive times only: a bag whose sensor clock ran ten minutes ahead, or a driver
stamping at 1 s resolution, calibrated with ``0 warning(s)`` while the node playing it
refused every sample as future (or 95 % as duplicates). Each bag here is written with
rosbags' own writer; nothing is mocked.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from thinkmem_ros.commands import calibrate as command
from thinkmem_ros.policy.bundle import BundleManifest, write_bundle

START_NS = 1_600_000_000 * 10**9
SECONDS = 10
IMU_HZ, ODOM_HZ = 30, 10
STORE = get_typestore(Stores.ROS2_HUMBLE)
T = STORE.types


def _header(stamp_ns: int):
    return T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](
        sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9), frame_id="base")


def _imu(stamp_ns: int):
    v3, q = T["geometry_msgs/msg/Vector3"], T["geometry_msgs/msg/Quaternion"]
    return T["sensor_msgs/msg/Imu"](
        header=_header(stamp_ns), orientation=q(x=0.0, y=0.0, z=0.0, w=1.0),
        orientation_covariance=np.zeros(9), angular_velocity=v3(x=0.0, y=0.0, z=0.1),
        angular_velocity_covariance=np.zeros(9),
        linear_acceleration=v3(x=0.3, y=0.0, z=9.81),
        linear_acceleration_covariance=np.zeros(9))


def _odom(stamp_ns: int):
    v3, q = T["geometry_msgs/msg/Vector3"], T["geometry_msgs/msg/Quaternion"]
    pose = T["geometry_msgs/msg/Pose"](position=T["geometry_msgs/msg/Point"](
        x=0.0, y=0.0, z=0.0), orientation=q(x=0.0, y=0.0, z=0.0, w=1.0))
    twist = T["geometry_msgs/msg/Twist"](linear=v3(x=1.0, y=0.0, z=0.0),
                                         angular=v3(x=0.0, y=0.0, z=0.1))
    return T["nav_msgs/msg/Odometry"](
        header=_header(stamp_ns), child_frame_id="base_link",
        pose=T["geometry_msgs/msg/PoseWithCovariance"](pose=pose, covariance=np.zeros(36)),
        twist=T["geometry_msgs/msg/TwistWithCovariance"](twist=twist,
                                                         covariance=np.zeros(36)))


def _bag(folder: Path, stamp_of) -> Path:
    """IMU at 30 Hz and odometry at 10 Hz for 10 s; header stamp = ``stamp_of(receive)``."""
    writer = Writer(folder, version=9, storage_plugin=StoragePlugin.MCAP)
    writer.open()
    imu = writer.add_connection("/imu/data", "sensor_msgs/msg/Imu", typestore=STORE)
    odom = writer.add_connection("/odom", "nav_msgs/msg/Odometry", typestore=STORE)
    for k in range(SECONDS * IMU_HZ):
        t = START_NS + k * 10**9 // IMU_HZ
        writer.write(imu, t, STORE.serialize_cdr(_imu(stamp_of(t)), "sensor_msgs/msg/Imu"))
        if k % (IMU_HZ // ODOM_HZ) == 0:
            writer.write(odom, t, STORE.serialize_cdr(_odom(stamp_of(t)),
                                                      "nav_msgs/msg/Odometry"))
    writer.close()
    return folder


def _params(folder: Path, **extra) -> Path:
    signals = {
        "speed": {"topic": "/odom", "type": "nav_msgs/msg/Odometry",
                  "field": "twist.twist.linear.x", "unit": "m/s"},
        "vibration": {"topic": "/imu/data", "type": "sensor_msgs/msg/Imu",
                      "field": "linear_acceleration", "norm": True, "remove_gravity": True,
                      "absolute": True, "unit": "m/s^2"}}
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": {
        "frame_rate_hz": 10.0, "stale_after_s": 0.5, **extra, "signals": signals}}}))
    return path


def _bundle(folder: Path) -> Path:
    write_bundle(folder, b"not-read-by-calibrate", BundleManifest(
        model_version=1, sha256="", labels=["moving"], signals=["speed", "vibration"],
        window=8, frame_rate_hz=10.0, normalisation={"mean": [0.0, 0.0], "std": [1.0, 1.0]},
        thresholds={"moving": 0.5}, signal_units={"speed": "m/s", "vibration": "m/s^2"},
        signal_ranges={"speed": [0.0, 2.0], "vibration": [0.0, 1.5]}))
    return folder


def _main(tmp_path: Path, bag: Path, params: Path, capsys) -> tuple[int, str]:
    args = argparse.Namespace(bag=str(bag), params=str(params),
                              bundle=str(_bundle(tmp_path / "bundle")), json=None)
    code = command.main(args)
    return code, capsys.readouterr().out


def test_stamps_equal_to_receive_times_give_no_warning(tmp_path, capsys):
    bag = _bag(tmp_path / "clean", lambda t: t)
    code, out = _main(tmp_path, bag, _params(tmp_path), capsys)
    assert code == 0
    assert "0 warning(s)" in out, out


def test_stamps_ten_minutes_ahead_are_refused_as_future(tmp_path, capsys):
    """The node refused all 400 samples as future ('samples: 0'); calibrate said nothing."""
    bag = _bag(tmp_path / "future", lambda t: t + 600 * 10**9)
    code, out = _main(tmp_path, bag, _params(tmp_path), capsys)
    assert code == 0  # warnings are printed, as for every other finding
    assert ("WARN speed: 100 of 100 samples stamped 600.0 s ahead of the recording's clock "
            "(median); the node will refuse them as future (future_stamp_tolerance_s 1)"
            in out), out
    assert "WARN vibration: 300 of 300 samples stamped 600.0 s ahead" in out, out
    assert "2 warning(s)" in out, out


def test_stamps_at_one_second_resolution_are_refused_as_duplicates(tmp_path, capsys):
    """Only the first sample of each second has a new stamp: 10 of 100, 10 of 300 pass."""
    bag = _bag(tmp_path / "coarse", lambda t: t - t % 10**9)
    code, out = _main(tmp_path, bag, _params(tmp_path), capsys)
    assert code == 0
    assert ("WARN speed: 90 of 100 samples share a header stamp with the sample before; the "
            "node counts them as duplicates" in out), out
    assert "WARN vibration: 290 of 300 samples share a header stamp" in out, out
    assert "2 warning(s)" in out, out


def test_stamps_running_backwards_are_refused_as_out_of_order(tmp_path):
    bag = _bag(tmp_path / "back", lambda t: 2 * START_NS - t)
    report = command.calibrate(bag, _params(tmp_path), _bundle(tmp_path / "bundle"))
    assert report["signals"]["speed"]["refused_by_stamp"] == {
        "future": 0, "duplicate": 0, "out_of_order": 99}
    assert any(w.startswith("speed: 99 of 100 samples are stamped before the newest "
                            "accepted one; the node refuses them as out of order")
               for w in report["warnings"]), report["warnings"]


def test_the_params_files_future_tolerance_is_the_one_judged_by(tmp_path):
    """0.8 s ahead passes the node's default 1 s; with 0.5 s in the params file it does not."""
    bag = _bag(tmp_path / "ahead", lambda t: t + 800_000_000)
    bundle = _bundle(tmp_path / "bundle")
    assert command.calibrate(bag, _params(tmp_path), bundle)["warnings"] == []
    strict = _params(tmp_path, future_stamp_tolerance_s=0.5)
    warnings = command.calibrate(bag, strict, bundle)["warnings"]
    assert len(warnings) == 2, warnings
    assert warnings[0] == ("speed: 100 of 100 samples stamped 0.8 s ahead of the recording's "
                           "clock (median); the node will refuse them as future "
                           "(future_stamp_tolerance_s 0.5)")


@pytest.mark.parametrize("value", ["soon", 0.0, math.inf, True])
def test_a_future_tolerance_the_node_refuses_is_refused(tmp_path, capsys, value):
    bag = _bag(tmp_path / "clean", lambda t: t)
    code = command.main(argparse.Namespace(
        bag=str(bag), params=str(_params(tmp_path, future_stamp_tolerance_s=value)),
        bundle=str(_bundle(tmp_path / "bundle")), json=None))
    assert code == 2
    assert "future_stamp_tolerance_s must be " in capsys.readouterr().err  # a number, in range
