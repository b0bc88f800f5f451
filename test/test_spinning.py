"""The node's executor choice: the events executor runs timers and subscriptions and ends
when its context shuts down; 'single' and the fallback give rclpy's SingleThreadedExecutor."""

from __future__ import annotations

import sys
import threading
import time

import pytest

rclpy = pytest.importorskip("rclpy")

from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor  # noqa: E402
from std_msgs.msg import Float32  # noqa: E402

from thinkmem_ros.robot.spinning import make_executor, spin  # noqa: E402

pytestmark = pytest.mark.ros


@pytest.mark.parametrize("kind", ["events", "single"])
def test_spin_runs_timers_and_subscriptions_until_shutdown(kind, ros_env):
    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node(f"spin_{kind}", context=context)
    ticks, samples = [], []
    node.create_timer(0.01, lambda: ticks.append(1))
    node.create_subscription(Float32, "spin_probe", samples.append, 10)
    pub = node.create_publisher(Float32, "spin_probe", 10)
    executor, made = make_executor(kind, context=context)
    assert made == kind
    executor.add_node(node)
    errors = []

    def run():
        try:
            spin(executor, made, context)
        except ExternalShutdownException:
            pass  # how both executors may end when the context shuts down
        except Exception as exc:  # noqa: BLE001 - anything else is a failure
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 5.0
        while (len(ticks) < 20 or not samples) and time.monotonic() < deadline:
            pub.publish(Float32(data=1.0))
            time.sleep(0.02)
        assert len(ticks) >= 20 and samples, (len(ticks), len(samples))
    finally:
        rclpy.shutdown(context=context)
        thread.join(timeout=5.0)
    assert not thread.is_alive(), "spin did not end when the context shut down"
    assert not errors, errors
    executor.remove_node(node)
    node.destroy_node()


def test_events_falls_back_to_single_where_rclpy_has_none(monkeypatch):
    # A fault the installed rclpy cannot produce (it has the events executor): hide the
    # module so the import fails as it does on distributions older than Kilted.
    monkeypatch.setitem(sys.modules, "rclpy.experimental", None)
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        executor, made = make_executor("events", context=context)
        assert made == "single" and isinstance(executor, SingleThreadedExecutor)
        executor.shutdown()
    finally:
        rclpy.shutdown(context=context)


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="executor must be"):
        make_executor("multi")
