"""Exp 5: a rare delayed-onset pattern is learned as the history grows (100 ... 8000).

Reproduce: ``thinkmem bench exp5 --json bench_results/exp5.json --plot bench_results/exp5.png``
(``--quick``: 2 seeds and fewer epochs, every history size kept).

The training history holds the rare pattern in 5% of its situations (at least 2); the test
set is about half rare. ``curves.proposed`` is the micro-F1 on the *rare* test rows, the
paper's rare-pattern metric; ``curves.proposed_all`` scores every test row. Every size
gets at least a floor of optimiser steps (``SIZES``), so small histories are not
under-trained. Paper: 0.777 (100), 0.912 (250), 0.996 (500), 0.999 (8000); target >= 0.95
at 250.
"""

from __future__ import annotations

import numpy as np

from thinkmem_ros.bench.common import bench_progress, mean_std
from thinkmem_ros.bench.plots import new_figure, save, series_panel
from thinkmem_ros.core.metrics import micro_scores
from thinkmem_ros.policy.config import DEFAULT_PRESET

HISTORIES = (100, 250, 500, 1000, 2000, 4000, 8000)
"""History sizes; every one is kept in ``--quick`` so quick and full runs compare."""

SIZES = {"full": {"histories": HISTORIES, "n_test": 400, "epochs": 8, "min_steps": 600},
         "quick": {"histories": HISTORIES, "n_test": 400, "epochs": 2, "min_steps": 300},
         "tiny": {"histories": (100, 250), "n_test": 60, "epochs": 1, "min_steps": 4}}
"""Per run size: history sizes, test rows, base epochs and minimum optimiser steps.

Every size gets at least ``min_steps`` optimiser steps (``train_policy(min_steps=)``, which
also holds off early stopping) and large histories ``epochs`` passes, so the curve measures
how much history the pattern needs, not how long training ran; quick mode keeps every size
and spends about 300 steps on each."""

SEED_BASE = 5000


def run_one(n: int, seed: int, cfg: dict, preset: str = DEFAULT_PRESET
            ) -> dict[str, dict[str, float]]:
    """Train on ``n`` histories and score the rare test rows and all test rows."""
    from thinkmem_ros.policy.training.train import predict_proba, train_policy
    from thinkmem_ros.world.families import rare_onset_split

    train, test = rare_onset_split(n, cfg["n_test"], np.random.default_rng(SEED_BASE + seed))
    trained = train_policy(train, preset, seed=seed, epochs=cfg["epochs"], patience=10,
                           min_steps=cfg["min_steps"], progress=False)
    epochs = sum("epoch" in row for row in trained.history)
    predicted = predict_proba(trained, test) >= trained.threshold_array
    rare = np.asarray(test.meta["rare"], dtype=bool)
    return {"rare": micro_scores(test.labels[rare], predicted[rare]),
            "all": micro_scores(test.labels, predicted),
            "epochs": {"f1": float(epochs)}}


def run(quick: bool, seeds: int, size: str | None = None, preset: str = DEFAULT_PRESET) -> dict:
    """Acquisition curve of the rare pattern over history sizes and seeds (policy ``preset``)."""
    cfg = SIZES[size or ("quick" if quick else "full")]
    rows: dict[str, list] = {str(n): [] for n in cfg["histories"]}
    with bench_progress() as bar:
        task = bar.add_task("exp5", total=seeds * len(cfg["histories"]))
        for seed in range(seeds):
            for n in cfg["histories"]:
                rows[str(n)].append(run_one(n, seed, cfg, preset))
                bar.update(task, advance=1, description=f"exp5 seed {seed} N={n}: rare F1 "
                                                        f"{rows[str(n)][-1]['rare']['f1']:.3f}")
    curves = {"proposed": {}, "proposed_precision": {}, "proposed_recall": {},
              "proposed_all": {}}
    for n, per_seed in rows.items():
        curves["proposed"][n] = mean_std([r["rare"]["f1"] for r in per_seed])
        curves["proposed_precision"][n] = mean_std([r["rare"]["precision"] for r in per_seed])
        curves["proposed_recall"][n] = mean_std([r["rare"]["recall"] for r in per_seed])
        curves["proposed_all"][n] = mean_std([r["all"]["f1"] for r in per_seed])
    at_250 = curves["proposed"].get("250", {}).get("mean")
    return {"metric": "rare_pattern_micro_f1", "curves": curves,
            "results": {"proposed": curves["proposed"][str(max(cfg["histories"]))],
                        "proposed_at_250": curves["proposed"].get("250")},
            "targets": {"f1_at_250_at_least": 0.95,
                        "met": bool(at_250 is not None and at_250 >= 0.95)},
            "epochs_per_history": {n: r[0]["epochs"]["f1"] for n, r in rows.items()},
            "setup": {**{k: v for k, v in cfg.items() if k != "histories"},
                      "histories": list(cfg["histories"]), "family": "rare_onset_split",
                      "rare_fraction_in_history": 0.05, "preset": preset,
                      "paper": {"100": 0.777, "250": 0.912, "500": 0.996, "8000": 0.999}}}


def plot(report: dict, path) -> None:
    """Draw the acquisition curve (rare rows and all rows) with std bands."""
    fig, (ax,) = new_figure(1, "Exp 5: rare delayed-onset pattern vs history size")
    series_panel(ax, report["curves"], {"proposed": "rare test rows",
                                        "proposed_all": "all test rows"},
                 ylabel="micro-F1 (mean ± std)")
    ax.axhline(0.95, color="red", linestyle="--", linewidth=1)
    ax.set_xlabel("historical situations")
    ax.set_ylim(0, 1.05)
    save(fig, path)
