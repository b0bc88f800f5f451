"""The passes that build candidates and their tests: whole, or one part of the log at a time.

Why: every statistic is a sum over episodes, so a fleet log is read part by part (pairs,
triples, frames), on this process's threads or as Ray tasks, and gives the same result as
one pass over a small log.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass

import numpy as np

from thinkmem_ros.consolidator.bucket_files import ParkedArray
from thinkmem_ros.consolidator.discovery.arrays import (
    _candidate_codes,
    _counts,
    _expand,
    _lookup,
    _member,
    _sorted_set_key,
)
from thinkmem_ros.consolidator.discovery.candidates import (
    _copresent_pairs,
    _copresent_sets,
    _copresent_triples,
    _neighbours,
    _pair_rows,
    _triple_rows,
    _triple_support_keys,
)
from thinkmem_ros.consolidator.discovery.episodes import _Episodes
from thinkmem_ros.consolidator.discovery.family import (
    _cooccurrence_weights,
    _family_budget,
    _surprising_sets,
)
from thinkmem_ros.consolidator.discovery.model import DiscoveryConfig, EventLog
from thinkmem_ros.consolidator.discovery.significance import (
    _frame_rows,
    _test_candidates,
    _Tested,
)
from thinkmem_ros.consolidator.discovery.spill import _FrameSpill
from thinkmem_ros.consolidator.engine import (
    EmbeddedEngine,
    release_free_memory,
)
from thinkmem_ros.consolidator.key_tally import KeyTally

_Scan = tuple["_Episodes", dict[int, np.ndarray],
              dict[int, tuple["_Tested", np.ndarray, np.ndarray]]]


def _parts(log: EventLog, part_events: int, weights: np.ndarray | None = None
           ) -> list[tuple[int, int]]:
    """Consecutive episode ranges of about ``part_events`` events each (whole episodes).

    ``weights`` (per episode, in events; default each episode's events) counts an episode
    at what it costs the scan (``density.scan_weights``): a part of dense episodes then
    holds fewer of them, so every part holds about as many candidate rows.
    """
    n_ep = len(log.episode_ids)
    if weights is None:
        weights = np.bincount(log.episode, minlength=n_ep)
    ends = np.cumsum(weights)  # weight up to and including each episode
    total = ends[-1] if n_ep else 0
    if part_events <= 0 or total <= part_events:
        return [(0, n_ep)]
    cuts = np.searchsorted(ends, np.arange(part_events, total, part_events))
    bounds = np.unique(np.concatenate(([0], cuts + 1, [n_ep])).clip(0, n_ep))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _scan_whole(log: EventLog, cfg: DiscoveryConfig, parts: list) -> _Scan:
    """Candidates and their tests in one pass over the whole log (small logs)."""
    del parts
    ctx = _Episodes(log, cfg)
    pair_rows = _pair_rows(ctx)
    pair_sets = _copresent_sets(ctx, 2, cfg.accept_support)
    keep = _surprising_sets(ctx, pair_sets[0], pair_sets[1],
                            _family_budget(cfg, log.code.size))
    if keep is not None:
        pair_sets = _within_budget(ctx, keep, *pair_sets)
        inside = _member(pair_sets[0], _candidate_set_keys(pair_rows["uk"], 2, ctx.v))
        pair_rows["uk"], pair_rows["support"] = (pair_rows["uk"][inside],
                                                 pair_rows["support"][inside])
    frequent = pair_rows["uk"][pair_rows["support"] >= cfg.candidate_support]
    left, right = _neighbours(ctx, frequent)
    triple_rows = _triple_rows(ctx, left, right)
    candidates = {2: frequent,
                  3: triple_rows["uk"][triple_rows["support"] >= cfg.candidate_support]}
    by_length = {}
    for length, rows in ({3: triple_rows, 2: pair_rows} if cfg.pairs
                         else {3: triple_rows}).items():
        set_keys, set_counts, set_ep, set_row_key = (
            pair_sets if length == 2 else
            _copresent_sets(ctx, 3, cfg.accept_support, pairs=pair_sets[0]))
        by_length[length] = (_test_candidates(ctx, rows, length, set_ep, set_row_key),
                             set_keys, set_counts)
    return ctx, candidates, by_length


def _within_budget(ctx: _Episodes, keep: np.ndarray, keys: np.ndarray, counts: np.ndarray,
                   *rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """The pair sets ``keep`` selects (and their (episode, key) rows); noted in ``ctx``."""
    ctx.family = {"budget_frames": _family_budget(ctx.cfg, ctx.log.code.size),
                  "sets": int(keys.size), "sets_kept": int(keep.sum()),
                  "frames": int(2 * counts.sum()), "frames_kept": int(2 * counts[keep].sum())}
    kept = keys[keep], counts[keep]
    if not rows:
        return kept
    sel = _member(kept[0], rows[1])
    return (*kept, rows[0][sel], rows[1][sel])


FRAME_BLOCK = 1_000_000  # frames built at once in a partitioned scan (~100 MB)


def _set_index(cand_sets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidates grouped by code set: (sorted set keys, candidate index of each)."""
    by_set = np.argsort(cand_sets, kind="stable")
    return cand_sets[by_set], by_set


def _blocks(set_index: tuple[np.ndarray, np.ndarray], set_key: np.ndarray):
    """The candidates with frames in this part, in blocks of at most ~``FRAME_BLOCK`` frames.

    ``set_index`` is ``_set_index`` of every candidate; ``set_key`` this part's (episode,
    set) rows. A frame is an episode holding the candidate's code set, so the candidates
    here are found from the part's sets (not by visiting every candidate: tens of millions
    on a fleet log); with a small vocabulary every set is in many episodes, and one part's
    frames of all candidates would not fit at once. Yields ascending candidate indices.
    """
    sorted_sets, by_set = set_index
    if sorted_sets.size == 0 or set_key.size == 0:
        return
    uniq, per_set = _counts(set_key)
    lo = np.searchsorted(sorted_sets, uniq, side="left")
    hi = np.searchsorted(sorted_sets, uniq, side="right")
    g, off = _expand(hi - lo)
    cand = by_set[lo[g] + off]
    order = np.argsort(cand, kind="stable")
    cand, ends = cand[order], np.cumsum(per_set[g][order])
    start = 0
    while start < cand.size:
        base = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + FRAME_BLOCK, side="right")))
        yield cand[start:stop]
        start = stop


def _candidate_set_keys(keys: np.ndarray, length: int, v: int) -> np.ndarray:
    """The sorted code-set key of each ordered candidate (decoded a slice at a time)."""
    out = np.empty(keys.size, np.int64)
    step = 1 << 20
    for lo in range(0, keys.size, step):
        out[lo:lo + step] = _sorted_set_key(_candidate_codes(keys[lo:lo + step], length, v), v)
    return out


def _inner_pairs(triples: np.ndarray, sets: np.ndarray, v: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Ordered pairs (a, b), (b, c) of candidate triples; the code pairs of their sets.

    Rebuilding triples from only these pairs gives every candidate the same tightest
    occurrence (its nearest a before b and c after b are among them) and every candidate
    set the same episodes, at a fraction of the cost once most pairs are frequent.
    """
    a, b, c = (triples[:, i] for i in range(3)) if triples.size else (np.zeros(0, np.int64),) * 3
    ordered = np.unique(np.concatenate((a * v + b, b * v + c)))
    x, y, z = sets // (v * v), (sets // v) % v, sets % v
    unordered = np.unique(np.concatenate((x * v + y, y * v + z, x * v + z)))
    return ordered, unordered


@dataclass(frozen=True)
class _WholeScale:
    """What a part takes from the whole log so its per-episode sums match a whole pass."""

    delta: float
    complete: bool
    scales: tuple[float, ...]  # the ladder reaches the whole log's median episode span


def _part(log: EventLog, cfg: DiscoveryConfig, whole: _WholeScale, first: int, last: int
          ) -> _Episodes:
    return _Episodes(log.slice(first, last), cfg, whole=whole)


def _part_pairs(log: EventLog, first: int, last: int, cfg: DiscoveryConfig,
                whole: _WholeScale) -> tuple[np.ndarray, ...]:
    """Pass 1 on one part: slot counts, ordered-pair support, co-present pair counts."""
    part = _part(log, cfg, whole, first, last)
    rows = _pair_rows(part)
    return (part.t2, part.t3, rows["uk"], rows["support"],
            *_counts(_copresent_pairs(part)[1]))


def _part_triples(log: EventLog, first: int, last: int, cfg: DiscoveryConfig,
                  whole: _WholeScale, frequent: np.ndarray, co_frequent: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Pass 2 on one part: triple keys once per episode, co-present triple keys."""
    part = _part(log, cfg, whole, first, last)
    support = _triple_support_keys(part, *_neighbours(part, frequent))
    return support, _copresent_triples(part, co_frequent)[1]


def _part_frames(log: EventLog, first: int, last: int, cfg: DiscoveryConfig,
                 whole: _WholeScale, keys: dict, set_index: dict, set_keys: dict,
                 inner: tuple | None) -> dict[int, tuple[np.ndarray, ...]]:
    """Pass 3 on one part: every frame of every candidate (global candidate and episode)."""
    part = _part(log, cfg, whole, first, last)
    rows = {2: _pair_rows(part)}
    if inner is not None:
        rows[3] = _triple_rows(part, *_neighbours(part, inner[0]))
    out = {}
    for n in keys:
        set_ep, set_key = (_copresent_pairs(part) if n == 2
                           else _copresent_triples(part, inner[1]))
        sel = _member(set_keys[n], set_key)
        set_ep, set_key = set_ep[sel], set_key[sel]
        got = []
        for block in _blocks(set_index[n], set_key):
            cand, f_ep, f_m, k = _frame_rows(part, rows[n], n, keys[n][block],
                                             _candidate_codes(keys[n][block], n, part.v),
                                             set_ep, set_key)
            got.append((block[cand], f_ep + first, f_m, k))
        out[n] = tuple(np.concatenate(col) for col in zip(*got)) if got else \
            (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0),
             np.zeros((0, n), np.int64))
    return out


def _scan_parts(log: EventLog, cfg: DiscoveryConfig, parts: list[tuple[int, int]],
                engine=None) -> _Scan:
    """The same candidates and tests as ``_scan_whole``, one part of the log at a time.

    Every statistic is a sum over episodes, so parts add up: pass 1 counts pairs (and fills
    the per-episode slot counts), pass 2 triples built on the pairs frequent over the whole
    log, pass 3 writes each candidate's frames to disk by candidate bucket
    (``_FrameSpill``), which are then tested a bucket at a time. Memory: one part's rows,
    one bucket's frames, the counted keys above their floors, and the candidates that can
    still be significant; key counts past ``key_tally.MEMORY_ROWS`` go to disk too.
    ``engine`` (``consolidator/engine.py``) runs each pass's parts: on this process's
    threads, or as Ray tasks; the sums and the tests stay here (the key counts and the test
    buckets on this process's threads, in order), so every engine gives the same result.
    """
    engine = engine or EmbeddedEngine()
    threads = getattr(engine, "threads", 1)  # for the work that stays in this process
    ctx = _Episodes(log, cfg, pairs=False)
    whole = _WholeScale(ctx.delta, ctx.complete, tuple(ctx.scales.tolist()))
    lengths = (3, 2) if cfg.pairs else (3,)
    clock = _time.perf_counter
    started = clock()
    pair_support, pair_sets = (KeyTally(span=ctx.v ** 2, threads=threads),
                               KeyTally(span=ctx.v ** 2, threads=threads))
    for (first, last), (t2, t3, *counted) in zip(parts, engine.map(
            _part_pairs, log, parts, cfg, whole)):
        ctx.t2[first:last], ctx.t3[first:last] = t2, t3
        pair_support.add(counted[0], counted[1])
        pair_sets.add(counted[2], counted[3])
    frequent, frequent_counts = pair_support.counted(cfg.candidate_support)
    # what pass 3 needs of the pair tallies, taken now so the tallies (hundreds of MB of
    # keys and counts on a fleet log) are gone before pass 2 builds its own
    # (the pairs pass 3 tests, as a mask over the frequent ones: an int64 copy of ~2 x 10^7
    # keys held through pass 2 was 0.16 GB of a 10^7 log's peak)
    pair_tested = frequent_counts >= cfg.accept_support
    del frequent_counts
    pair_set_keys, pair_set_counts = pair_sets.counted(cfg.accept_support)
    del pair_support, pair_sets
    release_free_memory()
    keep = _surprising_sets(ctx, pair_set_keys, pair_set_counts,
                            _family_budget(cfg, log.code.size))
    if keep is not None:  # triples, frames and tests only on the pairs within the budget
        pair_set_keys, pair_set_counts = _within_budget(ctx, keep, pair_set_keys,
                                                        pair_set_counts)
        inside = _member(pair_set_keys, _candidate_set_keys(frequent, 2, ctx.v))
        frequent, pair_tested = frequent[inside], pair_tested[inside]
        del inside
    del keep
    ctx.pass_s["pairs"], started = clock() - started, clock()
    triple_support, triple_sets = (KeyTally(span=ctx.v ** 3, threads=threads),
                                   KeyTally(span=ctx.v ** 3, threads=threads))
    for support_keys, set_keys_part in engine.map(_part_triples, log, parts, cfg, whole,
                                                  frequent, pair_set_keys):
        triple_support.add(support_keys, np.ones(support_keys.size, np.int64))
        triple_sets.add(set_keys_part, np.ones(set_keys_part.size, np.int64))
        del support_keys, set_keys_part
    candidates = {3: triple_support.at_least(cfg.candidate_support)}
    triple_set_keys, triple_set_counts = triple_sets.counted(cfg.accept_support)
    keys = {3: triple_support.at_least(cfg.accept_support)}
    set_keys = {2: pair_set_keys, 3: triple_set_keys}
    set_counts = {2: pair_set_counts, 3: triple_set_counts}
    del pair_set_keys, pair_set_counts, triple_support, triple_sets
    del triple_set_keys, triple_set_counts
    release_free_memory()
    if 2 in lengths:  # without pairs, pass 3 builds no pair frames
        keys[2] = frequent[pair_tested]  # once the triple tallies are gone
    del pair_tested
    # the frequent pairs are the caller's from here on: on disk through pass 3's peak
    parked, frequent = ParkedArray(frequent), None
    cand_sets, weights, spills = {}, {}, {}
    for n in lengths:
        cand_sets[n] = _candidate_set_keys(keys[n], n, ctx.v)
        weights[n] = _lookup(set_keys[n], _cooccurrence_weights(
            ctx, set_keys[n], set_counts[n], n), cand_sets[n], 1.0)
    # later passes only rebuild what the candidates are made of: the pairs inside them
    inner = _inner_pairs(_candidate_codes(keys[3], 3, ctx.v), set_keys[3], ctx.v) \
        if 3 in lengths else None
    ctx.pass_s["triples"], started = clock() - started, clock()
    try:
        for n in lengths:
            spills[n] = _FrameSpill(ctx, keys[n], n, _lookup(set_keys[n], set_counts[n],
                                                             cand_sets[n], 0), threads)
        set_index = {n: _set_index(cand_sets[n]) for n in lengths}
        del cand_sets
        for frames in engine.map(_part_frames, log, parts, cfg, whole, keys, set_index,
                                 set_keys, inner):
            for n, (cand, f_ep, f_m, k) in frames.items():
                spills[n].add(cand, f_ep, f_m, k)
            del frames
        # the candidates' set index (two arrays per candidate) and the inner pairs served
        # pass 3 only; held through the tests they were ~0.3 GB of a 10^7 log's peak
        del set_index, inner
        release_free_memory()
        ctx.pass_s["frames"], started = clock() - started, clock()
        by_length = {n: (spills[n].tested(keys[n], weights[n], cfg.alpha, threads),
                         set_keys[n], set_counts[n]) for n in lengths}
        release_free_memory()
        ctx.pass_s["tests"] = clock() - started
        ctx.pass_s["frames_spilled"] = sum(spill.files.rows for spill in spills.values())
    finally:
        for spill in spills.values():
            spill.close()
    candidates[2] = parked.load()  # on a failure its file goes with the object
    return ctx, candidates, by_length
