"""High-rate sensors: one executor wake-up handles every sample a topic has queued.

rclpy's executor hands a subscription callback one message per wake-up and rebuilds its
whole wait set in Python before the next; at 1 kHz sensors that bookkeeping cost more than
the samples and the reader queues overflowed. The node drains a topic's queue inside the
callback (up to ``DRAIN_MAX``) unless the frame timer is due. Real DDS, real node.
"""

from __future__ import annotations

import time

import pytest
from conftest import stop_ros

rclpy = pytest.importorskip("rclpy")

from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import qos_profile_sensor_data  # noqa: E402
from std_msgs.msg import Float32  # noqa: E402

from thinkmem_ros.robot.node import DRAIN_MAX, ThinkingNode  # noqa: E402

pytestmark = pytest.mark.ros
QUEUED = 30


@pytest.fixture
def queued_node(ros_env, source_bundle):
    """A node (not spinning) with QUEUED motion samples waiting in its reader queue."""
    context = rclpy.Context()
    rclpy.init(context=context)
    node = ThinkingNode(context=context, parameter_overrides=[
        Parameter("bundle_path", value=str(source_bundle)),
        Parameter("frame_rate_hz", value=20.0), Parameter("qos_depth", value=100)])
    helper = rclpy.create_node("burst_publisher", context=context)
    pub = helper.create_publisher(Float32, "/sensors/motion", qos_profile_sensor_data)
    deadline = time.monotonic() + 10.0
    while pub.get_subscription_count() < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    try:
        yield node, pub, executor, helper
    finally:
        stop_ros(executor, None, (node, helper), context, timeout=1.0)


def _accepted(node: ThinkingNode) -> int:
    return sum(node.buffer.snapshot().accepted.values())


def _first_handling(node: ThinkingNode, executor, before: int) -> int:
    """Spin one callback at a time until samples were handled; how many that callback took."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.2)
        now = _accepted(node)
        if now != before:
            return now - before
    raise AssertionError("no queued sample was handled within 10 s")


def _queue(pub, count: int) -> None:
    for i in range(count):
        pub.publish(Float32(data=float(i)))
    time.sleep(1.0)  # delivered into the node's reader queue (nothing spins meanwhile)


def test_one_wake_up_handles_every_queued_sample(queued_node):
    node, pub, executor, _ = queued_node
    node._frame_timer.cancel()  # no frame is ever due: nothing cuts the drain short
    _queue(pub, QUEUED)
    assert QUEUED <= DRAIN_MAX
    assert _first_handling(node, executor, _accepted(node)) == QUEUED
    assert node._stats.input_errors == 0


def test_a_due_frame_cuts_the_drain_short(queued_node):
    node, pub, executor, helper = queued_node
    # a real timer the executor never runs stands in for a frame timer that is overdue
    overdue = helper.create_timer(0.01, lambda: None)
    node._frame_timer.cancel()
    node._frame_timer = overdue
    _queue(pub, QUEUED)
    assert overdue.time_until_next_call() <= 0
    handled = _first_handling(node, executor, _accepted(node))
    assert handled == 1, "with the frame due, the callback returns after its own message"


def test_without_draining_a_callback_handles_its_own_message_only(queued_node):
    """Under the events executor ``main`` turns the drain off (each message is dispatched
    from C++ anyway); then one callback is one sample."""
    node, pub, executor, _ = queued_node
    node._frame_timer.cancel()
    node.drain_queued = False
    _queue(pub, QUEUED)
    assert _first_handling(node, executor, _accepted(node)) == 1
