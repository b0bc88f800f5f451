"""A round's discovery reads only the episodes of its own signal set (``SignalSetFilter``);
its log line says where a publication went."""

import logging
from dataclasses import replace

import consolidator_world as world
import pytest
import torch

from thinkmem_ros.consolidator.knowledge import KnowledgeStore
from thinkmem_ros.consolidator.retrain import NothingToTrain
from thinkmem_ros.consolidator.service import ConsolidatorConfig, ConsolidatorService
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.core.vocabulary import SIGNALS
from thinkmem_ros.link.experience import encode_experience
from thinkmem_ros.link.security import write_signing_keypair
from thinkmem_ros.policy.bundle import load_bundle, signal_set_fingerprint

FOREIGN = "ab" * 32  # another robot model's signal-set fingerprint


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    _, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    bundle = world.running_bundle(tmp_path / "running")

    def stop_after_discovery(*args, **kwargs):  # what is asked here is decided by then
        raise NothingToTrain("test: discovery only")

    monkeypatch.setattr("thinkmem_ros.consolidator.retrain.assemble", stop_after_discovery)
    return {"key": key, "bundle": bundle}


def _store(path, records):
    seqs: dict[str, int] = {}
    rows = []
    for e in records:
        seqs[e.robot_id] = seqs.get(e.robot_id, -1) + 1
        e = replace(e, seq=seqs[e.robot_id])
        rows.append((e, encode_experience(e)))
    with ExperienceStore(path) as store:
        store.insert_many(rows)


def _service(folder, setup, **overrides) -> ConsolidatorService:
    return ConsolidatorService(ConsolidatorConfig(
        db_path=folder / "c.db", publish_dir=folder / "pub", signing_key=setup["key"],
        initial_bundle=setup["bundle"], **overrides))


def _mixed(foreign_signal_set: str) -> list:
    """This line's episodes without the planted rule, two robots of another model's with it."""
    own = [replace(e, events=[x for x in e.events if x not in world.RULE])
           for e in world.experiences("r1", 40, 5, seed=3)]
    other = [replace(e, signal_set=foreign_signal_set)
             for robot, seed in (("m1", 4), ("m2", 5))
             for e in world.experiences(robot, 40, 5, seed=seed)]
    return own + other


def _rule_units(db) -> list[str]:
    with KnowledgeStore(db) as knowledge:
        return [key for key in knowledge.units() if set(key.split(">")) & set(world.RULE)]


def test_discovery_leaves_out_episodes_of_another_signal_set(tmp_path, setup):
    mixed = tmp_path / "mixed"
    _store(mixed / "c.db", _mixed(FOREIGN))
    service = _service(mixed, setup)
    report = service.run_round("test")
    assert report.stored_experiences == 600 and report.experiences == 200  # training's read
    assert report.episodes == 40, report.to_dict()  # discovery: this line's episodes only
    assert report.read["histories"]["refused_episodes"] == 80
    assert "EA>EB>EC" not in report.promoted, report.to_dict()
    assert not [w for w in report.waiting if set(w.split(">")) & set(world.RULE)]
    assert _rule_units(mixed / "c.db") == []  # nothing of the rule scored or kept
    # the next round judges what arrived since: a third robot of that model is left out too
    _store(mixed / "c.db", [replace(e, signal_set=FOREIGN)
                            for e in world.experiences("m3", 40, 5, seed=6)])
    report = service.run_round("test")
    assert report.episodes == 40 and report.read["histories"]["refused_episodes"] == 120
    assert _rule_units(mixed / "c.db") == [], report.to_dict()

    # the same store for a consolidator that serves the other model's signal set too: the
    # rule is there to be found
    unfiltered = tmp_path / "unfiltered"
    _store(unfiltered / "c.db", _mixed(FOREIGN))
    service = _service(unfiltered, setup)
    service.accept.served[FOREIGN] = len(SIGNALS)
    report = service.run_round("test")
    assert report.episodes == 120 and "EA>EB>EC" in report.promoted, report.to_dict()

    # the other model's episodes recorded with this line's signal set: read, rule found
    own = tmp_path / "own"
    manifest = load_bundle(setup["bundle"]).manifest
    _store(own / "c.db", _mixed(manifest.signal_set or signal_set_fingerprint(manifest)))
    report = _service(own, setup).run_round("test")
    assert report.episodes == 120 and "EA>EB>EC" in report.promoted, report.to_dict()
    assert "EA>EB>EC" in _rule_units(own / "c.db")


def test_refused_episodes_take_no_share_of_the_discovery_horizon(tmp_path, setup):
    # 200 episodes of 100 events per robot; the horizon holds 104 of them in all
    def long_episodes(robot, signal_set):
        return [replace(e, events=[f"F{i % 8}" for i in range(100)], signal_set=signal_set)
                for e in world.experiences(robot, 200, 1, seed=5)]

    _store(tmp_path / "c.db", long_episodes("r1", "") + long_episodes("m2", FOREIGN))
    report = _service(tmp_path, setup, discovery_events=10_486).run_round("test")
    horizon = report.read["histories"]["horizon"]
    # this line's robot gets the whole horizon, not the share the other model's would take
    assert report.episodes == 104, report.to_dict()
    assert horizon["robots"] == 1 and horizon["episodes"] == 104
    assert horizon["left_out_episodes"] == 96  # this line's older episodes
    assert report.read["histories"]["refused_episodes"] == 200


def test_the_round_log_line_says_a_publication_no_receiver_pushed(caplog):
    from thinkmem_ros.consolidator.service import RoundReport

    def line(**published) -> str:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="thinkmem_ros.consolidator.service"):
            ConsolidatorService._log(RoundReport(reason="once", outcome="published",
                                                 **published))
        return caplog.records[-1].getMessage()

    once = line(published_version=2, pushed_to=None)  # --once: no receiver in the process
    assert "None" not in once, once
    assert "published v2, pushed to no robot from this process" in once
    assert "published v2 to 1 robot in" in line(published_version=2, pushed_to=1)
    assert "published v2 to 3 robots in" in line(published_version=2, pushed_to=3)
    assert "published in" in line()
