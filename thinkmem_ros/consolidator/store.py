"""The consolidator's experience store: SQLite by default, each experience exactly once.

Robots deliver at least once (they re-send until acknowledged), so the store is where
duplicates die: ``UNIQUE(robot_id, seq)`` with ``INSERT OR IGNORE`` keeps the first copy
of every (robot, sequence) key and counts the rest. A batch is one transaction, and the
receiver acknowledges only after it is committed, so a crash mid-write loses nothing
that was acknowledged and stores nothing twice.

Layout: a ``schema_version`` table plus ordered ``MIGRATIONS``; opening an older file
upgrades it in place, opening a newer one is refused. WAL mode lets discovery read while
the receiver writes. Several processes may share one file (receive-only processes and
the consolidator, ``consolidator.receive``): writers wait for each other through the
busy timeout, and a migration runs under the write lock, so two processes opening a new
file at once apply it once. Each row keeps the validated wire payload (so every field can be
decoded again) next to indexed columns for the queries discovery and retraining run.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from thinkmem_ros.link.experience import (
    Experience,
    ExperienceError,
    decode_experience,
    decode_experiences,
)
from thinkmem_ros.link.receiver import SinkError

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: the experience table with its idempotency key
        "CREATE TABLE experiences ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " robot_id TEXT NOT NULL, seq INTEGER NOT NULL, episode_id TEXT NOT NULL,"
        " stamp REAL NOT NULL, bundle_version INTEGER NOT NULL,"
        " payload BLOB NOT NULL,"
        " UNIQUE (robot_id, seq))",
    ),
    (  # 2: columns and index for episode queries (events, feedback, arrival time)
        # events: names joined by "\n" (names cannot contain it), oldest first
        "ALTER TABLE experiences ADD COLUMN events TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE experiences ADD COLUMN reward REAL",
        "ALTER TABLE experiences ADD COLUMN received_at REAL NOT NULL DEFAULT 0",
        "CREATE INDEX experiences_episode ON experiences (robot_id, episode_id, stamp)",
    ),
    (  # 3: the producing bundle's signal-set fingerprint ('' = not sent, as in every row
        # of wire versions 1-2, so old rows need no backfill); not indexed: a store holds
        # one line, so queries by it are rare and an index would cost every insert
        "ALTER TABLE experiences ADD COLUMN signal_set TEXT NOT NULL DEFAULT ''",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)
PAGE_SIZE = 16384


class StoreError(SinkError):
    """The store file cannot be opened, is from a newer schema, or a write failed."""


@dataclass(frozen=True)
class EpisodeInfo:
    """Summary of one episode: who, how many experiences, and its time span."""

    robot_id: str
    episode_id: str
    count: int
    first_stamp: float
    last_stamp: float


class ExperienceStore:
    """SQLite-backed experience store used by one thread (open one per thread)."""

    def __init__(self, path: Path | str, *, target_version: int = SCHEMA_VERSION) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, timeout=10.0)
            # 16 KiB pages: a ~1.4 KB record costs a third of the page writes and syscalls
            # of the 4 KiB default (measured ~15 -> ~10 us per insert); only a new, empty
            # file takes it, older stores keep their page size and still work.
            self._conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
            _set_wal(self._conn, 10.0)
            # In WAL mode NORMAL syncs at checkpoints, not at every commit: a committed
            # batch survives a crash of this process (kill -9) but a power cut may lose
            # the last commits. The receiver ACKs after commit, so after a power cut the
            # robot has already dropped those rows: an accepted, documented trade-off
            # (FULL would fsync every batch).
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._migrate(target_version)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open store: {exc}") from exc

    @property
    def schema_version(self) -> int:
        """Schema version of the open file."""
        row = self._conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0] or 0)

    def insert_many(self, records: Sequence[tuple[Experience, bytes]]) -> tuple[int, int]:
        """Store validated ``(experience, payload)`` pairs in one transaction.

        Returns ``(stored, duplicates)``: keys already present are ignored, never overwritten.
        """
        if not records:
            return 0, 0
        now = time.time()
        rows = [(e.robot_id, e.seq, e.episode_id, e.stamp, e.bundle_version, payload,
                 "\n".join(e.events), e.reward, now, e.signal_set) for e, payload in records]
        try:
            with self._conn:
                before = self._conn.total_changes
                self._conn.executemany(
                    "INSERT OR IGNORE INTO experiences (robot_id, seq, episode_id, stamp,"
                    " bundle_version, payload, events, reward, received_at, signal_set)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
                stored = self._conn.total_changes - before
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: insert failed: {exc}") from exc
        return stored, len(rows) - stored

    def count(self, robot_id: str | None = None) -> int:
        """Count stored experiences (of one robot, if given)."""
        if robot_id is None:
            return self._conn.execute("SELECT COUNT(*) FROM experiences").fetchone()[0]
        return self._conn.execute(
            "SELECT COUNT(*) FROM experiences WHERE robot_id = ?", (robot_id,)).fetchone()[0]

    def last_id(self) -> int:
        """The newest row id (0 when empty): a mark to resume ``iter_experiences`` after."""
        return int(self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM experiences")
                   .fetchone()[0])

    def seqs(self, robot_id: str) -> list[int]:
        """All stored sequence numbers of a robot, ascending."""
        rows = self._conn.execute(
            "SELECT seq FROM experiences WHERE robot_id = ? ORDER BY seq", (robot_id,))
        return [r[0] for r in rows]

    def get(self, robot_id: str, seq: int) -> Experience | None:
        """Return the experience stored under a key, or None."""
        row = self._conn.execute(
            "SELECT payload FROM experiences WHERE robot_id = ? AND seq = ?",
            (robot_id, seq)).fetchone()
        return None if row is None else decode_experience(row[0])

    def episodes(self, robot_id: str | None = None) -> list[EpisodeInfo]:
        """Every episode with its size and time span, ordered by robot then first stamp."""
        sql = ("SELECT robot_id, episode_id, COUNT(*), MIN(stamp), MAX(stamp) FROM experiences"
               " {} GROUP BY robot_id, episode_id ORDER BY robot_id, MIN(stamp)")
        if robot_id is None:
            rows = self._conn.execute(sql.format(""))
        else:
            rows = self._conn.execute(sql.format("WHERE robot_id = ?"), (robot_id,))
        return [EpisodeInfo(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    def iter_experiences(self, robot_id: str | None = None, episode_id: str | None = None,
                         after_id: int = 0, limit: int | None = None,
                         signal_set: str | None = None) -> Iterator[tuple[int, Experience]]:
        """Yield ``(row id, experience)`` in arrival order, optionally filtered.

        ``after_id`` lets a consumer resume where it stopped (row ids only grow);
        ``signal_set`` keeps one fingerprint's rows ('' = records that carry none).
        """
        clauses, params = ["id > ?"], [after_id]
        for column, value in (("robot_id", robot_id), ("episode_id", episode_id),
                              ("signal_set", signal_set)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        sql = f"SELECT id, payload FROM experiences WHERE {' AND '.join(clauses)} ORDER BY id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        rows = self._conn.execute(sql, params).fetchall()
        yield from zip((r[0] for r in rows), _decode_all([r[1] for r in rows]))

    def iter_all(self, after_id: int = 0, page: int = 5000) -> Iterator[Experience]:
        """Every experience after row id ``after_id`` in arrival order, ``page`` rows at a time.

        For whole-store passes (an index, a replay): memory stays at one page of decoded
        records however large the store is.
        """
        while True:
            rows = list(self.iter_experiences(after_id=after_id, limit=page))
            yield from (e for _, e in rows)
            if len(rows) < page:
                return
            after_id = rows[-1][0]

    def episode_experiences(self, robot_id: str, episode_id: str) -> list[Experience]:
        """One episode's experiences in time order (stamp, then seq)."""
        rows = self._conn.execute(
            "SELECT payload FROM experiences WHERE robot_id = ? AND episode_id = ?"
            " ORDER BY stamp, seq", (robot_id, episode_id)).fetchall()
        return _decode_all([r[0] for r in rows])

    def episode_events(self) -> dict[tuple[str, str], list[str]]:
        """Event sequence per (robot_id, episode_id), for cross-experience discovery.

        Each record carries the episode's event history up to its stamp, oldest first, so
        the history of the episode's latest record (by stamp, then seq) is taken as the
        episode's sequence. Histories are capped at ``LIMITS['max_events']`` by the node.
        """
        rows = self._conn.execute(
            "SELECT robot_id, episode_id, events FROM experiences e WHERE id = ("
            " SELECT id FROM experiences i WHERE i.robot_id = e.robot_id"
            " AND i.episode_id = e.episode_id ORDER BY stamp DESC, seq DESC LIMIT 1)")
        return {(r[0], r[1]): r[2].split("\n") if r[2] else [] for r in rows}

    def signal_sets(self) -> dict[str, int]:
        """Stored experiences per signal-set fingerprint ('' = records that carry none)."""
        rows = self._conn.execute(
            "SELECT signal_set, COUNT(*) FROM experiences GROUP BY signal_set ORDER BY 1")
        return {r[0]: r[1] for r in rows}

    def rewards(self) -> list[tuple[str, int, float]]:
        """``(robot_id, seq, reward)`` of every experience that carries feedback."""
        rows = self._conn.execute(
            "SELECT robot_id, seq, reward FROM experiences WHERE reward IS NOT NULL ORDER BY id")
        return [(r[0], r[1], r[2]) for r in rows]

    def close(self) -> None:
        """Close the database (idempotent)."""
        try:
            self._conn.close()
        except sqlite3.Error:  # already closed
            pass

    def __enter__(self) -> ExperienceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self, target: int) -> None:
        if not 1 <= target <= SCHEMA_VERSION:
            raise StoreError(f"target_version {target} outside [1, {SCHEMA_VERSION}]")
        with self._conn:
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY,"
                " applied_at REAL NOT NULL)")
        current = self.schema_version
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: store schema {current} is newer than this thinkmem_ros "
                f"({SCHEMA_VERSION}); upgrade the consolidator")
        for version in range(current + 1, target + 1):
            with self._conn:  # each migration and its version row commit together
                # IMMEDIATE takes the write lock before the version is read again: several
                # processes (receivers, the consolidator) may open one new file at once,
                # and a migration another process applied meanwhile must not run twice
                self._conn.execute("BEGIN IMMEDIATE")
                if self.schema_version >= version:
                    continue
                for statement in MIGRATIONS[version - 1]:
                    self._conn.execute(statement)
                self._conn.execute("INSERT INTO schema_version VALUES (?, ?)",
                                   (version, time.time()))


def _set_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Switch to WAL, retrying "database is locked" for up to ``timeout_s``.

    Turning a new file to WAL needs an exclusive lock, and SQLite answers that request
    with SQLITE_BUSY at once, without the busy handler, while another process opens the
    same new file (seen with four processes opening one file at once).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _decode_all(payloads: list[bytes]) -> list[Experience]:
    """Decode stored payloads in one batch; a row that no longer validates raises."""
    out = decode_experiences(payloads)
    for item in out:
        if isinstance(item, ExperienceError):
            raise item
    return out
