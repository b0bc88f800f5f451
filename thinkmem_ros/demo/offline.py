"""Offline demo: the policy runtime over the stream's windows directly, no ROS involved.

Useful before (or without) a ROS graph: it exercises the same bundle, stream and scoring
as the ROS path, so a drop in F1 between the two modes points at the transport, the
framing in the node or the timing, not at the model.
"""

from __future__ import annotations

import time

import numpy as np

from thinkmem_ros.demo.common import GENERATE, LOAD_BUNDLE, PLOT, REPORT, SCORE
from thinkmem_ros.demo.scoring import build_timeline, label_matrix, percentiles
from thinkmem_ros.demo.steps import DemoContext, Step


def _bundle_event_ids(windows, runtime) -> np.ndarray:
    """Re-index window event ids into the bundle's vocabulary (unknown names -> padding)."""
    bundle_vocab = {name: i + 1 for i, name in enumerate(runtime.manifest.event_vocabulary)}
    lookup = np.zeros(len(windows.event_vocabulary) + 1, dtype=np.int64)
    for i, name in enumerate(windows.event_vocabulary):
        lookup[i + 1] = bundle_vocab.get(name, 0)
    events = lookup[windows.events]
    width = runtime.max_events
    return events[:, -width:] if events.shape[1] > width else events


def infer_step(ctx: DemoContext) -> None:
    """One single-situation query per frame (as the node would), timed, with progress."""
    from rich.progress import Progress

    from thinkmem_ros.world.streams import stream_windows

    runtime = ctx.artefacts["runtime"]
    stream = ctx.artefacts["stream"]
    windows = stream_windows(stream, runtime.window, max_events=runtime.max_events)
    events = _bundle_event_ids(windows, runtime)
    active: list[list[str]] = []
    for _ in range(min(10, len(windows))):  # warm-up: first calls allocate, not measured
        runtime.predict_one(windows.signals[0], windows.mask[0], events[0])
    latency_ns = np.zeros(len(windows), dtype=np.int64)
    with Progress(console=ctx.console, disable=ctx.config.quiet, transient=True) as progress:
        task = progress.add_task("policy over windows", total=len(windows))
        for i in range(len(windows)):
            t0 = time.perf_counter_ns()
            prediction = runtime.predict_one(windows.signals[i], windows.mask[i], events[i])
            latency_ns[i] = time.perf_counter_ns() - t0
            active.append(prediction.active[0])
            if i % 25 == 0:
                t_s = stream.times[windows.meta["end_frames"][i]]
                shown = ",".join(prediction.active[0]) or "-"
                progress.update(task, completed=i + 1, description=f"t={t_s:5.1f}s {shown:<40.40}")
        progress.update(task, completed=len(windows))
    frames = np.asarray(windows.meta["end_frames"])
    ctx.artefacts["timeline"] = build_timeline(
        stream.times, stream.values, stream.labels, frames,
        label_matrix(active, stream.label_names), min_frame=runtime.window - 1,
        signal_names=stream.signal_names, label_names=stream.label_names)
    ctx.summary["latency"] = {"inference_us": percentiles(latency_ns, 1e-3)}


INFER = Step("run policy", infer_step, "ONNX Runtime over every window, one at a time")


def offline_steps() -> list[Step]:
    """Return the offline job: bundle -> stream -> policy -> score -> plot -> report."""
    from thinkmem_ros.demo.own_folders import check_out_step

    # its summary.json, timeline.png ... go into --out as the ROS demo's do: same rule
    return [check_out_step(()), LOAD_BUNDLE, GENERATE, INFER, SCORE, PLOT, REPORT]
