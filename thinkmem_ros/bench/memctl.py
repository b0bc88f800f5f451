"""PaMER analogue: COMPRESS / RECALL probes on the policy embedding vs metadata baselines.

Reproduce: ``thinkmem bench memctl --json bench_results/memctl.json --plot
bench_results/memctl.png`` (``--quick``: shorter streams, fewer epochs).

Per seed: the policy is the shipped ``models/default`` bundle (trained on ``mixed`` streams
at 10 Hz; windows here take its K; fresh streams are drawn here) when it loads and
``use_default`` is on (the default), else a small policy trained here
(``bench.values.bench_policy``); the JSON names which. Probes are fitted on the embeddings
of separate *probe-training* streams and scored on *test* streams, with labels from the
ground-truth rules of ``consolidator.memctl_train`` (COMPRESS: no temporal thinking active
in the window or one window span behind it; RECALL: rare label set or a label change
within 0.5 s). Baselines see only length/step count and metadata
(``memctl_train.BASELINE_FEATURES``: step count, seconds since start, observed fraction of
the window and observed frames per signal, number of events in the history; no signal
values, no event kinds), fitted the same way as the probes.
Paper: AUROC 0.831 vs 0.751 (compression), 0.765 vs 0.552 (recall). Target: each head beats
its baseline by >= 0.05 AUROC.

Bytes kept: the test stream is replayed frame by frame into a ``LocalHistory`` (16-frame
blocks, 60 s retention) and the COMPRESS head is asked every 0.5 s; when it fires the raw
blocks behind the window are summarised and released. ``bytes_kept_ratio`` = mean bytes held
with compression / without. The policy sees only its K-frame window, which compression
never touches, so activation F1 is equal by construction (reported for both).
``compress_violation_rate`` = share of compressions made when the ground truth said a
pending pattern still needed the older frames; the deployed COMPRESS threshold is
calibrated on the probe-training rows for precision ``COMPRESS_PRECISION`` (0.9).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score

from thinkmem_ros.bench.common import bench_progress, mean_std
from thinkmem_ros.bench.values import RATE_HZ, SEED_BASE, bench_or_default_policy
from thinkmem_ros.consolidator.memctl_train import (
    BASELINE_FEATURES,
    compress_targets,
    fit_memctl_heads,
    fit_probe,
    metadata_features,
    recall_targets,
    set_frequencies,
)
from thinkmem_ros.core.metrics import micro_scores
from thinkmem_ros.robot.memory_control import LocalHistory, SummaryRecord

SIZES = {
    "full": {"train_s": 1800.0, "probe_s": 1800.0, "test_s": 1200.0, "epochs": 20, "n": 3},
    "quick": {"train_s": 600.0, "probe_s": 600.0, "test_s": 450.0, "epochs": 8, "n": 3},
    "tiny": {"train_s": 60.0, "probe_s": 80.0, "test_s": 80.0, "epochs": 1, "n": 2},
}
STRIDE = 5
COMPRESS_PRECISION = 0.9
"""The deployed COMPRESS threshold is calibrated on the probe-training rows for this precision."""
BLOCK = 16
RETAIN_S = 60.0
KEYS = ("compress_auroc", "compress_baseline_auroc", "recall_auroc", "recall_baseline_auroc",
        "compress_auprc", "compress_baseline_auprc", "recall_auprc", "recall_baseline_auprc",
        "bytes_kept_ratio", "compress_violation_rate", "activation_f1_with",
        "activation_f1_without", "compress_rate", "recall_rate", "compress_threshold")


class _ListStore:
    """In-memory summary store for the replay (the real node uses FolderSummaryStore)."""

    def __init__(self) -> None:
        self.records: list[SummaryRecord] = []

    def commit(self, records: list[SummaryRecord]) -> None:
        self.records.extend(records)


def _streams(runtime, seconds: float, n: int, rng: np.random.Generator):
    from thinkmem_ros.world.streams import generate_stream, stream_windows

    out = []
    for _ in range(n):
        stream = generate_stream("mixed", seconds / n, RATE_HZ, rng)
        w = stream_windows(stream, runtime.window, stride=STRIDE,
                           max_events=runtime.max_events)
        pred = runtime.predict(w.signals, w.mask, w.events)
        out.append((stream, w, pred))
    return out


def _targets(parts, freq) -> tuple[np.ndarray, np.ndarray]:
    c, r = [], []
    for stream, w, _ in parts:
        ends = np.asarray(w.meta["end_frames"])
        c.append(compress_targets(stream.labels, ends, w.window, stream.rate_hz,
                                  label_names=stream.label_names))
        r.append(recall_targets(stream.labels, ends, stream.rate_hz, freq))
    return np.concatenate(c), np.concatenate(r)


def _replay_bytes(stream, windows, p_compress: np.ndarray, threshold: float,
                  truth_compress: np.ndarray) -> tuple[float, float, float]:
    """Mean bytes held with and without compression, and the violation rate."""
    values = np.nan_to_num(np.asarray(stream.values, dtype=np.float32))
    hist = LocalHistory(BLOCK, values.shape[1])
    store = _ListStore()
    retain_blocks = int(RETAIN_S * stream.rate_hz) // BLOCK
    decide = {int(e): i for i, e in enumerate(windows.meta["end_frames"])}
    with_b, without_b, fired, bad = [], [], 0, 0
    for t, frame in enumerate(values):
        hist.append(frame)
        newest = (hist.frames_seen // BLOCK) - 1
        for b in [b for b in hist.blocks if b <= newest - retain_blocks]:
            del hist.blocks[b]
        hist.summaries = [s for s in hist.summaries if s.block_id > newest - retain_blocks]
        i = decide.get(t)
        if i is not None and p_compress[i] >= threshold:
            if hist.compress(windows.window, store):
                fired += 1
                bad += int(truth_compress[i] == 0)
        with_b.append(hist.nbytes)
        without_b.append(min(t + 1, retain_blocks * BLOCK + BLOCK) * values.shape[1] * 4)
    return float(np.mean(with_b)), float(np.mean(without_b)), bad / max(fired, 1)


def run_seed(seed: int, size: dict, use_default: bool = True) -> dict[str, float]:
    """Fit probes and baselines on one seed's streams and score them on its test streams."""
    rng = np.random.default_rng(SEED_BASE + 300 + seed)
    with tempfile.TemporaryDirectory() as tmp:
        runtime, policy_name = bench_or_default_policy(seed, size, Path(tmp) / "bundle",
                                                       use_default)
        fit_parts = _streams(runtime, size["probe_s"], size["n"], rng)
        test_parts = _streams(runtime, size["test_s"], size["n"], rng)
    freq = set_frequencies(np.concatenate([s.labels[np.asarray(w.meta["end_frames"])]
                                           for s, w, _ in fit_parts]))
    yc_fit, yr_fit = _targets(fit_parts, freq)
    yc, yr = _targets(test_parts, freq)
    emb_fit = np.concatenate([p.embedding for _, _, p in fit_parts])
    emb = np.concatenate([p.embedding for _, _, p in test_parts])
    meta_fit = np.concatenate([metadata_features(s, w) for s, w, _ in fit_parts])
    meta = np.concatenate([metadata_features(s, w) for s, w, _ in test_parts])
    heads = fit_memctl_heads(emb_fit, yc_fit, yr_fit, seed=seed,
                             compress_precision=COMPRESS_PRECISION)
    out: dict[str, float] = {"compress_rate": float(yc.mean()), "recall_rate": float(yr.mean())}
    for name, y, head, yf in (("compress", yc, heads.compress, yc_fit),
                              ("recall", yr, heads.recall, yr_fit)):
        base = fit_probe(meta_fit, yf, seed=seed)
        p, pb = head.probability(emb), base.probability(meta)
        out[f"{name}_auroc"] = float(roc_auc_score(y, p))
        out[f"{name}_baseline_auroc"] = float(roc_auc_score(y, pb))
        out[f"{name}_auprc"] = float(average_precision_score(y, p))
        out[f"{name}_baseline_auprc"] = float(average_precision_score(y, pb))
    kept, full, viol, offset = [], [], [], 0
    truth, active = [], []
    for stream, w, pred in test_parts:
        n = len(w)
        a, b, v = _replay_bytes(stream, w, heads.compress.probability(pred.embedding),
                                heads.compress.threshold, yc[offset:offset + n])
        kept.append(a)
        full.append(b)
        viol.append(v)
        offset += n
        truth.append(w.labels)
        col = {name: i for i, name in enumerate(runtime.labels)}
        act = np.zeros(w.labels.shape)
        for row, names in enumerate(pred.active):
            act[row, [col[x] for x in names]] = 1
        active.append(act)
    f1 = micro_scores(np.concatenate(truth), np.concatenate(active))["f1"]
    out.update(compress_threshold=heads.compress.threshold,
               bytes_kept_ratio=float(np.sum(kept) / np.sum(full)),
               compress_violation_rate=float(np.mean(viol)),
               activation_f1_with=f1, activation_f1_without=f1)
    return out, policy_name


def run(quick: bool, seeds: int, size: str | None = None, use_default: bool = True) -> dict:
    """Probe and baseline AUROC/AUPRC and bytes kept, over ``seeds`` seeds."""
    cfg = SIZES[size or ("quick" if quick else "full")]
    rows, policies = [], []
    with bench_progress() as bar:
        task = bar.add_task("memctl", total=seeds)
        for seed in range(seeds):
            row, policy_name = run_seed(seed, cfg, use_default)
            rows.append(row)
            policies.append(policy_name)
            bar.update(task, advance=1, description=(
                f"memctl seed {seed}: compress {rows[-1]['compress_auroc']:.3f} vs "
                f"{rows[-1]['compress_baseline_auroc']:.3f}, recall "
                f"{rows[-1]['recall_auroc']:.3f} vs {rows[-1]['recall_baseline_auroc']:.3f}"))
    results = {k: mean_std([r[k] for r in rows]) for k in KEYS}
    margin_c = results["compress_auroc"]["mean"] - results["compress_baseline_auroc"]["mean"]
    margin_r = results["recall_auroc"]["mean"] - results["recall_baseline_auroc"]["mean"]
    return {"experiment": "memctl", "metric": "auroc", "results": results,
            "summary": {"compress_margin": margin_c, "recall_margin": margin_r,
                        "target_met": bool(margin_c >= 0.05 and margin_r >= 0.05)},
            "policy": sorted(set(policies)),
            "baseline_features": list(BASELINE_FEATURES),
            "probe_input": "pooled policy embedding (d values), logistic probe",
            "label_rules": {"compress": "no temporal (non-state) thinking label active in the "
                            "window or one window span behind it",
                            "recall": "ground-truth label set rarer than 2 % of the probe-"
                            "training windows, or a label-set change within 0.5 s"},
            "paper": {"compress_auroc": 0.831, "compress_baseline_auroc": 0.751,
                      "recall_auroc": 0.765, "recall_baseline_auroc": 0.552}}


def plot(report: dict, path) -> None:
    """Bars: probe vs baseline AUROC/AUPRC per head, and the bytes-kept ratio."""
    from thinkmem_ros.bench.plots import new_figure, save

    fig, axes = new_figure(2, "Memory control from the policy's hidden state (PaMER analogue)")
    res = report["results"]
    names = ["compress_auroc", "compress_auprc", "recall_auroc", "recall_auprc"]
    x = np.arange(len(names))
    probe = [res[n]["mean"] for n in names]
    base = [res[n.replace("_au", "_baseline_au")]["mean"] for n in names]
    axes[0].bar(x - 0.2, probe, 0.4, label="probe on embedding")
    axes[0].bar(x + 0.2, base, 0.4, label="length/metadata baseline")
    axes[0].set_xticks(x, names, rotation=20)
    axes[0].set_ylim(0, 1)
    axes[0].legend(loc="lower right")
    axes[1].bar([0], [res["bytes_kept_ratio"]["mean"]], color="tab:green")
    axes[1].set_xticks([0], ["bytes kept with / without compression"])
    axes[1].set_ylim(0, 1)
    save(fig, path)
