"""The demo's timeline PNG: signals over time above a map of truth vs activated thinking."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .scoring import Timeline


def plot_timeline(timeline: Timeline, path: Path | str, title: str = "") -> Path:
    """Draw one strip per signal and a label raster (truth shaded, activations marked).

    In the raster, grey cells are ground truth, blue ticks are activations that agree
    and red ticks are activations the ground truth did not ask for, so errors stand out
    without reading numbers.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n_sig, n_lab = len(timeline.signal_names), len(timeline.label_names)
    fig, axes = plt.subplots(
        n_sig + 1, 1, sharex=True, figsize=(12, 1.0 * n_sig + 0.32 * n_lab + 1.5),
        gridspec_kw={"height_ratios": [1.0] * n_sig + [0.32 * n_lab]})
    t = timeline.times_s
    for i, name in enumerate(timeline.signal_names):
        ax = axes[i]
        ax.plot(t, timeline.values[:, i], lw=0.8, color="tab:gray")
        ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=8)
        ax.tick_params(labelsize=7)
        hazard = _column(timeline, "hazard")
        if hazard is not None:
            _shade(ax, t, hazard, color="tab:red", alpha=0.12)
    ax = axes[-1]
    dt = float(np.median(np.diff(t))) if t.size > 1 else 1.0
    for j in range(n_lab):
        truth = timeline.truth[:, j] > 0.5
        pred = (timeline.predicted[:, j] > 0.5) & timeline.evaluated
        ax.broken_barh(_runs(t, truth, dt), (j - 0.45, 0.9), color="0.82")
        ax.vlines(t[pred & truth], j - 0.3, j + 0.3, color="tab:blue", lw=0.6)
        ax.vlines(t[pred & ~truth], j - 0.3, j + 0.3, color="tab:red", lw=0.8)
    ax.set_yticks(range(n_lab), timeline.label_names, fontsize=7)
    ax.set_ylim(n_lab - 0.5, -0.5)
    ax.set_xlabel("time [s]")
    ax.set_title("thinking: grey = ground truth, blue = activated and expected, "
                 "red = activated, not expected", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _column(timeline: Timeline, label: str) -> np.ndarray | None:
    if label not in timeline.label_names:
        return None
    return timeline.truth[:, timeline.label_names.index(label)] > 0.5


def _runs(t: np.ndarray, on: np.ndarray, dt: float) -> list[tuple[float, float]]:
    """(start, width) pairs of consecutive True frames, for broken_barh."""
    if not on.any():
        return []
    edges = np.flatnonzero(np.diff(np.concatenate([[0], on.astype(np.int8), [0]])))
    return [(float(t[a]), float(t[b - 1] - t[a] + dt)) for a, b in zip(edges[::2], edges[1::2],
                                                                       strict=True)]


def _shade(ax, t: np.ndarray, on: np.ndarray, color: str, alpha: float) -> None:
    dt = float(np.median(np.diff(t))) if t.size > 1 else 1.0
    for start, width in _runs(t, on, dt):
        ax.axvspan(start, start + width, color=color, alpha=alpha, lw=0)
