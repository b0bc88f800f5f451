"""Value/memctl artefacts travel in BUNDLE_PUSH; robots install them only as signed."""

import hashlib
import logging

import numpy as np
import pytest
from conftest import copy_bundle
from waiting import wait

from thinkmem_ros.consolidator.ingest import open_receiver
from thinkmem_ros.consolidator.publish import PublishConfig, Publisher, PublishError, push_frame
from thinkmem_ros.link import protocol
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.link.protocol import Kind, ProtocolError, decode_frame
from thinkmem_ros.link.receiver import ReceiverConfig
from thinkmem_ros.link.security import sign_bundle, write_signing_keypair
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig
from thinkmem_ros.policy.bundle import load_bundle
from thinkmem_ros.policy.value_table import ValueConfig, ValueTable
from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig
from thinkmem_ros.robot.thinking_gates import attach_artefacts, load_gate_artefacts


@pytest.fixture
def keys(tmp_path):
    return write_signing_keypair(tmp_path / "keys", "consolidator")  # (pub, key)


def with_values(source, folder, version, seed=0):
    """A bundle at ``version`` carrying a learned value table listed in its manifest."""
    copy_bundle(source, folder, model_version=version)
    from thinkmem_ros.policy.runtime import PolicyRuntime

    manifest = load_bundle(folder).manifest
    dim = PolicyRuntime(folder).embedding_dim
    table = ValueTable(list(manifest.labels), dim, ValueConfig(gamma=0.0, forgetting=False))
    rng = np.random.default_rng(seed)
    for _ in range(5):
        table.update(table.assign(rng.normal(size=dim)), manifest.labels[0], 1.0)
    table.save(folder.parent / f"{folder.name}-arts")
    listed = attach_artefacts(folder, folder.parent / f"{folder.name}-arts")
    assert set(listed) == {"values.npz", "values.json"}
    return folder


@pytest.fixture
def robot(tmp_path, keys):
    rx = BundleReceiver(BundleReceiverConfig(tmp_path / "robot", keys[0], current_version=1))
    return rx


def signed_body(source, tmp_path, keys, version):
    folder = with_values(source, tmp_path / f"b{version}", version)
    sign_bundle(folder, keys[1])
    return folder, decode_frame(push_frame(folder)).body


# ------------------------------------------------------------------ protocol


def test_frame_carries_artefacts_and_old_frames_still_decode():
    frame = protocol.bundle_push(2, b"m", b"o", b"s", {"values.npz": b"\0\1"})
    assert decode_frame(frame).body["artefacts"] == {"values.npz": b"\0\1"}
    plain = decode_frame(protocol.bundle_push(2, b"m", b"o", b"s")).body
    assert "artefacts" not in plain and plain["onnx"] == b"o"


@pytest.mark.parametrize("artefacts, match", [
    ({"../evil.npz": b"x"}, "plain file name"),
    ({"sub/values.npz": b"x"}, "plain file name"),
    ({"..": b"x"}, "plain file name"),
    ({".hidden": b"x"}, "plain file name"),
    ({"bundle.sig": b"x"}, "plain file name"),
    ({"v" * 65: b"x"}, "plain file name"),
    ({"values.npz": "text"}, "expected bytes"),
    ({f"f{i}": b"" for i in range(protocol.MAX_ARTEFACTS + 1)}, "exceed"),
    ([b"x"], "expected map"),
])
def test_unsafe_artefact_maps_are_refused_both_ways(artefacts, match):
    with pytest.raises(ProtocolError, match=match):
        protocol.encode_frame(Kind.BUNDLE_PUSH, {"version": 2, "artefacts": artefacts})
    raw = b"TM\x01\x05" + protocol.msgpack.packb({"version": 2, "artefacts": artefacts},
                                                 use_bin_type=True)
    with pytest.raises(ProtocolError, match=match):
        decode_frame(raw)


# ------------------------------------------------------------------ receiver


def test_installs_the_artefacts_byte_identical(source_bundle, tmp_path, keys, robot):
    folder, body = signed_body(source_bundle, tmp_path, keys, 2)
    assert set(body["artefacts"]) == {"values.npz", "values.json"}
    path = robot.handle_push(body)
    assert path is not None and robot.stats()["accepted"] == 1
    for name in ("values.npz", "values.json"):
        assert (path / name).read_bytes() == (folder / name).read_bytes()
    loaded = load_gate_artefacts(path, load_bundle(path).manifest.extras)
    assert loaded.table is not None and not loaded.errors
    assert sorted(p.name for p in path.iterdir()) == [
        "bundle.json", "bundle.sig", "policy.onnx", "values.json", "values.npz"]


@pytest.mark.parametrize("attack", ["tampered", "missing", "unlisted", "traversal"])
def test_bad_artefacts_are_refused_and_the_running_bundle_kept(
        source_bundle, tmp_path, keys, robot, caplog, attack):
    assert robot.handle_push(signed_body(source_bundle, tmp_path, keys, 2)[1]) is not None
    running = robot.installed()
    _, body = signed_body(source_bundle, tmp_path, keys, 3)
    if attack == "tampered":  # bytes changed, the signed manifest's hash left as it was
        data = body["artefacts"]["values.npz"]
        body["artefacts"]["values.npz"] = data[:-1] + bytes([data[-1] ^ 1])
    elif attack == "missing":  # as an older consolidator would push it
        del body["artefacts"]["values.json"]
    elif attack == "unlisted":
        body["artefacts"]["memctl.npz"] = b"not signed"
    else:  # never reaches the transport's decoder intact; the receiver must not trust that
        body["artefacts"]["../../escaped.npz"] = b"x"
    with caplog.at_level(logging.WARNING, logger="thinkmem_ros.robot.bundle_receiver"):
        assert robot.handle_push(body) is None
    stats = robot.stats()
    assert stats["rejected_artefact"] == 1 and stats["running_version"] == 2, stats
    assert stats["last_reason"].startswith("artefact") and "REFUSED" in caplog.text
    assert robot.installed() == running
    assert sorted(p.name for p in (tmp_path / "robot").iterdir()) == ["current", "v000002"]
    assert not list(tmp_path.rglob("escaped.npz"))


def test_publish_refuses_a_corrupted_listed_artefact(source_bundle, tmp_path, keys):
    folder, _ = signed_body(source_bundle, tmp_path, keys, 2)
    (folder / "values.json").write_bytes(b"{}")
    with pytest.raises(PublishError, match="values.json"):
        push_frame(folder)


# ------------------------------------------------------------------ end to end, real ZeroMQ


def test_published_values_reach_a_robot_over_zeromq(source_bundle, tmp_path, keys):
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    publisher = Publisher(PublishConfig(tmp_path / "pub", keys[1]), initial)
    staged = load_bundle(with_values(source_bundle, tmp_path / "staged", 2))
    rx = open_receiver(ReceiverConfig(bind="tcp://127.0.0.1:*", db_path=tmp_path / "s.db",
                                           max_frame_bytes=1 << 20, poll_s=0.02)).start()
    installed: list = []
    bundles = BundleReceiver(BundleReceiverConfig(tmp_path / "robot", keys[0],
                                                  current_version=1),
                             on_install=installed.append)
    shipper = ExperienceShipper(ShipperConfig(
        endpoint=rx.endpoint, robot_id="r1", spool_path=tmp_path / "spool.db",
        on_bundle_push=bundles.handle_push)).start()
    try:
        assert shipper.ship(Experience(robot_id="r1", episode_id="e", stamp=0.0,
                                       window=np.zeros((4, 3), np.float32), labels=["trend"],
                                       probabilities=[0.5], bundle_version=1))
        assert shipper.flush(10.0) and wait(lambda: len(rx.peers) == 1)
        pub = publisher.publish(staged, push=rx.push_bundle)
        assert pub.pushed_to == 1
        assert wait(lambda: installed), bundles.stats()
    finally:
        shipper.close()
        rx.stop()
    path = installed[0]
    listed = load_bundle(path).manifest.extras["artefacts"]
    for name, sha in listed.items():
        data = (path / name).read_bytes()
        assert data == (staged.path / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha
    assert bundles.stats()["rejected_artefact"] == 0
    assert load_gate_artefacts(path, load_bundle(path).manifest.extras).table is not None
