"""A spool on a full filesystem: shedding is counted, acked rows still leave, it drains.

Each test mounts a real 2 MiB tmpfs (as root; skipped with the reason otherwise) and fills
it with a real SQLite spool, or a real shipper whose consolidator is down, so what is
checked is SQLite's own behaviour on ENOSPC, not a simulation of it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid

import numpy as np
import pytest

from thinkmem_ros.consolidator.ingest import open_receiver
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.link.receiver import ReceiverConfig
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig
from thinkmem_ros.link.spool import Spool, SpoolFull


@contextlib.contextmanager
def tiny_fs(tmp_path, size="2m"):
    """Mount a tmpfs of ``size`` at a fresh folder; skip when mounting is not permitted."""
    target = tmp_path / f"fs-{uuid.uuid4().hex[:8]}"
    target.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) here: cannot build a tiny filesystem")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def rows(start, n, size=1100):
    return [(seq, os.urandom(size)) for seq in range(start, start + n)]


def fill_disk(folder, name="hog"):
    """Take every free byte of the filesystem with another file (another process's logs)."""
    hog = folder / name
    with open(hog, "wb", buffering=0) as handle, contextlib.suppress(OSError):
        for block in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    handle.write(b"\1" * block)
    return hog


def test_spool_fills_its_disk_sheds_oldest_counted_and_still_drains(tmp_path):
    with tiny_fs(tmp_path) as fs:
        spool = Spool(fs / "spool.db", max_bytes=256 << 20)
        total = 0
        for i in range(20):  # 45,000 rows of 1.1 KB into 2 MiB: most must be shed
            spool.put(rows(total, 2048 if i % 2 else 157))
            total += 2048 if i % 2 else 157
        assert spool.disk_full
        # every row is either still spooled or counted as shed for the disk, newest kept
        assert spool.rows + spool.shed_disk_full == total
        assert spool.rows > 500, "shedding emptied the spool instead of making room"
        kept = [s for s, _ in spool.read_after(-1, 10**6)]
        assert kept == list(range(total - len(kept), total))
        # the consolidator comes back: every acknowledged batch leaves, on a full disk
        while spool.rows:
            batch = spool.read_after(-1, 512)
            assert spool.remove_range(batch[0][0], batch[-1][0]) == len(batch)
        assert spool.bytes == 0
        assert not spool.check_space(), "the drained spool still says the disk is full"
        assert (fs / "spool.db.reserve").exists()
        spool.close()
        again = Spool(fs / "spool.db", max_bytes=256 << 20)
        assert again.shed_disk_full_total == total - len(kept)
        again.close()


def test_disk_filled_by_someone_else_deletes_still_work_and_writes_are_refused(tmp_path):
    with tiny_fs(tmp_path) as fs:
        spool = Spool(fs / "spool.db", max_bytes=256 << 20)
        spool.put(rows(0, 200))
        hog = fill_disk(fs)
        assert spool.free_bytes() < 4096
        assert spool.remove_range(0, 99) == 100  # the reserve makes room for the delete
        assert spool.rows == 100
        spool.remove_range(100, 199)
        assert spool.rows == 0
        hog.unlink()
        hog = fill_disk(fs)  # 2.2 MB more: they fit only by shedding the oldest of them
        spool.put(rows(200, 2048))
        assert 0 < spool.rows < 2048 and spool.rows + spool.shed_disk_full == 2048
        spool.close()
        # a spool with nothing to shed and no reserve on a full disk: refused, counted
        empty = Spool(fs / "empty.db", max_bytes=1 << 20, reserve_bytes=0)
        hog2 = fill_disk(fs, "hog2")
        with pytest.raises(SpoolFull) as refused:
            empty.put(rows(0, 50))
        assert refused.value.written == 0
        assert empty.rows == 0 and empty.shed_disk_full == 50
        hog.unlink()
        hog2.unlink()
        empty.put(rows(50, 50))  # room again: writes work without a restart
        assert empty.rows == 50
        empty.close()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _exp(i):
    return Experience(robot_id="disk-bot", episode_id="e", stamp=float(i),
                      window=np.full((16, 7), i % 5, np.float32), labels=["trend", "hazard"],
                      probabilities=[0.5, 0.2], bundle_version=1, trace="t" * 200)


def test_shipper_on_a_full_disk_accounts_for_every_experience_and_drains(tmp_path):
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    db = tmp_path / "store.db"
    with tiny_fs(tmp_path) as fs:
        cfg = ShipperConfig(endpoint=endpoint, robot_id="disk-bot", spool_path=fs / "spool.db",
                            curve="off", ack_timeout_s=0.5, backoff_max_s=0.5)
        with ExperienceShipper(cfg) as shipper:
            accepted = refused = 0
            for i in range(12000):  # about 14 MB of records for a 2 MiB disk
                while len(shipper._queue) > 4000:
                    time.sleep(0.005)
                if shipper.ship(_exp(i)):
                    accepted += 1
                else:
                    refused += 1
            # the last batches may still be on their way into the spool: a 2-core machine
            # with a benchmark beside the suite took more than 20 s here
            deadline = time.monotonic() + 90
            while (sum(shipper.stats()[k] for k in ("queue", "spool_rows", "shed_disk_full"))
                   < accepted and time.monotonic() < deadline):
                time.sleep(0.02)
            time.sleep(0.2)
            stats = shipper.stats()
            assert stats["disk_full"] and stats["shed_disk_full"] > 0
            assert stats["spool_failed"] == 0 and stats["errors"] == 0
            assert refused == stats["refused_disk_full"]
            spooled = stats["spool_rows"]
            assert spooled + stats["shed_disk_full"] == accepted  # nothing vanished
            with open_receiver(ReceiverConfig(bind=endpoint, db_path=db, curve="off",
                                              poll_s=0.02)):
                assert shipper.flush(20.0), shipper.stats()
            stats = shipper.stats()
            assert stats["spool_rows"] == 0 and stats["errors"] == 0
            assert stats["stored"] == spooled
            deadline = time.monotonic() + 5
            while shipper.stats()["disk_full"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not shipper.stats()["disk_full"]
    with ExperienceStore(db) as store:
        assert store.count("disk-bot") == spooled
