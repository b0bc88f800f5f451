"""Train a bundle for one robot's own signals: situations in, a bundle that declares them out.

``thinkmem train --bag`` and ``thinkmem bench real`` both turn windows cut from a robot's
recording into a bundle; this is the one place that does it, so the bundle a user trains
and the one the benchmark scores are made the same way. The bundle declares its signal
set: names and order (as always), the unit of each signal (from the signal adapters) and
the range the training data covered, so ``thinkmem calibrate`` can compare another
recording against it and the consolidator can tell robots apart by their signal set.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.policy.bundle import Bundle, write_bundle
from thinkmem_ros.policy.training.export import build_manifest, onnx_bytes
from thinkmem_ros.policy.training.train import TrainedPolicy, train_policy


def signal_ranges(data: SituationSet) -> dict[str, list[float]]:
    """Per signal [p1, p99] of the observed values in ``data`` (signals never seen left out)."""
    values = data.signals.reshape(-1, data.signals.shape[-1])
    seen = data.mask.reshape(values.shape) > 0.5
    out: dict[str, list[float]] = {}
    for j, name in enumerate(data.signal_names):
        column = values[seen[:, j], j]
        if column.size:
            low, high = np.percentile(column, [1, 99])
            out[name] = [float(low), float(high)]
    return out


def fit_bundle(data: SituationSet, out: Path | str, *, frame_rate_hz: float,
               units: dict[str, str] | None = None, preset: str = "default", seed: int = 0,
               epochs: int = 30, batch_size: int = 128, lr: float = 2e-3, patience: int = 6,
               min_steps: int = 1500, signal_drop: float = 0.0, model_version: int = 1,
               metrics: dict | None = None, extras: dict | None = None,
               progress: bool = False) -> tuple[Bundle, TrainedPolicy]:
    """Train on ``data`` and write a bundle to ``out`` declaring units and training ranges.

    ``min_steps`` defaults high because a recording gives a few thousand windows (a few
    dozen optimiser steps per epoch): a fixed epoch count would stop before the policy
    learned the slower trend rules.
    """
    units = dict(units or {})
    stray = sorted(set(units) - set(data.signal_names))
    if stray:
        raise ValueError(f"units given for signals {stray} the data does not have")
    trained = train_policy(data, preset, seed=seed, epochs=epochs, batch_size=batch_size,
                           lr=lr, patience=patience, progress=progress, min_steps=min_steps,
                           signal_drop=signal_drop)
    manifest = build_manifest(
        trained, model_version=model_version, frame_rate_hz=frame_rate_hz,
        metrics={"validation": trained.val_metrics, **(metrics or {})},
        extras=dict(extras or {}),
        signal_units={name: units.get(name, "") for name in data.signal_names},
        signal_ranges=signal_ranges(data))
    return write_bundle(out, onnx_bytes(trained), manifest), trained
