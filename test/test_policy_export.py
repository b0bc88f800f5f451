"""Export: torch vs ONNX Runtime parity, dynamic batch, padding cases, warm start."""

import numpy as np
import pytest
import torch

from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.policy.bundle import load_bundle
from thinkmem_ros.policy.config import PolicyConfig
from thinkmem_ros.policy.runtime import PolicyRuntime
from thinkmem_ros.policy.training.export import export_bundle
from thinkmem_ros.policy.training.train import predict_proba, train_policy

K, M, VOCAB = 8, 4, ("door_open", "door_close", "payload_change")
TINY = PolicyConfig(window=K, n_signals=7, n_labels=10, d_model=16, n_layers=1, n_heads=2,
                    d_ff=32, max_events=M, n_event_vocab=len(VOCAB))


def random_situations(n: int, rng: np.random.Generator) -> SituationSet:
    """Raw-scale signals (not normalised), random dropouts, fully masked frames, events."""
    scale = np.array([50, 3, 2, 5, 0.8, 0.5, 20], dtype=np.float32)
    signals = (rng.normal(size=(n, K, 7)) * scale / 5 + scale).astype(np.float32)
    mask = (rng.random((n, K, 7)) > 0.2).astype(np.float32)
    mask[::7, :, :] = 0.0  # whole situations unobserved
    mask[1::5, -1, :] = 0.0  # newest frame missing
    mask[2::9, :, 3] = 0.0  # one channel unobserved for the whole window
    signals *= mask
    events = rng.integers(0, len(VOCAB) + 1, size=(n, M))
    events[::3] = 0  # every event slot padding
    labels = (rng.random((n, 10)) > 0.7).astype(np.float32)
    return SituationSet(signals, labels, mask=mask, events=events,
                        groups=np.arange(n) // 10, event_vocabulary=VOCAB)


@pytest.fixture(scope="module")
def trained_bundle(tmp_path_factory):
    torch.set_num_threads(1)
    data = random_situations(200, np.random.default_rng(1))
    trained = train_policy(data, TINY, epochs=1, batch_size=50, progress=False, seed=3)
    bundle = export_bundle(trained, tmp_path_factory.mktemp("b") / "tiny", model_version=7)
    return trained, bundle


def test_torch_and_onnxruntime_agree_on_1000_situations(trained_bundle):
    trained, bundle = trained_bundle
    data = random_situations(1000, np.random.default_rng(2))
    runtime = PolicyRuntime(bundle)
    pred = runtime.predict(data.signals, data.mask, data.events)
    with torch.no_grad():
        probs, embedding = trained.model(torch.from_numpy(data.signals),
                                         torch.from_numpy(data.mask),
                                         torch.from_numpy(data.events))
    assert np.isfinite(pred.probabilities).all() and np.isfinite(pred.embedding).all()
    assert np.abs(pred.probabilities - probs.numpy()).max() <= 1e-4
    assert np.abs(pred.embedding - embedding.numpy()).max() <= 1e-4
    assert np.abs(pred.probabilities - predict_proba(trained, data)).max() <= 1e-4
    # The outputs actually depend on the inputs (a constant graph would pass parity too).
    assert pred.probabilities.std(axis=0).max() > 1e-3


def test_dynamic_batch_and_single_query_paths_agree(trained_bundle):
    _, bundle = trained_bundle
    data = random_situations(64, np.random.default_rng(4))
    runtime = PolicyRuntime(bundle)
    batch = runtime.predict(data.signals, data.mask, data.events)
    assert batch.probabilities.shape == (64, 10)
    assert batch.embedding.shape == (64, TINY.d_model)
    for i in (0, 3, 63):
        one = runtime.predict_one(data.signals[i], data.mask[i], data.events[i])
        two = runtime.predict(data.signals[i], data.mask[i], data.events[i])
        np.testing.assert_allclose(one.probabilities[0], batch.probabilities[i], atol=1e-5)
        np.testing.assert_allclose(two.probabilities[0], batch.probabilities[i], atol=1e-5)
        assert one.active[0] == batch.active[i]


def test_events_change_the_output_and_padding_is_ignored(trained_bundle):
    _, bundle = trained_bundle
    runtime = PolicyRuntime(bundle)
    signals = random_situations(1, np.random.default_rng(5)).signals[0]
    none = runtime.predict_one(signals).probabilities
    padded = runtime.predict_one(signals, events=np.zeros(M, np.int64)).probabilities
    short = runtime.predict_one(signals, events=np.array([2])).probabilities
    left_padded = runtime.predict_one(signals, events=np.array([0, 0, 0, 2])).probabilities
    np.testing.assert_array_equal(none, padded)
    np.testing.assert_allclose(short, left_padded, atol=1e-6)
    assert np.abs(short - none).max() > 0


def test_manifest_describes_the_graph(trained_bundle):
    trained, bundle = trained_bundle
    m = load_bundle(bundle.path).manifest
    assert m.model_version == 7 and m.window == K and m.max_events == M
    assert m.labels == list(trained.label_names) and m.event_vocabulary == list(VOCAB)
    assert m.training_fingerprint == trained.fingerprint and len(m.training_fingerprint) == 64
    assert m.model_config["d_model"] == TINY.d_model
    np.testing.assert_allclose(m.normalisation["mean"], trained.model.signal_mean.numpy())
    runtime = PolicyRuntime(bundle)
    assert runtime.version == 7 and runtime.sha256 == m.sha256 and runtime.window == K


def test_warm_start_from_bundle_keeps_known_label_rows(trained_bundle):
    trained, bundle = trained_bundle
    data = random_situations(60, np.random.default_rng(6))
    grown = SituationSet(data.signals, np.concatenate([data.labels, data.labels[:, :1]], 1),
                         mask=data.mask, events=data.events, groups=data.groups,
                         label_names=data.label_names + ("consider:E001",),
                         event_vocabulary=VOCAB + ("robot_stop",))
    config = PolicyConfig(**{**TINY.to_dict(), "n_labels": 11, "n_event_vocab": 4})
    warm = train_policy(grown, config, epochs=1, lr=1e-9, progress=False,
                        init_from=bundle.path, val_fraction=0.0)
    old = trained.model.state_dict()
    new = warm.model.state_dict()
    # lr ~ 0: weights are what warm start copied (label rows by name, events by name).
    torch.testing.assert_close(new["head.weight"][:10], old["head.weight"], atol=1e-6, rtol=0)
    torch.testing.assert_close(new["event_embed.weight"][:4], old["event_embed.weight"],
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(new["encoder.layers.0.linear1.weight"],
                               old["encoder.layers.0.linear1.weight"], atol=1e-6, rtol=0)
    torch.testing.assert_close(new["signal_mean"], old["signal_mean"])
    report = warm.history[0]["warm_start"]
    assert "head.weight" in report["rows"] and "frame_in.weight" in report["copied"]
    assert "shape_in.weight" in report["copied"] and "zeroed" not in report
