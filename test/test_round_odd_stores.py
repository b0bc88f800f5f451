"""Rounds on odd stores: what they may grow, and what the gate may publish from them.

A round must never leave its robots unable to ship (a label set past the wire limit), and
never publish on evidence it cannot judge (a handful of held-out rows, no positives).
"""

from dataclasses import replace

import consolidator_world as world
import numpy as np
import pytest
import torch

from thinkmem_ros.consolidator.gate import GateConfig, validate
from thinkmem_ros.consolidator.material import with_labels
from thinkmem_ros.consolidator.retrain import (
    Material,
    RetrainConfig,
    assemble,
    export_candidate,
    keep_running,
)
from thinkmem_ros.consolidator.service import ConsolidatorConfig, ConsolidatorService
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.link.experience import LIMITS, Experience, encode_experience
from thinkmem_ros.link.security import write_signing_keypair
from thinkmem_ros.policy.bundle import load_bundle


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    return load_bundle(world.running_bundle(tmp_path_factory.mktemp("odd") / "running"))


def _store(path, records):
    records = [replace(e, seq=i) for i, e in enumerate(records)]
    with ExperienceStore(path) as store:
        store.insert_many([(e, encode_experience(e)) for e in records])


def _round(tmp_path, records, **config):
    _, key = write_signing_keypair(tmp_path / "keys", "c")
    bundle = world.running_bundle(tmp_path / "running")
    _store(tmp_path / "c.db", records)
    service = ConsolidatorService(ConsolidatorConfig(
        db_path=tmp_path / "c.db", publish_dir=tmp_path / "pub", signing_key=key,
        initial_bundle=bundle, retrain=RetrainConfig(epochs=2), **config))
    return service.run_round("test")


def _many_labels(n_episodes=60, per_episode=5, every=1):
    """A free-form judge: every ``every``-th record's ``required`` names a label of its own
    (300 of them), as the audit's store did."""
    recs = world.experiences("r1", n_episodes, per_episode, seed=3)
    return [replace(e, required=[*(e.required or []), f"check_part_{i // every % 300:03d}"])
            if i % every == 0 else e for i, e in enumerate(recs)]


# ------------------------------------------------------------------ labels and the wire

def test_a_label_named_by_one_record_is_not_grown(running):
    records = _many_labels(120, 5, every=2)  # 300 records name one label each, 300 none
    material = assemble(records, [], running, RetrainConfig(epochs=1))
    assert material.label_names == tuple(running.manifest.labels)
    assert material.counts["labels_left_out"] == 300
    assert material.counts["direct_train"] + material.counts["direct_heldout"] == 600


def test_a_new_label_needs_records_from_more_than_one_episode(running):
    records = world.experiences("r1", 4, 5, seed=3)
    # 15 records name "inspect", all of episode ep000: one episode's word is not a label
    one_episode = [replace(e, required=[*e.required, "inspect"]) if e.episode_id == "ep000"
                   else e for e in records * 3]
    cfg = RetrainConfig(epochs=1, new_label_min_positives=5)
    assert "inspect" not in assemble(one_episode, [], running, cfg).label_names
    two = [replace(e, required=[*e.required, "inspect"]) if e.episode_id in ("ep000", "ep001")
           else e for e in records]
    assert "inspect" in assemble(two, [], running, cfg).label_names
    assert "inspect" in assemble(two, [], running, RetrainConfig(epochs=1)).label_names
    fewer = RetrainConfig(epochs=1, new_label_min_positives=11)  # 10 records: one short
    assert "inspect" not in assemble(two, [], running, fewer).label_names


def test_the_label_set_never_exceeds_the_wire_limit_most_evidenced_first(running):
    records = world.experiences("r1", 4, 5, seed=3)  # episodes ep000..ep003, 5 records each
    first = [f"part_{i:03d}" for i in range(200)]
    second = [f"part_{i:03d}" for i in range(100, 300)]
    records = [replace(e, required=[*e.required, *(first if i < 10 else second)])
               for i, e in enumerate(records)]
    material = assemble(records, [], running, RetrainConfig(epochs=1))
    labels = material.label_names
    assert len(labels) == LIMITS["max_labels"], len(labels)
    assert labels[:len(running.manifest.labels)] == tuple(running.manifest.labels)
    # parts 100-199 are named by 20 records, the others by 10: the 20s come first
    assert set(first[100:]) <= set(labels)
    assert labels[len(running.manifest.labels)] == "part_100"


def test_the_gate_refuses_a_candidate_past_the_wire_limits(tmp_path, running):
    records = world.experiences("r1", 20, 5, seed=3)
    material = assemble(records, [], running, RetrainConfig(epochs=1))
    many = tuple(running.manifest.labels) + tuple(f"part_{i:03d}" for i in range(300))
    wide = Material(train=with_labels(material.train, many),
                    heldout=with_labels(material.heldout, many), units=[])
    kept = keep_running(wide, running)  # the running policy itself: it regresses nothing
    candidate = export_candidate(kept, tmp_path / "cand", model_version=2, current=running,
                                 material=wide)
    report = validate(candidate, running, kept, wide.heldout, [],
                      GateConfig(min_heldout=1, allow_no_heldout=True),
                      np.random.default_rng(0))
    assert not report.passed
    assert any("310 labels" in r and "wire limit" in r for r in report.reasons), report.reasons


def test_a_round_on_free_form_labels_never_publishes_past_the_wire_limit(tmp_path):
    report = _round(tmp_path, _many_labels())
    current = tmp_path / "pub" / "current"
    if report.published_version is not None:
        bundle = load_bundle(current.resolve())
        assert len(bundle.manifest.labels) <= LIMITS["max_labels"]
        labels = list(bundle.manifest.labels)
        Experience(robot_id="r1", episode_id="e", stamp=1.0,  # a robot can still ship
                   window=np.zeros((world.K, 7), np.float32), labels=labels,
                   probabilities=np.zeros(len(labels), np.float32),
                   bundle_version=bundle.version, seq=0)
    assert report.material["labels_left_out"] == 300, report.material


# ------------------------------------------------------------------ evidence the gate needs

def _kept_candidate(tmp_path, running, records):
    """The running policy itself as the candidate: its base predictions are identical, so
    only the amount of evidence decides (the bootstrap's bound is exactly 0)."""
    material = assemble(records, [], running, RetrainConfig(epochs=1))
    kept = keep_running(material, running)
    candidate = export_candidate(kept, tmp_path / "cand", model_version=2, current=running,
                                 material=material)
    return material, kept, candidate


def test_the_gate_refuses_one_held_out_row_by_default(tmp_path, running):
    records = [replace(e, episode_id=f"ep{i}")  # 4 one-experience episodes
               for i, e in enumerate(world.experiences("r1", 4, 1, seed=3))]
    material, kept, candidate = _kept_candidate(tmp_path, running, records)
    assert 0 < len(material.heldout) < 5
    report = validate(candidate, running, kept, material.heldout, [], GateConfig(),
                      np.random.default_rng(0))
    assert not report.passed
    assert any("min_heldout 200" in r for r in report.reasons), report.reasons
    assert any("min_blocks 10" in r for r in report.reasons), report.reasons
    assert report.checks["regression"] == "skipped"


def test_the_gate_refuses_rows_without_positives(tmp_path, running):
    records = [replace(e, required=[]) for e in world.experiences("r1", 200, 5, seed=3)]
    material, kept, candidate = _kept_candidate(tmp_path, running, records)
    assert len(material.heldout) >= 200  # enough rows and episodes, not one positive
    report = validate(candidate, running, kept, material.heldout, [], GateConfig(),
                      np.random.default_rng(0))
    assert not report.passed
    assert [r for r in report.reasons if "min_positives 50" in r] == report.reasons
    assert report.checks["evidence"]["base_positives"] == 0


def test_the_gate_refuses_rows_from_too_few_episodes(tmp_path, running):
    records = world.experiences("r1", 8, 60, seed=3)  # long episodes: few blocks
    material, kept, candidate = _kept_candidate(tmp_path, running, records)
    cfg = GateConfig(min_heldout=len(material.heldout))
    report = validate(candidate, running, kept, material.heldout, [], cfg,
                      np.random.default_rng(0))
    assert report.checks["evidence"]["blocks"] < 10
    assert not report.passed
    assert [r for r in report.reasons if "min_blocks 10" in r] == report.reasons


def test_the_gate_judges_when_the_evidence_meets_every_floor(tmp_path, running):
    records = world.experiences("r1", 200, 5, seed=3)
    material, kept, candidate = _kept_candidate(tmp_path, running, records)
    report = validate(candidate, running, kept, material.heldout, [], GateConfig(),
                      np.random.default_rng(0))
    assert report.passed, report.reasons
    evidence = report.checks["evidence"]
    assert evidence["situations"] >= 200 and evidence["blocks"] >= 10
    assert evidence["base_positives"] >= 50
    assert report.checks["noninferiority"]["micro"]["lower"] == 0.0


@pytest.mark.parametrize("kind", ["tiny", "nothing_needed"])
def test_a_round_on_evidence_it_cannot_judge_publishes_nothing(tmp_path, kind):
    if kind == "tiny":
        records = [replace(e, episode_id=f"ep{i}")
                   for i, e in enumerate(world.experiences("r1", 4, 1, seed=3))]
    else:
        records = [replace(e, required=[]) for e in world.experiences("r1", 40, 5, seed=3)]
    report = _round(tmp_path, records)
    assert report.published_version is None, (report.outcome, report.gate)
    assert report.outcome == "rejected by the gate"
    assert not (tmp_path / "pub" / "current").exists()
    assert report.gate is not None and any("too few" in r or "cannot" in r
                                           for r in report.gate.reasons)


# ------------------------------------------------------------------ the event vocabulary

def test_codes_of_one_episode_do_not_grow_the_vocabulary(running):
    records = world.experiences("r1", 40, 5, seed=3)
    unique = [replace(e, events=[*e.events, *(f"obj_{i}_{j}" for j in range(20))])
              for i, e in enumerate(records)]
    material = assemble(unique, [], running, RetrainConfig(epochs=1))
    assert not [c for c in material.event_vocabulary if c.startswith("obj_")]
    # the planted rule's codes are in every few episodes: they still join
    assert {"EA", "EB", "EC"} <= set(material.event_vocabulary)


def test_the_vocabulary_is_capped_most_frequent_first(running):
    base = world.experiences("r1", 10, 1, seed=3)
    # 5,000 codes, each in exactly 2 of 10 one-record episodes; "hot" in all 10
    records = [replace(e, events=["hot", *(f"c{(k * 500 + j) % 5000}" for j in range(1000))])
               for k, e in enumerate(base)]
    material = assemble(records, [], running, RetrainConfig(epochs=1))
    vocabulary = material.event_vocabulary
    assert len(vocabulary) == 4096
    assert vocabulary[:len(running.manifest.event_vocabulary)] == tuple(
        running.manifest.event_vocabulary)
    assert vocabulary[len(running.manifest.event_vocabulary)] == "hot"
    small = assemble(records, [], running, RetrainConfig(epochs=1, max_event_vocabulary=12))
    assert len(small.event_vocabulary) == 12 and "hot" in small.event_vocabulary
