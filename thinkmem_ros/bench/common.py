"""Pieces every benchmark shares: machine description, timing summaries, JSON output."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ..metrics import mean_std  # noqa: F401  (re-exported for benchmark modules)


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
    return {"cpu": cpu, "threads": threads, "cores": os.cpu_count(),
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
