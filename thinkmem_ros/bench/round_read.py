"""What a round decodes as the store grows: the whole store, or what is new plus a reservoir.

Why: a round used to decode every stored experience, so its read (and the retraining,
gate and artefacts that work on what it read) grew with the fleet's whole history. A round
on top of a bundle this store trained reads the rows after that bundle's mark and a
bounded reservoir of older episodes (``consolidator/round_read.py``). This measures both
reads side by side on the same stores: realistic records (32 x 7 windows, masks, ten
labels, events; ``fleet_ingest._experiences``) from 8 robots, 500 per episode, written
through the store's real ingest (SQLite tail, 20,000-row flushes into the Parquet lake).
Each size is the store before a round; ``new`` more rows arrive after the mark; the reads
then run on the same files: the whole store (within an unlimited cap), the new rows with
the reservoir carried from the round at the mark (what the consolidator does), and the new
rows with a reservoir chosen by counting every older row's episode (what it falls back to
when a mark has no reservoir recorded).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

ROBOTS = 8
EVENT_EVERY = 4


def _fill(store, rows: int, start: int, rng: np.random.Generator) -> None:
    """``rows`` more records, spread over the robots, numbered after ``start`` per robot.

    Each record carries its episode's event history up to it, as the node ships them: an
    event every ``EVENT_EVERY`` records (10 Hz records, an event every 0.4 s), so a
    500-record episode ends with 125 names.
    """
    from thinkmem_ros.bench.fleet_ingest import _experiences
    from thinkmem_ros.link.experience import encode_experience

    per_robot = rows // ROBOTS
    names = [f"E{k:03d}" for k in range(48)]
    for r in range(ROBOTS):
        records = _experiences(f"robot{r}", start + per_robot, "t", rng)[start:]
        history: dict[str, list[str]] = {}
        for i, e in enumerate(records):
            got = history.setdefault(e.episode_id, [])
            if (start + i) % EVENT_EVERY == 0:
                got.append(names[(start + i) // EVENT_EVERY % len(names)])
            e.events = list(got)
        for lo in range(0, len(records), 2000):
            batch = [e.with_seq(start + lo + i) for i, e in enumerate(records[lo:lo + 2000])]
            store.insert_many([(e, encode_experience(e)) for e in batch])


def read_scaling(sizes: tuple[int, ...], new: int, reservoir: int, progress=None) -> dict:
    """Seconds and experiences decoded by both reads, per store size."""
    from thinkmem_ros.consolidator.round_read import read_round
    from thinkmem_ros.consolidator.store import ExperienceStore

    rows = []
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="round-read-") as tmp:
            rng = np.random.default_rng(size)
            with ExperienceStore(Path(tmp) / "c.db") as store:
                _fill(store, size, 0, rng)
                mark = store.last_id()
                # the round at the mark, on top of a marked bundle: what it carries on
                carried = read_round(store, cap=0, seed=0, since_id=mark,
                                     reservoir=reservoir).next_reservoir
                store.fold_histories()  # that round's discovery carried the histories
                _fill(store, new, size // ROBOTS, rng)
                t = time.perf_counter()
                whole = read_round(store, cap=0, seed=0)
                whole_s = time.perf_counter() - t
                decoded_whole = len(whole.experiences)
                del whole
                t = time.perf_counter()
                counted = read_round(store, cap=0, seed=0, since_id=mark, reservoir=reservoir)
                counted_s = time.perf_counter() - t
                del counted
                t = time.perf_counter()
                incremental = read_round(store, cap=0, seed=0, since_id=mark,
                                         reservoir=reservoir, carried=carried)
                incremental_s = time.perf_counter() - t
                histories = _histories(store, mark)
            rows.append({"stored_before": size, "new": incremental.new,
                         "reservoir": incremental.reservoir,
                         "whole_s": round(whole_s, 2), "whole_decoded": decoded_whole,
                         "incremental_s": round(incremental_s, 2),
                         "incremental_decoded": len(incremental.experiences),
                         "incremental_counted_s": round(counted_s, 2), **histories})
            del incremental
        if progress is not None:
            progress()
    return {"rows": rows, "robots": ROBOTS, "new": new, "reservoir": reservoir,
            "growth_whole": _ratio(rows, "whole_s"),
            "growth_incremental": _ratio(rows, "incremental_s"),
            "growth_incremental_counted": _ratio(rows, "incremental_counted_s"),
            "growth_histories_scan": _ratio(rows, "histories_scan_s"),
            "growth_histories_fold": _ratio(rows, "histories_fold_s")}


def _histories(store, mark: int) -> dict:
    """Discovery's input, both ways: every row's history scanned, or the carried fold.

    The store's carried histories stand at ``mark`` (the round there folded them); the
    scan is what every round did before they were carried. ``event_log_s`` builds the
    round's log from the carried histories (it grows with the episodes, not the rows).
    """
    from thinkmem_ros.consolidator.discovery_log import log_from_rows

    t = time.perf_counter()
    scanned = store.latest_histories()
    scan_s = time.perf_counter() - t
    t = time.perf_counter()
    folded = store.fold_histories()
    fold_s = time.perf_counter() - t
    t = time.perf_counter()
    log, _ = log_from_rows(store.histories(), 4)  # folded just above
    log_s = time.perf_counter() - t
    if folded.after_id != mark or len(scanned) != len(log.episode_ids):
        raise RuntimeError(f"histories out of step: fold after {folded.after_id}, mark "
                           f"{mark}; {len(scanned)} scanned, {len(log.episode_ids)} in log")
    return {"histories_scan_s": round(scan_s, 3), "histories_fold_s": round(fold_s, 3),
            "histories_folded_episodes": folded.episodes, "episodes": len(scanned),
            "events": int(log.code.size), "event_log_s": round(log_s, 3)}


def _ratio(rows: list[dict], key: str) -> float | None:
    """Time at the largest store over time at the smallest.

    The stores grow by ``stored_before`` of the last row over the first's.
    """
    if len(rows) < 2 or rows[0][key] <= 0:
        return None
    return round(rows[-1][key] / rows[0][key], 2)
