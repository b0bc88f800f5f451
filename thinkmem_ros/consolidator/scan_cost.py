"""What one episode costs discovery's scan, in honest events.

Why a module of its own: the scan cuts its parts by this cost
(``discovery.density.scan_weights``) and the store charges it against a round's discovery
horizon (``histories``), so both must count alike; and the store, which every receiver
process opens, must not import discovery (numba kernels, seconds to load) to do it.

An event costs about w² candidate rows for the w distinct codes around it (bounded by the
episode's distinct codes, its length and ``MAX_LOOKBACK``); an event among at most
``HONEST_WIDTH`` of them (every honest episode measured) counts as one. An episode of more
than ``MAX_EPISODE_CODES`` distinct codes is left out of the scan, so it costs only its
events (reading it).
"""

from __future__ import annotations

import math

HONEST_WIDTH = 20
"""Distinct codes around an event at which it costs one event's worth of the scan."""
MAX_LOOKBACK = 256  # ``DiscoveryConfig.max_lookback``'s default
MAX_EPISODE_CODES = 64  # ``DiscoveryConfig.max_episode_codes``'s default
MAX_HISTORY_EVENTS = 1024  # ``link.experience.LIMITS['max_events']``: one history at most


def episode_cost(events: int, distinct: int, lookback: int = MAX_LOOKBACK) -> float:
    """The scan cost of an episode of ``events`` events over ``distinct`` codes."""
    width = min(distinct, events, lookback)
    return events * max(1.0, (width / HONEST_WIDTH) ** 2)


def history_cost(history: str) -> int:
    """The scan cost of a history (names joined by newlines), rounded up, for the horizon.

    With the defaults of discovery's configuration: an episode it leaves out as too dense
    costs its events.
    """
    names = history.split("\n") if history else []
    distinct = len(set(names))
    if distinct > MAX_EPISODE_CODES:
        return len(names)
    return math.ceil(episode_cost(len(names), distinct))


MAX_HISTORY_COST = math.ceil(episode_cost(MAX_HISTORY_EVENTS, MAX_EPISODE_CODES))
"""The most one history can cost (1,024 events over 64 names): a horizon must hold it."""
