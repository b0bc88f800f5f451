"""``thinkmem knowledge list``: show the knowledge units a consolidator database holds."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from thinkmem_ros.commands import one_line
from thinkmem_ros.core.input_files import input_file

HELP = "list knowledge units the consolidator has discovered"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``list --db PATH [--status S] [--json]``."""
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    listing = sub.add_parser("list", help="list knowledge units, highest confidence first")
    listing.add_argument("--db", required=True, help="consolidator SQLite database")
    listing.add_argument("--status", default=None,
                         choices=["candidate", "promoted", "demoted", "retired"],
                         help="only units with this status")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _row(unit) -> dict:
    return {"pattern": list(unit.pattern), "relation": unit.relation,
            "thinking": unit.thinking, "confidence": round(unit.confidence, 4),
            "status": unit.status, "constraints": unit.constraints,
            "supporting_experiences": list(unit.experiences), "rounds": unit.rounds,
            "statement": unit.statement}


def _print_json(units, db) -> int:
    """Print the units as JSON, or refuse in one line what strict JSON cannot carry.

    Why ``allow_nan=False``: json.dumps writes NaN and Infinity, which JSON parsers reject,
    and the listing would then be unreadable while the exit status said it succeeded.
    """
    try:
        text = json.dumps([_row(u) for u in units], indent=2, allow_nan=False)
    except ValueError as exc:
        return _refuse(f"{db}: a unit cannot be written as JSON: {exc}")
    print(text)
    return 0


def _refuse(text) -> int:
    """Print the refusal on one line (a path may hold a newline) and return exit code 2."""
    print(f"thinkmem knowledge: error: {one_line(text)}", file=sys.stderr)
    return 2


def main(args: argparse.Namespace) -> int:
    """Print the units; exit 2 when the database is missing or cannot be read as one."""
    from thinkmem_ros.consolidator.knowledge import KnowledgeStore, KnowledgeStoreError
    from thinkmem_ros.consolidator.store import StoreError, holds_store

    if not Path(args.db).exists():  # sqlite would silently create an empty file
        return _refuse(f"no database at {args.db}")
    if Path(args.db).is_dir():  # read-only SQLite calls this a "disk I/O error"
        return _refuse(f"{args.db} is a folder, not a database")
    try:  # SQLite's open of a FIFO waits for a writer forever
        input_file(args.db, "--db")
    except ValueError as exc:
        return _refuse(exc)
    try:  # an empty file is a valid SQLite database, and listed "no knowledge units"
        if not holds_store(args.db):
            return _refuse(f"{args.db} holds no consolidator store (an empty database)")
    except StoreError as exc:
        return _refuse(exc)
    try:  # a folder, a file that is not SQLite, a newer schema
        with KnowledgeStore(args.db, read_only=True) as store:  # looking writes nothing
            units = store.load(status=args.status)
    except KnowledgeStoreError as exc:
        return _refuse(exc)
    if args.json:
        return _print_json(units, args.db)
    if not units:
        print("no knowledge units")
        return 0
    print(f"{'pattern':<28} {'thinking':<16} {'conf':>5} {'status':<10} {'support':>7}")
    for u in units:
        print(f"{' ... '.join(u.pattern):<28} {u.thinking:<16} {u.confidence:5.2f} "
              f"{u.status:<10} {len(u.experiences):>7}")
    return 0
