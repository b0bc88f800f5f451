"""Which rclpy executor runs the thinking node, and how it spins.

rclpy's ``SingleThreadedExecutor`` rebuilds its wait set in Python on every wake-up (every
subscription, timer, service and event handler of the node); with seven sensors at
100 Hz that bookkeeping costs more CPU than the policy. rclpy's C++ ``EventsExecutor``
(``rclpy.experimental``, since Kilted) dispatches each ready entity from C++: `thinkmem
bench node` measures both side by side (``hz100`` vs ``hz100_single``).

Two facts about the events executor as shipped in the Kilted wheels shape the code here:
its ``spin()`` never runs timers (measured: zero timer calls in 2 s), while
``spin_until_future_complete`` with a timeout does; so the node spins in slices of
``SLICE_S`` until a stop is requested (``StopSignals``) or the context shuts down. Where
rclpy has no events executor (older distributions), ``events`` falls back to the single
one.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from rclpy.executors import Executor, ExternalShutdownException, SingleThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.task import Future

from thinkmem_ros.robot.node_config import EXECUTOR_CHOICES

SLICE_S = 0.2
"""How long one slice of spinning runs before the loop looks for a stop request: the
longest a SIGINT/SIGTERM waits (one Python wake-up per slice costs nothing measurable)."""


class StopSignals:
    """SIGINT and SIGTERM as a request to stop, handled here instead of by rclpy.

    Why not rclpy's handlers: they shut the context down from their own thread at once,
    wherever the main thread is. Landing while the events executor registers the node's
    entities (its first wake-up after ``add_node``), that made the registration fail half
    way ("failed to initialize wait set: the given context is not valid") and leave
    callbacks the executor no longer tracks; destroying it then killed the process
    ("Destroying callback manager with callbacks remaining", exit -6, sometimes -11): 9 of
    400 stops sent 0-12 ms after "ready" on a loaded 2-core machine, none since. Here a signal
    only records the request; the spin loop ends at its next slice and the caller tears the
    executor down while the context is still valid, shutting rclpy down last.

    A start-up is not cut short by the first signal (it ends within a second or two and the
    caller then exits 0); a second one before spinning starts raises KeyboardInterrupt, so
    a start-up that hangs can still be interrupted. Use with ``rclpy.init(...,
    signal_handler_options=SignalHandlerOptions.NO)``.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.spinning = False
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> StopSignals:
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in self.SIGNALS}
        return self

    def __exit__(self, *_exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, _frame) -> None:
        again = self.signum is not None
        self.signum = self.signum or signum
        if again and not self.spinning:
            raise KeyboardInterrupt


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
         on_error: Callable[[BaseException], None] | None = None,
         stop: StopSignals | None = None) -> None:
    """Run callbacks until ``stop`` is requested or ``context`` shuts down.

    Either executor may raise ``ExternalShutdownException`` when the context shuts down
    under it (and rcl errors or RuntimeError: the caller tells those apart). Any other
    exception out of a callback, including rclpy's own (its sim-time clock callback raises
    on a /clock message with negative seconds), is one bad message: ``on_error`` hears of
    it and spinning goes on, where it used to stop the node.
    """
    if stop is not None:
        stop.spinning = True
    while context.ok() and not (stop is not None and stop.requested):
        try:
            if kind == "single":
                executor.spin_once(timeout_sec=SLICE_S)
            else:
                executor.spin_until_future_complete(Future(), timeout_sec=SLICE_S)
        except (ExternalShutdownException, KeyboardInterrupt, _rclpy.RCLError,
                RuntimeError):
            raise
        except Exception as exc:  # noqa: BLE001 - see the docstring
            if on_error is None:
                raise
            on_error(exc)
