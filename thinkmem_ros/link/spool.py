"""Durable robot-side spool of encoded experiences that the consolidator has not acked.

Every experience the shipper takes from its in-memory queue is written here before it is
sent and removed only when an ACK says the consolidator committed it, so a consolidator
outage or a node restart loses nothing that reached the spool; on start the shipper
re-sends whatever is left. SQLite in WAL mode with ``synchronous=NORMAL`` survives a
process crash (kill -9): a commit is in the WAL file before ``put`` returns, and only
checkpoints are fsynced. A power cut (or kernel crash) may lose the last transactions,
i.e. the newest experiences that were not yet acknowledged; ``FULL`` would close that
window at the cost of one fsync per batch, which the robot's tick-rate shipping does not
need.

Shedding policy: the spool is bounded in bytes (payload sizes). When a new batch would
exceed ``max_bytes``, the OLDEST rows are deleted first until it fits; the newest
experiences are never the ones dropped, because recent situations matter most to the
consolidator and old ones are most likely already represented. Every dropped row is
counted in ``shed`` (in memory and persisted in the spool's ``meta`` table). On disk the
files take more than ``max_bytes``: SQLite's pages (about 1.25x the payload), the WAL
(checkpointed every ``_WAL_PAGES`` pages, 16 MB, or at half the cap for a cap below 32 MB)
and the reserve file (below); a 1 MB cap peaks near 3 MB, a 256 MB cap near 340 MB.

A full filesystem is the same policy with a smaller, unplanned bound. SQLite needs free
space even to delete (the WAL records the change before the database file does), so a
spool that filled its disk could otherwise neither take new rows nor drop acknowledged
ones, and would never drain (a checkpoint that cannot grow the database file leaves the
WAL full, and then every write needs new space). What prevents that wedge:

* when the filesystem runs low (free space under ``low_disk_bytes``) writes and deletes
  go in small transactions, each checkpointed, and the WAL is kept at a bounded size, so
  it is reused rather than grown;
* the database file grows only while the free space stays above what the WAL and one
  transaction need; beyond that, new rows take the pages of the oldest rows, shed in the
  same transaction (SQLite reuses pages freed earlier in a transaction);
* a reserve file (``<spool>.reserve``, ``reserve_bytes``, at most 1/8 of the filesystem)
  holds space back for when something else fills the disk: when a write fails with
  "database or disk is full" it is released, so the deletes that make room (and those
  of acknowledged rows) can still commit;
* new spool files use ``auto_vacuum=INCREMENTAL``, so pages freed by acknowledged rows go
  back to the filesystem and the reserve can be taken again once the spool drains (a
  spool file from before is converted the next time it is opened empty).

While the disk is full, the oldest rows are shed to make room for new ones and counted in
``shed_disk_full`` (persisted like ``shed``); if nothing can be written even with the
spool empty (another process filled the disk), ``put`` raises ``SpoolFull`` after counting
the incoming rows there too. ``disk_full`` tells whether the filesystem is still short of
room (the reserve could not be taken back yet).

Damage (a bad sector, a power cut on an SD card, a leftover WAL of another database) is
never adopted and never fatal: the file is judged read-only before anything may write to
it, and a damaged one (found then, by ``verify`` or by a later read or write) is moved
aside as ``<spool>.damaged-<UTC time>``, never deleted, and every row that can still be
read goes on in a fresh spool; one ERROR line says what was found and how many rows were
saved. Another program's database at the path is refused and left as it was. How a
damaged file is read is ``spool_damage``'s business.

The spool also persists ``next_seq`` so sequence numbers stay monotonic across restarts.
A spool is used by one thread at a time (the shipper's background thread).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from thinkmem_ros.link import spool_damage
from thinkmem_ros.link.sockets import RateLimitedLog
from thinkmem_ros.link.spool_damage import SIDE_FILES, file_size, is_damage

log = logging.getLogger(__name__)

SPOOL_SCHEMA_VERSION = 1
PAGE_SIZE = 16384
"""Page size of new spool files: a ~1.4 KB row costs a third of the page writes of 4 KiB."""
RESERVE_BYTES = 1 << 20
"""Default space held back by the reserve file (capped at 1/8 of the filesystem)."""
LOW_DISK_BYTES = 64 << 20
"""Below this much free space the WAL is checkpointed after every write."""
_LOW_DISK_WAL_PAGES = 16  # most WAL pages kept (and reused) in low-disk mode
_WAL_PAGES = 1000
"""SQLite's default checkpoint interval (16 MB of WAL at this page size). A spool whose cap
is small checkpoints at half its cap instead: max_bytes counts payload bytes, and a 16 MB
WAL beside a 1 MB cap would be most of what the spool costs on disk."""
FULL_CHECK_AT_OPEN_BYTES = 32 << 20
"""Spool files up to this size get every page read (``quick_check``) before they open.

A larger one without a leftover WAL opens after the cheap read-only checks (schema, meta,
whose tables) and is read in full by ``verify``, which the shipper runs once started, so
a slow card cannot make ``start`` time out. Measured here (1.4 KB rows, file read from
disk, page cache warm in brackets): a full default spool (256 MB) opened in 1.5-2.1 s
(0.17 s) with the check and in 0.15-0.45 s (0.06 s) without it, the row count still
reading the table; ``verify`` then took 1.55-1.65 s (0.11 s). At 32 MB the check costs
0.19 s (0.015 s): under 2 s even on an SD card ten times slower. A non-empty WAL is
always checked at open: a crash or power cut left it, and it is exactly what a read-write
open would checkpoint into the file for good.
"""
_RESERVE_RETRY_S = 0.5  # how often a missing reserve is tried again
_T = TypeVar("_T")


class SpoolError(RuntimeError):
    """The spool file cannot be opened, or a write to it failed.

    When ``put`` raises it, its first ``written`` rows were spooled (a low disk writes a
    batch as several transactions) and the rest were not.
    """

    written = 0


class SpoolDamaged(SpoolError):
    """The spool's bytes are damaged (malformed, not a database, a page that cannot be read).

    ``Spool.recover`` moves the file aside and goes on with a fresh spool holding every
    row that can still be read.
    """


class SpoolFull(SpoolError):
    """The filesystem is full and nothing could be written, not even after shedding.

    The rows of the batch after its first ``written`` are counted in ``shed_disk_full``.
    """


class Spool:
    """A bounded, durable FIFO of ``(seq, payload)`` rows keyed by sequence number."""

    def __init__(self, path: Path | str, max_bytes: int, *,
                 check_same_thread: bool = True, reserve_bytes: int = RESERVE_BYTES,
                 low_disk_bytes: int = LOW_DISK_BYTES,
                 full_check_bytes: int | None = None) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        if reserve_bytes < 0:
            raise ValueError(f"reserve_bytes must be >= 0, got {reserve_bytes}")
        if low_disk_bytes < 0:
            raise ValueError(f"low_disk_bytes must be >= 0, got {low_disk_bytes}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.low_disk_bytes = low_disk_bytes
        self._reserve_path = self.path.with_name(self.path.name + ".reserve")
        self._low_disk = False
        self._reserve_retry_at = 0.0
        self._full_log = RateLimitedLog(log, 100)
        self.disk_full = False  # the filesystem is short of room (reserve not held)
        # acknowledged rows left since the disk filled: only their pages may be given back
        # to the filesystem; the pages shedding frees are the room the spool writes into
        self._acked_since_full = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpoolError(f"{self.path}: cannot create its folder: {exc}") from exc
        total = _fs_total(self.path.parent)
        self.reserve_bytes = min(reserve_bytes, total // 8) if total else reserve_bytes
        # largest transaction on a low disk: it must fit the reserve once that is released
        self._txn_bytes = max(PAGE_SIZE, self.reserve_bytes // 4)
        # pages the WAL keeps (and reuses) on a low disk, and the free space kept for it
        self._wal_pages = max(4, min(_LOW_DISK_WAL_PAGES, self.reserve_bytes // PAGE_SIZE))
        self._normal_wal_pages = max(self._wal_pages,
                                     min(_WAL_PAGES, max_bytes // (2 * PAGE_SIZE)))
        self._headroom = 2 * self._txn_bytes + 4 * PAGE_SIZE
        self._check_same_thread = check_same_thread
        self.rows = self.bytes = 0
        self.shed = 0  # rows dropped by the size bound since this object was opened
        self.shed_disk_full = 0  # rows dropped because the filesystem was full
        self.shed_total = self.shed_disk_full_total = self.next_seq = 0
        self.lost = 0  # spooled rows a damaged spool could no longer read (see recover)
        self._full_check_bytes = FULL_CHECK_AT_OPEN_BYTES if full_check_bytes is None \
            else full_check_bytes
        self.checked = False  # every page was read since open (else ``verify`` will)
        self._open_judged()
        self._check_disk()
        self._take_reserve()

    def _open_judged(self) -> None:
        """Open the file once judged sound; a damaged one is replaced (and salvaged)."""
        damage = self._at_open(self._inspect)
        if damage is None:
            try:
                self._at_open(self._open)
                self._load_meta()
            except SpoolDamaged as exc:  # damage the check did not see, met by a first read
                self.close()
                damage = str(exc).removeprefix(f"{self.path}: ")
        if damage is not None:
            self._start_over(damage, self._move_aside(damage), None)

    def _open(self) -> None:
        self._conn = sqlite3.connect(self.path, timeout=5.0,
                                     check_same_thread=self._check_same_thread)
        try:
            self._conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # new files only
            self._conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # new files only
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._limit_wal()
            with self._conn:
                self._conn.execute(
                    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER)")
                self._conn.execute(
                    "CREATE TABLE IF NOT EXISTS spool (seq INTEGER PRIMARY KEY, "
                    "payload BLOB NOT NULL, size INTEGER NOT NULL)")
                self._conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                                   (SPOOL_SCHEMA_VERSION,))
            version = self._meta("schema_version", SPOOL_SCHEMA_VERSION)
            if version != SPOOL_SCHEMA_VERSION:
                raise SpoolError(f"{self.path}: spool schema {version} is not supported")
            row = self._conn.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM spool")
            self.rows, self.bytes = row.fetchone()
            if not self.rows and not self._conn.execute("PRAGMA auto_vacuum").fetchone()[0]:
                # a spool from before auto_vacuum, empty now: converting it costs nothing
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
                    self._conn.execute("VACUUM")
        except BaseException:
            self._conn.close()
            raise

    def put(self, items: Sequence[tuple[int, bytes]]) -> int:
        """Append rows (and persist ``next_seq``) in one transaction; returns rows dropped.

        The count covers rows shed by the size bound and, on a full disk, the oldest rows
        shed to make room (also in ``shed_disk_full``). Raises ``SpoolFull`` when even an
        emptied spool cannot take the rows (they are counted in ``shed_disk_full``), and
        ``SpoolError`` on any other write failure.
        """
        if not items:
            return 0
        incoming = list(items)
        size_in = sum(len(p) for _, p in incoming)
        shed = 0
        while size_in > self.max_bytes and len(incoming) > 1:  # batch alone too big
            size_in -= len(incoming.pop(0)[1])
            shed += 1
        self._check_disk()
        # on a low disk, small transactions: each must fit the WAL that is kept (and the
        # reserve), or a full disk could not even take the deletes that make room
        step = len(incoming)
        if self._low_disk:
            step = max(1, len(incoming) * self._txn_bytes // max(size_in, 1))
        dropped = written = 0
        for start in range(0, len(incoming), step):
            chunk = incoming[start:start + step]
            try:
                size_rows, disk_rows = self._put_chunk(chunk, shed if start == 0 else 0)
            except SpoolError as exc:
                exc.written = written
                if start == 0 and shed:  # the rows the size bound cut are gone too
                    self.shed += shed
                    self.shed_total += shed
                if isinstance(exc, SpoolFull):
                    self._count_disk_shed(len(incoming) - written)
                raise
            self._after_write()
            written += len(chunk)
            dropped += size_rows + disk_rows
            if size_rows:
                self.shed += size_rows
                self.shed_total += size_rows
                log.warning("spool full (%d bytes max): shed %d oldest experiences (%d "
                            "total)", self.max_bytes, size_rows, self.shed_total)
            if disk_rows:
                self._count_disk_shed(disk_rows, persisted=True)
        return dropped

    def read_after(self, seq: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` rows with sequence number > ``seq``, oldest first."""
        try:
            return self._conn.execute(
                "SELECT seq, payload FROM spool WHERE seq > ? ORDER BY seq LIMIT ?",
                (seq, limit)).fetchall()
        except sqlite3.Error as exc:
            raise self._error("read failed", exc) from exc

    def get(self, seqs: Iterable[int]) -> list[tuple[int, bytes]]:
        """Return the rows still present among ``seqs`` (shed ones are gone), oldest first."""
        seqs = list(seqs)
        out: list[tuple[int, bytes]] = []
        try:
            for start in range(0, len(seqs), 500):
                chunk = seqs[start:start + 500]
                marks = ",".join("?" * len(chunk))
                out += self._conn.execute(
                    f"SELECT seq, payload FROM spool WHERE seq IN ({marks})", chunk).fetchall()
        except sqlite3.Error as exc:
            raise self._error("read failed", exc) from exc
        out.sort()
        return out

    def remove(self, seqs: Iterable[int]) -> int:
        """Delete acknowledged rows; returns how many were present.

        One transaction normally; on a low disk several small ones (a delete writes every
        page it empties to the WAL, which must stay within what the disk has).
        """
        seqs = sorted(set(seqs))
        removed = 0
        for start in range(0, len(seqs), 500):
            chunk = seqs[start:start + 500]
            marks = ",".join("?" * len(chunk))
            if not self._low_disk:
                removed += self._delete_txn(f"seq IN ({marks})", chunk)
                continue
            present = self._sizes(f"seq IN ({marks})", chunk)
            for group in self._size_groups(present):
                removed += self._delete_txn(
                    f"seq IN ({','.join('?' * len(group))})", group)
        return removed

    def remove_range(self, first: int, last: int) -> int:
        """Delete every row with ``first <= seq <= last``; returns how many.

        The shipper's cheap path for an acknowledged batch: one range scan on the primary
        key instead of an ``IN`` list of a thousand ids. Only valid when every spooled row
        in that range was in the batch, which the shipper tracks. One transaction
        normally, several small ones on a low disk (as ``remove``).
        """
        if last < first:
            return 0
        if not self._low_disk:
            return self._delete_txn("seq BETWEEN ? AND ?", (first, last))
        present = self._sizes("seq BETWEEN ? AND ?", (first, last))
        return sum(self._delete_txn("seq BETWEEN ? AND ?", (group[0], group[-1]))
                   for group in self._size_groups(present))

    def check_space(self) -> bool:
        """Re-check a full disk (give back freed pages, retake the reserve); True if still full.

        Writes do this themselves; the shipper also calls it about once a second, so a
        spool that drained and went quiet reports the disk as no longer full.
        """
        if self.disk_full:
            self._reserve_retry_at = 0.0
            self._after_write()
        return self.disk_full

    def free_bytes(self) -> int:
        """Free space on the spool's filesystem (bytes available to this process)."""
        return _fs_free(self.path.parent)

    def close(self) -> None:
        """Close the database (idempotent); the reserve file stays for the next start."""
        try:
            self._conn.close()
        except sqlite3.Error:  # closing twice or after a failed open
            pass

    def recover(self, reason: str) -> None:
        """Go on with a fresh spool after damage met at run time (``reason``, for the log).

        As at open: the damaged file is moved aside, never deleted, and every row it can
        still give is copied into the fresh spool with its seq; the rows it held that
        could not be read (the row gauge is exact) are added to ``lost``. Raises
        SpoolError when the file cannot be moved aside; the spool is then reopened as it
        was.
        """
        known = self.rows
        reason = reason.removeprefix(f"{self.path}: ")
        self.close()
        try:
            aside = self._move_aside(reason)
        except SpoolError:
            with contextlib.suppress(sqlite3.Error, SpoolError):
                self._open()
            raise
        self._start_over(reason, aside, known)

    def verify(self) -> bool:
        """Read every page, if opening left that for later; True if damage was recovered from.

        A large spool opens without this (seconds on an SD card would hold up the
        shipper's start); its owner calls it once running. Through a read-only
        connection, which reads beside the open one and never writes. Damage found goes
        through ``recover``: the file moved aside, every readable row kept, the unreadable
        counted in ``lost``. Raises SpoolError when the check cannot run or the file
        cannot be moved aside.
        """
        if self.checked:
            return False
        try:
            damage = spool_damage.check_pages(self.path)
        except sqlite3.Error as exc:
            raise self._error("cannot check spool", exc) from exc
        self.checked = True
        if damage is None:
            return False
        self.recover(damage)
        return True

    # ---- internals
    def _put_chunk(self, chunk: list[tuple[int, bytes]], trimmed: int) -> tuple[int, int]:
        """Insert one chunk; on a full disk shed ever more of the oldest rows until it fits."""
        size_in = sum(len(p) for _, p in chunk)
        top = max(seq for seq, _ in chunk) + 1
        room = -1  # bytes of old rows to shed for the disk (-1: not worked out yet)
        released = False  # the reserve was given back for this chunk
        while True:
            try:
                if room < 0:
                    room = self._room_needed(size_in)
                return self._put_once(chunk, size_in, top, room, trimmed)
            except sqlite3.Error as exc:
                if not self._is_full(exc):
                    with contextlib.suppress(SpoolError):
                        self._recount()
                    raise self._error("write failed", exc) from exc
                if released and room >= self.bytes:  # an emptied spool did not take them
                    raise SpoolFull(f"{self.path}: filesystem full, experiences could not "
                                    f"be spooled") from exc
                if not released:
                    self._disk_full()
                    released = True
                room = max(2 * room, size_in, PAGE_SIZE)

    def _room_needed(self, size_in: int) -> int:
        """Bytes of old rows to shed first so that ``size_in`` new bytes fit on a low disk.

        A checkpoint that cannot grow the database file leaves the WAL un-reset, and then
        every later write (deletes included) needs new space: the wedge. So the file may
        grow only while the free space stays above what the WAL and the reserve need;
        otherwise the new rows go into pages freed by shedding the oldest (SQLite reuses
        pages freed earlier in the same transaction).
        """
        if not self._low_disk:
            return 0
        free_pages = self._conn.execute("PRAGMA freelist_count").fetchone()[0]
        growth = max(0, size_in * 5 // 4 + 2 * PAGE_SIZE - free_pages * PAGE_SIZE)
        deficit = growth + self._headroom - self.free_bytes()
        if deficit <= 0:
            return 0
        self.disk_full = True
        # shed about what comes in: over many writes the pages it empties are the pages
        # the new rows fill, so the file stops growing without emptying the spool
        return min(deficit, size_in * 5 // 4)

    def _put_once(self, incoming: list[tuple[int, bytes]], size_in: int, top: int,
                  room: int, trimmed: int) -> tuple[int, int]:
        """One insert transaction; ``room`` > 0 first sheds that many old bytes for the disk.

        ``trimmed`` rows of the batch were already cut by the size bound (persisted here).
        Returns ``(rows shed by the size bound, rows shed for the disk)``. The in-memory
        gauges move only once the transaction committed, so a failed try leaves them exact.
        """
        with self._conn:
            disk_rows, disk_bytes = self._shed_oldest(room) if room else (0, 0)
            over = self.bytes - disk_bytes + size_in - self.max_bytes
            size_rows, size_bytes = self._shed_oldest(over) if over > 0 else (0, 0)
            before = self._conn.total_changes
            self._conn.executemany(
                "INSERT OR IGNORE INTO spool (seq, payload, size) VALUES (?, ?, ?)",
                [(seq, payload, len(payload)) for seq, payload in incoming])
            inserted = self._conn.total_changes - before
            self._set_meta("next_seq", max(self.next_seq, top))
            size_rows += trimmed
            if size_rows:
                self._set_meta("shed_total", self.shed_total + size_rows)
            if disk_rows:
                self._set_meta("shed_disk_full_total", self.shed_disk_full_total + disk_rows)
        self.next_seq = max(self.next_seq, top)
        if inserted == len(incoming):
            self.rows += inserted - disk_rows - (size_rows - trimmed)
            self.bytes += size_in - disk_bytes - size_bytes
        else:  # some seqs were already spooled (a re-put); count from the table
            self._recount()
        return size_rows, disk_rows

    def _sizes(self, where: str, params: Sequence[int]) -> list[tuple[int, int]]:
        try:
            return self._conn.execute(
                f"SELECT seq, size FROM spool WHERE {where} ORDER BY seq", params).fetchall()
        except sqlite3.Error as exc:
            raise self._error("read failed", exc) from exc

    def _size_groups(self, rows: Iterable[tuple[int, int]]) -> list[list[int]]:
        """Split ``(seq, size)`` rows (in seq order) into groups of at most a low-disk txn."""
        groups: list[list[int]] = [[]]
        size = 0
        for seq, row_size in rows:
            if groups[-1] and size + row_size > self._txn_bytes:
                groups.append([])
                size = 0
            groups[-1].append(seq)
            size += row_size
        return [g for g in groups if g]

    def _delete_txn(self, where: str, params: Sequence[int]) -> int:
        """Delete the rows ``where`` selects in one transaction; returns how many.

        On a full disk the reserve is released and the delete tried once more, so
        acknowledged rows can always leave a spool that filled its disk.
        """
        def delete() -> tuple[int, int]:
            with self._conn:
                count, size = self._conn.execute(
                    f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM spool WHERE {where}",
                    params).fetchone()
                if count:
                    self._conn.execute(f"DELETE FROM spool WHERE {where}", params)
            return count, size

        try:
            try:
                count, size = delete()
            except sqlite3.Error as exc:
                if not self._is_full(exc):
                    raise
                self._disk_full()
                count, size = delete()
        except sqlite3.Error as exc:
            with contextlib.suppress(SpoolError):
                self._recount()
            raise self._error("delete failed", exc) from exc
        self.rows -= count
        self.bytes -= size
        self._acked_since_full |= count > 0
        self._after_write()
        return count

    def _shed_oldest(self, nbytes: int) -> tuple[int, int]:
        """Delete the oldest rows holding at least ``nbytes`` (inside the open transaction).

        Returns ``(rows, bytes)`` deleted; the caller moves the gauges after the commit.
        """
        count = freed = 0
        last = None
        for seq, size in self._conn.execute("SELECT seq, size FROM spool ORDER BY seq"):
            count += 1
            freed += size
            last = seq
            if freed >= nbytes:
                break
        if last is not None:
            self._conn.execute("DELETE FROM spool WHERE seq <= ?", (last,))
        return count, freed

    def _count_disk_shed(self, count: int, persisted: bool = False) -> None:
        self.shed_disk_full += count
        self.shed_disk_full_total += count
        if not persisted:  # best effort: the disk is full, the meta row may not fit
            with contextlib.suppress(sqlite3.Error), self._conn:
                self._set_meta("shed_disk_full_total", self.shed_disk_full_total)
        self._full_log(logging.ERROR, "spool filesystem full (%s): %d experiences dropped, "
                       "%d in all", self.path.parent, count, self.shed_disk_full_total)

    def _is_full(self, exc: sqlite3.Error) -> bool:
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if code == sqlite3.SQLITE_FULL:
            return True
        # ENOSPC on some paths (WAL index, fallocate) surfaces as an I/O error
        return code == sqlite3.SQLITE_IOERR and self.free_bytes() < PAGE_SIZE

    def _disk_full(self) -> None:
        """The disk is full: give back the reserve and move the WAL's pages into the file."""
        if not self.disk_full:
            log.error("spool filesystem %s is full (%d bytes free): releasing the %d-byte "
                      "reserve; the oldest experiences are shed to make room",
                      self.path.parent, self.free_bytes(), self.reserve_bytes)
        self.disk_full = True
        self._acked_since_full = False
        self._reserve_retry_at = time.monotonic() + _RESERVE_RETRY_S
        self._release_reserve()
        self._set_low_disk(True)
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _release_reserve(self) -> None:
        try:
            self._reserve_path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:  # a read-only folder: the error that brought us here says so
            log.debug("cannot remove the spool's reserve file %s: %s", self._reserve_path, exc)

    def _after_write(self) -> None:
        """Keep the WAL small on a low disk, and take the reserve back when there is room."""
        self._check_disk()
        if self._low_disk:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        if self.disk_full and time.monotonic() >= self._reserve_retry_at:
            self._reserve_retry_at = time.monotonic() + _RESERVE_RETRY_S
            # while nothing leaves (the consolidator away), giving shed rows' pages back
            # for the reserve only trades spooled experiences for it, once per retry: on a
            # slow machine that emptied the spool to a few dozen rows
            if self._acked_since_full:
                self._give_back_pages(self.reserve_bytes + 2 * self._headroom)
            if self.free_bytes() >= self.reserve_bytes + 2 * self._headroom \
                    and self._take_reserve():
                self.disk_full = False
                log.warning("spool filesystem %s has room again (%d bytes free)",
                            self.path.parent, self.free_bytes())

    def _give_back_pages(self, want_free: int) -> None:
        """Return pages freed by acknowledged rows to the filesystem until ``want_free``.

        A few pages per step: moving pages writes them to the WAL, which must stay within
        what it keeps on a low disk; each step is checkpointed before the next.
        """
        with contextlib.suppress(sqlite3.Error):
            for _ in range(256):
                need = want_free - self.free_bytes()
                free_pages = self._conn.execute("PRAGMA freelist_count").fetchone()[0]
                if need <= 0 or not free_pages:
                    return
                step = min(free_pages, max(1, self._wal_pages // 2), -(-need // PAGE_SIZE))
                self._conn.execute(f"PRAGMA incremental_vacuum({step})").fetchall()
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _check_disk(self) -> None:
        self._set_low_disk(self.free_bytes() < self.low_disk_bytes)

    def _set_low_disk(self, low: bool) -> None:
        if low == self._low_disk:
            return
        self._low_disk = low
        with contextlib.suppress(sqlite3.Error):
            self._limit_wal()

    def _limit_wal(self) -> None:
        """Checkpoint interval and WAL size for the disk's state and the spool's cap.

        A bounded WAL is checkpointed every that many pages and truncated back to that size
        (per connection, so every open sets it): kept small on a low disk, and below half
        the cap for a small spool; SQLite's defaults otherwise.
        """
        pages = self._wal_pages if self._low_disk else self._normal_wal_pages
        limit = pages * (PAGE_SIZE + 24) + 32 if pages < _WAL_PAGES else -1
        self._conn.execute(f"PRAGMA wal_autocheckpoint={pages}")
        self._conn.execute(f"PRAGMA journal_size_limit={limit}")

    def _take_reserve(self) -> bool:
        """Make sure the reserve file holds ``reserve_bytes`` of real blocks; True if it does."""
        want = self.reserve_bytes
        if want == 0:
            return True
        try:
            if self._reserve_path.stat().st_size >= want:
                return True
        except FileNotFoundError:
            pass
        if self.free_bytes() < want + self._headroom:  # leave the spool room to write
            return False
        try:
            fd = os.open(self._reserve_path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, want)
            finally:
                os.close(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._reserve_path.unlink()
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                log.warning("cannot create the spool's reserve file %s: %s",
                            self._reserve_path, exc)
            return False
        return True

    def _recount(self) -> None:
        try:
            row = self._conn.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM spool")
            self.rows, self.bytes = row.fetchone()
        except sqlite3.Error as exc:
            raise self._error("read failed", exc) from exc

    def _load_meta(self) -> None:
        self.shed_total = self._meta("shed_total", 0)
        self.shed_disk_full_total = self._meta("shed_disk_full_total", 0)
        self.next_seq = self._meta("next_seq", 0)

    def _meta(self, key: str, default: int) -> int:
        try:
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?",
                                     (key,)).fetchone()
        except sqlite3.Error as exc:
            raise self._error("read failed", exc) from exc
        if row is None:
            return default
        if not isinstance(row[0], int):
            raise SpoolDamaged(f"{self.path}: meta.{key} is not an integer ({row[0]!r})")
        return row[0]

    def _set_meta(self, key: str, value: int) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def _error(self, what: str, exc: sqlite3.Error, hint: str = "") -> SpoolError:
        """``exc`` as a SpoolError naming the file; SpoolDamaged when the bytes are bad."""
        kind = SpoolDamaged if is_damage(exc) else SpoolError
        return kind(f"{self.path}: {what}: {exc}{hint}")

    # ---- opening: judge the file before anything may write to it
    def _at_open(self, step: Callable[[], _T]) -> _T:
        """Run one step of opening; on a full disk give back the reserve and try once more.

        A node restarted on a full disk: the reserve of the last run makes the room that
        opening (the WAL index, the WAL itself) needs. Any other error keeps the reserve.
        """
        try:
            return step()
        except sqlite3.Error as exc:
            if not (self._is_full(exc) and self._reserve_path.exists()):
                raise self._error("cannot open spool", exc, self._hint()) from exc
            self._release_reserve()
        try:
            return step()
        except sqlite3.Error as again:
            raise self._error("cannot open spool", again, self._hint()) from again

    def _hint(self) -> str:
        """Why opening may have failed, from the files' modes (for the one-line message)."""
        folder = self.path.parent
        if not os.access(folder, os.W_OK):
            return (f" (the folder {folder} is not writable: a read-only filesystem or "
                    f"the wrong owner)")
        for suffix in SIDE_FILES:
            name = f"{self.path}{suffix}"
            if os.path.exists(name) and not os.access(name, os.R_OK | os.W_OK):
                return f" ({name} is not readable and writable by this user)"
        return ""

    def _inspect(self) -> str | None:
        """What is wrong with the file at ``path`` (it is then replaced), or None.

        Judged read-only (``spool_damage.judge_file``) before anything may write to it;
        every page is read only where that is cheap or a leftover WAL calls for it (see
        ``FULL_CHECK_AT_OPEN_BYTES``), else ``verify`` does it later. Raises SpoolError
        for a refusal: a directory in the way, another program's database, a newer
        schema.
        """
        wal = file_size(Path(f"{self.path}-wal"))
        full = bool(wal) or file_size(self.path) <= self._full_check_bytes
        verdict, detail = spool_damage.judge_file(self.path, SPOOL_SCHEMA_VERSION, full)
        if verdict == "refused":
            raise SpoolError(detail)
        self.checked = full
        return detail if verdict == "damaged" else None

    # ---- damage: move the file aside, salvage what can be read into a fresh one
    def _move_aside(self, reason: str) -> Path:
        try:
            return spool_damage.move_aside(self.path)
        except OSError as exc:
            raise SpoolError(f"{self.path} is damaged ({reason}) and cannot be moved "
                             f"aside: {exc}") from exc

    def _start_over(self, reason: str, aside: Path, known_rows: int | None) -> None:
        """Open a fresh spool in place of the damaged one (now ``aside``) and salvage it.

        ``known_rows``: how many rows the damaged spool held (None at open: not known).
        """
        try:
            self._at_open(self._open)
        except SpoolError as exc:
            raise SpoolError(f"{self.path} was damaged ({reason}) and moved aside to "
                             f"{aside}, but a fresh spool cannot be opened: {exc}") from exc
        self.checked = True
        self._low_disk = False  # the new connection takes the low-disk settings anew
        self._check_disk()
        copied, lost = self._salvage(aside, known_rows)
        log.error("spool %s was damaged (%s): moved it aside to %s (with its -wal/-shm); "
                  "salvaged %d rows into a fresh spool, %s", self.path, reason, aside,
                  copied, lost)
        for old in spool_damage.prune_damaged(self.path):
            log.warning("deleted the older damaged spool copy %s (the newest %d are kept; "
                        "its rows were salvaged when it was moved aside)", old,
                        spool_damage.KEEP_DAMAGED)

    def _salvage(self, aside: Path, known_rows: int | None) -> tuple[int, str]:
        """Copy every row still readable in ``aside`` into this fresh spool, keeping its seq.

        ``next_seq`` never goes back: the highest of this spool's, the copy's ``meta`` and
        the salvaged seqs + 1 (``put`` sees to that). Returns the rows copied and what
        was lost, in words.
        """
        found = spool_damage.salvage(aside, self._conn, self._salvage_put)
        self._keep_meta(found.meta, at_open=known_rows is None)
        if known_rows is None:
            return found.copied, spool_damage.loss_words(found, self._conn)
        lost = max(0, known_rows - found.copied - found.failed) + found.failed
        self.lost += lost
        return found.copied, f"{lost} lost"

    def _salvage_put(self, rows: list[tuple[int, bytes]]) -> int:
        """Spool salvaged rows; returns how many could not be written (not for a full disk)."""
        try:
            self.put(rows)
        except SpoolFull:  # put counted them in shed_disk_full
            return 0
        except SpoolError as exc:
            return len(rows) - exc.written
        return 0

    def _keep_meta(self, meta: dict[str, int], at_open: bool) -> None:
        """Persist next_seq (never lower than before) and the shed totals in the fresh file."""
        self.next_seq = max(self.next_seq, meta["next_seq"])
        if at_open:  # the totals so far count only what the salvage itself shed
            self.shed_total += meta["shed_total"]
            self.shed_disk_full_total += meta["shed_disk_full_total"]
        try:
            with self._conn:
                self._set_meta("next_seq", self.next_seq)
                self._set_meta("shed_total", self.shed_total)
                self._set_meta("shed_disk_full_total", self.shed_disk_full_total)
        except sqlite3.Error as exc:  # next_seq is kept in memory; the next put persists it
            log.warning("cannot record the counters in the fresh spool %s: %s", self.path, exc)


def _fs_free(folder: Path) -> int:
    try:
        stat = os.statvfs(folder)
    except OSError:
        return 1 << 62  # unknown: behave as if there were room
    return stat.f_bavail * stat.f_frsize


def _fs_total(folder: Path) -> int:
    try:
        stat = os.statvfs(folder)
    except OSError:
        return 0
    return stat.f_blocks * stat.f_frsize
