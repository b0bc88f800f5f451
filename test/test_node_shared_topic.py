"""Two signals read from one topic, over real DDS: one subscription, both numbers taken.

A robot's odometry carries speed and yaw rate, its IMU several numbers; the node used to
refuse a parameter file that read two signals from one topic ("each signal needs its own
topic"), so a real recording needed a hand-written republisher. Here ``current`` and
``vibration`` of the default bundle both come from one ``sensor_msgs/msg/Imu`` topic.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from conftest import SpinningPair, copy_bundle

rclpy = pytest.importorskip("rclpy")

from geometry_msgs.msg import Vector3  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Imu  # noqa: E402

from thinkmem_ros.robot.node import ThinkingNode  # noqa: E402

pytestmark = pytest.mark.ros
TOPIC = "/sensors/imu"
SHARED = {"current": "linear_acceleration.x", "vibration": "angular_velocity.z"}


class SharedTopic(SpinningPair):
    """The node with two signals on one Imu topic, fed by a helper node."""

    def __init__(self, bundle) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        params = [Parameter("bundle_path", value=str(bundle)),
                  Parameter("frame_rate_hz", value=20.0),
                  Parameter("stale_after_s", value=0.3)]
        for name, field in SHARED.items():
            params += [Parameter(f"signals.{name}.topic", value=TOPIC),
                       Parameter(f"signals.{name}.type", value="sensor_msgs/msg/Imu"),
                       Parameter(f"signals.{name}.field", value=field)]
        self.node = ThinkingNode(context=self.context, parameter_overrides=params)
        self.helper = rclpy.create_node("imu_feeder", context=self.context)
        self.pub = self.helper.create_publisher(Imu, TOPIC, 10)
        self.values = {"linear_acceleration.x": 2.0, "angular_velocity.z": 0.5}
        self.lock = threading.Lock()
        self.frames = []
        self.node.frame_listeners.append(self._on_frame)
        self.start_spinning()

    def _on_frame(self, result) -> None:
        with self.lock:
            self.frames.append(result)

    def _feed(self) -> None:
        while not self.stop.wait(1.0 / 40.0):
            msg = Imu()
            msg.header.stamp = self.helper.get_clock().now().to_msg()
            msg.linear_acceleration = Vector3(x=self.values["linear_acceleration.x"])
            msg.angular_velocity = Vector3(z=self.values["angular_velocity.z"])
            self.pub.publish(msg)

    def newest_rows(self, after: int, timeout: float = 8.0) -> list[np.ndarray]:
        """Last rows of the frames built after the first ``after``, once 5 are in."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                frames = self.frames[after:]
            if len(frames) >= 5:
                return [(f.signals[-1], f.mask[-1], f.stale) for f in frames[-3:]]
            time.sleep(0.05)
        pytest.fail(f"fewer than 5 frames in {timeout} s")

    def frame_count(self) -> int:
        with self.lock:
            return len(self.frames)


def test_two_signals_on_one_topic_are_both_read_from_each_message(ros_env, source_bundle,
                                                                  tmp_path):
    harness = SharedTopic(copy_bundle(source_bundle, tmp_path / "live"))
    try:
        signals = harness.node._slot.peek().signals
        cur, vib = signals.index("current"), signals.index("vibration")
        assert [s.topic_name for s in harness.node._subs].count(TOPIC) == 1
        before = harness.newest_rows(0)
        for _, mask, stale in before:
            assert mask[cur] == 1 and mask[vib] == 1, mask
            assert "current" not in stale and "vibration" not in stale, stale
        # only the field behind "current" changes: only its column moves
        harness.values["linear_acceleration.x"] = 9.0
        time.sleep(0.5)
        after = harness.newest_rows(harness.frame_count())
        assert all(row[cur] != before[-1][0][cur] for row, _, _ in after), (before, after)
        assert all(row[vib] == before[-1][0][vib] for row, _, _ in after), (before, after)
    finally:
        harness.close()
