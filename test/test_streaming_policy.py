"""The streaming policy: per-frame update = training's computation, both engines agree,
state resets on swap / time jumps / gaps, format-1 bundles still run, read-only installs."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_window_bundle

from thinkmem_ros.policy.bundle import BundleError, BundleManifest, load_bundle
from thinkmem_ros.policy.runtime import InputError, PolicyRuntime
from thinkmem_ros.policy.streaming_runtime import onnx_initialisers
from thinkmem_ros.policy.training.export import export_bundle
from thinkmem_ros.policy.training.train import train_policy
from thinkmem_ros.robot.hotswap import PolicySlot, load_policy
from thinkmem_ros.world.streams import generate_stream, stream_windows

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    stream = generate_stream("mixed", 90.0, 10.0, np.random.default_rng(3))
    data = stream_windows(stream, 16, stride=4, max_events=8)
    return train_policy(data, "streaming", seed=0, epochs=1, val_fraction=0.0,
                        progress=False)


@pytest.fixture(scope="module")
def bundle_dir(trained, tmp_path_factory):
    folder = tmp_path_factory.mktemp("streaming") / "bundle"
    export_bundle(trained, folder, frame_rate_hz=10.0)
    return folder


@pytest.fixture(scope="module")
def stream_data():
    stream = generate_stream("mixed", 40.0, 10.0, np.random.default_rng(11))
    return stream_windows(stream, 16, stride=1, max_events=8)


def _random_frames(rng, n, f, m, vocab):
    signals = rng.normal(size=(n, f)).astype(np.float32) * 5 + 10
    mask = (rng.random((n, f)) > 0.2).astype(np.float32)
    signals *= mask
    events = np.zeros((n, m), np.int64)
    for i in range(n):
        k = rng.integers(0, m + 1)
        events[i, m - k:] = rng.integers(1, vocab + 1, size=k)
    return signals, mask, events


def test_bundle_is_format_2_with_explicit_state(bundle_dir):
    m = load_bundle(bundle_dir).manifest
    assert m.format_version == 2
    assert m.streaming["kind"] == "gru"
    assert m.streaming["state"] == {"h": [64], "mu": [7], "var": [7], "seen": [7],
                                   "ring": [31, 7], "ring_mask": [31, 7]}
    runtime = PolicyRuntime(bundle_dir)
    assert runtime.streaming
    assert [i.name for i in runtime.session.get_inputs()] == \
        ["frame", "mask", "events", "h", "mu", "var", "seen", "ring", "ring_mask"]
    assert [o.name for o in runtime.session.get_outputs()] == \
        ["probabilities", "embedding", "h_out", "mu_out", "var_out", "seen_out", "ring_out",
         "ring_mask_out"]
    # the compiled kernel reads the very weights ONNX Runtime runs
    weights = onnx_initialisers(runtime.bundle.onnx_path.read_bytes())
    assert "gru.weight_hh_l0" in weights and weights["gru.weight_hh_l0"].shape == (192, 64)


def test_streaming_manifest_needs_format_2(bundle_dir):
    data = json.loads((bundle_dir / "bundle.json").read_text())
    data["format_version"] = 1
    with pytest.raises(BundleError, match="format_version >= 2"):
        BundleManifest.from_dict(data)


def test_numba_and_ort_agree_over_many_steps(bundle_dir):
    fast = PolicyRuntime(bundle_dir, engine="numba")
    ort = PolicyRuntime(bundle_dir, engine="ort")
    assert fast.engine.engine == "numba" and ort.engine.engine == "ort"
    m = fast.manifest
    rng = np.random.default_rng(0)
    signals, mask, events = _random_frames(rng, 600, len(m.signals), m.max_events,
                                           len(m.event_vocabulary))
    worst = 0.0
    for i in range(len(signals)):
        a = fast.step(signals[i], mask[i], events[i]).copy()
        b = ort.step(signals[i], mask[i], events[i])
        worst = max(worst, float(np.abs(a - b).max()),
                    float(np.abs(fast.last_embedding - ort.last_embedding).max()))
    assert worst <= 1e-4
    assert np.abs(fast.engine.state - ort.engine.state).max() <= 1e-4


def test_per_frame_output_equals_training_computation(trained, bundle_dir, stream_data):
    """Stepping T frames equals the torch model run over the same T frames from reset."""
    runtime = PolicyRuntime(bundle_dir)
    data = stream_data
    frames = np.concatenate([data.signals[0], data.signals[1:, -1]])  # (T, F) one stream
    masks = np.concatenate([data.mask[0], data.mask[1:, -1]])
    t_total = len(frames)
    stepped = [runtime.step(frames[t], masks[t], data.events[max(0, t - 15)]).copy()
               for t in range(t_total)]
    model = trained.model.eval()
    with torch.no_grad():
        for t in (15, 60, t_total - 1):
            events = torch.from_numpy(data.events[max(0, t - 15)][None])
            logits, _ = model.logits(torch.from_numpy(frames[None, :t + 1]),
                                     torch.from_numpy(masks[None, :t + 1]), events)
            assert np.abs(torch.sigmoid(logits)[0].numpy() - stepped[t]).max() <= 1e-4
    # and a window: predict_one (ONNX path) = the torch window the trainer scored
    with torch.no_grad():
        logits, emb = model.logits(torch.from_numpy(data.signals[:5]),
                                   torch.from_numpy(data.mask[:5]),
                                   torch.from_numpy(data.events[:5]))
    pred = runtime.predict(data.signals[:5], data.mask[:5], data.events[:5])
    assert np.abs(pred.probabilities - torch.sigmoid(logits).numpy()).max() <= 1e-4
    assert np.abs(pred.embedding - emb.numpy()).max() <= 1e-4


def test_restart_schedule_answers_from_a_history_training_saw(stream_data, tmp_path):
    """Two staggered states, restarted every P frames: frame n's answer is the model run
    from reset over the last P/2+1..P frames, the crop range of training."""
    stream = generate_stream("mixed", 60.0, 10.0, np.random.default_rng(5))
    data16 = stream_windows(stream, 16, stride=4, max_events=8)
    trained = train_policy(data16, "streaming-restart", seed=0, epochs=1, val_fraction=0.0,
                           progress=False)
    assert trained.config.restart == 16
    export_bundle(trained, tmp_path / "restart", frame_rate_hz=10.0)
    runtime = PolicyRuntime(tmp_path / "restart")
    assert runtime.manifest.streaming["restart_period"] == 16
    data = stream_data
    frames = np.concatenate([data.signals[0], data.signals[1:, -1]])
    masks = np.concatenate([data.mask[0], data.mask[1:, -1]])
    model = trained.model.eval()
    period, half = 16, 8
    for t in range(70):
        events = data.events[max(0, t - 15)]
        got = runtime.step(frames[t], masks[t], events).copy()
        if t < half:
            age = t + 1
        elif t % period + 1 > half:
            age = t % period + 1
        else:
            age = (t - half) % period + 1
        assert half < age <= period or t < half
        with torch.no_grad():
            logits, emb = model.logits(torch.from_numpy(frames[None, t + 1 - age:t + 1]),
                                       torch.from_numpy(masks[None, t + 1 - age:t + 1]),
                                       torch.from_numpy(events[None]))
        assert np.abs(torch.sigmoid(logits)[0].numpy() - got).max() <= 1e-4, t
        assert np.abs(emb[0].numpy() - runtime.last_embedding).max() <= 1e-4


def test_predict_frame_replays_window_after_reset_then_steps(bundle_dir, stream_data):
    runtime = PolicyRuntime(bundle_dir)
    data = stream_data
    window = runtime.predict_one(data.signals[0], data.mask[0], data.events[0])
    first = runtime.predict_frame(data.signals[0], data.mask[0], data.events[0], t=0.0)
    assert np.abs(first.probabilities - window.probabilities).max() <= 1e-5
    assert runtime.stream_resets["start"] == 1
    # following frames step only the newest row: equals the continuing stream
    ref = PolicyRuntime(bundle_dir, engine="ort")
    ref.predict_frame(data.signals[0], data.mask[0], data.events[0], t=0.0)
    for i in range(1, 30):
        a = runtime.predict_frame(data.signals[i], data.mask[i], data.events[i], t=0.1 * i)
        b = ref.step(data.signals[i, -1], data.mask[i, -1], data.events[i])
        assert np.abs(a.probabilities[0] - b).max() <= 1e-4
    assert sum(runtime.stream_resets.values()) == 1


def _replayed(runtime, data, i):
    return runtime.predict_one(data.signals[i], data.mask[i], data.events[i]).probabilities


@pytest.mark.parametrize("reason,stamp", [("backward", 0.5), ("gap", 9.0)])
def test_time_jump_and_gap_restart_from_window(bundle_dir, stream_data, reason, stamp):
    runtime = PolicyRuntime(bundle_dir)
    data = stream_data
    for i in range(40):
        runtime.predict_frame(data.signals[i], data.mask[i], data.events[i], t=1.0 + 0.1 * i)
    out = runtime.predict_frame(data.signals[40], data.mask[40], data.events[40], t=stamp)
    assert runtime.stream_resets[reason] == 1
    assert np.abs(out.probabilities - _replayed(runtime, data, 40)).max() <= 1e-5
    # the next regular frame is not a reset again
    runtime.predict_frame(data.signals[41], data.mask[41], data.events[41], t=stamp + 0.1)
    assert sum(runtime.stream_resets.values()) == 2


def test_skipped_frame_restarts_from_window(bundle_dir, stream_data):
    """A frame lost between assembly and inference (seq jumps) means a row never stepped."""
    runtime = PolicyRuntime(bundle_dir)
    data = stream_data
    for i in range(20):
        runtime.predict_frame(data.signals[i], data.mask[i], data.events[i], seq=i)
    out = runtime.predict_frame(data.signals[21], data.mask[21], data.events[21], seq=21)
    assert runtime.stream_resets["gap"] == 1
    assert np.abs(out.probabilities - _replayed(runtime, data, 21)).max() <= 1e-5


def test_explicit_reset_and_hot_swap_start_afresh(bundle_dir, stream_data):
    data = stream_data
    old = load_policy(bundle_dir)
    slot = PolicySlot(old)
    for i in range(20):
        old.runtime.predict_frame(data.signals[i], data.mask[i], data.events[i])
    continuing = old.runtime.predict_frame(data.signals[20], data.mask[20], data.events[20])
    assert np.abs(continuing.probabilities - _replayed(old.runtime, data, 20)).max() > 1e-6
    old.runtime.reset()  # e.g. the node's clock-jump callback, from another thread
    after = old.runtime.predict_frame(data.signals[21], data.mask[21], data.events[21])
    assert old.runtime.stream_resets["requested"] == 1
    assert np.abs(after.probabilities - _replayed(old.runtime, data, 21)).max() <= 1e-5
    new = load_policy(bundle_dir, like=old)
    new.runtime.predict_frame(data.signals[0], data.mask[0], data.events[0])  # used before
    slot.offer(new)
    policy, swapped = slot.current()
    assert swapped and policy is new
    out = policy.runtime.predict_frame(data.signals[22], data.mask[22], data.events[22])
    assert np.abs(out.probabilities - _replayed(new.runtime, data, 22)).max() <= 1e-5
    assert out.embedding.shape == (1, 64)  # the embedding stays available (values, recall)


def test_bad_frames_are_refused_and_leave_the_state(bundle_dir):
    runtime = PolicyRuntime(bundle_dir)
    f, m = len(runtime.signals), runtime.max_events
    runtime.step(np.ones(f, np.float32), np.ones(f, np.float32), np.zeros(m, np.int64))
    state = runtime.engine.state.copy()
    bad = np.ones(f, np.float32)
    bad[2] = np.nan
    with pytest.raises(InputError, match="NaN"):
        runtime.step(bad, np.ones(f, np.float32), np.zeros(m, np.int64))
    with pytest.raises(InputError, match="mask"):
        runtime.step(np.ones(f, np.float32), np.full(f, 2.0, np.float32),
                     np.zeros(m, np.int64))
    with pytest.raises(InputError, match="event"):
        runtime.step(np.ones(f, np.float32), np.ones(f, np.float32), np.full(m, 999))
    with pytest.raises(InputError, match="shape"):
        runtime.step(np.ones(f + 1, np.float32), np.ones(f, np.float32),
                     np.zeros(m, np.int64))
    assert np.array_equal(runtime.engine.state, state)


def test_version_1_bundle_still_loads_and_runs(tmp_path):
    folder = tiny_window_bundle(tmp_path / "window")
    path = folder / "bundle.json"  # as a release before the streaming format wrote it
    path.write_text(json.dumps({**json.loads(path.read_text()), "format_version": 1}))
    manifest = load_bundle(folder).manifest
    runtime = PolicyRuntime(folder)
    assert not runtime.streaming and runtime.engine is None
    k, f = runtime.window, len(runtime.signals)
    rng = np.random.default_rng(0)
    signals = rng.normal(size=(k, f)).astype(np.float32) + 10
    mask = np.ones((k, f), np.float32)
    events = np.zeros(runtime.max_events, np.int64)
    a = runtime.predict_one(signals, mask, events).probabilities
    b = runtime.predict_frame(signals, mask, events, t=1.0).probabilities
    assert np.array_equal(a, b)
    runtime.reset()  # a no-op for a window bundle
    with pytest.raises(TypeError, match="streaming"):
        runtime.step(signals[-1], mask[-1], events)
    assert manifest.format_version == 1


def test_ort_fallback_when_numba_disabled(bundle_dir, stream_data, monkeypatch):
    monkeypatch.setenv("THINKMEM_STREAMING_ENGINE", "ort")
    runtime = PolicyRuntime(bundle_dir)
    assert runtime.engine.engine == "ort"
    assert "THINKMEM_STREAMING_ENGINE=ort" in runtime.engine.fallback_reason
    monkeypatch.delenv("THINKMEM_STREAMING_ENGINE")
    fast = PolicyRuntime(bundle_dir)
    data = stream_data
    for i in range(10):
        a = runtime.predict_frame(data.signals[i], data.mask[i], data.events[i]).probabilities
        b = fast.predict_frame(data.signals[i], data.mask[i], data.events[i]).probabilities
        assert np.abs(a - b).max() <= 1e-4
    monkeypatch.setenv("THINKMEM_STREAMING_ENGINE", "cuda")
    with pytest.raises(BundleError, match="THINKMEM_STREAMING_ENGINE"):
        PolicyRuntime(bundle_dir)


def _readonly_tree(path: Path) -> None:
    for child in path.rglob("*"):
        child.chmod(child.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def test_read_only_package_and_bundle_with_a_cache_dir(bundle_dir, tmp_path):
    """An installed, read-only copy compiles once into the user cache, then loads from it."""
    package = tmp_path / "site" / "thinkmem_ros"
    shutil.copytree(ROOT / "thinkmem_ros", package,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    bundle = tmp_path / "bundle"
    shutil.copytree(bundle_dir, bundle)
    _readonly_tree(package)
    _readonly_tree(bundle)
    cache = tmp_path / "xdg"
    script = ("import sys, time, numpy as np\n"
              "t = time.perf_counter()\n"
              "from thinkmem_ros.policy.runtime import PolicyRuntime\n"
              "r = PolicyRuntime(sys.argv[1])\n"
              "p = r.step(np.ones(7, np.float32), np.ones(7, np.float32),"
              " np.zeros(8, np.int64))\n"
              "print(r.engine.engine, round(time.perf_counter() - t, 3), float(p.sum()))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR",
                                                             "THINKMEM_STREAMING_ENGINE")}
    env.update(PYTHONPATH=str(tmp_path / "site"), XDG_CACHE_HOME=str(cache),
               PYTHONDONTWRITEBYTECODE="1")
    runs = []
    try:
        for _ in range(2):
            done = subprocess.run([sys.executable, "-c", script, str(bundle)], env=env,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
            runs.append(done.stdout.split())
    finally:
        for path in (package, bundle):
            for child in [path, *path.rglob("*")]:
                child.chmod(child.stat().st_mode | stat.S_IWUSR)
    assert runs[0][0] == runs[1][0] == "numba"
    assert runs[0][2] == runs[1][2]
    cached = list((cache / "thinkmem_ros" / "numba").rglob("*.nbi"))
    assert cached, "the compiled kernel was not cached in $XDG_CACHE_HOME/thinkmem_ros/numba"
    assert not list(package.rglob("*.nbi"))  # nothing written into the package
