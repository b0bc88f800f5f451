"""The demo's consolidation round: planted rule, oracle, consolidator process, and end to end.

The end-to-end test runs the real job on short bags: thinking_node and the consolidator as
processes, DDS on a private domain, ZeroMQ on loopback. Its gate's quality bars are opened
(``DemoConfig.gate``) because a 2-epoch retrain on 30 s of experience is not meant to be a
better policy; the gate's judgement is tested in the consolidator's own tests, this one
checks that experiences flow, discovery finds the planted rule and the push is installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from thinkmem_ros.core.data import SignalStream
from thinkmem_ros.core.vocabulary import EPISODE_START_EVENT
from thinkmem_ros.demo import DemoConfig, run_demo
from thinkmem_ros.demo.consolidator_client import ConsolidatorProcess
from thinkmem_ros.demo.consolidator_proc import gate_overrides
from thinkmem_ros.demo.oracle import jaccard
from thinkmem_ros.demo.rule import DemoRule, anticipation, mission_kinds, plant_rule

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RULE = DemoRule()


# ------------------------------------------------------------------ plain parts (no ROS)

def _stream(seconds: float, rate: float = 10.0) -> SignalStream:
    n = int(seconds * rate)
    return SignalStream(rate_hz=rate, values=np.zeros((n, 2), np.float32),
                        labels=np.zeros((n, 1), np.float32), events=[(1.0, "door_open")],
                        label_names=("trend",), signal_names=("a", "b"))


def test_mission_kinds_mix_rule_and_every_counter_evidence():
    kinds = mission_kinds(8, np.random.default_rng(0))
    assert kinds.count("rule") == 5
    assert {"prefix", "reversed", "isolated"} <= set(kinds)
    with pytest.raises(ValueError, match="mission count"):
        mission_kinds(0, np.random.default_rng(0))


def test_plant_rule_places_markers_and_ordered_events_inside_missions():
    kinds = ["rule", "prefix", "reversed", "neutral"]
    stream, missions = plant_rule(_stream(40.0), kinds, RULE, np.random.default_rng(1))
    a, b, c = RULE.pattern
    assert [m.kind for m in missions] == kinds
    markers = [t for t, name in stream.events if name == EPISODE_START_EVENT]
    assert markers == [0.0, 10.0, 20.0, 30.0]
    assert (1.0, "door_open") in stream.events  # natural events stay
    rule, prefix, reversed_, neutral = missions
    assert rule.start_s < rule.times[a] < rule.times[b] < rule.times[c] < rule.end_s
    assert c not in prefix.times and prefix.times[a] < prefix.times[b]
    assert reversed_.times[b] < reversed_.times[a]
    assert neutral.times == {}
    assert [t for t, _ in stream.events] == sorted(t for t, _ in stream.events)
    with pytest.raises(ValueError, match="too short"):
        plant_rule(_stream(3.0), kinds, RULE, np.random.default_rng(1))


def test_anticipation_counts_fires_between_b_and_c_only():
    stream, missions = plant_rule(_stream(20.0), ["rule", "neutral"], RULE,
                                  np.random.default_rng(2))
    times = stream.times
    b, c = missions[0].times[RULE.second], missions[0].times[RULE.consequence]
    fired = (times > b) & (times < b + 0.5)  # fires right after B, well before C
    fired[150] = True  # and once in the neutral mission: a false fire
    result = anticipation(missions, RULE, times, fired, np.ones_like(times, dtype=bool))
    assert result["anticipated"] == 1 and result["rule_missions"] == 1
    assert result["missions"][0]["lead_s"] == pytest.approx(c - times[fired & (times < c)][0],
                                                            abs=1e-3)
    assert 0 < result["false_fire_rate"] < 0.02
    silent = anticipation(missions, RULE, times, np.zeros_like(fired),
                          np.ones_like(fired))
    assert silent["anticipated"] == 0 and silent["false_fire_rate"] == 0.0


def test_jaccard_and_gate_overrides():
    assert jaccard(set(), set()) == 1.0
    assert jaccard({"a", "b"}, {"b", "c"}) == pytest.approx(1 / 3)
    assert gate_overrides(["f1_tolerance=0.5", "rule_probes=5", "allow_no_heldout=true"]) == {
        "f1_tolerance": 0.5, "rule_probes": 5, "allow_no_heldout": True}
    with pytest.raises(ValueError, match="nope"):
        gate_overrides(["nope=1"])


def test_consolidator_process_protocol(source_bundle, tmp_path):
    from thinkmem_ros.link.security import write_signing_keypair

    _, secret = write_signing_keypair(tmp_path / "keys", "c")
    proc = ConsolidatorProcess(
        ["--db", str(tmp_path / "s.db"), "--publish-dir", str(tmp_path / "pub"),
         "--signing-key", str(secret), "--initial-bundle", str(source_bundle),
         "--bind", "tcp://127.0.0.1:*", "--curve", "off"], tmp_path / "c.log")
    try:
        assert proc.endpoint.startswith("tcp://127.0.0.1:")
        assert proc.command("count", 30.0) == {"experiences": 0, "episodes": 0,
                                               "with_feedback": 0, "last_stamp": 0.0}
        report = proc.command("round", 60.0)  # empty store: nothing to train, nothing published
        assert report["published_version"] is None and report["units"] == []
        assert report["outcome"].startswith("no retraining")
        with pytest.raises(RuntimeError, match="unknown command"):
            proc.command("bogus", 10.0)
    finally:
        assert proc.stop() == 0


def test_consolidator_process_start_failure_names_the_reason(tmp_path):
    with pytest.raises(RuntimeError, match="signing"):
        ConsolidatorProcess(["--db", str(tmp_path / "s.db"), "--signing-key",
                             str(tmp_path / "missing.sign.key")], tmp_path / "c.log")


# ------------------------------------------------------------------ the round end to end
# The held-out split is by a hash of the episode id (which holds the node's boot time), so
# a short run may hold out no episode at all: ``allow_no_heldout`` keeps that from failing.

@pytest.fixture(scope="module")
def round_demo(ros_env, source_bundle, tmp_path_factory):
    """One short round: 10 + 8 plain missions x 5 s before, 2 x 5 s after, a 2-epoch
    retrain (with 6 missions alone the rule's first code is in all of them and waits; with
    4 plain ones it was judged in most runs, not all: a clean-clone run on 2026-12-04 had
    neither its contrast nor its binding testable, and the rule waited). 10 rule missions,
    not 6: the rule's codes keep fixed phases of the mission, so its evidence beyond them
    is that C comes with A...B, and with 4 rule missions among 14 (C in 4 of the 8 that
    hold A and B) that is p 0.07, which chance sets of phased codes reach too."""
    config = DemoConfig(out_dir=tmp_path_factory.mktemp("round") / "out", duration_s=90.0,
                        missions=10, plain_missions=8, after_duration_s=10.0, after_missions=2,
                        retrain_epochs=2,
                        seed=5, bundle=source_bundle, quiet=True, settle_s=1.0,
                        gate={"f1_tolerance": 1.0, "label_f1_tolerance": 1.0,
                              "rule_recall": 0.0, "rule_false_rate": 1.0,
                              "allow_no_heldout": True})
    return config, run_demo(config)


@pytest.mark.ros
def test_round_ships_discovers_pushes_and_swaps(round_demo):
    config, summary = round_demo
    rnd = summary["round"]
    frames = summary["frames"]
    # experiences of the before playback reached the store, with the oracle's feedback
    store = rnd["store_before_round"]
    assert store["experiences"] >= 0.8 * frames
    assert store["with_feedback"] >= 0.8 * frames
    assert store["episodes"] >= config.missions  # one per mission (plus the idle start)
    # discovery found the planted rule and promoted it
    found = [u for u in summary["knowledge_units"] if tuple(u["pattern"]) == RULE.pattern]
    assert found and found[0]["relation"] == "sequence3"
    assert found[0]["thinking"] == RULE.thinking and found[0]["support_episodes"] >= 3
    assert ">".join(RULE.pattern) in rnd["promoted"] and rnd["planted_rule_found"]
    # signed v2 published, pushed to the node, and the node runs it
    assert rnd["outcome"] == "published" and rnd["published_version"] == 2, rnd["gate"]
    assert rnd["pushed_to"] == 1 and rnd["swapped"]
    assert rnd["bundle_versions"] == {"before": summary["bundle"]["version"], "after": 2}
    assert summary["after"]["anticipation"]["bundle_versions"] == [2]
    assert summary["before"]["anticipation"]["bundle_versions"] == [1]
    installed = config.out_dir / "node_state" / "bundles" / "current"
    assert json.loads((installed / "bundle.json").read_text())["model_version"] == 2
    # shipping counters from /diagnostics, clean exits
    shipping = summary["diagnostics"]["shipping"]
    assert shipping["acked"] > 0 and shipping["shed"] == 0
    assert summary["node"]["exit_code"] == 0 and rnd["consolidator_exit_code"] == 0


@pytest.mark.ros
def test_round_summary_has_before_after_and_plots(round_demo):
    config, summary = round_demo
    on_disk = json.loads((config.out_dir / "summary.json").read_text())
    for phase in ("before", "after"):
        assert set(on_disk[phase]["activation"]["micro"]) == {"precision", "recall", "f1"}
        assert on_disk[phase]["anticipation"]["pattern"] == list(RULE.pattern)
        assert on_disk[phase]["matching"]["matched"] > 0
    assert on_disk["round"]["gate"]["passed"] is True
    assert on_disk["round"]["consolidator"]["gate_overrides"] == config.gate
    assert on_disk["knowledge_units"] == summary["knowledge_units"]
    assert "oracle" in on_disk["round"]["feedback"]["note"]
    for key in ("timeline_png", "before_after_png"):
        assert Path(on_disk[key]).read_bytes()[:8] == PNG_MAGIC
    for step in ("consolidate", "wait for swap", "play before", "play after"):
        assert on_disk["steps"][step] >= 0
    assert on_disk["total_s"] >= sum(on_disk["steps"].values()) - 1e-3
