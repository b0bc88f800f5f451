"""Rehearsal material D: capped with rare labels kept, rebuilt from a recipe, saved per bundle."""

import json
from dataclasses import replace

import consolidator_world as world
import numpy as np
import pytest
import torch

from thinkmem_ros.consolidator.gate import GateConfig
from thinkmem_ros.consolidator.rehearsal import (
    RehearsalConfig,
    RehearsalError,
    load_npz,
    load_rehearsal,
    rehearsal_path,
    save_rehearsal,
    stratified_indices,
)
from thinkmem_ros.consolidator.retrain import RetrainConfig, assemble
from thinkmem_ros.consolidator.service import ConsolidatorConfig, ConsolidatorService
from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.core.paths import default_bundle
from thinkmem_ros.link.experience import encode_experience
from thinkmem_ros.link.security import write_signing_keypair
from thinkmem_ros.policy.bundle import load_bundle


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def test_stratified_cap_keeps_rare_labels_that_a_uniform_draw_would_lose():
    rng = np.random.default_rng(0)
    labels = np.zeros((5000, 3), np.float32)
    labels[:, 0] = rng.random(5000) < 0.5
    labels[rng.choice(5000, 10, replace=False), 2] = 1.0  # 0.2 %: ~1 in a uniform 500
    idx = stratified_indices(labels, 500, np.random.default_rng(1))
    assert len(idx) == 500 and len(np.unique(idx)) == 500
    assert labels[idx, 2].sum() == 10  # every rare positive kept
    assert 150 < labels[idx, 0].sum() < 350  # the common label is not inflated
    assert np.array_equal(stratified_indices(labels[:300], 500, rng), np.arange(300))


def test_saved_material_round_trips_and_must_match_the_bundle_hash(tmp_path):
    data = world.base_material(40, np.random.default_rng(0))
    path = rehearsal_path(tmp_path, 3)
    sha = save_rehearsal(data, path)
    back = load_npz(path)
    assert np.array_equal(back.signals, data.signals) and back.label_names == data.label_names
    assert back.event_vocabulary == data.event_vocabulary
    bundle = load_bundle(world.running_bundle(tmp_path / "b"))
    # the tiny bundle is v1 with no recorded sha256: a v1 file beside it is refused
    save_rehearsal(data, rehearsal_path(tmp_path, 1))
    with pytest.raises(RehearsalError, match="sha256"):
        load_rehearsal(bundle, tmp_path, RehearsalConfig())
    assert len(sha) == 64
    # an explicit file wins and is capped
    got = load_rehearsal(bundle, tmp_path, RehearsalConfig(npz=path, max_rows=25))
    assert got.source == "explicit" and len(got) == 25


def _edited_npz(tmp_path, **arrays):
    """A saved training set with ``arrays`` replaced (what a hand-made file may hold)."""
    path = tmp_path / "d.npz"
    save_rehearsal(world.base_material(40, np.random.default_rng(0)), path)
    with np.load(path) as saved:
        contents = dict(saved)
    vocabulary = len(contents["event_vocabulary"])
    np.savez(path, **{**contents, **{k: v(contents[k], vocabulary) for k, v in arrays.items()}})
    return path


def _nan_first(a, _):
    a = a.astype(np.float32)
    a.flat[0] = np.nan
    return a


@pytest.mark.parametrize("edit, says", [
    ({"signals": _nan_first}, "signals holds NaN or infinite values"),
    ({"labels": _nan_first}, "labels holds NaN or infinite values"),
    ({"labels": lambda a, _: a * 2 + 1}, "labels must lie in [0, 1], found [1, 3]"),
    ({"events": lambda a, v: a + v + 1}, "events must lie in [0, "),
    ({"events": lambda a, _: a - 5}, "events must lie in [0, "),
    ({"events": lambda a, _: a + 0.5}, "events must be whole numbers, found "),
    ({"groups": lambda a, _: a[:3]}, "groups must be one per row, shape (40,), got (3,)"),
    ({k: (lambda a, _: a[:0]) for k in ("signals", "labels", "mask", "events", "groups")},
     "it holds no rows"),
], ids=["nan-signals", "nan-labels", "labels-past-1", "events-past-vocabulary",
        "events-negative", "events-fractional", "groups-short", "no-rows"])
def test_a_rehearsal_set_that_cannot_be_trained_on_is_refused_when_loaded(tmp_path, edit,
                                                                         says):
    """NaN signals and ids past the vocabulary failed inside a round, after discovery ran;
    negative or fractional ids, NaN labels and labels above 1 were trained on silently."""
    path = _edited_npz(tmp_path, **edit)
    with pytest.raises(RehearsalError) as refused:
        load_npz(path)
    assert says in str(refused.value) and str(path) in str(refused.value)


def test_default_bundle_material_is_rebuilt_from_its_recipe_reproducibly(tmp_path):
    bundle = load_bundle(default_bundle())
    cfg = RehearsalConfig(max_rows=600, rebuild_streams=1)
    first = load_rehearsal(bundle, tmp_path, cfg)
    again = load_rehearsal(bundle, tmp_path, cfg)
    assert first.source == "rebuilt" and len(first) == 600
    assert np.array_equal(first.data.signals, again.data.signals)
    m = bundle.manifest
    assert first.data.window == m.window and first.data.signal_names == tuple(m.signals)
    assert first.data.events.shape[1] == m.max_events
    # every base label is present, the rarest ones boosted above their stream share
    assert (first.data.labels.sum(0) > 0).all()
    assert load_rehearsal(bundle, tmp_path, RehearsalConfig(enabled=False)).data is None


def test_the_recorded_train_command_reads_back_as_the_recipe_whatever_the_defaults():
    """``thinkmem train`` records every recipe option, so a reader with other defaults
    (the recipe parser keeps the old 8 streams, K = 32) rebuilds the same training set;
    a command recorded by an older version without them still reads with those defaults."""
    import argparse

    from thinkmem_ros.commands import train
    from thinkmem_ros.world.recipe import StreamRecipe

    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args(["--duration", "120", "--seed", "3", "--out", "x y"])
    train.resolve_defaults(args)
    assert (args.preset, args.window, args.streams) == ("streaming-restart", 64, 16)
    recipe = StreamRecipe.from_args(args)
    command = train.recorded_command(recipe, args)
    assert StreamRecipe.from_command(command) == recipe
    assert command.endswith("--out 'x y'") and "--preset streaming-restart" in command
    old = StreamRecipe.from_command("thinkmem train --duration 120 --out models/default")
    assert (old.streams, old.window, old.duration) == (8, 32, 120.0)
    bags = parser.parse_args(["--bag", "b", "--out", "o"])
    train.resolve_defaults(bags)
    assert (bags.preset, bags.window, bags.epochs) == ("default", 32, 16)


def test_assemble_adds_rehearsal_rows_renamed_and_with_rules_applied(tmp_path):
    from thinkmem_ros.consolidator.knowledge import KnowledgeUnit

    running = load_bundle(world.running_bundle(tmp_path / "b"))
    records = world.experiences("r1", 20, 5, seed=3)
    old = world.base_material(50, np.random.default_rng(4))
    # one rehearsal row whose history holds the rule's antecedent (codes new to D's vocab)
    vocab = old.event_vocabulary + ("EA", "EB")
    events = old.events.copy()
    events[0] = [0, 0, 0, 0, len(vocab) - 1, len(vocab)]
    old = SituationSet(old.signals, old.labels, old.mask, events, old.groups,
                       event_vocabulary=vocab)
    unit = KnowledgeUnit(pattern=("EA", "EB", "EC"), relation="sequence3", constraints={},
                         thinking="consider:EC", status="promoted")
    # all of D trained on here (row order checked below); the gate's held-out slice of D
    # is tested in test_consolidator_gate_heldout.py
    material = assemble(records, [unit], running,
                        RetrainConfig(rehearsal_heldout_fraction=0.0), rehearsal=old)
    assert material.counts["rehearsal"] == 50
    train = material.train
    assert len(train) == 50 + material.counts["direct_train"] + material.counts["discovered"]
    col = train.label_names.index("consider:EC")
    assert train.labels[0, col] == 1.0 and train.labels[1:50, col].sum() == 0
    assert np.array_equal(train.labels[:50, :len(old.label_names)], old.labels)
    names = ("",) + train.event_vocabulary
    assert [names[i] for i in train.events[0] if i] == ["EA", "EB"]
    sources = [set(train.groups[:50]), set(train.groups[50:])]
    assert not sources[0] & sources[1]  # rehearsal groups never shared with new material


def test_a_published_round_saves_its_training_set_beside_the_bundle(tmp_path):
    _, key = write_signing_keypair(tmp_path / "keys", "c")
    bundle = world.running_bundle(tmp_path / "running")
    d = world.base_material(300, np.random.default_rng(5))
    save_rehearsal(d, tmp_path / "d.npz")
    config = ConsolidatorConfig(
        db_path=tmp_path / "c.db", publish_dir=tmp_path / "pub", signing_key=key,
        initial_bundle=bundle, retrain=RetrainConfig(),
        rehearsal=RehearsalConfig(npz=tmp_path / "d.npz", max_rows=250),
        gate=GateConfig(**world.JUDGE_SMALL))  # what is saved, not the gate's floors
    from thinkmem_ros.consolidator.store import ExperienceStore

    records = [replace(e, seq=i) for i, e in enumerate(world.experiences("r1", 40, 5, seed=1))]
    with ExperienceStore(config.db_path) as store:
        store.insert_many([(e, encode_experience(e)) for e in records])
    service = ConsolidatorService(config)
    report = service.run_round("test")
    # D: 80 % trained on, 20 % held out for the gate's regression check
    assert report.material["rehearsal"] == 200 and report.material["rehearsal_heldout"] == 50
    assert report.material["rehearsal_source"] == "explicit"
    assert report.outcome == "published", (report.outcome, report.gate)
    saved = rehearsal_path(tmp_path / "pub", 2)
    kept = load_npz(saved)
    assert len(kept) == 250  # D U D_dir U D_disc, capped again
    assert "consider:EC" in kept.label_names and kept.labels[:, -1].sum() > 0
    manifest = json.loads((tmp_path / "pub" / "current" / "bundle.json").read_text())
    assert manifest["extras"]["rehearsal"]["rows"] == 250
    # the next round rehearses exactly that file (hash checked against the signed manifest)
    nxt = load_rehearsal(service.publisher.current(), tmp_path / "pub",
                         RehearsalConfig(max_rows=1000))
    assert nxt.source == "saved" and len(nxt) == 250
