"""Anchored retraining: what the running bundle knew stays where the round does not touch it."""

import dataclasses

import consolidator_world as world
import numpy as np
import pytest
import torch

from thinkmem_ros.consolidator.knowledge import KnowledgeUnit
from thinkmem_ros.consolidator.retrain import (
    RetrainConfig,
    assemble,
    export_candidate,
    keep_running,
    retrain,
    running_probabilities,
)
from thinkmem_ros.policy.bundle import load_bundle, write_bundle
from thinkmem_ros.policy.runtime import PolicyRuntime
from thinkmem_ros.policy.training.train import predict_proba

UNIT = KnowledgeUnit(pattern=("EA", "EB", "EC"), relation="sequence3", constraints={},
                     thinking="consider:EC", status="promoted")


@pytest.fixture(scope="module")
def round_material(tmp_path_factory):
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("anchored")
    running = load_bundle(world.running_bundle(tmp / "b"))
    records = world.experiences("r1", 30, 5, seed=4)
    d = world.base_material(200, np.random.default_rng(5))
    return tmp, running, records, d


def _base_probs(model_or_bundle, data, running):
    base = len(running.manifest.labels)
    if hasattr(model_or_bundle, "model"):
        return predict_proba(model_or_bundle, data)[:, :base]
    return running_probabilities(model_or_bundle, data)


def test_frozen_weights_keep_every_answer_on_inputs_without_new_codes(round_material):
    _, running, records, d = round_material
    cfg = RetrainConfig(epochs=2, base_lr=0.0, val_fraction=0.0)
    material = assemble(records, [UNIT], running, cfg, rehearsal=d)
    trained = retrain(material, running, cfg)
    plain = material.heldout_rehearsal  # D's held-out rows: filler codes only
    assert not {"EA", "EB", "EC"} & {plain.event_vocabulary[i - 1]
                                     for i in np.unique(plain.events) if i}
    got = _base_probs(trained, plain, running)
    want = running_probabilities(running, plain)
    assert np.abs(got - want).max() < 1e-5
    # ...while the same run with the old weights free to move does change them
    free = retrain(material, running, RetrainConfig(epochs=2, base_lr=2e-3, distill=0.0,
                                                    val_fraction=0.0))
    assert np.abs(_base_probs(free, plain, running) - want).max() > 1e-3


def test_discovered_prefixes_sit_on_real_windows_with_their_base_labels(round_material):
    _, running, records, d = round_material
    cfg = RetrainConfig(rehearsal_heldout_fraction=0.0)
    material = assemble(records, [UNIT], running, cfg, rehearsal=d)
    n = material.counts["discovered"]
    disc = material.train.subset(np.arange(len(material.train) - n, len(material.train)))
    assert disc.mask.sum(axis=(1, 2)).min() > 0  # no empty window left
    col = disc.label_names.index("consider:EC")
    assert disc.labels[:, col].sum() == cfg.positives_per_unit
    donors = {r.tobytes(): lab for r, lab in zip(material.train.signals[:len(d)],
                                                 material.train.labels[:len(d)], strict=True)}
    base = [j for j, name in enumerate(disc.label_names) if not name.startswith("consider:")]
    matched = [np.array_equal(donors[r.tobytes()][base], lab[base])
               for r, lab in zip(disc.signals, disc.labels, strict=True) if r.tobytes() in donors]
    assert matched and all(matched)
    bare = assemble(records, [UNIT], running, RetrainConfig(discovered_context=False),
                    rehearsal=d)
    tail = bare.train.mask[len(bare.train) - n:]
    assert tail.max() == 0.0  # the option off: event-only rows as before


def test_keep_running_answers_like_the_running_bundle_and_never_fires_new_labels(
        round_material, tmp_path):
    _, running, records, d = round_material
    material = assemble(records, [UNIT], running, RetrainConfig(), rehearsal=d)
    kept = keep_running(material, running)
    cand = export_candidate(kept, tmp_path / "kept", model_version=2, current=running,
                            material=material)
    assert cand.manifest.event_vocabulary == running.manifest.event_vocabulary
    assert cand.manifest.labels[:len(running.manifest.labels)] == running.manifest.labels
    rows = d.subset(np.arange(50))
    new, old = PolicyRuntime(cand), PolicyRuntime(running)
    p_new = new.predict(rows.signals, rows.mask, rows.events).probabilities
    p_old = old.predict(rows.signals, rows.mask, rows.events).probabilities
    base = len(running.manifest.labels)
    assert np.allclose(p_new[:, :base], p_old, atol=1e-5)
    assert p_new[:, cand.manifest.labels.index("consider:EC")].max() < 1e-6


def test_a_candidate_stays_in_the_signal_set_line_of_the_running_bundle(round_material,
                                                                        tmp_path):
    # A robot's own bundle declares units; a candidate that dropped them would get another
    # signal-set fingerprint, and the consolidator would refuse the robots running it.
    _, running, records, d = round_material
    units = {name: f"unit{i}" for i, name in enumerate(running.manifest.signals)}
    ranges = {name: [0.0, float(i + 1)] for i, name in enumerate(running.manifest.signals)}
    manifest = dataclasses.replace(running.manifest, sha256="", signal_set="",
                                   signal_units=units, signal_ranges=ranges)
    declared = write_bundle(tmp_path / "declared", running.onnx_path.read_bytes(), manifest)
    assert declared.manifest.signal_set != running.manifest.signal_set
    material = assemble(records, [UNIT], declared, RetrainConfig(), rehearsal=d)
    for name, trained in (("kept", keep_running(material, declared)),
                          ("trained", retrain(material, declared,
                                             RetrainConfig(epochs=1, val_fraction=0.0)))):
        cand = export_candidate(trained, tmp_path / name, model_version=2, current=declared,
                                material=material)
        assert cand.manifest.signal_set == declared.manifest.signal_set, name
        assert cand.manifest.signal_units == units
        assert cand.manifest.signal_ranges == ranges


def test_retrain_config_names_the_bad_value():
    for kw, name in (({"base_lr": -1.0}, "base_lr"), ({"distill": 1.5}, "distill"),
                     ({"anchor_weight": 0.0}, "anchor_weight"),
                     ({"distill_margin": 1.0}, "distill_margin")):
        with pytest.raises(ValueError, match=name):
            RetrainConfig(**kw)
