"""The gate's regression check on held-out direct episodes plus a held-out slice of D."""

import consolidator_world as world
import numpy as np
import pytest
import torch

from thinkmem_ros.consolidator.gate import GateConfig, combined_heldout, rule_probes, validate
from thinkmem_ros.consolidator.knowledge import KnowledgeUnit
from thinkmem_ros.consolidator.retrain import (
    RetrainConfig,
    assemble,
    export_candidate,
    retrain,
    split_rehearsal,
)
from thinkmem_ros.policy.bundle import load_bundle


@pytest.fixture(scope="module")
def round_material(tmp_path_factory):
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("gate_heldout")
    running = load_bundle(world.running_bundle(tmp / "b"))
    records = world.experiences("r1", 20, 5, seed=3)
    d = world.base_material(300, np.random.default_rng(4))
    material = assemble(records, [], running, RetrainConfig(epochs=1), rehearsal=d)
    return tmp, running, material


def test_split_rehearsal_is_seeded_disjoint_and_keeps_a_training_row():
    d = world.base_material(100, np.random.default_rng(1))
    train, held = split_rehearsal(d, 0.2, np.random.default_rng(7))
    again_train, again_held = split_rehearsal(d, 0.2, np.random.default_rng(7))
    assert len(held) == 20 and len(train) == 80
    assert np.array_equal(held.signals, again_held.signals)
    rows = {r.tobytes() for r in train.signals}
    assert not any(r.tobytes() in rows for r in held.signals)
    assert split_rehearsal(d, 0.0, np.random.default_rng(7))[1] is None
    one = d.subset(np.arange(1))
    assert split_rehearsal(one, 0.9, np.random.default_rng(7))[1] is None


def test_assemble_holds_out_rows_of_d_never_trained_on(round_material):
    _, _, material = round_material
    held = material.heldout_rehearsal
    assert material.counts["rehearsal_heldout"] == len(held) == 60
    assert material.counts["rehearsal"] == 240
    trained = {r.tobytes() for r in material.train.signals}
    assert not any(r.tobytes() in trained for r in held.signals)
    assert held.label_names == material.heldout.label_names


def test_gate_judges_regression_on_direct_plus_rehearsal_rows(round_material):
    tmp, running, material = round_material
    trained = retrain(material, running, RetrainConfig(epochs=1))
    with torch.no_grad():  # deliberate damage the real retraining cannot be relied on to do
        trained.model.head.weight.mul_(-5.0)
        trained.model.head.bias.fill_(2.0)
    candidate = export_candidate(trained, tmp / "cand", model_version=2, current=running,
                                 material=material)
    n_dir, n_d = len(material.heldout), len(material.heldout_rehearsal)
    # the floor at exactly the rows there are: judged (the evidence floors' own defaults are
    # tested in test_round_odd_stores.py), and one more row below refuses it (strict)
    report = validate(candidate, running, trained, material.heldout, [],
                      GateConfig(min_heldout=n_dir + n_d), np.random.default_rng(0),
                      rehearsal_heldout=material.heldout_rehearsal)
    assert report.checks["heldout_rows"] == n_dir + n_d
    assert report.checks["heldout_rows_by_source"] == {"direct": n_dir, "rehearsal": n_d}
    assert set(report.checks["f1_by_source"]) == {"direct", "rehearsal"}
    assert any("regressed" in r for r in report.reasons), report.reasons
    # too few rows in all: refused with a reason naming the floor, not judged on noise
    strict = validate(candidate, running, trained, material.heldout, [],
                      GateConfig(min_heldout=n_dir + n_d + 1), np.random.default_rng(0),
                      rehearsal_heldout=material.heldout_rehearsal)
    assert any("min_heldout" in r for r in strict.reasons), strict.reasons
    assert strict.checks["regression"] == "skipped"


def test_combined_heldout_refuses_misaligned_parts(round_material):
    _, _, material = round_material
    both, sources = combined_heldout(material.heldout, material.heldout_rehearsal)
    assert len(both) == sources["direct"].sum() + sources["rehearsal"].sum()
    other = world.base_material(10, np.random.default_rng(2))
    with pytest.raises(ValueError, match="not aligned"):
        combined_heldout(material.heldout, other)


def test_rule_probes_never_count_the_antecedent_as_a_negative():
    one = KnowledgeUnit(pattern=("A", "C"), relation="sequence2", constraints={},
                        thinking="consider:C", confidence=0.9, status="promoted")
    two = KnowledgeUnit(pattern=("A", "B", "D"), relation="sequence3", constraints={},
                        thinking="consider:D", confidence=0.9, status="promoted")
    vocab = ("A", "B", "C", "D", "x", "y", "z")
    for unit, pos, neg in rule_probes([one, two], vocab, 6, 9, np.random.default_rng(0)):
        ante = list(unit.antecedent)
        assert all(h.index(ante[0]) <= h.index(ante[-1]) for h in pos)
        for h in neg:  # without the antecedent in order
            assert not all(a in h for a in ante) or h.index(ante[0]) > h.index(ante[-1])
        if len(ante) == 1:
            assert not any(ante[0] in h for h in neg)
        else:
            assert any(h.count(ante[-1]) == 1 and ante[0] not in h for h in neg)
