"""Counting, lookup and membership over sorted int64 keys.

Why: candidates, code sets and (episode, key) rows are all packed into int64 keys, and a fleet
log has tens of millions of them; these helpers answer per-key questions with sorts and
searches instead of Python dictionaries.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import numpy as np


def _decode(key: int, length: int, v: int) -> tuple[int, ...]:
    out = []
    for _ in range(length):
        out.append(key % v)
        key //= v
    return tuple(reversed(out))


# ------------------------------------------------------------------------------ helpers
def _group_min(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique keys (sorted) and the smallest value of each."""
    order = np.argsort(keys)
    keys, values = keys[order], values[order]
    if keys.size == 0:
        return keys, values
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    return keys[starts], np.minimum.reduceat(values, starts)


def _counts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique sorted keys and their counts (one sort)."""
    if keys.size == 0:
        return keys, np.zeros(0, np.int64)
    keys = np.sort(keys)
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    return keys[starts], np.diff(np.concatenate((starts, [keys.size])))


LOOKUP_BLOCK = 1 << 21
"""Queries looked up at once: a fleet log's ~2x10^7 candidates at once made five
temporaries of their size (0.7 GB), the peak of its whole discovery."""


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray, default=0):
    """values[key] for each query key (keys sorted), ``default`` where absent."""
    query = np.asarray(query)
    values = np.asarray(values)
    if keys.size == 0:
        return np.full(query.shape, default, dtype=values.dtype)
    if query.ndim != 1 or query.size <= LOOKUP_BLOCK:
        pos = _positions(keys, query)
        return np.where(keys[pos] == query, values[pos], default)
    out = np.empty(query.size, np.result_type(values.dtype, np.asarray(default).dtype))
    for lo in range(0, query.size, LOOKUP_BLOCK):
        block = query[lo:lo + LOOKUP_BLOCK]
        pos = _positions(keys, block)
        out[lo:lo + block.size] = np.where(keys[pos] == block, values[pos], default)
    return out


BITMAP_KEYS = 1 << 26  # key ranges up to this are looked up in a bitmap (<= 64 MB)


def _member(sorted_keys: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Elementwise ``query in sorted_keys`` (keys sorted, unique, >= 0).

    Pair keys (< V^2) are looked up in a bitmap: a binary search per query over millions of
    keys misses the cache on every step, and this runs for every slot pair of the log.
    """
    query = np.asarray(query)
    if sorted_keys.size == 0:
        return np.zeros(query.shape, bool)
    top = int(sorted_keys[-1])
    if top < BITMAP_KEYS and query.size * 64 > top:
        bitmap = np.zeros(top + 1, bool)
        bitmap[sorted_keys] = True
        inside = (query >= 0) & (query <= top)
        out = np.zeros(query.shape, bool)
        out[inside] = bitmap[query[inside]]
        return out
    pos = _positions(sorted_keys, query)
    return sorted_keys[pos] == query


def _positions(sorted_keys: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``searchsorted`` clipped to valid indices; large random queries are searched sorted.

    Sorted queries let each search start where the last one ended: 4-5x faster on millions
    of keys, where a random binary search misses the cache at every step.
    """
    if query.ndim == 1 and query.size > 4096 and sorted_keys.size > 65536:
        order = np.argsort(query)
        pos = np.empty(query.size, np.int64)
        pos[order] = np.searchsorted(sorted_keys, query[order])
    else:
        pos = np.searchsorted(sorted_keys, query)
    return np.clip(pos, 0, sorted_keys.size - 1)


def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For groups of ``counts`` items: (group index, offset within group) per item."""
    total = int(counts.sum())
    group = np.repeat(np.arange(counts.size), counts)
    offset = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    return group, offset


def _sorted_set_key(codes: np.ndarray, v: int) -> np.ndarray:
    """Key of the sorted code set of each row of ``codes`` (P, L)."""
    s = np.sort(codes, axis=1)
    key = np.zeros(s.shape[0], np.int64)
    for col in range(s.shape[1]):
        key = key * v + s[:, col]
    return key


def _candidate_codes(keys: np.ndarray, length: int, v: int) -> np.ndarray:
    """(P, L) codes of pattern keys."""
    if not keys.size:
        return np.zeros((0, length), np.int64)
    return np.stack([(keys // v ** (length - 1 - c)) % v for c in range(length)], axis=1)
