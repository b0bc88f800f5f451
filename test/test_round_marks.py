"""Rounds after the first read what is new to the running bundle, plus a bounded reservoir."""

import logging
from dataclasses import replace

import consolidator_world as world
import pytest
import torch

from thinkmem_ros.consolidator.retrain import RetrainConfig
from thinkmem_ros.consolidator.round_marks import RoundMarks
from thinkmem_ros.consolidator.service import ConsolidatorConfig, ConsolidatorService
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.link.experience import encode_experience
from thinkmem_ros.link.security import write_signing_keypair


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def _store(path, robot, episodes, seed):
    records = [replace(e, seq=i) for i, e in
               enumerate(world.experiences(robot, episodes, 5, seed=seed))]
    with ExperienceStore(path) as store:
        store.insert_many([(e, encode_experience(e)) for e in records])
        return store.last_id()


def _service(tmp_path, **config):
    """A consolidator on ``tmp_path/c.db`` over the test world's running bundle."""
    from thinkmem_ros.consolidator.gate import GateConfig

    _, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    config.setdefault("gate", GateConfig(**world.JUDGE_SMALL))  # marks, not the gate's floors
    return ConsolidatorService(ConsolidatorConfig(
        db_path=tmp_path / "c.db", publish_dir=tmp_path / "pub", signing_key=key,
        initial_bundle=world.running_bundle(tmp_path / "running"),
        retrain=RetrainConfig(epochs=2, distill_margin=0.1), **config))


@pytest.mark.parametrize("incremental", [True, False])
def test_the_second_round_reads_the_new_rows_and_a_reservoir(tmp_path, incremental, caplog):
    db = tmp_path / "c.db"
    first_mark = _store(db, "r1", 40, seed=1)
    service = _service(tmp_path, round_reservoir=50, incremental_rounds=incremental)
    first = service.run_round("first")
    assert first.published_version == 2, first.to_dict()
    # the shipped bundle has no mark in this store: the first round reads every row
    horizon = first.read["histories"].pop("horizon")  # the default horizon holds them all
    assert horizon["episodes"] == 40 and horizon["left_out_episodes"] == 0
    assert first.read == {"since_id": 0, "through_id": first_mark, "new": 200,
                          "reservoir": 0, "histories": {"after_id": 0,
                                                        "through_id": first_mark,
                                                        "episodes": 40}}
    sha = service.publisher.current().manifest.extras["rehearsal"]["sha256"]
    with RoundMarks(db) as marks:
        assert marks.through(sha) == first_mark
    second_mark = _store(db, "r2", 20, seed=2)
    with caplog.at_level(logging.INFO, logger="thinkmem_ros.consolidator.service"):
        second = service.run_round("second")
    if incremental:
        assert {k: v for k, v in second.read.items() if k != "histories"} == {
            "since_id": first_mark, "through_id": second_mark, "new": 100, "reservoir": 50}
        assert second.experiences == 150
        assert f"(100 after row {first_mark} + 50 reservoir)" in caplog.text
    else:
        assert second.read["since_id"] == 0 and second.experiences == 300
        assert "(whole store)" in caplog.text
    assert second.stored_experiences == 300 and second.episodes == 60
    # discovery's histories carried from round to round however the rows are read
    assert second.read["histories"].pop("horizon")["episodes"] == 60
    assert second.read["histories"] == {"after_id": first_mark, "through_id": second_mark,
                                        "episodes": 20}
    assert "EA>EB>EC" in second.promoted
    assert second.published_version == 3, second.to_dict()
    split = [second.timings[f"discovery_{step}_s"] for step in ("scan", "checks", "redundancy")]
    assert all(s >= 0 for s in split) and split[1] > 0  # EA>EB>EC was checked
    assert sum(split) <= second.timings["discovery_s"] + 0.01
    sha = service.publisher.current().manifest.extras["rehearsal"]["sha256"]
    with RoundMarks(db) as marks:  # the mark moves with the published D
        assert marks.through(sha) == second_mark
        carried = marks.reservoir(sha, 50, 0)  # what a third round reads of the past
    assert carried is not None and 0 < sum(c[2] for c in carried.episodes) <= 50


def test_a_mark_belongs_to_one_rehearsal_set(tmp_path):
    with RoundMarks(tmp_path / "c.db") as marks:
        marks.record("a" * 64, 120, 2)
        marks.record("b" * 64, 480, 3)
        assert marks.through("a" * 64) == 120  # a rollback to v2 reads from v2's mark
        assert marks.through("b" * 64) == 480
        assert marks.through("c" * 64) == 0 and marks.through(None) == 0


def test_a_refused_round_leaves_the_mark_so_its_rows_are_read_again(tmp_path):
    from thinkmem_ros.consolidator.gate import GateConfig

    db = tmp_path / "c.db"
    first_mark = _store(db, "r1", 40, seed=1)
    service = _service(tmp_path, round_reservoir=0)
    assert service.run_round("first").published_version == 2
    _store(db, "r2", 10, seed=2)
    gate = service.config.gate
    service.config.gate = GateConfig(min_heldout=10**9)  # nothing can be judged: refused
    refused = service.run_round("refused")
    assert refused.published_version is None and refused.read["since_id"] == first_mark
    service.config.gate = gate
    third_mark = _store(db, "r3", 10, seed=3)
    third = service.run_round("third")
    third.read["histories"].pop("horizon")
    assert third.read == {"since_id": first_mark, "through_id": third_mark, "new": 100,
                          "reservoir": 0, "histories": {
                              "after_id": refused.read["histories"]["through_id"],
                              "through_id": third_mark, "episodes": 10}}


def test_a_marks_table_that_cannot_be_used_costs_speed_not_the_round(tmp_path, caplog):
    """A ``round_marks`` table of another shape (a real SQLite error, no mock): the round
    publishes, warns, and the next one reads the whole store."""
    import sqlite3

    db = tmp_path / "c.db"
    _store(db, "r1", 40, seed=1)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE round_marks (something_else TEXT)")
    service = _service(tmp_path)
    with caplog.at_level(logging.WARNING, logger="thinkmem_ros.consolidator.service"):
        first = service.run_round("first")
    assert first.published_version == 2, first.to_dict()
    assert "cannot record a round mark" in caplog.text
    _store(db, "r2", 10, seed=2)
    with caplog.at_level(logging.WARNING, logger="thinkmem_ros.consolidator.service"):
        second = service.run_round("second")
    assert "cannot read round marks" in caplog.text
    assert second.read["since_id"] == 0 and second.experiences == 250


def test_a_reservoir_is_carried_for_its_own_budget_and_seed(tmp_path):
    import sqlite3

    from thinkmem_ros.consolidator.round_marks import RoundMarkError
    from thinkmem_ros.consolidator.round_read import Reservoir

    kept = Reservoir((("r1", "e1", 4, 1, 9),), ("r2", "e2", 9, 3, 40))
    with RoundMarks(tmp_path / "c.db") as marks:
        marks.record("a" * 64, 120, 2, kept, budget=10, seed=0)
        marks.record("b" * 64, 130, 3)  # a mark without one
        assert marks.reservoir("a" * 64, 10, 0) == kept
        assert marks.reservoir("a" * 64, 20, 0) is None  # another budget chooses its own
        assert marks.reservoir("a" * 64, 10, 1) is None
        assert marks.reservoir("b" * 64, 10, 0) is None and marks.reservoir(None, 10, 0) is None
    with sqlite3.connect(tmp_path / "c.db") as conn:
        conn.execute("UPDATE round_marks SET reservoir = '{\"budget\": 10, \"seed\": 0, "
                     "\"reservoir\": 5}' WHERE through_id = 120")
    with RoundMarks(tmp_path / "c.db") as marks, \
            pytest.raises(RoundMarkError, match="damaged"):
        marks.reservoir("a" * 64, 10, 0)
    with sqlite3.connect(tmp_path / "c.db") as conn:  # a mark that is no row id
        conn.execute("UPDATE round_marks SET through_id = 'abc' WHERE through_id = 130")
    with RoundMarks(tmp_path / "c.db") as marks, \
            pytest.raises(RoundMarkError, match="damaged round mark"):
        marks.through("b" * 64)


def test_a_mark_past_the_stores_rows_reads_the_whole_store(tmp_path, caplog):
    """A mark no row reaches read nothing new, and the round learned from nothing."""
    import sqlite3

    db = tmp_path / "c.db"
    _store(db, "r1", 40, seed=1)
    service = _service(tmp_path, round_reservoir=0)
    assert service.run_round("first").published_version == 2
    _store(db, "r2", 10, seed=2)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE round_marks SET through_id = 1000000000")
    with caplog.at_level(logging.WARNING, logger="thinkmem_ros.consolidator.service"):
        second = service.run_round("second")
    assert "past the store's newest row" in caplog.text
    assert second.read["since_id"] == 0 and second.experiences == 250


def test_a_round_discovers_over_the_newest_episodes_within_its_horizon(tmp_path, caplog):
    """Forty long, recent episodes of one robot and forty older short ones of another: the
    round's discovery reads each robot's newest whole episodes within ``discovery_events``,
    shared fairly, and says what it left out."""
    from test_store import exp

    from thinkmem_ros.consolidator.scan_cost import MAX_HISTORY_COST

    db = tmp_path / "c.db"
    _store(db, "r1", 40, seed=1)
    with ExperienceStore(db) as store:
        store.insert_many([exp(k, robot="r9", episode=f"long{k:02d}", stamp=1e6 + k,
                               events=[f"E{j % 5}" for j in range(300)]) for k in range(40)])
        store.fold_histories()
        newest, horizon = store.histories_within(MAX_HISTORY_COST)
    # r1's 40 short episodes fit its half; r9 takes its newest long ones in what is left
    long = [r[1] for r in newest if r[0] == "r9"]
    assert long == [f"long{k:02d}" for k in range(39, 39 - len(long), -1)]
    assert 17 <= len(long) < 40 and horizon.cost <= MAX_HISTORY_COST
    assert (horizon.episodes, horizon.left_out, horizon.robots) == (40 + len(long),
                                                                    40 - len(long), 2)
    service = _service(tmp_path, discovery_events=MAX_HISTORY_COST)
    with caplog.at_level(logging.INFO, logger="thinkmem_ros.consolidator.service"):
        report = service.run_round("horizon")
    assert (f"{horizon.episodes} episodes ({horizon.left_out} left out beyond the "
            f"{MAX_HISTORY_COST:,}-event horizon)") in caplog.text
    assert report.episodes == horizon.episodes
    assert report.read["histories"]["horizon"] == {
        "max_events": MAX_HISTORY_COST, "episodes": horizon.episodes,
        "events": horizon.events, "scan_cost": horizon.cost, "robots": 2,
        "left_out_episodes": horizon.left_out}
    whole = _service(tmp_path / "whole", discovery_events=0)
    whole.config.db_path = db
    assert whole.run_round("whole").episodes == 80


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e7, True])
def test_a_horizon_that_is_no_whole_number_is_refused(tmp_path, value):
    """NaN passed every comparison and discovery then read nothing."""
    _, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    with pytest.raises(ValueError, match="discovery_events must be a whole number"):
        ConsolidatorConfig(db_path=tmp_path / "c.db", publish_dir=tmp_path / "pub",
                           signing_key=key, discovery_events=value)
