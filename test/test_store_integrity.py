"""A damaged SQLite store: refused at open in one line, and a stop (no ACK) when met later.

Real SQLite files damaged the way a disk or a careless copy damages them (bytes overwritten
in the middle of the file, one b-tree page overwritten), real ZeroMQ, a real shipper and
the real consolidator process; no mocks. A damage "while open" is written after the
process opened the file (its quick_check passed), then another connection commits, as a
second process would, so the open connection reads the file again.
"""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import consolidator_world as world
import pytest

from thinkmem_ros.consolidator.ingest import StopOnDamage, open_receiver
from thinkmem_ros.consolidator.store import ExperienceStore, StoreError, StoreReadOnly
from thinkmem_ros.link.experience import encode_experience
from thinkmem_ros.link.receiver import ReceiverConfig, SinkError
from thinkmem_ros.link.security import write_signing_keypair
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig

ROOT = Path(__file__).resolve().parents[1]
FILLED = 300


def _filled(path):
    """A store holding a few hundred experiences of robot r0, closed (WAL checkpointed)."""
    records = world.experiences("r0", FILLED // 5, 5, seed=1)
    for seq, record in enumerate(records):
        record.seq = seq
    with ExperienceStore(path, flush_rows=0) as store:
        store.insert_many([(r, encode_experience(r)) for r in records])
    return path


def _page_size(path):
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA page_size").fetchone()[0]


def _overwrite(path, offset, size):
    """Overwrite ``size`` bytes at ``offset`` with a fixed pattern; returns what was there."""
    with open(path, "r+b") as f:
        f.seek(offset)
        before = f.read(size)
        f.seek(offset)
        f.write(b"\xa5" * size)
    return before


def _damage_middle(path):
    """Overwrite 4 KiB from the start of the middle page: its header and cell pointers.

    (Bytes inside a stored payload alone are no damage SQLite can see: that row no longer
    decodes and reads leave it out, ``test_store_lake``.)
    """
    size = _page_size(path)
    _overwrite(path, path.stat().st_size // size // 2 * size, 4096)


def _damage_page_under_an_open_store(path, table):
    """Overwrite the root page of ``table`` (an index name too) after a checkpoint, then
    commit from another connection so open connections read the file again."""
    conn = sqlite3.connect(path)
    try:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?",
                            (table,)).fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = _page_size(path)
        before = _overwrite(path, (root - 1) * size, size)
        conn.execute("PRAGMA user_version = 1")  # a commit: readers drop their cached pages
    finally:
        conn.close()
    return (root - 1) * size, before


def _restore(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _quick_check(path):
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA quick_check").fetchone()[0]


# ------------------------------------------------------------------------------ at open

@pytest.mark.parametrize("damage", ["middle_bytes", "index_page"])
def test_a_damaged_store_file_is_refused_at_open_in_one_line(tmp_path, damage):
    """It used to open without complaint: later every batch, or every round, failed."""
    path = _filled(tmp_path / "c.db")
    if damage == "middle_bytes":
        _damage_middle(path)
    else:
        with sqlite3.connect(path) as conn:
            root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = "
                                "'sqlite_autoindex_experiences_1'").fetchone()[0]
        _overwrite(path, (root - 1) * _page_size(path) + 100, 2000)
    before = path.read_bytes()
    with pytest.raises(StoreError) as refused:
        ExperienceStore(path)
    text = str(refused.value)
    assert type(refused.value).__name__ == "StoreDamaged"
    assert "\n" not in text and str(path) in text and "damaged" in text
    assert "quick_check" in text
    assert path.read_bytes() == before  # refused before anything was written into it


@pytest.mark.slow
@pytest.mark.parametrize("once", [True, False], ids=["once", "serve"])
def test_the_consolidator_refuses_a_damaged_store_with_one_line_and_exit_2(tmp_path, once):
    path = _filled(tmp_path / "c.db")
    _damage_middle(path)
    _, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "thinkmem_ros.consolidator.service", "--db", str(path),
            "--publish-dir", str(tmp_path / "published"), "--signing-key", str(key),
            "--epochs", "1", *(["--once"] if once else ["--bind", "tcp://127.0.0.1:*"])]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # serving a damaged store: what this test forbids
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, (out, err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert lines[0].startswith("thinkmem consolidator: ") and str(path) in lines[0]
    assert "damaged" in lines[0] and "quick_check" in lines[0]
    assert "READY" not in out


# ------------------------------------------------------------------------------ while open

def test_a_store_damaged_while_open_raises_damage_on_writes_and_reads(tmp_path):
    """A write met a bare "insert failed" (the receiver retried forever) and a read a bare
    sqlite3.DatabaseError (a round's traceback); both now name the damage."""
    path = _filled(tmp_path / "c.db")
    more = world.experiences("r1", 1, 3, seed=2)
    for seq, record in enumerate(more):
        record.seq = seq
    with ExperienceStore(path, flush_rows=0) as store:
        _damage_page_under_an_open_store(path, "sqlite_autoindex_experiences_1")
        with pytest.raises(StoreError, match="damaged") as refused:
            store.insert_many([(r, encode_experience(r)) for r in more])
        assert str(path) in str(refused.value) and "malformed" in str(refused.value)
    path = _filled(tmp_path / "d.db")
    with ExperienceStore(path, flush_rows=0) as store:
        _damage_page_under_an_open_store(path, "experiences")
        with pytest.raises(StoreError, match="damaged"):
            list(store.iter_all())


def test_a_store_that_cannot_be_written_is_probed_and_stops_its_writer(tmp_path):
    """A read-only store opened fine (opening only reads) and then refused every batch while
    the receiver served on; the probe names it, and a write that meets it stops the sink
    as damage does, without acknowledging the batch."""
    path = _filled(tmp_path / "c.db")
    more = world.experiences("r1", 1, 2, seed=2)
    for seq, record in enumerate(more):
        record.seq = seq
    with ExperienceStore(path, flush_rows=0) as store:
        store.check_writable()  # a writable store passes and keeps its tables
        # query_only: SQLite answers every write as for a read-only file (SQLITE_READONLY)
        # without this test process (root) giving up its right to write a 0444 file
        store._conn.execute("PRAGMA query_only = 1")
        with pytest.raises(StoreReadOnly, match="cannot be written") as refused:
            store.check_writable()
        assert str(path) in str(refused.value) and "\n" not in str(refused.value)
        stopped, told = [], []
        sink = StopOnDamage(store, lambda: stopped.append(True), told.append)
        with pytest.raises(StoreReadOnly, match="readonly database"):
            sink.insert_many([(r, encode_experience(r)) for r in more[:1]])
        assert stopped == [True] and len(told) == 1
        with pytest.raises(SinkError, match="not written"):  # later batches: no write
            sink.insert_many([(r, encode_experience(r)) for r in more[1:]])
    with ExperienceStore(path, flush_rows=0) as store:
        assert store.count() == FILLED
    with sqlite3.connect(path) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert "write_probe" not in tables


def _shipper(endpoint, tmp_path):
    return ExperienceShipper(ShipperConfig(
        endpoint=endpoint, robot_id="r1", spool_path=tmp_path / "spool.db", ack_timeout_s=0.5,
        backoff_initial_s=0.05, backoff_max_s=0.3)).start()


def test_a_receiver_stops_on_a_damaged_store_and_the_robot_keeps_the_batch(tmp_path, caplog):
    """The batch that meets the damage is not acknowledged, one ERROR names the store, the
    receiver stops (it used to refuse every batch forever); restoring the page shows that
    nothing acknowledged was lost, and the robot's re-send lands once restored."""
    path = _filled(tmp_path / "c.db")
    records = world.experiences("r1", 1, 2, seed=2)
    damaged = []
    config = ReceiverConfig(bind="tcp://127.0.0.1:*", db_path=path, curve="off", poll_s=0.02)
    receiver = open_receiver(config, on_damaged=damaged.append).start()
    with caplog.at_level("ERROR"), _shipper(receiver.endpoint, tmp_path) as shipper:
        assert shipper.ship(records[0]) and shipper.flush(20.0)  # acknowledged
        offset, page = _damage_page_under_an_open_store(path, "sqlite_autoindex_experiences_1")
        assert shipper.ship(records[1])
        assert not shipper.flush(3.0)  # not acknowledged: the robot keeps it
        receiver._thread.join(10.0)
        assert not receiver._thread.is_alive()  # stopped by itself
        receiver.stop()
        assert len(damaged) == 1 and str(path) in str(damaged[0])
        errors = [r.getMessage() for r in caplog.records
                  if r.levelname == "ERROR" and str(path) in r.getMessage()]
        assert len(errors) == 1 and "damaged" in errors[0], errors
        assert "not acknowledged" in errors[0]
        assert shipper.stats()["stored"] == 1
        _restore(path, offset, page)
        assert _quick_check(path) == "ok"
        with ExperienceStore(path) as store:
            assert store.count() == FILLED + 1  # everything acknowledged is there
        with open_receiver(ReceiverConfig(bind=receiver.endpoint, db_path=path, curve="off",
                                          poll_s=0.02)):
            assert shipper.flush(30.0)  # the kept batch lands in the restored store
    with ExperienceStore(path) as store:
        assert store.count() == FILLED + 2 and len(store.seqs("r1")) == 2


@pytest.mark.slow
def test_the_consolidator_exits_2_when_a_write_finds_its_store_damaged(tmp_path):
    """The serving consolidator used to run on, refusing every batch; now it stops with one
    line and exit status 2 without acknowledging the batch that met the damage."""
    path = _filled(tmp_path / "c.db")
    _, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    bundle = world.running_bundle(tmp_path / "running")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    log = open(tmp_path / "log.txt", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "thinkmem_ros.consolidator.service", "--db", str(path),
         "--publish-dir", str(tmp_path / "published"), "--signing-key", str(key),
         "--initial-bundle", str(bundle), "--bind", "tcp://127.0.0.1:*", "--period-s", "inf",
         "--check-s", "0.1"], stdout=subprocess.PIPE, stderr=log, env=env, text=True)
    records = world.experiences("r1", 1, 2, seed=2)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY "), (tmp_path / "log.txt").read_text()
        with _shipper(line.split()[1], tmp_path) as shipper:
            assert shipper.ship(records[0]) and shipper.flush(20.0)
            offset, page = _damage_page_under_an_open_store(
                path, "sqlite_autoindex_experiences_1")
            assert shipper.ship(records[1])
            assert proc.wait(60) == 2
            assert shipper.stats()["stored"] == 1  # the second batch was never acknowledged
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    text = (tmp_path / "log.txt").read_text()
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if "not acknowledged" in line]
    assert len(errors) == 1 and str(path) in errors[0] and "damaged" in errors[0], text[-3000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith("thinkmem consolidator: stopped: ") and str(path) in last
    assert "damaged" in last and "malformed" in last
    _restore(path, offset, page)
    with ExperienceStore(path) as store:
        assert store.count() == FILLED + 1  # everything acknowledged is there
