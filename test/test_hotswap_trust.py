"""The hot-swap runs only what a push would: signed bundles under a signing key, the pin kept.

Real files, real signatures, the real ``BundleReceiver`` installing a real push frame, the
real ``HotSwapper`` thread polling the files, and a real ``ThinkingNode`` for the wiring.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import pytest
from conftest import copy_bundle, wait_for

from thinkmem_ros.consolidator.publish import push_frame
from thinkmem_ros.link.protocol import decode_frame
from thinkmem_ros.link.security import sign_bundle, write_signing_keypair
from thinkmem_ros.policy.bundle import MANIFEST
from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig
from thinkmem_ros.robot.hotswap import HotSwapper, PolicySlot, load_policy

rclpy = pytest.importorskip("rclpy")

from rclpy.parameter import Parameter  # noqa: E402

from thinkmem_ros.robot.node import ThinkingNode  # noqa: E402


@pytest.fixture
def keys(tmp_path) -> tuple[Path, Path]:
    """(public, secret) key files of the consolidator."""
    return write_signing_keypair(tmp_path / "keys", "consolidator")


def signed(source: Path, dest: Path, version: int, secret: Path) -> Path:
    copy_bundle(source, dest, model_version=version)
    sign_bundle(dest, secret)
    return dest


def install(source: Path, tmp_path: Path, keys, version: int = 2, **kwargs) -> Path:
    """Push a signed ``version`` to a real receiver; returns the installed folder."""
    pub, secret = keys
    folder = signed(source, tmp_path / f"staged{version}", version, secret)
    receiver = BundleReceiver(BundleReceiverConfig(tmp_path / "bundles", pub, **kwargs))
    installed = receiver.handle_push(decode_frame(push_frame(folder)).body)
    assert installed is not None, receiver.last_reason
    return installed


def tamper(folder: Path) -> None:
    """What the audit did on disk: every threshold at 1.0 and a higher model_version."""
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["thresholds"] = dict.fromkeys(manifest["thresholds"], 1.0)
    manifest["model_version"] += 1
    (folder / MANIFEST).write_text(json.dumps(manifest, sort_keys=True, indent=2))


class Swapper:
    """A running ``HotSwapper`` guarded as the node guards it, and what it reported."""

    def __init__(self, start: Path, guard, load=load_policy) -> None:
        self.slot = PolicySlot(load_policy(start))
        self.results: list[tuple[int | None, str]] = []
        self.thread = HotSwapper(self.slot, load, watch=True, period_s=0.05, guard=guard,
                                 on_result=lambda p, e: self.results.append(
                                     (p and p.version, e)))
        self.thread.start()

    def refused(self) -> str:
        return next((e for _, e in reversed(self.results) if e), "")

    def stop(self) -> None:
        self.thread.stop()


def node_guard(bundles: Path, pub: Path | None, pin: int = 0):
    """The guard the node builds for this configuration."""
    from thinkmem_ros.robot.hotswap import SwapGuard
    from thinkmem_ros.robot.node import _verify_installed

    verify = None if pub is None else functools.partial(_verify_installed, bundles, pub)
    return SwapGuard(verify, bundles, pin)


def test_an_installed_bundle_edited_on_disk_is_refused_and_the_signed_one_runs(
        source_bundle, tmp_path, keys):
    installed = install(source_bundle, tmp_path, keys)
    swapper = Swapper(installed, node_guard(tmp_path / "bundles", keys[0]))
    try:
        tamper(installed)
        assert wait_for(swapper.refused), swapper.results
        error = swapper.refused()
        assert str(installed) in error and "signature" in error, error
        assert "\n" not in error
        time.sleep(0.3)  # several more polls: still refused, never swapped
        running = swapper.slot.current()[0]
        assert running.version == 2 and float(running.thresholds.max()) < 1.0
        assert swapper.slot.swaps == 0 and swapper.thread.is_alive()
    finally:
        swapper.stop()


def test_a_bundle_under_bundles_dir_needs_a_signature_when_requested_too(
        source_bundle, tmp_path, keys):
    installed = install(source_bundle, tmp_path, keys)
    unsigned = copy_bundle(source_bundle, tmp_path / "bundles" / "v000009", model_version=9)
    local = copy_bundle(source_bundle, tmp_path / "local", model_version=4)
    swapper = Swapper(installed, node_guard(tmp_path / "bundles", keys[0]))
    try:
        swapper.thread.request(unsigned)  # e.g. bundle_path set to it
        assert wait_for(swapper.refused)
        assert str(unsigned) in swapper.refused() and swapper.slot.peek().version == 2
        # an operator's explicit local bundle outside bundles_dir is their choice, as before
        swapper.thread.request(local)
        assert wait_for(lambda: swapper.slot.peek().version == 4), swapper.results
    finally:
        swapper.stop()


def test_a_correctly_signed_replacement_is_still_swapped_in(source_bundle, tmp_path, keys):
    installed = install(source_bundle, tmp_path, keys)
    swapper = Swapper(installed, node_guard(tmp_path / "bundles", keys[0]))
    try:
        fresh = signed(source_bundle, tmp_path / "v3", 3, keys[1])
        for name in ("policy.onnx", "bundle.sig", MANIFEST):  # replaced by rename
            (fresh / name).replace(installed / name)
        assert wait_for(lambda: swapper.slot.peek().version == 3), swapper.results
        assert swapper.thread.error == ""
    finally:
        swapper.stop()


def test_the_pinned_version_is_kept_against_signed_bundles_too(source_bundle, tmp_path,
                                                               keys):
    installed = install(source_bundle, tmp_path, keys, pin_version=2)
    swapper = Swapper(installed, node_guard(tmp_path / "bundles", keys[0], pin=2))
    try:
        other = signed(source_bundle, tmp_path / "bundles" / "v000003", 3, keys[1])
        swapper.thread.request(other)
        assert wait_for(lambda: "pin_bundle_version" in swapper.refused()), swapper.results
        assert str(other) in swapper.refused() and swapper.slot.peek().version == 2
    finally:
        swapper.stop()


def test_a_manifest_replaced_between_verification_and_load_is_refused(
        source_bundle, tmp_path, keys):
    installed = install(source_bundle, tmp_path, keys)

    def racing_load(path, **kwargs):
        # the race cannot be timed with real threads: the edit is injected at the exact
        # point between the signature check and the load
        if not hasattr(racing_load, "done"):
            racing_load.done = True
            tamper(Path(path))
        return load_policy(path, **kwargs)

    swapper = Swapper(installed, node_guard(tmp_path / "bundles", keys[0]), load=racing_load)
    try:
        (installed / MANIFEST).write_bytes((installed / MANIFEST).read_bytes())  # touch
        assert wait_for(swapper.refused), swapper.results
        assert "changed while it was being verified" in swapper.refused()
        assert swapper.slot.peek().version == 2
    finally:
        swapper.stop()


def test_without_a_signing_key_a_local_unsigned_bundle_still_hot_swaps(source_bundle,
                                                                       tmp_path):
    live = copy_bundle(source_bundle, tmp_path / "live")
    swapper = Swapper(live, node_guard(tmp_path / "bundles", None))
    try:
        tamper(live)  # a developer editing thresholds of their bundle
        assert wait_for(lambda: swapper.slot.peek().version == 2), swapper.results
    finally:
        swapper.stop()


@pytest.mark.ros
def test_the_node_refuses_an_edited_installed_bundle_and_keeps_running(
        ros_env, source_bundle, tmp_path, keys, capfd, caplog):
    """Refused once, in one line naming the version kept, and the old policy runs on."""
    v1 = copy_bundle(source_bundle, tmp_path / "v1", model_version=1)
    installed = install(source_bundle, tmp_path, keys)
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = ThinkingNode(context=context, parameter_overrides=[
            Parameter("bundle_path", value=str(v1)),
            Parameter("bundles_dir", value=str(tmp_path / "bundles")),
            Parameter("bundle_signing_public_key", value=str(keys[0])),
            Parameter("watch_period_s", value=0.05)])
        try:
            assert node._slot.peek().path == installed.resolve()  # started on the push
            tamper(installed)
            assert wait_for(lambda: node._bundle_error)
            assert str(installed.resolve()) in node._bundle_error, node._bundle_error
            assert "signature" in node._bundle_error
            running = node._slot.peek()
            assert running.version == 2 and float(running.thresholds.max()) < 1.0
            assert node.health().bundle_error == node._bundle_error  # /diagnostics: WARN
            time.sleep(0.3)  # several more polls of the unchanged, still refused folder
            said = [line for line in capfd.readouterr().err.splitlines()
                    if "bundle refused" in line]
            assert len(said) == 1 and "keeping version 2" in said[0], said
            # the swapper leaves the saying to the node: it used to log the refusal again
            assert not [r for r in caplog.records if "refused" in r.getMessage()]
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown(context=context)
