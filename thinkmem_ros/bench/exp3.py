"""Exp 3: the same final state reached by different histories (rising vs falling).

Reproduce: ``thinkmem bench exp3 --json bench_results/exp3.json --plot bench_results/exp3.png``
(add ``--quick`` for the few-minute version).

Both classes end in identical final values; only the evolution towards them tells which
thinking is needed, so a classifier of the current state alone must guess. Paper: policy
1.000, Current-State-Only 0.711 ± 0.044.
"""

from __future__ import annotations

import numpy as np

from thinkmem_ros.bench.common import (
    METHODS,
    bench_progress,
    compare_methods,
    epochs_for,
    summarise_scores,
)
from thinkmem_ros.bench.plots import method_bars
from thinkmem_ros.policy.config import DEFAULT_PRESET

SIZES = {"full": {"n": 2500, "test_fraction": 0.2, "epochs": 30, "min_steps": 400},
         "quick": {"n": 1200, "test_fraction": 0.25, "epochs": 15, "min_steps": 90},
         "tiny": {"n": 128, "test_fraction": 0.25, "epochs": 2, "min_steps": 2}}
"""Situations, held-out share and training epochs per run size (``tiny``: smoke test)."""

SEED_BASE = 3000


def group_split(data, test_fraction: float, rng: np.random.Generator):
    """Split by ``groups`` so no episode/component is on both sides."""
    groups = rng.permutation(np.unique(data.groups))
    n_test = max(1, int(round(test_fraction * len(groups))))
    is_test = np.isin(data.groups, groups[:n_test])
    return data.subset(np.flatnonzero(~is_test)), data.subset(np.flatnonzero(is_test))


def make_split(n: int, test_fraction: float, seed: int):
    """Train/test situations of the same-final-state family."""
    from thinkmem_ros.world.families import same_final_state

    rng = np.random.default_rng(SEED_BASE + seed)
    return group_split(same_final_state(n, rng), test_fraction, rng)


def run(quick: bool, seeds: int, size: str | None = None, preset: str = DEFAULT_PRESET) -> dict:
    """Train and score every method on ``seeds`` independent same-final-state splits.

    ``preset``: the policy's preset (a window or a streaming one).
    """
    cfg = SIZES[size or ("quick" if quick else "full")]
    scores: dict[str, list] = {m: [] for m in METHODS}
    with bench_progress() as bar:
        task = bar.add_task("exp3 seeds", total=seeds)
        for seed in range(seeds):
            train, test = make_split(cfg["n"], cfg["test_fraction"], seed)
            epochs = epochs_for(len(train), cfg["epochs"], min_steps=cfg["min_steps"])
            for method, row in compare_methods(train, test, METHODS, seed=seed,
                                               epochs=epochs, preset=preset).items():
                scores[method].append(row)
            bar.update(task, advance=1,
                       description=f"exp3 seed {seed}: proposed F1 "
                                   f"{scores['proposed'][-1]['f1']:.3f}")
    return {"metric": "micro_f1", **summarise_scores(scores), "per_seed": scores,
            "epochs_used": epochs,
            "setup": {**cfg, "preset": preset, "family": "same_final_state",
                      "paper": {"proposed": 1.0, "current_state_only": 0.711}}}


def plot(report: dict, path) -> None:
    """Draw bars of micro P/R/F1 per method."""
    method_bars(report, path, "Exp 3: same final state, different evolution")
