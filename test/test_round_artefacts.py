"""Each published round ships values and memory-control probes fitted from the store."""

import hashlib
from dataclasses import replace

import consolidator_world as world
import numpy as np
import pytest
import torch

from thinkmem_ros.consolidator.gate import GateConfig
from thinkmem_ros.consolidator.memctl_train import experience_targets
from thinkmem_ros.consolidator.publish import attach_artefacts, push_frame
from thinkmem_ros.consolidator.retrain import RetrainConfig
from thinkmem_ros.consolidator.service import ConsolidatorConfig, ConsolidatorService
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.link.experience import encode_experience
from thinkmem_ros.link.protocol import decode_frame
from thinkmem_ros.link.security import write_signing_keypair
from thinkmem_ros.policy.memctl_heads import MemctlHeads, ProbeHead
from thinkmem_ros.policy.value_table import ValueTable

ARTEFACT_FILES = {"values.npz", "values.json", "memctl.npz", "memctl.json"}
# this file checks what a round ships, not how good the candidate is (test_gate_* do that)
OPEN_GATE = GateConfig(f1_tolerance=1.0, label_f1_tolerance=1.0, rule_recall=0.0,
                       rule_false_rate=1.0, **world.JUDGE_SMALL)


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def _records(seed, rewards):
    rng = np.random.default_rng(seed)
    out = world.experiences("r1", 44, 5, seed=seed)  # 220: above MIN_JUDGED
    # the node activated what was needed (and sometimes more): values get credit to learn
    return [replace(e, seq=i, reward=float(rng.random()) if rewards else None,
                    probabilities=np.where([n in e.required or rng.random() < 0.2
                                            for n in e.labels], 0.9, 0.1).astype(np.float32))
            for i, e in enumerate(out)]


def _service(tmp_path, db, records, initial, key):
    with ExperienceStore(db) as store:
        store.insert_many([(e, encode_experience(e)) for e in records])
    return ConsolidatorService(ConsolidatorConfig(
        db_path=db, publish_dir=tmp_path / "pub", signing_key=key, initial_bundle=initial,
        retrain=RetrainConfig(epochs=2), gate=OPEN_GATE))


def test_rounds_fit_ship_and_carry_their_artefacts(tmp_path):
    pub, key = write_signing_keypair(tmp_path / "keys", "c")
    initial = world.running_bundle(tmp_path / "running")
    # round 1: rewards and hindsight in the store -> both fitted, signed, pushed
    first = _service(tmp_path, tmp_path / "a.db", _records(1, rewards=True), initial, key)
    report = first.run_round("test")
    assert report.outcome == "published", (report.outcome, report.gate)
    assert report.artefacts["values"]["status"] == "fitted"
    assert report.artefacts["values"]["rated"] == 220
    assert report.artefacts["memctl"]["status"] == "fitted"
    v2 = first.publisher.current()  # signature verified
    listed = v2.manifest.extras["artefacts"]
    assert ARTEFACT_FILES <= set(listed)  # (the round's anticipation rules ship beside them)
    for name, sha in listed.items():
        assert hashlib.sha256((v2.path / name).read_bytes()).hexdigest() == sha
    d = int(v2.manifest.model_config["d_model"])
    assert ValueTable.load(v2.path).dim == d
    assert MemctlHeads.load(v2.path).compress.weights.shape == (d,)
    assert set(decode_frame(push_frame(v2.path)).body["artefacts"]) == set(listed)
    # round 2: a store without rewards -> the value table is carried over, and says why
    second = _service(tmp_path, tmp_path / "b.db", _records(2, rewards=False), initial, key)
    report = second.run_round("test")
    assert report.outcome == "published", (report.outcome, report.gate)
    values = report.artefacts["values"]
    assert values["status"] == "carried" and values["from_version"] == 2
    assert "reward" in values["reason"]
    assert report.artefacts["memctl"]["status"] == "fitted"
    v3 = second.publisher.current()
    assert v3.version == 3 and ARTEFACT_FILES <= set(v3.manifest.extras["artefacts"])
    assert (v3.path / "values.npz").read_bytes() == (v2.path / "values.npz").read_bytes()
    assert (v3.path / "memctl.npz").read_bytes() != (v2.path / "memctl.npz").read_bytes()


def test_a_round_with_nothing_to_fit_or_carry_says_so(tmp_path):
    _, key = write_signing_keypair(tmp_path / "keys", "c")
    initial = world.running_bundle(tmp_path / "running")  # ships without artefacts
    records = [replace(e, required=None) if e.stamp % 100 >= 1 else e
               for e in _records(3, rewards=False)]  # few hindsight labels, no rewards
    report = _service(tmp_path, tmp_path / "c.db", records, initial, key).run_round("test")
    assert report.outcome == "published", (report.outcome, report.gate)
    for kind, needs in (("values", "reward"), ("memctl", "required")):
        info = report.artefacts[kind]
        assert info["status"] == "none" and needs in info["reason"]
        assert "none to carry over" in info["reason"]
    current = ConsolidatorService(ConsolidatorConfig(
        db_path=tmp_path / "c.db", publish_dir=tmp_path / "pub", signing_key=key,
        initial_bundle=initial)).publisher.current()
    listed = current.manifest.extras.get("artefacts") or {}
    assert not ARTEFACT_FILES & set(listed)


def test_memctl_targets_follow_each_episode_in_time():
    records = _records(4, rewards=False)
    ordered, compress, recall = experience_targets(records, ["trend", "hazard"], 10.0, 4)
    assert len(ordered) == len(records) == compress.size == recall.size
    episodes = [e.episode_id for e in ordered]
    assert episodes == sorted(episodes)  # episode by episode, in stamp order
    # COMPRESS: no temporal thinking (trend) in the window or its horizon
    for exp, c in zip(ordered, compress, strict=True):
        if "trend" in exp.required:
            assert c == 0
    assert 0 < compress.mean() < 1 and 0 < recall.mean() < 1


def test_attach_lists_hashes_and_refuses_a_missing_file(tmp_path):
    from conftest import copy_bundle

    from thinkmem_ros.consolidator.publish import PublishError
    from thinkmem_ros.policy.bundle import load_bundle

    folder = copy_bundle(world.running_bundle(tmp_path / "b"), tmp_path / "staged",
                         model_version=2)
    arts = tmp_path / "arts"
    dim = int(load_bundle(folder).manifest.model_config["d_model"])
    ValueTable(["trend"], dim).save(arts)
    listed = attach_artefacts(folder, {"values": arts})
    assert set(listed) == {"values.npz", "values.json"}
    assert load_bundle(folder).manifest.extras["artefacts"] == listed
    with pytest.raises(PublishError, match="memctl"):
        attach_artefacts(folder, {"memctl": arts})
    # a later kind joins the listing; what was attached before stays, byte for byte
    MemctlHeads(*(ProbeHead(np.ones(dim), 0.0, 0.5) for _ in range(2))).save(arts)
    both = attach_artefacts(folder, {"memctl": arts})
    assert set(both) == ARTEFACT_FILES and both["values.npz"] == listed["values.npz"]
    assert load_bundle(folder).manifest.extras["artefacts"] == both
    for name, sha in both.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == sha
