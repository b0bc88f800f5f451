"""Golden-output regression for the shipped default bundle (models/default).

test/data/policy_golden.npz holds 48 situations from a mixed stream, the bundle's
outputs on them, a 30 s stretch of that stream replayed frame by frame as the node steps it
(for a streaming bundle, its per-frame state path), and the sha256 of the bundle they came
from. If models/default is
retrained on purpose its sha256 changes and this test skips, saying so; regenerate with::

    .venv/bin/python test/test_policy_golden.py --regenerate
"""

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "test" / "data" / "policy_golden.npz"
BUNDLE = REPO / "models" / "default"
REGENERATE = ".venv/bin/python test/test_policy_golden.py --regenerate"


def _runtime():
    from thinkmem_ros.policy.runtime import PolicyRuntime

    return PolicyRuntime(BUNDLE)


def test_default_bundle_matches_its_golden_outputs():
    if not (BUNDLE / "bundle.json").is_file():
        pytest.skip(f"no shipped bundle at {BUNDLE}")
    golden = np.load(GOLDEN)
    runtime = _runtime()
    if runtime.sha256 != str(golden["sha256"]):
        reason = (f"models/default changed (sha256 {runtime.sha256}, golden file is for "
                  f"{golden['sha256']}); regenerate with: {REGENERATE}")
        print(reason)
        pytest.skip(reason)
    pred = runtime.predict(golden["signals"], golden["mask"], golden["events"])
    np.testing.assert_allclose(pred.probabilities, golden["probabilities"], atol=1e-5)
    np.testing.assert_allclose(pred.embedding, golden["embedding"], atol=1e-4)
    active = (golden["probabilities"] >= runtime.thresholds)
    assert [[runtime.labels[j] for j in np.flatnonzero(row)] for row in active] == pred.active
    # The golden set is informative: several labels fire and several stay off.
    assert 0 < active.sum() < active.size
    stepped = _stepped(runtime, golden)
    np.testing.assert_allclose(stepped, golden["frame_probabilities"], atol=1e-5)
    assert 0 < (stepped >= runtime.thresholds).sum() < stepped.size


def _stepped(runtime, golden) -> np.ndarray:
    """The golden stream's frames through ``predict_frames``: the node's per-frame path."""
    from thinkmem_ros.policy.replay import ReplayedFrames, predict_frames

    m = runtime.manifest
    n = len(golden["frame_times_s"])
    frames = ReplayedFrames(signals=golden["frame_signals"], mask=golden["frame_mask"],
                            events=golden["frame_events"],
                            truth=np.zeros((n, len(m.labels)), np.float32),
                            times_s=golden["frame_times_s"], stream_frames=np.arange(n),
                            label_names=tuple(m.labels), signal_names=tuple(m.signals),
                            event_vocabulary=tuple(m.event_vocabulary))
    return predict_frames(runtime, frames)


def test_default_bundle_loads_and_describes_itself():
    if not (BUNDLE / "bundle.json").is_file():
        pytest.skip(f"no shipped bundle at {BUNDLE}")
    runtime = _runtime()
    m = runtime.manifest
    assert m.streaming and m.preset == "streaming-restart" and m.frame_rate_hz == 10.0
    assert runtime.window == 64  # the span a restarted state has seen when it takes over
    assert "held_out" in m.metrics and m.metrics["held_out"]["micro_f1"] > 0.5
    assert m.extras["command"].startswith("thinkmem train")


def regenerate() -> None:
    """Recompute the golden file from the current models/default (run after retraining)."""
    sys.path.insert(0, str(REPO))
    from thinkmem_ros.policy.replay import predict_frames, replay_for
    from thinkmem_ros.world.streams import generate_stream, stream_windows

    runtime = _runtime()
    stream = generate_stream("mixed", 300.0, 10.0, np.random.default_rng(20240601))
    windows = stream_windows(stream, runtime.window, max_events=runtime.max_events)
    rows = np.random.default_rng(7).choice(len(windows), size=48, replace=False)
    # Prefer situations where something happens, plus some quiet ones.
    busy = np.flatnonzero(windows.labels.sum(1) > 0)
    rows = np.concatenate([np.random.default_rng(8).choice(busy, 32, replace=False),
                           rows[:16]])
    data = windows.subset(np.sort(rows))
    pred = runtime.predict(data.signals, data.mask, data.events)
    frames = replay_for(stream, runtime.manifest)
    stretch = slice(900, 1200)  # 30 s with several labels switching on and off
    frames = type(frames)(**{**vars(frames), **{k: getattr(frames, k)[stretch] for k in (
        "signals", "mask", "events", "truth", "times_s", "stream_frames")}})
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(GOLDEN, signals=data.signals, mask=data.mask, events=data.events,
                        probabilities=pred.probabilities, embedding=pred.embedding,
                        frame_signals=frames.signals, frame_mask=frames.mask,
                        frame_events=frames.events, frame_times_s=frames.times_s,
                        frame_probabilities=predict_frames(runtime, frames),
                        sha256=np.array(runtime.sha256))
    print(f"wrote {GOLDEN} for bundle sha256 {runtime.sha256}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        raise SystemExit(f"usage: {REGENERATE}")
    regenerate()
