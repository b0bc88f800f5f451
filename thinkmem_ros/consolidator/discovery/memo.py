"""What the per-pattern checks worked out per episode, kept from one round to the next.

Why: step 3 visits every episode that holds a significant pattern's codes, in Python, and
both grow with the store: over ``bench rounds``' five rounds the checks went from under a
second to most of a round's discovery time. What a check reads of one episode (where the
pattern's codes sit, which orders and scales they fit, how many slots would complete it)
depends only on that episode's own events, the pattern, its scale g and the
configuration; the round's figures combine those terms with what does change (base rates,
which episodes support the pattern). A consolidator that keeps one ``CheckMemo`` works out
again only the episodes that are new or changed since the round before, and every relation
comes out exactly as without it (held equal by the tests).

Episodes are keyed by a digest of their content (code names and times), so a renumbered
vocabulary, an episode that grew, or a history read in another order cannot be served stale
terms. The memo keeps what the last few rounds asked for, at most ``max_entries`` terms:
its memory follows what the rounds' checks touch, not the store.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

MAX_ENTRIES = 500_000
"""Terms kept at most between rounds (~0.4 KB each, measured below)."""

KEEP_ROUNDS = 3
"""Rounds a term stays without being asked for."""


class CheckMemo:
    """Per-episode check terms keyed by (episode content, pattern code names, scale).

    Terms a round did not ask for stay ``keep_rounds`` rounds (a pattern that drops out of
    the significant set for a round, or moves to another scale and back, is common while
    the data grows); past ``max_entries`` the oldest go first.
    """

    def __init__(self, max_entries: int = MAX_ENTRIES, keep_rounds: int = KEEP_ROUNDS) -> None:
        self.max_entries, self.keep_rounds = max_entries, keep_rounds
        self._terms: dict[tuple, tuple[int, Any]] = {}  # key -> (round last used, terms)
        self._signature: tuple | None = None
        self._round = 0
        self.hits = self.misses = 0

    def begin(self, signature: tuple) -> None:
        """Start a round; a new configuration or scale ladder drops every term."""
        if signature != self._signature:
            self._terms = {}
            self._signature = signature
        self._round += 1
        self.hits = self.misses = 0

    def end(self) -> None:
        """Drop the terms no round asked for in ``keep_rounds``; keep at most ``max_entries``."""
        oldest = self._round - self.keep_rounds + 1
        kept = [(key, got) for key, got in self._terms.items() if got[0] >= oldest]
        if len(kept) > self.max_entries:
            kept.sort(key=lambda item: -item[1][0])  # stable: the latest rounds first
            kept = kept[:self.max_entries]
        self._terms = dict(kept)

    def get(self, key: tuple, compute: Callable[[], Any]) -> Any:
        """The terms under ``key``, worked out by ``compute`` when not held."""
        got = self._terms.get(key)
        if got is None:
            self.misses += 1
            value = compute()
        else:
            self.hits += 1
            value = got[1]
        self._terms[key] = (self._round, value)
        return value

    def stats(self) -> dict[str, int]:
        """Hits and misses of the round, terms held: what a round's notes show."""
        return {"hits": self.hits, "misses": self.misses, "held": len(self._terms)}


class EpisodeDigests:
    """Content digest of each episode of one log, worked out once per episode asked for."""

    def __init__(self, time: np.ndarray, code: np.ndarray, start: np.ndarray,
                 names: list[str]) -> None:
        self._time, self._code, self._start = time, code, start
        self._names = [n.encode() for n in names]
        self._done: dict[int, bytes] = {}

    def __call__(self, e: int) -> bytes:
        got = self._done.get(e)
        if got is None:
            lo, hi = int(self._start[e]), int(self._start[e + 1])
            h = hashlib.blake2b(digest_size=16)
            h.update(np.ascontiguousarray(self._time[lo:hi], np.float64).tobytes())
            h.update(b"\0".join(self._names[c] for c in self._code[lo:hi].tolist()))
            got = self._done[e] = h.digest()
        return got


def signature(cfg, scales: np.ndarray) -> tuple:
    """What every term depends on beyond its episode, pattern and scale."""
    return (cfg.min_gap, cfg.max_gap, cfg.max_lookback, tuple(scales.tolist()))
