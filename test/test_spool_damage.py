"""A damaged spool file: moved aside, every readable row salvaged, shipping goes on.

Each test damages a real spool file the way an SD card, a power cut or a stray file does
(truncated, a page overwritten with zeros, a garbage header, a leftover WAL of another
database or of an older copy of the spool) and drives the real Spool or ExperienceShipper
(with a real ZeroMQ receiver) on it. What holds every time: no exception escapes, the rows
SQLite could still read are all there afterwards (and get shipped), next_seq never goes
back, the damaged bytes are kept beside the spool, and one ERROR line says what happened.
Another program's database at the spool path is refused and left byte for byte as it was.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from waiting import wait as wait_until

from thinkmem_ros.consolidator.ingest import open_receiver
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.link import spool as spool_module
from thinkmem_ros.link.experience import Experience, encode_experience
from thinkmem_ros.link.receiver import ReceiverConfig
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig
from thinkmem_ros.link.spool import Spool, SpoolError

PAGE = 16384
SPOOL_LOG = "thinkmem_ros.link.spool"


def rows(first, last, size=1400):
    """Rows whose payload names its seq (mod 251), so a page can be found by its bytes."""
    return [(seq, bytes([seq % 251]) * size) for seq in range(first, last + 1)]


def make_spool(path, first=1, last=300, remove=None):
    spool = Spool(path, 1 << 30)
    spool.put(rows(first, last))
    if remove:
        spool.remove_range(*remove)
    spool.close()


def zero_page_holding(path, needle):
    data = path.read_bytes()
    at = data.find(needle)
    assert at > 0, "payload not found in the file"
    with open(path, "r+b") as handle:
        handle.seek(at // PAGE * PAGE)
        handle.write(b"\0" * PAGE)


def readable_seqs(path, seqs):
    """The seqs a look-up one by one can still read from ``path`` (read-only)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    found = set()
    for seq in seqs:
        try:
            if conn.execute("SELECT payload FROM spool WHERE seq = ?", (seq,)).fetchone():
                found.add(seq)
        except sqlite3.Error:
            pass
    conn.close()
    return found


def wal_database(path, rows):
    """Another program's WAL database at ``path``, ``rows`` committed and never checkpointed.

    Returns the open connection: closing it checkpoints the WAL into the file.
    """
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t(x)")
    conn.commit()
    conn.executemany("INSERT INTO t VALUES (?)", [(row,) for row in rows])
    conn.commit()
    return conn


def foreign_wal(folder):
    """The bytes of a WAL with committed frames from another database (never checkpointed)."""
    conn = wal_database(folder / "other.db", [b"z" * 500] * 50)
    wal = Path(f"{folder / 'other.db'}-wal").read_bytes()
    conn.close()
    return wal


def damaged_copies(folder, name="spool.db"):
    """The damaged spool files kept beside the spool (their -wal/-shm not listed)."""
    return sorted(p.name for p in folder.iterdir()
                  if p.name.startswith(f"{name}.damaged-") and not p.name.endswith(("-wal",
                                                                                   "-shm")))


def damage_freelist(path):
    """Overwrite the first freelist trunk page (rows removed before put their pages there)."""
    trunk = struct.unpack(">I", path.read_bytes()[32:36])[0]
    assert trunk, "the file has no freelist"
    with open(path, "r+b") as handle:
        handle.seek((trunk - 1) * PAGE)
        handle.write(b"\xff" * 8 + b"\0" * (PAGE - 8))


def spool_errors(caplog):
    return [r for r in caplog.records if r.name == SPOOL_LOG and r.levelno >= logging.ERROR]


def all_seqs(spool):
    return [seq for seq, _ in spool.read_after(-1, 10**6)]


# ------------------------------------------------------------------ damage found at open

def test_a_foreign_wal_is_moved_aside_and_every_row_kept(tmp_path, caplog):
    path = tmp_path / "spool.db"
    make_spool(path, 1, 300, remove=(1, 100))  # acked rows: next_seq stays above the rows
    main = path.read_bytes()
    Path(f"{path}-wal").write_bytes(foreign_wal(tmp_path))
    spool = Spool(path, 1 << 30)
    assert all_seqs(spool) == list(range(101, 301))
    assert spool.next_seq == 301
    spool.close()
    (aside,) = damaged_copies(tmp_path)
    assert (tmp_path / aside).read_bytes() == main  # the damaged copy keeps its bytes
    assert (tmp_path / f"{aside}-wal").exists()
    (line,) = spool_errors(caplog)
    assert aside in line.getMessage() and "another database" in line.getMessage()
    assert "salvaged 200 rows" in line.getMessage()


def test_a_stale_wal_of_its_own_is_not_checkpointed_into_the_file(tmp_path, caplog):
    path = tmp_path / "spool.db"
    make_spool(path)
    spool = Spool(path, 1 << 30)
    spool._conn.execute("PRAGMA wal_autocheckpoint=0")
    spool.put(rows(1000, 1019))
    stale = Path(f"{path}-wal").read_bytes()
    spool.close()
    spool = Spool(path, 1 << 30)
    spool.remove_range(1, 100)
    spool.close()
    Path(f"{path}-wal").write_bytes(stale)
    spool = Spool(path, 1 << 30)
    assert all_seqs(spool) == list(range(101, 301)) + list(range(1000, 1020))
    assert spool.next_seq == 1020
    spool.close()
    assert len(spool_errors(caplog)) == 1 and damaged_copies(tmp_path)


def test_a_zeroed_page_loses_only_the_rows_on_it(tmp_path, caplog):
    path = tmp_path / "spool.db"
    make_spool(path)
    zero_page_holding(path, bytes([135]) * 1400)
    readable = readable_seqs(path, range(1, 301))
    assert 250 < len(readable) < 300
    damaged = path.read_bytes()
    spool = Spool(path, 1 << 30)
    assert set(all_seqs(spool)) == readable
    assert spool.next_seq == 301
    assert spool.rows == len(readable)
    spool.put(rows(301, 301))  # and it takes new rows
    spool.close()
    (aside,) = damaged_copies(tmp_path)
    assert (tmp_path / aside).read_bytes() == damaged
    (line,) = spool_errors(caplog)
    assert f"salvaged {len(readable)} rows" in line.getMessage()
    assert f"up to {300 - len(readable)} lost" in line.getMessage()


def test_damage_at_every_start_keeps_the_newest_copies_not_a_full_disk(tmp_path, caplog):
    """Storage that fails again and again moved a copy aside at every start, each as
    large as the spool: they filled the robot's disk outside the spool's byte cap."""
    path = tmp_path / "spool.db"
    make_spool(path, 1, 30)
    for start in range(5):
        with open(path, "r+b") as handle:  # the same damage after every start
            handle.write(os.urandom(100))
        spool = Spool(path, 1 << 30)
        spool.put(rows(100 + start, 100 + start))
        spool.close()
        time.sleep(0.01 if start else 1.1)  # two copies within one second, the rest not
    kept = damaged_copies(tmp_path)
    assert len(kept) == spool_module.spool_damage.KEEP_DAMAGED == 2
    assert len(spool_errors(caplog)) == 5
    deleted = [r.getMessage() for r in caplog.records if "deleted the older" in r.getMessage()]
    assert len(deleted) == 3 and not any(name in " ".join(deleted) for name in kept)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(("-wal", "-shm"))
                and ".damaged-" in p.name and p.name[:-4] not in kept]


def test_pruning_orders_copies_by_time_then_number(tmp_path):
    from thinkmem_ros.link.spool_damage import prune_damaged

    names = ["spool.db.damaged-20261205T010203Z", "spool.db.damaged-20261205T010203Z-2",
             "spool.db.damaged-20261205T010203Z-10", "spool.db.damaged-20261204T235959Z",
             "spool.db.damaged-20261205T010203Z-10-wal", "other.db.damaged-20201205T010203Z"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    deleted = prune_damaged(tmp_path / "spool.db", keep=2)
    assert sorted(p.name for p in deleted) == ["spool.db.damaged-20261204T235959Z",
                                               "spool.db.damaged-20261205T010203Z"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["spool.db.damaged-20261205T010203Z-2", "spool.db.damaged-20261205T010203Z-10",
         "spool.db.damaged-20261205T010203Z-10-wal", "other.db.damaged-20201205T010203Z"])


@pytest.mark.parametrize("damage", ["truncated", "garbage header", "page 1 zeroed",
                                    "random file"])
def test_an_unreadable_file_is_kept_and_a_fresh_spool_started(tmp_path, caplog, damage):
    path = tmp_path / "spool.db"
    make_spool(path)
    with open(path, "r+b") as handle:
        if damage == "truncated":
            handle.truncate(path.stat().st_size * 2 // 5 + 123)
        elif damage == "garbage header":
            handle.write(os.urandom(100))
        elif damage == "page 1 zeroed":
            handle.write(b"\0" * PAGE)
        else:
            handle.truncate(0)
            handle.write(os.urandom(300_000))
    damaged = path.read_bytes()
    spool = Spool(path, 1 << 30)
    spool.put(rows(400, 409))
    assert spool.rows == 10
    spool.close()
    (aside,) = damaged_copies(tmp_path)
    assert (tmp_path / aside).read_bytes() == damaged
    (line,) = spool_errors(caplog)
    assert aside in line.getMessage() and "unknown number lost" in line.getMessage()
    Spool(path, 1 << 30).close()  # the fresh spool is sound: no second move
    assert len(damaged_copies(tmp_path)) == 1


def test_a_damaged_freelist_is_found_at_open_not_by_every_later_write(tmp_path, caplog):
    path = tmp_path / "spool.db"
    make_spool(path, remove=(1, 200))  # acked rows: their pages go to the freelist
    trunk = struct.unpack(">I", path.read_bytes()[32:36])[0]
    with open(path, "r+b") as handle:
        handle.seek((trunk - 1) * PAGE)
        handle.write(b"\xff" * 8 + b"\0" * (PAGE - 8))
    spool = Spool(path, 1 << 30)
    for seq in range(1000, 1010):
        spool.put(rows(seq, seq, size=20000))
    assert all_seqs(spool) == list(range(201, 301)) + list(range(1000, 1010))
    spool.close()
    assert len(spool_errors(caplog)) == 1 and damaged_copies(tmp_path)


def test_a_meta_next_seq_that_is_not_a_number_is_damage_named_and_salvaged(tmp_path, caplog):
    path = tmp_path / "spool.db"
    make_spool(path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = 'abc' WHERE key = 'next_seq'")
    conn.commit()
    conn.close()
    spool = Spool(path, 1 << 30)
    assert spool.rows == 300 and spool.next_seq == 301
    spool.close()
    (line,) = spool_errors(caplog)
    assert "meta.next_seq is not an integer" in line.getMessage()
    assert str(path) in line.getMessage()


# ------------------------------------------------------------------ a large spool: checked later

def test_a_large_spool_opens_unchecked_and_verify_moves_a_damaged_one_aside(tmp_path, caplog):
    path = tmp_path / "spool.db"
    make_spool(path, remove=(1, 200))
    damage_freelist(path)
    damaged = path.read_bytes()
    spool = Spool(path, 1 << 30, full_check_bytes=PAGE)  # "large": above the threshold
    assert not spool.checked and spool.rows == 100
    assert not damaged_copies(tmp_path) and not spool_errors(caplog)
    assert spool.verify()
    assert spool.checked and spool.lost == 0
    assert all_seqs(spool) == list(range(201, 301)) and spool.next_seq == 301
    for seq in range(1000, 1010):  # new pages come from a sound freelist now
        spool.put(rows(seq, seq, size=20000))
    assert not spool.verify()  # checked once: nothing more to do
    spool.close()
    (aside,) = damaged_copies(tmp_path)
    # opened read-write before the check, so only the header's change counter moved
    assert (tmp_path / aside).read_bytes()[100:] == damaged[100:]
    (line,) = spool_errors(caplog)
    assert "quick_check" in line.getMessage() and "salvaged 100 rows" in line.getMessage()


def test_verify_of_a_sound_large_spool_changes_nothing(tmp_path, caplog):
    path = tmp_path / "spool.db"
    make_spool(path)
    spool = Spool(path, 1 << 30, full_check_bytes=0)
    spool.put(rows(301, 310))  # the read-write connection holds these in its WAL
    assert not spool.checked and not spool.verify() and spool.checked
    assert all_seqs(spool) == list(range(1, 311))
    spool.close()
    assert not damaged_copies(tmp_path) and not spool_errors(caplog)


def test_a_leftover_wal_is_checked_at_open_whatever_the_size(tmp_path, caplog):
    path = tmp_path / "spool.db"
    make_spool(path, remove=(1, 200))
    conn = sqlite3.connect(path)  # a crash: the last commit is still in the WAL
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('next_seq', 400)")
    conn.commit()
    wal = Path(f"{path}-wal").read_bytes()
    conn.close()
    Path(f"{path}-wal").write_bytes(wal)
    damage_freelist(path)
    spool = Spool(path, 1 << 30, full_check_bytes=0)
    assert spool.checked and damaged_copies(tmp_path)  # found at open, not left for later
    assert all_seqs(spool) == list(range(201, 301)) and spool.next_seq == 400
    spool.close()
    assert len(spool_errors(caplog)) == 1


# ------------------------------------------------------------------ refused, left alone

def test_another_programs_database_is_refused_and_left_byte_identical(tmp_path, caplog):
    path = tmp_path / "spool.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT)")
    conn.executemany("INSERT INTO users(name) VALUES (?)", [("a",), ("b",)])
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(SpoolError, match=r"is not a thinkmem spool \(tables: users\)"):
        Spool(path, 1 << 30)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spool.db"]
    assert not spool_errors(caplog)


def test_another_programs_wal_database_is_refused_with_its_wal_untouched(tmp_path):
    path = tmp_path / "spool.db"
    conn = wal_database(path, [1])
    main, wal = path.read_bytes(), Path(f"{path}-wal").read_bytes()
    with pytest.raises(SpoolError, match=r"not a thinkmem spool \(tables: t\)"):
        Spool(path, 1 << 30)
    assert path.read_bytes() == main and Path(f"{path}-wal").read_bytes() == wal
    assert not damaged_copies(tmp_path)
    conn.close()
    assert sqlite3.connect(path).execute("SELECT x FROM t").fetchall() == [(1,)]


@pytest.mark.parametrize("where", ["", "-wal", "-shm"])
def test_a_directory_in_the_way_is_named_and_the_reserve_kept(tmp_path, where):
    path = tmp_path / "spool.db"
    if where:
        make_spool(path)
        Path(f"{path}{where}").mkdir()
    else:
        path.mkdir()
        (tmp_path / "spool.db.reserve").write_bytes(b"\0" * 4096)
    assert (tmp_path / "spool.db.reserve").exists()
    with pytest.raises(SpoolError, match=f"spool.db{where} is a directory"):
        Spool(path, 1 << 30)
    assert (tmp_path / "spool.db.reserve").exists()  # not a full disk: the reserve stays


def test_a_read_only_folder_is_reported_as_such(tmp_path):
    folder = Path(tempfile.mkdtemp(prefix="spool-ro-"))
    try:
        os.chmod(folder, 0o777)
        make_spool(folder / "spool.db")
        os.chmod(folder / "spool.db", 0o666)
        os.chmod(folder / "spool.db.reserve", 0o666)
        os.chmod(folder, 0o555)
        script = (
            "import os\n"
            "from thinkmem_ros.link.spool import Spool, SpoolError\n"
            "if os.geteuid() == 0:\n"  # root ignores permission bits: be someone else
            "    os.setgid(65534); os.setuid(65534)\n"
            "try:\n"
            f"    Spool({str(folder / 'spool.db')!r}, 1 << 30)\n"
            "except SpoolError as exc:\n"
            "    print(exc)\n")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[1], timeout=60)
        assert done.returncode == 0, done.stderr
        message = done.stdout.strip()
        assert f"the folder {folder} is not writable" in message, message
        assert "reserve" not in message and len(message.splitlines()) == 1
        assert (folder / "spool.db.reserve").exists()
    finally:
        os.chmod(folder, 0o755)
        shutil.rmtree(folder)


# ------------------------------------------------------------------ the shipper

def exp(i, robot="r1"):
    return Experience(robot_id=robot, episode_id=f"ep{i // 100}", stamp=float(i),
                      window=np.full((8, 3), i % 7, dtype=np.float32), labels=["trend"],
                      probabilities=[0.5], bundle_version=1, trace=f"x{i}")


def shipper_cfg(path, endpoint, **kw):
    base = dict(endpoint=endpoint, robot_id="r1", spool_path=path, ack_timeout_s=0.5,
                backoff_initial_s=0.05, backoff_max_s=0.5, batch_size=64)
    base.update(kw)
    return ShipperConfig(**base)


def encoded_spool(path, count):
    spool = Spool(path, 1 << 30)
    for start in range(1, count + 1, 1000):
        spool.put([(i, encode_experience(exp(i), seq=i))
                   for i in range(start, min(start + 1000, count + 1))])
    spool.close()


def free_endpoint(tmp_path):
    rx = open_receiver(ReceiverConfig(bind="tcp://127.0.0.1:*", db_path=tmp_path / "probe.db"))
    endpoint = rx.endpoint
    rx._close_socket()
    return endpoint


def traces(db):
    with ExperienceStore(db) as store:
        return {e.trace for _, e in store.iter_experiences()}



def wait(pred, timeout=20.0):
    return wait_until(pred, timeout)


def test_shipper_starts_on_a_damaged_spool_and_ships_every_readable_row(tmp_path, receiver,
                                                                        caplog):
    path = tmp_path / "robot" / "spool.db"
    path.parent.mkdir()
    encoded_spool(path, 3000)
    conn = sqlite3.connect(path)
    payload = conn.execute("SELECT payload FROM spool WHERE seq = 1500").fetchone()[0]
    conn.close()
    zero_page_holding(path, payload)
    readable = readable_seqs(path, range(1, 3001))
    assert 2900 < len(readable) < 3000
    with ExperienceShipper(shipper_cfg(path, receiver.endpoint)) as shipper:
        for i in range(5000, 5100):
            assert shipper.ship(exp(i))
        assert shipper.flush(30.0), shipper.stats()
        assert shipper.alive()
    assert traces(tmp_path / "store.db") == {f"x{i}" for i in readable | set(range(5000, 5100))}
    assert len(spool_errors(caplog)) == 1 and damaged_copies(path.parent)


def test_damage_met_while_shipping_renews_the_spool_and_loses_nothing_readable(tmp_path,
                                                                             caplog):
    path = tmp_path / "robot" / "spool.db"
    path.parent.mkdir()
    count = 12000  # 4 MB: more than the connection's page cache, so the damage is read
    encoded_spool(path, count)
    endpoint = free_endpoint(tmp_path)
    shipper = ExperienceShipper(shipper_cfg(path, endpoint)).start()
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        payload = conn.execute("SELECT payload FROM spool WHERE seq = 6000").fetchone()[0]
        conn.close()
        zero_page_holding(path, payload)  # an SD card write error while the robot runs
        readable = readable_seqs(path, range(1, count + 1))
        assert count - 100 < len(readable) < count
        for i in range(20000, 20050):
            assert shipper.ship(exp(i))
        cfg = ReceiverConfig(bind=endpoint, db_path=tmp_path / "store.db",
                             max_frame_bytes=1 << 20, poll_s=0.02)
        with open_receiver(cfg):
            assert wait(lambda: shipper.stats()["spool_failed"] > 0 or not shipper.alive())
            for i in range(20050, 20100):  # after the damage: still taken and shipped
                assert shipper.ship(exp(i))
            assert shipper.flush(60.0), shipper.stats()
            stats = shipper.stats()
            assert shipper.alive() and stats["spool_rows"] == 0
    finally:
        shipper.close()
    stored = traces(tmp_path / "store.db")
    assert stored == {f"x{i}" for i in readable | set(range(20000, 20100))}
    assert stats["spool_failed"] == count - len(readable)  # the lost rows are counted
    assert len(spool_errors(caplog)) == 1 and damaged_copies(path.parent)


def test_a_write_that_meets_damage_renews_the_spool_and_counts_every_row(tmp_path, caplog):
    path = tmp_path / "spool.db"
    spool = Spool(path, 1 << 30)
    for start in range(1, 20001, 1000):
        spool.put(rows(start, start + 999))
    spool.remove_range(1, 1000)  # acked: their pages go to the freelist
    spool.close()
    shipper = ExperienceShipper(shipper_cfg(path, free_endpoint(tmp_path))).start()
    try:
        time.sleep(0.3)
        data = path.read_bytes()
        trunk = struct.unpack(">I", data[32:36])[0]
        with open(path, "r+b") as handle:  # the freelist and one leaf go bad after start
            handle.seek((trunk - 1) * PAGE)
            handle.write(b"\xff" * 8 + b"\0" * (PAGE - 8))
        zero_page_holding(path, bytes([5000 % 251]) * 1400)
        accepted = sum(shipper.ship(exp(i)) for i in range(600))
        assert accepted == 600
        assert wait(lambda: shipper.stats()["spooled"] == 600)
        stats = shipper.stats()
        assert shipper.alive() and stats["queue"] == 0
        # every row is still spooled or counted as lost; nothing vanished
        assert stats["spool_rows"] + stats["spool_failed"] == 19000 + 600
        assert stats["spool_failed"] < 50
    finally:
        shipper.close()
    assert len(spool_errors(caplog)) == 1 and damaged_copies(tmp_path)


def test_a_disk_read_error_is_treated_as_damage(tmp_path, caplog):
    # An EIO from the disk cannot be produced on a healthy filesystem here (it needs a
    # failing device or dm-error), so this one read error is simulated: the connection
    # answers the spool's read with SQLite's own "disk I/O error" (SQLITE_IOERR_READ).
    path = tmp_path / "spool.db"
    make_spool(path)
    spool = Spool(path, 1 << 30)
    real = spool._conn

    class FailingReads:
        def __getattr__(self, name):
            return getattr(real, name)

        def execute(self, sql, *args):
            if sql.startswith("SELECT seq, payload FROM spool WHERE seq >"):
                exc = sqlite3.OperationalError("disk I/O error")
                exc.sqlite_errorcode = sqlite3.SQLITE_IOERR_READ
                raise exc
            return real.execute(sql, *args)

    spool._conn = FailingReads()
    with pytest.raises(SpoolError) as raised:
        spool.read_after(-1, 10)
    spool.recover(str(raised.value))
    assert all_seqs(spool) == list(range(1, 301)) and spool.lost == 0
    spool.close()
    assert len(spool_errors(caplog)) == 1 and damaged_copies(tmp_path)


def test_a_thread_that_stopped_makes_ship_refuse_and_count(tmp_path, monkeypatch):
    # Nothing in the spool can stop the thread any more, so a bug elsewhere in the loop is
    # simulated to stop it: what matters is what ship() does afterwards.
    from thinkmem_ros.link import shipper as shipper_module

    def broken(self):
        raise RuntimeError("a bug")

    monkeypatch.setattr(shipper_module._ShipLoop, "check_timeouts", broken)
    shipper = ExperienceShipper(shipper_cfg(tmp_path / "spool.db", free_endpoint(tmp_path)))
    shipper.start()
    assert wait(lambda: not shipper.alive(), 5.0)
    before = shipper.stats()["dropped_queue_full"]
    assert not any(shipper.ship(exp(i)) for i in range(10))
    assert shipper.stats()["dropped_queue_full"] == before + 10
    shipper.close()


def test_the_shipper_verifies_a_large_spool_once_started_and_ships_every_row(
        tmp_path, receiver, caplog, monkeypatch):
    path = tmp_path / "robot" / "spool.db"
    path.parent.mkdir()
    encoded_spool(path, 3000)
    spool = Spool(path, 1 << 30)
    spool.remove_range(1, 1000)  # acknowledged before the restart: a freelist
    spool.close()
    damage_freelist(path)
    monkeypatch.setattr(spool_module, "FULL_CHECK_AT_OPEN_BYTES", PAGE)
    verified = []
    real_verify = Spool.verify

    def watched(self):  # what the shipper's thread saw when it checked the spool
        started = shipper._started.is_set()
        verified.append((started, real_verify(self)))
        return verified[-1][1]

    monkeypatch.setattr(Spool, "verify", watched)
    shipper = ExperienceShipper(shipper_cfg(path, receiver.endpoint))
    with shipper:
        for i in range(5000, 5100):
            assert shipper.ship(exp(i))
        assert shipper.flush(30.0), shipper.stats()
        stats = shipper.stats()
        assert shipper.alive()
    assert verified == [(True, True)]  # after start() was let go; it found the damage
    assert traces(tmp_path / "store.db") == {f"x{i}" for i in range(1001, 3001)} | {
        f"x{i}" for i in range(5000, 5100)}
    assert stats["spool_failed"] == 0
    assert len(spool_errors(caplog)) == 1 and damaged_copies(path.parent)


def test_the_fault_probe_of_a_foreign_wal_at_start_loses_nothing():
    from thinkmem_ros.bench.fault_probes_link import run_probes

    (record,) = run_probes(["link_spool_foreign_wal_at_start"], quick=True)
    assert record["ok"] and not record["crashed"], record["detail"]
    assert record["lost"] == 0, record["detail"]
