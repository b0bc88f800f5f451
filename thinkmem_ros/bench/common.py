"""Pieces every benchmark shares: machine description, timing summaries, JSON output."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from thinkmem_ros.core.metrics import mean_std  # noqa: F401  (re-exported for benchmark modules)
from thinkmem_ros.policy.config import DEFAULT_PRESET


def machine_info(threads: int = 1) -> dict:
    """What the figures were measured on, so a reader can judge them."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:  # a loaded shared machine inflates wall-clock tails; say how loaded it was
        load = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        load = []
    return {"cpu": cpu, "threads": threads, "cores": os.cpu_count(), "load_avg_1_5_15": load,
            "python": platform.python_version(), "platform": platform.platform()}


def percentiles_ms(samples_s: Iterable[float]) -> dict[str, float]:
    """p50/p99/p99.9/mean/max of durations given in seconds, reported in milliseconds."""
    arr = np.asarray(list(samples_s), dtype=np.float64) * 1e3
    if arr.size == 0:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "p999_ms": float("nan"),
                "mean_ms": float("nan"), "max_ms": float("nan"), "n": 0}
    return {"p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99)),
            "p999_ms": float(np.percentile(arr, 99.9)), "mean_ms": float(arr.mean()),
            "max_ms": float(arr.max()), "n": int(arr.size)}


def time_calls(fn: Callable[[], object], n: int, warmup: int = 50) -> list[float]:
    """Per-call wall times in seconds of ``fn`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    clock = time.perf_counter
    for _ in range(n):
        start = clock()
        fn()
        out.append(clock() - start)
    return out


def finish_report(result: dict, *, name: str, quick: bool, seeds: int, threads: int = 1,
                  json_path: str | Path | None = None) -> dict:
    """Add the standard header keys and write the JSON if asked; returns the full report."""
    report = {"experiment": name, "quick": quick, "seeds": seeds, **result}
    report.setdefault("results", {})
    report.setdefault("curves", {})
    report["machine"] = machine_info(threads)
    if json_path:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return report


# --- shared by the method-comparison benchmarks (exp1, exp2, exp3, exp5) -------------------

METHODS: tuple[str, ...] = ("proposed", "summary_rag", "sequence_rag", "rf_summary",
                            "current_state_only")
"""Method keys of the benchmark JSON, in table order."""


def bench_progress():
    """Return a rich progress display on stderr, so stdout stays the command's JSON summary."""
    from rich import progress as rp
    from rich.console import Console

    return rp.Progress(rp.TextColumn("{task.description}"), rp.BarColumn(),
                       rp.MofNCompleteColumn(), rp.TimeElapsedColumn(),
                       console=Console(stderr=True))


def summarise_scores(scores: dict[str, list[dict[str, float]]]) -> dict[str, dict]:
    """Per-seed ``micro_scores`` per method -> ``results`` (F1) and precision/recall tables."""
    out: dict[str, dict] = {"results": {}, "results_precision": {}, "results_recall": {}}
    for method, rows in scores.items():
        if not rows:
            continue
        out["results"][method] = mean_std([r["f1"] for r in rows])
        out["results_precision"][method] = mean_std([r["precision"] for r in rows])
        out["results_recall"][method] = mean_std([r["recall"] for r in rows])
    return out


def compare_methods(train, test, methods: Iterable[str], *, seed: int, epochs: int,
                    preset: str = DEFAULT_PRESET,
                    min_steps: int = 0) -> dict[str, dict[str, float]]:
    """Fit each named method on ``train`` and score it on ``test`` (micro P/R/F1).

    ``proposed`` trains the policy of ``preset`` (a window or a streaming preset) and
    ``current_state_only`` the Transformer on the last frame (the same preset when it is a
    window preset, else ``default``); both with the same epochs and seed, thresholds tuned
    on their validation split. The others are the baselines of ``thinkmem_ros.baselines``.
    ``min_steps`` is the policy's optimiser-step floor (``train_policy``), which also holds
    off its early stopping.
    """
    from thinkmem_ros.baselines import CurrentStateOnly, RFSummary, SequenceRAG, SummaryRAG
    from thinkmem_ros.core.metrics import micro_scores
    from thinkmem_ros.policy.config import PRESETS

    out = {}
    for method in methods:
        if method == "proposed":
            from thinkmem_ros.policy.training.train import predict_proba, train_policy

            trained = train_policy(train, preset, seed=seed, epochs=epochs, progress=False,
                                   min_steps=min_steps)
            predicted = predict_proba(trained, test) >= trained.threshold_array
        elif method == "current_state_only":
            window_preset = preset if preset in PRESETS else "default"
            predicted = CurrentStateOnly(preset=window_preset, seed=seed, epochs=epochs).fit(
                train).predict(test)
        else:
            factories = {"summary_rag": SummaryRAG, "sequence_rag": SequenceRAG,
                         "rf_summary": lambda: RFSummary(seed=seed)}
            if method not in factories:
                raise ValueError(f"unknown method {method!r}; expected one of {list(METHODS)}")
            predicted = factories[method]().fit(train).predict(test)
        out[method] = micro_scores(test.labels, predicted)
    return out


def epochs_for(n_rows: int, base: int, *, min_steps: int = 400, batch_size: int = 128,
               val_fraction: float = 0.15, cap: int = 400) -> int:
    """Epochs so that small training sets still get ``min_steps`` optimiser steps.

    A fixed epoch count gives a 100-row set one step per epoch; training would end before
    the model learned anything, and the benchmark would measure the schedule, not the data.
    """
    steps = max(1, -(-int(round(n_rows * (1.0 - val_fraction))) // batch_size))
    return int(min(cap, max(base, -(-min_steps // steps))))


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _a_png(path: Path) -> bool:
    """Whether an existing --plot is a PNG (an earlier plot: replacing it loses nothing)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(len(PNG_MAGIC)) == PNG_MAGIC
    except OSError:
        return False


def check_report_outputs(parser, args) -> None:
    """Refuse --json and --plot before the run: one line, exit 2.

    For the benchmarks run as ``python -m`` (``args.json``, ``args.plot``). Why: both were
    written only after minutes of work, over whatever was there (a text file of the user's
    became a report), and a folder or a format matplotlib cannot save failed then with a
    traceback, the results lost.
    """
    from thinkmem_ros.core.output_files import check_output, json_report

    if args.plot and Path(args.plot).suffix.lower() != ".png":
        parser.error(f"--plot {args.plot}: the plot is a PNG; give a path ending in .png")
    try:
        if args.json:
            check_output(args.json, "--json", replaces=json_report("experiment", "results"))
        if args.plot:
            check_output(args.plot, "--plot", replaces=("a PNG image", _a_png))
    except SystemExit as refused:
        parser.error(str(refused.code))
