"""The discovery-only sweep: its loops run the real discovery and report what they promise."""

from __future__ import annotations

import json

import pytest

from thinkmem_ros.bench import discovery_sweep


def test_condition_sweep_reports_f1_and_false_relations_per_cell():
    out = discovery_sweep.condition_sweep(["sparse"], [8], 1)
    row = out["sparse.8"]
    assert 0.0 <= row["statistics_only"] <= 1.0 and 0.0 <= row["proposed"] <= 1.0
    assert row["false_relations"] >= 0 and len(row["proposed_per_seed"]) == 1
    assert row["statistics_only"] >= 0.5  # eight repetitions in the sparse world are found


def test_without_the_placement_check_the_phased_world_keeps_its_chance_triples():
    """``--no-placement`` really runs discovery without it: the phased world's first two
    seeds at 8 accept more chance triples of phase-bound codes then."""
    off = discovery_sweep.condition_sweep(["phased"], [8], 2, placement=False)["phased.8"]
    on = discovery_sweep.condition_sweep(["phased"], [8], 2)["phased.8"]
    assert off["false_relations"] > on["false_relations"]


def test_main_writes_json_and_refuses_bad_arguments(tmp_path, capsys):
    path = tmp_path / "sweep.json"
    assert discovery_sweep.main(["conditions", "--conditions", "zipf", "--reps", "8",
                                 "--seeds", "1", "--json", str(path)]) == 0
    assert "zipf.8" in json.loads(path.read_text())
    assert "zipf.8" in capsys.readouterr().out
    for bad in (["conditions", "--reps", "x"], ["rounds", "--seeds", "0"], ["nothing"]):
        with pytest.raises(SystemExit) as err:
            discovery_sweep.main(bad)
        assert err.value.code == 2


@pytest.mark.parametrize("argv, says", [
    (["conditions", "--conditions", "bogus"], "--conditions 'bogus': unknown ['bogus']"),
    (["conditions", "--conditions", ","], "--conditions ',': names none"),
    (["conditions", "--reps", "-5"], "--reps -5: must be in [1, 120]"),
    (["conditions", "--reps", "99999999999"], "--reps 99999999999: must be in [1, 120]"),
    (["conditions", "--reps", "40"], "do not fit in n_episodes=120"),
    (["conditions", "--reps", ","], "--reps ',' names no repetition count"),
    (["conditions", "--seeds", "1001"], "--seeds must be in [1, 1000]"),
    (["rounds", "--rounds", "101"], "--rounds must be in [1, 100]"),
    (["rounds", "--no-placement"], "--no-placement: not an option of the rounds loop"),
    (["conditions", "--rounds", "3"], "--rounds: not an option of the conditions loop"),
    (["conditions", "--json", "FOLDER"], "is a folder"),
    (["conditions", "--json", "OTHER"], "exists and is not a JSON report of this sweep"),
], ids=["unknown-condition", "no-condition", "negative-reps", "huge-reps", "reps-past-world",
        "no-reps", "seeds", "rounds", "no-placement-rounds", "rounds-conditions",
        "json-folder", "json-other-file"])
def test_bad_options_are_refused_in_one_line_before_anything_runs(tmp_path, capsys, argv,
                                                                  says):
    """Each was a traceback (some only after the whole run), an unbounded run, a silent
    overwrite, a run of nothing with exit 0, or an option the loop ignored."""
    other = tmp_path / "store.json"
    other.write_text('{"not": "a sweep"}')
    argv = [{"FOLDER": str(tmp_path), "OTHER": str(other)}.get(a, a) for a in argv]
    with pytest.raises(SystemExit) as err:
        discovery_sweep.main(argv)
    text = capsys.readouterr().err.strip()
    assert err.value.code == 2 and len(text.splitlines()) == 1, text
    assert says in text and "Traceback" not in text
    assert other.read_text() == '{"not": "a sweep"}'


def test_rounds_replay_times_each_round_and_compares_the_python_checks(capsys):
    rows = discovery_sweep.rounds_replay(0, rounds=2, compare_python=True)
    assert [row["round"] for row in rows] == [1, 2] and rows[1]["episodes"] == 96
    for row in rows:
        assert row["discovery_s"] > 0 and row["discovery_s_python_terms"] > 0
        assert row["same_relations"] is True
    # on this seed the first round's rule waits for round 2: its codes keep fixed phases
    # of every mission and C is in 33 of round 1's 48, so C's presence with A...B (Fisher
    # p 2.6e-3, twice that for the better of two tests) is no proof beyond what chance
    # sets of phased codes show (the placement check's presence-held branch)
    assert not rows[0]["planted"] and rows[1]["planted"]
    # this seed's rider (valve_stuck before the natural payload_change ... vibration_high,
    # first contrast 0.018) was promoted in rounds 1-2 before its first code's tries were
    # one family
    assert not rows[0]["spurious"] and not rows[1]["spurious"]
    with pytest.raises(SystemExit) as err:
        discovery_sweep.main(["rounds", "--rounds", "0"])
    assert err.value.code == 2 and "--rounds" in capsys.readouterr().err


def test_each_rounds_new_rule_is_promoted_in_its_own_round_on_a_running_clock():
    # the fleet's clock runs on, so round r's rule sits in the latest of the four periods;
    # it stands on its replication across the four robots (periods alone promoted round
    # 4's rule in round 5 and round 5's never, on this seed)
    rows = discovery_sweep.rounds_replay(1)
    assert [len(row["planted"]) for row in rows] == [1, 2, 3, 4, 5]
    assert not any(row["spurious"] for row in rows)
