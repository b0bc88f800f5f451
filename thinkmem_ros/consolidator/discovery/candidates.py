"""Candidate rows: ordered pairs and triples within the gap bounds, and co-present sets.

Why apart: this is step 1 (what may be tested at all), the only step whose cost grows with
the square of an episode's distinct codes, so it is where the budget and the inner-pair
rebuilds of a scan in parts apply.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import numpy as np

from thinkmem_ros.consolidator.discovery.arrays import _counts, _expand, _group_min, _member
from thinkmem_ros.consolidator.discovery.episodes import _Episodes


# --------------------------------------------------------------------------- candidates
def _pair_rows(ctx: _Episodes) -> dict:
    """Per (episode, ordered code pair): the tightest gap, plus each code pair's support."""
    log, v = ctx.log, ctx.v
    ci, cj = log.code[ctx.pi], log.code[ctx.pj]
    keep = ci != cj
    key = ci[keep] * v + cj[keep]
    gap = ctx.pgap[keep]
    ep = log.episode[ctx.pi[keep]]
    # one row per (episode, key) with its tightest gap: one sort of a combined key
    combined = ep * (v * v) + key
    order = np.argsort(combined)
    combined, gap = combined[order], gap[order]
    starts = np.flatnonzero(np.concatenate(([True], combined[1:] != combined[:-1]))) \
        if combined.size else np.zeros(0, np.int64)
    uniq = combined[starts]
    rows = {"ep": uniq // (v * v), "key": uniq % (v * v),
            "m": np.minimum.reduceat(gap, starts) if gap.size else gap}
    rows["uk"], rows["support"] = _counts(rows["key"])
    return rows


def _neighbours(ctx: _Episodes, frequent: np.ndarray) -> tuple[dict, dict]:
    """Nearest a before and nearest c after each slot j, per code, with (a, b) frequent."""
    log, v = ctx.log, ctx.v
    ci, cj = log.code[ctx.pi], log.code[ctx.pj]
    keep = (ci != cj) & _member(frequent, ci * v + cj)
    pi, pj, gap = ctx.pi[keep], ctx.pj[keep], ctx.pgap[keep]
    # left: for slot j and code a, the latest i (smallest gap)
    lk, lgap = _group_min(pj * v + log.code[pi], gap)
    # right: for slot i and code c, the earliest j
    rk, rgap = _group_min(pi * v + log.code[pj], gap)
    return ({"slot": lk // v, "code": lk % v, "gap": lgap},
            {"slot": rk // v, "code": rk % v, "gap": rgap})


def _triple_slots(ctx: _Episodes, left: dict, right: dict, with_gaps: bool
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (nearest a, middle slot j, nearest c) combination of distinct codes.

    Returns (episode, triple key, largest step gap) per combination, in ascending episode
    order (the gaps are empty unless ``with_gaps``).
    """
    log, v = ctx.log, ctx.v
    # group left by middle slot j; right (entries with slot == j) by j
    lo = np.argsort(left["slot"], kind="stable")
    ro = np.argsort(right["slot"], kind="stable")
    n = log.code.size
    lcount = np.bincount(left["slot"], minlength=n)
    rcount = np.bincount(right["slot"], minlength=n)
    lstart = np.concatenate(([0], np.cumsum(lcount)))
    rstart = np.concatenate(([0], np.cumsum(rcount)))
    pairs = lcount * rcount
    mids = np.flatnonzero(pairs)
    if mids.size == 0:
        z = np.zeros(0, np.int64)
        return z, z, np.zeros(0)
    g, off = _expand(pairs[mids])
    j = mids[g]
    del g
    li = lo[lstart[j] + off // rcount[j]]
    ri = ro[rstart[j] + off % rcount[j]]
    del off
    a, c = left["code"][li], right["code"][ri]
    ok = a != c
    j, a, c = j[ok], a[ok], c[ok]
    m = np.maximum(left["gap"][li[ok]], right["gap"][ri[ok]]) if with_gaps else np.zeros(0)
    del li, ri, ok
    return log.episode[j], (a * v + log.code[j]) * v + c, m


def _episode_key_order(ep: np.ndarray, key: np.ndarray, span: int) -> np.ndarray:
    """Order of rows by (episode, key), ``ep`` non-decreasing and keys below ``span``.

    One sort of a combined integer where it fits in 63 bits (3-10x faster than a lexsort
    of millions of rows), a lexsort otherwise.
    """
    if ep.size == 0:
        return np.zeros(0, np.int64)
    combined = _combined_key(ep, key, span)
    return np.argsort(combined) if combined is not None else np.lexsort((key, ep))


def _combined_key(ep: np.ndarray, key: np.ndarray, span: int) -> np.ndarray | None:
    """(episode - first episode) * span + key, or None where it would not fit in 63 bits."""
    base = int(ep[0])
    if (int(ep[-1]) - base + 1) * span < 2 ** 62:
        return (ep - base) * span + key
    return None


def _triple_rows(ctx: _Episodes, left: dict, right: dict) -> dict:
    """Per (episode, ordered triple of distinct codes): the tightest largest step gap."""
    ep, key, m = _triple_slots(ctx, left, right, with_gaps=True)
    order = _episode_key_order(ep, key, ctx.v ** 3)
    ep, key, m = ep[order], key[order], m[order]
    starts = np.flatnonzero(np.concatenate(([True], (ep[1:] != ep[:-1])
                                            | (key[1:] != key[:-1])))) \
        if ep.size else np.zeros(0, np.int64)
    rows = {"ep": ep[starts], "key": key[starts],
            "m": np.minimum.reduceat(m, starts) if m.size else m}
    rows["uk"], rows["support"] = _counts(rows["key"])
    return rows


def _triple_support_keys(ctx: _Episodes, left: dict, right: dict) -> np.ndarray:
    """Triple keys once per episode that holds them (what a support count needs): no gaps."""
    ep, key, _ = _triple_slots(ctx, left, right, with_gaps=False)
    if ep.size == 0:
        return key
    span = ctx.v ** 3
    combined = _combined_key(ep, key, span)
    if combined is not None:
        del ep, key
        combined.sort()  # a plain sort: no order array needed, only distinct values
        distinct = np.concatenate(([True], combined[1:] != combined[:-1]))
        return combined[distinct] % span
    order = np.lexsort((key, ep))
    ep, key = ep[order], key[order]
    return key[np.concatenate(([True], (ep[1:] != ep[:-1]) | (key[1:] != key[:-1])))]


def _presence_pairs(ctx: _Episodes) -> tuple[np.ndarray, ...]:
    """Per episode, every pair of the distinct codes it holds, as presence-row indices.

    Returns (episode of each presence row, its code, first row, second row, each row's
    episode end); rows of one episode are consecutive and ordered by code. Only codes
    patterns may be built from take part (``EventLog.eligible``).
    """
    v = ctx.v
    ep, code = ctx.pres_key // v, ctx.pres_key % v
    if ctx.log.eligible is not None:
        keep = ctx.log.eligible[code]
        ep, code = ep[keep], code[keep]
    starts = np.searchsorted(ep, np.arange(ctx.n_ep + 1))
    ends = starts[1:][ep] if ep.size else np.zeros(0, np.int64)
    g, off = _expand(np.maximum(ends - np.arange(ep.size) - 1, 0))
    return ep, code, g, g + 1 + off, ends


def _copresent_pairs(ctx: _Episodes) -> tuple[np.ndarray, np.ndarray]:
    """(episode, code-pair key) rows: every pair of distinct codes an episode holds."""
    ep, code, first, second, _ = _presence_pairs(ctx)
    return ep[first], code[first] * ctx.v + code[second]


def _copresent_triples(ctx: _Episodes, frequent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(episode, code-triple key) rows for triples whose three pairs are all ``frequent``."""
    v = ctx.v
    ep, code, g, second, ends = _presence_pairs(ctx)
    sel = _member(frequent, code[g] * v + code[second])
    p_first, p_second = g[sel], second[sel]
    g2, off2 = _expand(np.maximum(ends[p_second] - p_second - 1, 0))
    third = p_second[g2] + 1 + off2
    a, b, c = code[p_first[g2]], code[p_second[g2]], code[third]
    ok = _member(frequent, b * v + c) & _member(frequent, a * v + c)
    return ep[third[ok]], (a[ok] * v + b[ok]) * v + c[ok]


def _copresent_sets(ctx: _Episodes, length: int, minimum: int,
                    pairs: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """Code sets present together in >= ``minimum`` episodes.

    Returns the sorted set keys, their episode counts and the (episode, key) rows; triples
    are only built from pairs that co-occur that often (or from ``pairs``, sorted pair
    set keys, when given: the pair family after its budget).
    """
    pair_ep, pair_key = _copresent_pairs(ctx)
    if length == 2:
        set_ep, set_key = pair_ep, pair_key
    else:
        if pairs is None:
            pk, pc = _counts(pair_key)
            pairs = pk[pc >= minimum]
        set_ep, set_key = _copresent_triples(ctx, pairs)
    keys, counts = _counts(set_key)
    keep = counts >= minimum
    sel = _member(keys[keep], set_key)
    return keys[keep], counts[keep], set_ep[sel], set_key[sel]
