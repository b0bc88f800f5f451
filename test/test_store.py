import sqlite3
import time

import numpy as np
import pytest

from thinkmem_ros.consolidator.store import SCHEMA_VERSION, ExperienceStore, StoreError
from thinkmem_ros.link.experience import Experience, encode_experience


def exp(seq, robot="r1", episode="e1", stamp=None, events=(), reward=None):
    e = Experience(robot_id=robot, episode_id=episode, seq=seq,
                   stamp=float(seq if stamp is None else stamp), window=np.zeros((2, 2)),
                   labels=["trend"], probabilities=[0.5], bundle_version=1,
                   events=list(events), reward=reward)
    return e, encode_experience(e)


def test_insert_is_idempotent_per_robot_and_seq(tmp_path):
    with ExperienceStore(tmp_path / "x.db") as store:
        assert store.insert_many([exp(1), exp(2)]) == (2, 0)
        assert store.insert_many([exp(2), exp(3), exp(3)]) == (1, 2)
        assert store.insert_many([exp(2, robot="r2")]) == (1, 0)
        assert store.count() == 4 and store.count("r1") == 3
        assert store.seqs("r1") == [1, 2, 3]
        assert store.get("r1", 2).seq == 2 and store.get("r1", 99) is None


@pytest.mark.parametrize("flushed", [False, True], ids=["tail", "lake"])
def test_a_second_robot_under_the_same_id_is_kept_apart_and_named(tmp_path, caplog, flushed):
    """Same key, another episode: a clone counting the same seqs, not a re-send."""
    with ExperienceStore(tmp_path / "x.db", flush_rows=2 if flushed else 0) as store:
        assert store.insert_many([exp(1, episode="a-1"), exp(2, episode="a-1")]) == (2, 0)
        assert (store.lake_dir.exists()) == flushed
        with caplog.at_level("ERROR"):
            # the clone's seq 2 and 3 plus the first robot's own re-send of seq 1
            got = store.insert_many([exp(1, episode="a-1"), exp(2, episode="b-1"),
                                     exp(3, episode="b-1")])
        assert got == (1, 2) and store.conflicts == 1 and store.conflict_count("r1") == 1
        kept = store._conn.execute("SELECT seq, episode_id, payload FROM conflicts").fetchall()
        assert [(s, e) for s, e, _ in kept] == [(2, "b-1")]
        assert kept[0][2] == exp(2, episode="b-1")[1]  # the whole record, nothing lost
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "'r1'" in errors[0] and "'b-1'" in errors[0]
        # its re-send is kept once; the first robot's copy stays what the store serves
        assert store.insert_many([exp(2, episode="b-1")]) == (0, 1)
        assert store.conflict_count() == 1 and store.get("r1", 2).episode_id == "a-1"


def test_whole_store_passes_go_page_by_page_from_a_mark(tmp_path):
    with ExperienceStore(tmp_path / "x.db") as store:
        assert store.last_id() == 0
        store.insert_many([exp(i) for i in range(7)])
        mark = store.last_id()
        store.insert_many([exp(i) for i in range(7, 12)])
        assert [e.seq for e in store.iter_all(page=3)] == list(range(12))
        assert [e.seq for e in store.iter_all(after_id=mark, page=2)] == list(range(7, 12))
        assert list(store.iter_all(after_id=store.last_id())) == []


def test_queries_for_discovery(tmp_path):
    with ExperienceStore(tmp_path / "x.db") as store:
        store.insert_many([exp(1, events=["A"]), exp(2, events=["A", "B"], reward=1.0),
                           exp(3, episode="e2", events=["C"])])
        infos = store.episodes()
        assert [(i.episode_id, i.count, i.first_stamp, i.last_stamp) for i in infos] == [
            ("e1", 2, 1.0, 2.0), ("e2", 1, 3.0, 3.0)]
        assert store.episode_events() == {("r1", "e1"): ["A", "B"], ("r1", "e2"): ["C"]}
        assert [e.seq for e in store.episode_experiences("r1", "e1")] == [1, 2]
        assert store.rewards() == [("r1", 2, 1.0)]
        ids = [row_id for row_id, _ in store.iter_experiences()]
        assert [e.seq for _, e in store.iter_experiences(after_id=ids[0])] == [2, 3]
        assert [e.seq for _, e in store.iter_experiences(episode_id="e2")] == [3]


def test_migrates_old_file_and_keeps_rows(tmp_path):
    path = tmp_path / "old.db"
    with ExperienceStore(path, target_version=1) as old:
        assert old.schema_version == 1
        e, payload = exp(5)
        with old._conn:  # write a row the way schema 1 did
            old._conn.execute(
                "INSERT INTO experiences (robot_id, seq, episode_id, stamp, bundle_version,"
                " payload) VALUES (?, ?, ?, ?, ?, ?)", ("r1", 5, "e1", 5.0, 1, payload))
    with ExperienceStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.get("r1", 5).seq == 5
        assert store.insert_many([exp(5)]) == (0, 1)


def test_refuses_newer_schema(tmp_path):
    path = tmp_path / "new.db"
    ExperienceStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO schema_version VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError, match="newer"):
        ExperienceStore(path)


def test_new_files_use_large_pages_and_old_page_sizes_still_open(tmp_path):
    with ExperienceStore(tmp_path / "new.db") as store:
        assert store._conn.execute("PRAGMA page_size").fetchone()[0] == 16384
    old = sqlite3.connect(tmp_path / "old.db")  # a store made before the page-size change
    old.execute("PRAGMA page_size=4096")
    old.execute("PRAGMA journal_mode=WAL")
    old.close()
    with ExperienceStore(tmp_path / "old.db") as store:
        assert store._conn.execute("PRAGMA page_size").fetchone()[0] == 4096
        assert store.insert_many([exp(1), exp(2)]) == (2, 0)
        assert [e.seq for _, e in store.iter_experiences()] == [1, 2]


def test_an_open_waits_out_another_processs_long_upgrade(tmp_path):
    """A store being upgraded by another process (a table rebuild can hold the write lock
    past the 10 s every other write waits) made a receiver started meanwhile fail its open
    with 'database is locked'. Another process holds the lock 11 s here (a real lock)."""
    import subprocess
    import sys

    path = tmp_path / "s.db"
    ExperienceStore(path, target_version=SCHEMA_VERSION - 1).close()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        f"c = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE'); print('held', flush=True); time.sleep(11)\n"
        "c.execute('COMMIT')\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with ExperienceStore(path) as store:
            assert store.schema_version == SCHEMA_VERSION
        assert time.monotonic() - started > 10
    finally:
        holder.wait(timeout=30)
