"""Experiment 6 (seed 000 Table VI/VII): cross-experience discovery of A...B...C knowledge.

Reproduce: ``thinkmem bench exp6 [--quick] --json bench_results/exp6.json --plot ...png``.

Two kinds of worlds:

- the paper's (``world/event_episodes.py``: 300 codes, sparse background, gaps of 20-60),
  r in (1, 2, 4, 8): ``curves.candidate_recall`` / ``statistics_only_f1`` /
  ``proposed_f1`` and the ablations at r = 8;
- the harder conditions (``world/event_worlds.py``: 48 codes, 120 episodes, ~20 background
  events per episode, log-uniform gaps of 2-300 s, counter-evidence at a quarter of the
  repetitions), r in (1, 2, 4, 8, 16): ``curves.proposed_f1_<condition>``,
  ``curves.statistics_only_f1_<condition>`` and ``results.false_relations_<condition>``
  (false triples per run, over every r: an accepted or promoted triple that was not
  planted, or that holds the heartbeat code). Full runs add ``chain``, ``decoy``,
  ``sparse_300`` and ``phased`` (codes that keep to a phase of the episode, where
  discovery's known limit is).

Methods: ``statistics_only`` is one discovery pass over the whole history
(``consolidator/discovery``); ``proposed`` runs a consolidation round after each temporal partition
p >= 1 over the history so far and folds it into knowledge units (``knowledge.py``); its
relations are the promoted units after the last round (the LLM step is off). Ablations at
r = 8 (paper world): ``no_consolidation`` (each episode alone), ``unordered`` (each
episode's codes shuffled over its own time slots: co-occurrence kept, order gone), ``local``
(gaps limited to ``LOCAL_GAP``).

Also: ``null_stream_relations`` (everything accepted, pairs included, on a 1,000-episode
stream without rules; and after the consolidation rounds), the 10^6-event run
(``discovery_s_1e6`` with the default configuration a consolidator uses, the recall of its
rules planted 8-16 times and its false relations), and, on the ``sparse`` condition at
r = 8, a small policy trained on the promoted units' material: ``future_thinking_accuracy``
(argmax on held-out A...B prefixes of the true rules, chance 1/3) and
``reversed_order_fire_rate`` (share of reversed B...A prefixes on which the robot activates
consider:C: the policy merged with the shipped rules' tracker in the node's default
``rules`` mode; ``reversed_order_fire_rate_policy_only`` is the policy's threshold alone).
"""

from __future__ import annotations

import time

import numpy as np

from thinkmem_ros.consolidator.discovery import DiscoveryConfig, EventLog, discover, relation_f1
from thinkmem_ros.consolidator.knowledge import KnowledgeConfig, KnowledgeUnit, consolidate
from thinkmem_ros.core.metrics import mean_std
from thinkmem_ros.world.event_episodes import EventWorldConfig, generate_event_history
from thinkmem_ros.world.event_worlds import (
    WorldConfig,
    condition_config,
    generate_world,
    score_triples,
)

REPETITIONS = (1, 2, 4, 8)
CONDITION_REPETITIONS = (1, 2, 4, 8, 16)
CONDITIONS = ("sparse", "zipf", "heartbeat", "shared")
EXTRA_CONDITIONS = ("chain", "decoy", "sparse_300", "phased")  # full runs only
LOCAL_GAP = 5.0
NULL_EPISODES = 1000


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


def _unordered(log: EventLog, rng: np.random.Generator) -> EventLog:
    """Each episode's codes shuffled over its own time slots: sets kept, order gone."""
    code = log.code.copy()
    bounds = np.searchsorted(log.episode, np.arange(len(log.episode_ids) + 1))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        code[lo:hi] = rng.permutation(code[lo:hi])
    return log.with_codes(code)


def _no_consolidation(log: EventLog, cfg: DiscoveryConfig, rng: np.random.Generator) -> set:
    found: set = set()
    for row in range(len(log.episode_ids)):
        found |= discover(log.select(np.array([row])), cfg, rng).accepted_patterns(3)
    return found


def _policy_probes(units: list[KnowledgeUnit], rules, codes, seed: int,
                   episodes=()) -> dict:
    """Train a small policy on the units' material; probe true and reversed prefixes.

    ``reversed_order_fire_rate`` is what the robot does on a reversed B...A: in the node's
    default ``rules`` mode a ``consider:C`` the shipped rules cover is active only while
    the tracker holds it (``robot.thinking_gates.merge_anticipation``), with the rules
    built from the units and the world's episode timelines as a round builds them.
    ``reversed_order_fire_rate_policy_only`` is the policy's own output on the same
    probes (what a robot running ``anticipation: off`` would do).
    """
    chance = 1.0 / max(len(rules), 1)
    if not units:
        return {"future_thinking_accuracy": chance, "reversed_order_fire_rate": 0.0,
                "reversed_order_fire_rate_policy_only": 0.0}
    import torch

    from thinkmem_ros.consolidator.anticipation_export import build_rules
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
    names = list(data.label_names)
    shipped = build_rules(units, [list(ep.events) for ep in episodes])

    def probe(prefixes: list[list[str]]) -> np.ndarray:
        histories = [prefix_events(p, filler, 16, rng) for p in prefixes]
        test = situations_from_events(histories, np.zeros((len(histories), len(names)),
                                                          np.float32), data.label_names,
                                      codes, 16)
        return predict_proba(trained, test)

    hits, fires, robot = [], [], []
    for a, b, c in rules:
        label = f"consider:{c}"
        forward = probe([[a, b]] * 20)
        hits += [names[i] == label for i in forward.argmax(axis=1)]
        if label in names:
            col = names.index(label)
            policy = (probe([[b, a]] * 20)[:, col]
                      >= trained.thresholds.get(label, 0.5)).tolist()
        else:
            policy = [False] * 20
        fires += policy
        held = _tracker_holds(shipped, [(0.0, b), (1.0, a)], label, 2.0)
        robot += [_robot_decides(label, on, held, shipped) for on in policy]
    return {"future_thinking_accuracy": float(np.mean(hits)),
            "reversed_order_fire_rate": float(np.mean(robot)),
            "reversed_order_fire_rate_policy_only": float(np.mean(fires))}


def _tracker_holds(shipped, events: list[tuple[float, str]], label: str, now: float) -> bool:
    """Whether the node's anticipation tracker holds ``label`` after ``events``."""
    from thinkmem_ros.policy.anticipation import AnticipationTracker

    tracker = AnticipationTracker(rules=shipped)
    for t, name in events:
        tracker.observe(name, t)
    return label in tracker.active(now)


def _robot_decides(label: str, policy_on: bool, held: bool, shipped) -> bool:
    """The node's default merge of the policy's activation and the tracker (``rules``)."""
    from thinkmem_ros.robot.thinking_gates import merge_anticipation

    merged, _, _ = merge_anticipation([label] if policy_on else [], [label] if held else [],
                                      shipped.labels, "rules")
    return label in merged


def _paper(seed: int, reps: int, cfg: DiscoveryConfig, kcfg: KnowledgeConfig) -> dict:
    world = EventWorldConfig(repetitions=reps)
    hist = generate_event_history(world, np.random.default_rng(1000 * seed + reps))
    log = EventLog.from_episodes(hist.episodes, hist.codes)
    truth, decoys = set(hist.rules), set(hist.decoys)
    rng = np.random.default_rng(7919 * seed + reps)
    stats = discover(log, cfg, rng)
    units = proposed_rounds(log, cfg, kcfg, rng)
    proposed = {u.pattern for u in units.values() if u.active and len(u.pattern) == 3}
    out = {
        "candidate_recall": sum(stats.is_candidate(t) for t in truth) / len(truth),
        "statistics_only": relation_f1(stats.accepted_patterns(3), truth)["f1"],
        "proposed": relation_f1(proposed, truth)["f1"],
        "decoys_accepted": len(decoys & (stats.accepted_patterns(3) | proposed)),
        "discovery_s": stats.seconds,
    }
    if reps == max(REPETITIONS):
        local = discover(log, DiscoveryConfig(**{**cfg.__dict__, "max_gap": LOCAL_GAP}), rng)
        out["local"] = relation_f1(local.accepted_patterns(3), truth)["f1"]
        unordered = discover(_unordered(log, rng), cfg, rng)
        out["unordered"] = relation_f1(unordered.accepted_patterns(3), truth)["f1"]
        out["no_consolidation"] = relation_f1(_no_consolidation(log, cfg, rng), truth)["f1"]
    return out


def _condition(condition: str, seed: int, reps: int, cfg: DiscoveryConfig,
               kcfg: KnowledgeConfig, probes: bool) -> dict:
    wcfg = condition_config(condition, repetitions=reps)
    w = generate_world(wcfg, np.random.default_rng([seed, reps, len(condition)]))
    log = EventLog.from_episodes(w.episodes, w.codes)
    rng = np.random.default_rng([seed, reps, 1])
    stats = discover(log, cfg, rng)
    units = proposed_rounds(log, cfg, kcfg, rng)
    promoted = [u for u in units.values() if u.active]
    proposed = {u.pattern for u in promoted if len(u.pattern) == 3}
    found = stats.accepted_patterns(3)
    both = score_triples(found | proposed, w)
    out = {"statistics_only": score_triples(found, w)["f1"],
           "proposed": score_triples(proposed, w)["f1"],
           "false_relations": both["fp"],
           "pairs_accepted": len(stats.accepted_patterns(2)),
           "discovery_s": stats.seconds}
    if probes:
        out.update(_policy_probes(promoted, w.rules, w.codes, seed, w.episodes))
    return out


def null_stream(cfg: DiscoveryConfig, kcfg: KnowledgeConfig, seed: int,
                episodes: int = NULL_EPISODES) -> dict:
    """Relations accepted (pairs included) on a stream of background events only."""
    w = generate_world(condition_config("sparse", n_episodes=episodes, null_stream=True),
                       np.random.default_rng([seed, 99]))
    log = EventLog.from_episodes(w.episodes, w.codes)
    rng = np.random.default_rng([seed, 98])
    stats = discover(log, cfg, rng)
    units = proposed_rounds(log, cfg, kcfg, rng)
    return {"relations": len(stats.accepted), "promoted": sum(u.active for u in units.values()),
            "episodes": episodes, "events": int(log.code.size), "seconds": stats.seconds}


def stream_1e6(cfg: DiscoveryConfig, seed: int = 0, n_events: int = 1_000_000,
               n_codes: int = 5000, n_rules: int = 10) -> dict:
    """One discovery pass over ~``n_events`` events with rules planted 8-16 times."""
    rng = np.random.default_rng([seed, 6])
    reps = tuple(int(r) for r in rng.integers(8, 17, size=n_rules))
    episodes = int(round(n_events / WorldConfig().background))
    w = generate_world(WorldConfig(n_codes=n_codes, n_rules=n_rules, repetitions=reps,
                                   n_episodes=episodes), rng)
    log = EventLog.from_episodes(w.episodes, w.codes)
    start = time.perf_counter()
    result = discover(log, cfg, np.random.default_rng(seed + 1))
    seconds = time.perf_counter() - start
    score = score_triples(result.accepted_patterns(3), w)
    return {"seconds": seconds, "n_events": int(log.code.size), "n_episodes": episodes,
            "n_codes": n_codes, "repetitions": list(reps), "rule_recall": score["recall"],
            "false_relations": score["fp"], "accepted": len(result.accepted),
            "config": "DiscoveryConfig() defaults"}


def run(quick: bool, seeds: int) -> dict:
    """The paper world over REPETITIONS and the conditions over CONDITION_REPETITIONS."""
    cfg = DiscoveryConfig()
    kcfg = KnowledgeConfig()
    conditions = CONDITIONS if quick else CONDITIONS + EXTRA_CONDITIONS
    paper: dict[int, list[dict]] = {r: [] for r in REPETITIONS}
    cond: dict[str, dict[int, list[dict]]] = {
        c: {r: [] for r in CONDITION_REPETITIONS} for c in conditions}
    total = seeds * (len(REPETITIONS) + len(conditions) * len(CONDITION_REPETITIONS)) + 2
    with _progress() as progress:
        task = progress.add_task("exp6", total=total)
        for seed in range(seeds):
            for reps in REPETITIONS:
                paper[reps].append(_paper(seed, reps, cfg, kcfg))
                progress.advance(task)
            for c in conditions:
                for reps in CONDITION_REPETITIONS:
                    probes = c == "sparse" and reps == 8
                    cond[c][reps].append(_condition(c, seed, reps, cfg, kcfg, probes))
                    progress.advance(task)
        null = [null_stream(cfg, kcfg, seed) for seed in range(1 if quick else 2)]
        progress.advance(task)
        big = stream_1e6(cfg)
        progress.advance(task)

    def paper_cell(reps: int, key: str) -> dict:
        return mean_std([row[key] for row in paper[reps]])

    top = max(REPETITIONS)
    curves = {key: {str(r): paper_cell(r, src) for r in REPETITIONS} for key, src in
              (("candidate_recall", "candidate_recall"),
               ("statistics_only_f1", "statistics_only"), ("proposed_f1", "proposed"))}
    for c in conditions:
        for key, src in (("proposed_f1", "proposed"), ("statistics_only_f1",
                                                       "statistics_only")):
            curves[f"{key}_{c}"] = {str(r): mean_std([row[src] for row in cond[c][r]])
                                    for r in CONDITION_REPETITIONS}
    results = {key: paper_cell(top, key) for key in
               ("no_consolidation", "unordered", "local", "statistics_only", "proposed")}
    results["decoys_accepted"] = mean_std(
        [sum(paper[r][s]["decoys_accepted"] for r in REPETITIONS) for s in range(seeds)])
    for c in conditions:
        results[f"false_relations_{c}"] = mean_std(
            [row["false_relations"] for r in CONDITION_REPETITIONS for row in cond[c][r]])
    probe_rows = cond["sparse"][8]
    for key in ("future_thinking_accuracy", "reversed_order_fire_rate",
                "reversed_order_fire_rate_policy_only"):
        results[key] = mean_std([row[key] for row in probe_rows])
    results["null_stream_relations"] = mean_std([n["relations"] for n in null])
    results["null_stream_relations_proposed"] = mean_std([n["promoted"] for n in null])
    results["discovery_s_1e6"] = {"mean": big["seconds"], "std": 0.0}
    results["discovery_rule_recall_1e6"] = {"mean": big["rule_recall"], "std": 0.0}
    results["discovery_false_relations_1e6"] = {"mean": float(big["false_relations"]),
                                                "std": 0.0}
    return {
        "metric": "relation_f1",
        "results": results,
        "curves": curves,
        "discovery_1e6": big,
        "null_stream": null,
        "chance_future_thinking": 1.0 / 3.0,
        "settings": {"repetitions": list(REPETITIONS),
                     "condition_repetitions": list(CONDITION_REPETITIONS),
                     "conditions": list(conditions), "discovery": {
                         k: (list(v) if isinstance(v, tuple) else v)
                         for k, v in cfg.__dict__.items()},
                     "local_gap": LOCAL_GAP, "paper_world": EventWorldConfig().__dict__,
                     "condition_world": {k: (list(v) if isinstance(v, tuple) else v)
                                         for k, v in WorldConfig().__dict__.items()},
                     "knowledge": kcfg.__dict__,
                     "false_relations": "false triples (accepted or promoted) per run, "
                                        "mean over every repetition count and seed",
                     "decoys_accepted": "sum over r per seed"},
        "per_run": {"paper": {str(r): paper[r] for r in REPETITIONS},
                    **{c: {str(r): cond[c][r] for r in CONDITION_REPETITIONS}
                       for c in conditions}},
    }


def plot(result: dict, path) -> None:
    """F1 against repetitions per condition (proposed), the paper world, and ablations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(16, 4.2))
    curves = result["curves"]
    conditions = result["settings"]["conditions"]
    for c in conditions:
        series = curves[f"proposed_f1_{c}"]
        xs = [int(x) for x in series]
        left.errorbar(xs, [series[str(x)]["mean"] for x in xs],
                      yerr=[series[str(x)]["std"] for x in xs], fmt="o-", capsize=3, label=c)
    left.axhline(0.9, color="grey", lw=0.8, ls=":")
    left.set_xscale("log", base=2)
    xs = [int(x) for x in curves[f"proposed_f1_{conditions[0]}"]]
    left.set_xticks(xs, [str(x) for x in xs])
    left.set_xlabel("independent repetitions per hidden rule")
    left.set_ylabel("relation F1 (proposed: promoted units)")
    left.set_ylim(-0.05, 1.05)
    left.set_title("Exp 6: conditions (48 codes, 120 episodes)")
    left.legend(fontsize=7)
    xs = [int(x) for x in curves["proposed_f1"]]
    for key, style in (("candidate_recall", "o--"), ("statistics_only_f1", "s-"),
                       ("proposed_f1", "^-")):
        series = curves[key]
        mid.errorbar(xs, [series[str(x)]["mean"] for x in xs],
                     yerr=[series[str(x)]["std"] for x in xs], fmt=style, capsize=3,
                     label=key)
    mid.set_xscale("log", base=2)
    mid.set_xticks(xs, [str(x) for x in xs])
    mid.set_ylim(-0.05, 1.05)
    mid.set_xlabel("independent repetitions per hidden rule")
    mid.set_title("paper world (300 codes)")
    mid.legend(fontsize=7)
    names = ["no_consolidation", "unordered", "local", "statistics_only", "proposed",
             "future_thinking_accuracy", "reversed_order_fire_rate"]
    vals = [result["results"][n]["mean"] for n in names]
    errs = [result["results"][n]["std"] for n in names]
    right.bar(range(len(names)), vals, yerr=errs, capsize=3, color="tab:blue")
    right.axhline(1 / 3, color="tab:red", lw=0.8, ls="--", label="chance (future thinking)")
    right.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=6)
    right.set_ylim(0, 1.05)
    right.set_title("at 8 repetitions (F1; last two: policy probes)")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
