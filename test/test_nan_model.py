"""A model that answers NaN on real input: refused at load, and never published at run time.

The bundles here are real ONNX graphs (the shipped window policy with a few nodes added)
run by the real ONNX Runtime; the node test runs a real ``ThinkingNode`` over DDS.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import SpinningPair, wait_for
from onnx import helper

from thinkmem_ros.policy.bundle import BundleError
from thinkmem_ros.robot.hotswap import load_policy

RATE = 20.0
SPIKE = 5000.0  # above every probe value of the shipped window bundle's manifest


def nan_bundle(source: Path, dest: Path, *, above: float | None = None) -> Path:
    """Copy ``source`` with a graph whose probabilities turn NaN on some inputs.

    ``above=None``: NaN for any window that is not all zeros (the load-time probe used to
    feed only zeros). ``above=T``: NaN only once some signal exceeds T, so the bundle
    passes every probe and goes wrong on the robot, as a model can on out-of-range input.
    """
    import shutil

    shutil.copytree(source, dest)
    model = onnx.load(str(source / "policy.onnx"))
    graph = model.graph
    for node in graph.node:
        node.output[:] = ["p0" if out == "probabilities" else out for out in node.output]
    if above is None:
        nodes = [helper.make_node("ReduceSum", ["signals"], ["s"], keepdims=0),
                 helper.make_node("Abs", ["s"], ["a"])]
    else:
        threshold = onnx.numpy_helper.from_array(np.array(above, np.float32), "threshold")
        graph.initializer.append(threshold)
        nodes = [helper.make_node("ReduceMax", ["signals"], ["m"], keepdims=0),
                 helper.make_node("Sub", ["m", "threshold"], ["d"]),
                 helper.make_node("Relu", ["d"], ["a"])]
    graph.node.extend(nodes + [
        helper.make_node("Neg", ["a"], ["na"]),
        helper.make_node("Sqrt", ["na"], ["z"]),  # sqrt(-0) = -0; sqrt(-x) = NaN
        helper.make_node("Add", ["p0", "z"], ["probabilities"])])
    data = model.SerializeToString()
    (dest / "policy.onnx").write_bytes(data)
    manifest = json.loads((dest / "bundle.json").read_text())
    manifest["sha256"] = hashlib.sha256(data).hexdigest()
    (dest / "bundle.json").write_text(json.dumps(manifest))
    return dest


def test_a_model_that_answers_nan_on_realistic_input_is_refused_at_load(window_bundle,
                                                                        tmp_path):
    bundle = nan_bundle(window_bundle, tmp_path / "nan")
    with pytest.raises(BundleError, match="realistic values") as refused:
        load_policy(bundle)
    assert str(bundle) in str(refused.value) and "NaN" in str(refused.value)


def test_the_spiking_model_passes_every_probe_and_answers_nan_on_a_spike(window_bundle,
                                                                         tmp_path):
    """The node test's premise: only the run-time check can catch this one."""
    policy = load_policy(nan_bundle(window_bundle, tmp_path / "spike", above=SPIKE / 2))
    shape = (policy.window, len(policy.signals))
    pred = policy.runtime.predict_one(np.full(shape, SPIKE, np.float32))
    assert np.isnan(pred.probabilities).all()


# ------------------------------------------------------------------ the node over DDS

rclpy = pytest.importorskip("rclpy")

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Range, Temperature  # noqa: E402
from std_msgs.msg import Float32, String  # noqa: E402

from thinkmem_ros.robot.node import ThinkingNode  # noqa: E402


def _no_nan(token: str):
    raise ValueError(f"non-standard JSON token {token}")


class Rig(SpinningPair):
    """The node on the spiking bundle, a helper feeding every signal, what came out."""

    def __init__(self, bundle: Path) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = ThinkingNode(context=self.context, parameter_overrides=[
            Parameter("bundle_path", value=str(bundle)),
            Parameter("frame_rate_hz", value=RATE), Parameter("stale_after_s", value=0.3),
            Parameter("diagnostics_period_s", value=0.25),
            Parameter("watch_bundle", value=False), Parameter("robot_id", value="nan-bot")])
        self.helper = rclpy.create_node("nan_feeder", context=self.context)
        self.pubs = {"temperature": self.helper.create_publisher(
            Temperature, "/sensors/temperature", 10),
            "distance": self.helper.create_publisher(Range, "/sensors/distance", 10)}
        for name in ("current", "vibration", "visibility", "motion", "load"):
            self.pubs[name] = self.helper.create_publisher(Float32, f"/sensors/{name}", 10)
        self.lock = threading.Lock()
        self.value = 1.0
        self.raw: list[str] = []
        self.diag: tuple[int, str, dict] = (-1, "", {})
        self.helper.create_subscription(String, "/thinking/activation", self._on_act, 100)
        self.helper.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)
        self.start_spinning()

    def _on_act(self, msg: String) -> None:
        with self.lock:
            self.raw.append(msg.data)

    def _on_diag(self, msg: DiagnosticArray) -> None:
        status = msg.status[0]
        with self.lock:
            self.diag = (status.level[0], status.message,
                         {kv.key: kv.value for kv in status.values})

    def _feed(self) -> None:
        while not self.stop.wait(1.0 / 40.0):
            value = self.value
            for name, pub in self.pubs.items():
                if name == "temperature":
                    pub.publish(Temperature(temperature=value))
                elif name == "distance":
                    pub.publish(Range(range=value))
                else:
                    pub.publish(Float32(data=value))

    def count(self) -> int:
        with self.lock:
            return len(self.raw)



@pytest.mark.ros
def test_nan_outputs_are_inference_errors_not_activations(ros_env, window_bundle, tmp_path):
    rig = Rig(nan_bundle(window_bundle, tmp_path / "spike", above=SPIKE / 2))
    try:
        wait_for(lambda: rig.count() >= 5, 10.0, "activations on ordinary input")
        rig.value = SPIKE
        time.sleep(1.0)  # the window fills with the spike
        seen = rig.count()
        level, message, values = wait_for(
            lambda: (d := rig.diag)[2].get("inference_errors", "0") not in ("0", "") and d,
            10.0, "inference errors in /diagnostics")
        assert level >= 1 and "inference errors" in message, message
        time.sleep(1.0)
        assert rig.count() - seen <= 2, "frames answered with NaN were published"
        with rig.lock:
            published = list(rig.raw)
        for text in published:  # none may carry NaN (strict JSON parsers refuse it)
            record = json.loads(text, parse_constant=_no_nan)
            assert all(math.isfinite(v) for v in record.get("probabilities", {}).values())
        rig.value = 1.0  # the input comes back into range: activations resume
        wait_for(lambda: rig.count() > len(published) + 5, 10.0, "activations again")
    finally:
        rig.close()
