"""How far into the store each published bundle has learned: the marks incremental rounds use.

A round that publishes trained on the store's rows up to some row id; what it learned from
them is in the policy and in its rehearsal set D (saved beside the bundle, its sha256 in the
bundle's signed manifest). The next round on top of that bundle needs only the rows after
that id (plus a reservoir of older episodes, ``round_read``). The mark is kept in the
store's own SQLite file, keyed by D's sha256: row ids belong to that file, so a bundle
trained on another store (or whose D is missing and had to be rebuilt) finds no mark here,
and its round reads the whole store as a first round does. A bundle rolled back to, or a
robot pinned to, an older version finds that version's own mark.

Beside the mark goes the reservoir the next round reads (``round_read.Reservoir``, chosen
from the recording round's reservoir and new episodes), with the budget and seed it was
chosen for: a round with another budget or seed chooses its own from the row counts.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from thinkmem_ros.consolidator.round_read import Reservoir


class RoundMarkError(RuntimeError):
    """The marks table cannot be opened or written."""


class RoundMarks:
    """``round_marks`` in the consolidator's database: rehearsal sha256 -> newest row id."""

    def __init__(self, path: str | Path, timeout_s: float = 5.0) -> None:
        self.path = Path(path)
        try:
            self._conn = sqlite3.connect(str(self.path), timeout=timeout_s)
            with self._conn:
                self._conn.execute(
                    "CREATE TABLE IF NOT EXISTS round_marks (rehearsal_sha256 TEXT PRIMARY KEY,"
                    " through_id INTEGER NOT NULL, version INTEGER NOT NULL,"
                    " created_at REAL NOT NULL, reservoir TEXT)")
        except sqlite3.Error as err:
            raise RoundMarkError(f"{self.path}: cannot open round marks: {err}") from err

    def __enter__(self) -> RoundMarks:
        return self

    def __exit__(self, *exc) -> None:
        self._conn.close()

    def record(self, rehearsal_sha256: str, through_id: int, version: int,
               reservoir: Reservoir | None = None, budget: int = 0, seed: int = 0) -> None:
        """The bundle whose D has this sha256 learned from rows up to ``through_id``.

        ``reservoir``: what a round on top of it reads of the older rows, chosen for
        ``budget`` experiences and ``seed``.
        """
        carried = None if reservoir is None else json.dumps(
            {"budget": int(budget), "seed": int(seed), "reservoir": reservoir.to_json()})
        try:
            with self._conn:
                self._conn.execute("INSERT OR REPLACE INTO round_marks VALUES (?, ?, ?, ?, ?)",
                                   (rehearsal_sha256, int(through_id), int(version),
                                    time.time(), carried))
        except sqlite3.Error as err:
            raise RoundMarkError(f"{self.path}: cannot record a round mark: {err}") from err

    def through(self, rehearsal_sha256: str | None) -> int:
        """The mark of the bundle whose D has this sha256; 0 when this store has none."""
        if not rehearsal_sha256:
            return 0
        try:
            row = self._conn.execute("SELECT through_id FROM round_marks WHERE "
                                     "rehearsal_sha256 = ?", (rehearsal_sha256,)).fetchone()
        except sqlite3.Error as err:
            raise RoundMarkError(f"{self.path}: cannot read round marks: {err}") from err
        if row is None:
            return 0
        if isinstance(row[0], bool) or not isinstance(row[0], int) or row[0] < 0:
            raise RoundMarkError(f"{self.path}: a damaged round mark ({row[0]!r:.40})")
        return row[0]

    def reservoir(self, rehearsal_sha256: str | None, budget: int, seed: int
                  ) -> Reservoir | None:
        """The reservoir recorded with that mark for this budget and seed, or None."""
        if not rehearsal_sha256:
            return None
        try:
            row = self._conn.execute("SELECT reservoir FROM round_marks WHERE "
                                     "rehearsal_sha256 = ?", (rehearsal_sha256,)).fetchone()
        except sqlite3.Error as err:
            raise RoundMarkError(f"{self.path}: cannot read round marks: {err}") from err
        if row is None or row[0] is None:
            return None
        try:
            data = json.loads(row[0])
            if (data.get("budget"), data.get("seed")) != (budget, seed):
                return None
            return Reservoir.from_json(data["reservoir"])
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise RoundMarkError(f"{self.path}: a recorded reservoir is damaged: {err}"
                                 ) from err
