"""One consolidation round inside the ROS demo: before -> discover, retrain, push -> after.

The job (``round_steps()``) keeps every step of the plain ROS demo and adds:

1. the "before" stream is cut into missions carrying a planted long-range rule A...B...C
   and its counter-evidence (``rule.py``);
2. an Ed25519 signing key pair (``security.write_signing_keypair``) in ``<out>/keys``;
   CURVE stays off: everything runs on loopback, where CURVE is optional. ``keys``,
   ``consolidator``, ``node_state``, ``bag`` and ``bag_after`` are made afresh each run,
   and the demo deletes only such folders it made itself (marked ``.thinkmem-demo``) or
   empty ones; any other one there refuses the run before it starts (``own_folders``);
3. the consolidator (the real ``ConsolidatorService`` in its own process, ``
   consolidator_proc``) on 127.0.0.1 at a free port, store and publications in
   ``<out>/consolidator``, the demo's bundle as the initial one;
4. thinking_node shipping experiences to it, trusting its signing key, installing pushed
   bundles in ``<out>/node_state/bundles``; a hindsight oracle (``oracle.py``) republishes
   the bag's ground truth as ``/thinking/feedback``;
5. the "before" bag is played and scored; the demo waits until the consolidator's store
   holds the played experiences, then asks for ONE round: discovery -> knowledge units ->
   warm-start retraining -> gate -> signed publication as v2 -> push to the node;
6. it waits until the node's activations carry the new bundle version, plays a fresh
   "after" bag (another seed, same scenario, its own planted missions) and scores it,
   including whether ``consider:C`` fired after A...B and before C;
7. both bundles replay the after stream through the node's path and are scored on the
   base labels (``after_v1.base_micro_f1`` shipped, ``after.base_micro_f1`` new): the one
   comparison on the same data, so it says what the round did;
8. the summary holds before/after scores, the knowledge units, the gate decision, bundle
   versions, shipping counters and timings; ``timeline.png`` marks the swap and
   ``before_after.png`` compares the two phases.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from thinkmem_ros.demo.common import GENERATE, LOAD_BUNDLE, REPORT, SCORE
from thinkmem_ros.demo.own_folders import check_out_step, check_replaceable, fresh_folder
from thinkmem_ros.demo.ros import (
    LATE_FACTOR,
    MATCH,
    START_NODE,
    START_ROS,
    STOP_NODE,
    WRITE_BAG,
    play_step,
    write_own_bag,
)
from thinkmem_ros.demo.rule import DemoRule, anticipation, mission_kinds, plant_rule
from thinkmem_ros.demo.steps import DemoContext, Step

RULE = DemoRule()
"""The planted regularity (coolant_low ... duty_cycle_high ... overheat_alarm)."""
ROBOT_ID = "demo-robot"
STATE_FOLDERS = ("keys", "consolidator", "node_state")
"""Made afresh by the keys step: a stale v2, store or installed bundle must not be reused."""
PHASE_KEYS = ("activation", "latency", "matching", "playback", "anticipation")
"""Summary entries each playback phase produces; kept under ``before`` / ``after``."""
ORACLE_NOTE = ("feedback came from a hindsight oracle that republishes the bag's ground "
               "truth on /thinking/feedback; it stands in for the LLM or operator that would "
               "judge afterwards which thinking a situation needed")


def _round_summary(ctx: DemoContext) -> dict:
    return ctx.summary.setdefault("round", {})


# ------------------------------------------------------------------ streams and missions

def plant_before_step(ctx: DemoContext) -> None:
    """Cut the before stream into missions and plant the rule and its counter-evidence.

    ``plain_missions`` more carry none of the rule (neutral), shuffled among the others.
    """
    cfg = ctx.config
    rng = np.random.default_rng([cfg.seed, 1])
    kinds = mission_kinds(cfg.missions, rng) + ["neutral"] * cfg.plain_missions
    kinds = [kinds[i] for i in rng.permutation(len(kinds))]
    stream, missions = plant_rule(ctx.artefacts["stream"], kinds, RULE, rng)
    ctx.artefacts.update(stream=stream, missions=missions)
    ctx.summary["rule"] = {"pattern": list(RULE.pattern), "thinking": RULE.thinking,
                           "before_missions": [m.kind for m in missions],
                           "mission_s": round(missions[0].end_s - missions[0].start_s, 3)}
    kinds = ", ".join(f"{k} x{sum(m.kind == k for m in missions)}"
                      for k in dict.fromkeys(m.kind for m in missions))
    ctx.console.print(f"  planted {' ... '.join(RULE.pattern)} in {len(missions)} missions "
                      f"({kinds})")


def _after_stream(ctx: DemoContext):
    """Render a fresh stream (new seed, same scenario) with its own planted missions."""
    from thinkmem_ros.world.streams import generate_stream

    cfg = ctx.config
    rate = ctx.summary["rate_hz"]
    seed = cfg.seed + 1000
    stream = generate_stream(cfg.scenario, cfg.after_duration_s, rate,
                             np.random.default_rng(seed))
    rng = np.random.default_rng([seed, 1])
    return plant_rule(stream, mission_kinds(cfg.after_missions, rng), RULE, rng) + (seed,)


def write_after_bag_step(ctx: DemoContext) -> None:
    """Render and record the after bag now, so nothing heavy runs between round and replay."""
    from thinkmem_ros.playback.bag_files import DEFAULT_START_NS

    stream, missions, seed = _after_stream(ctx)
    path = ctx.config.out_dir / "bag_after"
    # Recorded an hour after the before bag ended: header stamps must keep growing, or the
    # node drops every sample of the replay as out of order.
    start_ns = DEFAULT_START_NS + round((ctx.summary["duration_s"] + 3600.0) * 1e9)
    info = write_own_bag(stream, path, start_ns=start_ns)
    ctx.artefacts["after"] = {"stream": stream, "missions": missions, "bag": path}
    ctx.summary["after_stream"] = {"seed": seed, "duration_s": ctx.config.after_duration_s,
                                   "frames": int(stream.values.shape[0]),
                                   "missions": [m.kind for m in missions],
                                   "bag": str(path), "messages": info.message_count}
    ctx.console.print(f"  {path}: {info.message_count} messages, seed {seed}, missions "
                      f"{[m.kind for m in missions]}")


# ------------------------------------------------------------------ keys and processes

def keys_step(ctx: DemoContext) -> None:
    """Fresh signing keys, consolidator and node state folders, replacing only the demo's.

    A folder the demo did not make (a user's real keys or store) is refused, never deleted.
    """
    from thinkmem_ros.link.security import write_signing_keypair

    out = ctx.config.out_dir
    for name in STATE_FOLDERS:  # all checked before the first is replaced
        check_replaceable(out / name)
    for name in STATE_FOLDERS:
        fresh_folder(out / name)
    public, secret = write_signing_keypair(out / "keys", "consolidator")
    ctx.artefacts["signing"] = {"public": public, "secret": secret}
    _round_summary(ctx)["keys"] = {"signing_public": str(public), "curve": "off (loopback)"}
    ctx.console.print(f"  Ed25519 signing pair {public.name} / {secret.name} in {public.parent}"
                      "; CURVE off on loopback")


def start_consolidator_step(ctx: DemoContext) -> None:
    """Start the consolidator process and point the node's shipping parameters at it."""
    from thinkmem_ros.demo.consolidator_client import ConsolidatorProcess

    cfg = ctx.config
    folder = cfg.out_dir / "consolidator"
    folder.mkdir(parents=True, exist_ok=True)
    args = ["--db", str(folder / "store.db"), "--publish-dir", str(folder / "published"),
            "--signing-key", str(ctx.artefacts["signing"]["secret"]),
            "--initial-bundle", ctx.summary["bundle"]["path"],
            "--bind", "tcp://127.0.0.1:*", "--curve", "off",
            "--epochs", str(cfg.retrain_epochs), "--lr", str(cfg.retrain_lr),
            "--seed", str(cfg.seed)]
    for key, value in cfg.gate.items():  # tests open the gate's quality bars; the demo does not
        args += ["--gate", f"{key}={value}"]
    proc = ConsolidatorProcess(args, folder / "consolidator.log",
                               start_timeout_s=cfg.node_start_timeout_s)
    ctx.artefacts["consolidator"] = proc

    def stop() -> None:
        _round_summary(ctx)["consolidator_exit_code"] = proc.stop()

    ctx.cleanups.append(stop)
    state = cfg.out_dir / "node_state"
    ctx.artefacts["node_params"] = {
        "robot_id": ROBOT_ID, "consolidator_endpoint": proc.endpoint,  # CURVE auto: off
        "bundle_signing_public_key": str(ctx.artefacts["signing"]["public"]),
        "bundles_dir": str(state / "bundles"), "spool_path": str(state / "spool.db")}
    _round_summary(ctx)["consolidator"] = {"endpoint": proc.endpoint, "log": str(proc.log_path),
                                           "pid": proc.process.pid,
                                           "gate_overrides": dict(cfg.gate)}
    ctx.console.print(f"  consolidator pid {proc.process.pid} at {proc.endpoint} "
                      f"(log {proc.log_path})")


def start_oracle_step(ctx: DemoContext) -> None:
    """Start the hindsight oracle and wait until the node subscribes to its feedback."""
    from thinkmem_ros.demo.oracle import HindsightOracle

    cfg = ctx.config
    period_s = 1.0 / ctx.summary["rate_hz"]
    oracle = HindsightOracle(ctx.artefacts["collector"].node, max_age_s=LATE_FACTOR * period_s)
    ctx.artefacts["oracle"] = oracle
    if not oracle.wait_for_subscriber(cfg.node_start_timeout_s):
        raise RuntimeError(f"thinking_node did not subscribe to /thinking/feedback within "
                           f"{cfg.node_start_timeout_s} s (is shipping on? see node.log)")
    _round_summary(ctx)["feedback"] = {"source": "hindsight oracle", "note": ORACLE_NOTE}
    ctx.console.print("  hindsight oracle: ground truth -> /thinking/feedback (stands in for "
                      "the LLM/operator judge)")


# ------------------------------------------------------------------ phases

def anticipation_step(ctx: DemoContext) -> None:
    """Score whether consider:C fired after A...B and before C in this phase's missions."""
    timeline = ctx.artefacts["timeline"]
    matched = ctx.artefacts["matched"]
    fired = np.zeros(timeline.times_s.shape, dtype=bool)
    for frame, active in zip(matched["frames"].tolist(), matched["active"], strict=True):
        fired[frame] = RULE.thinking in active  # the later activation of a frame wins
    ctx.artefacts["fired"] = fired
    result = anticipation(ctx.artefacts["missions"], RULE, timeline.times_s, fired,
                          timeline.evaluated)
    versions = matched["bundle_version"]
    result["bundle_versions"] = sorted(set(versions))
    ctx.summary["anticipation"] = result
    ctx.console.print(f"  {RULE.thinking}: anticipated {result['anticipated']}/"
                      f"{result['rule_missions']} rule missions, frame recall "
                      f"{result['frame_recall']:.2f}, false-fire rate "
                      f"{result['false_fire_rate']:.3f} (bundle v{result['bundle_versions']})")


def _keep_phase(name: str):
    def keep(ctx: DemoContext) -> None:
        phase = {key: ctx.summary[key] for key in PHASE_KEYS if key in ctx.summary}
        ctx.summary[name] = phase
        ctx.artefacts[f"{name}_timeline"] = ctx.artefacts["timeline"]
        ctx.artefacts[f"{name}_fired"] = ctx.artefacts["fired"]
        ctx.artefacts[f"{name}_missions"] = ctx.artefacts["missions"]
        micro = phase["activation"]["micro"]
        ctx.console.print(f"  {name}: micro P {micro['precision']:.3f} R {micro['recall']:.3f} "
                          f"F1 {micro['f1']:.3f} over {phase['activation']['activations_scored']}"
                          " activations")
    return keep


def wait_store_step(ctx: DemoContext) -> None:
    """Wait until the store holds the experience of the last frame the oracle judged."""
    cfg = ctx.config
    proc = ctx.artefacts["consolidator"]
    oracle = ctx.artefacts["oracle"]
    target = oracle.stats.last_stamp
    if target <= 0:
        raise RuntimeError("the oracle sent no feedback during playback: no direct material")
    deadline = time.monotonic() + cfg.store_timeout_s
    t0 = time.monotonic()
    while True:
        counts = proc.command("count", timeout_s=30.0)
        if counts["last_stamp"] >= target:
            break
        if time.monotonic() > deadline:
            shipping = ctx.artefacts["collector"].received.statuses.get("shipping", {})
            raise RuntimeError(
                f"the consolidator's store did not reach the last judged frame (stamp "
                f"{target:.3f}) within {cfg.store_timeout_s} s: store {counts}; node shipping "
                f"{shipping.get('message', '(no diagnostics)')}")
        time.sleep(0.5)
    counts["waited_s"] = round(time.monotonic() - t0, 3)
    counts["feedback_sent"] = oracle.stats.sent
    _round_summary(ctx)["store_before_round"] = counts
    ctx.console.print(f"  store: {counts['experiences']} experiences in {counts['episodes']} "
                      f"episodes, {counts['with_feedback']} with feedback "
                      f"(oracle sent {oracle.stats.sent})")


def consolidate_step(ctx: DemoContext) -> None:
    """Run one round in the consolidator process and keep its report."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    cfg = ctx.config
    proc = ctx.artefacts["consolidator"]
    box: dict = {}

    def call() -> None:
        try:
            box["report"] = proc.command("round", timeout_s=cfg.round_timeout_s)
        except Exception as exc:  # noqa: BLE001 - re-raised on the demo's thread
            box["error"] = exc

    thread = threading.Thread(target=call, name="demo-round", daemon=True)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=ctx.console, disable=cfg.quiet, transient=True) as progress:
        progress.add_task("consolidation round: discovery, retraining, gate, publish", total=None)
        thread.start()
        while thread.is_alive():
            thread.join(timeout=0.2)
    if "error" in box:
        raise box["error"]
    report = box["report"]
    ctx.artefacts["round_done_wall_ns"] = time.time_ns()
    gate = report.get("gate") or {}
    units = report.pop("units", [])
    summary = _round_summary(ctx)
    summary.update(
        outcome=report["outcome"], experiences=report["experiences"],
        episodes=report["episodes"], candidates=report["candidates"],
        accepted=report["accepted"], promoted=report["promoted"],
        waiting=report.get("waiting", []), material=report["material"],
        gate={"passed": gate.get("passed"), "reasons": gate.get("reasons", []),
              "checks": gate.get("checks", {})},
        published_version=report["published_version"], pushed_to=report["pushed_to"],
        seconds=report["seconds"], timings=report["timings"])
    ctx.summary["knowledge_units"] = units
    planted = [u for u in units if tuple(u["pattern"]) == RULE.pattern]
    summary["planted_rule_found"] = bool(planted)
    summary["spurious_promoted"] = sorted(
        key for key in report["promoted"] if key != ">".join(RULE.pattern))
    for unit in units:
        ctx.console.print(f"  unit {' ... '.join(unit['pattern'])} ({unit['relation']}) -> "
                          f"{unit['thinking']}: confidence {unit['confidence']:.2f}, "
                          f"{unit['support_episodes']} episodes, {unit['status']}")
    for key in report.get("waiting", []):  # the evidence cannot judge it yet: says so
        ctx.console.print(f"  {key.replace('>', ' ... ')}: significant, waits for more "
                          f"evidence (an element no real case can judge yet)")
    verdict = "pass" if gate.get("passed") else f"REJECT ({'; '.join(gate.get('reasons', []))})"
    ctx.console.print(f"  round: {report['candidates']} candidates, {report['accepted']} "
                      f"accepted, material {report['material']}, gate {verdict}; "
                      f"{report['outcome']} in {report['seconds']:.1f} s")


def wait_swap_step(ctx: DemoContext) -> None:
    """Wait until the node's activations carry the published version (or say why not)."""
    cfg = ctx.config
    summary = _round_summary(ctx)
    version = summary.get("published_version")
    start_version = ctx.summary["bundle"]["version"]
    received = ctx.artefacts["collector"].received
    if version is None:
        summary["swapped"] = False
        ctx.console.print(f"[yellow]  nothing was published ({summary.get('outcome')}); the "
                          f"after phase runs the same bundle v{start_version}[/]")
        return
    deadline = time.monotonic() + cfg.swap_timeout_s
    while True:
        acts = received.activations
        hit = next((a for a in reversed(acts[-50:]) if a[1].get("bundle_version") == version),
                   None)
        if hit is not None:
            break
        if time.monotonic() > deadline:
            push = received.statuses.get("bundle push", {})
            raise RuntimeError(
                f"thinking_node did not run the pushed bundle v{version} within "
                f"{cfg.swap_timeout_s} s; its bundle push status: "
                f"{push.get('message', '(no diagnostics)')} {push}")
        time.sleep(0.1)
    swap_ns = next(r for r, a in acts if a.get("bundle_version") == version)
    summary["swapped"] = True
    summary["swap_s_after_round"] = round((swap_ns - ctx.artefacts["round_done_wall_ns"]) / 1e9,
                                          3)
    summary["bundle_versions"] = {"before": start_version, "after": version}
    ctx.console.print(f"  node runs v{version} (first activation "
                      f"{summary['swap_s_after_round']:+.2f} s after the round's reply)")


def begin_after_step(ctx: DemoContext) -> None:
    """Point the play/match steps at the after bag and collect afresh."""
    after = ctx.artefacts["after"]
    ctx.artefacts.update(stream=after["stream"], missions=after["missions"], bag=after["bag"])
    ctx.artefacts["collector"].new_phase()


def compare_bundles_step(ctx: DemoContext) -> None:
    """Score the shipped and the new bundle on the SAME after stream, base labels only.

    The live after phase runs only the new bundle, and the before phase ran the shipped one
    on other missions, so those two figures cannot say what the round did. Here both
    bundles replay the after stream through the node's own path (``policy/replay.py``:
    SituationBuffer at the bundle's rate, then the policy) and are scored on the labels the
    shipped bundle knows, minus discovered ``consider:*`` thinking: ``after_v1`` is the
    shipped bundle, ``after`` the one the round published (the shipped one again when
    nothing was published).
    """
    from pathlib import Path

    from thinkmem_ros.core.metrics import micro_scores
    from thinkmem_ros.core.vocabulary import DISCOVERED_PREFIX
    from thinkmem_ros.policy.replay import predict_frames, replay_for
    from thinkmem_ros.policy.runtime import PolicyRuntime

    stream = ctx.artefacts["after"]["stream"]
    shipped = Path(ctx.summary["bundle"]["path"])
    published = ctx.config.out_dir / "consolidator" / "published" / "current"
    new = published.resolve() if _round_summary(ctx).get("swapped") else shipped
    base = [name for name in PolicyRuntime(shipped).labels
            if not name.startswith(DISCOVERED_PREFIX)]
    for key, folder in (("after_v1", shipped), ("after", new)):
        runtime = PolicyRuntime(folder)
        frames = replay_for(stream, runtime.manifest)
        active = predict_frames(runtime, frames) >= runtime.thresholds
        labels = list(runtime.labels)
        truth = frames.truth[:, [frames.label_names.index(n) for n in base]] > 0.5
        scores = micro_scores(truth, active[:, [labels.index(n) for n in base]])
        phase = ctx.summary.setdefault(key, {})
        phase.update(base_micro_f1=scores["f1"], base_precision=scores["precision"],
                     base_recall=scores["recall"], base_frames=len(frames),
                     base_bundle_version=runtime.version,
                     base_scored_by="replay of the after stream (policy/replay.py)")
    delta = ctx.summary["after"]["base_micro_f1"] - ctx.summary["after_v1"]["base_micro_f1"]
    ctx.summary["after_vs_shipped"] = {"base_micro_f1_delta": delta, "labels": base}
    ctx.console.print(f"  same after stream, base labels: shipped "
                      f"v{ctx.summary['after_v1']['base_bundle_version']} micro-F1 "
                      f"{ctx.summary['after_v1']['base_micro_f1']:.4f}, new "
                      f"v{ctx.summary['after']['base_bundle_version']} "
                      f"{ctx.summary['after']['base_micro_f1']:.4f} ({delta:+.4f})")


# ------------------------------------------------------------------ plot and report

def round_plot_step(ctx: DemoContext) -> None:
    """timeline.png (before | swap | after) and before_after.png (scores side by side)."""
    from thinkmem_ros.demo.plot import plot_before_after, plot_round_timeline

    out = ctx.config.out_dir
    summary = ctx.summary
    swap = summary.get("round", {}).get("bundle_versions")
    label = (f"swap v{swap['before']} -> v{swap['after']}" if swap
             else "round (no new bundle)")
    path = plot_round_timeline(
        ctx.artefacts["before_timeline"], ctx.artefacts["after_timeline"],
        (ctx.artefacts["before_fired"], ctx.artefacts["after_fired"]),
        (ctx.artefacts["before_missions"], ctx.artefacts["after_missions"]), RULE,
        out / "timeline.png", swap_label=label,
        title=f"{ctx.config.scenario}: before and after one consolidation round")
    summary["timeline_png"] = str(path)
    summary["before_after_png"] = str(plot_before_after(summary, out / "before_after.png"))


def round_report_step(ctx: DemoContext) -> None:
    """Print the before/after comparison (the common report prints the rest)."""
    from rich.table import Table

    summary = ctx.summary
    before, after = summary["before"], summary["after"]
    table = Table(title="one consolidation round: before vs after")
    for column in ("", "precision", "recall", "F1", f"{RULE.thinking} anticipated",
                   "false fires"):
        table.add_column(column, justify="left" if not column else "right")
    for name, phase in (("before", before), ("after", after)):
        micro, ant = phase["activation"]["micro"], phase["anticipation"]
        table.add_row(name, f"{micro['precision']:.3f}", f"{micro['recall']:.3f}",
                      f"{micro['f1']:.3f}", f"{ant['anticipated']}/{ant['rule_missions']}",
                      f"{ant['false_fire_rate']:.3f}")
    ctx.console.print(table)
    if "after_v1" in summary:
        ctx.console.print(f"  same after stream, base labels (replayed): shipped "
                          f"{summary['after_v1']['base_micro_f1']:.4f} -> new "
                          f"{summary['after']['base_micro_f1']:.4f}; rule missions held "
                          f"(>= 80 % of B..C frames) {after['anticipation'].get('held')}/"
                          f"{after['anticipation']['rule_missions']}")
    rnd = summary.get("round", {})
    ship = summary.get("diagnostics", {}).get("shipping", {})
    ctx.console.print(f"  shipping: sent {ship.get('sent')}, acked {ship.get('acked')}, "
                      f"spooled {ship.get('spool_rows')}, shed {ship.get('shed')}; "
                      f"round {rnd.get('outcome')} in {rnd.get('seconds')} s")
    ctx.console.print(f"  [dim]{ORACLE_NOTE}[/]")


# ------------------------------------------------------------------ the job

PLANT = Step("plant rule", plant_before_step, "missions with A...B...C and counter-evidence")
AFTER_BAG = Step("write after bag", write_after_bag_step, "fresh seed for the after phase")
KEYS = Step("keys", keys_step, "Ed25519 bundle-signing pair")
START_CONSOLIDATOR = Step("start consolidator", start_consolidator_step,
                          "store, discovery, retraining, signed publication on loopback")
START_ORACLE = Step("start oracle", start_oracle_step, "ground truth -> /thinking/feedback")
PLAY_BEFORE = Step("play before", play_step, "bundle v1 on the before missions")
MATCH_BEFORE = Step("match before", MATCH.run, MATCH.description)
SCORE_BEFORE = Step("score before", SCORE.run, SCORE.description)
ANTICIPATE_BEFORE = Step("anticipation before", anticipation_step, "consider:C before C?")
KEEP_BEFORE = Step("keep before", _keep_phase("before"), "")
WAIT_STORE = Step("wait for store", wait_store_step, "played experiences in the store")
CONSOLIDATE = Step("consolidate", consolidate_step,
                   "discovery -> knowledge units -> retrain -> gate -> sign -> push")
WAIT_SWAP = Step("wait for swap", wait_swap_step, "node runs the pushed bundle")
BEGIN_AFTER = Step("begin after", begin_after_step, "switch to the after bag")
PLAY_AFTER = Step("play after", play_step, "the new bundle on fresh missions")
MATCH_AFTER = Step("match after", MATCH.run, MATCH.description)
SCORE_AFTER = Step("score after", SCORE.run, SCORE.description)
ANTICIPATE_AFTER = Step("anticipation after", anticipation_step, "consider:C before C?")
KEEP_AFTER = Step("keep after", _keep_phase("after"), "")
COMPARE = Step("compare bundles", compare_bundles_step,
               "shipped vs new bundle on the same after stream (base labels)")
ROUND_PLOT = Step("plot", round_plot_step, "timeline with the swap, before/after bars")
ROUND_REPORT = Step("round report", round_report_step, "before vs after")


def round_steps() -> list[Step]:
    """Return the ROS job with one consolidation round (see the module docstring)."""
    return [check_out_step(("bag", "bag_after", *STATE_FOLDERS)), LOAD_BUNDLE, GENERATE,
            PLANT, WRITE_BAG, AFTER_BAG, KEYS, START_CONSOLIDATOR, START_ROS, START_NODE,
            START_ORACLE, PLAY_BEFORE, MATCH_BEFORE, SCORE_BEFORE, ANTICIPATE_BEFORE,
            KEEP_BEFORE, WAIT_STORE, CONSOLIDATE, WAIT_SWAP, BEGIN_AFTER, PLAY_AFTER,
            MATCH_AFTER, SCORE_AFTER, ANTICIPATE_AFTER, KEEP_AFTER, STOP_NODE, COMPARE,
            ROUND_PLOT, ROUND_REPORT, REPORT]
