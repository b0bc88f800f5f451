"""Judging a spool file read-only, moving a damaged one aside, salvaging its rows.

The spool's everyday path (put, read, remove, a full disk) and what it does with a bad
file are separate worries, and the second one reads the file in ways the first never
should: through read-only connections (which read a WAL beside the file but never
checkpoint it, so whatever is found the file keeps its bytes), with ``immutable`` views
that ignore a WAL, and by stepping over damaged pages seq by seq. Keeping that here keeps
``spool`` about the spool and lets the damage handling be read in one place.

Nothing here raises the spool's own errors: a verdict or an ``OSError`` goes back, and
``spool`` says what it means to its caller (this module is below it, never imports it).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

SIDE_FILES = ("", "-wal", "-shm")
"""Suffixes of the files SQLite keeps for one database: they move aside together."""
META_KEYS = ("schema_version", "next_seq", "shed_total", "shed_disk_full_total")
_TABLES = {"meta": {"key", "value"}, "spool": {"seq", "payload", "size"}}
# errors that say the bytes are bad (not the folder, the disk's room or a lock)
_DAMAGE_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_READ_ERRORS = frozenset({sqlite3.SQLITE_IOERR_READ, sqlite3.SQLITE_IOERR_SHORT_READ})
_SALVAGE_BATCH = 500
_MIN_SEQ, _MAX_SEQ = -(1 << 63), (1 << 63) - 1

Rows = list[tuple[int, bytes]]


@dataclass
class View:
    """What one read-only view of a damaged spool gave to the fresh one."""

    copied: int = 0  # rows handed to the fresh spool
    failed: int = 0  # rows read but not written (a write error other than a full disk)
    # stretches skipped: (last seq read before, first seq read after); None: none
    gaps: list[tuple[int | None, int | None]] = field(default_factory=list)
    meta: dict[str, int] = field(default_factory=dict)
    spool: bool = True  # the view shows a spool table (a foreign WAL's view does not)


def is_damage(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says the file's bytes are bad (not its folder, room or a lock)."""
    code = getattr(exc, "sqlite_errorcode", 0)
    return (code & 0xFF) in _DAMAGE_CODES or code in _READ_ERRORS


def file_size(path: Path) -> int:
    """Size of ``path``; 0 when it cannot be seen (the open that follows says why)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


# ---------------------------------------------------------------- judging, read-only

def judge_file(path: Path, schema_version: int, full: bool) -> tuple[str, str]:
    """Judge the file at ``path`` before anything opens it read-write: ``(verdict, detail)``.

    A read-write open replays a WAL lying beside the file and then checkpoints it into
    the file for good: another database's WAL would replace the spool, a stale one of its
    own would corrupt it. So the file is judged through read-only connections: with its
    WAL, and when that view is not a spool, also without it (``immutable``), which tells a
    spool under a foreign WAL (damaged) from another program's database (refused, left as
    it is). ``full``: also read every page (``quick_check``).

    ``verdict``: "ok", "damaged" (detail: what is wrong) or "refused" (detail: the whole
    message: a directory in the way, another program's database, another schema). An
    SQLite error that is not damage (the folder, a lock, a full disk) is raised.
    """
    for suffix in SIDE_FILES:
        if os.path.isdir(f"{path}{suffix}"):
            return "refused", f"{path}{suffix} is a directory, not a spool file"
    size, wal = file_size(path), file_size(Path(f"{path}-wal"))
    if not size:
        return ("damaged", "an empty file beside a non-empty WAL") if wal else ("ok", "")
    verdict, detail = _look(path, "mode=ro", schema_version, full)
    if verdict in ("foreign", "empty") and wal:
        alone, tables = _look(path, "mode=ro&immutable=1", schema_version, full)
        if alone in ("ok", "damaged"):
            return "damaged", f"its WAL belongs to another database (tables: {detail or 'none'})"
        if alone == "foreign":
            verdict, detail = alone, tables
    if verdict == "foreign":
        return "refused", f"{path} is not a thinkmem spool (tables: {detail}); left as it is"
    if verdict == "schema":
        return "refused", f"{path}: spool schema {detail} is not supported"
    return ("damaged", detail) if verdict == "damaged" else ("ok", "")


def check_pages(path: Path) -> str | None:
    """Read every page of the spool at ``path`` read-only; what is wrong, or None.

    Safe beside the spool's own read-write connection in the same process: in WAL mode a
    reader never blocks it, and SQLite shares one set of file locks per process.
    """
    try:
        conn = sqlite3.connect(_uri(path, "mode=ro"), uri=True, timeout=5.0)
        try:
            return _quick_check(conn)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if not is_damage(exc):
            raise
        return str(exc)


def _look(path: Path, params: str, schema_version: int, full: bool) -> tuple[str, str]:
    """Judge the file through one read-only connection: ``(verdict, detail)``.

    ``verdict`` is "ok", "empty" (no tables), "foreign" (detail: its tables), "schema"
    (detail: the version found) or "damaged" (detail: what is wrong).
    """
    try:
        conn = sqlite3.connect(_uri(path, params), uri=True, timeout=5.0)
        try:
            return _judge(conn, schema_version, full)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if not is_damage(exc):
            raise
        return "damaged", str(exc)


def _judge(conn: sqlite3.Connection, schema_version: int, full: bool) -> tuple[str, str]:
    tables = _tables(conn)
    if not tables:
        return "empty", ""
    meta = _read_meta(conn, tables)
    has_spool = _has_table(conn, tables, "spool")
    if "schema_version" not in meta and not has_spool:
        return "foreign", ", ".join(tables)
    for key, value in meta.items():
        if not isinstance(value, int):
            return "damaged", f"meta.{key} is not an integer ({value!r})"
    version = meta.get("schema_version")
    if version is not None and version != schema_version:
        return "schema", str(version)
    if version is None or not has_spool:
        return "damaged", "its spool or meta table is missing"
    damage = _quick_check(conn) if full else None
    return ("damaged", damage) if damage else ("ok", "")


def _quick_check(conn: sqlite3.Connection) -> str | None:
    """``quick_check`` reads every page once, the freelist too (which no row read visits)."""
    result = conn.execute("PRAGMA quick_check").fetchone()[0]
    if result == "ok":
        return None
    lines = [line for line in result.splitlines() if not line.startswith("***")]
    return f"quick_check: {(lines or [result])[0]}"


# ---------------------------------------------------------------- moving aside

def move_aside(path: Path) -> Path:
    """Rename ``path`` and its -wal/-shm to ``<name>.damaged-<UTC time>``; return that.

    Renamed, never deleted: the bytes stay for whoever looks into the damage. When one
    cannot be moved, those already moved are put back and the OSError is raised.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    number = 0
    while any(os.path.lexists(f"{aside}{suffix}") for suffix in SIDE_FILES):
        number += 1
        aside = path.with_name(f"{path.name}.damaged-{stamp}-{number}")
    moved: list[str] = []
    try:
        for suffix in SIDE_FILES:
            if os.path.lexists(f"{path}{suffix}"):
                os.rename(f"{path}{suffix}", f"{aside}{suffix}")
                moved.append(suffix)
    except OSError:
        for suffix in moved:
            with contextlib.suppress(OSError):
                os.rename(f"{aside}{suffix}", f"{path}{suffix}")
        raise
    return aside


KEEP_DAMAGED = 2
"""Damaged copies of one spool kept beside it (the newest); older ones are deleted."""


def prune_damaged(path: Path, keep: int = KEEP_DAMAGED) -> list[Path]:
    """Delete all but the newest ``keep`` damaged copies of ``path``; return those deleted.

    Why: each copy is as large as the spool was (up to its byte cap), and a robot whose
    storage keeps failing would move one aside at every start until its disk was full,
    outside the cap the spool keeps to. Their rows were salvaged when they moved aside;
    the newest copies stay for whoever looks into the damage. Oldest by the time in the
    name (and its number within one second). A copy that cannot be deleted is left.
    """
    prefix = f"{path.name}.damaged-"
    copies: dict[tuple[str, int], str] = {}
    for entry in os.listdir(path.parent):
        if not entry.startswith(prefix):
            continue
        base = entry.removesuffix("-wal").removesuffix("-shm")
        stamp, _, number = base[len(prefix):].partition("-")
        copies[(stamp, int(number) if number.isdigit() else 0)] = base
    deleted = []
    for key in sorted(copies)[:max(0, len(copies) - keep)]:
        left = False
        for suffix in SIDE_FILES:
            try:
                os.remove(path.parent / f"{copies[key]}{suffix}")
            except FileNotFoundError:
                pass
            except OSError:  # not ours to force (a folder of that name, permissions)
                left = True
        if not left:
            deleted.append(path.parent / copies[key])
    return deleted


# ---------------------------------------------------------------- salvage

@dataclass
class Salvaged:
    """What the views of a damaged copy gave to the fresh spool, all told."""

    views: list[View]

    @property
    def copied(self) -> int:
        return sum(view.copied for view in self.views)

    @property
    def failed(self) -> int:
        return sum(view.failed for view in self.views)

    @property
    def meta(self) -> dict[str, int]:
        """The highest of each counter any view read (never lower than the truth)."""
        return {key: max([view.meta.get(key, 0) for view in self.views], default=0)
                for key in META_KEYS}


def salvage(aside: Path, fresh: sqlite3.Connection, put: Callable[[Rows], int]) -> Salvaged:
    """Hand every row still readable in ``aside`` to ``put`` (returns rows not written).

    Through read-only connections, so the damaged copy keeps its bytes: the file with its
    WAL, and when it has one or that view met damage, also the file alone (``immutable``:
    SQLite ignores the WAL then), since a foreign or stale WAL hides rows the file itself
    holds, and its older copy of a page may still read. A seq's payload never changes, so
    the union is right; the second view skips seqs the fresh spool (``fresh``) holds.
    """
    found: list[View] = []
    if file_size(aside):  # an empty file: SQLite would delete the WAL beside it
        found.append(_salvage_view(aside, "mode=ro", put, None))
        if file_size(Path(f"{aside}-wal")) or found[0].gaps:
            found.append(_salvage_view(aside, "mode=ro&immutable=1", put, fresh))
    return Salvaged(found)


def _salvage_view(aside: Path, params: str, put: Callable[[Rows], int],
                  fresh: sqlite3.Connection | None) -> View:
    """Copy what one view of ``aside`` can read; with ``fresh``, skip seqs it holds."""
    try:
        conn = sqlite3.connect(_uri(aside, params), uri=True, timeout=5.0)
    except sqlite3.Error:
        return View(gaps=[(None, None)])
    try:
        try:
            tables = _tables(conn)
            view = View(spool=_has_table(conn, tables, "spool"))
        except sqlite3.Error:  # not even the schema can be read
            return View(gaps=[(None, None)])
        with contextlib.suppress(sqlite3.Error):
            view.meta = {key: value for key, value in _read_meta(conn, tables).items()
                         if isinstance(value, int)}
        for batch in _readable_batches(conn, view.gaps) if view.spool else ():
            if fresh is not None:
                known = _present(fresh, [seq for seq, _ in batch])
                batch = [row for row in batch if row[0] not in known]
            failed = put(batch) if batch else 0
            view.failed += failed
            view.copied += len(batch) - failed
        return view
    finally:
        conn.close()


def loss_words(salvaged: Salvaged, fresh: sqlite3.Connection) -> str:
    """What a salvage at open lost, in words (how many rows the file held is unknown).

    A stretch a view skipped runs from the last seq read before it to the first after it
    (or ``next_seq``); its seqs that no view salvaged (not in ``fresh``) bound the rows
    lost there from above, since seqs may have holes. The view that lost least tells.
    """
    next_seq = salvaged.meta["next_seq"]
    bounds = [_gap_bound(view.gaps, next_seq, fresh) for view in salvaged.views if view.spool]
    known = [bound for bound in bounds if bound is not None]
    if not known:
        return "an unknown number lost (the spool table cannot be read)"
    lost = min(known) + salvaged.failed
    return f"up to {lost} lost" if lost else "none lost"


def _gap_bound(gaps: list[tuple[int | None, int | None]], next_seq: int,
               fresh: sqlite3.Connection) -> int | None:
    total = 0
    merged: dict[int | None, int | None] = {}
    for low, high in gaps:  # a row stepped over gives a second stretch from `low`
        old = merged.get(low, high)
        merged[low] = None if old is None or high is None else max(old, high)
    for low, high in merged.items():
        high = next_seq if high is None and next_seq else high
        if low is None or high is None:
            return None
        total += max(0, high - low - 1 - _count_between(fresh, low, high))
    return total


def _present(fresh: sqlite3.Connection, seqs: list[int]) -> set[int]:
    marks = ",".join("?" * len(seqs))
    try:
        return {row[0] for row in fresh.execute(
            f"SELECT seq FROM spool WHERE seq IN ({marks})", seqs)}
    except sqlite3.Error:
        return set()


def _count_between(fresh: sqlite3.Connection, low: int, high: int) -> int:
    try:
        return fresh.execute("SELECT COUNT(*) FROM spool WHERE seq > ? AND seq < ?",
                             (low, high)).fetchone()[0]
    except sqlite3.Error:
        return 0


# ---------------------------------------------------------------- reading past damage

def _uri(path: Path, params: str) -> str:
    return f"file:{urllib.parse.quote(os.fspath(path))}?{params}"


def _tables(conn: sqlite3.Connection) -> list[str]:
    return sorted(row[0] for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'"))


def _has_table(conn: sqlite3.Connection, tables: list[str], name: str) -> bool:
    """Whether ``name`` is among ``tables`` with (at least) the spool's columns for it."""
    if name not in tables:
        return False
    columns = {row[1] for row in conn.execute(f"PRAGMA table_info({name})")}
    return columns >= _TABLES[name]


def _read_meta(conn: sqlite3.Connection, tables: list[str]) -> dict[str, object]:
    if not _has_table(conn, tables, "meta"):
        return {}
    marks = ",".join("?" * len(META_KEYS))
    return dict(conn.execute(f"SELECT key, value FROM meta WHERE key IN ({marks})",
                             META_KEYS))


def _readable_batches(conn: sqlite3.Connection, gaps: list[tuple[int | None, int | None]]
                      ) -> Iterator[Rows]:
    """The spool rows ``conn`` can still read, in seq order and in batches, past damage.

    A read that fails has met a damaged page after the last seq read; ``_next_readable``
    finds where intact pages start again, and each stretch stepped over is noted in
    ``gaps`` as (last seq read before it, first seq after it), None where there is none.
    """
    after, last, jumped = _MIN_SEQ, None, False
    while True:
        rows, failed = _read_rows(conn, after)
        if rows:
            yield rows
            after = last = rows[-1][0]
            jumped = False
        if not failed:
            if not rows:
                return
            continue
        if jumped and not rows:  # a scan cannot even start at the row a seek found:
            after += 1  # read that row alone (a scan steps on into the damage), then on
            one = _read_one(conn, after)
            if one:
                yield one
                last = after
        found = _next_readable(conn, after)
        gaps.append((last, found))
        if found is None:
            return
        after, jumped = found - 1, True


def _read_rows(conn: sqlite3.Connection, after: int) -> tuple[Rows, bool]:
    """Up to a batch of rows after ``after``, and whether the read stopped on an error."""
    rows: Rows = []
    try:  # ">= after + 1": SQLite seeks "> after" by visiting ``after`` first, maybe damaged
        for row in conn.execute("SELECT seq, payload FROM spool WHERE seq >= ? ORDER BY seq "
                                "LIMIT ?", (after + 1, _SALVAGE_BATCH)):
            rows.append(row)
    except sqlite3.Error:
        return rows, True
    return rows, False


def _read_one(conn: sqlite3.Connection, seq: int) -> Rows:
    try:
        return conn.execute("SELECT seq, payload FROM spool WHERE seq = ?", (seq,)).fetchall()
    except sqlite3.Error:
        return []


def _next_readable(conn: sqlite3.Connection, after: int) -> int | None:
    """The first seq after ``after`` that a seek reaches without meeting damage, or None.

    Seeks to ever further seqs (the step doubles) until one lands on an intact page, then
    bisects back to the nearest seek point that works: the rows in between are on the
    damaged pages. Some 2 x 64 seeks at most, against any spread of seqs.
    """
    bad, step = after, 1
    while True:
        at = min(after + step, _MAX_SEQ)
        try:
            found = _first_at(conn, at)
            break
        except sqlite3.Error:
            if at == _MAX_SEQ:
                return None
            bad, step = at, 2 * step
    good = at
    while good - bad > 1:
        middle = (bad + good) // 2
        try:
            found, good = _first_at(conn, middle), middle
        except sqlite3.Error:
            bad = middle
    return found


def _first_at(conn: sqlite3.Connection, at: int) -> int | None:
    row = conn.execute("SELECT seq FROM spool WHERE seq >= ? ORDER BY seq LIMIT 1",
                       (at,)).fetchone()
    return None if row is None else row[0]
