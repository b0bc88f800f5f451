"""Golden-output regression for the shipped default bundle (models/default).

test/data/policy_golden.npz holds 48 situations from a mixed stream, the bundle's
outputs on them and the sha256 of the bundle they came from. If models/default is
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


def test_default_bundle_loads_and_describes_itself():
    if not (BUNDLE / "bundle.json").is_file():
        pytest.skip(f"no shipped bundle at {BUNDLE}")
    runtime = _runtime()
    m = runtime.manifest
    assert runtime.window == 32 and m.frame_rate_hz == 10.0 and m.preset == "default"
    assert "held_out" in m.metrics and m.metrics["held_out"]["micro_f1"] > 0.5
    assert m.extras["command"].startswith("thinkmem train")


def regenerate() -> None:
    """Recompute the golden file from the current models/default (run after retraining)."""
    sys.path.insert(0, str(REPO))
    from thinkmem_ros.world.streams import generate_stream, stream_windows

    stream = generate_stream("mixed", 300.0, 10.0, np.random.default_rng(20240601))
    windows = stream_windows(stream, 32, max_events=_runtime().max_events)
    rows = np.random.default_rng(7).choice(len(windows), size=48, replace=False)
    # Prefer situations where something happens, plus some quiet ones.
    busy = np.flatnonzero(windows.labels.sum(1) > 0)
    rows = np.concatenate([np.random.default_rng(8).choice(busy, 32, replace=False),
                           rows[:16]])
    data = windows.subset(np.sort(rows))
    runtime = _runtime()
    pred = runtime.predict(data.signals, data.mask, data.events)
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(GOLDEN, signals=data.signals, mask=data.mask, events=data.events,
                        probabilities=pred.probabilities, embedding=pred.embedding,
                        sha256=np.array(runtime.sha256))
    print(f"wrote {GOLDEN} for bundle sha256 {runtime.sha256}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        raise SystemExit(f"usage: {REGENERATE}")
    regenerate()
