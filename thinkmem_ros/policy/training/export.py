"""Export a trained policy to ONNX and write it as a verified model bundle.

Uses the TorchScript-based exporter (``dynamo=False``): it handles this small encoder
without the extra ``onnxscript`` dependency. Constant folding is left to ONNX Runtime at
session creation, so the graph's initialisers keep their module names (``head.weight``...)
and ``train.warm_start`` can read weights back from a shipped bundle.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import torch

from thinkmem_ros.policy.bundle import Bundle, BundleManifest, write_bundle
from thinkmem_ros.policy.training.train import TrainedPolicy

OPSET = 17
INPUTS = ("signals", "mask", "events")
OUTPUTS = ("probabilities", "embedding")


def onnx_bytes(trained: TrainedPolicy, opset: int = OPSET) -> bytes:
    """Serialise the policy as ONNX with a dynamic batch axis on every input and output."""
    if opset < 17:
        raise ValueError(f"opset must be >= 17, got {opset}")
    c = trained.config
    model = trained.model.eval()
    example = (torch.zeros(2, c.window, c.n_signals), torch.ones(2, c.window, c.n_signals),
               torch.zeros(2, c.max_events, dtype=torch.int64))
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # The legacy exporter announces its own deprecation; it is chosen on purpose.
        warnings.simplefilter("ignore", DeprecationWarning)
        # Token counts read from tensor shapes are constants for a fixed config.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            model, example, buffer, dynamo=False, opset_version=opset,
            input_names=list(INPUTS), output_names=list(OUTPUTS),
            dynamic_axes={name: {0: "batch"} for name in INPUTS + OUTPUTS},
            do_constant_folding=False)
    return buffer.getvalue()


def build_manifest(trained: TrainedPolicy, *, model_version: int = 1,
                   frame_rate_hz: float = 10.0, training_fingerprint: str | None = None,
                   thresholds: dict[str, float] | None = None,
                   metrics: dict | None = None, extras: dict | None = None) -> BundleManifest:
    """Describe ``trained`` as ``bundle.json`` content (sha256 is filled by ``write_bundle``)."""
    if frame_rate_hz <= 0:
        raise ValueError(f"frame_rate_hz must be > 0, got {frame_rate_hz!r}")
    tau = dict(trained.thresholds if thresholds is None else thresholds)
    missing = [name for name in trained.label_names if name not in tau]
    if missing:
        raise ValueError(f"thresholds lack labels {missing}")
    return BundleManifest(
        model_version=int(model_version), sha256="", labels=list(trained.label_names),
        signals=list(trained.signal_names), window=trained.config.window,
        frame_rate_hz=float(frame_rate_hz),
        normalisation={k: [float(v) for v in trained.normalisation[k]] for k in ("mean", "std")},
        thresholds={name: float(tau[name]) for name in trained.label_names},
        event_vocabulary=list(trained.event_vocabulary),
        max_events=trained.config.max_events,
        training_fingerprint=training_fingerprint or trained.fingerprint,
        preset=trained.preset, model_config=trained.config.to_dict(),
        metrics=dict(metrics or {"validation": trained.val_metrics}),
        extras=dict(extras or {}))


def export_bundle(trained: TrainedPolicy, folder: str | Path, *, model_version: int = 1,
                  frame_rate_hz: float = 10.0, training_fingerprint: str | None = None,
                  thresholds: dict[str, float] | None = None, metrics: dict | None = None,
                  extras: dict | None = None) -> Bundle:
    """Export ``trained`` to ``folder`` atomically and return the re-loaded, verified bundle."""
    manifest = build_manifest(
        trained, model_version=model_version, frame_rate_hz=frame_rate_hz,
        training_fingerprint=training_fingerprint, thresholds=thresholds, metrics=metrics,
        extras=extras)
    return write_bundle(folder, onnx_bytes(trained), manifest)
