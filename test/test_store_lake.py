"""The store's Parquet lake: same answers wherever a row lives, exactly once, crash-safe.

Real SQLite, real Parquet files written by pyarrow, real DuckDB queries; no mocks. The
crash cases use real faults: a partition folder that cannot be created (a file sits where
the folder should be) and a leftover file a crash would leave.
"""

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest
from test_store import exp

from thinkmem_ros.consolidator.lake import OWNER_FILE
from thinkmem_ros.consolidator.store import ExperienceStore, StoreError
from thinkmem_ros.link.experience import encode_experience


def _history():
    """Rows over two robots, episodes that span the flush, feedback on some, two fingerprints."""
    rows = []
    for i in range(30):
        robot = "r1" if i % 3 else "robot:2.b"  # ":" is quoted in the path
        e, payload = exp(i, robot=robot, episode=f"e{i // 7}", stamp=100 - i if i % 5 else i,
                         events=[f"ev{i % 4}", f"ev{i % 6}"], reward=(0.5 if i % 4 == 0 else None))
        if i % 2:
            e.signal_set = "ab" * 32
            payload = encode_experience(e)
        rows.append((e, payload))
    return rows


def _answers(store):
    return {
        "count": (store.count(), store.count("r1"), store.count("robot:2.b")),
        "last_id": store.last_id(),
        "seqs": (store.seqs("r1"), store.seqs("robot:2.b")),
        "get": (store.get("r1", 4).seq, store.get("robot:2.b", 3).seq, store.get("r1", 3)),
        "episodes": store.episodes(), "episodes_r1": store.episodes("r1"),
        "iter": [(i, e.seq) for i, e in store.iter_experiences()],
        "iter_after": [(i, e.seq) for i, e in store.iter_experiences(after_id=9, limit=8)],
        "iter_filtered": [e.seq for _, e in store.iter_experiences(robot_id="r1",
                                                                  episode_id="e2")],
        "iter_signal": [e.seq for _, e in store.iter_experiences(signal_set="ab" * 32)],
        "all": [e.seq for e in store.iter_all(after_id=5, page=4)],
        "episode": [e.seq for e in store.episode_experiences("r1", "e1")],
        "events": store.episode_events(),
        "signal_sets": store.signal_sets(),
        "rewards": store.rewards(),
    }


def test_every_query_answers_the_same_from_tail_lake_or_both(tmp_path):
    rows = _history()
    with ExperienceStore(tmp_path / "tail.db", flush_rows=0) as tail_only:
        tail_only.insert_many(rows[:17])
        tail_only.insert_many(rows[17:])
        expected = _answers(tail_only)
        assert not tail_only.lake_dir.exists()
    with ExperienceStore(tmp_path / "split.db", flush_rows=0) as split:
        split.insert_many(rows[:17])
        assert split.flush(chunk=6) == 17  # three chunks, several files each
        split.insert_many(rows[17:])
        assert _answers(split) == expected
        assert split.flush() == 13
        assert _answers(split) == expected
        assert split._conn.execute("SELECT COUNT(*) FROM experiences").fetchone()[0] == 0


def test_a_store_named_through_a_symlink_reads_and_writes_its_own_lake(tmp_path, caplog):
    """Through ``links/alias.db -> ../c.db`` the store looked for ``links/alias.lake``: a
    round read none of the flushed rows and warned that every listed file was unreadable."""
    rows = _history()
    with ExperienceStore(tmp_path / "c.db", flush_rows=0) as store:
        store.insert_many(rows[:17])
        store.flush()
        store.insert_many(rows[17:])
        expected = _answers(store)
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / "alias.db"
    link.symlink_to(Path("..") / "c.db")
    with caplog.at_level("WARNING"), ExperienceStore(link, flush_rows=0) as store:
        assert store.lake_dir == tmp_path / "c.lake"
        assert _answers(store) == expected
        assert store.flush() == 13  # into the store's own lake
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    assert not (tmp_path / "links" / "alias.lake").exists()
    with ExperienceStore(tmp_path / "c.db", flush_rows=0) as store:
        assert _answers(store) == expected


def test_flushed_keys_stay_exactly_once(tmp_path):
    with ExperienceStore(tmp_path / "x.db", flush_rows=0) as store:
        assert store.insert_many([exp(1), exp(2)]) == (2, 0)
        store.flush()
        assert store.insert_many([exp(2), exp(3), exp(1, robot="r2")]) == (2, 1)
        store.flush()
        assert store.insert_many([exp(1), exp(3), exp(1, robot="r2")]) == (0, 3)
        assert store.count() == 4 and store.seqs("r1") == [1, 2, 3]
        ids = [i for i, _ in store.iter_experiences()]
        assert ids == sorted(ids) and len(set(ids)) == 4


def test_the_tail_moves_to_the_lake_when_full(tmp_path):
    with ExperienceStore(tmp_path / "x.db", flush_rows=10) as store:
        for start in range(0, 25, 5):
            store.insert_many([exp(i) for i in range(start, start + 5)])
        tail = store._conn.execute("SELECT COUNT(*) FROM experiences").fetchone()[0]
        assert tail == 5 and store.count() == 25  # flushed at 10 and at 20
        assert [e.seq for e in store.iter_all()] == list(range(25))


def test_the_lake_is_hive_partitioned_parquet_any_engine_reads(tmp_path):
    with ExperienceStore(tmp_path / "fleet.db", flush_rows=0) as store:
        store.insert_many(_history())
        store.flush()
        lake = store.lake_dir
    assert lake == tmp_path / "fleet.lake"
    robots = sorted(p.name for p in lake.iterdir())
    assert robots == [OWNER_FILE, "robot=r1", "robot=robot%3A2.b"]  # and whose lake it is
    days = {p.name for p in lake.glob("robot=*/day=*")}
    assert len(days) == 1 and next(iter(days)).startswith("day=20")
    con = duckdb.connect()
    got = con.execute("SELECT robot, COUNT(*) FROM read_parquet(?, hive_partitioning = true)"
                      " GROUP BY robot ORDER BY robot",
                      [str(lake / "**" / "*.parquet")]).fetchall()
    assert got == [("r1", 20), ("robot:2.b", 10)]  # the engine decodes the quoting


def test_a_failed_flush_keeps_the_tail_and_leaves_no_listed_file(tmp_path):
    with ExperienceStore(tmp_path / "x.db", flush_rows=0) as store:
        store.insert_many([exp(1), exp(2, robot="r2"), exp(3, robot="r3")])
        day = time.strftime("%Y-%m-%d", time.gmtime())
        blocker = store.lake_dir / "robot=r3" / f"day={day}" / "part-3-3.parquet"
        blocker.mkdir(parents=True)  # a folder where r3's file must go: a real rename fault
        before = _answers_small(store)
        with pytest.raises(StoreError, match="flush to .* failed"):
            store.flush()
        assert store._conn.execute("SELECT COUNT(*) FROM lake_files").fetchone()[0] == 0
        files = [p for p in store.lake_dir.rglob("*") if p.is_file() and p.name != OWNER_FILE]
        assert files == []  # r1's and r2's files went too, and r3's temporary one
        assert _answers_small(store) == before
        blocker.rmdir()
        assert store.flush() == 3
        assert _answers_small(store) == before


def _answers_small(store):
    return (store.count(), [e.seq for e in store.iter_all()], store.episode_events())


def test_files_a_crash_left_unlisted_are_never_read_and_are_swept(tmp_path):
    with ExperienceStore(tmp_path / "x.db", flush_rows=0) as store:
        store.insert_many([exp(1)])
        store.flush()
        listed = next(store.lake_dir.rglob("*.parquet"))
        stray = listed.with_name("part-900-901.parquet")  # a flush that never committed
        stray.write_bytes(listed.read_bytes())
        (listed.parent / ".part-5-6.parquet.abc.tmp").write_bytes(b"half")
        assert store.count() == 1 and [e.seq for e in store.iter_all()] == [1]
        store.insert_many([exp(2)])
        store.flush()
        assert not stray.exists() and not list(store.lake_dir.rglob("*.tmp"))
        assert [e.seq for e in store.iter_all()] == [1, 2]


def test_two_writers_flushing_one_store_store_each_key_once(tmp_path):
    path = tmp_path / "shared.db"
    ExperienceStore(path).close()

    def writer(offset):
        with ExperienceStore(path, flush_rows=7) as store:
            for start in range(0, 60, 5):  # overlapping keys: both send 20..59
                store.insert_many([exp(i) for i in range(start + offset, start + offset + 5)])

    threads = [threading.Thread(target=writer, args=(k,)) for k in (0, 20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with ExperienceStore(path) as store:
        assert store.seqs("r1") == list(range(80))
        assert store.count() == 80
        files = store._conn.execute("SELECT COUNT(*) FROM lake_files").fetchone()[0]
        assert files > 0


def test_a_store_from_before_the_lake_opens_and_flushes(tmp_path):
    path = tmp_path / "old.db"
    with ExperienceStore(path, target_version=3) as old:
        with old._conn:
            old._conn.execute(
                "INSERT INTO experiences (robot_id, seq, episode_id, stamp, bundle_version,"
                " payload, events, reward, received_at, signal_set) VALUES"
                " (?, ?, ?, ?, ?, ?, 'a', NULL, 0, '')", ("r1", 5, "e1", 5.0, 1, exp(5)[1]))
    with ExperienceStore(path, flush_rows=0) as store:
        assert store.flush() == 1
        assert store.insert_many([exp(5)]) == (0, 1)
        assert store.get("r1", 5).seq == 5 and store.episode_events() == {("r1", "e1"): ["a"]}
        assert store.lake_dir.joinpath("robot=r1", "day=1970-01-01").is_dir()


def test_a_receiver_killed_mid_flush_loses_and_duplicates_nothing(tmp_path):
    """A real process is killed while it flushes; the store is whole when reopened."""
    path = tmp_path / "k.db"
    script = (
        "import sys; from test_store import exp\n"
        "from thinkmem_ros.consolidator.store import ExperienceStore\n"
        "s = ExperienceStore(sys.argv[1], flush_rows=0)\n"
        "s.insert_many([exp(i, robot=f'r{i % 50}') for i in range(20000)])\n"
        "print('ready', flush=True)\n"
        "s.flush(chunk=500)\n"
        "print('done', flush=True)\n")
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}
    proc = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)  # somewhere inside the chunked flush
    proc.kill()
    proc.wait()
    with ExperienceStore(path, flush_rows=0) as store:
        assert store.count() == 20000
        store.flush()
        assert store.count() == 20000
        assert sorted(store.seqs("r7")) == list(range(7, 20000, 50))
        with sqlite3.connect(path) as conn:
            keys = conn.execute("SELECT COUNT(*) FROM flushed_keys").fetchone()[0]
        assert keys == 20000
        listed = {r[0] for r in store._conn.execute("SELECT path FROM lake_files")}
        on_disk = {str(p.relative_to(store.lake_dir)) for p in store.lake_dir.rglob("*")
                   if p.is_file() and p.name != OWNER_FILE}
        assert on_disk == listed


@pytest.mark.parametrize("damage", ["truncated", "deleted", "foreign"])
def test_a_damaged_lake_file_is_left_out_of_reads_and_named(tmp_path, caplog, damage):
    """One bad file stopped every round for good: its rows are left out, the rest is read."""
    with ExperienceStore(tmp_path / "x.db", flush_rows=0) as store:
        store.insert_many([exp(1), exp(2)])
        store.flush()
        bad = next(store.lake_dir.rglob("*.parquet"))
        store.insert_many([exp(3, episode="e2")])
        store.flush()
        store.insert_many([exp(4, episode="e2")])  # stays in the tail
        if damage == "truncated":
            bad.write_bytes(bad.read_bytes()[:40])
        elif damage == "deleted":
            bad.unlink()
        else:  # a valid Parquet file of something else under the listed name
            import pyarrow as pa
            import pyarrow.parquet as pq
            pq.write_table(pa.table({"x": [1, 2]}), bad)
        assert store.count() == 4  # the manifest still answers: nothing was deleted
        with caplog.at_level("WARNING", logger="thinkmem_ros.consolidator.store"):
            assert [e.seq for e in store.iter_all()] == [3, 4]
            assert store.episode_events()[("r1", "e2")] is not None
        assert "cannot be read and are left out" in caplog.text and bad.name in caplog.text


def test_a_stored_row_that_no_longer_decodes_is_left_out_and_named(tmp_path, caplog):
    with ExperienceStore(tmp_path / "x.db", flush_rows=0) as store:
        store.insert_many([exp(i) for i in range(1, 6)])
        with store._conn:
            store._conn.execute("UPDATE experiences SET payload = x'c1' WHERE seq = 2")
        with caplog.at_level("WARNING", logger="thinkmem_ros.consolidator.store"):
            assert [e.seq for e in store.iter_all(page=2)] == [1, 3, 4, 5]  # paging holds
            assert [e.seq for _, e in store.iter_experiences()] == [1, 3, 4, 5]
        assert "no longer decode" in caplog.text


def test_a_flush_that_fails_during_ingest_keeps_ingesting(tmp_path, caplog):
    with ExperienceStore(tmp_path / "x.db", flush_rows=3) as store:
        day = time.strftime("%Y-%m-%d", time.gmtime())
        blocker = store.lake_dir / "robot=r1" / f"day={day}" / "part-1-3.parquet"
        blocker.mkdir(parents=True)  # the flush the third row triggers cannot rename
        assert store.insert_many([exp(1), exp(2)]) == (2, 0)
        assert store.insert_many([exp(3)]) == (1, 0)  # committed, then the flush failed
        assert "stay in the SQLite tail" in caplog.text
        assert store.insert_many([exp(3), exp(4)]) == (1, 1)
        blocker.rmdir()
        assert store.insert_many([exp(5), exp(6)]) == (2, 0)  # the next try moves them all
        assert store._conn.execute("SELECT COUNT(*) FROM experiences").fetchone()[0] == 0
        assert [e.seq for e in store.iter_all()] == [1, 2, 3, 4, 5, 6]


def test_an_older_episode_is_read_from_the_files_its_row_ids_span(tmp_path):
    """``episodes_through`` with the episodes' id spans reads what it reads without them,
    from the files that hold them only (one episode no longer costs its robot's history)."""
    with ExperienceStore(tmp_path / "s.db", flush_rows=20) as store:
        seq = 0
        for e in range(12):  # one robot, 12 episodes of 10 rows, a flush every 20 rows
            store.insert_many([exp(seq := seq + 1, episode=f"e{e}") for _ in range(10)])
        through = store.last_id()
        infos = {i.episode_id: i for i in store.episodes()}
        keys = [("r1", "e3"), ("r1", "e10"), ("r1", "e7")]
        spans = [(infos[e].min_id, infos[e].max_id) for _, e in keys]
        narrow = store.episodes_through(keys, through, spans)
        assert [x.seq for x in narrow] == [x.seq for x in store.episodes_through(keys, through)]
        assert [x.episode_id for x in narrow] == ["e3"] * 10 + ["e10"] * 10 + ["e7"] * 10
        with store._snapshot():
            opened = store._files_over("r1", spans, through)
            every = store._lake_files("r1")
        assert 0 < len(opened) <= 3 < len(every)
        # a row-id bound below an episode's end leaves its later rows out
        assert len(store.episodes_through([("r1", "e3")], infos["e3"].min_id + 4,
                                          [spans[0]])) == 5


def test_one_robots_files_are_found_through_the_manifest_index(tmp_path):
    """A fleet flushes ~50,000 files a day; a round's reservoir asks for one robot's files
    over row-id spans, which must not scan the manifest, in new and in migrated stores."""
    old = tmp_path / "old.db"
    with ExperienceStore(old, target_version=4) as store:
        assert store.schema_version == 4
    for path in (tmp_path / "new.db", old):
        with ExperienceStore(path) as store:
            plan = " ".join(str(r[-1]) for r in store._conn.execute(
                "EXPLAIN QUERY PLAN SELECT path, min_id FROM lake_files WHERE robot_id = ?"
                " AND max_id >= ? AND min_id <= ?", ("r1", 1, 2)))
            assert "USING INDEX lake_files_robot" in plan, (path.name, plan)


def test_an_unlisted_file_of_older_rows_is_left_in_place_and_reported(tmp_path, caplog):
    """A manifest row deleted by hand: the file may be the only copy of its rows."""
    with ExperienceStore(tmp_path / "x.db", flush_rows=0) as store:
        store.insert_many([exp(1), exp(2)])
        store.flush()
        listed = next(store.lake_dir.rglob("*.parquet"))
        with store._conn:
            store._conn.execute("DELETE FROM lake_files")
        notes = store.lake_dir / "NOTES.txt"  # an operator's file is never touched
        notes.write_text("keep me")
        store.insert_many([exp(3)])
        with caplog.at_level("WARNING", logger="thinkmem_ros.consolidator.store"):
            assert store.flush() == 1
        assert listed.exists() and notes.exists()
        assert "not in the store's manifest" in caplog.text and listed.name in caplog.text


def test_a_replaced_store_file_refuses_the_lake_of_the_old_one(tmp_path):
    """An emptied store file beside its lake used to sweep all of the lake at its first flush."""
    path = tmp_path / "c.db"
    with ExperienceStore(path, flush_rows=0) as store:
        store.insert_many([exp(i) for i in range(5)])
        store.flush()
        lake = store.lake_dir
    before = sorted(p.name for p in lake.rglob("*.parquet"))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(b"")  # zero bytes: SQLite opens it as a new, empty store
    with pytest.raises(StoreError, match="belongs to another store"):
        ExperienceStore(path)
    assert sorted(p.name for p in lake.rglob("*.parquet")) == before


def test_a_lake_from_before_the_owner_marker_is_adopted_or_refused(tmp_path):
    path = tmp_path / "c.db"
    with ExperienceStore(path, flush_rows=0) as store:
        store.insert_many([exp(1)])
        store.flush()
        marker = store.lake_dir / OWNER_FILE
    marker.unlink()  # as a lake written before the marker existed
    with ExperienceStore(path, flush_rows=0) as store:  # it lists files: its own lake
        store.insert_many([exp(2)])
        store.flush()
        assert marker.is_file() and store.count() == 2
    marker.unlink()
    other = tmp_path / "c.sqlite"  # same stem, same folder, lists nothing
    with pytest.raises(StoreError, match="does not list"):
        ExperienceStore(other)


def test_two_stores_with_one_stem_never_share_a_lake(tmp_path):
    first = ExperienceStore(tmp_path / "c.db", flush_rows=0)
    second = ExperienceStore(tmp_path / "c.sqlite", flush_rows=0)  # no lake yet: both open
    try:
        first.insert_many([exp(1)])
        first.flush()
        second.insert_many([exp(2)])
        with pytest.raises(StoreError, match="belongs to another store"):
            second.flush()  # its rows stay in its tail
        assert second.count() == 1 and first.count() == 1
        assert [e.seq for e in first.iter_all()] == [1]
    finally:
        first.close()
        second.close()
    with pytest.raises(StoreError, match="belongs to another store"):
        ExperienceStore(tmp_path / "c.sqlite")



def _two_files(path, episode="e1"):
    """A store with two lake files of two rows each (ids 1-2, 3-4) and a tail row (5)."""
    store = ExperienceStore(path, flush_rows=0)
    store.insert_many([exp(1, episode=episode), exp(2, episode=episode)])
    store.flush()
    store.insert_many([exp(3, episode="e2"), exp(4, episode="e2")])
    store.flush()
    store.insert_many([exp(5, episode="e2")])
    files = sorted(store.lake_dir.rglob("*.parquet"), key=lambda p: int(p.name.split("-")[1]))
    return store, files


def test_a_lake_file_swapped_for_another_of_its_parts_is_left_out_and_named(tmp_path, caplog):
    """A valid Parquet file under a listed name used to be read as listed: the copy's rows
    came back twice. Its footer contradicts the manifest (ids), so it is left out, named,
    and nothing is deleted."""
    store, (first, second) = _two_files(tmp_path / "x.db")
    with store:
        assert [e.seq for e in store.iter_all()] == [1, 2, 3, 4, 5]  # a verdict to forget
        second.write_bytes(first.read_bytes())  # same rows count, the other part's ids
        with caplog.at_level("WARNING", logger="thinkmem_ros.consolidator.store"):
            assert [e.seq for e in store.iter_all()] == [1, 2, 5]
            assert [e.seq for _, e in store.iter_experiences()] == [1, 2, 5]
            assert [i.count for i in store.episodes()] == [2, 1]
        assert "do not hold what the manifest lists" in caplog.text
        assert second.name in caplog.text and "ids 1..2" in caplog.text
        assert store.count() == 5 and first.exists() and second.exists()  # nothing deleted


def test_a_part_file_of_another_lake_is_left_out_and_named(tmp_path, caplog):
    """Another store's part file with the same rows count, ids and robot (another lake of
    the same schema) was read as this store's rows; the owner id in its footer tells."""
    ours, (mine, _) = _two_files(tmp_path / "ours.db")
    theirs, (foreign, _) = _two_files(tmp_path / "theirs.db", episode="theirs")
    theirs.close()
    with ours:
        mine.write_bytes(foreign.read_bytes())  # ids 1-2 of robot r1, but not this store's
        with caplog.at_level("WARNING", logger="thinkmem_ros.consolidator.store"):
            assert [(e.episode_id, e.seq) for e in ours.iter_all()] == [
                ("e2", 3), ("e2", 4), ("e2", 5)]
        assert mine.name in caplog.text and "written by store" in caplog.text
        assert ours.count() == 5 and mine.exists()


def test_lake_files_written_before_footer_owners_are_still_read(tmp_path, caplog):
    """A lake flushed before the owner id went into footers: its files agree with the
    manifest on rows, ids and robot, so they are read as before, without a warning."""
    import pyarrow.parquet as pq

    store, files = _two_files(tmp_path / "x.db")
    with store:
        for f in files:  # as an older flush wrote them: no key-value metadata of ours
            table = pq.read_table(f).replace_schema_metadata(None)
            pq.write_table(table, f, compression="zstd")
            assert b"thinkmem.store" not in (pq.read_metadata(f).metadata or {})
        with caplog.at_level("WARNING", logger="thinkmem_ros.consolidator.store"):
            assert [e.seq for e in store.iter_all()] == [1, 2, 3, 4, 5]
        assert "left out" not in caplog.text
