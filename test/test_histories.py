"""Episode histories carried in the store, and discovery's log built from them.

Real SQLite and a real Parquet lake (rows flushed every few inserts, so episodes span the
lake and the tail); the carried answer is held equal to a scan of every row after each
batch, with records arriving out of order, and the columnar log to the one built event by
event.
"""

import sqlite3
from dataclasses import dataclass

import numpy as np
import pytest
from test_store import exp

from thinkmem_ros.consolidator.discovery import EventLog
from thinkmem_ros.consolidator.discovery_log import event_log, log_from_histories
from thinkmem_ros.consolidator.store import SCHEMA_VERSION, ExperienceStore


def _batches(rng: np.random.Generator, n_batches: int = 6, per: int = 9):
    """Batches of records over 3 robots and growing episodes, stamps sometimes older."""
    seq, batches = 0, []
    for b in range(n_batches):
        batch = []
        for _ in range(per):
            robot = f"r{rng.integers(3)}"
            episode = f"e{rng.integers(b // 2, b // 2 + 3)}"
            stamp = float(rng.integers(0, 100))  # a late record can be older than the last
            events = [f"E{rng.integers(6)}" for _ in range(rng.integers(0, 5))]
            batch.append(exp(seq, robot=robot, episode=episode, stamp=stamp, events=events))
            seq += 1
        batches.append(batch)
    return batches


@pytest.mark.parametrize("flush_rows", [0, 4])
def test_carried_histories_equal_a_scan_of_every_row(tmp_path, flush_rows):
    with ExperienceStore(tmp_path / "c.db", flush_rows=flush_rows) as store:
        for batch in _batches(np.random.default_rng(flush_rows)):
            store.insert_many(batch)
            before = store.last_id()
            folded = store.fold_histories()
            assert folded.through_id == before
            scanned = {(r[0], r[1]): (r[2], r[5]) for r in store.latest_histories()}
            assert {(r[0], r[1]): (r[2], r[3]) for r in store.histories()} == scanned
        again = store.fold_histories()  # nothing new: nothing read, nothing changed
        assert (again.after_id, again.through_id, again.episodes) == (before, before, 0)
        assert store.episode_events() == {k: v[1].split("\n") if v[1] else []
                                          for k, v in scanned.items()}


def test_a_fold_reads_only_the_rows_after_its_mark(tmp_path):
    with ExperienceStore(tmp_path / "c.db", flush_rows=0) as store:  # rows stay editable
        store.insert_many([exp(i, episode=f"e{i % 4}", events=["A"] * i) for i in range(12)])
        first = store.fold_histories()
        store.insert_many([exp(12, episode="e1", events=["B"])])
        second = store.fold_histories()
        assert (first.after_id, second.after_id, second.through_id) == (0, 12, 13)
        assert second.episodes == 1  # the one episode the new row touched
        # the rows before the mark are not read again: change one behind the store's back
        # (what a fold would then see if it scanned them) and the carried answer holds
        with sqlite3.connect(tmp_path / "c.db") as conn:
            conn.execute("UPDATE experiences SET events = 'Z' WHERE seq = 11")
        scan = {(r[0], r[1]): r[5] for r in store.latest_histories()}
        assert scan[("r1", "e3")] == "Z"
        store.insert_many([exp(13, episode="e0", events=["C"])])
        assert store.fold_histories().episodes == 1
        events = store.episode_events()
        assert events[("r1", "e3")] == ["A"] * 11 and events[("r1", "e0")] == ["C"]


def test_a_store_from_before_the_histories_folds_every_row_once(tmp_path):
    path = tmp_path / "old.db"
    with ExperienceStore(path, target_version=5, flush_rows=3) as old:
        old.insert_many([exp(i, episode=f"e{i % 2}", events=[f"E{i}"]) for i in range(7)])
    with ExperienceStore(path, flush_rows=3) as store:
        folded = store.fold_histories()
        assert (folded.after_id, folded.through_id, folded.episodes) == (0, 7, 2)
        assert store.episode_events() == {("r1", "e0"): ["E6"], ("r1", "e1"): ["E5"]}


@dataclass
class _Episode:
    episode_id: int
    partition: int
    events: list


def test_the_columnar_log_equals_the_one_built_event_by_event():
    rng = np.random.default_rng(3)
    names = ["zeta", "alpha", "E10", "E9", "é", "a b"]
    histories = [[names[k] for k in rng.integers(len(names), size=rng.integers(0, 9))]
                 for _ in range(40)]
    ids = rng.integers(1, 2 ** 62, size=40)
    got = log_from_histories(["\n".join(h) for h in histories], ids, partitions=4)
    want = EventLog.from_episodes(
        [_Episode(int(i), k * 4 // 40, [(float(t), e) for t, e in enumerate(h)])
         for k, (i, h) in enumerate(zip(ids, histories))])
    assert got.codes == want.codes
    for field in ("episode", "time", "code", "partition", "episode_ids"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), field)
    empty = log_from_histories(["", ""], np.array([1, 2]), 4)
    assert empty.code.size == 0 and empty.codes == () and empty.partition.tolist() == [0, 2]


def test_a_rounds_log_orders_episodes_by_first_stamp(tmp_path):
    with ExperienceStore(tmp_path / "c.db", flush_rows=2) as store:
        store.insert_many([exp(1, episode="late", stamp=50, events=["B"]),
                           exp(2, episode="early", stamp=5, events=["A"]),
                           exp(3, episode="late", stamp=60, events=["B", "C"]),
                           exp(4, robot="r2", episode="early", stamp=5, events=[])])
        log, names = event_log(store, partitions=2)
    order = [names[int(i)] for i in log.episode_ids]
    # r2's episode holds no events: nothing for discovery, so it is not read
    assert order == [("r1", "early"), ("r1", "late")]
    assert log.codes == ("A", "B", "C") and log.code.tolist() == [0, 1, 2]
    assert log.episode.tolist() == [0, 1, 1] and log.partition.tolist() == [0, 1]
    assert log.source.tolist() == [0, 0]  # each episode's robot, for stability


class _DiesOnSecondChunk:
    """The store's real connection, failing the second upsert chunk: a crash at that exact
    point between two transactions cannot be produced reliably with a real fault."""

    def __init__(self, conn):
        self._conn, self.chunks = conn, 0

    def executemany(self, sql, rows):
        self.chunks += 1
        if self.chunks == 2:
            raise sqlite3.OperationalError("injected: the process died here")
        return self._conn.executemany(sql, rows)

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def __enter__(self):
        return self._conn.__enter__()

    def __exit__(self, *exc):
        return self._conn.__exit__(*exc)


def test_a_fold_that_dies_between_chunks_keeps_its_mark_and_is_redone(tmp_path, monkeypatch):
    from thinkmem_ros.consolidator import histories

    monkeypatch.setattr(histories, "FOLD_CHUNK", 2)
    with ExperienceStore(tmp_path / "c.db", flush_rows=0) as store:
        store.insert_many([exp(i, episode=f"e{i % 5}", events=[f"E{i}"]) for i in range(10)])
        dying = _DiesOnSecondChunk(store._conn)
        with pytest.raises(sqlite3.OperationalError, match="injected"):
            histories.fold(dying, store.last_id(), store.latest_histories)
        assert histories.mark(store._conn) == 0  # the mark did not move
        assert len(store.histories()) == 2  # the first chunk's episodes are in
        assert store.fold_histories().episodes == 5  # the same rows folded again
        assert {(r[0], r[1]): r[3] for r in store.histories()} == {
            (r[0], r[1]): r[5] for r in store.latest_histories()}


def test_a_damaged_histories_table_costs_a_scan_not_the_round(tmp_path, caplog):
    from thinkmem_ros.consolidator.discovery_log import carried_histories, log_from_rows

    with ExperienceStore(tmp_path / "c.db", flush_rows=3) as store:
        store.insert_many([exp(i, episode=f"e{i % 3}", events=[f"E{i % 4}"] * (i + 1))
                           for i in range(9)])
        healthy, report = carried_histories(store)
        assert report == {"after_id": 0, "through_id": 9, "episodes": 3}
        with sqlite3.connect(tmp_path / "c.db") as other:  # a real fault, not a mock
            other.execute("DROP TABLE episode_histories")
        with caplog.at_level("WARNING"):
            scanned, report = carried_histories(store)
        assert "episode_histories" in report["error"]
        assert "this round scans every row's history" in caplog.text
        assert sorted(scanned) == sorted(healthy)
        want, _ = log_from_rows(healthy, 4)
        got, _ = log_from_rows(scanned, 4)
        np.testing.assert_array_equal(got.code, want.code)
        np.testing.assert_array_equal(got.episode_ids, want.episode_ids)


def test_folds_while_another_connection_writes_miss_and_double_nothing(tmp_path):
    """A receiver keeps inserting (and flushing to the lake) while rounds fold."""
    import threading

    batches = _batches(np.random.default_rng(11), n_batches=40, per=12)
    done, folding = threading.Event(), threading.Event()

    def receive():
        with ExperienceStore(tmp_path / "c.db", flush_rows=25) as writer:
            writer.insert_many(batches[0])
            folding.wait(10)  # the rest arrive while rounds fold
            for batch in batches[1:]:
                writer.insert_many(batch)
        done.set()

    thread = threading.Thread(target=receive)
    with ExperienceStore(tmp_path / "c.db", flush_rows=25) as store:
        thread.start()
        folds = 0
        while not done.is_set():
            store.fold_histories()
            folds += 1
            folding.set()
        thread.join()
        store.fold_histories()
        assert folds >= 1 and store.count() == sum(len(b) for b in batches)
        assert {(r[0], r[1]): (r[2], r[3]) for r in store.histories()} == {
            (r[0], r[1]): (r[2], r[5]) for r in store.latest_histories()}


@pytest.mark.parametrize("damage", [10**6, "abc", -3], ids=["ahead", "text", "negative"])
def test_a_mark_that_is_no_row_id_folds_every_row_again(tmp_path, caplog, damage):
    """A mark ahead of the rows left every later episode out of discovery, silently."""
    with ExperienceStore(tmp_path / "c.db", flush_rows=0) as store:
        store.insert_many([exp(i, episode=f"e{i % 4}", events=[f"E{i}"]) for i in range(8)])
        store.fold_histories()
        store.insert_many([exp(8, episode="e9", events=["N"])])
        with store._conn:
            store._conn.execute("UPDATE histories_mark SET through_id = ?", (damage,))
        with caplog.at_level("WARNING"):
            folded = store.fold_histories()
        assert "not a row id of this store" in caplog.text
        assert (folded.after_id, folded.through_id) == (0, 9)
        assert store.episode_events()[("r1", "e9")] == ["N"]
        assert {(r[0], r[1]): r[3] for r in store.histories()} == {
            (r[0], r[1]): r[5] for r in store.latest_histories()}


def _episodes_of(store, sizes: dict[str, int], start: int = 0) -> None:
    """One record per episode: episode ``eK`` starts at stamp K and holds ``sizes`` events."""
    store.insert_many([exp(start + i, episode=name, stamp=float(name[1:]),
                           events=[f"E{j % 7}" for j in range(n)])
                       for i, (name, n) in enumerate(sizes.items())])


def test_the_horizon_reads_the_newest_whole_episodes_and_stops(tmp_path):
    sizes = {"e1": 5, "e2": 9, "e3": 0, "e4": 4, "e5": 6, "e6": 3}
    with ExperienceStore(tmp_path / "c.db", flush_rows=4) as store:
        _episodes_of(store, sizes)
        store.fold_histories()
        rows, horizon = store.histories_within(13)
        # newest first: e6 (3), e5 (6), e4 (4) = 13; e3 holds nothing for discovery and is
        # not read; e2's 9 do not fit, and the older e1 (5) is not read in its place
        assert [r[1] for r in rows] == ["e6", "e5", "e4"]
        assert (horizon.episodes, horizon.events, horizon.left_out) == (3, 13, 2)
        assert horizon.robots == 1
        assert [len(r[3].split("\n")) for r in rows] == [3, 6, 4]
        every, whole = store.histories_within(0)
        assert sorted(r[1] for r in every) == sorted(set(sizes) - {"e3"})
        assert whole.left_out == 0
        assert whole.events == sum(sizes.values())
        # the in-memory answer (a histories table that cannot be read) is the same one
        from thinkmem_ros.consolidator.histories import newest_within
        scanned = [(r[0], r[1], r[2], r[5]) for r in store.latest_histories()]
        again, same = newest_within(scanned, 13)
        assert again == rows and same == horizon


def test_the_horizon_reads_an_index_not_every_history(tmp_path):
    """Also on a store of the schema before the index: opening it adds the counts."""
    from thinkmem_ros.consolidator import histories

    with ExperienceStore(tmp_path / "c.db", target_version=7) as old:
        _episodes_of(old, {"e1": 3, "e2": 4})
        with old._conn:  # folded as schema 7 folded them: no event counts
            old._conn.executemany(
                "INSERT INTO episode_histories VALUES (?, ?, ?, ?, ?, ?)",
                [("r1", "e1", 1.0, 1.0, 0, "E0\nE1\nE2"),
                 ("r1", "e2", 2.0, 2.0, 1, "E0\nE1\nE2\nE3")])
            old._conn.execute("INSERT INTO histories_mark VALUES (1, 2)")
    with ExperienceStore(tmp_path / "c.db") as store:
        plans = [" ".join(str(r) for r in store._conn.execute(
            "EXPLAIN QUERY PLAN " + sql, ("r1",) + extra).fetchall())
            for sql, extra in ((histories._SIZES_SQL, (5,)), (histories._NEWEST_SQL, (5,)),
                               (histories._SIZES_AFTER_SQL, (1.0, "e1", 5)))]
        assert [r[1] for r in store.histories_within(4)[0]] == ["e2"]
        _episodes_of(store, {"e3": 2}, start=10)  # counted as it is folded in
        store.fold_histories()
        assert [r[1] for r in store.histories_within(6)[0]] == ["e3", "e2"]
    assert "COVERING INDEX episode_histories_newest" in plans[0], plans
    assert "COVERING INDEX episode_histories_newest" in plans[2], plans
    assert "episode_histories_newest" in plans[1] and "TEMP B-TREE" not in " ".join(plans)


def test_a_robot_that_floods_new_episodes_cannot_push_the_others_out(tmp_path):
    """Newest over the whole fleet would read only the flood (its stamps are its own);
    shared per robot, each robot with less than an equal share keeps all of its episodes
    and the flood gets what is left."""
    with ExperienceStore(tmp_path / "c.db") as store:
        batch = [exp(i, robot="r1", episode=f"a{i}", stamp=float(i), events=["A"] * 10)
                 for i in range(5)]
        batch += [exp(i, robot="r2", episode=f"b{i}", stamp=float(i), events=["B"] * 30)
                  for i in range(20)]
        batch += [exp(i, robot="zz", episode=f"f{i}", stamp=1e9 + i, events=["F"] * 50)
                  for i in range(100)]
        store.insert_many(batch)
        store.fold_histories()
        rows, horizon = store.histories_within(600)
    by_robot = {robot: [r[1] for r in rows if r[0] == robot] for robot in ("r1", "r2", "zz")}
    # three shares of 200: r1 needs 50 (all 5); r2 and zz share the other 550 in whole
    # episodes (zz's 6th of 50 no longer fits once r2 has 270, so r2 takes the last 30)
    assert by_robot["r1"] == [f"a{i}" for i in range(4, -1, -1)]
    assert by_robot["r2"] == [f"b{i}" for i in range(19, 9, -1)]  # 10 x 30 = 300
    assert by_robot["zz"] == [f"f{i}" for i in range(99, 94, -1)]  # 5 x 50 = 250
    assert (horizon.events, horizon.robots, horizon.left_out) == (600, 3, 125 - 20)


def test_fair_counts_shares_max_min_and_reads_no_further_than_it_needs():
    from thinkmem_ros.consolidator.histories import fair_counts

    read = []

    def sizes(robot, values):
        for v in values:
            read.append(robot)
            yield v

    counts = fair_counts({"a": sizes("a", [5] * 100), "b": sizes("b", [1, 1]),
                          "c": sizes("c", [40, 1])}, 30)
    # shares of 10: b takes its 2; c's 40 never fits; a takes 2 of 5, then 5 more in the
    # passes that share what b and c left (28 of 30 events in all)
    assert counts == {"a": 5, "b": 2, "c": 0}
    assert read.count("a") == 6 and read.count("c") == 1
    assert fair_counts({"a": iter([3, 3])}, 0) == {"a": 0}
    assert fair_counts({}, 10) == {}


def test_discovery_reads_its_horizon_and_reports_what_it_left_out(tmp_path):
    from thinkmem_ros.consolidator.discovery_log import carried_histories, log_from_rows

    with ExperienceStore(tmp_path / "c.db") as store:
        _episodes_of(store, {f"e{k}": 600 for k in range(1, 5)})
        rows, report = carried_histories(store, 1200)
        assert [r[1] for r in rows] == ["e4", "e3"]
        assert report["horizon"] == {"max_events": 1200, "episodes": 2, "events": 1200,
                                     "scan_cost": 1200, "robots": 1, "left_out_episodes": 2}
        log, _ = log_from_rows(rows, 2)
        assert int(log.code.size) == 1200
        assert "horizon" not in carried_histories(store, 0)[1]


def test_episodes_without_events_are_not_read_into_the_horizon(tmp_path):
    """They cost no events of the budget: a robot sending thousands of them had every one
    read into the round."""
    with ExperienceStore(tmp_path / "c.db") as store:
        store.insert_many([exp(i, robot="zz", episode=f"z{i}", stamp=1e9 + i)
                           for i in range(3000)] + [exp(0, episode="a", events=["A"] * 4)])
        store.fold_histories()
        rows, horizon = store.histories_within(2000)
    assert [(r[0], r[1]) for r in rows] == [("r1", "a")]
    assert (horizon.episodes, horizon.events, horizon.left_out) == (1, 4, 0)


def test_dense_episodes_are_charged_what_they_cost_the_scan(tmp_path):
    """Counted by events, a robot of episodes over 64 distinct names took its equal share
    of events at ten times the scan's cost per event; counted by cost, its share of the
    round's time is equal too."""
    dense = [f"D{j % 64}" for j in range(640)]  # 640 events over 64 names: 6,554
    with ExperienceStore(tmp_path / "c.db") as store:
        store.insert_many([exp(i, robot="dd", episode=f"d{i}", stamp=1e9 + i, events=dense)
                           for i in range(6)] +
                          [exp(10 + i, robot="r1", episode=f"h{i}", stamp=float(i),
                               events=[f"E{j % 20}" for j in range(640)]) for i in range(30)])
        store.fold_histories()
        rows, horizon = store.histories_within(20_000)
    got = {robot: sum(1 for r in rows if r[0] == robot) for robot in ("dd", "r1")}
    # two shares of 10,000: dd's episodes cost 6,554 each (by events it would have had
    # 15 of them, 640 each), so it gets one and r1 the rest (21 x 640 = 13,440)
    assert got == {"dd": 1, "r1": 21}
    assert horizon.cost == 6554 + 21 * 640 and horizon.events == 22 * 640


def test_a_historys_cost_is_what_the_scan_charges_it():
    from thinkmem_ros.consolidator.discovery import DiscoveryConfig, EventLog
    from thinkmem_ros.consolidator.discovery.density import scan_weights
    from thinkmem_ros.consolidator.scan_cost import history_cost

    rng = np.random.default_rng(3)
    texts = ["\n".join(f"N{k}" for k in rng.integers(0, width, size=n))
             for n, width in ((5, 3), (20, 20), (300, 40), (1024, 64), (700, 30), (90, 64))]
    log = log_from_histories(texts, np.arange(len(texts)), 1)
    charged = np.ceil(scan_weights(log, DiscoveryConfig()))
    assert [history_cost(t) for t in texts] == charged.astype(int).tolist()
    assert isinstance(log, EventLog)


def test_fair_counts_serves_every_robot_before_any_twice_and_wastes_nothing():
    """Equal shares per pass starved a robot whose next episode was larger than a share:
    five robots, 4,096 events, episodes of 1,000 and 900 gave one robot four of its own
    and the rest none; one robot of 1-event episodes took a whole budget."""
    from thinkmem_ros.consolidator.histories import fair_counts

    sizes = {"a": [1000] * 9, "b": [900] * 9, "c": [900] * 9, "d": [900] * 9, "e": [900] * 9}
    assert fair_counts({r: iter(v) for r, v in sizes.items()}, 4096) == {
        "a": 0, "b": 1, "c": 1, "d": 1, "e": 1}  # four served, smaller episodes first
    flood = {"flood": iter([1] * 100_000), **{f"r{k}": iter([100] * 50) for k in range(9)}}
    got = fair_counts(flood, 10_000)
    assert got["flood"] == 1000 and all(got[f"r{k}"] == 10 for k in range(9))
    rng = np.random.default_rng(5)
    for _ in range(2000):
        robots = {f"r{k}": rng.integers(1, 60, size=rng.integers(0, 6)).tolist()
                  for k in range(rng.integers(1, 5))}
        budget = int(rng.integers(1, 200))
        counts = fair_counts({r: iter(v) for r, v in robots.items()}, budget)
        given = {r: sum(v[:counts[r]]) for r, v in robots.items()}
        left = budget - sum(given.values())
        assert left >= 0
        for r, v in robots.items():
            assert counts[r] == len(v) or v[counts[r]] > left  # nothing that fits is left
        # a robot given nothing: when its turn came (before any robot's second, after
        # the smaller firsts and some equal ones), its first episode did not fit
        for r, v in robots.items():
            if v and counts[r] == 0:
                taken_before = sum(robots[o][0] for o in robots
                                   if o != r and counts[o] and robots[o][0] <= v[0])
                assert v[0] > budget - taken_before, (robots, budget, counts)


def test_thousands_of_robots_are_read_without_a_cursor_each(tmp_path):
    with ExperienceStore(tmp_path / "c.db") as store:
        store.insert_many([exp(i, robot=f"r{i:05d}", episode="e", stamp=float(i),
                               events=["A", "B"]) for i in range(5000)])
        store.fold_histories()
        rows, horizon = store.histories_within(20_000)
    assert horizon.robots == 5000 and horizon.episodes == 5000 and horizon.left_out == 0


def test_a_robots_sizes_are_read_page_by_page_in_order(tmp_path):
    from thinkmem_ros.consolidator.histories import _sizes

    with ExperienceStore(tmp_path / "c.db") as store:
        store.insert_many([exp(i, episode=f"e{i:04d}", stamp=float(i // 3),
                               events=["A"] * (1 + i % 7)) for i in range(1000)])
        store.fold_histories()
        got = list(_sizes(store._conn, "r1"))
    order = sorted(range(1000), key=lambda i: (i // 3, f"e{i:04d}"), reverse=True)
    assert got == [1 + i % 7 for i in order]


@pytest.mark.parametrize("variant", ["first-stamp index", "event counts", "scan costs"])
def test_every_schema_8_this_project_wrote_upgrades_to_the_horizon(tmp_path, variant):
    """Schema 8 changed shape twice on its first day (an index on the first stamp, then
    event counts, then scan costs): migration 9 rebuilds the table from its base columns,
    so a store left at any of them gets the same table. Counts come out right, names of
    any characters included."""
    import time as _time

    steps = {"first-stamp index": [
        "CREATE INDEX episode_histories_first ON episode_histories"
        " (first_stamp, robot_id, episode_id)"],
        "event counts": [
            "ALTER TABLE episode_histories ADD COLUMN n_events INTEGER NOT NULL DEFAULT 0",
            "CREATE INDEX episode_histories_newest ON episode_histories"
            " (robot_id, first_stamp, episode_id, n_events)"],
        "scan costs": [
            "ALTER TABLE episode_histories ADD COLUMN n_events INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE episode_histories ADD COLUMN scan_cost INTEGER NOT NULL DEFAULT 0",
            "CREATE INDEX episode_histories_newest ON episode_histories"
            " (robot_id, first_stamp, episode_id, scan_cost)"]}[variant]
    histories_then = {"e1": "A\nB\nC", "e2": "", "e3": "ü\n日本\u2028x\nA", "e4": "A"}
    with ExperienceStore(tmp_path / "c.db", target_version=7) as old:
        with old._conn:
            old._conn.executemany(
                "INSERT INTO episode_histories VALUES (?, ?, ?, ?, ?, ?)",
                [("r1", ep, float(k), float(k), k, text)
                 for k, (ep, text) in enumerate(histories_then.items())])
            old._conn.execute("INSERT INTO histories_mark VALUES (1, 0)")
            for statement in steps:
                old._conn.execute(statement)
            old._conn.execute("INSERT INTO schema_version VALUES (8, ?)", (_time.time(),))
    with ExperienceStore(tmp_path / "c.db") as store:
        assert store.schema_version == SCHEMA_VERSION
        got = dict(store._conn.execute(
            "SELECT episode_id, n_events || ',' || scan_cost FROM episode_histories"))
        rows, horizon = store.histories_within(5)
        indexes = {r[0] for r in store._conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'episode%'")}
    assert got == {"e1": "3,3", "e2": "0,0", "e3": "3,3", "e4": "1,1"}
    assert [r[1] for r in rows] == ["e4", "e3"] and horizon.events == 4
    assert indexes == {"episode_histories_newest"}


def test_among_equals_a_different_robot_misses_out_each_round():
    """Ties went to the robot named first: with the budget short of equal robots, the
    robots whose ids sort last were never read, round after round."""
    from thinkmem_ros.consolidator.histories import fair_counts

    missed = set()
    for turn in range(20):
        counts = fair_counts({f"r{k}": iter([10]) for k in range(4)}, 30, turn)
        assert sorted(counts.values()) == [0, 1, 1, 1]
        missed |= {r for r, n in counts.items() if n == 0}
    assert len(missed) >= 3


def test_a_damaged_histories_table_shares_the_horizon_as_the_table_would(tmp_path):
    """The in-memory fallback broke full ties with turn 0: the same robots missed out
    of every round the histories table could not be read."""
    from thinkmem_ros.consolidator.discovery_log import carried_histories

    chosen = []
    with ExperienceStore(tmp_path / "c.db") as store:
        for turn in range(8):  # a round: one equal episode per robot, 3 of 5 fit
            store.insert_many([exp(100 * turn + k, robot=f"r{k}", episode=f"t{turn}",
                                   stamp=float(turn), events=["A", "B"]) for k in range(5)])
            healthy, _ = carried_histories(store, max_events=6)
            chosen.append(sorted(r[0] for r in healthy))
        with sqlite3.connect(tmp_path / "c.db") as other:  # a real fault, not a mock
            other.execute("DROP TABLE episode_histories")
        scanned, report = carried_histories(store, max_events=6)
    assert "error" in report
    assert sorted(r[0] for r in scanned) == chosen[-1]
    assert len({tuple(c) for c in chosen}) > 1  # equal robots take turns

