"""The thinking node over real DDS: faults on its inputs, and what /diagnostics says about them.

One node per module (starting rclpy and ONNX Runtime is the slow part); each test injects
one condition through real publishers and asserts on the diagnostic values, the frames
the node built (via its frame listener hook) and that activations keep coming.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import pytest
from conftest import SpinningPair, copy_bundle, stop_ros

rclpy = pytest.importorskip("rclpy")

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Range, Temperature  # noqa: E402
from std_msgs.msg import Float32, Float32MultiArray, String  # noqa: E402

from thinkmem_ros.robot.node import ThinkingNode  # noqa: E402

pytestmark = pytest.mark.ros
RATE = 20.0
FED = ("temperature", "current", "vibration", "visibility", "motion")  # not distance, not load


class Harness(SpinningPair):
    """The node under test plus a helper node that feeds inputs and records outputs."""

    def __init__(self, bundle: Path) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = ThinkingNode(context=self.context, parameter_overrides=[
            Parameter("bundle_path", value=str(bundle)),
            Parameter("frame_rate_hz", value=RATE),
            Parameter("stale_after_s", value=0.3),
            Parameter("diagnostics_period_s", value=0.25),
            Parameter("watch_period_s", value=0.1),
            Parameter("robot_id", value="test-bot")])
        self.helper = rclpy.create_node("fault_injector", context=self.context)
        self.pubs = {
            "temperature": self.helper.create_publisher(Temperature, "/sensors/temperature", 10),
            "distance": self.helper.create_publisher(Range, "/sensors/distance", 10)}
        for name in ("current", "vibration", "visibility", "motion", "load"):
            self.pubs[name] = self.helper.create_publisher(Float32, f"/sensors/{name}", 10)
        self.lock = threading.Lock()
        self.diag: dict[str, str] = {}
        self.diag_level = -1
        self.diag_message = ""
        self.activations: list[dict] = []
        self.probabilities: list[Float32MultiArray] = []
        self.frames = []
        self.node.frame_listeners.append(self._on_frame)
        self.helper.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)
        self.helper.create_subscription(String, "/thinking/activation", self._on_act, 50)
        self.helper.create_subscription(Float32MultiArray, "/thinking/probabilities",
                                        self._on_probs, 50)
        self.paused: set[str] = set()
        self.start_spinning()

    def _on_frame(self, result) -> None:
        with self.lock:
            self.frames.append(result)

    def _on_diag(self, msg: DiagnosticArray) -> None:
        status = msg.status[0]
        with self.lock:
            self.diag = {kv.key: kv.value for kv in status.values}
            self.diag_level = status.level[0]
            self.diag_message = status.message

    def _on_act(self, msg: String) -> None:
        with self.lock:
            self.activations.append(json.loads(msg.data))

    def _on_probs(self, msg: Float32MultiArray) -> None:
        with self.lock:
            self.probabilities.append(msg)

    def _feed(self) -> None:
        step = 0
        while not self.stop.wait(1.0 / 40.0):
            step += 1
            for name in FED:
                if name in self.paused:
                    continue
                if name == "temperature":
                    msg = Temperature(temperature=20.0 + 0.01 * step)
                    msg.header.stamp = self.helper.get_clock().now().to_msg()
                else:
                    msg = Float32(data=float(step % 50))
                self.pubs[name].publish(msg)

    def wait_diag(self, predicate, timeout: float = 8.0) -> dict[str, str]:
        """Latest diagnostic values once ``predicate(values)`` holds (fails after timeout)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                values = dict(self.diag)
            if values and predicate(values):
                return values
            time.sleep(0.05)
        pytest.fail(f"diagnostics never matched; last: {self.diag_message!r} {values}")

    def counter(self, key: str) -> int:
        with self.lock:
            return int(self.diag.get(key, "0"))

    def activation_count(self) -> int:
        with self.lock:
            return len(self.activations)

    def assert_still_running(self) -> None:
        before = self.activation_count()
        deadline = time.monotonic() + 3.0
        while self.activation_count() < before + 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.activation_count() >= before + 3, "activations stopped"


@pytest.fixture(scope="module")
def bundles(source_bundle, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("node_ros")
    return {"live": copy_bundle(source_bundle, root / "live"),
            "v2": copy_bundle(source_bundle, root / "v2", model_version=2)}


@pytest.fixture(scope="module")
def harness(ros_env, bundles):
    h = Harness(bundles["live"])
    h.wait_diag(lambda v: int(v["frames"]) > 5)
    yield h
    h.close()


def test_outputs_at_the_frame_rate(harness):
    values = harness.wait_diag(lambda v: float(v["frame_rate_hz"]) > 0.8 * RATE)
    assert float(values["frame_rate_hz"]) < 1.2 * RATE
    assert float(values["inference_p99_us"]) > 0
    assert values["robot_id"] == "test-bot" and values["bundle_version"] == "1"
    with harness.lock:
        act = harness.activations[-1]
        probs = harness.probabilities[-1]
    labels = [d.label for d in probs.layout.dim]
    assert labels == list(act["probabilities"]) == list(harness.node._slot.peek().labels)
    assert len(probs.data) == len(labels)
    assert all(a["label"] in labels and 0 <= a["probability"] <= 1 for a in act["active"])
    assert act["bundle_version"] == 1 and act["inference_us"] > 0


def test_topic_that_never_publishes_is_masked_and_reported(harness):
    values = harness.wait_diag(lambda v: "load" in v["stale_signals"].split(","))
    assert "temperature" not in values["stale_signals"].split(",")
    assert "stale: " in harness.diag_message and "load" in harness.diag_message
    assert harness.diag_level == 1  # WARN
    before = int(values["stale_frames"])
    harness.wait_diag(lambda v: int(v["stale_frames"]) > before)
    load = harness.node.buffer.signals.index("load")
    with harness.lock:
        recent = harness.frames[-5:]
    assert all(f.mask[-1, load] == 0.0 and f.signals[-1, load] == 0.0 for f in recent)


def test_nan_and_inf_are_dropped_and_counted(harness):
    before = harness.counter("invalid")
    harness.paused.add("current")
    time.sleep(0.1)
    for bad in (math.nan, math.inf, -math.inf):
        harness.pubs["current"].publish(Float32(data=bad))
    harness.wait_diag(lambda v: int(v["invalid"]) >= before + 3)
    harness.paused.discard("current")
    harness.assert_still_running()
    with harness.lock:
        assert all(math.isfinite(float(f.signals.max())) for f in harness.frames)


def test_out_of_order_and_duplicate_stamps_never_corrupt_the_window(harness):
    dup0, ooo0 = harness.counter("duplicate"), harness.counter("out_of_order")
    distance = harness.node.buffer.signals.index("distance")
    for stamp, value in ((100.0, 1.0), (100.0, 2.0), (99.0, 3.0), (101.0, 4.0)):
        msg = Range(range=value)
        msg.header.stamp.sec = int(stamp)
        harness.pubs["distance"].publish(msg)
    values = harness.wait_diag(
        lambda v: int(v["duplicate"]) >= dup0 + 1 and int(v["out_of_order"]) >= ooo0 + 1)
    assert int(values["duplicate"]) == dup0 + 1 and int(values["out_of_order"]) == ooo0 + 1
    deadline = time.monotonic() + 5.0  # the counters can be published before the next frame
    while True:
        with harness.lock:
            seen = {float(f.signals[-1, distance]) for f in harness.frames
                    if f.mask[-1, distance] == 1.0}
        if seen & {1.0, 4.0} or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert 4.0 in seen or 1.0 in seen
    assert not seen & {2.0, 3.0}, f"rejected samples entered the window: {seen}"


def test_burst_faster_than_the_frame_rate(harness):
    harness.paused.add("motion")
    time.sleep(0.1)
    frames_before = harness.counter("frames")
    samples_before = harness.counter("samples")
    t0 = time.monotonic()
    for i in range(1, 401):  # 400 messages in a few ms vs 20 frames/s
        harness.pubs["motion"].publish(Float32(data=float(i)))
    motion = harness.node.buffer.signals.index("motion")
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        with harness.lock:
            last = harness.frames[-1]
        if last.signals[-1, motion] == 400.0:
            break
        time.sleep(0.02)
    assert last.signals[-1, motion] == 400.0  # the latest sample wins
    values = harness.wait_diag(lambda v: int(v["frames"]) >= frames_before + 10)
    elapsed = time.monotonic() - t0
    frames = int(values["frames"]) - frames_before
    assert frames <= RATE * (elapsed + 0.6), "frames must follow the clock, not the burst"
    assert int(values["samples"]) - samples_before >= 10
    assert values["frames_skipped"] == "0" and values["inference_errors"] == "0"
    harness.paused.discard("motion")


def test_wrong_message_type_on_a_configured_topic(harness):
    # A participant of its own: DDS refuses two types for one topic inside one participant.
    context = rclpy.Context()
    rclpy.init(context=context)
    rogue_node = rclpy.create_node("rogue_publisher", context=context)
    rogue = rogue_node.create_publisher(String, "/sensors/vibration", 10)
    try:
        for _ in range(3):
            rogue.publish(String(data="not a number"))
        values = harness.wait_diag(lambda v: "/sensors/vibration" in v["type_mismatch"])
        assert "std_msgs/msg/String" in values["type_mismatch"]
        assert int(values["type_mismatch_count"]) >= 1
        assert "wrong type on /sensors/vibration" in harness.diag_message
        harness.assert_still_running()
    finally:
        rogue_node.destroy_node()
        rclpy.shutdown(context=context)
    harness.wait_diag(lambda v: "/sensors/vibration" not in v["type_mismatch"])


def test_tampered_bundle_is_refused_then_a_good_one_swapped_in(harness, bundles):
    sha = harness.diag["bundle_sha256"]
    onnx = bundles["live"] / "policy.onnx"
    data = bytearray(onnx.read_bytes())
    data[len(data) // 2] ^= 0xFF
    onnx.write_bytes(bytes(data))
    values = harness.wait_diag(lambda v: "sha256" in v["bundle_error"])
    assert values["bundle_sha256"] == sha and values["bundle_version"] == "1"
    assert "bundle rejected" in harness.diag_message and harness.diag_level >= 1
    harness.assert_still_running()

    harness.node.set_parameters([Parameter("bundle_path", value=str(bundles["v2"]))])
    values = harness.wait_diag(lambda v: v["bundle_version"] == "2")
    harness.wait_diag(lambda v: v["bundle_error"] == "" and v["bundle_swaps"] == "1")
    harness.assert_still_running()
    with harness.lock:
        assert harness.activations[-1]["bundle_version"] == 2

    # a set that would be refused fails at the parameter level, naming the reason
    result = harness.node.set_parameters([Parameter("bundle_path",
                                                    value="/nonexistent/bundle")])[0]
    assert not result.successful and "not found" in result.reason, result
    assert harness.node.get_parameter("bundle_path").value == str(bundles["v2"])
    values = harness.wait_diag(lambda v: v["bundle_version"] == "2")
    assert values["bundle_error"] == ""
    harness.assert_still_running()


def _set_over_the_service(harness, value) -> object:
    """What `ros2 param set /thinking_node bundle_path VALUE` gets back."""
    from rcl_interfaces.srv import SetParameters

    client = harness.helper.create_client(SetParameters, "/thinking_node/set_parameters")
    try:
        assert client.wait_for_service(timeout_sec=10.0)
        request = SetParameters.Request(
            parameters=[Parameter("bundle_path", value=value).to_parameter_msg()])
        future = client.call_async(request)
        deadline = time.monotonic() + 10.0
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert future.done(), "set_parameters service did not answer"
        return future.result().results[0]
    finally:
        harness.helper.destroy_client(client)


def test_param_set_of_an_unusable_bundle_path_fails_with_the_reason(harness, tmp_path):
    before = harness.node.get_parameter("bundle_path").value
    bad_json = tmp_path / "bad_json"
    bad_json.mkdir()
    (bad_json / "bundle.json").write_text("[" * 100000)
    list_field = copy_bundle(harness.node._slot.peek().path, tmp_path / "list_field")
    manifest = json.loads((list_field / "bundle.json").read_text())
    manifest["normalisation"] = [1, 2]
    (list_field / "bundle.json").write_text(json.dumps(manifest))
    other_window = copy_bundle(harness.node._slot.peek().path, tmp_path / "other_window")
    manifest = json.loads((other_window / "bundle.json").read_text())
    manifest["window"] += 1
    (other_window / "bundle.json").write_text(json.dumps(manifest))
    for value, reason in (("/nonexistent/bundle", "not found"),
                          (str(bad_json), "nested too deeply"),
                          (str(list_field), "normalisation must be"),
                          (str(other_window), "restart the node")):
        result = _set_over_the_service(harness, value)
        assert not result.successful, value
        assert reason in result.reason, (value, result.reason)
        assert harness.node.get_parameter("bundle_path").value == before
    harness.assert_still_running()
    assert harness.counter("inference_errors") == 0


def test_a_far_future_stamp_is_refused_and_does_not_blind_the_sensor(harness):
    future0, ooo0 = harness.counter("future"), harness.counter("out_of_order")
    rogue = Temperature(temperature=99.0)
    rogue.header.stamp.sec = 2_145_916_800  # 2038
    harness.pubs["temperature"].publish(rogue)
    values = harness.wait_diag(lambda v: int(v["future"]) >= future0 + 1)
    assert "future stamps dropped" in harness.diag_message or int(values["future"]) > future0
    time.sleep(1.0)  # genuine samples keep arriving at 40 Hz
    values = harness.wait_diag(lambda v: "temperature" not in v["stale_signals"].split(","))
    assert int(values["out_of_order"]) - ooo0 <= 2, "genuine samples refused after the rogue"
    temperature = harness.node.buffer.signals.index("temperature")
    with harness.lock:
        recent = harness.frames[-5:]
    assert all(f.mask[-1, temperature] == 1.0 and f.signals[-1, temperature] != 99.0
               for f in recent)


def test_hostile_event_messages_are_counted_and_the_node_goes_on(harness):
    invalid0, unknown0 = harness.counter("invalid_events"), harness.counter("unknown_events")
    # left to the helper node's teardown: destroying it here, while the executor thread
    # builds its wait set, can kill that thread (rclpy InvalidHandle) under load
    events = harness.helper.create_publisher(String, "/sensors/events", 10)
    deadline = time.monotonic() + 5.0
    while events.get_subscription_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    events.publish(String(data="[" * 100000))
    events.publish(String(data="x" * 2_000_000))
    events.publish(String(data="no_such_event\x00\n"))
    harness.wait_diag(lambda v: int(v["invalid_events"]) >= invalid0 + 2
                      and int(v["unknown_events"]) >= unknown0 + 1)
    assert harness.counter("input_errors") == 0
    harness.assert_still_running()


def test_no_fresh_input_claims_no_active_thinking(harness):
    harness.paused.update(FED)
    try:
        harness.wait_diag(lambda v: int(v["stale_count"]) == len(harness.node.buffer.signals))
        time.sleep(0.3)
        with harness.lock:
            recent = harness.activations[-5:]
        assert recent and all(a["no_input"] and a["active"] == [] for a in recent), recent
        assert all(len(a["stale"]) == len(harness.node.buffer.signals) for a in recent)
        assert all(a["probabilities"] for a in recent)  # the policy output is still there
        assert "no fresh input" in harness.diag_message and harness.diag_level == 2
        assert harness.counter("no_input_frames") > 0
    finally:
        harness.paused.difference_update(FED)
    harness.wait_diag(lambda v: "temperature" not in v["stale_signals"].split(","))
    time.sleep(0.2)
    with harness.lock:
        assert not harness.activations[-1]["no_input"]


def test_without_a_namespace_the_documented_topics_are_read(harness):
    topics = {sub.topic_name for sub in harness.node._subs}
    assert {"/sensors/temperature", "/sensors/distance", "/sensors/events"} <= topics


def test_two_robots_in_namespaces_read_only_their_own_sensors(ros_env, bundles):
    context = rclpy.Context()
    rclpy.init(context=context)
    params = [Parameter("bundle_path", value=str(bundles["v2"])),
              Parameter("frame_rate_hz", value=RATE), Parameter("watch_bundle", value=False)]
    robots = {ns: ThinkingNode(context=context, namespace=ns, parameter_overrides=params)
              for ns in ("robot1", "robot2")}
    helper = rclpy.create_node("namespace_feeder", context=context)
    pub = helper.create_publisher(Float32, "/robot1/sensors/current", 10)
    executor = SingleThreadedExecutor(context=context)
    for node in (*robots.values(), helper):
        executor.add_node(node)
    spin = threading.Thread(target=executor.spin, daemon=True)
    spin.start()
    try:
        for ns, node in robots.items():
            topics = {sub.topic_name for sub in node._subs}
            assert f"/{ns}/sensors/current" in topics and "/sensors/current" not in topics
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and \
                robots["robot1"].buffer.snapshot().accepted["current"] < 5:
            pub.publish(Float32(data=1.0))
            time.sleep(0.05)
        assert robots["robot1"].buffer.snapshot().accepted["current"] >= 5
        assert robots["robot2"].buffer.snapshot().accepted["current"] == 0
    finally:
        stop_ros(executor, spin, (*robots.values(), helper), context)


def test_diagnostics_keep_coming_and_say_so_while_sim_time_stands_still(ros_env, bundles):
    """use_sim_time and no /clock: ROS time stays 0, yet /diagnostics must not go silent."""
    context = rclpy.Context()
    rclpy.init(context=context)
    node = ThinkingNode(context=context, parameter_overrides=[
        Parameter("bundle_path", value=str(bundles["v2"])), Parameter("use_sim_time", value=True),
        Parameter("diagnostics_period_s", value=0.25), Parameter("watch_bundle", value=False)])
    helper = rclpy.create_node("still_clock_listener", context=context)
    seen: list[str] = []
    helper.create_subscription(DiagnosticArray, "/diagnostics",
                               lambda m: seen.append(m.status[0].message), 10)
    executor = SingleThreadedExecutor(context=context)
    for n in (node, helper):
        executor.add_node(n)
    spin = threading.Thread(target=executor.spin, daemon=True)
    spin.start()
    try:
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and not any(
                "ROS time not advancing" in m for m in seen):
            time.sleep(0.05)
    finally:
        stop_ros(executor, spin, (node, helper), context)
    assert any("ROS time not advancing for" in m and "/clock" in m for m in seen), seen
