"""Episodes too dense to scan, and what an episode costs the scan.

Why: candidate generation builds, for every event of an episode, the triples it can be the
middle of: about n·w² rows for n events and w distinct codes within ``max_lookback`` of
each one, plus C(u, 3) co-present code triples for u distinct codes. An honest episode has
tens of events and codes (the rounds' missions: at most 18 events, 16 codes; exp6's worlds
~20-30; the fleet stream 20), so a few thousand rows. One robot sending episodes of 1,024
events drawn from names other robots report too made every pair frequent and nothing
pruned them: beside 400 honest episodes (0.2 s, 0.08 GB), 2 such episodes took discovery
9.7 s and 2.7 GB, 20 of 256 events 91 s and 9.2 GB, 20 of 1,024 ran a 24 GB machine out
of memory. So:

* an episode with more than ``max_episode_codes`` distinct codes a pattern may use is left
  out of discovery (counted in the result's notes): that bounds both terms per episode
  (w ≤ u, and C(u, 3)), so no episode costs more than n·u² + C(u, 3) rows;
* the scan's parts are cut by what their episodes cost (``scan_weights``), not by their
  events alone, so a part of dense-but-allowed episodes holds about as many rows as a part
  of honest ones, and memory stays bounded whatever robots send.

Leaving an episode out by how many distinct codes it holds is a choice made on its
multiset, which the within-episode null holds fixed: every other episode's null and the
FDR guarantee over what is tested are unchanged. What it costs: patterns whose evidence
lies only in such episodes are not found; a robot whose honest episodes hold that many
distinct event names raises ``max_episode_codes`` (cost grows with its square).
"""

from __future__ import annotations

import numpy as np

from thinkmem_ros.consolidator.discovery.model import DiscoveryConfig, EventLog
from thinkmem_ros.consolidator.scan_cost import HONEST_WIDTH


def distinct_codes(log: EventLog) -> np.ndarray:
    """(E,) distinct codes per episode that a pattern may be built from."""
    n_ep = len(log.episode_ids)
    if log.code.size == 0:
        return np.zeros(n_ep, np.int64)
    code = log.code
    keep = np.ones(code.size, bool) if log.eligible is None else log.eligible[code]
    present = np.unique(log.episode[keep] * max(log.n_codes, 1) + code[keep])
    return np.bincount(present // max(log.n_codes, 1), minlength=n_ep)


def without_dense(log: EventLog, cfg: DiscoveryConfig
                  ) -> tuple[EventLog, int, np.ndarray]:
    """``log`` without its episodes of more than ``max_episode_codes`` codes.

    Also returns how many were left out and the kept episodes' distinct codes (what
    ``scan_weights`` reads next, so they are counted once).
    """
    counts = distinct_codes(log)
    if cfg.max_episode_codes <= 0 or not (counts > cfg.max_episode_codes).any():
        return log, 0, counts
    kept = np.flatnonzero(counts <= cfg.max_episode_codes)
    return log.select(kept), int(counts.size - kept.size), counts[kept]


def scan_weights(log: EventLog, cfg: DiscoveryConfig, distinct: np.ndarray | None = None
                 ) -> np.ndarray:
    """(E,) what each episode costs the scan, in honest events (``scan_cost``).

    An event costs about w² triple rows for the w distinct codes within ``max_lookback``
    of it; w is bounded by the episode's distinct codes and its length, and an honest
    event (w ≤ ``HONEST_WIDTH``) counts as one.
    """
    n = np.bincount(log.episode, minlength=len(log.episode_ids)).astype(np.float64)
    distinct = distinct_codes(log) if distinct is None else distinct
    width = np.minimum(np.minimum(distinct, n), cfg.max_lookback)
    return n * np.maximum(1.0, (width / HONEST_WIDTH) ** 2)
