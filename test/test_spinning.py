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


@pytest.mark.parametrize("kind", ["events", "single"])
def test_a_signal_ends_the_spin_and_leaves_the_context_to_the_caller(kind, ros_env):
    # The node's own stop path: SIGINT is only recorded, spinning ends at the next slice
    # and the context is still valid, so the executor can let go of the node before rclpy
    # shuts down (rclpy's handlers shut it down under a running executor).
    import os
    import signal

    from thinkmem_ros.robot.spinning import StopSignals

    context = rclpy.Context()
    rclpy.init(context=context, signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    node = rclpy.create_node(f"stop_{kind}", context=context)
    ticks = []

    def tick():
        ticks.append(1)
        if len(ticks) == 5:
            os.kill(os.getpid(), signal.SIGINT)

    node.create_timer(0.01, tick)
    executor, made = make_executor(kind, context=context)
    executor.add_node(node)
    try:
        with StopSignals() as stop:
            started = time.monotonic()
            spin(executor, made, context, stop=stop)
            took = time.monotonic() - started
        assert stop.signum == signal.SIGINT and context.ok()
        assert len(ticks) >= 5 and took < 10.0
    finally:
        executor.remove_node(node)
        executor.shutdown()
        node.destroy_node()
        rclpy.shutdown(context=context)


def test_a_second_signal_interrupts_only_a_start_up():
    import os
    import signal

    from thinkmem_ros.robot.spinning import StopSignals

    before = signal.getsignal(signal.SIGINT)  # another library's, in a full run
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # the handler runs between bytecodes of this thread
        assert stop.requested and stop.signum == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
        stop.spinning = True
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        assert stop.signum == signal.SIGTERM  # the first request is the one reported
    assert signal.getsignal(signal.SIGINT) is before
