"""``thinkmem bench rounds`` end to end at a toy size: real store, real rounds, real scoring.

Why: the benchmark's full run takes most of an hour; this runs its own code path (robots
driving planted streams through the node's replay, experiences stored in SQLite, a real
``ConsolidatorService`` round with signed publication, scoring on fixed streams) small
enough for CI, and checks the pinned keys and what they must mean.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from thinkmem_ros.bench import rounds

TOY = {"robots": 2, "rounds": 2, "robot_s": 96.0, "missions": 8, "eval_streams": 1,
       "eval_s": 60.0, "eval_missions": 5, "epochs": 1, "ship_every": 5}


@pytest.fixture(scope="module")
def fleet():
    return rounds.run_fleet(TOY, seed=0)


def test_rows_cover_round_zero_and_every_round(fleet):
    rows = fleet["rows"]
    assert [row["round"] for row in rows] == [0, 1, 2]
    assert fleet["planted"] == [">".join(r.pattern) for r in rounds.RULES[:2]]
    # the shipped bundle on the fixed streams: the default bundle's base skills
    assert rows[0]["base_micro_f1"] > 0.9
    # every round's drive adds its own episodes: the store's history grows round on round
    # (robots numbering their episodes afresh each round would overwrite the last round's)
    assert rows[2]["store_episodes"] >= 2 * rows[1]["store_episodes"] - 2
    for row in rows[1:]:
        assert row["experiences_shipped"] > 0
        assert 0.0 <= row["false_fire_rate"] <= 1.0
        if row["published"]:
            # what a published round ships: rules, values and memory-control artefacts
            assert set(row["artefacts"]) >= {"rules", "values", "memctl"}
    # round 1 runs on the shipped bundle (no mark in this store): it reads every row
    assert rows[1]["read"]["since_id"] == 0 and rows[1]["read"]["reservoir"] == 0
    assert rows[1]["read"]["new"] == rows[1]["experiences_shipped"]
    if rows[1]["published"]:  # round 2 reads the new rows and a reservoir of older ones
        assert rows[2]["read"]["since_id"] == rows[1]["read"]["through_id"] > 0
        assert rows[2]["read"]["new"] == rows[2]["experiences_shipped"]
    # discovery's histories: round 1 folds every row, round 2 only the rows after it
    first, second = rows[1]["read"]["histories"], rows[2]["read"]["histories"]
    assert first["after_id"] == 0 and first["episodes"] == rows[1]["store_episodes"]
    assert second["after_id"] == first["through_id"] > 0
    assert 0 < second["episodes"] < rows[2]["store_episodes"]


def test_summary_has_every_pinned_key_with_its_meaning(fleet):
    results = rounds.summarise([fleet])
    for key in ("base_f1_by_round", "min_base_f1_delta", "rule_recall_final",
                "spurious_promoted", "anticipation_frame_recall", "false_fire_rate",
                "rounds_published", "artefacts_attached"):
        assert key in results
    f1 = results["base_f1_by_round"]
    assert len(f1) == 3
    assert results["min_base_f1_delta"] == pytest.approx(min(f1[1:]) - f1[0], abs=1e-3)
    assert 0.0 <= results["rule_recall_final"] <= 1.0
    assert 0 <= results["rounds_published"] <= 2
    assert len(results["round_s_by_round"]) == len(results["experiences_read_by_round"]) == 2
    json.dumps(results)  # JSON-ready


def test_a_later_drive_is_stamped_after_the_earlier_ones():
    # a real fleet's clock runs on: round r's drive must land after round r-1's in the
    # store, or the consolidator's temporal partitions would mix rounds by mission phase
    from thinkmem_ros.core.paths import default_bundle

    rng = np.random.default_rng(3)
    stream, missions = rounds.planted_stream(24.0, rounds.round_plan(1, 2, rng), rng)
    first = rounds.robot_experiences(default_bundle(), stream, missions, "r", 10)
    later = rounds.robot_experiences(default_bundle(), stream, missions, "r", 10,
                                     clock_s=500.0)
    assert len(first) == len(later) > 0
    for a, b in zip(first, later, strict=True):
        assert b.stamp == pytest.approx(a.stamp + 500.0)
        assert (a.episode_id, a.events, a.seq) == (b.episode_id, b.events, b.seq)


def test_classify_unit_tells_planted_natural_and_spurious():
    assert rounds.classify_unit("valve_stuck>pressure_spike>pump_trip") == "planted"
    assert rounds.classify_unit("robot_stop>robot_start") == "natural"
    assert rounds.classify_unit("pressure_spike>payload_change>vibration_normal") == "spurious"
    assert rounds.classify_unit("valve_stuck>pump_trip") == "planted_part"
    assert rounds.classify_unit("pump_trip>valve_stuck") == "spurious"  # out of order
    assert rounds.classify_unit("valve_stuck>lidar_degraded") == "spurious"  # two rules
