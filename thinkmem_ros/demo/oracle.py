"""The demo's hindsight oracle: the bag's ground truth republished as ``/thinking/feedback``.

On a robot, feedback on what thinking a situation needed comes later, from the LLM that did
the reasoning or from an operator. The demo has neither, but it has the world generator's
ground truth, which the bag carries on ``/thinking/ground_truth``. The oracle stands in for
that judge: for every activation the node publishes it answers with the feedback

    {"stamp": <the activation's stamp>, "required": <truth labels of its frame>,
     "reward": <Jaccard overlap of activated and required thinking, 0..1>}

where "its frame" is the latest ground-truth frame received at or before the activation's
stamp (wall clock, as the demo's scoring matches them). Activations with no fresh truth
(before playback, between bags, after the end: the newest truth is more than
``max_age_s`` older than the stamp) get no feedback, as a judge would have nothing to say.
This is a stand-in, and the summary says so: a real judge is noisier and slower.
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from collections import deque
from dataclasses import dataclass

from thinkmem_ros.playback.bag_files import GROUND_TRUTH_TOPIC
from thinkmem_ros.robot.node_config import ACTIVATION_TOPIC

FEEDBACK_TOPIC = "/thinking/feedback"


@dataclass
class OracleStats:
    """What the oracle did (read by the demo summary)."""

    sent: int = 0
    no_truth: int = 0
    bad_json: int = 0
    last_stamp: float = 0.0  # stamp of the newest activation that got feedback


def jaccard(active: set[str], required: set[str]) -> float:
    """Return |A ∩ R| / |A ∪ R|, 1.0 when both are empty (nothing needed, none activated)."""
    union = active | required
    return 1.0 if not union else len(active & required) / len(union)


class HindsightOracle:
    """Listens to truth and activations on ``node``; publishes feedback for each activation."""

    def __init__(self, node, max_age_s: float, topic: str = FEEDBACK_TOPIC) -> None:
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from std_msgs.msg import String

        self._string = String
        self.stats = OracleStats()
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._truth: deque[tuple[int, list[str]]] = deque(maxlen=256)  # (receipt ns, labels)
        self.enabled = True
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self._pub = node.create_publisher(String, topic, qos)
        node.create_subscription(String, GROUND_TRUTH_TOPIC, self._on_truth, qos)
        node.create_subscription(String, ACTIVATION_TOPIC, self._on_activation, qos)

    def _on_truth(self, msg) -> None:
        now = time.time_ns()
        try:
            labels = list(json.loads(msg.data)["active"])
        except (json.JSONDecodeError, KeyError, TypeError):
            self.stats.bad_json += 1
            return
        with self._lock:
            self._truth.append((now, labels))

    def wait_for_subscriber(self, timeout_s: float) -> bool:
        """Poll until the node subscribes to the feedback topic; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._pub.get_subscription_count() == 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def truth_at(self, stamp_ns: int) -> list[str] | None:
        """Labels of the newest truth received at or before ``stamp_ns``, if fresh enough."""
        with self._lock:
            received = list(self._truth)
        index = bisect.bisect_right([r for r, _ in received], stamp_ns) - 1
        if index < 0 or stamp_ns - received[index][0] > self.max_age_s * 1e9:
            return None
        return received[index][1]

    def _on_activation(self, msg) -> None:
        if not self.enabled:
            return
        try:
            record = json.loads(msg.data)
            stamp = float(record["stamp"])
            active = {a["label"] for a in record["active"]}
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            self.stats.bad_json += 1
            return
        truth = self.truth_at(round(stamp * 1e9))
        if truth is None:
            self.stats.no_truth += 1
            return
        required = truth
        base = {a for a in active if not a.startswith("consider:")}  # the truth's vocabulary
        feedback = {"stamp": stamp, "required": required,
                    "reward": round(jaccard(base, set(required)), 4)}
        self._pub.publish(self._string(data=json.dumps(feedback)))
        self.stats.sent += 1
        self.stats.last_stamp = max(self.stats.last_stamp, stamp)
