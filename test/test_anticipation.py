"""Anticipation on the robot: the rules artefact, the tracker, the gates and a real node.

The tracker must hold ``consider:C`` from the completion of A...B until C or the rule's
horizon, whatever the gap, and never for B...A, A alone, B alone or C alone. Property tests
compare it with a brute-force reference over random event streams.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import copy_bundle, stop_ros

from thinkmem_ros.consolidator.anticipation_export import (
    ExportConfig,
    build_rules,
    event_times,
    listed_files,
    write_rules,
)
from thinkmem_ros.consolidator.knowledge import KnowledgeUnit
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.policy.anticipation import (
    DUPLICATE,
    OUT_OF_ORDER,
    RESET,
    AnticipationTracker,
    TrackerConfig,
)
from thinkmem_ros.policy.anticipation_rules import (
    RULES_JSON,
    RULES_META,
    AnticipationRule,
    RulesArtefactError,
    RuleSet,
    chain_gaps,
)
from thinkmem_ros.policy.bundle import load_bundle
from thinkmem_ros.robot.thinking_gates import (
    GateConfig,
    ThinkingGates,
    artefact_hashes,
    attach_artefacts,
    load_gate_artefacts,
    merge_anticipation,
)

ABC = AnticipationRule(("A", "B"), "C", "consider:C", (60.0,), 100.0)


def tracker(*rules: AnticipationRule, **cfg) -> AnticipationTracker:
    return AnticipationTracker(TrackerConfig(**cfg), RuleSet(rules or (ABC,)))


def feed(tr: AnticipationTracker, events) -> None:
    for t, name in events:
        tr.observe(name, t)


def on(tr: AnticipationTracker, t: float, label: str = "consider:C") -> bool:
    return label in tr.active(t)


# ------------------------------------------------------------------ the tracker


def test_holds_from_b_until_c_across_a_long_gap():
    tr = tracker()
    tr.observe("A", 0.0)
    assert not on(tr, 0.0) and not on(tr, 49.9)
    tr.observe("B", 50.0)
    assert all(on(tr, t) for t in np.arange(50.0, 140.0, 0.1))
    act = tr.active(120.0)["consider:C"]
    assert act.rule == "A>B>C" and act.since == 50.0 and act.until == 150.0
    tr.observe("C", 140.0)
    assert not on(tr, 140.0) and not on(tr, 141.0)
    assert tr.stats()["opened"] == 1 and tr.stats()["closed"] == 1


def test_horizon_expires_without_c():
    tr = tracker()
    feed(tr, [(0.0, "A"), (10.0, "B")])
    assert on(tr, 110.0) and not on(tr, 110.01)
    assert tr.stats()["expired"] == 1 and tr.stats()["open"] == 0
    tr.observe("C", 200.0)  # C after the horizon: nothing opens, nothing to close
    assert not on(tr, 200.0)


@pytest.mark.parametrize("events", [
    [(0.0, "B"), (10.0, "A")],  # reversed
    [(0.0, "A")],
    [(0.0, "B")],
    [(0.0, "C")],
    [(0.0, "A"), (5.0, "C"), (6.0, "C")],  # A...C without B
    [(0.0, "B"), (5.0, "C")],  # B...C without A
    [(0.0, "A"), (60.5, "B")],  # A expired before B (max A->B gap 60 s)
    [(0.0, "B"), (1.0, "A"), (2.0, "C"), (3.0, "A")],
])
def test_partial_reversed_or_expired_evidence_never_fires(events):
    tr = tracker()
    feed(tr, events)
    assert not any(on(tr, t) for t in np.arange(0.0, 300.0, 0.5))


def test_repeated_a_refreshes_and_repeated_b_extends():
    tr = tracker()
    feed(tr, [(0.0, "A"), (50.0, "A"), (105.0, "B")])  # first A too old, the second counts
    assert on(tr, 105.0)
    tr.observe("B", 108.0)  # A (50) still within 60 s: the horizon restarts from 108
    assert on(tr, 207.9) and not on(tr, 208.1)
    tr2 = tracker()
    feed(tr2, [(0.0, "A"), (30.0, "B"), (90.0, "B")])  # second B too far from A: no restart
    assert on(tr2, 130.0) and not on(tr2, 130.1)


def test_c_consumes_the_chain():
    tr = tracker()
    feed(tr, [(0.0, "A"), (5.0, "B"), (10.0, "C"), (12.0, "B")])
    assert not on(tr, 12.0)  # A...B...C happened; the second B needs a new A
    feed(tr, [(13.0, "A"), (14.0, "B")])
    assert on(tr, 14.0)


def test_same_code_twice_in_the_antecedent_needs_two_events():
    rule = AnticipationRule(("A", "A"), "C", "consider:C", (10.0,), 20.0)
    tr = tracker(rule)
    tr.observe("A", 0.0)
    assert not on(tr, 0.0)
    tr.observe("A", 3.0)
    assert on(tr, 3.0)


def test_duplicates_out_of_order_and_time_jumps():
    tr = tracker()
    assert tr.observe("A", 10.0) == "accepted"
    assert tr.observe("A", 10.0) == DUPLICATE
    assert tr.observe("B", 12.0) == "accepted"
    assert tr.observe("B", 11.5) == OUT_OF_ORDER  # slightly late: taken as arriving at 12.0
    assert on(tr, 12.0)
    assert tr.observe("B", 3.0) == RESET  # the clock jumped back: everything forgotten
    assert not on(tr, 3.0)
    assert tr.stats()["backwards_resets"] == 1
    feed(tr, [(4.0, "A"), (5.0, "B")])
    assert on(tr, 6.0)
    assert tr.active(1.0) == {}  # a frame from before the jump resets too
    assert not on(tr, 6.0) and tr.stats()["backwards_resets"] == 2
    assert tr.observe("A", math.nan) == "invalid" and tr.active(math.inf) == {}


def test_a_looped_bag_repeating_its_stamps_is_a_jump_not_duplicates():
    tr = tracker()
    loop = [(1.0, "A"), (5.0, "B"), (9.0, "X")]
    feed(tr, loop)
    assert on(tr, 9.0)
    assert tr.observe("A", 1.0) == RESET  # the bag started over: same stamps, new events
    tr.observe("B", 5.0)
    assert on(tr, 5.0) and tr.stats()["duplicates"] == 0


def test_episode_start_resets():
    tr = tracker(reset_events=("episode_start",))
    feed(tr, [(0.0, "A"), (1.0, "B")])
    assert on(tr, 2.0)
    assert tr.observe("episode_start", 3.0) == RESET
    assert not on(tr, 3.0)
    tr.observe("B", 4.0)  # the A of the previous episode does not count
    assert not on(tr, 4.0)


def test_hot_swap_replays_history_and_keeps_state_for_the_same_rules():
    tr = AnticipationTracker(TrackerConfig())
    feed(tr, [(0.0, "A"), (10.0, "B"), (11.0, "X")])
    assert tr.active(12.0) == {}
    assert tr.set_rules(RuleSet((ABC,))) is True  # a new rule arrives mid-mission
    assert on(tr, 12.0)
    assert tr.set_rules(RuleSet((ABC,), {"round": 2})) is False  # same behaviour: kept
    assert on(tr, 13.0)
    other = AnticipationRule(("X", "Y"), "Z", "consider:Z", (5.0,), 5.0)
    tr.set_rules(RuleSet((other,)))  # the rule left: it stops at once
    assert tr.active(13.0) == {}
    tr.set_rules(RuleSet((ABC, other)))
    assert on(tr, 13.0)
    tr.set_rules(None)
    assert tr.active(13.0) == {} and tr.labels == frozenset()


def test_shared_label_and_shared_events():
    abc = ABC
    xbc = AnticipationRule(("X", "B"), "C", "consider:C", (60.0,), 30.0)
    ade = AnticipationRule(("A", "D"), "E", "consider:E", (60.0,), 30.0)
    tr = tracker(abc, xbc, ade)
    feed(tr, [(0.0, "X"), (1.0, "A"), (2.0, "B"), (3.0, "D")])
    early = tr.active(10.0)
    assert early["consider:E"].rule == "A>D>E"
    assert early["consider:C"].rule == "A>B>C"  # both hold C; A>B>C lasts longer
    act = tr.active(40.0)
    assert act["consider:C"].rule == "A>B>C" and "consider:E" not in act  # X>B>C expired


def _reference(rule: AnticipationRule, events, t: float) -> bool:
    """Brute force over the prefix of ``events`` at or before ``t`` (same semantics)."""
    a, b = rule.antecedent
    last_a = None
    open_b = None
    for te, name in events:
        if te > t:
            break
        if name == rule.consequent and open_b is not None:
            last_a = open_b = None
        if name == b and last_a is not None and te - last_a <= rule.max_gaps_s[0]:
            open_b = te
        if name == a:
            last_a = te
    return open_b is not None and t - open_b <= rule.horizon_s


def test_matches_a_brute_force_reference_on_random_streams():
    rng = np.random.default_rng(7)
    rule = AnticipationRule(("A", "B"), "C", "consider:C", (20.0,), 15.0)
    for trial in range(60):
        n = int(rng.integers(1, 40))
        times = np.sort(rng.uniform(0, 200, n)).round(1)
        names = rng.choice(["A", "B", "C", "X"], size=n, p=[0.3, 0.3, 0.2, 0.2])
        events = list(zip(times.tolist(), names.tolist()))
        tr = tracker(rule)
        queries = np.arange(0.0, 230.0, 0.7)
        i = 0
        for q in queries:
            while i < n and events[i][0] <= q:
                tr.observe(events[i][1], events[i][0])
                i += 1
            assert on(tr, q) == _reference(rule, events, q), (trial, q, events)


def test_chain_gaps_measure_what_the_tracker_closes():
    events = [(0.0, "A"), (3.0, "A"), (10.0, "B"), (40.0, "C"), (50.0, "B"), (55.0, "A"),
              (56.0, "B"), (70.0, "C")]
    assert chain_gaps(("A", "B"), "C", events) == [(7.0, 30.0), (1.0, 14.0)]


def test_tracker_costs_little_per_event_and_frame():
    rules = tuple(AnticipationRule((f"A{i}", f"B{i}"), f"C{i}", f"consider:C{i}", (60.0,),
                                   100.0) for i in range(200))
    tr = AnticipationTracker(TrackerConfig(), RuleSet(rules))
    start = time.perf_counter()
    for k in range(2000):
        tr.observe(f"A{k % 200}" if k % 2 else f"B{k % 200}", float(k))
        tr.active(float(k))
    assert time.perf_counter() - start < 2.0  # ~1 ms per event + frame would be a bug


# ------------------------------------------------------------------ the artefact


def test_rules_round_trip_and_tamper_detection(tmp_path):
    rules = RuleSet((ABC, AnticipationRule(("X",), "Y", "consider:Y", (), 12.5, 0.8, 9)),
                    {"round": 3})
    rules.save(tmp_path)
    back = RuleSet.load(tmp_path)
    assert back == rules and back.digest == rules.digest and back.info == {"round": 3}
    assert back.labels == ("consider:C", "consider:Y")
    text = (tmp_path / RULES_JSON).read_text()
    (tmp_path / RULES_JSON).write_text(text.replace("100.0", "1000.0"))
    with pytest.raises(RulesArtefactError, match="sha256 does not match"):
        RuleSet.load(tmp_path)
    meta = json.loads((tmp_path / RULES_META).read_text())
    meta["artefact_version"] = 99
    (tmp_path / RULES_META).write_text(json.dumps(meta))
    with pytest.raises(RulesArtefactError, match="artefact_version"):
        RuleSet.load(tmp_path)


def test_a_repeated_key_in_the_rules_or_their_sidecar_is_refused(tmp_path):
    """Plain json keeps the last of two equal keys, so a sidecar holding a wrong sha256
    first and the right one last passed its tamper check, and a rule read one of two
    horizons; another reader may take the other."""
    RuleSet((ABC,), {}).save(tmp_path)
    meta_text = (tmp_path / RULES_META).read_text()
    (tmp_path / RULES_META).write_text('{"sha256": "' + "0" * 64 + '", ' + meta_text[1:])
    with pytest.raises(RulesArtefactError, match="'sha256' appears twice"):
        RuleSet.load(tmp_path)
    RuleSet((ABC,), {}).save(tmp_path)
    text = (tmp_path / RULES_JSON).read_text()
    assert text.count('"horizon_s": ') == 1
    raw = text.replace('"horizon_s": ', '"horizon_s": 1e9, "horizon_s": ').encode()
    import hashlib

    (tmp_path / RULES_JSON).write_bytes(raw)
    meta = json.loads(meta_text)
    meta["sha256"] = hashlib.sha256(raw).hexdigest()
    (tmp_path / RULES_META).write_text(json.dumps(meta))
    with pytest.raises(RulesArtefactError, match="'horizon_s' appears twice"):
        RuleSet.load(tmp_path)


@pytest.mark.parametrize("bad, match", [
    ({"antecedent": [], "consequent": "C", "thinking": "t", "max_gaps_s": [],
      "horizon_s": 1.0}, "1..8 codes"),
    ({"antecedent": ["A", "B"], "consequent": "C", "thinking": "t", "max_gaps_s": [],
      "horizon_s": 1.0}, "max_gaps_s must hold 1"),
    ({"antecedent": ["A"], "consequent": "C", "thinking": "t", "max_gaps_s": [],
      "horizon_s": -1.0}, "horizon_s"),
    ({"antecedent": ["A"], "consequent": "C", "thinking": "t", "max_gaps_s": [],
      "horizon_s": float("nan")}, "horizon_s"),
    ({"antecedent": "AB", "consequent": "C", "thinking": "t", "max_gaps_s": [],
      "horizon_s": 1.0}, "list of codes"),
    ({"antecedent": ["A"], "consequent": "", "thinking": "t", "max_gaps_s": [],
      "horizon_s": 1.0}, "consequent"),
    ({"antecedent": ["A"], "consequent": "C", "thinking": "t", "max_gaps_s": [],
      "horizon_s": 1.0, "extra": 1}, "unknown rule keys"),
    ("not a rule", "JSON object"),
])
def test_malformed_rules_are_refused_naming_the_problem(tmp_path, bad, match):
    raw = json.dumps({"rules": [bad]}).encode()
    import hashlib

    (tmp_path / RULES_JSON).write_bytes(raw)
    (tmp_path / RULES_META).write_text(json.dumps(
        {"artefact_version": 1, "sha256": hashlib.sha256(raw).hexdigest()}))
    with pytest.raises(RulesArtefactError, match=match):
        RuleSet.load(tmp_path)


def _unit(pattern, status="promoted", confidence=0.9) -> KnowledgeUnit:
    return KnowledgeUnit(pattern=tuple(pattern), relation=f"sequence{len(pattern)}",
                         constraints={}, thinking=f"consider:{pattern[-1]}",
                         confidence=confidence, status=status)


def test_export_learns_bounds_from_observed_gaps(tmp_path):
    timelines = {i: [(0.0, "X"), (10.0, "A"), (10.0 + ab, "B"), (10.0 + ab + bc, "C")]
                 for i, (ab, bc) in enumerate([(20.0, 100.0), (40.0, 200.0), (5.0, 50.0)])}
    cfg = ExportConfig(quantile=1.0, gap_margin=1.25, horizon_margin=1.25, min_s=5.0,
                       max_s=900.0)
    rules = write_rules(tmp_path, [_unit("ABC"), _unit("XYZ"), _unit("QRS", "candidate")],
                        timelines, cfg, {"round": 1})
    by_key = {r.key: r for r in rules.rules}
    assert set(by_key) == {"A>B>C", "X>Y>Z"}  # candidates are not shipped
    abc = by_key["A>B>C"]
    assert abc.max_gaps_s == (50.0,) and abc.horizon_s == 250.0 and abc.samples == 3
    assert by_key["X>Y>Z"].samples == 0 and by_key["X>Y>Z"].horizon_s == cfg.default_s
    assert RuleSet.load(tmp_path) == rules
    assert listed_files(tmp_path) == artefact_hashes(tmp_path)  # both sides list the same
    capped = build_rules([_unit("ABC")], [[(0.0, "A"), (1.0, "B"), (5000.0, "C")]], cfg)
    assert capped.rules[0].horizon_s == 900.0 and capped.rules[0].max_gaps_s == (5.0,)


def test_export_defaults_widen_the_a_b_gap_more_than_the_horizon():
    timelines = [[(0.0, "A"), (ab, "B"), (ab + bc, "C")]
                 for ab, bc in [(10.0, 40.0), (100.0, 80.0), (30.0, 20.0)]]
    rule = build_rules([_unit("ABC")], timelines).rules[0]
    assert rule.max_gaps_s == (200.0,) and rule.horizon_s == 100.0  # 2 x 100, 1.25 x 80
    wide = build_rules([_unit("ABC")], timelines, ExportConfig(horizon_tail=1.0)).rules[0]
    assert wide.horizon_s == pytest.approx(100.0 * 4.0 ** (1 / 3))  # (80/20) ** (1/n)


@pytest.mark.parametrize("kw, match", [({"quantile": 0.0}, "quantile"),
                                       ({"gap_margin": 0.5}, "gap_margin"),
                                       ({"horizon_tail": -1.0}, "horizon_tail"),
                                       ({"min_s": 10.0, "max_s": 5.0}, "min_s"),
                                       ({"default_s": 1.0}, "default_s"),
                                       ({"min_samples": 0}, "min_samples")])
def test_export_config_names_the_bad_value(kw, match):
    with pytest.raises(ValueError, match=match):
        ExportConfig(**kw)


def test_event_times_from_experiences():
    def exp(stamp, events, episode="e1", seq=0):
        return Experience(robot_id="r", episode_id=episode, stamp=stamp,
                          window=np.zeros((1, 1), np.float32), labels=[], probabilities=[],
                          bundle_version=1, events=list(events), seq=seq)

    exps = [exp(0.1, []), exp(0.2, ["A"]), exp(5.0, ["A", "B", "B"]), exp(9.0, ["A", "B", "B"]),
            exp(20.0, ["B", "B", "C"]), exp(1.0, ["Q"], episode="e2")]  # capped at 3
    times = event_times(reversed(exps))
    assert times[("r", "e1")] == [(0.2, "A"), (5.0, "B"), (5.0, "B"), (20.0, "C")]
    assert times[("r", "e2")] == [(1.0, "Q")]


# ------------------------------------------------------------------ the gates


LABELS = ["trend", "hazard", "consider:C"]


def _gates(rules: RuleSet | None, mode: str = "rules", folder: Path | None = None
           ) -> ThinkingGates:
    gates = ThinkingGates(GateConfig(anticipation=mode), "r1", "s1",
                          rng=np.random.default_rng(0))
    if rules is not None and folder is not None:
        rules.save(folder)
        gates.use(load_gate_artefacts(folder))
    return gates


def test_gates_add_hold_and_drop_consider_labels(tmp_path):
    gates = _gates(RuleSet((ABC,)), folder=tmp_path)
    emb = np.ones(4)
    out = gates.apply(1, ("trend", "consider:C"), emb, {}, now=0.0)  # the policy guessed
    assert out.active == ["trend"] and out.suppressed == {"consider:C": "not_anticipated"}
    gates.on_event("A", 1.0)
    gates.on_event("B", 2.0)
    out = gates.apply(2, ("trend",), emb, {}, now=3.0)
    assert out.active == ["trend", "consider:C"]
    rec = out.record()
    assert rec["ranked"] == ["trend", "consider:C"]
    assert rec["anticipating"]["consider:C"]["rule"] == "A>B>C"
    assert rec["anticipating"]["consider:C"]["remaining_s"] == 99.0
    gates.on_event("C", 50.0)
    assert gates.apply(3, ("consider:C",), emb, {}, now=51.0).active == []
    stats = gates.stats()
    assert stats["anticipation_added"] == 1 and stats["anticipation_dropped"] == 2
    assert stats["anticipation_closed"] == 1
    assert gates.apply(4, ("trend",), emb, {}).anticipating is None  # no frame time: skipped


def test_or_mode_keeps_the_policy_and_off_ignores_rules(tmp_path):
    or_gates = _gates(RuleSet((ABC,)), "or", tmp_path / "a")
    assert or_gates.apply(1, ("consider:C",), np.ones(4), {}, now=0.0).active == ["consider:C"]
    off = _gates(RuleSet((ABC,)), "off", tmp_path / "b")
    off.on_event("A", 0.0)
    off.on_event("B", 1.0)
    out = off.apply(1, (), np.ones(4), {}, now=2.0)
    assert out.active == [] and "anticipating" not in out.record()
    with pytest.raises(ValueError, match="anticipation"):
        GateConfig(anticipation="always")


def test_merge_anticipation_modes():
    active, covered = ["hazard", "consider:C", "consider:Z"], {"consider:C", "consider:E"}
    assert merge_anticipation(active, ["consider:E"], covered, "rules") == (
        ["hazard", "consider:Z", "consider:E"], ["consider:C"], ["consider:E"])
    assert merge_anticipation(active, ["consider:E"], covered, "or") == (
        [*active, "consider:E"], [], ["consider:E"])
    assert merge_anticipation(active, ["consider:E"], covered, "off") == (active, [], [])
    with pytest.raises(ValueError, match="anticipation"):
        merge_anticipation(active, [], covered, "and")


def test_bench_tracker_active_reads_the_bundles_signed_rules(source_bundle, tmp_path):
    from thinkmem_ros.bench.anticipation import tracker_active

    folder = copy_bundle(source_bundle, tmp_path / "b")
    events = [(0.0, "episode_start"), (1.0, "A"), (2.0, "B"), (3.0, "C"), (4.0, "A"),
              (5.0, "episode_start"), (6.0, "B")]
    times = np.arange(0.0, 8.0, 0.5)
    assert all(not row for row in tracker_active(folder, events, times))  # no rules shipped
    RuleSet((ABC,)).save(tmp_path / "arts")
    attach_artefacts(folder, tmp_path / "arts")
    held = tracker_active(folder, events, times)
    assert [t for t, row in zip(times, held) if "consider:C" in row] == [2.0, 2.5]


def test_no_rules_artefact_leaves_the_activation_alone():
    gates = _gates(None)
    out = gates.apply(1, ("consider:C",), np.ones(4), {}, now=0.0)
    assert out.active == ["consider:C"] and "anticipating" not in out.record()


def test_rules_listed_in_the_manifest_must_match(source_bundle, tmp_path):
    folder = copy_bundle(source_bundle, tmp_path / "b")
    RuleSet((ABC,)).save(tmp_path / "arts")
    listed = attach_artefacts(folder, tmp_path / "arts")
    assert set(listed) == {RULES_JSON, RULES_META}
    extras = load_bundle(folder).manifest.extras
    assert extras["artefacts"] == artefact_hashes(folder)
    ok = load_gate_artefacts(folder, extras)
    assert ok.rules is not None and ok.rules.rules == (ABC,) and not ok.errors
    RuleSet((ABC, AnticipationRule(("X",), "Y", "consider:Y", (), 1.0))).save(folder)
    bad = load_gate_artefacts(folder, extras)  # self-consistent but not the signed one
    assert bad.rules is None and "does not match the manifest" in bad.errors[0]
    (folder / RULES_META).unlink()
    (folder / RULES_JSON).write_text("{}")
    assert load_gate_artefacts(folder, extras).rules is None


def test_rules_travel_signed_from_a_round_to_the_robot(source_bundle, tmp_path):
    """The consolidator's way (no robot import): extras from ``listed_files``, then push."""
    import shutil

    from thinkmem_ros.consolidator.publish import PublishConfig, Publisher, push_frame
    from thinkmem_ros.link.protocol import decode_frame
    from thinkmem_ros.link.security import write_signing_keypair
    from thinkmem_ros.policy.bundle import write_bundle
    from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig

    pub_key, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    publisher = Publisher(PublishConfig(tmp_path / "pub", key), initial)
    arts = tmp_path / "staging" / "v000002.artefacts"
    timelines = [[(0.0, "A"), (4.0, "B"), (30.0, "C")], [(1.0, "A"), (9.0, "B"), (20.0, "C")]]
    rules = write_rules(arts, [_unit("ABC")], timelines, info={"round": 1})
    src = load_bundle(initial)
    manifest = src.manifest
    manifest.model_version = 2
    manifest.extras = {**manifest.extras, "artefacts": listed_files(arts)}
    staged = tmp_path / "staging" / "v000002"
    write_bundle(staged, src.onnx_path.read_bytes(), manifest)
    for name in listed_files(arts):
        shutil.copyfile(arts / name, staged / name)
    publication = publisher.publish(load_bundle(staged))
    robot = BundleReceiver(BundleReceiverConfig(tmp_path / "robot", pub_key, current_version=1))
    path = robot.handle_push(decode_frame(push_frame(publication.path)).body)
    assert path is not None, robot.stats()
    arts_on_robot = load_gate_artefacts(path, load_bundle(path).manifest.extras)
    assert not arts_on_robot.errors and arts_on_robot.rules == rules
    assert arts_on_robot.rules.rules[0].horizon_s == 32.5  # 1.25 x the longest B->C, 26 s


# ------------------------------------------------------------------ a real node over DDS

rclpy = pytest.importorskip("rclpy")

from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import Range, Temperature  # noqa: E402
from std_msgs.msg import Float32, String  # noqa: E402

from thinkmem_ros.robot.node import ThinkingNode  # noqa: E402


@pytest.mark.ros
def test_node_holds_consider_label_from_b_until_c(ros_env, source_bundle, tmp_path):
    folder = copy_bundle(source_bundle, tmp_path / "bundle")
    rule = AnticipationRule(("coolant_low", "duty_cycle_high"), "overheat_alarm",
                            "consider:overheat_alarm", (60.0,), 60.0)
    RuleSet((rule,)).save(tmp_path / "arts")
    attach_artefacts(folder, tmp_path / "arts")
    context = rclpy.Context()
    rclpy.init(context=context)
    node = ThinkingNode(context=context, parameter_overrides=[
        Parameter("bundle_path", value=str(folder)), Parameter("frame_rate_hz", value=20.0),
        Parameter("stale_after_s", value=1000.0)])
    helper = rclpy.create_node("anticipation_feeder", context=context)
    events = helper.create_publisher(String, node.config.events_topic, 10)
    sensors = [(helper.create_publisher(Temperature, "/sensors/temperature", 10),
                lambda: Temperature(temperature=20.0)),
               (helper.create_publisher(Range, "/sensors/distance", 10), lambda: Range(range=8.0))]
    sensors += [(helper.create_publisher(Float32, f"/sensors/{name}", 10),
                 lambda: Float32(data=1.0))
                for name in ("current", "vibration", "visibility", "motion", "load")]
    stop = threading.Event()

    def feed_signals() -> None:  # the node claims nothing while every signal is silent
        while not stop.wait(0.1):
            for pub, make in sensors:
                pub.publish(make())
    lock = threading.Lock()
    seen: list[dict] = []

    def on_activation(msg: String) -> None:
        with lock:
            seen.append(json.loads(msg.data))

    helper.create_subscription(String, "/thinking/activation", on_activation, 100)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    executor.add_node(helper)
    spin = threading.Thread(target=executor.spin, daemon=True)
    spin.start()
    feeder = threading.Thread(target=feed_signals, daemon=True)
    feeder.start()

    def labels(record: dict) -> set[str]:
        return {a["label"] for a in record["active"]}

    def wait_for(pred, what: str, timeout: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with lock:
                if seen and pred(seen[-1]):
                    return seen[-1]
            time.sleep(0.02)
        pytest.fail(f"timed out waiting for {what}; last {seen[-1] if seen else None}")

    try:
        wait_for(lambda r: "anticipating" in r, "a gated activation")
        for name in ("duty_cycle_high", "coolant_low"):  # B...A: must not fire
            events.publish(String(data=name))
            time.sleep(0.1)
        time.sleep(0.5)
        with lock:
            assert not any("consider:overheat_alarm" in labels(r) for r in seen)
        events.publish(String(data="duty_cycle_high"))  # A (above) ... B: fires
        rec = wait_for(lambda r: "consider:overheat_alarm" in labels(r), "consider:C")
        assert rec["anticipating"]["consider:overheat_alarm"]["rule"] == rule.key
        time.sleep(0.5)
        with lock:
            n_before = len(seen)
        time.sleep(0.5)
        with lock:
            held = [labels(r) for r in seen[n_before:]]
        assert held and all("consider:overheat_alarm" in h for h in held)  # held, no flicker
        events.publish(String(data="overheat_alarm"))
        wait_for(lambda r: "consider:overheat_alarm" not in labels(r), "C to close it")
    finally:
        stop.set()
        feeder.join(timeout=2.0)
        stop_ros(executor, spin, (node, helper), context)


# ------------------------------------------------------------------ the measurement


def test_bench_scores_the_tracker_and_would_catch_a_flickering_or_eager_source():
    from thinkmem_ros.bench.anticipation import (
        KINDS,
        WorldConfig,
        kinds_for,
        learn_rules,
        make_episodes,
        score_frames,
        tracker_frames,
    )

    rng = np.random.default_rng(3)
    cfg = WorldConfig()
    rules = learn_rules(cfg, 16, rng)
    kinds = kinds_for(2, 8)
    episodes = make_episodes([kinds[i] for i in rng.permutation(len(kinds))], cfg, rng)
    times, fired = tracker_frames(rules, episodes, rate_hz=2.0)
    res = score_frames(episodes, times, fired, cfg.gap_hi_s, rules)
    assert res["anticipation_frame_recall"] >= 0.8 and res["false_fire_rate"] <= 0.01
    assert res["false_fire_rate_learned"] == 0.0 and res["reversed_order_fire_rate"] == 0.0
    assert all(res["kind_fire_rate"][k] == 0.0 for k in KINDS if k not in ("rule", "prefix"))
    label = cfg.label
    eager = score_frames(episodes, times, {label: np.ones(times.size, bool)}, cfg.gap_hi_s)
    assert eager["false_fire_rate"] > 0.5 and eager["reversed_order_fire_rate"] == 1.0
    flicker = np.zeros(times.size, bool)  # on for one frame after each B, like the policy
    for ep in episodes:
        if ep.kind == "rule":
            flicker[np.searchsorted(times, ep.planted["B"], side="right")] = True
    once = score_frames(episodes, times, {label: flicker}, cfg.gap_hi_s)
    assert once["missions_anticipated"] == 1.0 and once["anticipation_frame_recall"] < 0.2
