"""Exact counts of integer keys summed over the parts of a scan, in bounded memory.

Discovery counts every ordered code pair and triple it sees, part by part, and keeps only
those seen in enough episodes. On a fleet-sized log almost every key is seen once (10^7
events over 5,000 codes produce ~10^8 distinct triples, a few thousand of them seen three
times), so holding all distinct keys in memory until the end is what breaks first. Past
``memory_rows`` pending keys a ``KeyTally`` moves to disk: each part's keys are appended
to one of ``buckets`` files chosen by a hash of the key, so every copy of a key lands in
the same file; ``finish`` then counts one file at a time and keeps the keys that reached
the floor. The result is exact; memory is about one bucket plus what is kept.
"""

from __future__ import annotations

import numpy as np

from thinkmem_ros.consolidator.bucket_files import BucketFiles
from thinkmem_ros.consolidator.engine import ordered_map

MEMORY_ROWS = 1 << 22  # ~64 MB of keys and counts before a tally spills to disk
BUCKETS = 256
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads clustered keys evenly
_RECORD = np.dtype([("key", np.int64), ("count", np.int32)])


def sum_by_key(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct keys and the sum of their counts."""
    if keys.size == 0:
        return keys.astype(np.int64), counts.astype(np.int64)
    order = np.argsort(keys)
    keys, counts = keys[order], counts[order]
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    return keys[starts], np.add.reduceat(counts.astype(np.int64), starts)


class KeyTally:
    """Counts per key (int64 >= 0) summed over ``add`` calls; see the module docstring."""

    def __init__(self, memory_rows: int | None = None, buckets: int = BUCKETS,
                 directory: str | None = None, span: int | None = None, threads: int = 1
                 ) -> None:
        """Spill past ``memory_rows`` keys into ``buckets`` files under ``directory``.

        ``span``: keys lie in [0, span) when given; buckets are then ranges of keys, so
        the kept keys come out sorted without a final sort (half the peak on ~10^7 kept
        keys), at the price of uneven buckets when keys cluster. Without it, a hash.
        ``threads``: spilled buckets counted at once by ``finish``; each thread gets
        ``buckets`` of its own (the buckets are that many times smaller: the thread count
        rounded up to a power of two), so several threads hold no more at once than one.
        """
        self._threads = max(1, threads)
        buckets <<= (self._threads - 1).bit_length()
        memory_rows = MEMORY_ROWS if memory_rows is None else memory_rows
        self._width = None if span is None else -(-int(span) // buckets)
        if memory_rows < 1 or buckets < 1 or buckets & (buckets - 1):
            raise ValueError(f"need memory_rows >= 1 and buckets a power of two, got "
                             f"{memory_rows}, {buckets}")
        self._memory_rows, self._buckets, self._parent = memory_rows, buckets, directory
        self._keys, self._counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0
        self._spill: BucketFiles | None = None
        self._floor: int | None = None  # set by finish: only keys counted this often kept
        self._spilled_once = False

    @property
    def spilled(self) -> bool:
        """Whether the keys went to disk at some point (the tally outgrew ``memory_rows``)."""
        return self._spilled_once

    def add(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Add one part's keys and counts (keys need not be distinct or sorted)."""
        if self._floor is not None:
            raise RuntimeError("KeyTally.add after finish")
        keys = np.asarray(keys, np.int64)
        counts = np.asarray(counts, np.int64)
        if self._spill is not None:
            self._write(keys, counts)
            return
        self._pending.append((keys, counts))
        self._pending_size += keys.size
        if self._pending_size > max(self._keys.size, 1 << 20):
            self._merge()
        if self._keys.size + self._pending_size > self._memory_rows:
            self._start_spill()

    def _merge(self) -> None:
        if not self._pending:
            return
        keys = np.concatenate([self._keys, *(k for k, _ in self._pending)])
        counts = np.concatenate([self._counts, *(c for _, c in self._pending)])
        self._pending, self._pending_size = [], 0
        self._keys, self._counts = sum_by_key(keys, counts)

    def _start_spill(self) -> None:
        self._merge()
        self._spill = BucketFiles(self._buckets, _RECORD, self._parent)
        self._spilled_once = True
        keys, counts = self._keys, self._counts
        self._keys, self._counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self._write(keys, counts)

    def _bucket_of(self, keys: np.ndarray) -> np.ndarray:
        if self._width is not None:
            if keys.size and (keys.min() < 0 or keys.max() >= self._width * self._buckets):
                raise ValueError("KeyTally: a key outside [0, span)")
            return keys // self._width
        bits = np.uint64(64 - (self._buckets.bit_length() - 1))
        if self._buckets == 1:
            return np.zeros(keys.size, np.int64)
        return ((keys.astype(np.uint64) * _MIX) >> bits).astype(np.int64)

    def _write(self, keys: np.ndarray, counts: np.ndarray) -> None:
        self._spill.append(self._bucket_of(keys), key=keys, count=counts)

    def finish(self, floor: int) -> None:
        """Keep only keys counted at least ``floor`` times (then frees the disk)."""
        if self._floor is not None:
            if floor < self._floor:
                raise RuntimeError(f"tally already finished at floor {self._floor}")
            return
        if self._spill is None:
            self._merge()
            keep = self._counts >= floor
            self._keys, self._counts = self._keys[keep], self._counts[keep]
        else:
            kept_keys, kept_counts = [], []
            try:
                for keys, counts in ordered_map(lambda b: self._kept_in(b, floor),
                                                range(self._buckets), self._threads):
                    kept_keys.append(keys)
                    kept_counts.append(counts)
                    del keys, counts
            finally:
                self.close()
            keys = np.concatenate(kept_keys) if kept_keys else np.zeros(0, np.int64)
            del kept_keys
            counts = np.concatenate(kept_counts) if kept_counts else np.zeros(0, np.int32)
            del kept_counts
            if self._width is None:
                order = np.argsort(keys)
                keys, counts = keys[order], counts[order]
            self._keys, self._counts = keys, counts
        self._floor = floor

    def _kept_in(self, bucket: int, floor: int) -> tuple[np.ndarray, np.ndarray]:
        """One spilled bucket's keys counted at least ``floor`` times (file then deleted)."""
        records = self._spill.read(bucket)
        self._spill.drop(bucket)
        keys, counts = sum_by_key(records["key"], records["count"])
        del records
        keep = counts >= floor
        return keys[keep], counts[keep].astype(np.int32)

    def at_least(self, minimum: int) -> np.ndarray:
        """Keys counted ``minimum`` times or more (sorted)."""
        keys, _ = self.counted(minimum)
        return keys

    def counted(self, minimum: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys counted ``minimum`` times or more (sorted), with their counts."""
        if self._floor is None:
            self.finish(minimum)
        elif minimum < self._floor:
            raise RuntimeError(f"tally finished at floor {self._floor}; asked for {minimum}")
        if minimum <= self._floor:  # everything kept: the arrays themselves, no copy (the
            # keys of a fleet log's triples seen twice are its largest array), read-only
            self._keys.flags.writeable = self._counts.flags.writeable = False
            return self._keys, self._counts
        keep = self._counts >= minimum
        return self._keys[keep], self._counts[keep]

    def close(self) -> None:
        """Remove any spilled files (also done by ``finish``)."""
        if self._spill is not None:
            self._spill.close()
            self._spill = None

    def __del__(self) -> None:
        if getattr(self, "_spill", None) is not None:  # not when __init__ refused its arguments
            self.close()
