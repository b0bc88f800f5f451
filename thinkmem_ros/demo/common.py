"""Steps both demo modes share: load the bundle, generate the stream, score, plot, report."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import numpy as np

from thinkmem_ros.demo.plot import plot_timeline
from thinkmem_ros.demo.scoring import score
from thinkmem_ros.demo.steps import DemoContext, Step


def load_bundle_step(ctx: DemoContext) -> None:
    """Verify the bundle (sha256, shapes) up front so a bad one fails before anything runs."""
    from thinkmem_ros.core.paths import default_bundle
    from thinkmem_ros.policy.runtime import PolicyRuntime

    path = ctx.config.bundle or default_bundle()
    runtime = PolicyRuntime(path, threads=1)
    ctx.artefacts["runtime"] = runtime
    ctx.summary["bundle"] = {"path": str(path), "version": runtime.version,
                             "sha256": runtime.sha256, "window": runtime.window,
                             "frame_rate_hz": runtime.manifest.frame_rate_hz,
                             "labels": list(runtime.labels)}
    ctx.console.print(f"  bundle v{runtime.version} ({runtime.sha256[:12]}) from {path}: "
                      f"window {runtime.window} frames at {runtime.manifest.frame_rate_hz} Hz")


def generate_step(ctx: DemoContext) -> None:
    """Render the scenario stream at the bundle's frame rate (or the configured one)."""
    from thinkmem_ros.world.streams import SCENARIOS, generate_stream

    cfg = ctx.config
    if cfg.scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {cfg.scenario!r}; expected one of "
                         f"{sorted(SCENARIOS)}")
    rate = cfg.rate_hz or float(ctx.artefacts["runtime"].manifest.frame_rate_hz)
    stream = generate_stream(cfg.scenario, cfg.duration_s, rate,
                             np.random.default_rng(cfg.seed))
    ctx.artefacts["stream"] = stream
    ctx.summary.update(scenario=cfg.scenario, duration_s=cfg.duration_s, rate_hz=rate,
                       seed=cfg.seed, frames=int(stream.values.shape[0]),
                       events=len(stream.events),
                       dropout_fraction=float(np.isnan(stream.values).mean()))
    ctx.console.print(f"  {stream.values.shape[0]} frames of {cfg.scenario!r} at {rate:g} Hz, "
                      f"{len(stream.events)} events")


def score_step(ctx: DemoContext) -> None:
    """Micro and per-label precision/recall/F1 of the activations against ground truth."""
    ctx.summary["activation"] = score(ctx.artefacts["timeline"])


def plot_step(ctx: DemoContext) -> None:
    """Write timeline.png next to summary.json."""
    cfg = ctx.config
    micro = ctx.summary["activation"]["micro"]
    title = (f"{cfg.scenario} ({'offline' if cfg.offline else 'ROS playback'}): "
             f"micro P {micro['precision']:.3f} R {micro['recall']:.3f} F1 {micro['f1']:.3f}")
    path = plot_timeline(ctx.artefacts["timeline"], cfg.out_dir / "timeline.png", title)
    ctx.summary["timeline_png"] = str(path)


def report_step(ctx: DemoContext) -> None:
    """Print the summary table and write summary.json."""
    from rich.table import Table

    summary = ctx.summary
    summary.setdefault("machine", {"cpu": platform.processor() or platform.machine(),
                                   "python": platform.python_version()})
    act = summary["activation"]
    table = Table(title=f"thinking activation vs ground truth ({summary['mode']})")
    for column in ("label", "precision", "recall", "F1", "support", "predicted"):
        table.add_column(column, justify="left" if column == "label" else "right")
    for label, cell in act["per_label"].items():
        table.add_row(label, f"{cell['precision']:.3f}", f"{cell['recall']:.3f}",
                      f"{cell['f1']:.3f}", str(cell["support"]), str(cell["predicted"]))
    micro = act["micro"]
    table.add_row("[bold]micro[/]", *(f"[bold]{micro[k]:.3f}" for k in
                                      ("precision", "recall", "f1")), "", "")
    ctx.console.print(table)
    latency = summary.get("latency", {})
    for name, cell in latency.items():
        if cell.get("count"):
            ctx.console.print(f"  {name}: p50 {cell['p50']:.3f}  p99 {cell['p99']:.3f}  "
                              f"max {cell['max']:.3f}  (n={cell['count']})")
    if "diagnostics" in summary:
        diag = summary["diagnostics"]
        ctx.console.print(f"  diagnostics levels {diag['levels']}, counters {diag['counts']}")
    for key in ("playback", "matching"):
        if key in summary:
            ctx.console.print(f"  {key}: {json.dumps(summary[key])}")
    if "node" in summary:
        ctx.console.print(f"  node exit code {summary['node'].get('exit_code')}, "
                          f"log {summary['node']['log']}")
    path = Path(ctx.config.out_dir) / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    summary["summary_json"] = str(path)
    path.write_text(json.dumps(summary, indent=2, default=_jsonable) + "\n")
    ctx.console.print(f"  wrote {path} and {summary.get('timeline_png', '(no plot)')}")


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


LOAD_BUNDLE = Step("load bundle", load_bundle_step, "verify the model bundle")
GENERATE = Step("generate stream", generate_step, "render the scenario with ground truth")
SCORE = Step("score", score_step, "precision/recall/F1 against ground truth")
PLOT = Step("plot", plot_step, "timeline PNG")
REPORT = Step("report", report_step, "summary table and summary.json")
