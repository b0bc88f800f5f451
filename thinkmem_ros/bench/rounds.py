"""A simulated fleet through consolidation rounds: does each round make the robots better.

Reproduce: ``thinkmem bench rounds [--quick] [--seeds N] --json bench_results/rounds.json
--plot bench_results/rounds.png``.

The fleet: ``robots`` robots run the shipped bundle (round 0). In every round each robot
drives a fresh ``mixed`` stream (its own seed) cut into missions that carry evidence of the
rules planted so far (``world/rule_overlay.py``); the round's NEW rule gets half of the
missions, the older rules share the rest, so each round brings one regularity nobody has
seen yet. A robot's frames go through the node's own runtime path (``policy/replay.py``:
SituationBuffer + the running bundle, its rules artefact tracked by
``policy/anticipation.py``) and become experiences through the node's ``ExperienceBuilder``
with hindsight feedback (the ground truth, as the demo's oracle sends it). They land in a
real SQLite store; a real ``ConsolidatorService`` runs the round (discovery, knowledge,
rehearsal, retraining, gate, signed publication). A published bundle is what the robots
run in the next round.

Every bundle (round 0 and each round's running bundle) is scored on the SAME fixed fresh
streams, generated once per seed and never shipped: base-label micro-F1 through the node's
replay path, and for every rule promoted so far whether ``consider:C`` is active from B
until C (the robot's activation: policy output OR the rule tracker).

Pinned JSON keys (``results``): ``base_f1_by_round`` (index 0 = the shipped bundle),
``min_base_f1_delta``, ``rule_recall_final``, ``spurious_promoted``,
``anticipation_frame_recall``, ``false_fire_rate``, ``rounds_published``,
``artefacts_attached``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from thinkmem_ros.core.metrics import mean_std, micro_scores
from thinkmem_ros.core.vocabulary import DISCOVERED_PREFIX
from thinkmem_ros.world.rule_overlay import (
    Mission,
    PlantedRule,
    anticipation,
    mission_kinds,
    plant_rules,
)

RULES: tuple[PlantedRule, ...] = (
    PlantedRule("valve_stuck", "pressure_spike", "pump_trip"),
    PlantedRule("dust_alert", "lidar_degraded", "localization_lost"),
    PlantedRule("battery_cold", "current_surge", "brownout"),
    PlantedRule("wheel_slip", "odom_drift", "path_deviation"),
    PlantedRule("gripper_wear", "grasp_retry", "object_dropped"),
)
"""One new rule per round; names no stream emits on its own."""

SIZES = {
    True: {"robots": 4, "rounds": 5, "robot_s": 240.0, "missions": 12, "eval_streams": 2,
           "eval_s": 240.0, "eval_missions": 16, "epochs": 4, "ship_every": 3},
    False: {"robots": 4, "rounds": 5, "robot_s": 480.0, "missions": 16, "eval_streams": 4,
            "eval_s": 480.0, "eval_missions": 30, "epochs": 20, "ship_every": 2},
}
RATE_HZ = 10.0


@dataclass
class Fleet:
    """Where one seed's fleet keeps its consolidator state."""

    root: Path
    db: Path
    publish_dir: Path
    signing_key: Path


# ------------------------------------------------------------------ streams

def round_plan(round_index: int, missions: int, rng: np.random.Generator
               ) -> list[tuple[str, PlantedRule]]:
    """Mission plan of one robot in round ``round_index`` (1-based): half the new rule."""
    known = RULES[:round_index]
    kinds = mission_kinds(missions, rng)
    plan = []
    for i, kind in enumerate(kinds):
        rule = known[-1] if i % 2 == 0 or len(known) == 1 else known[i // 2 % (len(known) - 1)]
        plan.append((kind, rule))
    return plan


def planted_stream(duration_s: float, plan: list[tuple[str, PlantedRule]],
                   rng: np.random.Generator):
    """A fresh ``mixed`` stream with the plan's missions planted."""
    from thinkmem_ros.world.streams import generate_stream

    stream = generate_stream("mixed", duration_s, RATE_HZ, rng)
    return plant_rules(stream, plan, rng)


def eval_streams(size: dict, seed: int) -> list[tuple[object, list[Mission]]]:
    """The fixed scoring streams of one seed: every rule, each kind of evidence."""
    out = []
    for i in range(size["eval_streams"]):
        rng = np.random.default_rng([seed, 900, i])
        kinds = mission_kinds(size["eval_missions"], rng)
        plan = [(kind, RULES[j % len(RULES)]) for j, kind in enumerate(kinds)]
        out.append(planted_stream(size["eval_s"], plan, rng))
    return out


# ------------------------------------------------------------------ the robot side

def robot_view(bundle: Path, stream, missions: list[Mission]):
    """What a node running ``bundle`` publishes on ``stream``: frames, probabilities, active.

    As the node decides (``thinking_gates.merge_anticipation`` in its default ``rules``
    mode): the policy's activation (probability >= threshold), except that a ``consider:C``
    the bundle's rules cover is active exactly while the tracker holds it (from A...B until
    C or the horizon).
    """
    from thinkmem_ros.bench.anticipation import bundle_rules, tracker_active
    from thinkmem_ros.policy.replay import predict_frames, replay_for
    from thinkmem_ros.policy.runtime import PolicyRuntime
    from thinkmem_ros.robot.thinking_gates import merge_anticipation

    runtime = PolicyRuntime(bundle)
    frames = replay_for(stream, runtime.manifest)
    probs = predict_frames(runtime, frames)
    hits = probs >= runtime.thresholds
    covered = bundle_rules(bundle).labels
    tracked = tracker_active(bundle, stream.events, frames.times_s)
    labels = list(runtime.labels)
    labels += sorted({name for row in tracked for name in row} - set(labels))
    column = {name: j for j, name in enumerate(labels)}
    active = np.zeros((len(frames), len(labels)), bool)
    for i in range(len(frames)):
        policy = [name for name, on in zip(runtime.labels, hits[i], strict=True) if on]
        merged, _, _ = merge_anticipation(policy, sorted(tracked[i]), covered, "rules")
        active[i, [column[name] for name in merged]] = True
    return runtime, frames, probs, labels, active


def robot_experiences(bundle: Path, stream, missions: list[Mission], robot_id: str,
                      ship_every: int, boot_id: str = "bench", clock_s: float = 0.0) -> list:
    """Experiences a robot running ``bundle`` ships while driving ``stream`` (with feedback).

    ``boot_id`` names the drive: episode ids are (robot, boot, n), so each round's drive
    needs its own, or its missions would reuse the ids of the round before and the store
    would keep one of the two (and merge their event timelines). ``clock_s`` is the
    robot's clock when the drive starts: stamps are ``clock_s`` + stream time, so a later
    round's drive comes after the earlier ones in the store, as on a real fleet (the
    consolidator's temporal partitions follow first stamps).
    """
    from thinkmem_ros.policy.bundle import signal_set_fingerprint
    from thinkmem_ros.robot.activation import FrameResult
    from thinkmem_ros.robot.experience_builder import BuilderConfig, ExperienceBuilder, Feedback

    runtime, frames, probs, labels, active = robot_view(bundle, stream, missions)
    signal_set = runtime.manifest.signal_set or signal_set_fingerprint(runtime.manifest)
    shipped: list = []
    builder = ExperienceBuilder(
        BuilderConfig(robot_id, 1.0 / RATE_HZ, feedback_window_s=0.0,
                      ship_every_n_frames=ship_every, episode_gap_s=3600.0),
        lambda e: shipped.append(e) or True, boot_id=boot_id)
    events = sorted(stream.events, key=lambda e: e[0])
    truth_names = np.asarray(frames.label_names, dtype=object)
    next_event = 0
    for i in range(len(frames)):
        t = float(frames.times_s[i])
        while next_event < len(events) and events[next_event][0] <= t + 1e-9:
            builder.add_event(events[next_event][1], clock_s + events[next_event][0])
            next_event += 1
        t += clock_s
        result = FrameResult(
            seq=i, stamp=t, signals=frames.signals[i], mask=frames.mask[i],
            events=frames.events[i], labels=tuple(runtime.labels), probabilities=probs[i],
            active=tuple(name for name, on in zip(labels, active[i], strict=True) if on),
            embedding=np.zeros(1, np.float32), inference_us=0.0, latency_us=None,
            bundle_version=runtime.version, bundle_sha256=runtime.sha256, stale=(),
            inputs_stamp=t, signal_set=signal_set)
        builder.add_frame(result, now=t)
        required = tuple(truth_names[frames.truth[i] > 0.5])
        builder.add_feedback(Feedback(stamp=t, required=required,
                                      reward=_reward(result.active, required)), now=t)
        builder.release(t)
    builder.release(float("inf"), everything=True)
    return shipped


def _reward(active: tuple[str, ...], required: tuple[str, ...]) -> float:
    """What a judge would say the activated thinking was worth: Jaccard overlap, in [-1, 1]."""
    a, r = set(active), set(required)
    if not a and not r:
        return 1.0
    return 2.0 * len(a & r) / len(a | r) - 1.0


def classify_unit(key: str) -> str:
    """Say whether a promoted unit is ``planted``, ``planted_part``, ``natural`` or ``spurious``.

    ``natural``: only the world's own event codes, a real regularity of the simulated robot
    (not a discovery error); ``planted_part``: two steps of one planted rule in its order
    (``valve_stuck>pump_trip``), a true regularity of the planted world that is reported
    apart and counts for neither recall nor spurious units (its ``consider:C`` still counts
    in the false-fire rate wherever it fires outside the rule's B..C); ``spurious``: mixes
    a planted code with others, or a rule's codes out of order.
    """
    from thinkmem_ros.world.streams import EVENT_VOCABULARY

    if _planted(key) is not None:
        return "planted"
    codes = key.split(">")
    if len(codes) == 2 and any(codes in ([r.first, r.second], [r.first, r.consequence],
                                         [r.second, r.consequence]) for r in RULES):
        return "planted_part"
    return "natural" if all(code in EVENT_VOCABULARY for code in codes) else "spurious"


# ------------------------------------------------------------------ scoring

def score_bundle(bundle: Path, streams, base_labels: list[str], promoted: list[PlantedRule],
                 natural: tuple[str, ...] = ()) -> dict:
    """Base micro-F1 and anticipation of every promoted rule on the fixed streams."""
    truth_rows, pred_rows = [], []
    recall_num = recall_den = 0
    false_num = false_den = 0
    per_rule: dict[str, dict] = {}
    for stream, missions in streams:
        runtime, frames, probs, labels, active = robot_view(bundle, stream, missions)
        cols = [labels.index(name) for name in base_labels]
        truth_cols = [frames.label_names.index(name) for name in base_labels]
        truth_rows.append(frames.truth[:, truth_cols] > 0.5)
        pred_rows.append(active[:, cols])
        evaluated = np.ones(len(frames), bool)
        for rule in promoted:
            fired = active[:, labels.index(rule.thinking)] if rule.thinking in labels \
                else np.zeros(len(frames), bool)
            got = anticipation(missions, rule, frames.times_s, fired, evaluated)
            row = per_rule.setdefault(rule.thinking, {"expected": 0, "hit": 0})
            row["expected"] += got["expected_frames"]
            row["hit"] += round(got["frame_recall"] * got["expected_frames"])
            recall_num += round(got["frame_recall"] * got["expected_frames"])
            recall_den += got["expected_frames"]
        # false fires: discovered thinking (other than a natural regularity of the world's
        # own events, ``natural``) active where no promoted planted rule's A...B is open
        open_any = np.zeros(len(frames), bool)
        for rule in promoted:
            for m in missions:
                if m.rule == rule and m.kind in ("rule", "prefix"):
                    b = m.times[rule.second]
                    c = m.times.get(rule.consequence, m.end_s)
                    open_any |= (frames.times_s > b) & (frames.times_s < c)
        consider = [j for j, name in enumerate(labels)
                    if name.startswith(DISCOVERED_PREFIX) and name not in natural]
        fired_any = active[:, consider].any(axis=1) if consider else np.zeros(len(frames), bool)
        false_num += int((fired_any & ~open_any).sum())
        false_den += int((~open_any).sum())
    scores = micro_scores(np.vstack(truth_rows), np.vstack(pred_rows))
    return {"base_micro_f1": scores["f1"],
            "anticipation_frame_recall": recall_num / recall_den if recall_den else None,
            "false_fire_rate": false_num / false_den if false_den else 0.0,
            "per_rule_frame_recall": {k: v["hit"] / v["expected"] if v["expected"] else None
                                      for k, v in per_rule.items()}}


# ------------------------------------------------------------------ one fleet

def _fleet(root: Path) -> Fleet:
    from thinkmem_ros.link.security import write_signing_keypair

    _, secret = write_signing_keypair(root / "keys", "bench")
    return Fleet(root, root / "store.db", root / "published", secret)


def _service(fleet: Fleet, size: dict, seed: int, bundle: Path):
    from thinkmem_ros.consolidator.retrain import RetrainConfig
    from thinkmem_ros.consolidator.service import ConsolidatorConfig, ConsolidatorService

    return ConsolidatorService(ConsolidatorConfig(
        db_path=fleet.db, publish_dir=fleet.publish_dir, signing_key=fleet.signing_key,
        initial_bundle=bundle, seed=seed,
        retrain=RetrainConfig(epochs=size["epochs"], seed=seed)))


def _store(fleet: Fleet, experiences: list, next_seq: dict[str, int]) -> None:
    """Store as the receiver would: each robot's records numbered on from its last seq."""
    from dataclasses import replace

    from thinkmem_ros.consolidator.store import ExperienceStore
    from thinkmem_ros.link.experience import encode_experience

    rows = []
    for e in experiences:
        seq = next_seq.get(e.robot_id, 0)
        next_seq[e.robot_id] = seq + 1
        e = replace(e, seq=seq)
        rows.append((e, encode_experience(e)))
    with ExperienceStore(fleet.db) as store:
        store.insert_many(rows)


def _planted(key: str) -> PlantedRule | None:
    for rule in RULES:
        if key == ">".join(rule.pattern):
            return rule
    return None


def run_fleet(size: dict, seed: int, progress=None, bundle: Path | str | None = None) -> dict:
    """One seed: round 0 scored, then ``rounds`` rounds; returns per-round figures.

    ``bundle``: what the fleet runs at round 0 (default: the shipped default bundle).
    """
    from thinkmem_ros.core.paths import default_bundle

    root = Path(tempfile.mkdtemp(prefix="thinkmem-bench-rounds-"))
    try:
        fleet = _fleet(root)
        running = Path(bundle if bundle is not None else default_bundle())
        service = _service(fleet, size, seed, running)
        streams = eval_streams(size, seed)
        base_labels = [n for n in json.loads((running / "bundle.json").read_text())["labels"]
                       if not n.startswith(DISCOVERED_PREFIX)]
        next_seq: dict[str, int] = {}
        rows = [{"round": 0, "published": False, **score_bundle(running, streams, base_labels,
                                                                  [])}]
        for r in range(1, size["rounds"] + 1):
            t0 = time.perf_counter()
            shipped = []
            for k in range(size["robots"]):
                rng = np.random.default_rng([seed, r, k])
                stream, missions = planted_stream(size["robot_s"],
                                                  round_plan(r, size["missions"], rng), rng)
                shipped += robot_experiences(running, stream, missions, f"robot{k}",
                                             size["ship_every"], boot_id=f"round{r}",
                                             clock_s=(r - 1) * size["robot_s"])
            _store(fleet, shipped, next_seq)
            report = service.run_round(f"bench round {r}")
            published = report.published_version is not None
            if published:
                running = Path(service.publisher.current().path)
            kinds = {key: classify_unit(key) for key in report.promoted}
            planted_now = [_planted(k) for k, kind in kinds.items() if kind == "planted"]
            natural = tuple(f"{DISCOVERED_PREFIX}{k.split('>')[-1]}"
                            for k, kind in kinds.items() if kind == "natural")
            row = {"round": r, "published": published, "outcome": report.outcome,
                   "experiences_shipped": len(shipped), "store_episodes": report.episodes,
                   "promoted": list(report.promoted),
                   "planted_promoted": [">".join(p.pattern) for p in planted_now],
                   "spurious": [k for k, kind in kinds.items() if kind == "spurious"],
                   "natural": [k for k, kind in kinds.items() if kind == "natural"],
                   "planted_part": [k for k, kind in kinds.items() if kind == "planted_part"],
                   "artefacts": _artefacts(running) if published else [],
                   "round_artefacts": report.artefacts,
                   "gate_reasons": list(report.gate.reasons) if report.gate else [],
                   "round_s": round(time.perf_counter() - t0, 1),
                   "consolidation_s": round(report.seconds, 1), "timings": report.timings,
                   "read": report.read,
                   **score_bundle(running, streams, base_labels, planted_now, natural)}
            rows.append(row)
            if progress is not None:
                progress(r, row)
        return {"rows": rows, "planted": [">".join(rule.pattern)
                                          for rule in RULES[:size["rounds"]]]}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _artefacts(bundle: Path) -> list[str]:
    """Artefact kinds the bundle's signed manifest lists (values, memctl, rules)."""
    extras = json.loads((bundle / "bundle.json").read_text()).get("extras") or {}
    files = set((extras.get("artefacts") or {}).keys())
    kinds = {"values": "values.npz", "memctl": "memctl.npz", "rules": "rules.json"}
    return sorted(kind for kind, name in kinds.items() if name in files)


# ------------------------------------------------------------------ benchmark entry

def summarise(fleets: list[dict]) -> dict:
    """The pinned ``results`` keys from every seed's rows (means over seeds)."""
    base = np.array([[row["base_micro_f1"] for row in f["rows"]] for f in fleets])
    deltas = base[:, 1:] - base[:, :1]
    last = [f["rows"][-1] for f in fleets]
    recall_final = [len(row["planted_promoted"]) / len(f["planted"])
                    for row, f in zip(last, fleets, strict=True)]
    spurious = [len({k for row in f["rows"][1:] for k in row["spurious"]}) for f in fleets]
    frame_recall = [row["anticipation_frame_recall"] for row in last
                    if row["anticipation_frame_recall"] is not None]
    published = [sum(row["published"] for row in f["rows"][1:]) for f in fleets]
    attached = all(set(row["artefacts"]) >= {"values", "memctl", "rules"}
                   for f in fleets for row in f["rows"][1:] if row["published"])
    return {
        "base_f1_by_round": [round(float(v), 4) for v in base.mean(axis=0)],
        "min_base_f1_delta": round(float(deltas.min()), 4) if deltas.size else 0.0,
        "rule_recall_final": round(float(np.mean(recall_final)), 4),
        "spurious_promoted": float(np.mean(spurious)),
        "anticipation_frame_recall": (round(float(np.mean(frame_recall)), 4)
                                      if frame_recall else None),
        "false_fire_rate": round(float(np.mean([row["false_fire_rate"] for row in last])), 4),
        "rounds_published": float(np.mean(published)),
        "natural_promoted": float(np.mean([len({k for row in f["rows"][1:]
                                                for k in row["natural"]}) for f in fleets])),
        "planted_part_promoted": float(np.mean([len({k for row in f["rows"][1:]
                                                     for k in row.get("planted_part", ())})
                                                for f in fleets])),
        "rounds": len(fleets[0]["rows"]) - 1,
        "artefacts_attached": bool(attached),
        # the consolidator's own time per round (index 0 = round 1) and what it decoded:
        # rounds after the first read the rows new to the running bundle and a reservoir
        "round_s_by_round": [round(float(np.mean([f["rows"][r]["consolidation_s"]
                                                  for f in fleets])), 1)
                             for r in range(1, len(fleets[0]["rows"]))],
        "discovery_s_by_round": [round(float(np.mean([f["rows"][r]["timings"].get(
            "discovery_s", 0.0) for f in fleets])), 1) for r in range(1, len(fleets[0]["rows"]))],
        "experiences_read_by_round": [
            round(float(np.mean([f["rows"][r]["read"]["new"] + f["rows"][r]["read"]["reservoir"]
                                 for f in fleets])), 1)
            for r in range(1, len(fleets[0]["rows"]))],
    }


def run(quick: bool, seeds: int, bundle: str | None = None) -> dict:
    """Run ``seeds`` fleets (each a full set of rounds) and summarise.

    ``bundle``: start the fleet on this bundle instead of the shipped default (a streaming
    bundle goes through the rounds as streaming).
    """
    from rich.progress import Progress

    from thinkmem_ros.core.paths import default_bundle

    bundle = str(bundle if bundle is not None else default_bundle())
    size = SIZES[quick]
    fleets = []
    with Progress(transient=True) as bar:
        task = bar.add_task("fleet rounds", total=seeds * size["rounds"])
        for seed in range(seeds):
            def tick(r: int, row: dict, seed: int = seed) -> None:
                bar.update(task, advance=1, description=(
                    f"seed {seed} round {r}: base F1 {row['base_micro_f1']:.3f} "
                    f"{'published' if row['published'] else 'kept'}"))
            fleets.append(run_fleet(size, seed, tick, bundle))
    results = summarise(fleets)
    curves = {"base_f1": {str(r): mean_std([f["rows"][r]["base_micro_f1"] for f in fleets])
                          for r in range(size["rounds"] + 1)},
              "anticipation_frame_recall": {
                  str(r): mean_std([f["rows"][r]["anticipation_frame_recall"] or 0.0
                                    for f in fleets]) for r in range(1, size["rounds"] + 1)},
              "false_fire_rate": {str(r): mean_std([f["rows"][r]["false_fire_rate"]
                                                    for f in fleets])
                                  for r in range(size["rounds"] + 1)}}
    return {"experiment": "rounds", "metric": "base_micro_f1", "results": results,
            "curves": curves, "size": size, "fleets": fleets, "bundle": bundle}


def plot(result: dict, path: str | Path) -> None:
    """Base F1 per round, anticipation recall and false fires per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = result["curves"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    xs = sorted(int(k) for k in curves["base_f1"])
    axes[0].errorbar(xs, [curves["base_f1"][str(x)]["mean"] for x in xs],
                     yerr=[curves["base_f1"][str(x)]["std"] for x in xs], marker="o")
    axes[0].axhline(curves["base_f1"]["0"]["mean"] - 0.005, ls="--", c="grey",
                    label="round 0 - 0.005")
    axes[0].set(xlabel="round (0 = shipped bundle)", ylabel="base-label micro-F1",
                title="base skills on the same fresh streams")
    axes[0].legend()
    xs = sorted(int(k) for k in curves["anticipation_frame_recall"])
    axes[1].plot(xs, [curves["anticipation_frame_recall"][str(x)]["mean"] for x in xs],
                 marker="o", label="frames B..C with consider:C")
    axes[1].plot(xs, [curves["false_fire_rate"][str(x)]["mean"] for x in xs], marker="s",
                 label="false fires")
    axes[1].set(xlabel="round", ylim=(-0.02, 1.02), title="anticipation of promoted rules")
    axes[1].legend()
    r = result["results"]
    xs = list(range(1, len(r["round_s_by_round"]) + 1))
    axes[2].plot(xs, r["round_s_by_round"], marker="o", c="C3", label="round time (s)")
    axes[2].plot(xs, r["discovery_s_by_round"], marker="s", c="C4",
                 label="of which discovery (s)")
    axes[2].set(xlabel="round", ylabel="seconds", title="consolidation time per round")
    twin = axes[2].twinx()
    twin.plot(xs, r["experiences_read_by_round"], marker="^", c="grey",
              label="experiences read")
    twin.set(ylabel="experiences read")
    axes[2].legend(loc="upper left")
    twin.legend(loc="lower right")
    fig.suptitle(f"{r['rounds']} rounds, published {r['rounds_published']:.1f}, rule recall "
                 f"{r['rule_recall_final']:.2f}, spurious {r['spurious_promoted']:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
