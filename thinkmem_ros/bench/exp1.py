"""Exp 1: explicit memory grows with history; the policy does not.

Reproduce: ``thinkmem bench exp1 --json bench_results/exp1.json --plot bench_results/exp1.png``
(``--quick``: 2 seeds, fewer timed queries, N = 100,000 skipped).

History family (``FAMILY``): order-only situations (``world.families.order_only``) of a
fixed set of component identities, with the nuisance channels quiet, histories and test
rows drawn from the same identities. Temporal order decides the thinking and every test
situation has been met before, the paper's setting: retrieving a stored neighbour is
enough, so Sequence-RAG can reach F1 1.0, while Summary-RAG, blind to order, cannot. The
speed comparison is then between two methods that both get the answer right.

For each N: Summary-RAG and Sequence-RAG index the first N histories; the policy is trained
on the first min(N, 2000) histories (its training set is the consolidated history: a larger
history changes nothing in its size or cost), exported to ONNX and queried through
``PolicyRuntime.predict_one`` on one thread. Sequence-RAG answers one query at a time with
one GEMV and BLAS limited to one thread (threadpoolctl). Both are timed on the same query
windows after an untimed warm-up. Paper: Sequence-RAG 0.0186 -> 0.3636 ms, policy 0.0382 ms
(9.53x at 30k); target here >= 20x and flat policy latency.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import numpy as np

from thinkmem_ros.bench.common import bench_progress, mean_std
from thinkmem_ros.bench.plots import new_figure, save, series_panel
from thinkmem_ros.core.metrics import micro_scores

SIZES = {"full": {"ns": (500, 2000, 10000, 30000, 100000), "n_test": 600, "queries": 2000,
                  "warmup": 100, "epochs": 1, "min_steps": 1500, "train_cap": 2000},
         "quick": {"ns": (500, 2000, 10000, 30000), "n_test": 600, "queries": 500,
                   "warmup": 50, "epochs": 1, "min_steps": 600, "train_cap": 2000},
         "tiny": {"ns": (100, 300), "n_test": 60, "queries": 30, "warmup": 5, "epochs": 1,
                  "min_steps": 2, "train_cap": 100}}
"""History sizes, test rows, timed queries, warm-up and training budget per run size.

The policy's budget is a floor on optimiser steps (``train_policy(min_steps=)``), so the
500-history model is trained as long as the 2,000-history one."""

SEED_BASE = 1000
POLICIES = {"proposed": "default", "proposed_fast": "fast"}
"""Curve prefix -> policy preset: the shipped default architecture and the fastest preset
that keeps the F1 targets (``policy.config.PRESETS``)."""
WINDOW = 12
IDENTITIES = 16
FAMILY = ("order_only (window 12, nuisance 0, 16 component identities shared by histories "
          "and test rows): order decides the thinking and queried situations have been met "
          "before. Earlier attempts: order_only with the nuisance channels at full noise "
          "kept Sequence-RAG at F1 ~0.5 (the six class-independent channels dominate a "
          "whole-window distance); mixed-stream windows gave Sequence-RAG 0.8-0.94 with "
          "Summary-RAG above it, not the paper's setting. Measured here: Summary-RAG also "
          "reaches F1 ~1.0, because its features include the least-squares slope, which "
          "is order-sensitive; with the queried situation stored and the nuisance quiet "
          "that one feature finds it (on unseen identities, Exp 2, it does not)")


def make_pool(n_histories: int, n_test: int, seed: int):
    """Histories (``n_histories`` rows) and a test set over the same identities."""
    from thinkmem_ros.world.families import order_only

    rng = np.random.default_rng(SEED_BASE + seed)
    identities = rng.choice(2**31 - 1, size=IDENTITIES, replace=False)
    pool = order_only(n_histories + n_test, rng, identities=identities, window=WINDOW,
                      nuisance=0.0)
    order = rng.permutation(len(pool))
    return pool.subset(order[n_test:]), pool.subset(order[:n_test])


def time_per_query(answer, windows: np.ndarray, warmup: int) -> tuple[float, float]:
    """Mean wall and CPU (this thread) ms of ``answer(window)`` after ``warmup`` calls.

    On a shared machine wall time includes waiting for a core; CPU time does not, so both
    are reported and a reader can see how much of a ratio the load explains.
    """
    for i in range(warmup):
        answer(windows[i % len(windows)])
    start, cpu = time.perf_counter(), time.thread_time()
    for window in windows:
        answer(window)
    n = len(windows)
    return (time.perf_counter() - start) * 1e3 / n, (time.thread_time() - cpu) * 1e3 / n


def train_policy_bundle(train, seed: int, cfg: dict, folder: Path, preset: str = "default"):
    """Train a ``preset`` policy on ``train``, export it and load it on one thread."""
    from thinkmem_ros.policy.runtime import PolicyRuntime
    from thinkmem_ros.policy.training.export import export_bundle
    from thinkmem_ros.policy.training.train import train_policy

    trained = train_policy(train, preset, seed=seed, epochs=cfg["epochs"],
                           min_steps=cfg["min_steps"], progress=False)
    bundle = export_bundle(trained, folder, model_version=1, frame_rate_hz=10.0)
    return PolicyRuntime(bundle, threads=1)


def measure_n(n: int, histories, test, runtimes: dict, cfg: dict) -> dict[str, float]:
    """F1, bytes and per-query ms of every method with the first ``n`` histories.

    ``runtimes`` maps a curve prefix (``proposed``, ``proposed_fast``) to a loaded policy.
    """
    from threadpoolctl import threadpool_limits

    from thinkmem_ros.baselines import SequenceRAG, SummaryRAG

    hist = histories.subset(np.arange(n))
    summary = SummaryRAG().fit(hist)
    sequence = SequenceRAG().fit(hist)
    windows = test.signals[np.arange(cfg["queries"]) % len(test)]
    out: dict[str, float] = {}
    with threadpool_limits(limits=1, user_api="blas"):
        seq_pred = sequence.predict(test)
        out["sequence_rag_ms"], out["sequence_rag_cpu_ms"] = time_per_query(
            sequence.query_one, windows, cfg["warmup"])
        for prefix, runtime in runtimes.items():
            probs = runtime.predict(test.signals, test.mask, test.events).probabilities
            out[f"{prefix}_f1"] = micro_scores(test.labels, probs >= runtime.thresholds)["f1"]
            out[f"{prefix}_bytes"] = float(runtime.bundle.onnx_path.stat().st_size)
            out[f"{prefix}_ms"], out[f"{prefix}_cpu_ms"] = time_per_query(
                runtime.predict_one, windows, cfg["warmup"])
    out.update({"summary_rag_f1": micro_scores(test.labels, summary.predict(test))["f1"],
                "sequence_rag_f1": micro_scores(test.labels, seq_pred)["f1"],
                "summary_rag_bytes": float(summary.stored_bytes()),
                "sequence_rag_bytes": float(sequence.stored_bytes()),
                "sequence_rag_bytes_per_record": sequence.bytes_per_record()})
    return out


def run(quick: bool, seeds: int, size: str | None = None) -> dict:
    """Sweep N for every seed; the policy is retrained only while N <= the training cap."""
    cfg = SIZES[size or ("quick" if quick else "full")]
    ns = cfg["ns"]
    rows: dict[str, dict[str, list]] = {}
    trained_on: dict[str, int] = {}
    with bench_progress() as bar, tempfile.TemporaryDirectory() as tmp:
        task = bar.add_task("exp1", total=seeds * len(ns))
        for seed in range(seeds):
            histories, test = make_pool(max(ns), cfg["n_test"], seed)
            runtimes: dict = {}
            runtime_n = 0
            for n in ns:
                train_n = min(n, cfg["train_cap"])
                if not runtimes or train_n != runtime_n:
                    bar.update(task, description=f"exp1 seed {seed}: training on {train_n}")
                    train = histories.subset(np.arange(train_n))
                    runtimes = {prefix: train_policy_bundle(
                        train, seed, cfg, Path(tmp) / f"s{seed}_n{train_n}_{preset}", preset)
                        for prefix, preset in POLICIES.items()}
                    runtime_n = train_n
                trained_on[str(n)] = train_n
                bar.update(task, description=f"exp1 seed {seed}: N={n}")
                for key, value in measure_n(n, histories, test, runtimes, cfg).items():
                    rows.setdefault(key, {}).setdefault(str(n), []).append(value)
                bar.update(task, advance=1)
    curves = {key: {n: mean_std(v) for n, v in per_n.items()} for key, per_n in rows.items()}
    return {"metric": "micro_f1 / bytes / ms per query", "curves": curves,
            "results": summarise(curves, ns),
            "family": FAMILY, "proposed_training_histories": trained_on,
            "policies": dict(POLICIES),
            "setup": {**{k: v for k, v in cfg.items() if k != "ns"}, "ns": list(ns),
                      "threads": 1, "batch": 1, "k": 4,
                      "timing": "mean wall (and thread CPU) ms per query over the timed "
                                "queries, warm-up excluded; policy via "
                                "PolicyRuntime.predict_one, input checks included",
                      "paper": {"speedup_at_30000": 9.53, "sequence_rag_ms_30000": 0.3636,
                                "proposed_ms": 0.0382}}}


def summarise(curves: dict, ns) -> dict:
    """Speed-ups at 30,000 (wall and CPU), policy flatness, where the index outgrows the model."""
    last = str(max(ns))
    ref = "30000" if "30000" in curves["proposed_ms"] else last
    per_record = curves["sequence_rag_bytes_per_record"][last]["mean"]
    out: dict = {"crossover_note": "N at which the Sequence-RAG index (measured bytes per "
                                   "stored window) exceeds the policy's ONNX file",
                 "sequence_rag_bytes_per_record": per_record}
    for prefix in POLICIES:
        if f"{prefix}_ms" not in curves:
            continue
        tag = prefix.removeprefix("proposed")  # "" or "_fast"
        model_bytes = curves[f"{prefix}_bytes"][last]["mean"]
        pol = [curves[f"{prefix}_ms"][str(n)]["mean"] for n in ns]
        out[f"speedup_at_{ref}{tag}"] = (curves["sequence_rag_ms"][ref]["mean"]
                                         / curves[f"{prefix}_ms"][ref]["mean"])
        out[f"speedup_cpu_at_{ref}{tag}"] = (curves["sequence_rag_cpu_ms"][ref]["mean"]
                                             / curves[f"{prefix}_cpu_ms"][ref]["mean"])
        out[f"crossover_n{tag}"] = int(math.ceil(model_bytes / per_record))
        out[f"{prefix}_model_bytes"] = model_bytes
        out[f"{prefix}_ms_max_over_min"] = max(pol) / min(pol)
        out[prefix] = curves[f"{prefix}_f1"][ref]
    for method in ("summary_rag", "sequence_rag"):
        out[method] = curves[f"{method}_f1"][ref]
    out["targets"] = {"speedup_at_least": 20.0,
                      "speedup_met": bool(out[f"speedup_at_{ref}"] >= 20.0),
                      "flat_policy_latency": bool(out["proposed_ms_max_over_min"] < 1.5)}
    if f"speedup_at_{ref}_fast" in out:
        out["targets"]["speedup_met_fast"] = bool(out[f"speedup_at_{ref}_fast"] >= 20.0)
        out["targets"]["flat_policy_latency_fast"] = bool(
            out["proposed_fast_ms_max_over_min"] < 1.5)
    return out


def plot(report: dict, path) -> None:
    """Three panels over N: F1, stored bytes and ms per query."""
    c = report["curves"]
    fig, (a1, a2, a3) = new_figure(3, "Exp 1: explicit memory vs thinking policy")
    series_panel(a1, c, {"proposed_f1": "policy", "proposed_fast_f1": "policy (fast preset)",
                         "sequence_rag_f1": "Sequence-RAG", "summary_rag_f1": "Summary-RAG"},
                 ylabel="micro-F1")
    a1.set_ylim(0, 1.05)
    series_panel(a2, c, {"proposed_bytes": "policy (ONNX file)",
                         "proposed_fast_bytes": "policy, fast preset",
                         "sequence_rag_bytes": "Sequence-RAG index"}, log_y=True,
                 ylabel="stored bytes")
    series_panel(a3, c, {"proposed_ms": "policy (ONNX, 1 thread)",
                         "proposed_fast_ms": "policy, fast preset",
                         "sequence_rag_ms": "Sequence-RAG (1 BLAS thread)"}, log_y=True,
                 ylabel="ms per query (batch 1)")
    for ax in (a1, a2, a3):
        ax.set_xlabel("historical situations N")
    save(fig, path)
