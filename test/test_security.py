import argparse
import logging
import time

import numpy as np
import pytest

from thinkmem_ros.commands import keys as keys_cmd
from thinkmem_ros.consolidator.ingest import open_receiver
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.link.receiver import ReceiverConfig
from thinkmem_ros.link.security import (
    SecurityError,
    SignatureError,
    curve_enabled,
    is_loopback,
    load_curve_keypair,
    load_signing_key,
    sign_bundle,
    verify_bundle_signature,
    verify_signed_bundle,
    write_signing_keypair,
)
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig
from thinkmem_ros.link.sockets import TransportError
from thinkmem_ros.policy.bundle import BundleError, BundleManifest, write_bundle


@pytest.fixture(scope="module")
def keydir(tmp_path_factory):
    out = tmp_path_factory.mktemp("keys")
    args = argparse.Namespace(out=str(out), name=["server", "robot", "intruder"],
                              sign_name="signer", no_sign=False, force=False)
    assert keys_cmd.main(args) == 0
    allowed = out / "allowed"
    allowed.mkdir()
    (allowed / "robot.key").write_bytes((out / "robot.key").read_bytes())
    return out


def test_keys_command_perms_and_no_overwrite(keydir, capsys):
    for secret in ("server.key_secret", "robot.key_secret", "signer.sign.key"):
        assert (keydir / secret).stat().st_mode & 0o777 == 0o600
    assert (keydir / "server.key").stat().st_mode & 0o777 == 0o644
    public, secret = load_curve_keypair(keydir / "robot.key_secret")
    assert len(public) == 40 and len(secret) == 40
    args = argparse.Namespace(out=str(keydir), name=["server"], sign_name=None,
                              no_sign=True, force=False)
    assert keys_cmd.main(args) == 2
    assert load_curve_keypair(keydir / "server.key_secret")[0] != public


@pytest.mark.parametrize("mode, who", [(0o620, "group"), (0o602, "others"),
                                       (0o666, "group and others")])
@pytest.mark.parametrize("name", ["signer.sign.key", "robot.key_secret"])
def test_a_secret_key_others_may_write_is_refused_naming_the_file(tmp_path, keydir, name,
                                                                 mode, who):
    """It was used without a word: whoever may write it can swap in a key of their own."""
    load = load_signing_key if name.endswith(".sign.key") else load_curve_keypair
    copy = tmp_path / name
    copy.write_bytes((keydir / name).read_bytes())
    copy.chmod(mode)
    with pytest.raises(SecurityError, match=f"writable by {who} ") as refused:
        load(copy)
    assert str(copy) in str(refused.value) and "chmod 600" in str(refused.value)
    copy.chmod(0o640)  # readable by its group: not a way to replace it
    load(copy)


def test_curve_policy():
    assert is_loopback("tcp://127.0.0.1:5") and is_loopback("ipc:///tmp/x")
    assert not is_loopback("tcp://10.0.0.2:5") and not is_loopback("tcp://*:5")
    assert curve_enabled("auto", "tcp://127.0.0.1:5", have_keys=False) is False
    assert curve_enabled("auto", "tcp://127.0.0.1:5", have_keys=True) is True
    with pytest.raises(SecurityError, match="no keys"):
        curve_enabled("auto", "tcp://10.1.2.3:5", have_keys=False)
    with pytest.raises(ValueError, match="curve"):
        curve_enabled("maybe", "tcp://127.0.0.1:5", have_keys=True)
    with pytest.raises(SecurityError):
        ShipperConfig(endpoint="tcp://192.168.1.9:5755", robot_id="r", spool_path="x")


def _bundle(folder, version=3):
    manifest = BundleManifest(
        model_version=version, sha256="", labels=["trend"], signals=["t"], window=4,
        frame_rate_hz=10.0, normalisation={"mean": [0.0], "std": [1.0]},
        thresholds={"trend": 0.5})
    return write_bundle(folder, b"fake onnx bytes", manifest)


def test_bundle_signature_roundtrip_and_tampering(tmp_path, keydir):
    bundle = _bundle(tmp_path / "b")
    sign_bundle(bundle.path, keydir / "signer.sign.key")
    assert (bundle.path / "bundle.sig").stat().st_size == 64
    assert verify_bundle_signature(bundle.path, keydir / "signer.sign.pub").model_version == 3
    assert verify_signed_bundle(bundle.path, keydir / "signer.sign.pub").version == 3
    # wrong key
    other, _ = write_signing_keypair(tmp_path / "k", "other")
    with pytest.raises(SignatureError, match="does not verify"):
        verify_bundle_signature(bundle.path, other)
    # tampered manifest (version bumped by an attacker)
    text = (bundle.path / "bundle.json").read_text()
    (bundle.path / "bundle.json").write_text(text.replace('"model_version": 3',
                                                          '"model_version": 4'))
    with pytest.raises(SignatureError):
        verify_bundle_signature(bundle.path, keydir / "signer.sign.pub")
    assert issubclass(SignatureError, BundleError)


def test_a_signed_manifest_that_gives_a_key_twice_does_not_verify(tmp_path, keydir):
    """Signed bytes read last-wins here while every loader refuses them: one reading."""
    bundle = _bundle(tmp_path / "b")
    text = (bundle.path / "bundle.json").read_text()
    (bundle.path / "bundle.json").write_text(
        text.replace('"model_version": 3', '"model_version": 9, "model_version": 3', 1))
    sign_bundle(bundle.path, keydir / "signer.sign.key")
    with pytest.raises(SignatureError, match="signed but unparsable.*'model_version' appears "
                                             "twice"):
        verify_bundle_signature(bundle.path, keydir / "signer.sign.pub")


def test_signed_manifest_but_swapped_onnx_fails_hash(tmp_path, keydir):
    bundle = _bundle(tmp_path / "b")
    sign_bundle(bundle.path, keydir / "signer.sign.key")
    (bundle.path / "policy.onnx").write_bytes(b"evil")
    verify_bundle_signature(bundle.path, keydir / "signer.sign.pub")  # manifest still fine
    with pytest.raises(BundleError, match="sha256"):
        verify_signed_bundle(bundle.path, keydir / "signer.sign.pub")


def test_missing_or_short_signature(tmp_path, keydir):
    bundle = _bundle(tmp_path / "b")
    with pytest.raises(SignatureError, match="cannot read"):
        verify_bundle_signature(bundle.path, keydir / "signer.sign.pub")
    (bundle.path / "bundle.sig").write_bytes(b"x" * 10)
    with pytest.raises(SignatureError, match="expected 64"):
        verify_bundle_signature(bundle.path, keydir / "signer.sign.pub")


def _exp(i):
    return Experience(robot_id="robot", episode_id="e", stamp=float(i),
                      window=np.zeros((4, 2)), labels=["trend"], probabilities=[0.5],
                      bundle_version=1)


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_curve_authorised_client_delivers(tmp_path, keydir):
    cfg = ReceiverConfig(bind="tcp://127.0.0.1:*", db_path=tmp_path / "db.sqlite",
                         curve="on", server_secret_file=keydir / "server.key_secret",
                         allowed_clients=keydir / "allowed")
    with open_receiver(cfg) as receiver:
        shipper_cfg = ShipperConfig(
            endpoint=receiver.endpoint, robot_id="robot", spool_path=tmp_path / "sp.db",
            curve="on", server_public_key=keydir / "server.key",
            client_secret_file=keydir / "robot.key_secret")
        with ExperienceShipper(shipper_cfg) as shipper:
            for i in range(20):
                shipper.ship(_exp(i))
            assert shipper.flush(10.0)
            assert shipper.stats()["auth_failures"] == 0
    with ExperienceStore(tmp_path / "db.sqlite") as store:
        assert store.count("robot") == 20


def test_unauthorised_client_is_refused_and_both_sides_see_it(tmp_path, keydir, caplog):
    caplog.set_level(logging.WARNING)
    cfg = ReceiverConfig(bind="tcp://127.0.0.1:*", db_path=tmp_path / "db.sqlite",
                         curve="on", server_secret_file=keydir / "server.key_secret",
                         allowed_clients=keydir / "allowed")
    with open_receiver(cfg) as receiver:
        shipper_cfg = ShipperConfig(
            endpoint=receiver.endpoint, robot_id="robot", spool_path=tmp_path / "sp.db",
            curve="on", server_public_key=keydir / "server.key",
            client_secret_file=keydir / "intruder.key_secret")
        with ExperienceShipper(shipper_cfg) as shipper:
            shipper.ship(_exp(0))
            assert _wait(lambda: shipper.stats()["auth_failures"] >= 1)
            assert _wait(lambda: receiver._allow.denied >= 1)
            # the gauges are published by the shipper's thread after each step: wait for
            # the refused experience to show in the spool (it must, and stay unacked)
            assert _wait(lambda: shipper.stats()["spool_rows"] == 1)
            stats = shipper.stats()
            assert stats["acked"] == 0 and stats["spool_rows"] == 1 and not stats["connected"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("REFUSED CURVE client" in m for m in messages)  # server side
    assert any("REFUSED our CURVE key" in m for m in messages)  # client side
    with ExperienceStore(tmp_path / "db.sqlite") as store:
        assert store.count() == 0


@pytest.mark.parametrize("bad", ["missing", "garbage"])
def test_unreadable_client_key_fails_start_at_once_naming_the_file(tmp_path, keydir, bad):
    secret = tmp_path / "robot.key_secret"
    if bad == "garbage":
        secret.write_text("not a certificate\n")
    cfg = ShipperConfig(endpoint="tcp://127.0.0.1:9", robot_id="robot",
                        spool_path=tmp_path / "sp.db", curve="on",
                        server_public_key=keydir / "server.key", client_secret_file=secret)
    shipper = ExperienceShipper(cfg)
    began = time.monotonic()
    with pytest.raises(TransportError, match=str(secret)):
        shipper.start(timeout_s=30.0)
    assert time.monotonic() - began < 5.0  # not the start timeout
    assert not shipper.alive()
    cfg.server_public_key = tmp_path / "nowhere.key"
    cfg.client_secret_file = keydir / "robot.key_secret"
    with pytest.raises(TransportError, match="nowhere.key"):
        ExperienceShipper(cfg).start(timeout_s=30.0)


def test_refusals_are_counted_without_any_frame_arriving(tmp_path, keydir):
    cfg = ReceiverConfig(bind="tcp://127.0.0.1:*", db_path=tmp_path / "db.sqlite",
                         curve="on", server_secret_file=keydir / "server.key_secret",
                         allowed_clients=keydir / "allowed", poll_s=0.05)
    with open_receiver(cfg) as receiver:
        shipper_cfg = ShipperConfig(
            endpoint=receiver.endpoint, robot_id="robot", spool_path=tmp_path / "sp.db",
            curve="on", server_public_key=keydir / "server.key",
            client_secret_file=keydir / "intruder.key_secret")
        with ExperienceShipper(shipper_cfg):  # ships nothing: only the handshake happens
            assert _wait(lambda: receiver.stats.auth_refused >= 1)
        assert receiver.stats.frames == 0


def test_alive_follows_the_shipper_thread(tmp_path):
    cfg = ShipperConfig(endpoint="tcp://127.0.0.1:9", robot_id="robot",
                        spool_path=tmp_path / "sp.db", curve="off")
    shipper = ExperienceShipper(cfg)
    assert not shipper.alive()
    shipper.start()
    assert shipper.alive()
    shipper.close()
    assert not shipper.alive()


def test_anonymous_routing_ids_cannot_be_predicted():
    """libzmq numbers anonymous peers from an unseeded rand(): every process's first ROUTER
    gave the same id, so a peer could claim the next ids and make the next genuine
    connection abort the process. Two fresh processes must now give different ids."""
    import subprocess
    import sys

    code = ("import zmq\nfrom thinkmem_ros.link.sockets import context\nctx = context()\n"
            "r = ctx.socket(zmq.ROUTER); r.bind('tcp://127.0.0.1:*')\n"
            "d = ctx.socket(zmq.DEALER); d.connect(r.getsockopt_string(zmq.LAST_ENDPOINT))\n"
            "d.send(b'x'); print(r.recv_multipart()[0].hex())\n")
    ids = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip() for _ in range(3)}
    assert len(ids) == 3 and "006b8b4567" not in ids, ids
