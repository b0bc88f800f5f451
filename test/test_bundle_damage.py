"""Installed bundles and the trust file damaged on disk (power loss, a failing SD card).

Real signed bundles installed by the real ``BundleReceiver``, then damaged the way a power
cut or fsck leaves them. The promise: the robot runs the newest intact signed version with
one ERROR line saying why, never crashes with a traceback, and a replayed older signed
push stays refused however the files were damaged.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import copy_bundle

import thinkmem_ros.policy.bundle as bundle_module
import thinkmem_ros.robot.bundle_receiver as receiver_module
from thinkmem_ros.consolidator.publish import push_frame
from thinkmem_ros.link.protocol import decode_frame
from thinkmem_ros.link.security import sign_bundle, write_signing_keypair
from thinkmem_ros.policy.bundle import MANIFEST, ONNX_FILE, load_bundle
from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig
from thinkmem_ros.robot.hotswap import load_policy
from thinkmem_ros.robot.node_config import NodeConfig
from thinkmem_ros.robot.shipping_link import ShippingLink, newer_installed_bundle
from thinkmem_ros.robot.trust_store import (
    TRUST_FILE,
    TrustStore,
    TrustStoreConfig,
    TrustStoreError,
)

NODE_LOG = logging.getLogger("test_bundle_damage.node")  # stands in for the node's logger


@pytest.fixture
def robot(window_bundle, tmp_path):
    """bundles_dir with signed v2, v3 and v4 installed by pushes (current -> v4)."""
    pub, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    bodies = {}
    for version in (2, 3, 4, 5):
        folder = copy_bundle(window_bundle, tmp_path / f"pub{version}", model_version=version)
        sign_bundle(folder, key)
        bodies[version] = decode_frame(push_frame(folder)).body
    bundles = tmp_path / "bundles"
    rx = BundleReceiver(BundleReceiverConfig(bundles, pub, current_version=1))
    for version in (2, 3, 4):
        assert rx.handle_push(bodies[version]) is not None
    v1 = copy_bundle(window_bundle, tmp_path / "v1", model_version=1)
    config = NodeConfig(bundle_path=str(v1), bundles_dir=str(bundles))
    return SimpleNamespace(pub=pub, bodies=bodies, bundles=bundles, v1=v1, config=config)


def truncate_onnx(bundles: Path) -> None:
    onnx = bundles / "v000004" / ONNX_FILE
    onnx.write_bytes(onnx.read_bytes()[: onnx.stat().st_size // 2])


def nul_fill_manifest(bundles: Path) -> None:
    manifest = bundles / "v000004" / MANIFEST
    manifest.write_bytes(b"\0" * manifest.stat().st_size)


def current_a_file(bundles: Path) -> None:
    (bundles / "current").unlink()
    (bundles / "current").write_bytes(os.urandom(64))


# name: (damage, version that must run, words the ERROR line must hold)
DAMAGE = {
    "onnx truncated": (truncate_onnx, 3, "does not verify"),
    "onnx missing": (lambda b: (b / "v000004" / ONNX_FILE).unlink(), 3, "not found"),
    "manifest NUL-filled": (nul_fill_manifest, 3, "damaged"),
    "current dangling": (lambda b: shutil.rmtree(b / "v000004"), 3, "which is missing"),
    "current a regular file": (current_a_file, 4, "not a link"),
    "current lost": (lambda b: (b / "current").unlink(), 4, "is missing"),
}


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_start_runs_the_newest_intact_version_and_keeps_the_floor(robot, caplog, damage):
    spoil, expected, words = DAMAGE[damage]
    spoil(robot.bundles)
    with caplog.at_level(logging.INFO):
        path = newer_installed_bundle(robot.config, robot.pub, NODE_LOG)
    want = (robot.bundles / f"v{expected:06d}").resolve()
    assert path == want, caplog.text
    lines = errors(caplog)
    assert len(lines) == 1, lines
    assert words in lines[0] and f"running v{expected}" in lines[0], lines
    if damage == "manifest NUL-filled":  # no signature was checked: damage, not an attack
        assert "tampered" not in lines[0], lines
    assert (robot.bundles / "current").resolve() == want  # repointed: the next start agrees

    caplog.clear()
    with caplog.at_level(logging.INFO):
        rx = BundleReceiver(BundleReceiverConfig(robot.bundles, robot.pub, current_version=1))
    assert errors(caplog) == [] and rx.version == expected
    assert rx.handle_push(robot.bodies[2]) is None  # a replayed older signed push
    assert rx.stats()["rejected_version"] == 1 and rx.version == expected


def test_a_regular_file_current_is_moved_aside_not_deleted(robot, caplog):
    current_a_file(robot.bundles)
    garbage = (robot.bundles / "current").read_bytes()
    newer_installed_bundle(robot.config, robot.pub, NODE_LOG)
    moved = list(robot.bundles.glob("current.moved-*"))
    assert len(moved) == 1 and moved[0].read_bytes() == garbage


@pytest.mark.parametrize("damage", [d for d in DAMAGE if DAMAGE[d][1] == 3])
def test_receiver_alone_stands_on_the_newest_intact_version_and_heals(robot, caplog, damage):
    """The receiver at restart, with no start-up repair before it (``current`` still bad)."""
    DAMAGE[damage][0](robot.bundles)
    with caplog.at_level(logging.INFO):
        rx = BundleReceiver(BundleReceiverConfig(robot.bundles, robot.pub, current_version=1))
    lines = errors(caplog)
    assert len(lines) == 1 and "v3" in lines[0], lines
    assert rx.version == 3 and rx.installed() == (robot.bundles / "v000003").resolve()
    assert rx.handle_push(robot.bodies[2]) is None
    assert rx.stats()["rejected_version"] == 1
    healed = rx.handle_push(robot.bodies[4])  # the newest version again repairs the damage
    assert healed == robot.bundles / "v000004" and load_bundle(healed).version == 4
    assert (robot.bundles / "current").resolve() == healed and rx.version == 4


def test_floor_stays_at_the_damaged_newest_version(robot):
    """v4 damaged, v3 runs: v3 and v2 stay refused, only v4 (or newer) may come in."""
    truncate_onnx(robot.bundles)
    (robot.bundles / "current").unlink()
    os.symlink("v000003", robot.bundles / "current")  # as the start-up repair leaves it
    rx = BundleReceiver(BundleReceiverConfig(robot.bundles, robot.pub, current_version=1))
    assert rx.version == 3
    shutil.rmtree(robot.bundles / "v000003")  # even with v3 gone too (current dangling)
    rx = BundleReceiver(BundleReceiverConfig(robot.bundles, robot.pub, current_version=1))
    assert rx.version == 2
    assert rx.handle_push(robot.bodies[3]) is None and "older than v4" in rx.last_reason
    assert rx.handle_push(robot.bodies[5]) is not None and rx.version == 5


@pytest.fixture
def eio_on_v4(monkeypatch):
    """EIO from v4's graph. A failing card's EIO cannot be made on a healthy disk, and root
    (these tests' user) reads a mode-000 file anyway: the fault is injected here."""
    real = bundle_module.sha256_file

    def failing(path):
        if Path(path).parent.name == "v000004":
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real(path)

    monkeypatch.setattr(bundle_module, "sha256_file", failing)


def test_an_unreadable_installed_file_does_not_stop_the_start(robot, caplog, eio_on_v4,
                                                              tmp_path):
    with caplog.at_level(logging.INFO):
        rx = BundleReceiver(BundleReceiverConfig(robot.bundles, robot.pub, current_version=1))
    lines = errors(caplog)
    assert len(lines) == 1 and "unreadable" in lines[0] and "v3" in lines[0], lines
    assert rx.version == 3

    config = NodeConfig(bundle_path=str(robot.v1), bundles_dir=str(robot.bundles),
                        consolidator_endpoint="tcp://127.0.0.1:9",
                        spool_path=str(tmp_path / "spool.db"),
                        bundle_signing_public_key=str(robot.pub))
    said = []
    logger = SimpleNamespace(info=said.append, error=said.append, warning=said.append)
    link = ShippingLink(config, load_policy(robot.v1), 10.0, robot.pub, lambda path: None,
                        logger)  # raised ValueError: the node refused to start (exit 2)
    try:
        assert link.receiver is not None and link.receiver.version == 3
    finally:
        link.close()

    caplog.clear()
    with caplog.at_level(logging.INFO):
        path = newer_installed_bundle(robot.config, robot.pub, NODE_LOG)
    assert path == (robot.bundles / "v000003").resolve()
    assert len(errors(caplog)) == 1 and "unreadable" in errors(caplog)[0]


def test_a_deeply_nested_trust_file_is_a_trust_store_error(robot, caplog):
    (robot.bundles / TRUST_FILE).write_bytes(b"[" * 100_000)
    with pytest.raises(TrustStoreError, match="nested too deeply") as raised:
        TrustStore(TrustStoreConfig(robot.bundles, robot.pub))
    assert TRUST_FILE in str(raised.value) and "\n" not in str(raised.value)
    # a ValueError: the node refuses to start in one line (exit 2), no traceback
    with pytest.raises(TrustStoreError, match=TRUST_FILE):
        BundleReceiver(BundleReceiverConfig(robot.bundles, robot.pub, current_version=1))
    with caplog.at_level(logging.INFO):
        assert newer_installed_bundle(robot.config, robot.pub, NODE_LOG) is None
    lines = errors(caplog)
    assert len(lines) == 1 and TRUST_FILE in lines[0], lines


def test_a_directory_current_is_moved_aside_and_the_push_installs(robot, caplog):
    (robot.bundles / "current").unlink()  # a backup restored by a copy that followed links
    shutil.copytree(robot.bundles / "v000004", robot.bundles / "current")
    rx = BundleReceiver(BundleReceiverConfig(robot.bundles, robot.pub, current_version=1))
    assert rx.version == 4
    with caplog.at_level(logging.WARNING):
        path = rx.handle_push(robot.bodies[5])
    assert path == robot.bundles / "v000005", rx.last_reason
    assert (robot.bundles / "current").is_symlink()
    assert (robot.bundles / "current").resolve() == path
    moved = list(robot.bundles.glob("current.moved-*"))
    assert len(moved) == 1 and load_bundle(moved[0]).version == 4  # renamed, not deleted
    assert "not a link" in caplog.text


def test_the_staging_folder_is_synced_before_it_is_renamed(robot, monkeypatch):
    """A missing sync shows only after a power cut, which a test cannot make: a spy that
    calls the real ``fsync_dir`` records what was synced while it happened."""
    real, synced = receiver_module.fsync_dir, []

    def spy(path):
        synced.append((Path(path).name, sorted(p.name for p in Path(path).iterdir())))
        real(path)

    monkeypatch.setattr(receiver_module, "fsync_dir", spy)
    rx = BundleReceiver(BundleReceiverConfig(robot.bundles, robot.pub, current_version=4))
    assert rx.handle_push(robot.bodies[5]) is not None
    staging_name, entries = synced[0]
    assert staging_name.startswith(".incoming-") and {MANIFEST, ONNX_FILE} <= set(entries)
    assert synced[1][0] == "bundles" and "v000005" in synced[1][1]


@pytest.mark.ros
@pytest.mark.slow
def test_node_runs_the_newest_intact_version_in_one_error_line(ros_env, robot, tmp_path):
    from test_node_process import NodeProcess, node_cmd

    truncate_onnx(robot.bundles)
    node = NodeProcess(node_cmd(  # nothing listens on port 9: experiences stay spooled
        "-p", f"bundle_path:={robot.v1}", "-p", f"bundles_dir:={robot.bundles}",
        "-p", f"bundle_signing_public_key:={robot.pub}",
        "-p", "consolidator_endpoint:=tcp://127.0.0.1:9", "-p", "robot_id:=damaged",
        "-p", f"spool_path:={tmp_path / 'spool.db'}"), ros_env)
    node.wait_for("ready:", timeout=60.0)
    node.proc.send_signal(signal.SIGINT)
    assert node.finish() == 0, node.output
    out = node.output
    assert "Traceback" not in out and "ready: bundle v3" in out, out
    bundle_errors = [line for line in node.lines
                     if "ERROR" in line and "installed bundle" in line]
    assert len(bundle_errors) == 1 and "running v3" in bundle_errors[0], out
    assert "shipping experiences to tcp://127.0.0.1:9" in out, out
