"""The consolidator serves recall from its own store, embedded by its current bundle.

Real store (SQLite), real ONNX Runtime for the embeddings, real ZeroMQ between a
``RecallClient`` (the robot's end) and the service's ``RecallServer``.
"""

from __future__ import annotations

from dataclasses import replace

import consolidator_world as world
import pytest
from conftest import copy_bundle

from thinkmem_ros.consolidator.service import ConsolidatorConfig, ConsolidatorService
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.consolidator.values import embed_experiences
from thinkmem_ros.link.experience import encode_experience
from thinkmem_ros.link.security import write_signing_keypair
from thinkmem_ros.policy.bundle import load_bundle
from thinkmem_ros.policy.runtime import PolicyRuntime
from thinkmem_ros.robot.recall import RecallClient


def test_consolidator_serves_recall_from_its_store_and_rebuilds_it_for_a_new_current(
        tmp_path):
    _, key = write_signing_keypair(tmp_path / "keys", "c")
    bundle = world.running_bundle(tmp_path / "running")
    exps = [replace(e, seq=i) for i, e in enumerate(world.experiences("r0", 6, 5, seed=3))]
    with ExperienceStore(tmp_path / "c.db") as store:
        store.insert_many([(e, encode_experience(e)) for e in exps])
    config = ConsolidatorConfig(db_path=tmp_path / "c.db", publish_dir=tmp_path / "pub",
                                signing_key=key, initial_bundle=bundle,
                                bind="tcp://127.0.0.1:*", recall_bind="tcp://127.0.0.1:*")
    probe = exps[17]
    query = embed_experiences(PolicyRuntime(load_bundle(bundle), threads=1), [probe])[0]
    with ConsolidatorService(config) as service:
        assert len(service.recall.index) == len(exps)
        client = RecallClient(service.recall.endpoint, "r0", deadline_s=5.0, k=3)
        try:
            items = client.recall(query)
        finally:
            client.close()
        assert (items[0]["episode_id"], items[0]["seq"]) == (probe.episode_id, 17)
        assert items[0]["score"] == pytest.approx(1.0, abs=1e-4)
        assert not service.refresh_recall()  # current did not move: nothing to rebuild
        # a new version becomes current: the index is re-embedded by it, and experiences
        # stored since the last build are in it
        more = [replace(e, seq=100 + i, episode_id="late") for i, e in enumerate(exps[:4])]
        with ExperienceStore(tmp_path / "c.db") as store:
            store.insert_many([(e, encode_experience(e)) for e in more])
        staged = load_bundle(copy_bundle(bundle, tmp_path / "s2", model_version=2))
        service.publisher.publish(staged)
        assert service.refresh_recall() and len(service.recall.index) == len(exps) + 4
    assert service.recall is None  # closed with the service


def test_recall_bind_must_be_an_endpoint(tmp_path):
    _, key = write_signing_keypair(tmp_path / "keys", "c")
    with pytest.raises(ValueError, match="recall_bind"):
        ConsolidatorConfig(db_path=tmp_path / "c.db", signing_key=key, recall_bind="5757")


def test_the_recall_index_holds_the_newest_experiences_it_is_allowed(tmp_path):
    from thinkmem_ros.consolidator.recall_server import index_store

    bundle = world.running_bundle(tmp_path / "running")
    exps = [replace(e, seq=i) for i, e in enumerate(world.experiences("r0", 4, 5, seed=4))]
    with ExperienceStore(tmp_path / "c.db", flush_rows=7) as store:  # tail and lake
        store.insert_many([(e, encode_experience(e)) for e in exps])
    running = load_bundle(bundle)
    newest = index_store(tmp_path / "c.db", running, limit=6)
    assert sorted(r.seq for r in newest.refs) == list(range(len(exps) - 6, len(exps)))
    assert len(index_store(tmp_path / "c.db", running, limit=0)) == len(exps)
    assert len(index_store(tmp_path / "c.db", running, limit=10 ** 6)) == len(exps)
    _, key = write_signing_keypair(tmp_path / "keys", "c")
    with pytest.raises(ValueError, match="recall_experiences"):
        ConsolidatorConfig(db_path=tmp_path / "c.db", signing_key=key, recall_experiences=-1)


def test_windows_of_another_length_are_left_out_of_the_index(tmp_path, caplog):
    """One robot's records from a bundle with another window stopped the consolidator's
    start (the index could not stack them); they stay stored and stay out of recall."""
    from thinkmem_ros.consolidator.recall_server import index_store

    bundle = world.running_bundle(tmp_path / "running")
    exps = [replace(e, seq=i) for i, e in enumerate(world.experiences("r0", 4, 5, seed=4))]
    short = [replace(e, seq=100 + i, robot_id="r9", window=e.window[-2:],
                     mask=None if e.mask is None else e.mask[-2:])
             for i, e in enumerate(exps[:3])]
    with ExperienceStore(tmp_path / "c.db") as store:
        store.insert_many([(e, encode_experience(e)) for e in exps + short])
    with caplog.at_level("WARNING"):
        index = index_store(tmp_path / "c.db", load_bundle(bundle), limit=0)
    assert sorted(r.seq for r in index.refs) == list(range(len(exps)))
    assert "3 stored experiences with windows other than" in caplog.text
