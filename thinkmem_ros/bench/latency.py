"""Policy inference latency on one thread: the shipped bundles, paper and fast presets.

Reproduce: ``thinkmem bench latency --json bench_results/latency.json
--plot bench_results/latency.png`` (``--quick``: 2,000 instead of 10,000 queries per repeat).

``results.default`` is the window-form Transformer (the ``default`` preset: the shipped
``models/window``, or the measured bundle when it is a window one). Its batch-1 queries go
through ``PolicyRuntime.predict_one`` (the robot's control-loop path for a window bundle,
input checks included), timed one by one after an untimed warm-up; ``batch64_per_s`` is the
throughput of ``predict`` on batches of 64. The paper preset (4 layers, d=192) is exported
*untrained* with the window bundle's window, labels and events: weights do not change the
arithmetic, so its latency is that of a trained one. ONNX Runtime is measured with spinning
allowed and disallowed (DESIGN.md pitfall: spinning threads burn CPU between calls), and the
CPU time each query costs is recorded beside its wall time.

``results.streaming`` times the per-frame update the robot runs (``PolicyRuntime.step``:
one new frame, the state carried over, input checks included), one frame after another on
one thread: the measured bundle when it streams (the shipped default runs two staggered
states, so two updates per frame), else an untrained export of the default streaming
preset with its shapes. ``results.streaming_one_state`` is one state of the same shapes,
for reference. Both engines are timed (``engines.numba`` / ``engines.ort``); the top-level
figures are those of the engine the runtime picks by itself.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from thinkmem_ros.bench.common import bench_progress, mean_std, percentiles_ms
from thinkmem_ros.bench.plots import new_figure, save
from thinkmem_ros.core.paths import default_bundle

SIZES = {"full": {"queries": 10000, "batches": 300, "warmup": 200},
         "quick": {"queries": 2000, "batches": 60, "warmup": 100},
         "tiny": {"queries": 200, "batches": 5, "warmup": 10}}
"""Batch-1 queries per repeat, batch-64 calls and warm-up calls per run size."""

SEED_BASE = 7000


def situations(manifest, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, K, F) float32 windows around the bundle's training statistics."""
    mean = np.asarray(manifest.normalisation["mean"], np.float32)
    std = np.asarray(manifest.normalisation["std"], np.float32)
    noise = rng.standard_normal((n, manifest.window, len(manifest.signals))).astype(np.float32)
    return mean + std * noise


def export_untrained(preset: str, reference, folder: Path) -> Path:
    """Write an untrained ``preset`` model with ``reference``'s shapes as a bundle.

    ``reference`` is a loaded bundle, or None for the package's standard shapes (window 32,
    the base signals and labels, 8 event slots) when no shipped bundle exists yet.
    """
    from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
    from thinkmem_ros.policy.config import PolicyConfig
    from thinkmem_ros.policy.training.export import export_bundle
    from thinkmem_ros.policy.training.model import ThinkingPolicy
    from thinkmem_ros.policy.training.train import TrainedPolicy

    if reference is None:
        sizes = {"window": 32, "n_signals": len(SIGNALS), "n_labels": len(THINKING),
                 "max_events": 8, "n_event_vocab": 0}
        names = {"label_names": THINKING, "signal_names": SIGNALS, "event_vocabulary": (),
                 "normalisation": {"mean": [0.0] * len(SIGNALS), "std": [1.0] * len(SIGNALS)},
                 "thresholds": {name: 0.5 for name in THINKING}}
        rate = 10.0
    else:
        m = reference.manifest
        sizes = {k: m.model_config[k] for k in ("window", "n_signals", "n_labels",
                                               "max_events", "n_event_vocab")}
        names = {"label_names": tuple(m.labels), "signal_names": tuple(m.signals),
                 "event_vocabulary": tuple(m.event_vocabulary),
                 "normalisation": dict(m.normalisation), "thresholds": dict(m.thresholds)}
        rate = m.frame_rate_hz
    config = PolicyConfig.from_preset(preset, **sizes)
    trained = TrainedPolicy(model=ThinkingPolicy(config).eval(), config=config, preset=preset,
                            **names)
    export_bundle(trained, folder, model_version=1, frame_rate_hz=rate,
                  extras={"note": "untrained; for latency only"})
    return folder


def export_untrained_streaming(reference, folder: Path, preset: str = "streaming") -> Path:
    """Write an untrained streaming policy with ``reference``'s shapes as a bundle."""
    from thinkmem_ros.policy.streaming_runtime import StreamingConfig
    from thinkmem_ros.policy.training.export import export_bundle
    from thinkmem_ros.policy.training.streaming_model import StreamingPolicy
    from thinkmem_ros.policy.training.train import STREAMING_PRESETS, TrainedPolicy

    m = reference.manifest
    shape = dict(STREAMING_PRESETS[preset])
    if shape.get("restart") == -1:
        shape["restart"] = m.window
    config = StreamingConfig(window=m.window, n_signals=len(m.signals), n_labels=len(m.labels),
                             max_events=m.max_events, n_event_vocab=len(m.event_vocabulary),
                             **shape)
    model = StreamingPolicy(config).eval()
    model.set_normalisation(m.normalisation["mean"], m.normalisation["std"])
    trained = TrainedPolicy(
        model=model, config=config, preset=preset, label_names=tuple(m.labels),
        signal_names=tuple(m.signals), event_vocabulary=tuple(m.event_vocabulary),
        normalisation=dict(m.normalisation), thresholds=dict(m.thresholds))
    export_bundle(trained, folder, model_version=1, frame_rate_hz=m.frame_rate_hz,
                  extras={"note": "untrained; for latency only"})
    return folder


def step_times(runtime, frames: np.ndarray, events: np.ndarray,
               warmup: int) -> tuple[list[float], float]:
    """Per-frame wall seconds of ``step`` over consecutive frames, and CPU s per frame."""
    mask = np.ones(frames.shape[1], np.float32)
    for i in range(warmup):
        runtime.step(frames[i % len(frames)], mask, events)
    clock = time.perf_counter
    out = []
    cpu0 = time.process_time()
    for frame in frames:
        start = clock()
        runtime.step(frame, mask, events)
        out.append(clock() - start)
    return out, (time.process_time() - cpu0) / len(frames)


def measure_streaming(bundle_path: Path, cfg: dict, repeats: int,
                      rng: np.random.Generator) -> dict:
    """Per-frame update percentiles in microseconds for each engine, one thread."""
    from thinkmem_ros.policy.runtime import PolicyRuntime

    out: dict = {"engines": {}}
    for engine in (None, "ort"):
        runtime = PolicyRuntime(bundle_path, threads=1, engine=engine)
        events = np.zeros(runtime.max_events, np.int64)
        events[-2:] = 1 if runtime.manifest.event_vocabulary else 0
        samples, cpu = [], []
        for _ in range(repeats):
            frames = situations(runtime.manifest, cfg["queries"] // runtime.window + 1, rng)
            frames = np.ascontiguousarray(frames.reshape(-1, frames.shape[-1])[:cfg["queries"]])
            times, cpu_s = step_times(runtime, frames, events, cfg["warmup"])
            samples.extend(times)
            cpu.append(cpu_s * 1e6)
        us = np.asarray(samples) * 1e6
        row = {"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99)),
               "p999_us": float(np.percentile(us, 99.9)), "mean_us": float(us.mean()),
               "cpu_us_per_frame": float(np.mean(cpu)), "frames": int(us.size)}
        name = runtime.engine.engine
        out["engines"][name] = row
        if engine is None:
            out.update(row, engine=name, fallback_reason=runtime.engine.fallback_reason)
    out.update(threads=1, hidden=runtime.engine.config.hidden,
               onnx_bytes=runtime.bundle.onnx_path.stat().st_size)
    return out


def bundle_roles(path: Path, source: str, tmp: Path) -> dict[str, tuple[Path, str]]:
    """(bundle, where it came from) for each section of the report.

    ``streaming`` is the per-frame update the robot runs: the measured bundle when it
    streams (the shipped default: two staggered states), else an untrained export of the
    default streaming preset with its shapes. ``streaming_one_state`` is one state of the
    same shapes, for reference. ``default`` is the window-form Transformer (the ``default``
    preset): the measured bundle when it is a window one, else the shipped models/window.
    Untrained exports time like trained ones: weights do not change the arithmetic.
    """
    from thinkmem_ros.core.paths import window_bundle
    from thinkmem_ros.policy.bundle import BundleError, load_bundle
    from thinkmem_ros.policy.config import DEFAULT_PRESET

    reference = load_bundle(path)
    shapes = "the measured bundle's shapes"
    one_state = (export_untrained_streaming(reference, tmp / "one_state"),
                 f"untrained 'streaming' preset (one state) with {shapes}")
    if not reference.manifest.streaming:
        return {"default": (path, source), "streaming_one_state": one_state,
                "streaming": (export_untrained_streaming(reference, tmp / "streaming",
                                                         DEFAULT_PRESET),
                              f"untrained {DEFAULT_PRESET!r} preset with {shapes}")}
    try:
        window = (window_bundle(), "shipped models/window")
        load_bundle(window[0])
    except (FileNotFoundError, BundleError):
        window = (export_untrained("default", None, tmp / "window"),
                  "stand-in: untrained default preset (models/window missing)")
    return {"default": window, "streaming": (path, source), "streaming_one_state": one_state}


def batch1_times(runtime, windows: np.ndarray, warmup: int) -> tuple[list[float], float]:
    """Per-query wall seconds of ``predict_one`` and the CPU seconds per query."""
    for i in range(warmup):
        runtime.predict_one(windows[i % len(windows)])
    clock = time.perf_counter
    out = []
    cpu0 = time.process_time()
    for window in windows:
        start = clock()
        runtime.predict_one(window)
        out.append(clock() - start)
    return out, (time.process_time() - cpu0) / len(windows)


def batch64_rate(runtime, windows: np.ndarray, calls: int) -> float:
    """Situations per second of ``predict`` on batches of 64 (after one untimed call)."""
    batch = windows[:64]
    runtime.predict(batch)
    start = time.perf_counter()
    for _ in range(calls):
        runtime.predict(batch)
    return 64 * calls / (time.perf_counter() - start)


def measure(bundle_path: Path, cfg: dict, repeats: int, rng: np.random.Generator, *,
            allow_spinning: bool = False, with_batch: bool = True) -> dict:
    """Latency percentiles (pooled over repeats), per-repeat p99 spread and throughput."""
    from thinkmem_ros.policy.runtime import PolicyRuntime

    runtime = PolicyRuntime(bundle_path, threads=1, allow_spinning=allow_spinning)
    samples, p99s, cpu = [], [], []
    for _ in range(repeats):
        windows = situations(runtime.manifest, cfg["queries"], rng)
        times, cpu_s = batch1_times(runtime, windows, cfg["warmup"])
        samples.extend(times)
        p99s.append(percentiles_ms(times)["p99_ms"])
        cpu.append(cpu_s * 1e3)
    out = {**percentiles_ms(samples), "p99_ms_per_repeat": mean_std(p99s),
           "cpu_ms_per_query": float(np.mean(cpu)), "allow_spinning": allow_spinning,
           "threads": 1, "onnx_bytes": runtime.bundle.onnx_path.stat().st_size,
           "model_config": runtime.manifest.model_config}
    if with_batch:
        windows = situations(runtime.manifest, 64, rng)
        out["batch64_per_s"] = float(np.mean([batch64_rate(runtime, windows, cfg["batches"])
                                              for _ in range(repeats)]))
    return out


def run(quick: bool, seeds: int, size: str | None = None,
        bundle: str | Path | None = None) -> dict:
    """Measure the default bundle (spinning off and on) and the paper preset."""
    from thinkmem_ros.policy.bundle import BundleError, load_bundle

    cfg = SIZES[size or ("quick" if quick else "full")]
    rng = np.random.default_rng(SEED_BASE)
    results: dict = {}
    with bench_progress() as bar, tempfile.TemporaryDirectory() as tmp:
        path, source = Path(bundle) if bundle else None, "given"
        if path is None:
            try:
                path, source = default_bundle(), "shipped models/default"
                load_bundle(path)
            except (FileNotFoundError, BundleError):
                # No shipped bundle yet: time an untrained default-preset stand-in of the
                # same shapes (weights do not change latency) and say so in the JSON.
                path = export_untrained("default", None, Path(tmp) / "default")
                source = "stand-in: untrained default preset (models/default missing)"
        roles = bundle_roles(path, source, Path(tmp))
        task = bar.add_task("latency", total=6)
        bar.update(task, description="latency: window bundle")
        results["default"] = measure(roles["default"][0], cfg, seeds, rng)
        results["default"]["source"] = roles["default"][1]
        bar.update(task, advance=1, description="latency: window, spinning allowed")
        spinning = measure(roles["default"][0], cfg, seeds, rng, allow_spinning=True,
                           with_batch=False)
        window_ref = load_bundle(roles["default"][0])
        bar.update(task, advance=1, description="latency: exporting paper preset")
        paper_path = export_untrained("paper", window_ref, Path(tmp) / "paper")
        bar.update(task, advance=1, description="latency: paper preset")
        results["paper"] = measure(paper_path, cfg, seeds, rng)
        bar.update(task, advance=1, description="latency: fast preset")
        fast_path = export_untrained("fast", window_ref, Path(tmp) / "fast")
        results["fast"] = measure(fast_path, cfg, seeds, rng)
        bar.update(task, advance=1, description="latency: streaming per-frame update")
        for name in ("streaming", "streaming_one_state"):
            results[name] = measure_streaming(roles[name][0], cfg, seeds, rng)
            results[name]["source"] = roles[name][1]
        bar.update(task, advance=1)
    keys = ("p50_ms", "p99_ms", "p999_ms", "mean_ms", "cpu_ms_per_query")
    results["default"]["spinning"] = {
        "disallowed": {k: results["default"][k] for k in keys},
        "allowed": {k: spinning[k] for k in keys}}
    return {"metric": "latency_ms", "results": results,
            "targets": {"default_p99_ms_below": 1.0,
                        "default_p99_met": results["default"]["p99_ms"] < 1.0,
                        "streaming_p50_us_at_most": 5.0,
                        "streaming_p50_met": results["streaming"]["p50_us"] <= 5.0},
            "setup": {**cfg, "repeats": seeds, "bundle": str(path), "bundle_source": source,
                      "batch": 1,
                      "paper_preset": "untrained export with the window bundle's window, "
                                      "labels and events; weights do not change latency",
                      "fast_preset": "the same for the 'fast' preset (1 layer, d=32)"}}


def plot(report: dict, path) -> None:
    """Per-frame update of the streaming policy; window-form percentiles and throughput."""
    res = report["results"]
    rows = {"window (default preset)": res["default"], "window, spinning":
            res["default"]["spinning"]["allowed"], "paper preset": res["paper"]}
    if "fast" in res:
        rows["fast preset"] = res["fast"]
    fig, (ax0, ax1, ax2) = new_figure(3, "Policy latency, 1 thread, batch 1")
    _plot_streaming(ax0, res)
    keys = ("p50_ms", "p99_ms", "p999_ms")
    width = 0.8 / len(rows)
    for j, (name, row) in enumerate(rows.items()):
        xs = [i + (j - (len(rows) - 1) / 2) * width for i in range(len(keys))]
        bars = ax1.bar(xs, [row[k] for k in keys], width, label=name)
        ax1.bar_label(bars, fmt="%.3f", fontsize=7)
    ax1.axhline(1.0, color="red", linestyle="--", linewidth=1, label="1 ms target")
    ax1.set_xticks(range(len(keys)), ["p50", "p99", "p99.9"])
    ax1.set_yscale("log")  # p50 and a loaded machine's p99.9 differ by orders of magnitude
    ax1.set_ylabel("ms per query (log)")
    ax1.legend(fontsize=8)
    names = [n for n in ("default", "paper", "fast") if n in res]
    bars = ax2.bar([f"{n} preset" if n != "default" else n for n in names],
                   [res[n]["batch64_per_s"] for n in names])
    ax2.bar_label(bars, fmt="%.0f", fontsize=8)
    ax2.set_ylabel("situations / s (batch 64)")
    save(fig, path)


def _plot_streaming(ax, res: dict) -> None:
    """p50/p99 microseconds per frame of each streaming section, per engine (log scale)."""
    names = [n for n in ("streaming", "streaming_one_state") if n in res]
    engines = sorted({e for n in names for e in res[n]["engines"]})
    width = 0.8 / max(1, 2 * len(engines))
    for j, (engine, q) in enumerate((e, q) for e in engines for q in ("p50_us", "p99_us")):
        xs = [i + (j - (2 * len(engines) - 1) / 2) * width for i in range(len(names))]
        values = [res[n]["engines"].get(engine, {}).get(q, float("nan")) for n in names]
        bars = ax.bar(xs, values, width, label=f"{engine} {q[:3]}")
        ax.bar_label(bars, fmt="%.1f", fontsize=6)
    ax.axhline(5.0, color="red", linestyle="--", linewidth=1, label="5 us goal (p50)")
    ax.set_xticks(range(len(names)), ["per frame (robot)" if n == "streaming" else "one state"
                                      for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("us per frame (log)")
    ax.legend(fontsize=7)
