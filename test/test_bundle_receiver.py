"""Robot-side bundle receiver: only signed, hash-matching, strictly newer bundles get in."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import copy_bundle

from thinkmem_ros.consolidator.publish import push_frame
from thinkmem_ros.link.protocol import decode_frame
from thinkmem_ros.link.security import sign_bundle, write_signing_keypair
from thinkmem_ros.policy.bundle import load_bundle, write_bundle
from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def keys(tmp_path):
    good = write_signing_keypair(tmp_path / "keys", "consolidator")
    evil = write_signing_keypair(tmp_path / "keys", "evil")
    return {"pub": good[0], "key": good[1], "evil": evil[1]}


def signed(source, folder, version, key, *, onnx_suffix=b""):
    """A signed bundle folder at ``version`` (optionally with different ONNX bytes)."""
    bundle = load_bundle(source)
    if onnx_suffix:
        manifest = bundle.manifest
        manifest.model_version, manifest.created_at = version, ""
        write_bundle(folder, bundle.onnx_path.read_bytes() + onnx_suffix, manifest)
    else:
        copy_bundle(source, folder, model_version=version)
    if key is not None:
        sign_bundle(folder, key)
    return folder


def body_of(folder):
    return decode_frame(push_frame(folder)).body


@pytest.fixture
def receiver(tmp_path, keys):
    installed = []
    rx = BundleReceiver(BundleReceiverConfig(tmp_path / "robot", keys["pub"], current_version=1),
                        on_install=installed.append)
    rx.installed_paths = installed
    return rx


def test_accepts_a_newer_signed_bundle_atomically(source_bundle, tmp_path, keys, receiver):
    folder = signed(source_bundle, tmp_path / "pub2", 2, keys["key"])
    path = receiver.handle_push(body_of(folder))
    assert path == tmp_path / "robot" / "v000002"
    assert receiver.installed_paths == [path]
    assert load_bundle(path).version == 2 and receiver.installed() == path
    assert (tmp_path / "robot" / "current").resolve() == path
    assert receiver.stats()["accepted"] == 1 and receiver.stats()["running_version"] == 2
    assert not list((tmp_path / "robot").glob(".incoming-*"))


@pytest.mark.parametrize("attack, counter", [
    ("bad_signature", "rejected_signature"),
    ("tampered_onnx", "rejected_hash"),
    ("unsigned", "rejected_unsigned"),
    ("older", "rejected_version"),
    ("equal_other_bytes", "rejected_version"),
    ("malformed", "rejected_malformed"),
    ("version_mismatch", "rejected_version"),
])
def test_refuses_and_keeps_the_running_bundle(source_bundle, tmp_path, keys, receiver, caplog,
                                              attack, counter):
    good = signed(source_bundle, tmp_path / "pub3", 3, keys["key"])
    assert receiver.handle_push(body_of(good)) is not None
    running = receiver.installed()
    if attack == "bad_signature":
        body = body_of(signed(source_bundle, tmp_path / "x", 4, keys["evil"]))
    elif attack == "tampered_onnx":
        body = body_of(signed(source_bundle, tmp_path / "x", 4, keys["key"]))
        body["onnx"] = body["onnx"][:-1] + bytes([body["onnx"][-1] ^ 1])
    elif attack == "unsigned":
        body = body_of(signed(source_bundle, tmp_path / "x", 4, keys["key"]))
        body["signature"] = b""
    elif attack == "older":
        body = body_of(signed(source_bundle, tmp_path / "x", 2, keys["key"]))
    elif attack == "equal_other_bytes":
        body = body_of(signed(source_bundle, tmp_path / "x", 3, keys["key"], onnx_suffix=b"\0"))
    elif attack == "malformed":
        body = {"version": "4", "manifest": b"{}", "onnx": b"", "signature": b""}
    else:  # a signed v2 manifest replayed in a frame that claims v4
        body = body_of(signed(source_bundle, tmp_path / "x", 2, keys["key"]))
        body["version"] = 4
    installs = len(receiver.installed_paths)
    with caplog.at_level(logging.WARNING, logger="thinkmem_ros.robot.bundle_receiver"):
        assert receiver.handle_push(body) is None
    stats = receiver.stats()
    assert stats[counter] == 1, stats
    assert stats["running_version"] == 3 and receiver.installed() == running
    assert len(receiver.installed_paths) == installs
    assert "REFUSED" in caplog.text and stats["last_reason"].startswith(counter[9:])
    assert sorted(p.name for p in (tmp_path / "robot").iterdir()) == ["current", "v000003"]


def test_replay_of_running_bundle_is_ignored_and_restart_keeps_the_floor(
        source_bundle, tmp_path, keys, receiver):
    body = body_of(signed(source_bundle, tmp_path / "pub2", 2, keys["key"]))
    assert receiver.handle_push(body) is not None
    assert receiver.handle_push(body) is None
    assert receiver.stats()["replayed"] == 1 and receiver.stats()["accepted"] == 1
    # a restarted robot (config still says v1) must not accept v1 or replays below v2
    again = BundleReceiver(BundleReceiverConfig(tmp_path / "robot", keys["pub"],
                                                current_version=1))
    assert again.stats()["running_version"] == 2
    old = body_of(signed(source_bundle, tmp_path / "pub1", 1, keys["key"]))
    assert again.handle_push(old) is None and again.stats()["rejected_version"] == 1


def test_keeps_only_the_newest_versions(source_bundle, tmp_path, keys):
    rx = BundleReceiver(BundleReceiverConfig(tmp_path / "robot", keys["pub"], keep=2))
    for version in (2, 3, 4):
        rx.handle_push(body_of(signed(source_bundle, tmp_path / f"p{version}", version,
                                      keys["key"])))
    assert sorted(p.name for p in (tmp_path / "robot").iterdir()) == [
        "current", "v000003", "v000004"]


def test_config_is_validated(tmp_path, keys):
    with pytest.raises(ValueError, match="current_version"):
        BundleReceiverConfig(tmp_path, keys["pub"], current_version=-1)
    with pytest.raises(ValueError, match="keep"):
        BundleReceiverConfig(tmp_path, keys["pub"], keep=0)
    with pytest.raises(RuntimeError, match="public key"):
        BundleReceiverConfig(tmp_path, tmp_path / "missing.sign.pub")


def test_robot_side_does_not_import_torch():
    code = ("import sys, thinkmem_ros.robot.bundle_receiver, thinkmem_ros.link.shipper; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60).returncode == 0


def test_a_full_disk_while_installing_is_a_counted_rejection(source_bundle, tmp_path):
    """Writes fail mid-install (a real EFBIG under RLIMIT_FSIZE): refused and counted."""
    from thinkmem_ros.bench.fault_probes_node import ProbeContext, probe_bundle_push_disk_full

    record = probe_bundle_push_disk_full(ProbeContext(tmp_path / "probe", bundle=source_bundle))
    assert not record["crashed"] and record["ok"], record["detail"]
    assert "rejected_install=1" in record["detail"]


def test_disk_errors_on_metadata_operations_are_refusals_too(source_bundle, tmp_path, keys,
                                                             receiver, monkeypatch):
    """ENOSPC can hit a mkdir or a symlink as well as a write; none may escape."""
    import errno
    import os

    folder = signed(source_bundle, tmp_path / "pub2", 2, keys["key"])
    body = body_of(folder)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    for target, name in ((os, "symlink"), (os, "mkdir")):
        with monkeypatch.context() as patch:
            patch.setattr(target, name, full)
            assert receiver.handle_push(body) is None
        assert "No space left" in receiver.last_reason
    assert receiver.stats()["rejected_install"] == 2 and receiver.installed_paths == []
    assert receiver.handle_push(body) is not None  # space again: the same push installs
