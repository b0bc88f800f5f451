"""Discovery's input built from the store: one event history per episode, as columns.

Why columns: a fleet's history is millions of events, and building the log from one Python
tuple per event cost ~100 bytes and a few microseconds per event before discovery started;
here each episode's history stays one string until pyarrow splits and encodes all of them
at once. Times are positions in the history (the node ships names, not their stamps), so
the log's median gap is 1 and its scales do not move from round to round.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thinkmem_ros.consolidator.direct import episode_key
from thinkmem_ros.consolidator.discovery import EventLog
from thinkmem_ros.consolidator.histories import newest_within
from thinkmem_ros.consolidator.store import ExperienceStore, StoreError

log = logging.getLogger(__name__)
# discovery's horizon: a round reads each robot's newest episode histories up to this many
# events in all (whole episodes, shared fairly between robots). At 10^7 events discovery
# took 2-4 minutes and 1.6 GB on a 2-core machine (``docs/scale.md``), so by default a
# round stays within that as the store grows.
DEFAULT_DISCOVERY_EVENTS = 10_000_000


def event_log(store: ExperienceStore, partitions: int) -> tuple[EventLog, dict[int, tuple]]:
    """Episodes' event histories as a discovery ``EventLog``, and each id's (robot, episode).

    Reads the histories the store carries (``histories.py``), after folding in the rows new
    since the last round (``carried_histories``).
    """
    return log_from_rows(carried_histories(store)[0], partitions)


def carried_histories(store: ExperienceStore, max_events: int = 0
                      ) -> tuple[list[tuple], dict]:
    """Episodes' (robot, episode, first stamp, history) in discovery's horizon, and the fold.

    ``max_events`` > 0 is discovery's horizon (``histories.carried``): each robot's newest
    whole episodes, what they cost the scan (``scan_cost``) shared fairly between robots.
    A histories table that cannot be read or written (locked past the busy timeout,
    damaged, dropped) is logged as a WARNING and costs one scan of every row's history,
    never the round: the rows themselves hold the same answer.
    """
    try:
        folded = store.fold_histories()
        rows, horizon = store.histories_within(max_events)
        report = {"after_id": folded.after_id, "through_id": folded.through_id,
                  "episodes": folded.episodes}
    except StoreError as exc:
        log.warning("%s: this round scans every row's history", exc)
        through = store.last_id()
        scanned = [(r[0], r[1], r[2], r[5]) for r in store.latest_histories(0, through)]
        rows, horizon = newest_within(scanned, max_events, through)
        report = {"error": str(exc)}
    if max_events > 0:
        report["horizon"] = {"max_events": max_events, "episodes": horizon.episodes,
                             "events": horizon.events, "scan_cost": horizon.cost,
                             "robots": horizon.robots, "left_out_episodes": horizon.left_out}
    return rows, report


def log_from_rows(rows: Sequence[tuple], partitions: int
                  ) -> tuple[EventLog, dict[int, tuple]]:
    """The log of (robot, episode, first stamp, history) rows, and each id's (robot, episode).

    Episode ids are stable hashes of (robot, episode), so knowledge units keep meaningful
    supporting-experience ids across rounds; episodes are ordered by first stamp and split
    into ``partitions`` temporal partitions of equal count; each episode's robot is its
    source (stability: a recent pattern may replicate across robots instead of periods).
    """
    rows = sorted(rows, key=lambda r: (r[2], r[0], r[1]))
    keys = [episode_key(r[0], r[1]) for r in rows]
    names = {key: (r[0], r[1]) for key, r in zip(keys, rows)}
    robots = {robot: i for i, robot in enumerate(sorted({r[0] for r in rows}))}
    source = np.asarray([robots[r[0]] for r in rows], np.int64)
    return log_from_histories([r[3] for r in rows], np.asarray(keys, np.int64),
                              partitions, source), names


def log_from_histories(texts: Sequence[str], episode_ids: np.ndarray, partitions: int,
                       source: np.ndarray | None = None) -> EventLog:
    """An ``EventLog`` of histories joined by newlines ('' = no events), time = position.

    The vocabulary is every name that occurs, sorted, as ``EventLog.from_episodes`` has it.
    """
    n = len(texts)
    split = pc.split_pattern(pa.array([t or None for t in texts], pa.string()), "\n")
    lengths = pc.fill_null(pc.list_value_length(split), 0).to_numpy().astype(np.int64)
    encoded = pc.dictionary_encode(pc.list_flatten(split))
    found = encoded.dictionary.to_pylist()  # names in order of first appearance
    codes = tuple(sorted(found))
    index = {name: i for i, name in enumerate(codes)}
    rank = np.asarray([index[name] for name in found], np.int64)
    code = rank[encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)]
    episode = np.repeat(np.arange(n, dtype=np.int64), lengths)
    starts = np.cumsum(lengths) - lengths
    time = (np.arange(episode.size, dtype=np.int64) - np.repeat(starts, lengths)
            ).astype(np.float64)
    partition = np.arange(n, dtype=np.int64) * partitions // max(n, 1)
    return EventLog(episode=episode, time=time, code=code, partition=partition,
                    episode_ids=np.asarray(episode_ids, np.int64), codes=codes,
                    source=source)
