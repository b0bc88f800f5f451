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

A file that is not a store (another program's database) is refused at open, before anything
is written into it (``not_a_store``); a store says what it is in its header (``PRAGMA
application_id``, ``APPLICATION_ID``). A damaged file (SQLite: "database disk image is
malformed") is refused at open (``PRAGMA quick_check``) and raises ``StoreDamaged``
wherever SQLite meets the damage later, so the processes that write into it stop instead
of failing batch after batch (``ingest``).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from thinkmem_ros.consolidator import histories
from thinkmem_ros.consolidator.lake import (
    COLUMNS,
    LakeError,
    LakeFile,
    ParquetLake,
    lake_dir_for,
)
from thinkmem_ros.core.input_files import input_file
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
    (  # 4: the lake: its file manifest and the keys of every row moved into it, so the
        # tail table (``experiences``) can shrink while duplicates keep dying at insert
        "CREATE TABLE lake_files (path TEXT PRIMARY KEY, robot_id TEXT NOT NULL,"
        " day TEXT NOT NULL, rows INTEGER NOT NULL, min_id INTEGER NOT NULL,"
        " max_id INTEGER NOT NULL)",
        "CREATE TABLE flushed_keys (robot_id TEXT NOT NULL, seq INTEGER NOT NULL,"
        " PRIMARY KEY (robot_id, seq)) WITHOUT ROWID",
    ),
    (  # 5: a round's reservoir asks for one robot's files over a few row-id spans; a
        # fleet flushes ~50,000 files a day, and without it each ask scanned the manifest
        "CREATE INDEX lake_files_robot ON lake_files (robot_id, max_id)",
    ),
    # 6: each episode's latest event history, folded in round by round (``histories.py``):
    # discovery's input without scanning every row's history each round; an upgraded
    # store starts with no mark, and its first fold reads every row once
    histories.TABLES,
    (  # 7: who this store is, so its lake folder can say whose it is (``lake.py``): a
        # store file replaced or emptied, or a second store with the same stem, must not
        # read or sweep another store's Parquet files as its own
        "CREATE TABLE store_identity (id TEXT NOT NULL)",
        "INSERT INTO store_identity VALUES (lower(hex(randomblob(16))))",
    ),
    (  # 8: discovery's horizon read the newest episodes first (superseded by 9)
        histories.FIRST_STAMP_INDEX,
    ),
    # 9: discovery's horizon (``histories.carried``) chooses each robot's newest episodes
    # from an index of what they cost the scan, then reads only the histories it chose;
    # without it every round read every carried history
    histories.HORIZON_MIGRATION,
    (  # 10: a key that arrives again with another episode is not a re-send but a second
        # robot under the same id (a cloned image, a copied config): its experience is
        # kept here instead of dying as a duplicate (``insert_many``)
        "CREATE TABLE conflicts (robot_id TEXT NOT NULL, seq INTEGER NOT NULL,"
        " episode_id TEXT NOT NULL, stamp REAL NOT NULL, payload BLOB NOT NULL,"
        " received_at REAL NOT NULL, PRIMARY KEY (robot_id, seq, episode_id))"
        " WITHOUT ROWID",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)
APPLICATION_ID = 0x746D6D73  # b"tmms" in the header: "a thinkmem store", whatever it holds
# Tables a store file may hold: the store's own and those other modules keep beside them in
# the same file (``knowledge``, ``round_marks``).
STORE_TABLES = frozenset(
    {"schema_version", "knowledge_schema_version", "knowledge_units", "round_marks"}
    | {statement.split()[2] for migration in MIGRATIONS for statement in migration
       if statement.startswith("CREATE TABLE")})
# A manifest row as ``LakeFile`` takes it.
_LISTED = "path, robot_id, day, rows, min_id, max_id"
PAGE_SIZE = 16384
log = logging.getLogger(__name__)
# Tail rows that trigger a move into the lake: ~28 MB of payloads, a few files per robot
# and day per flush; small enough that the flush (about a second) barely delays an ack.
DEFAULT_FLUSH_ROWS = 20_000
# How long an open waits for the write lock when the store needs upgrading: another
# process may be upgrading it, and a table rebuild (schema 9: 10-17 s for 200,000 episode
# histories of 512 names) outlasts the 10 s every other write waits; a receiver started
# meanwhile failed its open.
MIGRATION_WAIT_S = 600.0


class StoreError(SinkError):
    """The store file cannot be opened, is from a newer schema, or a write failed."""


class StoreDamaged(StoreError):
    """SQLite reports the store file damaged: nothing more may be written to or read from it.

    Its own class because the answer differs from a failed write: a full disk or a lock
    clears by itself, a damaged file only by an operator restoring it.
    """


class StoreReadOnly(StoreError):
    """The store file cannot be written (its mode, a read-only mount, a read-only open).

    Like damage it does not clear by itself, so the processes that write into the store
    stop on it (``ingest.StopOnDamage``) instead of refusing batch after batch.
    """


# SQLite's primary result codes for a damaged file (an extended code keeps them in its
# low byte): SQLITE_CORRUPT, and SQLITE_NOTADB for a file whose header was overwritten
_DAMAGE_CODES = (11, 26)
_READONLY_CODES = (8,)  # SQLITE_READONLY: "attempt to write a readonly database"
_BUSY_CODES = (5,)  # SQLITE_BUSY: another process holds the write lock


def is_damage(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised from, says a store file is damaged.

    Callers above the store (a round, a receiver) see SQLite's error wrapped, or raised
    by another module's connection to the same file; the chain tells them either way.
    """
    return _in_chain(exc, StoreDamaged, _DAMAGE_CODES)


def is_read_only(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised from, says a store file cannot be written."""
    return _in_chain(exc, StoreReadOnly, _READONLY_CODES)


def is_fatal(exc: BaseException | None) -> bool:
    """Whether no retry on this store can succeed: it is damaged or cannot be written."""
    return is_damage(exc) or is_read_only(exc)


def _in_chain(exc: BaseException | None, kind: type, codes: tuple[int, ...]) -> bool:
    """Whether ``exc`` or an error it was raised from is a ``kind`` or SQLite's ``codes``."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, kind):
            return True
        if isinstance(exc, sqlite3.DatabaseError) and _primary_code(exc) in codes:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _primary_code(exc: BaseException) -> int:
    """SQLite's primary result code of ``exc`` (0 when it carries none)."""
    return (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF


@dataclass(frozen=True)
class EpisodeInfo:
    """Summary of one episode: who, how many experiences, its time span and row-id span."""

    robot_id: str
    episode_id: str
    count: int
    first_stamp: float
    last_stamp: float
    min_id: int = 0  # the episode's rows lie between these ids (0, 0: not known)
    max_id: int = 0


class ExperienceStore:
    """Experience store used by one thread (open one per thread): a SQLite tail and a lake.

    New batches land in SQLite (the exactly-once ingest); once the tail holds
    ``flush_rows`` rows they move to the Parquet lake beside the file (``lake.py``), and
    every query reads both, so callers never see where a row lives. ``flush_rows=0``
    keeps everything in SQLite (tests of the tail alone, tools that must not write files).
    """

    def __init__(self, path: Path | str, *, target_version: int = SCHEMA_VERSION,
                 flush_rows: int = DEFAULT_FLUSH_ROWS) -> None:
        self.path = Path(path)
        self.flush_rows = int(flush_rows)
        self._lake = ParquetLake(lake_dir_for(self.path))
        self._tail_rows: int | None = None
        self.conflicts = 0  # records kept apart by ``_keep_conflicts`` since opening
        self._conflict_said: dict[str, float] = {}  # robot id -> when its ERROR was logged
        try:
            input_file(self.path, "path")
        except ValueError as exc:  # a FIFO or a folder: SQLite's "disk I/O error" says less
            raise StoreError(f"cannot open store: {exc}") from None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, timeout=10.0)
            histories.functions(self._conn)  # migration 9's rebuild counts in Python
            # 16 KiB pages: a ~1.4 KB record costs a third of the page writes and syscalls
            # of the 4 KiB default (measured ~15 -> ~10 us per insert); only a new, empty
            # file takes it, older stores keep their page size and still work.
            self._conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
            self._quick_check()  # before anything is written into the file
            self._refuse_foreign()  # this one too
            _set_wal(self._conn, 10.0)
            # In WAL mode NORMAL syncs at checkpoints, not at every commit: a committed
            # batch survives a crash of this process (kill -9) but a power cut may lose
            # the last commits. The receiver ACKs after commit, so after a power cut the
            # robot has already dropped those rows: an accepted, documented trade-off
            # (FULL would fsync every batch).
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._migrate(target_version)
            self._identity = self._read_identity()
            self._check_lake()
        except sqlite3.Error as exc:
            self._conn_close_quietly()
            # SQLITE_NOTADB at open is a file that is no store (a text file, a typo), not damage
            if is_damage(exc) and _primary_code(exc) != _DAMAGE_CODES[1]:
                raise self._failure("cannot open store", exc) from exc
            raise StoreError(f"{self.path}: cannot open store: {exc}") from exc

    def _quick_check(self) -> None:
        """Refuse a damaged file at open with one line: the file and what SQLite said.

        Without it a damaged store opened without complaint; then every insert touching a
        damaged page failed (each robot re-sending forever to a process that looked
        healthy), a round failed on a traceback or read around the damage. ``quick_check``
        reads every page once without cross-checking indexes against their tables
        (measured: 0.07 s warm, 0.8 s cold for 100,000 rows of 1.4 KB, 159 MB; 0.5 s warm
        with 5 million flushed keys besides), and the tail rarely holds more than
        ``DEFAULT_FLUSH_ROWS`` rows, so every open pays it.
        """
        try:
            rows = self._conn.execute("PRAGMA quick_check").fetchall()
        except sqlite3.DatabaseError as exc:
            if not is_damage(exc):
                raise
            problems = [str(exc)]
        else:
            problems = [line for (text,) in rows for line in str(text).splitlines()
                        if line.strip() and not line.startswith("*** in database")]
        if problems == ["ok"]:
            return
        self._conn_close_quietly()
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise StoreDamaged(
            f"{self.path}: the store file is damaged, not opened (SQLite quick_check: "
            f"{problems[0][:200]}{more}); restore it from a backup (robots keep every batch "
            f"not acknowledged)")

    def _refuse_foreign(self) -> None:
        """Refuse another program's database in one line, before anything is written.

        Opening creates the store's tables, so a --db naming another application's file (or
        a typo that hit one) used to gain eleven tables and WAL files, and a round on it
        reported "0 experiences" and exited 0.
        """
        problem = not_a_store(self._conn)
        if problem is not None:
            self._conn_close_quietly()
            raise StoreError(f"{self.path}: not a thinkmem store ({problem}); refused so "
                             f"nothing is written into it: name a new file or a store")

    def _failure(self, what: str, exc: sqlite3.Error) -> StoreError:
        """The error to raise for SQLite's ``exc``: damaged or read-only if it says so."""
        if is_damage(exc):
            return StoreDamaged(f"{self.path}: the store file is damaged ({what}: SQLite: "
                                f"{exc}); nothing more is written to it until it is restored")
        if is_read_only(exc):
            return StoreReadOnly(f"{self.path}: the store cannot be written ({what}: "
                                 f"SQLite: {exc}); give this process write access to the "
                                 f"file and its folder")
        return StoreError(f"{self.path}: {what}: {exc}")

    def check_writable(self) -> None:
        """Raise ``StoreReadOnly`` unless this connection can write the store.

        Why a real write (rolled back): opening only reads, and in WAL mode even BEGIN
        IMMEDIATE succeeds on a read-only file, so a 0444 store (or a read-only mount)
        served READY and then refused every batch. A store another process is writing
        (busy past the timeout) is writable by someone and passes; a write that fails
        later still stops the writer (``is_fatal``).
        """
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute("CREATE TABLE main.write_probe (x)")
            finally:
                self._conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            if _primary_code(exc) in _BUSY_CODES:
                return
            raise self._failure("write probe", exc) from exc

    def _conn_close_quietly(self) -> None:
        """Close the connection of a store that is not opened after all."""
        try:
            self._conn.close()
        except (AttributeError, sqlite3.Error):  # never connected, or closed already
            pass

    def _read_identity(self) -> str | None:
        """The store's id (None below schema 7: a store opened at an older version)."""
        if self.schema_version < 7:
            return None
        row = self._conn.execute("SELECT id FROM store_identity").fetchone()
        if row is None or not isinstance(row[0], str) or not row[0]:
            raise StoreError(f"{self.path}: the store_identity table is damaged")
        return row[0]

    def _check_lake(self) -> None:
        """Refuse a lake folder that is not this store's, before anything reads or sweeps it."""
        if self._identity is None:
            return
        listed = self._conn.execute("SELECT 1 FROM lake_files LIMIT 1").fetchone() is not None
        try:
            self._lake.check_owner(self._identity, has_listed=listed)
        except (LakeError, OSError) as exc:
            self._conn.close()
            raise StoreError(f"{self.path}: {exc}") from None

    @property
    def lake_dir(self) -> Path:
        """The folder of this store's Parquet files (exists once something was flushed)."""
        return self._lake.root

    @property
    def schema_version(self) -> int:
        """Schema version of the open file."""
        row = self._conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0] or 0)

    def insert_many(self, records: Sequence[tuple[Experience, bytes]]) -> tuple[int, int]:
        """Store validated ``(experience, payload)`` pairs in one transaction.

        Returns ``(stored, duplicates)``: keys already present (in the tail or flushed to
        the lake) are ignored, never overwritten. Moves the tail to the lake when it is full.
        """
        if not records:
            return 0, 0
        now = time.time()
        rows = [(e.robot_id, e.seq, e.episode_id, e.stamp, e.bundle_version, payload,
                 "\n".join(e.events), e.reward, now, e.signal_set, e.robot_id, e.seq)
                for e, payload in records]
        try:
            with self._conn:
                before = self._conn.total_changes
                self._conn.executemany(
                    "INSERT OR IGNORE INTO experiences (robot_id, seq, episode_id, stamp,"
                    " bundle_version, payload, events, reward, received_at, signal_set)"
                    " SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM"
                    " flushed_keys WHERE robot_id = ? AND seq = ?)", rows)
                stored = self._conn.total_changes - before
        except sqlite3.Error as exc:
            raise self._failure("insert failed", exc) from exc
        if stored < len(rows):
            self._keep_conflicts(records, now)
        self._maybe_flush(stored)
        return stored, len(rows) - stored

    def _keep_conflicts(self, records: Sequence[tuple[Experience, bytes]], now: float
                        ) -> None:
        """Keep the batch's records whose key is stored with another episode, and say so.

        Why: a re-send carries the episode it was stored with, so a key that comes back
        with another episode is a second robot under the same id (a cloned image, a copied
        config) counting the same sequence numbers. Ignoring it as a duplicate would ack
        it, the robot would delete it from its spool, and that robot's experience would be
        lost without a word. It is kept in ``conflicts`` (a re-send of it is stored once)
        and an ERROR names the robot id, at most once a minute per id.
        """
        by_robot: dict[str, list[tuple[Experience, bytes]]] = {}
        for experience, payload in records:
            by_robot.setdefault(experience.robot_id, []).append((experience, payload))
        for robot_id, batch in by_robot.items():
            stored = self._stored_episodes(robot_id, sorted({e.seq for e, _ in batch}))
            clashing = [(e, p) for e, p in batch
                        if stored.get(e.seq, e.episode_id) != e.episode_id]
            if not clashing:
                continue
            try:
                with self._conn:
                    before = self._conn.total_changes
                    self._conn.executemany(
                        "INSERT OR IGNORE INTO conflicts VALUES (?, ?, ?, ?, ?, ?)",
                        [(e.robot_id, e.seq, e.episode_id, e.stamp, p, now)
                         for e, p in clashing])
                    kept = self._conn.total_changes - before
            except sqlite3.Error as exc:
                raise self._failure("keeping conflicting records failed", exc) from exc
            self.conflicts += kept
            self._say_conflict(robot_id, clashing[0][0], stored[clashing[0][0].seq])

    def _stored_episodes(self, robot_id: str, seqs: list[int]) -> dict[int, str]:
        """The episode each of ``seqs`` is stored under (tail or lake), by sequence number."""
        found: dict[int, str] = {}
        for at in range(0, len(seqs), 500):
            chunk = seqs[at:at + 500]
            marks = ", ".join("?" * len(chunk))
            lake, tail = self._both(f"SELECT seq, episode_id FROM {{src}} WHERE robot_id = ?"
                                    f" AND seq IN ({marks})", (robot_id, *chunk), robot_id)
            found.update((int(seq), episode) for seq, episode in lake + tail)
        return found

    def _say_conflict(self, robot_id: str, incoming: Experience, stored_episode: str) -> None:
        last = self._conflict_said.get(robot_id)
        if last is not None and time.monotonic() - last < 60.0:
            return
        self._conflict_said[robot_id] = time.monotonic()
        total = self.conflict_count(robot_id)
        log.error("robot id %r: experience seq %d arrived from episode %r, but is stored from "
                  "episode %r: two robots send under this id (a cloned image or copied "
                  "config?); %d such experiences kept apart in the store's conflicts table "
                  "so far; give each robot its own robot_id", robot_id[:64], incoming.seq,
                  incoming.episode_id[:64], stored_episode[:64], total)

    def conflict_count(self, robot_id: str | None = None) -> int:
        """Experiences kept apart because their key is stored from another episode."""
        where, params = ("", ()) if robot_id is None else (" WHERE robot_id = ?", (robot_id,))
        return int(self._conn.execute(f"SELECT COUNT(*) FROM conflicts{where}",
                                      params).fetchone()[0])

    def flush(self, chunk: int = 50_000) -> int:
        """Move every tail row into the lake, ``chunk`` rows per file set; returns rows moved.

        Each chunk is one SQLite write transaction: files written and renamed, listed in the
        manifest, keys kept in ``flushed_keys``, tail rows deleted, all committed together.
        """
        moved = 0
        while (n := self._flush_chunk(chunk, sweep=moved == 0)) > 0:
            moved += n
        self._tail_rows = 0
        return moved

    def count(self, robot_id: str | None = None) -> int:
        """Count stored experiences (of one robot, if given)."""
        where, params = ("", ()) if robot_id is None else (" WHERE robot_id = ?", (robot_id,))
        with self._snapshot():
            tail = self._conn.execute(f"SELECT COUNT(*) FROM experiences{where}", params)
            lake = self._conn.execute(f"SELECT COALESCE(SUM(rows), 0) FROM lake_files{where}",
                                      params)
            return int(tail.fetchone()[0]) + int(lake.fetchone()[0])

    def last_id(self) -> int:
        """The newest row id (0 when empty): a mark to resume ``iter_experiences`` after."""
        with self._snapshot():
            tail = self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM experiences")
            lake = self._conn.execute("SELECT COALESCE(MAX(max_id), 0) FROM lake_files")
            return max(int(tail.fetchone()[0]), int(lake.fetchone()[0]))

    def seqs(self, robot_id: str) -> list[int]:
        """All stored sequence numbers of a robot, ascending."""
        lake, tail = self._both("SELECT seq FROM {src} WHERE robot_id = ?", (robot_id,),
                                robot_id)
        return sorted(r[0] for r in lake + tail)

    def get(self, robot_id: str, seq: int) -> Experience | None:
        """Return the experience stored under a key, or None."""
        lake, tail = self._both("SELECT payload FROM {src} WHERE robot_id = ? AND seq = ?",
                                (robot_id, seq), robot_id)
        rows = tail or lake
        return None if not rows else decode_experience(rows[0][0])

    def episodes(self, robot_id: str | None = None, after_id: int = 0,
                 through_id: int | None = None) -> list[EpisodeInfo]:
        """Every episode with its size and time span, ordered by robot then first stamp.

        ``after_id`` < row id <= ``through_id`` limits the rows counted (an episode that
        spans the bounds is counted with its rows inside them): what arrived since a mark,
        or what had arrived by it. The query reads ids and stamps, never payloads.
        """
        clauses, params = ["id > ?"], [after_id]
        if through_id is not None:
            clauses.append("id <= ?")
            params.append(through_id)
        if robot_id is not None:
            clauses.append("robot_id = ?")
            params.append(robot_id)
        lake, tail = self._both(
            "SELECT robot_id, episode_id, COUNT(*), MIN(stamp), MAX(stamp), MIN(id), MAX(id)"
            f" FROM {{src}} WHERE {' AND '.join(clauses)} GROUP BY robot_id, episode_id",
            params, robot_id, after_id, through_id)
        merged: dict[tuple[str, str], list] = {}
        for r in lake + tail:
            have = merged.get((r[0], r[1]))
            merged[(r[0], r[1])] = list(r[2:]) if have is None else [
                have[0] + r[2], min(have[1], r[3]), max(have[2], r[4]), min(have[3], r[5]),
                max(have[4], r[6])]
        out = [EpisodeInfo(k[0], k[1], *v) for k, v in merged.items()]
        return sorted(out, key=lambda e: (e.robot_id, e.first_stamp))

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
        sql = "SELECT id, payload FROM {src} WHERE " + " AND ".join(clauses) + " ORDER BY id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        lake, tail = self._both(sql, params, robot_id, after_id)
        rows = (lake + tail)[:limit]  # every lake id is below every tail id
        decoded = _decode_all([r[1] for r in rows], self.path)
        yield from ((r[0], e) for r, e in zip(rows, decoded, strict=True) if e is not None)

    def iter_all(self, after_id: int = 0, page: int = 5000) -> Iterator[Experience]:
        """Every experience after row id ``after_id`` in arrival order, ``page`` rows at a time.

        For whole-store passes (an index, a replay): memory stays at one page of decoded
        records however large the store is. Pages by stored row, not by decoded record, so
        a row left out as undecodable never ends the pass early.
        """
        while True:
            lake, tail = self._both("SELECT id, payload FROM {src} WHERE id > ? ORDER BY id"
                                    " LIMIT ?", (after_id, page), None, after_id)
            rows = (lake + tail)[:page]
            decoded = _decode_all([r[1] for r in rows], self.path)
            yield from (e for e in decoded if e is not None)
            if len(rows) < page:
                return
            after_id = rows[-1][0]

    def episode_experiences(self, robot_id: str, episode_id: str) -> list[Experience]:
        """One episode's experiences in time order (stamp, then seq)."""
        lake, tail = self._both(
            "SELECT stamp, seq, payload FROM {src} WHERE robot_id = ? AND episode_id = ?",
            (robot_id, episode_id), robot_id)
        rows = sorted(lake + tail, key=lambda r: (r[0], r[1]))
        return [e for e in _decode_all([r[2] for r in rows], self.path) if e is not None]

    def episodes_through(self, keys: Iterable[tuple[str, str]], through_id: int,
                         spans: Iterable[tuple[int, int]] | None = None) -> list[Experience]:
        """The rows of episodes ``keys`` (robot, episode) with id <= ``through_id``.

        One query per robot over that robot's files (the lake is partitioned by robot), so
        a round re-reads a sample of older episodes without scanning every payload;
        ``spans`` (each episode's (min_id, max_id), from ``episodes``) narrow it to the
        files whose ids overlap them. Episodes come in ``keys`` order, each in time order
        (stamp, then seq).
        """
        keys = list(keys)
        spans = [(0, through_id)] * len(keys) if spans is None else list(spans)
        by_robot: dict[str, list[tuple[str, tuple[int, int]]]] = {}
        for (robot_id, episode_id), span in zip(keys, spans, strict=True):
            by_robot.setdefault(robot_id, []).append((episode_id, span))
        rows: dict[tuple[str, str], list[tuple]] = {}
        for robot_id, episodes in by_robot.items():
            for lo in range(0, len(episodes), 500):  # SQLite's bound-parameter limit
                chunk = [e for e, _ in episodes[lo:lo + 500]]
                marks = ", ".join("?" * len(chunk))
                lake, tail = self._both(
                    "SELECT episode_id, stamp, seq, payload FROM {src} WHERE robot_id = ?"
                    f" AND id <= ? AND episode_id IN ({marks})", (robot_id, through_id, *chunk),
                    robot_id, through_id=through_id,
                    spans=[span for _, span in episodes[lo:lo + 500]])
                for r in lake + tail:
                    rows.setdefault((robot_id, r[0]), []).append(r[1:])
        out: list[Experience] = []
        for key in keys:
            got = sorted(rows.get(key, []), key=lambda r: (r[0], r[1]))
            out += [e for e in _decode_all([r[2] for r in got], self.path) if e is not None]
        return out

    def episode_events(self) -> dict[tuple[str, str], list[str]]:
        """Event sequence per (robot_id, episode_id), for cross-experience discovery.

        Each record carries the episode's event history up to its stamp, oldest first, so
        the history of the episode's latest record (by stamp, then seq) is taken as the
        episode's sequence. Histories are capped at ``LIMITS['max_events']`` by the node.
        Folds the rows that arrived since the last call in first (``fold_histories``).
        """
        self.fold_histories()
        return {(r[0], r[1]): r[3].split("\n") if r[3] else [] for r in self.histories()}

    def fold_histories(self) -> histories.HistoriesFold:
        """Bring the carried episode histories up to the newest row (``histories.py``)."""
        try:
            return histories.fold(self._conn, self.last_id(), self.latest_histories)
        except sqlite3.Error as exc:
            raise self._failure("cannot update episode histories", exc) from exc

    def histories(self) -> list[tuple[str, str, float, str]]:
        """(robot, episode, first stamp, history joined by newlines) as last folded.

        Every episode, those without events too (discovery reads ``histories_within``).
        """
        try:
            return histories.every_episode(self._conn)
        except sqlite3.Error as exc:
            raise self._failure("cannot read episode histories", exc) from exc

    def histories_within(self, budget: int
                         ) -> tuple[list[tuple[str, str, float, str]], histories.Horizon]:
        """Discovery's input: each robot's newest histories within ``budget`` (scan cost).

        0 reads every episode that holds events (``histories.carried``: the horizon).
        """
        try:
            return histories.carried(self._conn, budget)
        except sqlite3.Error as exc:
            raise self._failure("cannot read episode histories", exc) from exc

    def latest_histories(self, after_id: int = 0, through_id: int | None = None
                         ) -> list[histories.Row]:
        """Per episode over the rows in (``after_id``, ``through_id``]: ``histories.Row``.

        Its first stamp and its latest record's (stamp, seq, history); reads every such
        row's history, which is the whole store when ``after_id`` is 0.
        """
        through = self.last_id() if through_id is None else through_id
        lake, tail = self._both(histories.LATEST_SQL, (after_id, through),
                                after_id=after_id, through_id=through)
        return histories.latest(lake + tail)

    def signal_sets(self) -> dict[str, int]:
        """Stored experiences per signal-set fingerprint ('' = records that carry none)."""
        lake, tail = self._both("SELECT signal_set, COUNT(*) FROM {src} GROUP BY signal_set",
                                ())
        out: dict[str, int] = {}
        for key, n in lake + tail:
            out[key] = out.get(key, 0) + n
        return dict(sorted(out.items()))

    def rewards(self) -> list[tuple[str, int, float]]:
        """``(robot_id, seq, reward)`` of every experience that carries feedback."""
        lake, tail = self._both(
            "SELECT robot_id, seq, reward FROM {src} WHERE reward IS NOT NULL ORDER BY id", ())
        return [(r[0], r[1], r[2]) for r in lake + tail]

    def close(self) -> None:
        """Close the database and the lake's engine (idempotent)."""
        self._lake.close()
        try:
            self._conn.close()
        except sqlite3.Error:  # already closed
            pass

    def __enter__(self) -> ExperienceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _both(self, sql: str, params: Sequence, robot_id: str | None = None,
              after_id: int = 0, through_id: int | None = None,
              spans: list[tuple[int, int]] | None = None) -> tuple[list[tuple], list[tuple]]:
        """Run one query (``{src}`` = the rows) over the lake and the tail of one snapshot.

        The manifest and the tail are read in one SQLite read transaction, so a flush
        committed meanwhile cannot show a row twice or hide it; listed files never change.
        ``spans`` (row-id ranges of one robot's episodes) list only the files they overlap.
        """
        with self._snapshot():
            files = (self._lake_files(robot_id, after_id, through_id) if spans is None
                     else self._files_over(robot_id, spans, through_id))
            tail = self._conn.execute(sql.format(src="experiences"), params).fetchall()
        return self._lake_query(sql, files, params), tail

    def _lake_query(self, sql: str, listed: list[LakeFile], params: Sequence = ()
                    ) -> list[tuple]:
        """Query the listed files; a damaged one is left out of the answer with a WARNING.

        Raising stopped every round on that one file, for good. Its rows are not deleted
        (the manifest still lists it, so ``count`` still includes them) and every read
        names it until it is restored; a failure no single file explains still raises.
        """
        files = [f.path for f in self._matching(listed)]
        try:
            return self._lake.query(sql, files, params)
        except LakeError as exc:
            bad = self._lake.damaged(files)
            if not bad:
                raise StoreError(str(exc)) from exc
        first = next(iter(bad.items()))
        log.warning("%s: %d listed lake file(s) cannot be read and are left out of this read "
                    "(first: %s: %s)", self.lake_dir, len(bad), *first)
        try:
            return self._lake.query(sql, [f for f in files if f not in bad], params)
        except LakeError as exc:
            raise StoreError(str(exc)) from exc

    def _matching(self, listed: list[LakeFile]) -> list[LakeFile]:
        """The listed files whose footer agrees with the manifest; a WARNING names the rest.

        A file swapped for another valid Parquet file (a copy of another part file, a part
        of another lake) reads without an error: its rows would come back twice, or as
        this store's. Left out like a damaged file, and for the same reason not deleted:
        the manifest still counts its rows, and restoring the file brings them back.
        """
        bad = self._lake.mismatched(listed, self._identity)
        if not bad:
            return listed
        first = next(iter(bad.items()))
        log.warning("%s: %d listed lake file(s) do not hold what the manifest lists and are "
                    "left out of this read (first: %s: %s)", self.lake_dir, len(bad), *first)
        return [f for f in listed if f.path not in bad]

    def _lake_files(self, robot_id: str | None = None, after_id: int = 0,
                    through_id: int | None = None) -> list[LakeFile]:
        sql, params = f"SELECT {_LISTED} FROM lake_files WHERE max_id > ?", [after_id]
        if through_id is not None:
            sql += " AND min_id <= ?"
            params.append(through_id)
        if robot_id is not None:
            sql += " AND robot_id = ?"
            params.append(robot_id)
        return [LakeFile(*r) for r in self._conn.execute(sql + " ORDER BY min_id", params)]

    def _files_over(self, robot_id: str, spans: list[tuple[int, int]], through_id: int
                    ) -> list[LakeFile]:
        """The robot's lake files whose ids overlap any of ``spans`` (up to through_id)."""
        found: dict[str, LakeFile] = {}
        for first, last in spans:
            for row in self._conn.execute(
                    f"SELECT {_LISTED} FROM lake_files WHERE robot_id = ? AND max_id >= ?"
                    " AND min_id <= ?", (robot_id, first, min(last, through_id))):
                found[row[0]] = LakeFile(*row)
        return sorted(found.values(), key=lambda f: f.min_id)

    @contextmanager
    def _snapshot(self) -> Iterator[None]:
        """One read transaction: every SELECT inside sees the same committed state.

        A read that meets a damaged page raises ``StoreDamaged`` (it used to escape as a
        bare ``sqlite3.DatabaseError``), so a round says which file and why.
        """
        try:
            self._conn.execute("BEGIN")
            try:
                yield
            except BaseException:
                self._rollback_quietly()  # a read transaction: nothing to keep
                raise
            self._conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            if is_damage(exc):
                raise self._failure("read failed", exc) from exc
            raise

    def _rollback_quietly(self) -> None:
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:  # SQLite ended the transaction itself (on an error)
            pass

    def _maybe_flush(self, stored: int) -> None:
        if self.flush_rows <= 0 or stored == 0:
            return
        if self._tail_rows is None:  # first insert: learn what the tail holds already
            try:
                self._tail_rows = int(self._conn.execute(
                    "SELECT COUNT(*) FROM experiences").fetchone()[0])
            except sqlite3.Error as exc:
                raise self._failure("cannot count the tail", exc) from exc
        else:
            self._tail_rows += stored
        if self._tail_rows >= self.flush_rows:
            try:
                self.flush()
            except StoreDamaged:  # committed, but not acknowledged: the robot re-sends it
                raise
            except StoreError as exc:  # the batch is committed: ingest goes on, tail grows
                self._tail_rows = 0  # try again after another flush_rows rows
                log.warning("experiences stay in the SQLite tail: %s", exc)

    def _flush_chunk(self, chunk: int, sweep: bool) -> int:
        written: list[LakeFile] = []
        try:
            with self._conn:
                self._conn.execute("BEGIN IMMEDIATE")  # one flusher at a time, any process
                rows = self._conn.execute(
                    f"SELECT {', '.join(COLUMNS)} FROM experiences ORDER BY id LIMIT ?",
                    (chunk,)).fetchall()
                if not rows:
                    return 0
                if sweep:  # leftovers of a crashed flush; once per flush, not per chunk
                    self._sweep(first_tail_id=rows[0][0])
                self._lake.write(rows, written, owner=self._identity)
                self._conn.executemany(
                    "INSERT INTO lake_files VALUES (?, ?, ?, ?, ?, ?)",
                    [(f.path, f.robot_id, f.day, f.rows, f.min_id, f.max_id) for f in written])
                self._conn.executemany("INSERT INTO flushed_keys VALUES (?, ?)",
                                       [(r[1], r[2]) for r in rows])
                self._conn.execute("DELETE FROM experiences WHERE id <= ?", (rows[-1][0],))
            return len(rows)
        except BaseException as exc:
            self._lake.remove(written)  # never listed: the transaction rolled back
            if isinstance(exc, sqlite3.Error):
                raise self._failure(f"flush to {self.lake_dir} failed", exc) from exc
            if isinstance(exc, OSError):
                raise StoreError(f"{self.path}: flush to {self.lake_dir} failed: {exc}") from exc
            raise

    def _sweep(self, first_tail_id: int) -> None:
        """Remove a crashed flush's files; leave (and report) unlisted files of other rows."""
        if self._identity is not None:
            try:
                self._lake.claim(self._identity)
            except LakeError as exc:
                raise StoreError(f"{self.path}: {exc}") from None
        listed = {r[0] for r in self._conn.execute("SELECT path FROM lake_files")}
        left = self._lake.remove_unlisted(listed, first_tail_id)
        if left:
            log.warning("%d Parquet file(s) in %s are not in the store's manifest and hold "
                        "rows that are not in its tail either (first: %s): left in place "
                        "and not read; restore their manifest rows or move them away",
                        len(left), self.lake_dir, left[0])

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
        if _application_id(self._conn) != APPLICATION_ID:  # new, or written before the id
            with self._conn:
                self._conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        if current < target:  # another process's upgrade may hold the write lock long
            self._conn.execute(f"PRAGMA busy_timeout = {int(MIGRATION_WAIT_S * 1000)}")
        try:
            self._apply(current, target)
        finally:
            self._conn.execute("PRAGMA busy_timeout = 10000")

    def _apply(self, current: int, target: int) -> None:
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


def _application_id(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA application_id").fetchone()[0])


def _tables(conn: sqlite3.Connection) -> set[str]:
    """The file's own tables (SQLite's internal ``sqlite_*`` left out)."""
    return {name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}


def not_a_store(conn: sqlite3.Connection) -> str | None:
    """Why the file behind ``conn`` is no thinkmem store; None for a store or an empty file.

    A store carries ``APPLICATION_ID``; one written before the id existed holds only
    ``STORE_TABLES``, as does a new file one of this file's openers began (an empty one
    holds none). Any other table, or another application id, is another program's.
    Reads only, so a read-only opener (``thinkmem knowledge list``) may ask too.
    """
    app = _application_id(conn)
    if app == APPLICATION_ID:
        return None
    if app != 0:
        return f"another program's database: SQLite application id {app:#010x}"
    other = sorted(_tables(conn) - STORE_TABLES)
    if not other:
        return None
    more = f" and {len(other) - 3} more" if len(other) > 3 else ""
    return f"it holds other tables: {', '.join(other[:3])}{more}"


def holds_store(path: Path | str) -> bool:
    """Whether ``path`` is a store already, not an empty file (a reader's check: read-only).

    Raises ``StoreError`` for another program's database, a file that is no SQLite
    database, a FIFO or a folder.
    """
    path = Path(path)
    try:
        input_file(path, "path")
    except ValueError as exc:
        raise StoreError(f"cannot open store: {exc}") from None
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=10.0)
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot open store: {exc}") from None
    try:
        problem = not_a_store(conn)
        if problem is not None:
            raise StoreError(f"{path}: not a thinkmem store ({problem})")
        return _application_id(conn) == APPLICATION_ID or bool(_tables(conn))
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot open store: {exc}") from None
    finally:
        conn.close()


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


def _decode_all(payloads: list[bytes], path: Path) -> list[Experience | None]:
    """Decode stored payloads in one batch; None (and a WARNING) for a row that no longer does.

    A stored row was valid when it was acknowledged; one that no longer decodes was changed
    on disk since. Raising stopped every round on that one row, for good; it is left out
    of what is read (not deleted) and named in the log instead.
    """
    out: list[Experience | None] = []
    bad: list[ExperienceError] = []
    for item in decode_experiences(payloads):
        if isinstance(item, ExperienceError):
            bad.append(item)
            item = None
        out.append(item)
    if bad:
        log.warning("%s: %d stored experience(s) no longer decode and are left out of this "
                    "read (first: %s)", path, len(bad), " ".join(str(bad[0]).split())[:200])
    return out
