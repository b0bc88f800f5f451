"""Signed publication and the push over the experience connection, on real ZeroMQ."""


import numpy as np
import pytest
from conftest import copy_bundle
from waiting import wait

from thinkmem_ros.consolidator.ingest import open_receiver
from thinkmem_ros.consolidator.publish import (
    ARTEFACT_FILES,
    PublishConfig,
    Publisher,
    PublishError,
    attach_artefacts,
)
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.link.receiver import ReceiverConfig
from thinkmem_ros.link.security import verify_signed_bundle, write_signing_keypair
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig
from thinkmem_ros.policy.bundle import load_bundle
from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig


@pytest.fixture
def keys(tmp_path):
    pub, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    return pub, key


@pytest.fixture
def publisher(tmp_path, keys, source_bundle):
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    return Publisher(PublishConfig(tmp_path / "pub", keys[1], keep_history=2), initial)


def staged(publisher, source_bundle, tmp_path):
    version = publisher.next_version()
    return load_bundle(copy_bundle(source_bundle, tmp_path / f"staged{version}",
                                   model_version=version))


def test_publish_signs_versions_links_and_prunes(publisher, source_bundle, tmp_path, keys):
    assert publisher.current().version == 1 and publisher.next_version() == 2
    for expected in (2, 3, 4):
        pub = publisher.publish(staged(publisher, source_bundle, tmp_path))
        assert pub.version == expected and pub.pushed_to is None
        assert verify_signed_bundle(pub.path, keys[0]).version == expected
        assert publisher.current().version == expected
    assert publisher.versions() == [3, 4]  # keep_history=2
    with pytest.raises(PublishError, match="next version is v5"):
        publisher.publish(load_bundle(copy_bundle(source_bundle, tmp_path / "old",
                                                  model_version=3)))


def test_an_artefact_changed_after_it_was_listed_is_never_published(publisher, source_bundle,
                                                                    tmp_path):
    """The manifest lists each artefact's sha256 and the signature covers the manifest, so
    only hashing the file catches one changed after it was attached: it was signed and
    published as it was, and refused by every robot it was pushed to."""
    bundle = staged(publisher, source_bundle, tmp_path)
    (tmp_path / "memctl").mkdir()
    for name in ARTEFACT_FILES["memctl"]:
        (tmp_path / "memctl" / name).write_bytes(b"probes of " + name.encode())
    attach_artefacts(bundle.path, {"memctl": tmp_path / "memctl"})
    (bundle.path / ARTEFACT_FILES["memctl"][0]).write_bytes(b"other probes")
    with pytest.raises(PublishError, match="sha256 does not match the manifest"):
        publisher.publish(load_bundle(bundle.path))
    assert publisher.versions() == [] and publisher.current().version == 1


def test_restart_cleans_staging_and_never_reuses_a_version(publisher, source_bundle, tmp_path,
                                                           keys):
    publisher.publish(staged(publisher, source_bundle, tmp_path))
    (publisher.history / ".staging-crashed").mkdir()  # as left by a SIGKILL mid-publication
    (publisher.root / "current").unlink()  # killed after the rename, before the link moved
    again = Publisher(PublishConfig(tmp_path / "pub", keys[1]), tmp_path / "initial")
    assert not list(again.history.glob(".staging-*"))
    assert again.current().version == 1 and again.next_version() == 3


def test_no_version_is_published_past_what_an_experience_carries(source_bundle, tmp_path,
                                                                 keys):
    """A round on a v(2^63 - 1) bundle published v2^63 and then failed on SQLite's INTEGER
    overflow, with ``current`` left on it."""
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=2**63 - 1)
    publisher = Publisher(PublishConfig(tmp_path / "pub", keys[1]), initial)
    with pytest.raises(PublishError, match="next version would be v9223372036854775808"):
        publisher.next_version()
    assert not (tmp_path / "pub" / "current").exists() and publisher.versions() == []


def exp(i):
    return Experience(robot_id="r1", episode_id="e", stamp=float(i),
                      window=np.zeros((4, 3), np.float32), labels=["trend"],
                      probabilities=[0.5], bundle_version=1)


def test_push_reaches_connected_and_late_robots(publisher, source_bundle, tmp_path, keys):
    rx = open_receiver(ReceiverConfig(bind="tcp://127.0.0.1:*", db_path=tmp_path / "s.db",
                                           max_frame_bytes=1 << 20, poll_s=0.02)).start()
    robots = []
    try:
        def robot(name):
            installed = []
            bundles = BundleReceiver(BundleReceiverConfig(tmp_path / name, keys[0],
                                                          current_version=1),
                                     on_install=installed.append)
            shipper = ExperienceShipper(ShipperConfig(
                endpoint=rx.endpoint, robot_id=name, spool_path=tmp_path / f"{name}.db",
                on_bundle_push=bundles.handle_push)).start()
            robots.append(shipper)
            return bundles, installed, shipper

        early, early_installed, shipper = robot("early")
        assert shipper.ship(exp(0)) and shipper.flush(10.0)
        assert wait(lambda: len(rx.peers) == 1)
        pub = publisher.publish(staged(publisher, source_bundle, tmp_path), push=rx.push_bundle)
        assert pub.pushed_to == 1
        assert wait(lambda: early_installed), early.stats()
        assert load_bundle(early_installed[0]).manifest.sha256 == pub.sha256
        assert shipper.stats()["bundle_pushes"] == 1
        # a robot that connects after the push says HELLO and still gets the latest bundle
        late, late_installed, _ = robot("late")
        assert wait(lambda: late_installed), late.stats()
        assert late.stats()["running_version"] == 2 and rx.stats.bundle_pushes == 2
    finally:
        for shipper in robots:
            shipper.close()
        rx.stop()


def test_a_public_key_is_refused_as_a_signing_key(tmp_path):
    """Both halves are 32 bytes of hex: a ``.pub`` passed by mistake would sign silently."""
    from thinkmem_ros.link.security import SecurityError, load_signing_key

    public, secret = write_signing_keypair(tmp_path, "fleet")
    with pytest.raises(SecurityError, match="public key"):
        load_signing_key(public)
    assert bytes(load_signing_key(secret).verify_key).hex() == public.read_text().strip()
