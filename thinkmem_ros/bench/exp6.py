"""Experiment 6 (seed 000 Table VI/VII): cross-experience discovery of A...B...C knowledge.

Reproduce: ``thinkmem bench exp6 [--quick] --json bench_results/exp6.json --plot ...png``.

Per seed and repetitions r in (1, 2, 4, 8) a history is generated with three hidden rules,
the paper's counter-evidence and two decoys (``world/event_episodes.py``). Methods:

- ``statistics_only``: one discovery pass over the whole history (``discovery.py``).
- ``proposed``: periodic consolidation. After each temporal partition p >= 1 a round runs
  discovery over the history so far and folds it into knowledge units
  (c <- rho*c + (1-rho)*Support, promotion/demotion/retirement, ``knowledge.py``); the
  relations are the promoted units after the last round. The optional LLM step is OFF here
  (no endpoint offline); it can only phrase or drop relations, never add one. What differs
  from statistics-only is therefore only the round-to-round persistence of confidence.
- ablations at r = 8: ``no_consolidation`` (every episode analysed alone, no
  cross-episode aggregation), ``unordered`` (each episode's events re-ordered by code, i.e.
  only set co-occurrence survives, then the same miner), ``local`` (gaps limited to
  ``LOCAL_GAP`` time units).
- ``future_thinking_accuracy``: a small policy is trained on the material of the promoted
  units (``material.py``) and must pick, on held-out A...B prefixes of the three TRUE
  rules, the right ``consider:C`` by argmax (chance 1/3). A source with no promoted unit
  has no consider label and scores chance, 1/3.
"""

from __future__ import annotations

import time

import numpy as np

from thinkmem_ros.consolidator.discovery import DiscoveryConfig, EventLog, discover, relation_f1
from thinkmem_ros.consolidator.knowledge import KnowledgeConfig, KnowledgeUnit, consolidate
from thinkmem_ros.core.metrics import mean_std
from thinkmem_ros.world.event_episodes import EventWorldConfig, generate_event_history

REPETITIONS = (1, 2, 4, 8)
LOCAL_GAP = 5.0
PERMUTATIONS = 100


def _progress():
    from rich.progress import Progress

    return Progress(transient=True)


def proposed_rounds(log: EventLog, cfg: DiscoveryConfig, kcfg: KnowledgeConfig,
                    rng: np.random.Generator) -> dict[str, KnowledgeUnit]:
    """Consolidation rounds over the growing history, one after each partition p >= 1."""
    units: dict[str, KnowledgeUnit] = {}
    for part in range(1, log.n_partitions):
        rows = np.flatnonzero(log.partition <= part)
        consolidate(units, discover(log.select(rows), cfg, rng), part, kcfg)
    return units


def _unordered(log: EventLog) -> EventLog:
    """Each episode's events sorted by code with unit spacing: order gone, sets kept."""
    order = np.lexsort((log.code, log.episode))
    ep = log.episode[order]
    starts = np.searchsorted(ep, ep)
    rank = np.arange(ep.size) - starts
    return EventLog(ep, rank.astype(np.float64), log.code[order], log.partition,
                    log.episode_ids, log.codes)


def _no_consolidation(log: EventLog, cfg: DiscoveryConfig, rng: np.random.Generator) -> set:
    found: set = set()
    single = DiscoveryConfig(**{**cfg.__dict__, "permutations": 10})
    for row in range(len(log.episode_ids)):
        found |= discover(log.select(np.array([row])), single, rng).accepted_patterns(3)
    return found


def _future_accuracy(units: list[KnowledgeUnit], rules, codes, seed: int, quick: bool
                     ) -> float:
    """Argmax accuracy over the true rules' held-out prefixes of a policy trained on units."""
    if not units:
        return 1.0 / max(len(rules), 1)
    import torch

    from thinkmem_ros.consolidator.material import (
        filler_codes,
        knowledge_material,
        prefix_events,
        situations_from_events,
    )
    from thinkmem_ros.policy.training.train import predict_proba, train_policy

    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    data = knowledge_material(units, codes, rng, positives_per_unit=128, negatives_per_kind=32)
    trained = train_policy(data, "default", seed=seed, epochs=30, progress=False)
    filler = filler_codes(codes, units)
    histories, targets = [], []
    for a, b, c in rules:
        for _ in range(20):
            histories.append(prefix_events([a, b], filler, 16, rng))
            targets.append(f"consider:{c}")
    test = situations_from_events(histories, np.zeros((len(histories), len(data.label_names)),
                                                      np.float32),
                                  data.label_names, codes, 16)
    picks = predict_proba(trained, test).argmax(axis=1)
    return float(np.mean([data.label_names[i] == t for i, t in zip(picks, targets)]))


def _one(seed: int, reps: int, cfg: DiscoveryConfig, kcfg: KnowledgeConfig, quick: bool
         ) -> dict:
    world = EventWorldConfig(repetitions=reps)
    hist = generate_event_history(world, np.random.default_rng(1000 * seed + reps))
    log = EventLog.from_episodes(hist.episodes, hist.codes)
    truth, decoys = set(hist.rules), set(hist.decoys)
    rng = np.random.default_rng(7919 * seed + reps)
    stats = discover(log, cfg, rng)
    units = proposed_rounds(log, cfg, kcfg, rng)
    promoted = [u for u in units.values() if u.active]
    proposed = {u.pattern for u in promoted if len(u.pattern) == 3}
    out = {
        "candidate_recall": sum(stats.is_candidate(t) for t in truth) / len(truth),
        "statistics_only": relation_f1(stats.accepted_patterns(3), truth)["f1"],
        "proposed": relation_f1(proposed, truth)["f1"],
        "decoys_accepted": len(decoys & (stats.accepted_patterns(3) | proposed)),
        "statistics_only_relations": len(stats.accepted),
        "proposed_relations": len(promoted),
        "discovery_s": stats.seconds,
        "n_events": hist.n_events,
        "n_episodes": len(hist.episodes),
    }
    if reps == max(REPETITIONS):
        local = discover(log, DiscoveryConfig(**{**cfg.__dict__, "max_gap": LOCAL_GAP}), rng)
        unordered = discover(_unordered(log), cfg, rng)
        out["local"] = relation_f1(local.accepted_patterns(3), truth)["f1"]
        out["unordered"] = relation_f1(unordered.accepted_patterns(3), truth)["f1"]
        out["no_consolidation"] = relation_f1(_no_consolidation(log, cfg, rng), truth)["f1"]
        out["future_thinking_accuracy"] = _future_accuracy(promoted, hist.rules, hist.codes,
                                                           seed, quick)
        null = generate_event_history(EventWorldConfig(repetitions=reps, null_stream=True),
                                      np.random.default_rng(5000 + seed))
        null_log = EventLog.from_episodes(null.episodes, null.codes)
        null_stats = discover(null_log, cfg, rng)
        null_units = proposed_rounds(null_log, cfg, kcfg, rng)
        out["null_stream_relations"] = len(null_stats.accepted)
        out["null_stream_relations_proposed"] = sum(u.active for u in null_units.values())
    return out


def time_discovery_1e6(cfg: DiscoveryConfig, seed: int = 0, n_events: int = 1_000_000
                       ) -> dict:
    """Seconds for one discovery pass over ~``n_events`` events (generation not timed)."""
    world = EventWorldConfig(n_codes=5000, repetitions=8, n_neutral=1)
    per_episode = world.background_rate * world.episode_duration
    world.n_neutral = max(1, int(n_events / per_episode) - 3 * (8 + 10) - 16)
    hist = generate_event_history(world, np.random.default_rng(seed))
    log = EventLog.from_episodes(hist.episodes, hist.codes)
    start = time.perf_counter()
    result = discover(log, cfg, np.random.default_rng(seed + 1))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "n_events": int(log.code.size),
            "n_episodes": int(log.episode_ids.size), "n_codes": world.n_codes,
            "permutations": cfg.permutations,
            "rules_found": len(set(hist.rules) & result.accepted_patterns(3)),
            "accepted": len(result.accepted)}


def run(quick: bool, seeds: int) -> dict:
    """Table VI/VII over ``seeds`` seeds (same x values with ``--quick``)."""
    cfg = DiscoveryConfig(permutations=PERMUTATIONS)
    kcfg = KnowledgeConfig()
    rows: dict[int, list[dict]] = {r: [] for r in REPETITIONS}
    with _progress() as progress:
        task = progress.add_task("exp6", total=seeds * len(REPETITIONS) + 1)
        for seed in range(seeds):
            for reps in REPETITIONS:
                rows[reps].append(_one(seed, reps, cfg, kcfg, quick))
                progress.advance(task)
        timing_cfg = DiscoveryConfig(permutations=10 if quick else PERMUTATIONS)
        timing = time_discovery_1e6(timing_cfg)
        progress.advance(task)

    def cell(reps: int, key: str) -> dict:
        return mean_std([row[key] for row in rows[reps]])

    top = max(REPETITIONS)
    curves = {key: {str(r): cell(r, src) for r in REPETITIONS} for key, src in
              (("candidate_recall", "candidate_recall"),
               ("statistics_only_f1", "statistics_only"), ("proposed_f1", "proposed"))}
    results = {key: cell(top, key) for key in
               ("no_consolidation", "unordered", "local", "statistics_only", "proposed",
                "future_thinking_accuracy", "null_stream_relations")}
    results["decoys_accepted"] = mean_std(
        [sum(row["decoys_accepted"] for r in REPETITIONS for row in rows[r][s:s + 1])
         for s in range(seeds)])
    results["discovery_s_1e6"] = {"mean": timing["seconds"], "std": 0.0}
    differ = [(r, i) for r in REPETITIONS for i, row in enumerate(rows[r])
              if row["statistics_only"] != row["proposed"]]
    return {
        "metric": "relation_f1",
        "results": results,
        "curves": curves,
        "null_stream_relations_proposed": cell(top, "null_stream_relations_proposed"),
        "discovery_1e6": timing,
        "chance_future_thinking": 1.0 / 3.0,
        "proposed_vs_statistics_only": {
            "what_differs": "proposed = statistics + periodic knowledge consolidation "
                            "(confidence persistence across rounds, promotion/demotion); "
                            "LLM step off",
            "runs_where_f1_differs": [f"reps={r} seed={i}" for r, i in differ],
        },
        "settings": {"repetitions": list(REPETITIONS), "permutations": PERMUTATIONS,
                     "alpha": cfg.alpha, "local_gap": LOCAL_GAP,
                     "world": EventWorldConfig().__dict__,
                     "knowledge": kcfg.__dict__, "decoys_accepted": "sum over r per seed"},
        "per_run": {str(r): rows[r] for r in REPETITIONS},
    }


def plot(result: dict, path) -> None:
    """Relation F1 / candidate recall against repetitions, and the ablation bars at r=8."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [int(x) for x in result["curves"]["proposed_f1"]]
    for key, style in (("candidate_recall", "o--"), ("statistics_only_f1", "s-"),
                       ("proposed_f1", "^-")):
        series = result["curves"][key]
        means = [series[str(x)]["mean"] for x in xs]
        stds = [series[str(x)]["std"] for x in xs]
        left.errorbar(xs, means, yerr=stds, fmt=style, capsize=3, label=key)
    left.axhline(0.9, color="grey", lw=0.8, ls=":")
    left.set_xscale("log", base=2)
    left.set_xticks(xs, [str(x) for x in xs])
    left.set_xlabel("independent repetitions per hidden rule")
    left.set_ylabel("score")
    left.set_ylim(-0.05, 1.05)
    left.set_title("Exp 6: cross-experience discovery")
    left.legend()
    names = ["no_consolidation", "unordered", "local", "statistics_only", "proposed",
             "future_thinking_accuracy"]
    vals = [result["results"][n]["mean"] for n in names]
    errs = [result["results"][n]["std"] for n in names]
    right.bar(range(len(names)), vals, yerr=errs, capsize=3, color="tab:blue")
    right.axhline(1 / 3, color="tab:red", lw=0.8, ls="--", label="chance (future thinking)")
    right.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=7)
    right.set_ylim(0, 1.05)
    right.set_title("at 8 repetitions (relation F1; last bar: accuracy)")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
