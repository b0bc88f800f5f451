"""Value rerank and memory control in the node: plain-Python gates, then a real node over DDS.

The bundle under test is a copy of the source bundle plus a small value table (one cluster
that every situation falls into, where every label has earned -1) and memctl probes that
always ask for recall. Thresholds are overridden so trend and hazard are always activated.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import SpinningPair, copy_bundle

from thinkmem_ros.consolidator.recall_server import EpisodeRef, RecallIndex, RecallServer
from thinkmem_ros.policy.bundle import load_bundle
from thinkmem_ros.policy.memctl_heads import MemctlHeads, ProbeHead
from thinkmem_ros.policy.value_table import ValueConfig, ValueTable
from thinkmem_ros.robot.thinking_gates import (
    GateConfig,
    ThinkingGates,
    artefact_hashes,
    attach_artefacts,
    load_gate_artefacts,
)


def _dim(bundle: Path) -> int:
    """The policy's embedding width, whatever its form (a window Transformer or a GRU)."""
    from thinkmem_ros.policy.runtime import PolicyRuntime

    return PolicyRuntime(bundle).embedding_dim


def _write_artefacts(folder: Path, labels: list[str], dim: int, *, recall_bias: float = 20.0
                     ) -> None:
    """One catch-all cluster (theta -0.99) where every label earned -1; recall always on."""
    table = ValueTable(labels, dim, ValueConfig(theta=-0.99, gamma=0.0, forgetting=False))
    s = table.assign(np.ones(dim))
    for _ in range(6):
        for label in labels:
            table.update(s, label, -1.0)
    table.save(folder)
    MemctlHeads(ProbeHead(np.zeros(dim), -20.0), ProbeHead(np.zeros(dim), recall_bias)).save(
        folder)


# ------------------------------------------------------------------ plain Python

LABELS = ["trend", "cause", "hazard"]


def _gates(tmp_path: Path, mode: str = "deploy", submit=None, horizon: int = 10_000,
           **kw) -> ThinkingGates:
    _write_artefacts(tmp_path, LABELS, 4, **kw)
    gates = ThinkingGates(GateConfig(value_mode=mode, value_horizon=horizon), "r1", "s1",
                          recall=submit, rng=np.random.default_rng(0))
    gates.use(load_gate_artefacts(tmp_path))
    return gates


def test_deploy_suppresses_low_value_but_never_hazard(tmp_path):
    submitted = []
    gates = _gates(tmp_path, submit=lambda tag, emb: submitted.append(tag))
    out = gates.apply(7, ("trend", "hazard"), np.ones(4), {"trend": 0.9, "hazard": 0.6})
    assert out.active == ["hazard"] and out.suppressed == {"trend": "low_value"}
    assert out.values["hazard"] < 0 and out.uncertainties["trend"] > 0
    rec = out.record()
    assert rec["ranked"] == ["hazard"] and rec["memctl"]["recall"] is True
    assert rec["memctl"]["compress"] is False and submitted == [7]
    assert gates.stats()["value_suppressed"] == 1 and gates.stats()["memctl_recall"] == 1


def test_off_mode_keeps_everything_and_learn_mode_explores_early(tmp_path):
    off = _gates(tmp_path / "a", mode="off")
    assert off.apply(1, ("trend",), np.ones(4), {}).active == ["trend"]
    learn = _gates(tmp_path / "b", mode="learn")
    early = [learn.apply(t, ("trend",), np.ones(4), {}).explored for t in range(20)]
    learn._t = 10_000  # far past the horizon: eps ~ 0.95 * exp(-600), greedy
    late = [learn.apply(t, ("trend",), np.ones(4), {}) for t in range(20)]
    assert sum(early) >= 15 and not any(o.explored for o in late)
    assert all(o.suppressed == {"trend": "low_value"} for o in late)
    with pytest.raises(ValueError, match="value_mode"):
        GateConfig(value_mode="greedy")


def test_head_failure_keeps_the_activation(tmp_path):
    gates = _gates(tmp_path)
    out = gates.apply(1, ("hazard",), np.ones(5), {})  # wrong embedding size for both parts
    assert out.active == ["hazard"] and out.p_compress is None and out.memctl_error
    assert gates.stats()["memctl_head_errors"] == 1


def test_artefacts_listed_in_the_manifest_must_match(source_bundle, tmp_path):
    folder = copy_bundle(source_bundle, tmp_path / "b")
    _write_artefacts(tmp_path / "arts", list(load_bundle(folder).manifest.labels), _dim(folder))
    listed = attach_artefacts(folder, tmp_path / "arts")
    assert set(listed) == {"values.npz", "values.json", "memctl.npz", "memctl.json"}
    assert load_bundle(folder).manifest.extras["artefacts"] == artefact_hashes(folder)
    ok = load_gate_artefacts(folder, load_bundle(folder).manifest.extras)
    assert ok.table is not None and ok.heads is not None and not ok.errors
    table = ValueTable.load(folder)  # a self-consistent but different table: still refused
    table.update(0, table.labels[0], 5.0)
    table.save(folder)
    bad = load_gate_artefacts(folder, load_bundle(folder).manifest.extras)
    assert bad.table is None and bad.heads is not None
    assert "does not match the manifest" in bad.errors[0]
    (folder / "memctl.json").unlink()  # listed but missing: refused, not silently skipped
    assert load_gate_artefacts(folder, load_bundle(folder).manifest.extras).heads is None


# ------------------------------------------------------------------ real node over DDS

rclpy = pytest.importorskip("rclpy")

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Range, Temperature  # noqa: E402
from std_msgs.msg import Float32, String  # noqa: E402

from thinkmem_ros.robot.node import ThinkingNode  # noqa: E402


class Harness(SpinningPair):
    """A node with the gated bundle plus a helper that feeds every signal and records."""

    def __init__(self, bundle: Path, recall_endpoint: str) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = ThinkingNode(context=self.context, parameter_overrides=[
            Parameter("bundle_path", value=str(bundle)),
            Parameter("frame_rate_hz", value=20.0),
            Parameter("diagnostics_period_s", value=0.25),
            Parameter("thresholds", value="trend=0.0,hazard=0.0"),
            Parameter("recall_endpoint", value=recall_endpoint),
            Parameter("recall_deadline_s", value=0.5),
            Parameter("robot_id", value="gate-bot")])
        self.helper = rclpy.create_node("gate_feeder", context=self.context)
        self.pubs = {"temperature": self.helper.create_publisher(
            Temperature, "/sensors/temperature", 10), "distance": self.helper.create_publisher(
            Range, "/sensors/distance", 10)}
        for name in ("current", "vibration", "visibility", "motion", "load"):
            self.pubs[name] = self.helper.create_publisher(Float32, f"/sensors/{name}", 10)
        self.lock = threading.Lock()
        self.activations: list[dict] = []
        self.evidence: list[dict] = []
        self.memory: dict[str, str] = {}
        self.memory_level = -1
        self.helper.create_subscription(String, "/thinking/activation", self._on(
            self.activations), 50)
        self.helper.create_subscription(String, "/thinking/evidence", self._on(self.evidence), 50)
        self.helper.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)
        self.start_spinning()

    def _on(self, sink: list):
        def callback(msg: String) -> None:
            with self.lock:
                sink.append(json.loads(msg.data))
        return callback

    def _on_diag(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name.endswith(": memory"):
                with self.lock:
                    self.memory = {kv.key: kv.value for kv in status.values}
                    self.memory_level = status.level[0]

    def _feed(self) -> None:
        step = 0
        while not self.stop.wait(1.0 / 40.0):
            step += 1
            for name, pub in self.pubs.items():
                if name == "temperature":
                    msg = Temperature(temperature=20.0 + 0.01 * step)
                    msg.header.stamp = self.helper.get_clock().now().to_msg()
                elif name == "distance":
                    msg = Range(range=8.0)
                    msg.header.stamp = self.helper.get_clock().now().to_msg()
                else:
                    msg = Float32(data=float(step % 50) / 10.0)
                pub.publish(msg)

    def wait(self, predicate, timeout: float = 15.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if predicate():
                    return
            time.sleep(0.05)
        pytest.fail(f"timed out waiting for {what}; memory status {self.memory}, "
                    f"{len(self.activations)} activations, {len(self.evidence)} evidence")


@pytest.fixture(scope="module")
def gated_bundle(source_bundle, tmp_path_factory) -> Path:
    folder = copy_bundle(source_bundle, tmp_path_factory.mktemp("gated") / "bundle")
    _write_artefacts(folder, list(load_bundle(folder).manifest.labels), _dim(folder))
    return folder


@pytest.mark.ros
def test_node_suppresses_and_publishes_recalled_evidence(ros_env, gated_bundle):
    dim = _dim(gated_bundle)
    index = RecallIndex(dim)
    index.add(np.eye(3, dim), [EpisodeRef("old-bot", f"ep{i}", i, float(i), ["hazard"], 1.0)
                              for i in range(3)])
    with RecallServer(index, "tcp://127.0.0.1:*") as server:
        h = Harness(gated_bundle, server.endpoint)
        try:
            h.wait(lambda: len(h.activations) >= 5 and h.evidence, what="evidence")
            with h.lock:
                act = h.activations[-1]
                ev = h.evidence[0]
            labels = [a["label"] for a in act["active"]]
            assert "hazard" in labels and "trend" not in labels  # hazard is never suppressed
            assert act["suppressed"]["trend"] == "low_value" and "hazard" not in act["suppressed"]
            assert set(act["policy_active"]) >= {"trend", "hazard"}
            assert set(act["suppressed"]) == set(act["policy_active"]) - {"hazard"}
            assert act["value_mode"] == "deploy" and act["values"]["trend"] < 0
            assert act["memctl"]["recall"] is True and act["memctl"]["compress"] is False
            assert ev["robot_id"] == "gate-bot" and len(ev["items"]) == 3
            assert {item["episode_id"] for item in ev["items"]} == {"ep0", "ep1", "ep2"}
            h.wait(lambda: int(h.memory.get("recall_evidence", "0")) > 0, what="counter")
            assert server.served > 0
        finally:
            h.close()


@pytest.mark.ros
def test_recall_server_down_still_publishes_activations(ros_env, gated_bundle):
    import zmq

    from thinkmem_ros.link.sockets import context

    probe = context().socket(zmq.ROUTER)  # find a free port, then leave nothing on it
    probe.bind("tcp://127.0.0.1:*")
    endpoint = probe.getsockopt_string(zmq.LAST_ENDPOINT)
    probe.close(0)
    h = Harness(gated_bundle, endpoint)
    try:
        h.wait(lambda: int(h.memory.get("recall_errors", "0")) >= 2, what="recall errors")
        count = len(h.activations)
        h.wait(lambda: len(h.activations) >= count + 5, what="more activations")
        with h.lock:
            assert not h.evidence and h.memory_level == 1  # WARN
            assert h.activations[-1]["memctl"]["recall"] is True
            assert int(h.memory["recall_evidence"]) == 0
    finally:
        h.close()


def test_published_bundle_carries_its_signed_artefacts(source_bundle, tmp_path):
    from thinkmem_ros.consolidator.publish import PublishConfig, Publisher
    from thinkmem_ros.link.security import verify_signed_bundle, write_signing_keypair

    pub_key, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    publisher = Publisher(PublishConfig(tmp_path / "pub", key), initial)
    staged = copy_bundle(source_bundle, tmp_path / "staged", model_version=2)
    _write_artefacts(tmp_path / "arts", list(load_bundle(staged).manifest.labels), _dim(staged))
    attach_artefacts(staged, tmp_path / "arts")
    publication = publisher.publish(load_bundle(staged))
    signed = verify_signed_bundle(publication.path, pub_key)
    arts = load_gate_artefacts(publication.path, load_bundle(signed.path).manifest.extras)
    assert arts.table is not None and arts.heads is not None and not arts.errors
