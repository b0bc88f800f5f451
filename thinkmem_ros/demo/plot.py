"""The demo's timeline PNG: signals over time above a map of truth vs activated thinking."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from thinkmem_ros.demo.scoring import Timeline


def plot_timeline(timeline: Timeline, path: Path | str, title: str = "",
                  marks: list[tuple[float, str]] = ()) -> Path:
    """Draw one strip per signal and a label raster (truth shaded, activations marked).

    ``marks`` are (time, text) pairs drawn as dashed vertical lines through every strip
    (the bundle swap of a consolidation round).

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
    for when, text in marks:
        for ax in axes:
            ax.axvline(when, color="tab:green", ls="--", lw=1.2)
        axes[0].annotate(text, (when, 1.0), xycoords=("data", "axes fraction"),
                         xytext=(3, 2), textcoords="offset points", fontsize=8,
                         color="tab:green", va="bottom")
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


def join_timelines(first: Timeline, second: Timeline, gap_s: float,
                   extra: tuple[str, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
                   | None = None) -> tuple[Timeline, float]:
    """``first``, a gap of ``gap_s`` (no data), then ``second``; returns it and where it starts.

    ``extra`` = (label, (truth_1, truth_2), (predicted_1, predicted_2)) appends one more
    label row (e.g. the discovered ``consider:C`` thinking, which the world's ground truth
    does not have).
    """
    dt = float(np.median(np.diff(first.times_s))) if first.times_s.size > 1 else 0.1
    offset = float(first.times_s[-1]) + dt + gap_s
    gap_row = np.full((1, first.values.shape[1]), np.nan, dtype=np.float32)
    times = np.concatenate([first.times_s, [first.times_s[-1] + dt], second.times_s + offset])
    values = np.concatenate([first.values, gap_row, second.values])

    def rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.concatenate([a, np.zeros((1, a.shape[1]), a.dtype), b])

    truth, predicted = rows(first.truth, second.truth), rows(first.predicted, second.predicted)
    evaluated = np.concatenate([first.evaluated, [False], second.evaluated])
    labels = first.label_names
    if extra is not None:
        name, (t1, t2), (p1, p2) = extra
        col_t = np.concatenate([t1, [0], t2]).astype(np.float32)[:, None]
        col_p = np.concatenate([p1, [0], p2]).astype(np.float32)[:, None]
        truth, predicted = np.hstack([truth, col_t]), np.hstack([predicted, col_p])
        labels = (*labels, name)
    joined = Timeline(times_s=times, values=values, truth=truth, predicted=predicted,
                      evaluated=evaluated, signal_names=first.signal_names, label_names=labels)
    return joined, offset


def plot_before_after(summary: dict, path: Path | str) -> Path:
    """Bars of micro P/R/F1 and rule anticipation, before vs after the round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    names = ("precision", "recall", "f1", "anticipation_rate", "false_fire_rate")
    shown = ("micro P", "micro R", "micro F1", "consider:C\nbefore C", "consider:C\nfalse fires")
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(names))
    for i, phase in enumerate(("before", "after")):
        data = summary[phase]
        micro, ant = data["activation"]["micro"], data.get("anticipation", {})
        heights = [micro["precision"], micro["recall"], micro["f1"],
                   ant.get("anticipation_rate", 0.0), ant.get("false_fire_rate", 0.0)]
        bars = ax.bar(x + (i - 0.5) * 0.38, heights, 0.38, label=phase,
                      color=("tab:gray", "tab:blue")[i])
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(x, shown, fontsize=8)
    ax.set_ylim(0, 1.12)
    ax.legend(loc="center right", fontsize=8)
    rnd = summary.get("round", {})
    ax.set_title(f"before vs after one consolidation round ({rnd.get('outcome', '?')}, "
                 f"units promoted: {len(rnd.get('promoted', []))})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_round_timeline(before: Timeline, after: Timeline, fired: tuple[np.ndarray, np.ndarray],
                        missions: tuple[list, list], rule, path: Path | str, *,
                        swap_label: str, title: str = "") -> Path:
    """Before and after playback on one axis, the swap marked, ``consider:C`` as a last row.

    The ``consider:C`` row is grey where the planted rule asks for it (after B, before C
    in rule missions) and marks where the policy raised it, like the other rows.
    """
    def expected(tl: Timeline, ms: list) -> np.ndarray:
        a, b, c = rule.pattern
        out = np.zeros(tl.times_s.shape, dtype=bool)
        for m in ms:
            if m.kind == "rule":
                out |= (tl.times_s > m.times[b]) & (tl.times_s < m.times[c])
        return out

    gap = 0.04 * float(before.times_s[-1] + after.times_s[-1])
    joined, offset = join_timelines(
        before, after, gap,
        (rule.thinking, (expected(before, missions[0]), expected(after, missions[1])),
         fired))
    return plot_timeline(joined, path, title, marks=[(offset - gap / 2, swap_label)])
