"""Which codes a fleet's patterns may be built from.

Why: in a log of several robots a pattern's support must spread over robots
(``examine._unstable``: at least ``min_partitions`` of them, none holding more than
``max_partition_share``), so a code that too few robots report can never be in an accepted
pattern; yet every candidate it forms used to be built and counted, and candidate
generation costs up to n·u² rows per episode (n events, u distinct codes). One robot
sending 20 episodes of the same 100 names of its own (16 KB of names) took discovery 65 s
and 5.6 GB; 300 names each were killed for memory on a 24 GB machine. Such codes are now
left out of every candidate before anything is counted.

Their events stay where they are: each episode keeps its slots and its multiset of codes,
so the within-episode null of every other pattern is what it was. Only the family shrinks,
by hypotheses that could never be accepted, chosen by who reported each code: the null
(codes permuted within each episode) leaves that unchanged, so the FDR guarantee holds.
"""

from __future__ import annotations

import numpy as np

from thinkmem_ros.consolidator.discovery.model import DiscoveryConfig, EventLog


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
