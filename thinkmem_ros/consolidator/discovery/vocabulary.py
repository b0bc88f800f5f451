"""Which codes a fleet's patterns may be built from.

Why: in a log of several robots a pattern's support must spread over robots
(``examine._unstable``: at least ``min_partitions`` of them, none holding more than
``max_partition_share``), so a code that too few robots report can never be in an accepted
pattern; yet every candidate it forms used to be built and counted, and candidate
generation costs up to n·u² rows per episode (n events, u distinct codes). One robot
sending 20 episodes of the same 100 names of its own (16 KB of names) took discovery 65 s
and 5.6 GB; 300 names each were killed for memory on a 24 GB machine. Such codes are now
left out of every candidate before anything is counted.

Their events stay where they are, all under one code no pattern holds (``OTHERS``): each
episode keeps its slots and the copies of every other code, so the within-episode null of
every other pattern is what it was (a pattern's null reads its own codes' copies, the
episode's length and its slots). Only the family shrinks, by hypotheses that could never
be accepted, chosen by who reported each code: the null (codes permuted within each
episode) leaves that unchanged, so the FDR guarantee holds. Merged, they also stop taking
key space: a pattern is packed into an int64 as (a·V + b)·V + c, which holds at most
2,097,151 codes, and a robot can send more names than that over time.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from thinkmem_ros.consolidator.discovery.model import DiscoveryConfig, EventLog

OTHERS = "\n(names too few robots report)"
"""The one code of every excluded name: no event name holds a newline (histories are
newline-joined), so it cannot be a robot's, and it sorts before every name."""

MAX_CODES = 2_097_151
"""The most codes a pattern key holds: (a·V + b)·V + c must stay below 2**63."""


def robots_needed(cfg: DiscoveryConfig) -> int:
    """Robots a pattern's support must come from in a fleet (1: no restriction)."""
    return max(cfg.min_partitions, 2 if cfg.max_partition_share < 1.0 else 1)


def fleet_vocabulary(log: EventLog, cfg: DiscoveryConfig) -> np.ndarray | None:
    """Per code, whether enough robots report it to be in a pattern; None for every code.

    None where the log is not a fleet's (sources unknown, or one robot: the demo, a robot's
    own recordings) or where one robot may carry a pattern by configuration.
    """
    source, need = log.source, robots_needed(cfg)
    if source is None or need < 2 or log.code.size == 0 or np.unique(source).size < 2:
        return None
    radix = int(source.max()) + 1
    reported = np.unique(log.code * radix + source[log.episode]) // radix
    return np.bincount(reported, minlength=log.n_codes) >= need


def fleet_log(log: EventLog, cfg: DiscoveryConfig) -> tuple[EventLog, int]:
    """``log`` with the names too few robots report merged into ``OTHERS``; how many.

    Raises ValueError when more codes remain than a pattern key can hold.
    """
    eligible = fleet_vocabulary(log, cfg)
    excluded = 0 if eligible is None else int(log.n_codes - eligible.sum())
    if excluded:
        kept = np.flatnonzero(eligible)
        remap = np.zeros(log.n_codes, np.int64)  # every excluded name -> OTHERS (0)
        remap[kept] = np.arange(1, kept.size + 1)
        flags = np.ones(kept.size + 1, bool)
        flags[0] = False
        log = replace(log, code=remap[log.code], eligible=flags,
                      codes=(OTHERS, *(log.codes[i] for i in kept)))
    if log.n_codes > MAX_CODES:
        raise ValueError(f"discovery: {log.n_codes} distinct event names, more than the "
                         f"{MAX_CODES} a pattern key holds")
    return log, excluded
