"""Rotating the bundle-signing key by endorsements, and pinning a robot to one version.

Real Ed25519 keys made by the real ``thinkmem keys`` command, real bundle folders (copies of
the shipped bundle), the real publisher, and pushes over ZeroMQ into the robot's
``BundleReceiver`` through an ``ExperienceShipper``: the path a robot in the field takes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from conftest import copy_bundle
from waiting import wait

from thinkmem_ros import cli
from thinkmem_ros.consolidator.ingest import open_receiver
from thinkmem_ros.consolidator.publish import PublishConfig, Publisher, push_frame
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.link.key_endorsement import (
    ENDORSEMENTS_KEY,
    EndorsementError,
    KeyEndorsement,
    endorse,
    load_chain,
    public_hex,
)
from thinkmem_ros.link.protocol import decode_frame
from thinkmem_ros.link.receiver import ReceiverConfig
from thinkmem_ros.link.security import load_signing_key, sign_bundle
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig
from thinkmem_ros.policy.bundle import MANIFEST, load_bundle, read_manifest
from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig
from thinkmem_ros.robot.node_config import NodeConfig
from thinkmem_ros.robot.shipping_link import newer_installed_bundle
from thinkmem_ros.robot.trust_store import TRUST_FILE, TrustStoreError


def thinkmem(*argv: str) -> int:
    return cli.main(["keys", *map(str, argv)])


@pytest.fixture
def keys(tmp_path):
    """K1 (the fleet's first key), K2 rotated in by ``--rotate``, K3 an outsider's."""
    assert thinkmem("--out", tmp_path / "k1", "--name", "consolidator") == 0
    assert thinkmem("--rotate", tmp_path / "k1" / "consolidator.sign.key",
                    "--out", tmp_path / "k2", "--sign-name", "signer2") == 0
    assert thinkmem("--out", tmp_path / "k3", "--name", "outsider") == 0
    k = {"pub1": tmp_path / "k1" / "consolidator.sign.pub",
         "key1": tmp_path / "k1" / "consolidator.sign.key",
         "pub2": tmp_path / "k2" / "signer2.sign.pub",
         "key2": tmp_path / "k2" / "signer2.sign.key",
         "key3": tmp_path / "k3" / "outsider.sign.key",
         "chain": tmp_path / "k2" / "key_chain.json"}
    return k


def signed(source, folder, version, key, chain=None):
    """A bundle folder at ``version``, its manifest carrying ``chain``, signed with ``key``."""
    copy_bundle(source, folder, model_version=version)
    if chain is not None:
        manifest = json.loads((folder / MANIFEST).read_text())
        manifest["extras"][ENDORSEMENTS_KEY] = [
            e.to_dict() if isinstance(e, KeyEndorsement) else e for e in chain]
        (folder / MANIFEST).write_text(json.dumps(manifest, sort_keys=True, indent=2))
    sign_bundle(folder, key)
    return folder


def judged(receiver: BundleReceiver) -> int:
    """Pushes the receiver has finished with (``pushes`` counts from the start of one)."""
    stats = receiver.stats()
    return stats["accepted"] + stats["replayed"] + sum(
        v for k, v in stats.items() if k.startswith("rejected_"))


class Fleet:
    """A consolidator-side receiver and robots connected to it by ExperienceShipper."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.rx = open_receiver(ReceiverConfig(bind="tcp://127.0.0.1:*",
                                               db_path=tmp_path / "store.db",
                                               max_frame_bytes=1 << 22, poll_s=0.02)).start()
        self.shippers: list[ExperienceShipper] = []
        self.robots: list[BundleReceiver] = []
        self.pushed = False
        self.closed = False

    def robot(self, name: str, trusted, pin: int = 0, version: int = 1) -> BundleReceiver:
        receiver = BundleReceiver(BundleReceiverConfig(self.tmp / name, trusted,
                                                       current_version=version,
                                                       pin_version=pin))
        shipper = ExperienceShipper(ShipperConfig(
            endpoint=self.rx.endpoint, robot_id=name, spool_path=self.tmp / f"{name}.db",
            on_bundle_push=receiver.handle_push)).start()
        self.shippers.append(shipper)
        self.robots.append(receiver)
        experience = Experience(robot_id=name, episode_id="e", stamp=0.0,
                                window=np.zeros((4, 3), np.float32), labels=["trend"],
                                probabilities=[0.5], bundle_version=1)
        assert shipper.ship(experience) and shipper.flush(10.0)
        assert wait(lambda: len(self.rx.peers) == len(self.shippers))
        if self.pushed:  # a robot that joins late gets the latest push on HELLO
            assert wait(lambda: judged(receiver) == 1), receiver.stats()
        return receiver

    def push(self, frame: bytes) -> None:
        """Send one BUNDLE_PUSH to every robot and wait until each has judged it."""
        before = [judged(r) for r in self.robots]
        assert self.rx.push_bundle(frame) == len(self.robots)
        self.pushed = True
        for robot, count in zip(self.robots, before, strict=True):
            assert wait(lambda r=robot, c=count: judged(r) > c), robot.stats()

    def push_counted(self, frame: bytes) -> int:
        """The publisher's ``push`` callback: push, wait for every verdict, say how many."""
        self.push(frame)
        return len(self.robots)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for shipper in self.shippers:
            shipper.close()
        self.rx.stop()


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path)
    yield f
    f.close()


def hexes(receiver: BundleReceiver) -> tuple[str, ...]:
    return receiver.trust.trust.keys


def test_rotation_end_to_end_revocation_and_restart(fleet, keys, source_bundle, tmp_path):
    robot = fleet.robot("r1", keys["pub1"])
    k1, k2 = public_hex(keys["pub1"]), public_hex(keys["pub2"])
    assert hexes(robot) == (k1,) and not (tmp_path / "r1" / TRUST_FILE).exists()

    # the first bundle of the new key WITHOUT its endorsement: refused, nothing learnt
    fleet.push(push_frame(signed(source_bundle, tmp_path / "bare", 2, keys["key2"])))
    stats = robot.stats()
    assert stats["accepted"] == 0 and stats["rejected_signature"] == 1, stats
    assert hexes(robot) == (k1,)

    # the real publisher, rotated: new key plus the chain `thinkmem keys --rotate` wrote
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    publisher = Publisher(PublishConfig(tmp_path / "pub", keys["key2"],
                                        endorsements=keys["chain"]), initial)
    staged = load_bundle(copy_bundle(source_bundle, tmp_path / "s2", model_version=2))
    publication = publisher.publish(staged, push=fleet.push_counted)
    assert publication.pushed_to == 1
    stats = robot.stats()
    assert stats["accepted"] == 1 and stats["running_version"] == 2, stats
    assert stats["endorsements_applied"] == 1 and stats["trust_serial"] == 1
    assert hexes(robot) == (k1, k2)
    saved = json.loads((tmp_path / "r1" / TRUST_FILE).read_text())
    assert saved["keys"] == [k1, k2] and saved["serial"] == 1

    # K1 retired, signed by K2; the publisher restarts with the longer chain and still
    # reads its own history (v2, signed by K2) to number the next version
    assert thinkmem("--revoke", keys["pub1"], "--signing-key", keys["key2"],
                    "--out", tmp_path / "k2") == 0
    assert [e.action for e in load_chain(keys["chain"])] == ["add", "revoke"]
    publisher = Publisher(PublishConfig(tmp_path / "pub", keys["key2"],
                                        endorsements=keys["chain"]), initial)
    assert publisher.next_version() == 3
    staged = load_bundle(copy_bundle(source_bundle, tmp_path / "s3", model_version=3))
    publisher.publish(staged, push=fleet.push_counted)
    stats = robot.stats()
    assert stats["accepted"] == 2 and stats["running_version"] == 3, stats
    assert stats["endorsements_applied"] == 2 and hexes(robot) == (k2,)

    # after the revocation a bundle signed by K1 is refused (even carrying the old chain)
    old_chain = load_chain(keys["chain"])[:1]
    fleet.push(push_frame(signed(source_bundle, tmp_path / "old", 4, keys["key1"],
                                 chain=old_chain)))
    stats = robot.stats()
    assert stats["rejected_signature"] == 2 and stats["running_version"] == 3, stats
    assert hexes(robot) == (k2,)

    # restart: the robot is still configured with K1, but the trust file wins
    fleet.close()
    again = BundleReceiver(BundleReceiverConfig(tmp_path / "r1", keys["pub1"],
                                                current_version=1))
    assert hexes(again) == (k2,) and again.version == 3 and again.trust.serial == 2
    assert again.handle_push(body(signed(source_bundle, tmp_path / "old5", 5,
                                         keys["key1"]))) is None
    assert again.stats()["rejected_signature"] == 1
    assert again.handle_push(body(signed(source_bundle, tmp_path / "new5", 5,
                                         keys["key2"]))) == tmp_path / "r1" / "v000005"


def body(folder: Path) -> dict:
    return decode_frame(push_frame(folder)).body


def test_endorsements_that_must_not_change_the_trust_list(fleet, keys, source_bundle,
                                                          tmp_path):
    robot = fleet.robot("r1", keys["pub1"])
    k1 = public_hex(keys["pub1"])
    key1, key3 = load_signing_key(keys["key1"]), load_signing_key(keys["key3"])
    k3 = public_hex(key3)

    # signed by a key the robot does not trust: skipped, K3's bundle refused
    forged = endorse(key3, key3.verify_key, "add", 1)
    fleet.push(push_frame(signed(source_bundle, tmp_path / "a", 2, keys["key3"], [forged])))
    stats = robot.stats()
    assert stats["endorsements_untrusted"] == 1 and stats["rejected_signature"] == 1, stats
    assert hexes(robot) == (k1,) and not (tmp_path / "r1" / TRUST_FILE).exists()

    # a genuine K1 endorsement of K2, edited to name K3 instead: the signature breaks
    genuine = load_chain(keys["chain"])[0].to_dict()
    tampered = {**genuine, "key": k3}
    fleet.push(push_frame(signed(source_bundle, tmp_path / "b", 2, keys["key3"], [tampered])))
    stats = robot.stats()
    assert stats["endorsements_refused"] == 1 and stats["rejected_signature"] == 2, stats
    assert hexes(robot) == (k1,) and robot.trust.serial == 0

    # a chain that adds K3 (serial 1) then revokes it (serial 2): applied in order
    add3 = endorse(key1, key3.verify_key, "add", 1)
    revoke3 = endorse(key1, key3.verify_key, "revoke", 2)
    fleet.push(push_frame(signed(source_bundle, tmp_path / "c", 2, keys["key1"],
                                 [revoke3, add3])))
    stats = robot.stats()
    assert stats["accepted"] == 1 and stats["endorsements_applied"] == 2, stats
    assert hexes(robot) == (k1,) and robot.trust.serial == 2

    # replaying the 'add K3' alone, or a fresh K1 'add K3' with a used serial: not applied
    fleet.push(push_frame(signed(source_bundle, tmp_path / "d", 3, keys["key3"], [add3])))
    rollback = endorse(key1, key3.verify_key, "add", 2)
    fleet.push(push_frame(signed(source_bundle, tmp_path / "e", 3, keys["key3"], [rollback])))
    stats = robot.stats()
    assert stats["rejected_signature"] == 4 and stats["endorsements_stale"] == 1, stats
    assert stats["endorsements_applied"] == 2 and hexes(robot) == (k1,)

    # a revoke that would leave no key is refused; K1 still signs
    suicide = endorse(key1, key1.verify_key, "revoke", 3)
    fleet.push(push_frame(signed(source_bundle, tmp_path / "f", 3, keys["key1"], [suicide])))
    stats = robot.stats()
    assert stats["endorsements_refused"] == 2 and stats["accepted"] == 2, stats
    assert hexes(robot) == (k1,) and robot.trust.serial == 2


def test_a_robot_flashed_with_the_new_key_follows_later_rotations(fleet, keys, source_bundle,
                                                                  tmp_path):
    """The chain's older links are unverifiable for it and skipped, not blocking."""
    assert thinkmem("--revoke", keys["pub1"], "--signing-key", keys["key2"],
                    "--out", tmp_path / "k2") == 0
    assert thinkmem("--rotate", keys["key2"], "--out", tmp_path / "k4",
                    "--sign-name", "signer4", "--chain", keys["chain"]) == 0
    chain = load_chain(keys["chain"])
    assert [e.serial for e in chain] == [1, 2, 3]
    robot = fleet.robot("fresh", keys["pub2"])
    fleet.push(push_frame(signed(source_bundle, tmp_path / "a", 2,
                                 tmp_path / "k4" / "signer4.sign.key", chain)))
    stats = robot.stats()
    assert stats["accepted"] == 1, stats
    assert stats["endorsements_untrusted"] == 1 and stats["endorsements_applied"] == 2
    assert hexes(robot) == (public_hex(keys["pub2"]),
                            public_hex(tmp_path / "k4" / "signer4.sign.pub"))


def test_pinned_robot_refuses_other_versions_and_starts_only_the_pin(fleet, keys,
                                                                     source_bundle, tmp_path,
                                                                     caplog):
    free = fleet.robot("free", keys["pub1"])
    for version in (2, 3, 4):
        fleet.push(push_frame(signed(source_bundle, tmp_path / f"b{version}", version,
                                     keys["key1"])))
    assert free.stats()["accepted"] == 3 and free.version == 4

    pinned = fleet.robot("pinned", keys["pub1"], pin=6)  # gets the latest (v4) on HELLO
    caplog.set_level(logging.WARNING)
    for version in (5, 6, 7):
        fleet.push(push_frame(signed(source_bundle, tmp_path / f"b{version}", version,
                                     keys["key1"])))
    stats = pinned.stats()
    assert stats["rejected_pinned"] == 3 and stats["accepted"] == 1, stats  # v4, v5, v7
    assert pinned.version == 6 and "pinned v6" in stats["last_reason"]
    assert any("pinned v6" in r.getMessage() for r in caplog.records)

    # at start: the free robot's bundles_dir holds v5..v7 (current v7); bundle_path is v1
    class Log:
        def __init__(self):
            self.lines = []

        def info(self, text):
            self.lines.append(text)

        error = warning = info

    v1 = copy_bundle(source_bundle, tmp_path / "v1", model_version=1)

    def start(pin: int, bundle_path: Path = v1) -> tuple[Path | None, list[str]]:
        log = Log()
        config = NodeConfig(bundle_path=str(bundle_path), bundles_dir=str(tmp_path / "free"),
                            pin_bundle_version=pin)
        return newer_installed_bundle(config, keys["pub1"], log), log.lines

    assert start(0)[0] == (tmp_path / "free" / "v000007").resolve()
    assert start(6)[0] == (tmp_path / "free" / "v000006").resolve()
    assert start(1)[0] is None  # bundle_path is the pinned version
    path, lines = start(2)  # pruned from disk: run bundle_path and say so
    assert path is None and any("pin_bundle_version 2" in line for line in lines), lines


@pytest.mark.parametrize("value", [-1, "3", 2.0, True])
def test_pin_parameter_is_validated(value):
    with pytest.raises(ValueError, match="pin_bundle_version"):
        NodeConfig(pin_bundle_version=value)


def test_restart_rebuilds_a_lost_trust_file_and_refuses_a_corrupt_one(keys, source_bundle,
                                                                      tmp_path):
    robot = BundleReceiver(BundleReceiverConfig(tmp_path / "r", keys["pub1"]))
    chain = load_chain(keys["chain"])
    folder = signed(source_bundle, tmp_path / "a", 2, keys["key2"], chain)
    assert robot.handle_push(body(folder)) is not None
    config = NodeConfig(bundle_path=str(copy_bundle(source_bundle, tmp_path / "v1",
                                                    model_version=1)),
                        bundles_dir=str(tmp_path / "r"))
    quiet = type("Quiet", (), {"info": print, "error": print})()
    (tmp_path / "r" / TRUST_FILE).unlink()  # lost: the installed manifest's chain restores it
    installed = newer_installed_bundle(config, keys["pub1"], quiet)
    assert installed == (tmp_path / "r" / "v000002").resolve()
    assert json.loads((tmp_path / "r" / TRUST_FILE).read_text())["serial"] == 1
    (tmp_path / "r" / TRUST_FILE).write_text("{not json")
    with pytest.raises(TrustStoreError, match="delete it to start over"):
        BundleReceiver(BundleReceiverConfig(tmp_path / "r", keys["pub1"]))
    assert newer_installed_bundle(config, keys["pub1"], quiet) is None


def test_publisher_and_cli_refuse_bad_chains(keys, source_bundle, tmp_path, capsys):
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    with pytest.raises(ValueError, match="not the signing key"):  # chain ends at K2, not K3
        Publisher(PublishConfig(tmp_path / "p", keys["key3"], endorsements=keys["chain"]),
                  initial)
    (tmp_path / "broken.json").write_text('{"format": 1, "endorsements": [{"key": 1}]}')
    with pytest.raises(ValueError, match="missing"):
        PublishConfig(tmp_path / "p", keys["key2"], endorsements=tmp_path / "broken.json")
    # the manifest the publisher signs carries the chain, unchanged
    publisher = Publisher(PublishConfig(tmp_path / "p", keys["key2"],
                                        endorsements=keys["chain"]), initial)
    staged = load_bundle(copy_bundle(source_bundle, tmp_path / "s2", model_version=2))
    published = publisher.publish(staged).path
    carried = read_manifest(published).extras[ENDORSEMENTS_KEY]
    assert carried == [e.to_dict() for e in load_chain(keys["chain"])]

    capsys.readouterr()
    cases = [
        ("--rotate", tmp_path / "missing.sign.key", "--out", tmp_path / "x"),
        ("--rotate", keys["key1"], "--out", tmp_path / "x", "--chain", tmp_path / "none.json"),
        ("--rotate", keys["key1"], "--out", tmp_path / "x", "--chain", tmp_path / "broken.json"),
        ("--revoke", keys["pub1"], "--out", tmp_path / "x"),  # no --signing-key
        ("--revoke", keys["pub1"], "--signing-key", keys["key3"], "--out", tmp_path / "k2"),
        ("--revoke", keys["pub2"], "--signing-key", keys["key2"], "--out", tmp_path / "k2",
         "--serial", "1"),
    ]
    for argv in cases:
        with pytest.raises(SystemExit) as exit_info:
            thinkmem(*argv)
        message = str(exit_info.value.code)
        assert exit_info.value.code != 0 and message.startswith("thinkmem keys: "), argv
        assert "\n" not in message and "Traceback" not in message, message
    assert len(load_chain(keys["chain"])) == 1  # nothing was appended by a refused call


def test_a_chain_file_with_a_repeated_key_is_refused(keys, tmp_path):
    """The chain file names the endorsements a publisher ships; with a key twice, plain
    json read the last list, and a reviewer reading the first saw another chain."""
    text = keys["chain"].read_text()
    doubled = tmp_path / "doubled.json"
    doubled.write_text(text.replace('"endorsements":', '"endorsements": [], "endorsements":', 1))
    assert doubled.read_text() != text
    with pytest.raises(EndorsementError, match="'endorsements' appears twice"):
        load_chain(doubled)
