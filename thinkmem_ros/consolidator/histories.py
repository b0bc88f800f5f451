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

A round's discovery reads them within a horizon (``carried``): each robot's newest
episodes, charged what they cost the scan (``scan_cost``) and shared fairly between robots,
up to ``--discovery-events``; so a round's memory and time stay bounded as the store grows.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from thinkmem_ros.consolidator.scan_cost import history_cost

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
    "INSERT INTO episode_histories (robot_id, episode_id, first_stamp, stamp, seq, events,"
    " n_events, scan_cost) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (robot_id, episode_id) DO UPDATE SET"
    # every right-hand side reads the row as it was, so the comparison is made once
    " first_stamp = MIN(first_stamp, excluded.first_stamp),"
    " events = CASE WHEN (excluded.stamp, excluded.seq) > (stamp, seq)"
    " THEN excluded.events ELSE events END,"
    " n_events = CASE WHEN (excluded.stamp, excluded.seq) > (stamp, seq)"
    " THEN excluded.n_events ELSE n_events END,"
    " scan_cost = CASE WHEN (excluded.stamp, excluded.seq) > (stamp, seq)"
    " THEN excluded.scan_cost ELSE scan_cost END,"
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
            conn.executemany(UPSERT_SQL, [(*r, history_events(r[5]), history_cost(r[5]))
                                          for r in rows[lo:lo + FOLD_CHUNK]])
            if lo + FOLD_CHUNK >= len(rows):  # the mark moves with the last chunk
                conn.execute(MARK_SQL, (through_id,))
    return HistoriesFold(after, through_id, len(rows))


# schema 8 as first written: newest episodes first over the whole fleet
FIRST_STAMP_INDEX = ("CREATE INDEX episode_histories_first ON episode_histories"
                     " (first_stamp, robot_id, episode_id)")
# schema 9, discovery's horizon: each episode's events and scan cost (``scan_cost``), and
# per robot its episodes newest first, read from the index alone until its share is spent.
# The table is rebuilt rather than altered: stores migrated to 8 by this project's
# intermediate versions hold either index and some of the columns, and a rebuild from the
# base columns gives every one of them the same table. The counts come from the Python
# functions registered on the store's connection (``functions``).
HORIZON_MIGRATION = (
    "DROP INDEX IF EXISTS episode_histories_first",
    "DROP INDEX IF EXISTS episode_histories_newest",
    "CREATE TABLE episode_histories_v9 (robot_id TEXT NOT NULL, episode_id TEXT NOT NULL,"
    " first_stamp REAL NOT NULL, stamp REAL NOT NULL, seq INTEGER NOT NULL,"
    " events TEXT NOT NULL, n_events INTEGER NOT NULL, scan_cost INTEGER NOT NULL,"
    " UNIQUE (robot_id, episode_id))",
    "INSERT INTO episode_histories_v9 SELECT robot_id, episode_id, first_stamp, stamp, seq,"
    " events, thinkmem_history_events(events), thinkmem_history_cost(events)"
    " FROM episode_histories",
    "DROP TABLE episode_histories",
    "ALTER TABLE episode_histories_v9 RENAME TO episode_histories",
    "CREATE INDEX episode_histories_newest ON episode_histories"
    " (robot_id, first_stamp, episode_id, scan_cost)",
)
_ROBOT_AFTER_SQL = "SELECT MIN(robot_id) FROM episode_histories WHERE robot_id > ?"
# an episode without events holds nothing for discovery: a robot sending millions of
# them would otherwise be read whole, since they cost none of the budget
_SIZES_SQL = ("SELECT scan_cost, first_stamp, episode_id FROM episode_histories"
              " WHERE robot_id = ? AND scan_cost > 0"
              " ORDER BY first_stamp DESC, episode_id DESC LIMIT ?")
# the next page: older than the last row read, (first_stamp, episode_id) descending
_SIZES_AFTER_SQL = ("SELECT scan_cost, first_stamp, episode_id FROM episode_histories"
                    " WHERE robot_id = ? AND scan_cost > 0"
                    " AND (first_stamp, episode_id) < (?, ?)"
                    " ORDER BY first_stamp DESC, episode_id DESC LIMIT ?")
_NEWEST_SQL = ("SELECT robot_id, episode_id, first_stamp, events FROM episode_histories"
               " WHERE robot_id = ? AND scan_cost > 0"
               " ORDER BY first_stamp DESC, episode_id DESC LIMIT ?")


@dataclass(frozen=True)
class Horizon:
    """What discovery's horizon kept of the carried histories."""

    episodes: int  # episodes read (each robot's newest)
    events: int  # their events
    left_out: int  # older episodes (with events) beyond the horizon, not read
    robots: int = 0  # robots whose episodes were read
    cost: int = 0  # their scan cost, in honest events (``scan_cost``)


def functions(conn: sqlite3.Connection) -> None:
    """Register the counts migration 9's rebuild runs in SQL on ``conn``."""
    conn.create_function("thinkmem_history_events", 1, history_events, deterministic=True)
    conn.create_function("thinkmem_history_cost", 1, history_cost, deterministic=True)


def every_episode(conn: sqlite3.Connection) -> list[tuple[str, str, float, str]]:
    """(robot, episode, first stamp, history joined by newlines) of every episode."""
    return conn.execute("SELECT robot_id, episode_id, first_stamp, events"
                        " FROM episode_histories").fetchall()


def carried(conn: sqlite3.Connection, budget: int = 0
            ) -> tuple[list[tuple[str, str, float, str]], Horizon]:
    """(robot, episode, first stamp, history joined by newlines) within discovery's horizon.

    ``budget`` > 0 is the horizon, in what the episodes cost the scan (honest events,
    ``scan_cost``: an event among many distinct names costs more): whole episodes, each
    robot's newest first, the budget shared max-min fairly between robots
    (``fair_counts``). Why a horizon: a round held every episode the store ever carried in
    memory and scanned them all, so its memory and time grew with the store until a
    fleet's consolidator could not run a round at all. Why per robot and by cost: newest
    over the whole fleet let one robot that floods new episodes (or stamps them in the
    future: stamps are the robot's) push every other robot's out of discovery, and counted
    by events, dense episodes could still make a round ten times longer. Episodes without
    events hold nothing for discovery and are never read, with a horizon or without (so a
    horizon that holds every episode gives discovery the same log as none). Only the
    index is read to choose, then only the chosen histories. 0 reads every episode that
    holds events.
    """
    if budget <= 0:
        rows = conn.execute("SELECT robot_id, episode_id, first_stamp, events"
                            " FROM episode_histories WHERE scan_cost > 0").fetchall()
        return rows, _horizon(rows, 0)
    robots = _robots(conn)
    counts = fair_counts({r: _sizes(conn, r) for r in robots}, budget, mark(conn))
    rows = [row for r in robots if counts[r]
            for row in conn.execute(_NEWEST_SQL, (r, counts[r]))]
    total = conn.execute("SELECT COUNT(*) FROM episode_histories WHERE scan_cost > 0"
                         ).fetchone()[0]
    return rows, _horizon(rows, int(total) - len(rows))


def newest_within(rows: Sequence[tuple], budget: int, turn: int = 0
                  ) -> tuple[list[tuple], Horizon]:
    """``carried``'s horizon over (robot, episode, first stamp, history) rows in memory.

    ``turn`` breaks full ties as ``carried``'s round mark does (the newest row id the
    rows were read through), so equal robots take turns here too.
    """
    by_robot: dict[str, list[tuple]] = {}
    for row in rows:
        if row[3]:  # as ``carried``: an episode without events is not read
            by_robot.setdefault(row[0], []).append(row)
    if budget <= 0:
        every = [row for own in by_robot.values() for row in own]
        return every, _horizon(every, 0)
    for own in by_robot.values():
        own.sort(key=lambda r: (r[2], r[1]), reverse=True)
    counts = fair_counts({r: (history_cost(x[3]) for x in own)
                          for r, own in by_robot.items()}, budget, turn)
    kept = [row for r in sorted(by_robot) for row in by_robot[r][:counts[r]]]
    return kept, _horizon(kept, sum(len(own) for own in by_robot.values()) - len(kept))


def _horizon(rows: Sequence[tuple], left_out: int) -> Horizon:
    return Horizon(len(rows), sum(history_events(r[3]) for r in rows), left_out,
                   len({r[0] for r in rows}), sum(history_cost(r[3]) for r in rows))


def fair_counts(sizes: dict[str, Iterator[int]], budget: int, turn: int = 0
                ) -> dict[str, int]:
    """How many of each robot's newest episodes fit ``budget``, shared max-min fairly.

    ``sizes[robot]`` yields what its episodes cost, newest first, and is read only as far
    as needed (one beyond what is taken). The robot that has been given the least so far
    takes its next episode while it fits what is left (at equal shares, the smaller next
    episode first, so as many robots as possible are served); a robot whose next episode
    no longer fits is done. So no robot gets a second episode before every other has had
    the chance of a first, a robot sending many small episodes gets no more in all than
    one sending few large ones, and no budget is left while some robot's next episode
    would fit. Full ties go by a hash of the robot and ``turn`` (the round's histories
    mark), so when the budget runs out among equals, a different robot misses out each
    round rather than the one whose id sorts last, every round.
    """
    counts = {r: 0 for r in sizes}
    # (given, next episode, tie-break, robot)
    heap = [(0, n, _tie(robot, turn), robot) for robot in sorted(sizes)
            if (n := next(sizes[robot], None)) is not None]
    heapq.heapify(heap)
    left = budget
    while heap and left > 0:
        given, n, tie, robot = heapq.heappop(heap)
        if n > left:  # it no longer fits: this robot is done
            continue
        counts[robot] += 1
        left -= n
        after = next(sizes[robot], None)
        if after is not None:
            heapq.heappush(heap, (given + n, after, tie, robot))
    return counts


def _tie(robot: str, turn: int) -> bytes:
    return hashlib.blake2b(f"{turn}\x1f{robot}".encode(), digest_size=8).digest()


def _sizes(conn: sqlite3.Connection, robot: str) -> Iterator[int]:
    """What ``robot``'s episodes cost, newest first, a page at a time.

    Pages, not one live cursor per robot: SQLite slows down with thousands of open
    statements (10,000 robots took 2.8 s, 30,000 took 59 s).
    """
    page, after = 64, None
    while True:
        rows = conn.execute(_SIZES_SQL if after is None else _SIZES_AFTER_SQL,
                            (robot, *(after or ()), page)).fetchall()
        for row in rows:
            yield row[0]
        if len(rows) < page:
            return
        after = (rows[-1][1], rows[-1][2])
        page = min(page * 4, 65536)


def _robots(conn: sqlite3.Connection) -> list[str]:
    """The robots with carried histories, one index seek each (not a scan of every row)."""
    robots = []
    robot = conn.execute("SELECT MIN(robot_id) FROM episode_histories").fetchone()[0]
    while robot is not None:
        robots.append(robot)
        robot = conn.execute(_ROBOT_AFTER_SQL, (robot,)).fetchone()[0]
    return robots


def history_events(text: str) -> int:
    """Events in a history joined by newlines ('' holds none)."""
    return text.count("\n") + 1 if text else 0
