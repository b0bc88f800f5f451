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
counted in ``shed`` (in memory and persisted in the spool's ``meta`` table).

The spool also persists ``next_seq`` so sequence numbers stay monotonic across restarts.
A spool is used by one thread at a time (the shipper's background thread).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

SPOOL_SCHEMA_VERSION = 1
PAGE_SIZE = 16384
"""Page size of new spool files: a ~1.4 KB row costs a third of the page writes of 4 KiB."""


class SpoolError(RuntimeError):
    """The spool file cannot be opened, or a write to it failed."""


class Spool:
    """A bounded, durable FIFO of ``(seq, payload)`` rows keyed by sequence number."""

    def __init__(self, path: Path | str, max_bytes: int, *,
                 check_same_thread: bool = True) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, timeout=5.0,
                                         check_same_thread=check_same_thread)
            self._conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # new files only
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
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
        except sqlite3.Error as exc:
            raise SpoolError(f"{self.path}: cannot open spool: {exc}") from exc
        self.shed = 0  # rows dropped by the shedding policy since this object was opened
        self.shed_total = self._meta("shed_total", 0)
        self.next_seq = self._meta("next_seq", 0)

    def put(self, items: Sequence[tuple[int, bytes]]) -> int:
        """Append rows (and persist ``next_seq``) in one transaction; returns rows shed."""
        if not items:
            return 0
        incoming = list(items)
        size_in = sum(len(p) for _, p in incoming)
        shed = 0
        while size_in > self.max_bytes and len(incoming) > 1:  # batch alone too big
            size_in -= len(incoming.pop(0)[1])
            shed += 1
        try:
            with self._conn:
                shed += self._make_room(size_in)
                before = self._conn.total_changes
                self._conn.executemany(
                    "INSERT OR IGNORE INTO spool (seq, payload, size) VALUES (?, ?, ?)",
                    [(seq, payload, len(payload)) for seq, payload in incoming])
                inserted = self._conn.total_changes - before
                top = max(seq for seq, _ in items) + 1
                self.next_seq = max(self.next_seq, top)
                self._set_meta("next_seq", self.next_seq)
                if shed:
                    self._set_meta("shed_total", self.shed_total + shed)
        except sqlite3.Error as exc:
            self._recount()
            raise SpoolError(f"{self.path}: write failed: {exc}") from exc
        if inserted == len(incoming):
            self.rows += inserted
            self.bytes += size_in
        else:  # some seqs were already spooled (a re-put); count from the table
            self._recount()
        if shed:
            self.shed += shed
            self.shed_total += shed
            log.warning("spool full (%d bytes max): shed %d oldest experiences (%d total)",
                        self.max_bytes, shed, self.shed_total)
        return shed

    def read_after(self, seq: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` rows with sequence number > ``seq``, oldest first."""
        cursor = self._conn.execute(
            "SELECT seq, payload FROM spool WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit))
        return cursor.fetchall()

    def get(self, seqs: Iterable[int]) -> list[tuple[int, bytes]]:
        """Return the rows still present among ``seqs`` (shed ones are gone), oldest first."""
        seqs = list(seqs)
        out: list[tuple[int, bytes]] = []
        for start in range(0, len(seqs), 500):
            chunk = seqs[start:start + 500]
            marks = ",".join("?" * len(chunk))
            out += self._conn.execute(
                f"SELECT seq, payload FROM spool WHERE seq IN ({marks})", chunk).fetchall()
        out.sort()
        return out

    def remove(self, seqs: Iterable[int]) -> int:
        """Delete acknowledged rows in one transaction; returns how many were present."""
        seqs = list(seqs)
        if not seqs:
            return 0
        removed = freed = 0
        try:
            with self._conn:
                for start in range(0, len(seqs), 500):
                    chunk = seqs[start:start + 500]
                    marks = ",".join("?" * len(chunk))
                    count, size = self._conn.execute(
                        f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM spool "
                        f"WHERE seq IN ({marks})", chunk).fetchone()
                    self._conn.execute(f"DELETE FROM spool WHERE seq IN ({marks})", chunk)
                    removed += count
                    freed += size
        except sqlite3.Error as exc:
            self._recount()
            raise SpoolError(f"{self.path}: delete failed: {exc}") from exc
        self.rows -= removed
        self.bytes -= freed
        return removed

    def remove_range(self, first: int, last: int) -> int:
        """Delete every row with ``first <= seq <= last`` in one transaction; returns how many.

        The shipper's cheap path for an acknowledged batch: one range scan on the primary
        key instead of an ``IN`` list of a thousand ids. Only valid when every spooled row
        in that range was in the batch, which the shipper tracks.
        """
        if last < first:
            return 0
        try:
            with self._conn:
                count, size = self._conn.execute(
                    "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM spool "
                    "WHERE seq BETWEEN ? AND ?", (first, last)).fetchone()
                if count:
                    self._conn.execute("DELETE FROM spool WHERE seq BETWEEN ? AND ?",
                                       (first, last))
        except sqlite3.Error as exc:
            self._recount()
            raise SpoolError(f"{self.path}: delete failed: {exc}") from exc
        self.rows -= count
        self.bytes -= size
        return count

    def close(self) -> None:
        """Close the database (idempotent)."""
        try:
            self._conn.close()
        except sqlite3.Error:  # closing twice or after a failed open
            pass

    def _make_room(self, incoming: int) -> int:
        over = self.bytes + incoming - self.max_bytes
        if over <= 0:
            return 0
        victims: list[int] = []
        freed = 0
        for seq, size in self._conn.execute("SELECT seq, size FROM spool ORDER BY seq"):
            victims.append(seq)
            freed += size
            if freed >= over:
                break
        self._conn.executemany("DELETE FROM spool WHERE seq = ?", [(s,) for s in victims])
        self.rows -= len(victims)
        self.bytes -= freed
        return len(victims)

    def _recount(self) -> None:
        row = self._conn.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM spool")
        self.rows, self.bytes = row.fetchone()

    def _meta(self, key: str, default: int) -> int:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else int(row[0])

    def _set_meta(self, key: str, value: int) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
