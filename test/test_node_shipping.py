"""The node ships experiences and takes verified bundle pushes: real DDS, real ZeroMQ.

Each ROS test runs a real ``ThinkingNode`` (in-process, own rclpy context) fed over DDS by
a helper node, and a real ``ExperienceReceiver`` (the consolidator's ingest) on 127.0.0.1
at a random port; what arrives is read back from the consolidator's SQLite store.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest
from conftest import SpinningPair, copy_bundle, wait_for

from thinkmem_ros.consolidator.ingest import open_receiver
from thinkmem_ros.consolidator.publish import PublishConfig, Publisher, push_frame
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.link.receiver import ReceiverConfig
from thinkmem_ros.link.security import sign_bundle, write_signing_keypair
from thinkmem_ros.link.spool import Spool
from thinkmem_ros.policy.bundle import load_bundle, signal_set_fingerprint
from thinkmem_ros.robot.diagnostics import (
    ERROR,
    OK,
    WARN,
    PushSnapshot,
    ShippingSnapshot,
    push_status,
    shipping_status,
)
from thinkmem_ros.robot.node_config import NodeConfig

RATE = 20.0
ROBOT = "ship-bot"


# ------------------------------------------------------------------ plain-Python parts

@pytest.mark.parametrize("kwargs, key", [
    ({"consolidator_endpoint": "10.0.0.5:5755"}, "consolidator_endpoint"),
    ({"consolidator_endpoint": "tcp://10.0.0.5:5755"}, "server_public_key"),
    ({"consolidator_endpoint": "tcp://127.0.0.1:5755", "server_public_key": "s.key"},
     "client_secret_key"),
    ({"curve": "maybe"}, "curve"),
    ({"feedback_window_s": -1.0}, "feedback_window_s"),
    ({"ship_every_n_frames": 0}, "ship_every_n_frames"),
    ({"feedback_topic": "/sensors/events"}, "feedback_topic"),
    ({"consolidator_endpoint": "tcp://127.0.0.1:5755", "robot_id": "bot 7"}, "robot_id"),
    ({"consolidator_endpoint": "tcp://127.0.0.1:*"}, "consolidator_endpoint .*'\\*' only"),
    ({"consolidator_endpoint": "tcp://127.0.0.1:5755,tcp://*:5755"}, "consolidator_endpoint"),
    ({"consolidator_endpoint": "tcp://127.0.0.1:0"}, "consolidator_endpoint"),
])
def test_shipping_parameters_are_validated_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        NodeConfig(**kwargs)


def _spool_config(path) -> NodeConfig:
    return NodeConfig(consolidator_endpoint="tcp://127.0.0.1:5755", spool_path=str(path))


def test_a_spool_path_that_can_never_hold_a_spool_is_refused(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("x")
    for path, says in ((tmp_path, "it is a folder"),
                       (tmp_path / "file" / "sub" / "spool.db",
                        f"{tmp_path / 'file'} is a file, not a folder"),
                       ("/proc/x/spool.db", "No such file or directory"),
                       (tmp_path / "fifo", "it is not a regular file")):
        with pytest.raises(ValueError, match=re.escape(
                f"spool_path '{path}' cannot hold the spool: {says}")):
            _spool_config(path).check_spool_path()
    fresh = tmp_path / "new" / "spool.db"
    _spool_config(fresh).check_spool_path()  # its folder is made, the file is not
    assert fresh.parent.is_dir() and not fresh.exists()
    fresh.write_bytes(b"")
    _spool_config(fresh).check_spool_path()
    assert fresh.read_bytes() == b""  # an existing spool is left as it is
    NodeConfig(spool_path=str(tmp_path)).check_spool_path()  # not shipping: not checked


def test_a_full_disk_at_start_is_left_to_the_spool(tmp_path, monkeypatch):
    import errno
    import tempfile

    def full(*args, **kwargs):  # a full disk cannot be made here: injected
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "TemporaryFile", full)
    _spool_config(tmp_path / "spool.db").check_spool_path()


def test_shipping_defaults_are_off_and_paths_live_in_the_state_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    config = NodeConfig(robot_id="r7")
    assert not config.shipping and config.feedback_topic == "thinking/feedback"
    assert config.spool_file() == tmp_path / "thinkmem_ros" / "r7" / "spool.db"
    assert config.bundles_folder() == tmp_path / "thinkmem_ros" / "r7" / "bundles"
    loopback = NodeConfig(consolidator_endpoint="tcp://127.0.0.1:5755")  # no CURVE needed
    assert loopback.shipping


def test_a_second_node_on_the_same_spool_is_refused_naming_the_holder(source_bundle, tmp_path):
    from types import SimpleNamespace

    from thinkmem_ros.robot.hotswap import load_policy
    from thinkmem_ros.robot.shipping_link import ShippingLink

    config = NodeConfig(consolidator_endpoint="tcp://127.0.0.1:9", curve="off",
                        spool_path=str(tmp_path / "spool.db"),
                        bundles_dir=str(tmp_path / "bundles"))  # robot_id left at 'robot'
    policy = load_policy(source_bundle)
    log = SimpleNamespace(info=print, error=print, warning=print)

    def link(ns: str) -> ShippingLink:
        return ShippingLink(config, policy, 10.0, None, lambda path: None, log,
                            holder=f"node /{ns}/thinking_node")

    first = link("robot1")
    try:
        with pytest.raises(ValueError, match=re.escape(
                f"is in use by pid {os.getpid()} (node /robot1/thinking_node, robot_id "
                "robot) since ")) as refused:
            link("robot2")
        assert "give each robot its own robot_id (or its own spool_path)" in str(refused.value)
    finally:
        first.close()
    link("robot2").close()  # free again once the holder is gone


def test_a_robot_id_too_long_for_its_episode_ids_is_refused():
    from thinkmem_ros.robot.experience_builder import MAX_ROBOT_ID_CHARS

    endpoint = "tcp://127.0.0.1:5755"
    NodeConfig(consolidator_endpoint=endpoint, robot_id="r" * MAX_ROBOT_ID_CHARS)
    with pytest.raises(ValueError, match=f"robot_id .*at most {MAX_ROBOT_ID_CHARS}"):
        NodeConfig(consolidator_endpoint=endpoint, robot_id="r" * (MAX_ROBOT_ID_CHARS + 1))


def _ship_snap(**kw) -> ShippingSnapshot:
    base = dict(endpoint="tcp://h:1", curve=True,
                shipper={"connected": True, "acked": 5, "spool_rows": 0},
                previous={"connected": True, "acked": 3, "spool_rows": 0},
                builder={"frames": 5})
    base.update(kw)
    return ShippingSnapshot(**base)


def test_shipping_status_levels():
    assert shipping_status(_ship_snap()).level == OK
    growing = shipping_status(_ship_snap(shipper={"connected": False, "spool_rows": 40},
                                         previous={"connected": False, "spool_rows": 20}))
    assert growing.level == WARN and "growing" in growing.message
    auth = shipping_status(_ship_snap(shipper={"connected": False, "auth_failures": 1},
                                      previous={}))
    assert auth.level == ERROR and "CURVE" in auth.message
    shed = shipping_status(_ship_snap(shipper={"connected": True, "shed": 4},
                                      previous={"connected": True, "shed": 1}))
    assert shed.level == WARN and "3 experiences shed" in shed.message
    assert shipping_status(_ship_snap(failure="spool unreadable")).level == ERROR
    values = dict(shipping_status(_ship_snap()).values)
    assert values["acked"] == "5" and values["connected"] == "true"


def test_shipping_status_warns_when_waiting_feedback_is_dropped():
    builder = {"frames": 5, "feedback_waiting": 1024, "feedback_dropped": 30}
    report = shipping_status(_ship_snap(builder=builder,
                                        previous_builder=dict(builder, feedback_dropped=10)))
    assert report.level == WARN and "20 feedback messages dropped" in report.message
    values = dict(report.values)
    assert values["experiences_feedback_waiting"] == "1024"
    assert values["experiences_feedback_dropped"] == "30"


def test_shipping_status_is_an_error_while_the_spool_disk_is_full():
    full = shipping_status(_ship_snap(shipper={"connected": True, "disk_full": True,
                                               "shed_disk_full": 7},
                                      previous={"connected": True, "shed_disk_full": 2}))
    assert full.level == ERROR and "disk full" in full.message
    assert "5 oldest spooled experiences shed" in full.message
    refused = shipping_status(_ship_snap(shipper={"connected": True, "refused_disk_full": 3},
                                         previous={"connected": True}))
    assert refused.level == ERROR and "3 experiences refused" in refused.message
    assert dict(full.values)["shed_disk_full"] == "7"


def test_push_status_warns_after_a_rejection_until_a_good_push():
    snap = dict(configured=True, counters={"pushes": 1, "rejected_signature": 1},
                last_outcome="rejected", last_reason="signature: bad", installed_version=2,
                running_version=2)
    rejected = push_status(PushSnapshot(**snap))
    assert rejected.level == WARN and "signature: bad" in rejected.message
    assert dict(rejected.values)["rejected_signature"] == "1"
    snap.update(last_outcome="accepted", installed_version=3, running_version=3)
    assert push_status(PushSnapshot(**snap)).level == OK
    snap.update(installed_version=4, swap_error="window differs")
    assert push_status(PushSnapshot(**snap)).level == WARN


# ------------------------------------------------------------------------- ROS rig

rclpy = pytest.importorskip("rclpy")

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Range, Temperature  # noqa: E402
from std_msgs.msg import Float32, String  # noqa: E402

from thinkmem_ros.robot.node import ThinkingNode  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def receiver(endpoint: str, db: Path):
    return open_receiver(ReceiverConfig(bind=endpoint, db_path=db, poll_s=0.02)).start()


def stored(db: Path) -> list:
    with ExperienceStore(db) as store:
        return [exp for _, exp in store.iter_experiences(robot_id=ROBOT)]


class Rig(SpinningPair):
    """A shipping node, a helper that feeds it and sends feedback, and what they saw."""

    def __init__(self, bundle: Path, tmp: Path, endpoint: str, *, feedback_every: int = 0,
                 **params) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        overrides = dict(bundle_path=str(bundle), frame_rate_hz=RATE, stale_after_s=0.3,
                         diagnostics_period_s=0.25, watch_period_s=0.1, robot_id=ROBOT,
                         consolidator_endpoint=endpoint, spool_path=str(tmp / "spool.db"),
                         bundles_dir=str(tmp / "bundles"), feedback_window_s=0.5)
        overrides.update(params)
        self.node = ThinkingNode(context=self.context, parameter_overrides=[
            Parameter(k, value=v) for k, v in overrides.items()])
        self.helper = rclpy.create_node("ship_helper", context=self.context)
        self.lock = threading.Lock()
        self.frames: list[float] = []  # stamps of every published frame (listener hook)
        self.activations: list[dict] = []
        self.feedback_sent: dict[float, list[str]] = {}
        self.diag: dict[str, tuple[int, str, dict]] = {}
        self.feedback_every = feedback_every
        self.node.frame_listeners.append(self._on_frame)
        self.pubs = {"temperature": self.helper.create_publisher(
            Temperature, "/sensors/temperature", 10),
            "distance": self.helper.create_publisher(Range, "/sensors/distance", 10)}
        for name in ("current", "vibration", "visibility", "motion", "load"):
            self.pubs[name] = self.helper.create_publisher(Float32, f"/sensors/{name}", 10)
        self.events = self.helper.create_publisher(String, "/sensors/events", 10)
        self.feedback = self.helper.create_publisher(
            String, "/thinking/feedback", QoSProfile(depth=100,
                                                     reliability=ReliabilityPolicy.RELIABLE))
        self.helper.create_subscription(String, "/thinking/activation", self._on_act, 100)
        self.helper.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)
        self.start_spinning()

    def _on_frame(self, result) -> None:
        with self.lock:
            self.frames.append(result.stamp)

    def _on_act(self, msg: String) -> None:
        act = json.loads(msg.data)
        with self.lock:
            self.activations.append(act)
            count = len(self.activations)
        if (self.feedback_every and count % self.feedback_every == 0
                and self.feedback.get_subscription_count() > 0):
            required = ["hazard", f"consider:n{count}"]
            self.feedback.publish(String(data=json.dumps(
                {"stamp": act["stamp"], "required": required, "reward": 1.0})))
            with self.lock:
                self.feedback_sent[act["stamp"]] = required

    def _on_diag(self, msg: DiagnosticArray) -> None:
        with self.lock:
            for status in msg.status:
                self.diag[status.name.rsplit(": ", 1)[-1]] = (
                    status.level[0], status.message, {kv.key: kv.value for kv in status.values})

    def _feed(self) -> None:
        step = 0
        while not self.stop.wait(1.0 / 40.0):
            step += 1
            for name, pub in self.pubs.items():
                if name == "temperature":
                    msg = Temperature(temperature=20.0 + 0.01 * step)
                elif name == "distance":
                    msg = Range(range=1.0 + 0.001 * step)
                else:
                    msg = Float32(data=float(step % 50))
                pub.publish(msg)

    def status(self, name: str) -> tuple[int, str, dict]:
        with self.lock:
            return self.diag.get(name, (-1, "", {}))


@pytest.fixture
def rig_factory(ros_env, tmp_path):
    rigs: list[Rig] = []

    def make(*args, **kwargs) -> Rig:
        rig = Rig(*args, **kwargs)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


@pytest.fixture
def v1(source_bundle, tmp_path) -> Path:
    return copy_bundle(source_bundle, tmp_path / "v1", model_version=1)


def test_activations_reach_the_store_with_feedback_attached(rig_factory, v1, tmp_path):
    db = tmp_path / "consolidator.db"
    rx = receiver("tcp://127.0.0.1:*", db)
    try:
        rig = rig_factory(v1, tmp_path, rx.endpoint, feedback_every=4)
        wait_for(lambda: len(rig.feedback_sent) >= 6, 15.0, "6 feedback messages")
        rig.events.publish(String(data="door_open"))
        with rig.lock:
            sent = dict(rig.feedback_sent)

        def arrived():
            rows = {e.stamp: e for e in stored(db)}
            return rows if all(s in rows for s in sent) else None
        rows = wait_for(arrived, 10.0, "the experiences that got feedback")
        for stamp, required in sent.items():
            assert rows[stamp].required == required and rows[stamp].reward == 1.0
        others = [e for s, e in rows.items() if s not in sent]
        assert others and all(e.required is None and e.reward is None for e in others)
        manifest = load_bundle(v1).manifest
        for exp in rows.values():
            assert exp.robot_id == ROBOT and exp.bundle_version == 1
            assert exp.labels == list(manifest.labels)
            assert exp.window.shape == (manifest.window, len(manifest.signals))
            assert exp.bundle_sha256 == manifest.sha256
            # the fingerprint the consolidator filters on (computed when undeclared)
            assert exp.signal_set == (manifest.signal_set or signal_set_fingerprint(manifest))
        assert len({e.episode_id for e in rows.values()}) == 1
        wait_for(lambda: any("door_open" in e.events for e in stored(db)), 5.0,
                 "an experience carrying the door_open event")
        level, message, values = wait_for(
            lambda: (s := rig.status("shipping"))[2].get("connected") == "true"
            and int(s[2]["acked"]) > 0 and s, 5.0, "a connected shipping status")
        assert level == OK, message
        assert int(values["experiences_feedback_matched"]) >= len(sent)
    finally:
        rx.stop()


def test_consolidator_down_at_start_spools_then_delivers_once(rig_factory, v1, tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    db = tmp_path / "consolidator.db"
    rig = rig_factory(v1, tmp_path, endpoint, feedback_window_s=0.1)
    level, message, values = wait_for(
        lambda: (s := rig.status("shipping"))[2].get("spool_rows", "0") != "0" and s, 10.0,
        "experiences in the spool while the consolidator is down")
    assert level == WARN and values["connected"] == "false", message
    rx = receiver(endpoint, db)
    try:
        with rig.lock:
            before = list(rig.frames)  # all spooled (or pending) while nobody listened
        wait_for(lambda: {round(s, 6) for s in before} <= {round(e.stamp, 6)
                                                           for e in stored(db)},
                 15.0, "every frame from the outage in the store")
        rig.close()  # held frames and the queue go to the spool
        with rig.lock:
            frames = list(rig.frames)
        time.sleep(0.3)
        rows = stored(db)
        spool = Spool(tmp_path / "spool.db", 1 << 30)
        try:
            spooled = spool.rows
        finally:
            spool.close()
        stamps = [round(e.stamp, 6) for e in rows]
        assert len(stamps) == len(set(stamps)), "an experience was stored twice"
        assert set(stamps) <= {round(s, 6) for s in frames}
        assert len(rows) + spooled == len(frames), (len(rows), spooled, len(frames))
    finally:
        rx.stop()


def test_signed_push_swaps_and_bad_or_old_pushes_are_refused(rig_factory, source_bundle, v1,
                                                             tmp_path):
    pub, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    _, wrong_key = write_signing_keypair(tmp_path / "keys", "intruder")
    publisher = Publisher(PublishConfig(tmp_path / "published", key), v1)
    rx = receiver("tcp://127.0.0.1:*", tmp_path / "consolidator.db")
    try:
        rig = rig_factory(v1, tmp_path, rx.endpoint, bundle_signing_public_key=str(pub))
        wait_for(lambda: rx.peers, 10.0, "the node's HELLO at the consolidator")
        staged = load_bundle(copy_bundle(source_bundle, tmp_path / "staged2", model_version=2))
        assert publisher.publish(staged, push=rx.push_bundle).pushed_to == 1

        def running(version):
            with rig.lock:
                recent = rig.activations[-3:]
            return len(recent) == 3 and all(a["bundle_version"] == version for a in recent)
        wait_for(lambda: running(2), 10.0, "activations from the pushed v2")
        level, message, values = wait_for(
            lambda: (s := rig.status("bundle push"))[2].get("running_version") == "2" and s,
            5.0, "the accepted push running, in /diagnostics")
        assert level == OK and values["accepted"] == "1", message

        forged = copy_bundle(source_bundle, tmp_path / "forged3", model_version=3)
        sign_bundle(forged, wrong_key)
        rx.push_bundle(push_frame(forged))
        level, message, values = wait_for(
            lambda: (s := rig.status("bundle push"))[2].get("rejected_signature") == "1" and s,
            10.0, "the forged push refused in /diagnostics")
        assert level == WARN and "signature" in message

        old = copy_bundle(source_bundle, tmp_path / "old1", model_version=1)
        sign_bundle(old, key)
        rx.push_bundle(push_frame(old))
        level, message, values = wait_for(
            lambda: (s := rig.status("bundle push"))[2].get("rejected_version") == "1" and s,
            10.0, "the rollback push refused in /diagnostics")
        assert level == WARN and "not newer" in message
        with rig.lock:
            seen = len(rig.activations)
        wait_for(lambda: len(rig.activations) > seen + 5, 5.0, "activations after refusals")
        assert running(2), "a refused push changed the running bundle"
        rig.close()
    finally:
        rx.stop()

    # a restart keeps the pushed bundle: bundle_path still names v1, bundles_dir holds v2
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = ThinkingNode(context=context, parameter_overrides=[
            Parameter("bundle_path", value=str(v1)),
            Parameter("bundles_dir", value=str(tmp_path / "bundles")),
            Parameter("bundle_signing_public_key", value=str(pub))])
        try:
            assert node._slot.peek().version == 2
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown(context=context)


def test_unverifiable_pushes_are_refused_without_a_signing_key(rig_factory, source_bundle, v1,
                                                               tmp_path):
    _, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    rx = receiver("tcp://127.0.0.1:*", tmp_path / "consolidator.db")
    try:
        rig = rig_factory(v1, tmp_path, rx.endpoint)
        wait_for(lambda: rx.peers, 10.0, "the node's HELLO at the consolidator")
        signed = copy_bundle(source_bundle, tmp_path / "v2", model_version=2)
        sign_bundle(signed, key)
        rx.push_bundle(push_frame(signed))
        level, message, values = wait_for(
            lambda: (s := rig.status("bundle push"))[2].get("rejected_unconfigured") == "1"
            and s, 10.0, "the push refused for want of a key")
        assert level == WARN and values["configured"] == "false", message
        with rig.lock:
            assert rig.activations and rig.activations[-1]["bundle_version"] == 1
        assert not list((tmp_path / "bundles").glob("v*")), "an unverified bundle was installed"
    finally:
        rx.stop()


def test_an_unauthorised_curve_key_is_an_error_in_diagnostics(rig_factory, v1, tmp_path):
    from thinkmem_ros.link.security import write_curve_keypair

    server_pub, server_secret = write_curve_keypair(tmp_path / "keys", "server")
    _, robot_secret = write_curve_keypair(tmp_path / "keys", "robot")
    allowed_pub, _ = write_curve_keypair(tmp_path / "keys", "someone_else")
    rx = open_receiver(ReceiverConfig(
        bind="tcp://127.0.0.1:*", db_path=tmp_path / "c.db", curve="on",
        server_secret_file=server_secret, allowed_clients=allowed_pub, poll_s=0.02)).start()
    try:
        rig = rig_factory(v1, tmp_path, rx.endpoint, server_public_key=str(server_pub),
                          client_secret_key=str(robot_secret))
        level, message, values = wait_for(
            lambda: (s := rig.status("shipping"))[0] == ERROR and s, 10.0,
            "an ERROR shipping status for the refused key")
        assert "CURVE" in message and int(values["auth_failures"]) >= 1
        assert values["curve"] == "true" and values["connected"] == "false"
        assert not stored(tmp_path / "c.db")
    finally:
        rx.stop()
