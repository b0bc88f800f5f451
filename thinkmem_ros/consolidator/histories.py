"""Each episode's event history, carried in the store from round to round.

Why: discovery reads one event history per episode, but every stored experience carries
its episode's whole history up to its stamp (up to ``LIMITS['max_events']`` names), so
finding each episode's latest history by scanning the rows reads the store's every row
and every history, each round: hundreds of bytes to kilobytes per row, for a few names
per episode that changed. The store keeps the answer instead (``episode_histories``: per
episode its latest history, the stamp and sequence number it came from, and its first
stamp) and a mark (``histories_mark``: every row up to this id is in it). A round folds in
only the rows after the mark.

The fold is a maximum and a minimum per episode (the latest record by (stamp, seq) gives
the history, the earliest stamp opens the episode), so it gives the answer of a whole scan
whatever order rows arrive in (a robot that reconnects and sends older records after newer
ones) and folding the same rows twice changes nothing: a round that dies between the fold
and the mark only repeats work. Rows are ordered by id and ids only grow, so "after the
mark" is exactly what arrived since.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

TABLES = (
    # an ordinary rowid table: WITHOUT ROWID suits small rows, and a history is up to
    # 1,024 names (kilobytes)
    "CREATE TABLE episode_histories (robot_id TEXT NOT NULL, episode_id TEXT NOT NULL,"
    " first_stamp REAL NOT NULL, stamp REAL NOT NULL, seq INTEGER NOT NULL,"
    " events TEXT NOT NULL, UNIQUE (robot_id, episode_id))",
    "CREATE TABLE histories_mark (one INTEGER PRIMARY KEY CHECK (one = 1),"
    " through_id INTEGER NOT NULL)",
)

# per episode among the rows in (after, through]: its latest record's stamp, seq and
# history, and its first stamp; the same SQL runs on the SQLite tail and in DuckDB
LATEST_SQL = (
    "SELECT robot_id, episode_id, first_stamp, stamp, seq, events FROM (SELECT robot_id,"
    " episode_id, stamp, seq, events, MIN(stamp) OVER (PARTITION BY robot_id, episode_id)"
    " AS first_stamp, row_number() OVER (PARTITION BY robot_id, episode_id ORDER BY stamp"
    " DESC, seq DESC) AS latest FROM {src} WHERE id > ? AND id <= ?) WHERE latest = 1")

UPSERT_SQL = (
    "INSERT INTO episode_histories VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (robot_id, episode_id) DO UPDATE SET"
    # every right-hand side reads the row as it was, so the comparison is made once
    " first_stamp = MIN(first_stamp, excluded.first_stamp),"
    " events = CASE WHEN (excluded.stamp, excluded.seq) > (stamp, seq)"
    " THEN excluded.events ELSE events END,"
    " seq = CASE WHEN (excluded.stamp, excluded.seq) > (stamp, seq)"
    " THEN excluded.seq ELSE seq END,"
    " stamp = MAX(stamp, excluded.stamp)")

MARK_SQL = ("INSERT INTO histories_mark VALUES (1, ?) ON CONFLICT (one) DO UPDATE SET"
            " through_id = MAX(through_id, excluded.through_id)")

FOLD_CHUNK = 2000  # episodes upserted per write transaction (histories up to ~16 KB each)

Row = tuple[str, str, float, float, int, str]  # robot, episode, first, stamp, seq, events
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HistoriesFold:
    """What one fold read: the rows after ``after_id`` through ``through_id``."""

    after_id: int
    through_id: int
    episodes: int  # episodes those rows touched (new or extended)


def mark(conn: sqlite3.Connection, newest: int | None = None) -> int:
    """Every row up to this id is folded into ``episode_histories`` (0: none yet).

    A mark that is not a row id of this store (text, negative, or past ``newest``, the
    store's newest row, when given) was written by something else: it is dropped with a
    WARNING and 0 returned, so the next fold reads every row again. Trusted as it was, a
    mark ahead of the rows left every episode after it out of discovery, silently.
    """
    row = conn.execute("SELECT through_id FROM histories_mark").fetchone()
    if row is None:
        return 0
    value = row[0]
    if (isinstance(value, int) and not isinstance(value, bool) and value >= 0
            and (newest is None or value <= newest)):
        return value
    log.warning("the episode histories mark %.40r is not a row id of this store (newest "
                "%s): every row is folded again", value, newest)
    with conn:
        conn.execute("DELETE FROM histories_mark")
    return 0


def latest(rows: Sequence[Row]) -> list[Row]:
    """Per episode, the first stamp and the latest record's history over ``rows``.

    An episode's rows can be split between the lake and the SQLite tail, so each side's
    answer is folded again here.
    """
    out: dict[tuple[str, str], Row] = {}
    for r in rows:
        have = out.get((r[0], r[1]))
        if have is None:
            out[(r[0], r[1])] = r
            continue
        newer = r if (r[3], r[4]) > (have[3], have[4]) else have
        out[(r[0], r[1])] = (*newer[:2], min(r[2], have[2]), *newer[3:])
    return list(out.values())


def fold(conn: sqlite3.Connection, through_id: int,
         read: Callable[[int, int], Sequence[Row]]) -> HistoriesFold:
    """Fold the rows in (mark, ``through_id``] into the carried histories, then move the mark.

    ``read(after, through)`` returns ``LATEST_SQL``'s rows of both the lake and the tail.
    ``FOLD_CHUNK`` episodes per write transaction, so receivers writing the same file wait
    for one short transaction at a time (their busy timeout is 10 s), and the mark moves
    with the last: a fold that dies between chunks leaves the mark where it was, and the
    next one folds the same rows again, which changes nothing (idempotent).
    """
    after = mark(conn, newest=through_id)
    if through_id <= after:
        return HistoriesFold(after, after, 0)
    rows = latest(read(after, through_id))
    for lo in range(0, max(len(rows), 1), FOLD_CHUNK):
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(UPSERT_SQL, rows[lo:lo + FOLD_CHUNK])
            if lo + FOLD_CHUNK >= len(rows):  # the mark moves with the last chunk
                conn.execute(MARK_SQL, (through_id,))
    return HistoriesFold(after, through_id, len(rows))


# newest episode first (by first stamp; ties by robot and episode, so the horizon is one
# answer): walks ``HORIZON_INDEX`` backwards, reading only the rows it keeps
NEWEST_FIRST_SQL = ("SELECT robot_id, episode_id, first_stamp, events FROM episode_histories"
                    " ORDER BY first_stamp DESC, robot_id DESC, episode_id DESC")
HORIZON_INDEX = ("CREATE INDEX episode_histories_first ON episode_histories"
                 " (first_stamp, robot_id, episode_id)")


@dataclass(frozen=True)
class Horizon:
    """What discovery's horizon kept of the carried histories."""

    episodes: int  # episodes read (the newest)
    events: int  # their events
    left_out: int  # older episodes beyond the horizon, not read


def carried(conn: sqlite3.Connection, max_events: int = 0
            ) -> tuple[list[tuple[str, str, float, str]], Horizon]:
    """(robot, episode, first stamp, history joined by newlines), newest episode first.

    ``max_events`` > 0 is discovery's horizon: whole episodes, newest first, while their
    events fit; the first that does not ends it (an older short episode is not read in its
    place, so what is read is one recent stretch of the fleet's history). Why: a round
    held every episode the store ever carried in memory and scanned them all, so its
    memory and time grew with the store until a fleet's consolidator could not run a
    round at all; the horizon bounds both by what a round can afford. 0 reads every
    episode.
    """
    rows, events = _newest(conn.execute(NEWEST_FIRST_SQL), max_events)
    left = 0
    if max_events > 0:
        total = conn.execute("SELECT COUNT(*) FROM episode_histories").fetchone()[0]
        left = int(total) - len(rows)
    return rows, Horizon(len(rows), events, left)


def newest_within(rows: Sequence[tuple], max_events: int
                  ) -> tuple[list[tuple], Horizon]:
    """``carried``'s horizon over (robot, episode, first stamp, history) rows in memory."""
    ordered = sorted(rows, key=lambda r: (r[2], r[0], r[1]), reverse=True)
    kept, events = _newest(ordered, max_events)
    return kept, Horizon(len(kept), events, len(ordered) - len(kept))


def _newest(rows: Iterable[tuple], max_events: int) -> tuple[list[tuple], int]:
    """Rows (newest first) while their events fit ``max_events`` (0: all); reads no further."""
    kept: list[tuple] = []
    events = 0
    for row in rows:
        n = history_events(row[3])
        if max_events > 0 and events + n > max_events:
            break
        kept.append(row)
        events += n
    return kept, events


def history_events(text: str) -> int:
    """Events in a history joined by newlines ('' holds none)."""
    return text.count("\n") + 1 if text else 0
