"""Export a trained policy to ONNX and write it as a verified model bundle.

Uses the TorchScript-based exporter (``dynamo=False``): it handles this small encoder
without the extra ``onnxscript`` dependency. Constant folding is left to ONNX Runtime at
session creation, so the graph's initialisers keep their module names (``head.weight``...)
and ``train.warm_start`` can read weights back from a shipped bundle (the robot's compiled
streaming kernel reads them by the same names).

A streaming policy (``streaming_model.StreamingPolicy``) is exported as its per-frame
update with explicit state inputs and outputs (``streaming_runtime.STEP_INPUTS`` /
``STEP_OUTPUTS``), in a format-2 bundle whose manifest has a ``streaming`` section.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import torch

from thinkmem_ros.policy.bundle import Bundle, BundleManifest, write_bundle
from thinkmem_ros.policy.streaming_runtime import (
    STATE_OUTPUTS,
    STEP_INPUTS,
    STEP_OUTPUTS,
    StreamingConfig,
)
from thinkmem_ros.policy.training.train import TrainedPolicy

OPSET = 17
INPUTS = ("signals", "mask", "events")
OUTPUTS = ("probabilities", "embedding")


def onnx_bytes(trained: TrainedPolicy, opset: int = OPSET) -> bytes:
    """Serialise the policy as ONNX with a dynamic batch axis on every input and output."""
    if opset < 17:
        raise ValueError(f"opset must be >= 17, got {opset}")
    if isinstance(trained.config, StreamingConfig):
        return streaming_onnx_bytes(trained, opset)
    c = trained.config
    model = trained.model.eval()
    example = (torch.zeros(2, c.window, c.n_signals), torch.ones(2, c.window, c.n_signals),
               torch.zeros(2, c.max_events, dtype=torch.int64))
    return _trace(model, example, INPUTS, OUTPUTS, opset)


def _trace(model, example: tuple, inputs, outputs, opset: int) -> bytes:
    """ONNX bytes of ``model`` traced on ``example``, batch axis dynamic everywhere."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # The legacy exporter announces its own deprecation; it is chosen on purpose.
        warnings.simplefilter("ignore", DeprecationWarning)
        # Token counts read from tensor shapes are constants for a fixed config.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            model, example, buffer, dynamo=False, opset_version=opset,
            input_names=list(inputs), output_names=list(outputs),
            dynamic_axes={name: {0: "batch"} for name in (*inputs, *outputs)},
            do_constant_folding=False)
    return buffer.getvalue()


def streaming_onnx_bytes(trained: TrainedPolicy, opset: int = OPSET) -> bytes:
    """Serialise a streaming policy's per-frame update, state in and state out."""
    c = trained.config
    model = trained.model.eval()
    f = c.n_signals
    example = (torch.zeros(2, f), torch.ones(2, f),
               torch.zeros(2, c.max_events, dtype=torch.int64),
               *(torch.zeros(2, *shape) for shape in c.state_shapes().values()))
    return _trace(model, example, STEP_INPUTS, STEP_OUTPUTS, opset)


def streaming_section(config: StreamingConfig, frame_rate_hz: float) -> dict:
    """The manifest's ``streaming`` section: state layout and when the robot resets it.

    ``gap_s``: a frame later than this after the previous one (an input gap, a dropped
    frame, a forward sim-time jump) restarts the state from the node's window, as does any
    backward step of time (a looped bag, a seek).
    """
    return {"kind": config.kind, "inputs": list(STEP_INPUTS), "outputs": list(STEP_OUTPUTS),
            "state": {name: list(shape) for name, shape in config.state_shapes().items()},
            "state_outputs": list(STATE_OUTPUTS), "warmup_frames": config.window,
            "restart_period": config.restart,
            "gap_s": round(2.5 / float(frame_rate_hz), 6)}


def build_manifest(trained: TrainedPolicy, *, model_version: int = 1,
                   frame_rate_hz: float = 10.0, training_fingerprint: str | None = None,
                   thresholds: dict[str, float] | None = None,
                   metrics: dict | None = None, extras: dict | None = None,
                   signal_units: dict[str, str] | None = None,
                   signal_ranges: dict[str, list[float]] | None = None) -> BundleManifest:
    """Describe ``trained`` as ``bundle.json`` content (sha256 is filled by ``write_bundle``).

    ``signal_units`` and ``signal_ranges`` declare the robot's signal set; a retrained
    bundle must carry its parent's, or its signal-set fingerprint changes and the
    consolidator's line stops accepting the robots that run it.
    """
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
        extras=dict(extras or {}),
        signal_units={name: str((signal_units or {}).get(name, ""))
                      for name in trained.signal_names} if signal_units else {},
        signal_ranges={name: [float(v) for v in r] for name, r in (signal_ranges or {}).items()
                       if name in trained.signal_names},
        streaming=(streaming_section(trained.config, frame_rate_hz)
                   if isinstance(trained.config, StreamingConfig) else {}))


def export_bundle(trained: TrainedPolicy, folder: str | Path, *, model_version: int = 1,
                  frame_rate_hz: float = 10.0, training_fingerprint: str | None = None,
                  thresholds: dict[str, float] | None = None, metrics: dict | None = None,
                  extras: dict | None = None, signal_units: dict[str, str] | None = None,
                  signal_ranges: dict[str, list[float]] | None = None) -> Bundle:
    """Export ``trained`` to ``folder`` atomically and return the re-loaded, verified bundle."""
    manifest = build_manifest(
        trained, model_version=model_version, frame_rate_hz=frame_rate_hz,
        training_fingerprint=training_fingerprint, thresholds=thresholds, metrics=metrics,
        extras=extras, signal_units=signal_units, signal_ranges=signal_ranges)
    return write_bundle(folder, onnx_bytes(trained), manifest)
