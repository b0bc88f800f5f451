"""The demo's listening node: activations, ground truth and diagnostics, with receipt times."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

from thinkmem_ros.playback.bag_files import GROUND_TRUTH_TOPIC
from thinkmem_ros.robot.node_config import ACTIVATION_TOPIC, DIAGNOSTICS_TOPIC

LEVELS = {0: "OK", 1: "WARN", 2: "ERROR", 3: "STALE"}


@dataclass
class Received:
    """Everything heard so far; lists are appended by executor callbacks (GIL-atomic)."""

    activations: list[tuple[int, dict]] = field(default_factory=list)  # (receipt wall ns, json)
    truth: dict[int, dict] = field(default_factory=dict)  # frame -> ground-truth json
    diagnostics: dict[str, str] = field(default_factory=dict)  # last node status values
    diagnostic_levels: dict[str, int] = field(default_factory=dict)  # level name -> count
    statuses: dict[str, dict[str, str]] = field(default_factory=dict)  # kind -> last values
    status_levels: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> counts
    bad_json: int = 0


class Collector:
    """An rclpy node (also used by the player) that records what the thinking node says."""

    def __init__(self, context, name: str = "thinkmem_demo") -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from std_msgs.msg import String

        self.node = rclpy.create_node(name, context=context)
        self.received = Received()
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.node.create_subscription(String, ACTIVATION_TOPIC, self._on_activation, qos)
        self.node.create_subscription(String, GROUND_TRUTH_TOPIC, self._on_truth, qos)
        self.node.create_subscription(DiagnosticArray, DIAGNOSTICS_TOPIC, self._on_diag, qos)
        self._executor = SingleThreadedExecutor(context=context)
        self._executor.add_node(self.node)
        self._thread = threading.Thread(target=self._executor.spin, name="demo-collector",
                                        daemon=True)
        self._thread.start()

    def _on_activation(self, msg) -> None:
        now = time.time_ns()
        try:
            self.received.activations.append((now, json.loads(msg.data)))
        except json.JSONDecodeError:
            self.received.bad_json += 1

    def _on_truth(self, msg) -> None:
        try:
            record = json.loads(msg.data)
            self.received.truth[int(record["frame"])] = record
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            self.received.bad_json += 1

    def _on_diag(self, msg) -> None:
        """Keep the last values of each thinkmem status, by kind.

        The node reports "thinkmem: <node>" (kind "node", also kept as ``diagnostics``) and,
        when shipping, "thinkmem: <node>: shipping" and "...: bundle push".
        """
        received = self.received
        for status in msg.status:
            if not status.name.startswith("thinkmem"):
                continue
            parts = status.name.split(": ")
            kind = parts[2] if len(parts) > 2 else "node"
            level = LEVELS.get(int.from_bytes(bytes(status.level), "little"), "UNKNOWN")
            counts = received.status_levels.setdefault(kind, {})
            counts[level] = counts.get(level, 0) + 1
            values = {kv.key: kv.value for kv in status.values}
            values["message"] = status.message
            received.statuses[kind] = values
            if kind == "node":
                received.diagnostics = values
                received.diagnostic_levels = counts

    def new_phase(self) -> None:
        """Start collecting activations and ground truth afresh (a new bag, frames from 0).

        Fresh containers, not cleared ones: callbacks append to whatever is current, and a
        step may still hold the previous phase's lists.
        """
        self.received.activations = []
        self.received.truth = {}

    def wait_for_publisher(self, topic: str, timeout_s: float, alive=lambda: True) -> bool:
        """Poll until ``topic`` has a publisher; False on timeout or once ``alive()`` is false."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and alive():
            if self.node.count_publishers(topic) > 0:
                return True
            time.sleep(0.1)
        return False

    def close(self) -> None:
        """Stop spinning and destroy the node (bounded waits)."""
        self._executor.shutdown(timeout_sec=2.0)
        self._thread.join(timeout=5.0)
        self.node.destroy_node()
