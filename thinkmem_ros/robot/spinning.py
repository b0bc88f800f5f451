"""Which rclpy executor runs the thinking node, and how it spins.

rclpy's ``SingleThreadedExecutor`` rebuilds its wait set in Python on every wake-up (every
subscription, timer, service and event handler of the node); with seven sensors at
100 Hz that bookkeeping costs more CPU than the policy. rclpy's C++ ``EventsExecutor``
(``rclpy.experimental``, since Kilted) dispatches each ready entity from C++: `thinkmem
bench node` measures both side by side (``hz100`` vs ``hz100_single``).

Two facts about the events executor as shipped in the Kilted wheels shape the code here:
its ``spin()`` never runs timers (measured: zero timer calls in 2 s), while
``spin_until_future_complete`` with a timeout does; so the node spins in slices of
``SLICE_S`` until the context shuts down (a signal, or ``rclpy.shutdown``). Where rclpy
has no events executor (older distributions), ``events`` falls back to the single one.
"""

from __future__ import annotations

from collections.abc import Callable

from rclpy.executors import Executor, ExternalShutdownException, SingleThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.task import Future

from thinkmem_ros.robot.node_config import EXECUTOR_CHOICES

SLICE_S = 1.0
"""How long one events-executor slice runs before the loop checks the context again;
a shutdown wakes the executor at once, so this only bounds a missed wake-up."""


def make_executor(kind: str, context=None) -> tuple[Executor, str]:
    """The executor for ``kind`` ('events' or 'single') and the kind actually made."""
    if kind == "events":
        try:
            from rclpy.experimental import EventsExecutor
        except ImportError:
            return SingleThreadedExecutor(context=context), "single"
        return EventsExecutor(context=context), "events"
    if kind == "single":
        return SingleThreadedExecutor(context=context), "single"
    raise ValueError(f"executor must be one of {list(EXECUTOR_CHOICES)}, got {kind!r}")


def spin(executor: Executor, kind: str, context,
         on_error: Callable[[BaseException], None] | None = None) -> None:
    """Run callbacks until ``context`` shuts down.

    Either executor may then raise ``ExternalShutdownException``: a requested stop (and
    rcl errors or RuntimeError while the context shuts down: the caller tells those
    apart). Any other exception out of a callback, including rclpy's own (its sim-time
    clock callback raises on a /clock message with negative seconds), is one bad message:
    ``on_error`` hears of it and spinning goes on, where it used to stop the node.
    """
    while context.ok():
        try:
            if kind == "single":
                executor.spin()
                return
            executor.spin_until_future_complete(Future(), timeout_sec=SLICE_S)
        except (ExternalShutdownException, KeyboardInterrupt, _rclpy.RCLError,
                RuntimeError):
            raise
        except Exception as exc:  # noqa: BLE001 - see the docstring
            if on_error is None:
                raise
            on_error(exc)
