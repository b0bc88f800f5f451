"""A full consolidation round in-process, and the gate refusing a damaged candidate."""

import logging
from dataclasses import replace

import consolidator_world as world
import numpy as np
import pytest
import torch
from waiting import wait

from thinkmem_ros.consolidator.gate import GateConfig, validate
from thinkmem_ros.consolidator.knowledge import KnowledgeStore
from thinkmem_ros.consolidator.retrain import RetrainConfig, assemble, export_candidate, retrain
from thinkmem_ros.consolidator.service import ConsolidatorConfig, ConsolidatorService
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.consolidator.trigger import TriggerConfig
from thinkmem_ros.link.security import verify_signed_bundle, write_signing_keypair
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig
from thinkmem_ros.policy.bundle import load_bundle
from thinkmem_ros.policy.runtime import PolicyRuntime
from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.fixture
def setup(tmp_path):
    pub, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    bundle = world.running_bundle(tmp_path / "running")
    return {"pub": pub, "key": key, "bundle": bundle}




def test_round_end_to_end_ships_discovers_retrains_gates_signs_and_pushes(tmp_path, setup,
                                                                          caplog):
    # the tiny running bundle's outputs sit close to its thresholds: distilling it exactly
    # would copy decisions that flip on the next nudge, so only its sure cells are distilled
    config = ConsolidatorConfig(db_path=tmp_path / "c.db", publish_dir=tmp_path / "pub",
                                signing_key=setup["key"], initial_bundle=setup["bundle"],
                                bind="tcp://127.0.0.1:*",
                                trigger=TriggerConfig(buffer_limit=200),
                                retrain=RetrainConfig(distill_margin=0.1),
                                gate=GateConfig(**world.JUDGE_SMALL))  # 55 held-out rows
    installed = []
    robot = BundleReceiver(BundleReceiverConfig(tmp_path / "robot", setup["pub"],
                                                current_version=1), on_install=installed.append)
    records = world.experiences("r1", 40, 5, seed=1)
    with ConsolidatorService(config) as service:
        shipper = ExperienceShipper(ShipperConfig(
            endpoint=service.endpoint, robot_id="r1", spool_path=tmp_path / "spool.db",
            on_bundle_push=robot.handle_push)).start()
        try:
            for record in records:
                assert shipper.ship(record)
            assert shipper.flush(20.0), shipper.stats()
            # 200 new experiences fire the buffer trigger (on_stored runs just after the ACK)
            assert wait(lambda: service.trigger.reason() == "buffer")
            with caplog.at_level(logging.INFO, logger="thinkmem_ros.consolidator.service"):
                report = service.run_round("test")
            assert wait(lambda: installed), (report.to_dict(), robot.stats())
        finally:
            shipper.close()
    assert report.experiences == 200 and report.episodes == 40
    assert report.accepted >= 1 and "EA>EB>EC" in report.promoted
    assert report.gate is not None and report.gate.passed, report.gate
    assert report.policy == "retrained" and report.attempts == []
    assert report.published_version == 2 and report.pushed_to == 1
    assert "gate pass" in caplog.text and "trigger test" in caplog.text
    assert "EA>EB>EC" not in report.waiting and "waiting for more evidence" in caplog.text
    with KnowledgeStore(tmp_path / "c.db") as kstore:
        unit = {u.key: u for u in kstore.load()}["EA>EB>EC"]
    assert unit.status == "promoted" and unit.thinking == "consider:EC"
    # the robot installed exactly the published, signed v2 which now knows consider:EC
    assert installed == [tmp_path / "robot" / "v000002"]
    bundle = verify_signed_bundle(installed[0], setup["pub"])
    assert bundle.version == 2 and "consider:EC" in bundle.manifest.labels
    assert bundle.manifest.extras["parent_version"] == 1
    runtime = PolicyRuntime(bundle)
    vocab = {name: i + 1 for i, name in enumerate(bundle.manifest.event_vocabulary)}
    col = bundle.manifest.labels.index("consider:EC")
    prefix = np.array([[0, vocab["F1"], vocab["EA"], vocab["F2"], vocab["EB"], vocab["F3"]]])
    zeros = np.zeros((1, world.K, 7), np.float32)
    assert runtime.predict(zeros, zeros, prefix).probabilities[0, col] >= runtime.thresholds[col]
    rule = report.gate.checks["rules"]["EA>EB>EC"]  # held-out prefixes vs B...A, B, filler
    assert rule["recall"] >= 0.8 and rule["false_rate"] <= 0.2
    assert report.gate.checks["f1_candidate"] >= report.gate.checks["f1_running"] - 0.02
    with ExperienceStore(tmp_path / "c.db") as store:
        assert store.count() == 200


def test_gate_rejects_a_damaged_candidate_with_a_reason(tmp_path, setup):
    running = load_bundle(setup["bundle"])
    # 200 episodes: the default gate's evidence floors are met (>= 200 held-out rows)
    records = world.experiences("r1", 200, 5, seed=2)
    material = assemble(records, [], running, RetrainConfig(epochs=3))
    trained = retrain(material, running, RetrainConfig(epochs=3))
    with torch.no_grad():  # deliberate damage: the head predicts the opposite
        trained.model.head.weight.mul_(-5.0)
        trained.model.head.bias.fill_(2.0)
    candidate = export_candidate(trained, tmp_path / "cand", model_version=2, current=running,
                                 material=material)
    report = validate(candidate, running, trained, material.heldout, [], GateConfig(),
                      np.random.default_rng(0))
    assert not report.passed
    assert any("regressed" in r for r in report.reasons), report.reasons
    assert report.checks["f1_candidate"] < report.checks["f1_running"] - 0.02
    assert report.checks["parity_max_abs"] <= 1e-4  # damaged, but ONNX still matches torch
    # a stale candidate (not newer) and one without held-out material are refused too
    stale = validate(running, running, trained, material.heldout, [], GateConfig(),
                     np.random.default_rng(0))
    assert any("not newer" in r for r in stale.reasons)
    empty = validate(candidate, running, trained, material.heldout.subset(np.arange(0)), [],
                     GateConfig(), np.random.default_rng(0))
    assert any("held-out" in r for r in empty.reasons)


def test_a_round_whose_retraining_regresses_ships_its_rules_with_the_running_policy(
        tmp_path, setup, monkeypatch):
    import thinkmem_ros.consolidator.retrain as retrain_module
    from thinkmem_ros.consolidator.store import ExperienceStore
    from thinkmem_ros.link.experience import encode_experience

    real = retrain_module.retrain

    def damaged(*args, **kwargs):  # a retraining that forgot the base skills
        trained = real(*args, **kwargs)
        with torch.no_grad():
            trained.model.head.weight.mul_(-5.0)
        return trained

    monkeypatch.setattr(retrain_module, "retrain", damaged)
    records = [replace(e, seq=i) for i, e in enumerate(world.experiences("r1", 40, 5, seed=1))]
    with ExperienceStore(tmp_path / "c.db") as store:
        store.insert_many([(e, encode_experience(e)) for e in records])
    service = ConsolidatorService(ConsolidatorConfig(
        db_path=tmp_path / "c.db", publish_dir=tmp_path / "pub", signing_key=setup["key"],
        initial_bundle=setup["bundle"], retrain=RetrainConfig(epochs=2),
        gate=GateConfig(**world.JUDGE_SMALL)))  # the fallback, not the gate's floors
    report = service.run_round("test")
    assert "EA>EB>EC" in report.promoted
    assert [a["policy"] for a in report.attempts] == ["retrained"]
    assert any("regressed" in r for r in report.attempts[0]["reasons"])
    assert report.policy == "kept v1" and report.outcome == "published", report.gate
    ni = report.gate.checks["noninferiority"]["micro"]
    assert ni["delta"] == 0.0 and ni["lower"] == 0.0  # the running policy's own answers
    assert report.gate.checks["rules"]["EA>EB>EC"]["recall"] >= 0.8  # held by the tracker
    v2 = service.publisher.current()
    assert v2.version == 2 and v2.manifest.extras["policy_kept_from"] == 1
    assert "consider:EC" in v2.manifest.labels
    running = load_bundle(setup["bundle"])
    assert v2.manifest.event_vocabulary == running.manifest.event_vocabulary
    zeros = np.zeros((3, world.K, 7), np.float32)
    events = np.array([[0, 0, 0, 1, 2, 3]] * 3)
    new, old = PolicyRuntime(v2), PolicyRuntime(running)
    p_new = new.predict(zeros, zeros, events).probabilities
    p_old = old.predict(zeros, zeros, events).probabilities
    assert np.allclose(p_new[:, :len(running.manifest.labels)], p_old, atol=1e-5)
    assert p_new[:, v2.manifest.labels.index("consider:EC")].max() < 1e-6  # silent


def test_a_round_over_a_larger_store_reads_a_bounded_sample_and_still_discovers(tmp_path,
                                                                                setup):
    from thinkmem_ros.link.experience import encode_experience

    records = [replace(e, seq=i) for i, e in enumerate(world.experiences("r1", 40, 5, seed=1))]
    with ExperienceStore(tmp_path / "c.db") as store:
        store.insert_many([(e, encode_experience(e)) for e in records])
    service = ConsolidatorService(ConsolidatorConfig(
        db_path=tmp_path / "c.db", publish_dir=tmp_path / "pub", signing_key=setup["key"],
        initial_bundle=setup["bundle"], retrain=RetrainConfig(epochs=2),
        round_experiences=100))
    report = service.run_round("test")
    assert report.stored_experiences == 200
    assert 0 < report.experiences <= 100 and report.experiences % 5 == 0  # whole episodes
    assert report.episodes == 40  # discovery reads every episode's events, not the sample
    assert "EA>EB>EC" in report.promoted


def test_a_round_on_a_streaming_bundle_publishes_a_streaming_candidate(tmp_path, setup):
    """The per-frame GRU bundle goes through a round as it is: fine-tuned, gated on the
    node's per-frame path, published, and still run by the compiled per-frame update."""
    from thinkmem_ros.link.experience import encode_experience

    running = world.running_bundle(tmp_path / "stream_v1", streaming=True)
    records = [replace(e, seq=i) for i, e in enumerate(world.experiences("r1", 40, 5, seed=1))]
    with ExperienceStore(tmp_path / "c.db") as store:
        store.insert_many([(e, encode_experience(e)) for e in records])
    service = ConsolidatorService(ConsolidatorConfig(
        db_path=tmp_path / "c.db", publish_dir=tmp_path / "pub", signing_key=setup["key"],
        initial_bundle=running, retrain=RetrainConfig(distill_margin=0.1),
        gate=GateConfig(**world.JUDGE_SMALL)))  # the streaming path, not the gate's floors
    report = service.run_round("test")
    assert "EA>EB>EC" in report.promoted, report.to_dict()
    assert report.published_version == 2, report.to_dict()
    bundle = verify_signed_bundle(service.publisher.current().path, setup["pub"])
    m = bundle.manifest
    assert m.streaming and m.model_config["kind"] == "gru" and m.model_config["hidden"] == 32
    assert "consider:EC" in m.labels and m.extras["parent_version"] == 1
    runtime = PolicyRuntime(bundle)
    assert runtime.streaming and runtime.embedding_dim == 32
    vocab = {name: i + 1 for i, name in enumerate(m.event_vocabulary)}
    zeros = np.zeros((world.K, 7), np.float32)
    prefix = np.array([0, vocab["F1"], vocab["EA"], vocab["F2"], vocab["EB"], vocab["F3"]])
    got = runtime.predict_frame(zeros, np.ones_like(zeros), prefix, t=0.0)
    assert got.probabilities.shape == (1, len(m.labels))
    assert got.embedding.shape == (1, 32)
    assert report.policy == "retrained", report.attempts  # not the running policy kept
    col = m.labels.index("consider:EC")  # the rule was learned and the gate saw it fire
    assert got.probabilities[0, col] >= runtime.thresholds[col]
    assert report.gate.passed and report.gate.checks["rules"]["EA>EB>EC"]["recall"] >= 0.8
    ni = report.gate.checks["noninferiority"]["micro"]
    assert ni["candidate"] >= ni["running"] - 0.005, ni


def test_the_round_log_line_lists_a_long_list_in_part():
    from thinkmem_ros.consolidator.service import LOGGED_NAMES, _capped

    assert _capped([]) == "none"
    assert _capped(["a>b>c"]) == "[a>b>c]"
    names = [f"x{i}>y>z" for i in range(LOGGED_NAMES + 5)]
    line = _capped(names)
    assert line.endswith(" and 5 more]") and f"x{LOGGED_NAMES - 1}>y>z" in line
    assert f"x{LOGGED_NAMES}>y>z" not in line
