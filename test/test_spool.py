import os
import signal
import sqlite3
import subprocess
import sys

import pytest

from thinkmem_ros.link.spool import Spool
from thinkmem_ros.link.spool_lock import SpoolInUse, SpoolLock


def rows(start, n, size=100):
    return [(seq, bytes([seq % 256]) * size) for seq in range(start, start + n)]


def test_put_read_remove_and_counters(tmp_path):
    spool = Spool(tmp_path / "s.db", max_bytes=10_000)
    assert spool.put(rows(0, 10)) == 0
    assert (spool.rows, spool.bytes) == (10, 1000)
    assert [s for s, _ in spool.read_after(3, 4)] == [4, 5, 6, 7]
    assert spool.remove([4, 5, 99]) == 2
    assert (spool.rows, spool.bytes) == (8, 800)
    assert [s for s, _ in spool.get([3, 4, 6])] == [3, 6]
    spool.put(rows(6, 2))  # a re-put of present rows is not double counted
    assert (spool.rows, spool.bytes) == (8, 800)
    spool.close()


def test_survives_reopen_with_next_seq_and_rows(tmp_path):
    spool = Spool(tmp_path / "s.db", max_bytes=10_000)
    spool.put(rows(100, 5))
    spool.remove([100])
    spool.close()
    again = Spool(tmp_path / "s.db", max_bytes=10_000)
    assert again.next_seq == 105
    assert [s for s, _ in again.read_after(-1, 100)] == [101, 102, 103, 104]
    assert again.bytes == 400


def test_full_spool_sheds_oldest_never_newest(tmp_path):
    spool = Spool(tmp_path / "s.db", max_bytes=1000)
    spool.put(rows(0, 10))
    shed = spool.put(rows(10, 3))
    assert shed == 3 and spool.shed == 3
    kept = [s for s, _ in spool.read_after(-1, 100)]
    assert kept == list(range(3, 13))
    assert spool.bytes <= 1000
    # a single batch larger than the whole spool keeps its newest rows
    shed = spool.put(rows(20, 15))
    kept = [s for s, _ in spool.read_after(-1, 100)]
    assert kept == list(range(25, 35)) and spool.shed == 3 + 10 + 5
    spool.close()
    assert Spool(tmp_path / "s.db", max_bytes=1000).shed_total == 18


def test_wal_mode_and_bad_config(tmp_path):
    Spool(tmp_path / "s.db", max_bytes=10).close()
    mode = sqlite3.connect(tmp_path / "s.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    with pytest.raises(ValueError, match="max_bytes"):
        Spool(tmp_path / "t.db", max_bytes=0)


def test_remove_range_deletes_only_that_range_and_keeps_counters(tmp_path):
    spool = Spool(tmp_path / "s.db", max_bytes=100_000)
    spool.put(rows(0, 20))
    spool.remove([5])  # a hole inside the range is fine
    assert spool.remove_range(3, 9) == 6
    assert (spool.rows, spool.bytes) == (13, 1300)
    assert [s for s, _ in spool.read_after(-1, 100)] == [0, 1, 2] + list(range(10, 20))
    assert spool.remove_range(9, 3) == 0 and spool.remove_range(100, 200) == 0
    assert spool.remove_range(0, 19) == 13 and (spool.rows, spool.bytes) == (0, 0)
    spool.close()
    again = Spool(tmp_path / "s.db", max_bytes=100_000)
    assert (again.rows, again.bytes) == (0, 0)


def test_new_spool_files_use_large_pages(tmp_path):
    Spool(tmp_path / "s.db", max_bytes=10).close()
    assert sqlite3.connect(tmp_path / "s.db").execute("PRAGMA page_size").fetchone()[0] == 16384


def test_old_spool_files_are_converted_to_incremental_vacuum_when_empty(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER)")
    conn.execute("CREATE TABLE spool (seq INTEGER PRIMARY KEY, payload BLOB NOT NULL, "
                 "size INTEGER NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema_version', 1), ('next_seq', 42)")
    conn.commit()
    conn.close()
    spool = Spool(path, max_bytes=10_000)
    assert spool.next_seq == 42
    spool.close()
    assert sqlite3.connect(path).execute("PRAGMA auto_vacuum").fetchone()[0] == 2


def test_reserve_file_and_bad_reserve_config(tmp_path):
    spool = Spool(tmp_path / "s.db", max_bytes=10_000, reserve_bytes=64 * 1024)
    assert (tmp_path / "s.db.reserve").stat().st_size == 64 * 1024
    assert not spool.disk_full and not spool.check_space()
    spool.close()
    with pytest.raises(ValueError, match="reserve_bytes"):
        Spool(tmp_path / "t.db", max_bytes=10, reserve_bytes=-1)


HOLD_LOCK = """
import sys, time
from thinkmem_ros.link.spool_lock import SpoolLock
SpoolLock(sys.argv[1], "node /robot1/thinking_node").acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_spool_is_held_by_one_process_and_freed_when_it_dies(tmp_path):
    spool = tmp_path / "spool.db"
    child = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(spool)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(SpoolInUse, match=rf"in use by pid {child.pid} "
                                             r"\(node /robot1/thinking_node\) since "):
            SpoolLock(spool, "node /robot2/thinking_node").acquire()
    finally:
        os.kill(child.pid, signal.SIGKILL)  # a crash: the kernel drops the lock
        child.wait(timeout=10)
    mine = SpoolLock(spool, "node /robot2/thinking_node").acquire()
    assert mine.held and f"pid {os.getpid()} (node /robot2/thinking_node)" in \
        (tmp_path / "spool.db.lock").read_text()
    with pytest.raises(SpoolInUse):  # another holder in this very process is refused too
        SpoolLock(spool, "other").acquire()
    mine.release()
    mine.release()  # idempotent
    SpoolLock(spool, "again").acquire().release()


def test_the_wal_stays_small_beside_a_small_cap(tmp_path):
    """spool_max_mb counts payload bytes; the WAL must not add many times the cap on disk."""
    cap = 1 << 20
    spool = Spool(tmp_path / "s.db", max_bytes=cap, low_disk_bytes=0)
    wal = tmp_path / "s.db-wal"
    peak = 0
    for batch in range(200):  # 28 MB through a 1 MB spool: put, ship, acknowledge, shed
        spool.put(rows(batch * 100, 100, size=1400))
        spool.remove(range(batch * 100, batch * 100 + 50))
        peak = max(peak, wal.stat().st_size if wal.exists() else 0)
    assert spool.bytes <= cap
    assert peak <= cap, f"WAL reached {peak / 2**20:.1f} MB beside a 1 MB cap"
    spool.close()
    big = Spool(tmp_path / "big.db", max_bytes=256 << 20, low_disk_bytes=0)
    assert big._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
    big.close()
