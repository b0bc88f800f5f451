"""A bare rclpy node carrying the thinking node's DDS traffic and nothing else.

``thinkmem bench node`` runs it beside the ``hz100`` case to measure the middleware floor:
the same sensor subscriptions (topics, message types, the node's sensor-data QoS), the same
executor, and one activation-sized ``std_msgs/String`` published per complete sample set,
but no buffering, no policy, no shipping and no diagnostics. Its CPU is what any Python
node pays to receive these samples and publish these activations through rclpy; the
thinking node's CPU above it is the node's own work.

Run: ``python -m thinkmem_ros.bench.bare_node --executor events --signals a,b,c``; it prints
``READY <executor>`` once spinning and exits on SIGINT/SIGTERM (rclpy's handlers).
"""

from __future__ import annotations

import json
import sys

from thinkmem_ros.core.arguments import OneLineParser

ACTIVATION_CHARS = 604
"""Length of a real activation (``activation_json`` of a 10-label frame with two active)."""


class BareNode:
    """Sensor subscriptions; every ``len(signals)``-th sample publishes one activation."""

    def __init__(self, node, signals: tuple[str, ...]) -> None:
        from rclpy.qos import qos_profile_sensor_data
        from std_msgs.msg import String

        from thinkmem_ros.robot.msg_fields import message_class
        from thinkmem_ros.robot.node_config import DEFAULT_SIGNAL_MAP

        self._string = String
        self._pub = node.create_publisher(String, "/thinking/activation", 10)
        self._per_set = len(signals)
        self._count = 0
        self._stamp: float | None = None
        for name in signals:
            src = DEFAULT_SIGNAL_MAP[name]
            node.create_subscription(message_class(src.msg_type), src.topic, self._on_sample,
                                     qos_profile_sensor_data)

    def _on_sample(self, msg) -> None:
        self._count += 1
        if hasattr(msg, "header"):  # the newest input stamp, as the node reports it
            self._stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        if self._count % self._per_set:
            return
        text = json.dumps({"inputs_stamp": self._stamp, "pad": ""})
        text = text[:-2] + "x" * max(0, ACTIVATION_CHARS - len(text)) + '"}'
        self._pub.publish(self._string(data=text))


def main(argv: list[str] | None = None) -> int:
    """Spin a bare node until SIGINT/SIGTERM."""
    import rclpy
    from rclpy.executors import ExternalShutdownException
    from rclpy.signals import SignalHandlerOptions

    from thinkmem_ros.robot.node_config import DEFAULT_SIGNAL_MAP, EXECUTOR_CHOICES
    from thinkmem_ros.robot.spinning import StopSignals, make_executor, spin

    parser = OneLineParser(prog="python -m thinkmem_ros.bench.bare_node")
    parser.add_argument("--executor", default="events", choices=EXECUTOR_CHOICES)
    parser.add_argument("--signals", required=True, help="comma-separated signal names")
    args = parser.parse_args(argv)
    unknown = [s for s in args.signals.split(",") if s not in DEFAULT_SIGNAL_MAP]
    if unknown:
        parser.error(f"--signals: not signals of the default map: {unknown} (known: "
                     f"{sorted(DEFAULT_SIGNAL_MAP)})")
    # stopped as the node is (see StopSignals): the executor lets go before rclpy shuts down
    with StopSignals() as stop:
        rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
        node = rclpy.create_node("bare_thinking_node")
        BareNode(node, tuple(args.signals.split(",")))
        executor, kind = make_executor(args.executor)
        executor.add_node(node)
        print(f"READY {kind}", flush=True)
        try:
            spin(executor, kind, node.context, stop=stop)
        except (KeyboardInterrupt, ExternalShutdownException):
            pass
        finally:
            executor.remove_node(node)
            executor.shutdown(timeout_sec=1.0)
            node.destroy_node()
            rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
