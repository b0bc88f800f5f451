"""The gate's paired non-inferiority test on fresh streams replayed through the node's buffer."""

from pathlib import Path

import numpy as np
import pytest
import torch

from thinkmem_ros.consolidator.gate import (
    GateConfig,
    ScoredSource,
    fresh_streams,
    paired_bootstrap,
    validate,
)
from thinkmem_ros.policy.bundle import load_bundle


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


# ------------------------------------------------------------------ the bootstrap alone

def _source(name, truth, running, candidate, block):
    return ScoredSource(name, truth, running, candidate, np.arange(len(truth)) // block)


def _truth(n, labels, rng):
    runs = np.repeat(rng.random((n // 20 + 1, labels)) < 0.3, 20, axis=0)[:n]
    return runs  # positives come in runs of 20 frames, as situations do


def test_identical_decisions_give_a_bound_of_exactly_zero():
    rng = np.random.default_rng(0)
    truth = _truth(1000, 3, rng)
    pred = truth ^ (rng.random(truth.shape) < 0.05)
    out = paired_bootstrap([_source("fresh", truth, pred, pred.copy(), 50)], GateConfig(), rng)
    assert out["micro"]["delta"] == 0.0 and out["micro"]["lower"] == 0.0
    assert all(cell["lower"] == 0.0 for cell in out["labels"])
    assert out["blocks"] == {"fresh": 20}


def test_a_real_loss_is_caught_and_a_better_candidate_passes():
    rng = np.random.default_rng(1)
    truth = _truth(3000, 2, rng)
    running = truth.copy()
    worse = truth.copy()
    miss = truth & (rng.random(truth.shape) < 0.03)  # 3 % of positives lost everywhere
    worse[miss] = False
    cfg = GateConfig()
    out = paired_bootstrap([_source("fresh", truth, running, worse, 50)], cfg, rng)
    assert out["micro"]["delta"] < -0.01 and out["micro"]["lower"] < -cfg.f1_tolerance
    better = paired_bootstrap([_source("fresh", truth, worse, running, 50)], cfg, rng)
    assert better["micro"]["lower"] > 0.0


def test_blocks_of_consecutive_frames_widen_the_interval_of_clustered_errors():
    rng = np.random.default_rng(2)
    truth = _truth(3000, 2, rng)
    cand = truth.copy()
    cand[400:520] = ~cand[400:520]  # errors in two bursts, as a model fails on a situation
    cand[2000:2060] = ~cand[2000:2060]
    iid = paired_bootstrap([_source("fresh", truth, truth, cand, 1)], GateConfig(), rng)
    blocks = paired_bootstrap([_source("fresh", truth, truth, cand, 50)], GateConfig(), rng)
    assert iid["micro"]["delta"] == blocks["micro"]["delta"]
    assert blocks["micro"]["lower"] < iid["micro"]["lower"] - 0.005


def test_gate_config_names_the_bad_value():
    for kw, name in (({"confidence": 1.0}, "confidence"), ({"bootstrap": 0}, "bootstrap"),
                     ({"block_frames": 0}, "block_frames"), ({"fresh_streams": -1},
                                                             "fresh_streams"),
                     ({"label_f1_tolerance": 2.0}, "label_f1_tolerance"),
                     ({"fresh_duration_s": 0.0}, "fresh_duration_s")):
        with pytest.raises(ValueError, match=name):
            GateConfig(**kw)


# ------------------------------------------------------------------ validate on fresh streams

def _trained_copy(bundle):
    """The bundle's weights in a torch model (the candidate's 'trained' for parity), a window
    Transformer or a streaming GRU as the bundle is."""
    from thinkmem_ros.consolidator.retrain import running_config
    from thinkmem_ros.policy.training.train import TrainedPolicy, build_model, warm_start

    m = bundle.manifest
    config = running_config(bundle, n_labels=len(m.labels),
                            n_event_vocab=len(m.event_vocabulary))
    model = build_model(config)
    warm_start(model, bundle, tuple(m.labels), tuple(m.event_vocabulary))
    model.eval()
    return TrainedPolicy(model, config, dict(m.normalisation), tuple(m.labels), tuple(m.signals),
                         tuple(m.event_vocabulary), dict(m.thresholds))


def _candidate(trained, folder: Path, running):
    from thinkmem_ros.policy.training.export import export_bundle

    return export_bundle(trained, folder, model_version=running.version + 1,
                         frame_rate_hz=running.manifest.frame_rate_hz,
                         thresholds=trained.thresholds, extras={"scenario": "mixed"})


SMALL = dict(fresh_streams=2, fresh_duration_s=30.0, bootstrap=500)


@pytest.fixture(scope="module")
def world_bundle(tmp_path_factory, source_bundle):
    """A bundle that records the world scenario it was trained on (as models/default does)."""
    running = load_bundle(source_bundle)
    if (running.manifest.extras or {}).get("scenario") != "mixed":
        pytest.skip("the shipped bundle is not available (tiny fallback has no world)")
    return running


def test_same_policy_passes_on_fresh_streams_replayed_through_the_buffer(world_bundle,
                                                                        tmp_path):
    running = world_bundle
    trained = _trained_copy(running)
    candidate = _candidate(trained, tmp_path / "cand", running)
    empty = _empty_heldout(running)
    report = validate(candidate, running, trained, empty, [], GateConfig(**SMALL),
                      np.random.default_rng(0))
    assert report.passed, report.reasons
    fresh = report.checks["fresh"]
    frames = 2 * (300 - running.manifest.window + 1)
    assert fresh == {**fresh, "scenario": "mixed", "streams": 2, "frames": frames}
    ni = report.checks["noninferiority"]
    assert ni["micro"]["delta"] == 0.0 and ni["micro"]["lower"] == 0.0
    assert ni["blocks"] == {"fresh": 2 * -(-(300 - running.manifest.window + 1) // 50)}
    assert "consider" not in " ".join(ni["base_labels"])
    assert report.checks["parity_max_abs"] <= 1e-4
    assert report.checks["f1_running"] > 0.9  # the world bundle is good on its own world
    # no recorded scenario and nothing held out: nothing to judge, said so
    bare = validate(candidate, running, trained, empty, [],
                    GateConfig(**{**SMALL, "fresh_scenario": ""}), np.random.default_rng(0))
    assert not bare.passed and any("held-out" in r for r in bare.reasons)


def test_a_candidate_that_lost_one_skill_is_refused_with_the_label_named(world_bundle,
                                                                         tmp_path):
    running = world_bundle
    trained = _trained_copy(running)
    j = list(running.manifest.labels).index("trend")
    with torch.no_grad():
        trained.model.head.bias[j] -= 3.0  # trend now fires on strong evidence only
    candidate = _candidate(trained, tmp_path / "cand", running)
    report = validate(candidate, running, trained, _empty_heldout(running), [],
                      GateConfig(**SMALL), np.random.default_rng(0))
    assert not report.passed
    assert any(r.startswith("base label trend regressed") for r in report.reasons), \
        report.reasons
    cell = report.checks["noninferiority"]["labels"]["trend"]
    assert cell["judged"] and cell["lower"] <= -0.01 and cell["positives"] >= 50
    assert report.checks["parity_max_abs"] <= 1e-4


def test_fresh_streams_are_new_per_version_and_reproducible(world_bundle):
    cfg = GateConfig(fresh_streams=2, fresh_duration_s=5.0)
    scenario, a = fresh_streams(world_bundle, 2, cfg)
    _, again = fresh_streams(world_bundle, 2, cfg)
    _, other = fresh_streams(world_bundle, 3, cfg)
    assert scenario == "mixed" and len(a) == 2
    assert np.array_equal(a[0].values, again[0].values, equal_nan=True)
    assert not np.array_equal(a[0].values, other[0].values, equal_nan=True)
    assert not np.array_equal(a[0].values, a[1].values, equal_nan=True)
    with pytest.raises(ValueError, match="not a world scenario"):
        fresh_streams(world_bundle, 2, GateConfig(fresh_scenario="moon"))


def _empty_heldout(bundle):
    from thinkmem_ros.core.data import SituationSet

    m = bundle.manifest
    return SituationSet(np.zeros((0, m.window, len(m.signals)), np.float32),
                        np.zeros((0, len(m.labels)), np.float32),
                        events=np.zeros((0, m.max_events), np.int64),
                        label_names=tuple(m.labels), signal_names=tuple(m.signals),
                        event_vocabulary=tuple(m.event_vocabulary))
