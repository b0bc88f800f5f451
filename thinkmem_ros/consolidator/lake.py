"""The experience lake: append-only Parquet files, partitioned by robot and day, read by DuckDB.

Why a lake beside SQLite: a fleet's history outgrows one SQLite table (every row carries
its wire payload, and a round would page through all of it), while columnar files are
written once, compress well, and are read column by column by an embedded engine with
nothing to install or start. SQLite keeps what it does best: the exactly-once ingest
(each batch is one transaction, acknowledged after commit) for the recent tail, the keys
of everything ever flushed, and the manifest of lake files. ``ExperienceStore.flush``
moves the tail into the lake under SQLite's write lock: files are written to a temporary
name and renamed, then listed in the manifest in the same transaction that deletes the
tail rows, so a crash anywhere leaves each experience either in the tail or in a listed
file, never both and never neither. Readers only read files the manifest lists, so a
file orphaned by a crash before the commit is invisible (and removed by the next flush).
The sweep removes only what a crashed flush can leave: temporary files, and part files
whose rows are all still in the tail. A part file of older rows that the manifest does not
list (a manifest row deleted by hand, a store file replaced) is left in place and reported:
it may be the only copy of those experiences. The folder holds a marker with the id of the
store that owns it (``OWNER_FILE``), so a second store with the same stem, or a store file
replaced by an empty one, is refused instead of sweeping another store's files.

Every read checks each listed file's Parquet footer against its manifest row (rows, id
range, robot, and the owner id a flush writes into the footer, ``OWNER_KEY``) before the
query runs (``ParquetLake.mismatched``): a file swapped for another valid Parquet file of
the same columns (a copy of another part, another lake's part) reads without an error, so
only this check keeps its rows from being read twice or read as this store's.

Layout (Hive style, so DuckDB, pyarrow or Spark can read the folder directly)::

    <store>.lake/robot=<robot id, %-quoted>/day=<YYYY-MM-DD, UTC of arrival>/
        part-<first id>-<last id>.parquet
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from thinkmem_ros.policy.bundle import fsync_dir

# Column order of a lake row: the SQLite tail's columns, so one SELECT feeds both.
COLUMNS = ("id", "robot_id", "seq", "episode_id", "stamp", "bundle_version", "payload",
           "events", "reward", "received_at", "signal_set")


OWNER_FILE = ".thinkmem-store"
# Footer key-value metadata of a part file: the id of the store whose flush wrote it.
OWNER_KEY = b"thinkmem.store"
# Footer verdicts remembered per process (a fleet flushes ~50,000 files a day; ~15 MB at
# most): a listed file is re-checked only when its inode, size or times change.
VERDICTS = 100_000
# What a flush writes: part files, and their temporary names before the rename.
_PART = re.compile(r"part-(\d+)-(\d+)\.parquet")
_TEMPORARY = re.compile(r"\.part-\d+-\d+\.parquet\.[0-9a-f]+\.tmp")


class LakeError(RuntimeError):
    """A listed lake file cannot be read (truncated, tampered with, deleted by hand)."""


@dataclass(frozen=True)
class LakeFile:
    """One Parquet file as the manifest lists it (``path`` relative to the lake root)."""

    path: str
    robot_id: str
    day: str
    rows: int
    min_id: int
    max_id: int


def lake_dir_for(store_path: Path) -> Path:
    """Where a store's lake lives: beside the SQLite file, same stem, ``.lake``.

    Beside the file itself, not beside a symlink to it: a store named through a link
    (``alias.db -> c.db``) looked for ``alias.lake``, read none of its flushed rows and
    called every listed file unreadable.
    """
    return Path(os.path.realpath(store_path)).with_suffix(".lake")


def _schema():
    import pyarrow as pa  # offboard only: the robot never imports the lake

    return pa.schema([
        ("id", pa.int64()), ("robot_id", pa.string()), ("seq", pa.int64()),
        ("episode_id", pa.string()), ("stamp", pa.float64()),
        ("bundle_version", pa.int64()), ("payload", pa.binary()), ("events", pa.string()),
        ("reward", pa.float64()), ("received_at", pa.float64()), ("signal_set", pa.string()),
    ])


def _day(received_at: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(received_at))


def _column_range(meta, name: str) -> tuple | None:
    """(min, max) of a column from the footer's row-group statistics; None if any lacks them."""
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    if name not in names or meta.num_row_groups == 0:
        return None
    index = names.index(name)
    stats = [meta.row_group(g).column(index).statistics for g in range(meta.num_row_groups)]
    if any(s is None or not s.has_min_max for s in stats):
        return None
    return min(s.min for s in stats), max(s.max for s in stats)


def _read_range(path: Path, name: str) -> tuple:
    """(min, max) of a column read from the file: a writer that kept no statistics."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    values = pq.read_table(path, columns=[name]).column(name)
    bounds = pc.min_max(values)
    return bounds["min"].as_py(), bounds["max"].as_py()


class ParquetLake:
    """Writes tail rows as Parquet partitions and answers SQL over listed files with DuckDB."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._db = None
        self._verdicts: OrderedDict[bytes, str | None] = OrderedDict()

    def write(self, rows: Sequence[tuple], written: list[LakeFile],
              owner: str | None = None) -> None:
        """Write rows (``COLUMNS`` order, ascending id) as one file per robot and day.

        Each file is complete before it gets its final name (write, fsync, rename), so a
        listed file is never partial. Files are appended to ``written`` as they land, so a
        caller whose transaction fails can remove exactly those. ``owner`` (the store's id)
        goes into each footer, so a part file copied in from another lake is told apart.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        groups: dict[tuple[str, str], list[tuple]] = defaultdict(list)
        for row in rows:
            groups[(row[1], _day(row[9]))].append(row)
        schema = _schema()
        for (robot_id, day), part in groups.items():
            rel = (f"robot={quote(robot_id, safe='')}/day={day}/"
                   f"part-{part[0][0]}-{part[-1][0]}.parquet")
            target = self.root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            table = pa.Table.from_arrays(
                [pa.array([r[i] for r in part], type=schema.field(i).type)
                 for i in range(len(COLUMNS))], schema=schema)
            if owner is not None:
                table = table.replace_schema_metadata({OWNER_KEY: owner.encode()})
            tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
            try:
                pq.write_table(table, tmp, compression="zstd")
                fsync_dir(tmp)  # the file's data (fsync of any path opened read-only)
                os.replace(tmp, target)
                fsync_dir(target.parent)  # the rename
            finally:
                tmp.unlink(missing_ok=True)
            written.append(LakeFile(rel, robot_id, day, len(part), part[0][0], part[-1][0]))

    def check_owner(self, identity: str, has_listed: bool) -> None:
        """Raise ``LakeError`` unless this folder is the store ``identity``'s (or unclaimed).

        An unclaimed folder (a lake written before the marker existed) is this store's if
        the store lists files, or if it holds no part file; a store that lists nothing
        beside a folder of part files was replaced or emptied, and reading or sweeping
        that folder would take or delete another store's experiences.
        """
        marker = self.root / OWNER_FILE
        if not self.root.exists():
            return
        if marker.is_file():
            owner = marker.read_text(encoding="utf-8", errors="replace").strip()
            if owner != identity:
                raise LakeError(
                    f"the lake folder {self.root} belongs to another store (its {OWNER_FILE} "
                    f"says {owner[:40]!r}, this store is {identity}); give this store "
                    f"another file name, or restore that store's file")
            return
        if not has_listed and any(self._parts()):
            raise LakeError(
                f"the lake folder {self.root} holds Parquet files this store does not list "
                f"(was the store file replaced or emptied?); restore the store file, or "
                f"move the folder away")

    def claim(self, identity: str) -> None:
        """Write the owner marker once (atomically) before this store's first flush.

        A marker already there must be this store's: another store with the same stem may
        have claimed the folder since this one opened it.
        """
        marker = self.root / OWNER_FILE
        if marker.is_file():
            self.check_owner(identity, has_listed=True)
            return
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_name(f"{OWNER_FILE}.{uuid.uuid4().hex}.tmp")
        tmp.write_text(identity + "\n", encoding="utf-8")
        os.replace(tmp, marker)

    def _parts(self):
        """Every part file under ``robot=*/day=*`` (what a flush writes), lazily."""
        for path in self.root.glob("robot=*/day=*/*"):
            if _PART.fullmatch(path.name) and path.is_file():
                yield path

    def remove_unlisted(self, listed: set[str], first_tail_id: int) -> list[str]:
        """Delete a crashed flush's leftovers; return unlisted part files of older rows.

        Leftovers are temporary files and part files whose first id is in the tail
        (``>= first_tail_id``): their rows are still in SQLite and will be written again.
        Any other unlisted part file is left alone. Only safe under the store's write
        lock: a flush in progress holds it while its files are not listed yet.
        """
        left: list[str] = []
        if not self.root.is_dir():
            return left
        for path in self.root.glob("robot=*/day=*/*"):
            rel = str(path.relative_to(self.root))
            part = _PART.fullmatch(path.name)
            if rel in listed or not path.is_file():
                continue
            if _TEMPORARY.fullmatch(path.name) or (part and int(part[1]) >= first_tail_id):
                path.unlink(missing_ok=True)
            elif part:
                left.append(rel)
        return left

    def remove(self, files: Sequence[LakeFile]) -> None:
        """Delete files written by a flush whose transaction did not commit."""
        for f in files:
            (self.root / f.path).unlink(missing_ok=True)

    def query(self, sql: str, files: Sequence[str], params: Sequence = ()) -> list[tuple]:
        """Run ``sql`` with ``{src}`` standing for the listed files; [] when none are listed."""
        if not files:
            return []
        import duckdb

        src = "read_parquet(?)"
        paths = [str(self.root / f) for f in files]
        try:
            return self.db.execute(sql.format(src=src), [paths, *params]).fetchall()
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LakeError(f"{self.root}: cannot read the lake: {first}") from exc

    def damaged(self, files: Sequence[str]) -> dict[str, str]:
        """The listed files that cannot be opened as this lake's Parquet, with the reason.

        Asked only after a query failed, to tell one bad file (truncated, overwritten,
        deleted by hand) from a failure of the whole read.
        """
        import pyarrow.parquet as pq

        bad: dict[str, str] = {}
        for f in files:
            try:
                names = pq.ParquetFile(self.root / f).schema_arrow.names
                if names != list(COLUMNS):
                    raise ValueError(f"columns {names[:4]}... are not a lake file's")
            except Exception as exc:  # noqa: BLE001 - any reason makes the file unreadable
                bad[f] = " ".join(str(exc).split())[:160] or type(exc).__name__
        return bad

    def mismatched(self, listed: Sequence[LakeFile], owner: str | None) -> dict[str, str]:
        """The listed files whose footer contradicts their manifest row, with what differs.

        Only footers are read (about 0.1 ms a file, remembered until the file's inode, size
        or times change, so a swap is always seen): a content hash would read every byte
        of every file a query names, payloads included, where the query reads a few
        columns. A file whose footer cannot be read is not judged here: the query fails
        on it and ``damaged`` names it.
        """
        bad: dict[str, str] = {}
        for f in listed:
            try:
                st = os.stat(self.root / f.path)
            except OSError:
                continue  # missing: ``damaged`` names it
            key = hashlib.blake2b(repr((f, owner, st.st_ino, st.st_size, st.st_mtime_ns,
                                        st.st_ctime_ns)).encode(), digest_size=16).digest()
            if key in self._verdicts:
                self._verdicts.move_to_end(key)
                why = self._verdicts[key]
            else:
                try:
                    why = self._footer_problem(f, owner)
                except Exception:  # noqa: BLE001 - unreadable: left to the query, not kept
                    continue
                self._verdicts[key] = why
                while len(self._verdicts) > VERDICTS:
                    self._verdicts.popitem(last=False)
            if why is not None:
                bad[f.path] = why
        return bad

    def _footer_problem(self, f: LakeFile, owner: str | None) -> str | None:
        """What the footer of ``f`` says against its manifest row (None: they agree).

        Checks what a flush wrote and the manifest recorded: row count, id range, robot,
        and the owning store where the footer names one (files from before ``OWNER_KEY``
        do not, and are judged on the rest, so an existing lake is never refused).
        """
        import pyarrow.parquet as pq

        meta = pq.read_metadata(self.root / f.path)
        if meta.num_rows != f.rows:
            return f"{meta.num_rows} rows, the manifest lists {f.rows}"
        ids = _column_range(meta, "id") or _read_range(self.root / f.path, "id")
        if ids != (f.min_id, f.max_id):
            return f"ids {ids[0]}..{ids[1]}, the manifest lists {f.min_id}..{f.max_id}"
        robots = _column_range(meta, "robot_id")
        if robots is not None:
            robots = tuple(r.decode("utf-8", "replace") if isinstance(r, bytes) else r
                           for r in robots)
        if robots is not None and robots != (f.robot_id, f.robot_id):
            return f"robot {robots[0][:64]!r}, the manifest lists {f.robot_id[:64]!r}"
        writer = (meta.metadata or {}).get(OWNER_KEY)
        if owner is not None and writer is not None and writer != owner.encode():
            return (f"written by store {writer[:40].decode('utf-8', 'replace')!r}, "
                    f"not by this one ({owner})")
        return None

    @property
    def db(self):
        """An in-process DuckDB connection, made on first use (one per store, one thread)."""
        if self._db is None:
            import duckdb

            self._db = duckdb.connect(":memory:", config={"threads": 1})
        return self._db

    def close(self) -> None:
        """Close the DuckDB connection (idempotent)."""
        if self._db is not None:
            self._db.close()
            self._db = None
