"""The largest pushable bundle: one number, checked before a version is signed or linked.

A bundle is pushed to robots in one BUNDLE_PUSH frame, so the wire's frame limit is the
size of the largest bundle the fleet can get. A bundle past it used to be signed and made
``current`` first, then fail in ``push_frame``: no robot ever got that version and the
round lost its mark. Real publisher, real files, real receiver.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import copy_bundle

from thinkmem_ros.consolidator.publish import PublishConfig, Publisher, PublishError
from thinkmem_ros.link import protocol
from thinkmem_ros.link.security import sign_bundle, write_signing_keypair
from thinkmem_ros.policy import bundle as bundle_module
from thinkmem_ros.policy.bundle import MANIFEST, load_bundle, write_bundle
from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig

SIGNATURE_BYTES = 64  # bundle.sig: an Ed25519 signature


@pytest.fixture
def keys(tmp_path):
    return write_signing_keypair(tmp_path / "keys", "consolidator")


@pytest.fixture
def publisher(tmp_path, keys, source_bundle):
    """A publisher whose ``current`` is a normal v2, so there is something not to move."""
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    pub = Publisher(PublishConfig(tmp_path / "pub", keys[1]), initial)
    pub.publish(load_bundle(copy_bundle(source_bundle, tmp_path / "staged2", model_version=2)))
    return pub


def bundle_of(source: Path, folder: Path, version: int, total: int) -> Path:
    """An unsigned bundle whose files plus the signature to come total ``total`` bytes.

    The ONNX bytes are padding: publishing and pushing only hash them, and the manifest's
    size does not depend on them (its sha256 is always 64 hex digits).
    """
    manifest = load_bundle(source).manifest
    manifest.model_version, manifest.created_at = version, ""
    write_bundle(folder, b"", manifest)
    onnx = total - SIGNATURE_BYTES - (folder / MANIFEST).stat().st_size
    write_bundle(folder, bytes(onnx), manifest)
    assert sum(p.stat().st_size for p in folder.iterdir()) + SIGNATURE_BYTES == total
    return folder


def published_state(publisher: Publisher) -> tuple[str, list[str]]:
    """Where ``current`` points and every entry of the history folder, hidden ones too."""
    return (os.readlink(publisher.root / "current"),
            sorted(p.name for p in publisher.history.iterdir()))


def test_every_bundle_limit_comes_from_the_frame_limit():
    """Policy sits below the link and writes the number out; this holds the two equal."""
    assert bundle_module.MAX_ARTEFACT_BYTES == protocol.MAX_FRAME_BYTES
    assert protocol.MAX_BUNDLE_BYTES == protocol.MAX_FRAME_BYTES - protocol.PUSH_ENVELOPE_BYTES
    config = BundleReceiverConfig(Path("unused"), bytes(32))
    assert config.max_bytes == protocol.MAX_BUNDLE_BYTES


def test_the_envelope_bound_holds_for_the_widest_push():
    """The most artefacts with the longest names and the highest version still fit."""
    names = [f"{i:02d}".ljust(protocol.MAX_ARTEFACT_NAME, "a")
             for i in range(protocol.MAX_ARTEFACTS)]
    fixed = 4096 + SIGNATURE_BYTES + len(names)
    onnx = bytes(protocol.MAX_BUNDLE_BYTES - fixed)
    frame = protocol.bundle_push(2**63 - 1, bytes(4096), onnx, bytes(SIGNATURE_BYTES),
                                 {name: b"x" for name in names})
    assert len(frame) <= protocol.MAX_FRAME_BYTES
    assert len(frame) - protocol.MAX_BUNDLE_BYTES <= protocol.PUSH_ENVELOPE_BYTES


@pytest.mark.parametrize("total", [protocol.MAX_BUNDLE_BYTES + 1, protocol.MAX_FRAME_BYTES + 1],
                         ids=["just-over", "past-the-frame"])
@pytest.mark.parametrize("link", [True, False], ids=["linked", "canary"])
def test_a_bundle_too_big_to_push_is_refused_before_anything_moves(publisher, source_bundle,
                                                                   tmp_path, total, link):
    staged = load_bundle(bundle_of(source_bundle, tmp_path / "big", 3, total))
    before = published_state(publisher)
    frames: list[bytes] = []
    with pytest.raises(PublishError) as refused:
        publisher.publish(staged, push=lambda frame: frames.append(frame) or 1, link=link)
    message = str(refused.value)
    assert "\n" not in message
    assert f"{total} bytes" in message and str(protocol.MAX_BUNDLE_BYTES) in message
    assert published_state(publisher) == before and frames == []
    assert publisher.current().version == 2 and publisher.next_version() == 3


def test_promoting_a_version_too_big_to_push_leaves_current(publisher, source_bundle,
                                                            tmp_path, keys):
    """A too-big version already in the history (signed by hand or by an older publisher)."""
    target = publisher.history / "v000003"
    bundle_of(source_bundle, target, 3, protocol.MAX_FRAME_BYTES + 1)
    sign_bundle(target, keys[1])
    before = published_state(publisher)
    with pytest.raises(PublishError, match=f"{protocol.MAX_FRAME_BYTES + 1} bytes"):
        publisher.promote(3, push=lambda frame: 1)
    assert published_state(publisher) == before and publisher.current().version == 2


def test_the_largest_pushable_bundle_publishes_and_a_robot_installs_it(publisher,
                                                                       source_bundle,
                                                                       tmp_path, keys):
    staged = load_bundle(bundle_of(source_bundle, tmp_path / "max", 3,
                                   protocol.MAX_BUNDLE_BYTES))
    frames: list[bytes] = []
    publication = publisher.publish(staged, push=lambda frame: frames.append(frame) or 1)
    assert publication.version == 3 and publication.pushed_to == 1
    assert os.readlink(publisher.root / "current") == "history/v000003"
    frame = protocol.decode_frame(frames[0])
    assert frame.kind is protocol.Kind.BUNDLE_PUSH
    robot = BundleReceiver(BundleReceiverConfig(tmp_path / "robot", keys[0],
                                                current_version=2))
    installed = robot.handle_push(frame.body)
    assert installed is not None, robot.last_reason
    assert load_bundle(installed).version == 3 and robot.stats()["accepted"] == 1
