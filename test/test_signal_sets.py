"""Signal sets: a bundle declares its signals' units and fingerprint; training drops signals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from thinkmem_ros.core.data import SituationSet, signal_drop_mask
from thinkmem_ros.policy.bundle import (
    BundleError,
    BundleManifest,
    parse_manifest,
    read_manifest,
    signal_set_fingerprint,
    signal_set_key,
    write_bundle,
)

SIGNALS = ["speed", "yaw_rate"]


def _manifest(**overrides) -> BundleManifest:
    fields = dict(model_version=1, sha256="", labels=["turning"], signals=list(SIGNALS),
                  window=4, frame_rate_hz=10.0,
                  normalisation={"mean": [0.0, 0.0], "std": [1.0, 1.0]},
                  thresholds={"turning": 0.5})
    fields.update(overrides)
    return BundleManifest(**fields)


def test_units_ranges_and_fingerprint_round_trip(tmp_path):
    manifest = _manifest(signal_units={"speed": "m/s", "yaw_rate": "rad/s"},
                         signal_ranges={"speed": [0.0, 1.0]})
    write_bundle(tmp_path / "b", b"onnx", manifest)
    back = read_manifest(tmp_path / "b")
    assert back.signal_units == {"speed": "m/s", "yaw_rate": "rad/s"}
    assert back.signal_ranges == {"speed": [0.0, 1.0]}
    assert back.signal_set == signal_set_fingerprint(back) == signal_set_key(
        SIGNALS, {"speed": "m/s", "yaw_rate": "rad/s"}, 10.0)


def test_fingerprint_changes_with_names_order_units_and_rate():
    base = signal_set_fingerprint(_manifest(signal_units={"speed": "m/s"}))
    assert base == signal_set_fingerprint(_manifest(signal_units={"speed": "m/s"}))
    others = [
        _manifest(signal_units={"speed": "mm/s"}),
        _manifest(signal_units={"speed": "m/s"}, frame_rate_hz=30.0),
        _manifest(signal_units={"speed": "m/s"}, signals=["yaw_rate", "speed"]),
        _manifest(signal_units={"speed": "m/s"}, signals=["speed", "gyro"]),
    ]
    assert len({base, *map(signal_set_fingerprint, others)}) == 5


def test_old_manifests_without_signal_fields_still_load():
    old = json.loads(_manifest().to_json())
    for key in ("signal_units", "signal_ranges", "signal_set"):
        old.pop(key)
    manifest = parse_manifest(json.dumps(old))
    assert manifest.signal_units == {} and manifest.signal_set == ""


@pytest.mark.parametrize("key, value, match", [
    ("signal_units", {"speed": 3}, "signal_units must be"),
    ("signal_ranges", {"speed": [0.0]}, "signal_ranges must be"),
    ("signal_ranges", {"speed": [0.0, float("nan")]}, "signal_ranges must be"),
    ("signal_set", 5, "signal_set must be"),
    ("signal_units", {"gyro": "rad/s"}, "does not have"),
])
def test_bad_signal_fields_are_refused(key, value, match):
    data = json.loads(_manifest().to_json())
    data[key] = value
    with pytest.raises(BundleError, match=match):
        BundleManifest.from_dict(data)


def test_signal_drop_mask_drops_whole_windows_and_keeps_one():
    rng = np.random.default_rng(0)
    keep = signal_drop_mask(20_000, 4, 0.25, rng)
    assert keep.shape == (20_000, 1, 4)
    assert keep.sum(axis=2).min() >= 1  # never a window with nothing observed
    assert abs(1 - keep.mean() - 0.25) < 0.01
    assert signal_drop_mask(10, 4, 0.0, rng).min() == 1.0
    assert signal_drop_mask(50, 1, 0.9, rng).min() == 1.0  # a single signal is never dropped
    with pytest.raises(ValueError, match="probability"):
        signal_drop_mask(3, 2, 1.0, rng)


def _toy(n: int = 240, k: int = 6, seed: int = 0) -> SituationSet:
    """Label = 'a' is high; 'b' duplicates 'a' with noise, so 'b' alone still tells."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, k))
    b = a + 0.3 * rng.normal(size=(n, k))
    labels = (a[:, -1] > 0).astype(np.float32)[:, None]
    return SituationSet(signals=np.stack([a, b], 2).astype(np.float32), labels=labels,
                        label_names=("high",), signal_names=("a", "b"),
                        groups=np.arange(n) // 20)


def test_training_with_signal_drop_is_robust_to_an_absent_signal():
    torch = pytest.importorskip("torch")
    from thinkmem_ros.policy.config import PolicyConfig
    from thinkmem_ros.policy.training.train import evaluate, train_policy

    torch.set_num_threads(1)
    data, test = _toy(), _toy(seed=1)
    absent = test.subset(np.arange(len(test)))
    absent.signals = absent.signals.copy()
    absent.mask = absent.mask.copy()
    absent.signals[:, :, 0] = 0.0
    absent.mask[:, :, 0] = 0.0
    config = PolicyConfig(window=6, n_signals=2, n_labels=1, d_model=16, n_layers=1,
                          n_heads=2, d_ff=32, max_events=1, n_event_vocab=0)
    kwargs = dict(seed=0, epochs=1, min_steps=300, batch_size=32, val_fraction=0.0,
                  progress=False)
    plain = train_policy(data, config, **kwargs)
    again = train_policy(data, config, **kwargs)
    dropped = train_policy(data, config, signal_drop=0.3, **kwargs)
    # signal_drop=0 leaves training exactly as it was (same seed, same weights)
    for key, value in plain.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[key])
    loss_plain = evaluate(plain, test)["f1"] - evaluate(plain, absent)["f1"]
    loss_dropped = evaluate(dropped, test)["f1"] - evaluate(dropped, absent)["f1"]
    assert evaluate(dropped, test)["f1"] > 0.8
    assert loss_dropped < loss_plain
    with pytest.raises(ValueError, match="signal_drop"):
        train_policy(data, config, signal_drop=1.0, **kwargs)


def _experience(sha: str, width: int, seq: int):
    from thinkmem_ros.link.experience import Experience

    return Experience(robot_id="husky", episode_id="ep", stamp=float(seq),
                      window=np.zeros((4, width), np.float32), labels=["turning"],
                      probabilities=[0.5], bundle_version=1, bundle_sha256=sha, seq=seq)


def test_consolidator_stores_only_its_signal_set(tmp_path):
    from thinkmem_ros.consolidator.ingest import SignalSetFilter
    from thinkmem_ros.consolidator.store import ExperienceStore
    from thinkmem_ros.link.experience import encode_experience

    ours = write_bundle(tmp_path / "ours", b"ours", _manifest(
        signal_units={"speed": "m/s", "yaw_rate": "rad/s"}))
    other = write_bundle(tmp_path / "other", b"other", _manifest(
        signal_units={"speed": "mm/s", "yaw_rate": "rad/s"}))
    assert ours.manifest.signal_set != other.manifest.signal_set
    accept = SignalSetFilter([ours])
    rows = [_experience(ours.manifest.sha256, 2, 1), _experience(other.manifest.sha256, 2, 2),
            _experience("", 2, 3), _experience("", 7, 4)]
    # the receiver's screen: refused records are named (they go back in the ACK), the
    # rest are stored
    reasons = [accept.refusal(e) for e in rows]
    assert [r is None for r in reasons] == [True, False, True, False]
    assert "unknown_bundle" in reasons[1] and "window_width" in reasons[3]
    with ExperienceStore(tmp_path / "db.sqlite") as store:
        kept = [(e, encode_experience(e)) for e, r in zip(rows, reasons) if r is None]
        assert store.insert_many(kept) == (2, 0)
        assert store.seqs("husky") == [1, 3]
    assert accept.refused == {"unknown_bundle": 1, "window_width": 1}
    assert accept.reason(_experience(other.manifest.sha256, 2, 5)) == "unknown_bundle"
    accept.serve(other)  # a consolidator serving the mm/s line too accepts both
    assert accept.reason(_experience(other.manifest.sha256, 2, 5)) is None
