"""Matplotlib figures for the method-comparison benchmarks (Agg backend, PNG out).

One helper per kind of figure so each benchmark's ``plot`` is a line or two and every
figure looks the same: bars with std error bars for method tables, lines with std bands
for series keyed by x.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)

LABELS = {"proposed": "Policy (proposed)", "summary_rag": "Summary-RAG",
          "sequence_rag": "Sequence-RAG", "rf_summary": "RF-Summary",
          "current_state_only": "Current-State-Only"}
"""Display names of the method keys."""


def _save(fig, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def method_bars(report: dict, path: str | Path, title: str) -> None:
    """Draw grouped bars of micro precision / recall / F1 per method, with std error bars."""
    tables = [("F1", report.get("results", {})),
              ("precision", report.get("results_precision", {})),
              ("recall", report.get("results_recall", {}))]
    methods = [m for m in report.get("results", {}) if isinstance(report["results"][m], dict)
               and "mean" in report["results"][m]]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(tables)
    for j, (name, table) in enumerate(tables):
        xs = [i + (j - 1) * width for i in range(len(methods))]
        means = [table.get(m, {}).get("mean", 0.0) for m in methods]
        stds = [table.get(m, {}).get("std", 0.0) for m in methods]
        bars = ax.bar(xs, means, width, yerr=stds, capsize=3, label=f"micro-{name}")
        if name == "F1":
            ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=2)
    ax.set_xticks(range(len(methods)), [LABELS.get(m, m) for m in methods], rotation=15)
    ax.set_ylim(0, 1.25)
    ax.set_ylabel("score (mean ± std over seeds)")
    ax.set_title(title)
    ax.legend(loc="upper center", ncol=3, fontsize=8)
    _save(fig, path)


def series_panel(ax, curves: dict, keys: dict[str, str], *, log_x: bool = True,
                 log_y: bool = False, ylabel: str = "") -> None:
    """Draw ``curves[key]`` ({x: {"mean","std"}}) as lines with std bands on ``ax``."""
    for key, label in keys.items():
        series = curves.get(key)
        if not series:
            continue
        xs = sorted(series, key=float)
        x = [float(v) for v in xs]
        mean = [series[v]["mean"] if isinstance(series[v], dict) else series[v] for v in xs]
        std = [series[v].get("std", 0.0) if isinstance(series[v], dict) else 0.0 for v in xs]
        ax.plot(x, mean, marker="o", label=label)
        ax.fill_between(x, [m - s for m, s in zip(mean, std, strict=True)],
                        [m + s for m, s in zip(mean, std, strict=True)], alpha=0.2)
    if log_x:
        ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def new_figure(n_panels: int, title: str):
    """Make a row of ``n_panels`` axes with a common title."""
    fig, axes = plt.subplots(1, n_panels, figsize=(4.5 * n_panels, 4), squeeze=False)
    fig.suptitle(title)
    return fig, list(axes[0])


def save(fig, path: str | Path) -> None:
    """Write ``fig`` as a PNG at ``path`` (folders created) and free it."""
    _save(fig, path)
