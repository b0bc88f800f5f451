"""The per-episode index discovery reads: slots, slot counts, code positions, time scale.

Why one object: every step asks the same questions of an episode (where its codes sit,
how many slot pairs and triples fit a scale), and a scan in parts builds it per part from
the whole log's scale so the parts' sums equal a whole pass.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from thinkmem_ros.consolidator.discovery.arrays import _counts, _lookup
from thinkmem_ros.consolidator.discovery.model import DiscoveryConfig, EventLog


def _median_span(t: np.ndarray, start: np.ndarray) -> float:
    """The median time from first to last event over the episodes of two events or more."""
    first, last = start[:-1], start[1:] - 1
    several = last > first
    return float(np.median(t[last[several]] - t[first[several]])) if several.any() else 0.0


def _ladder(multiples: tuple[float, ...], reach: float) -> tuple[float, ...]:
    """``multiples`` of the median gap, continued at their last ratio until ``reach``.

    Why: the median gap between consecutive events sets the ladder's unit, and where
    events come in bursts it is the gap inside a burst (0.7 s between bursts of codes a
    few seconds apart in 30-minute episodes), so the ladder's top (64 units: 45 s) sat far
    below the gaps of rules between bursts, every such occurrence fell on the last rung
    (anywhere in the episode) and rules were found in 4 of 36 cases. Continued up to the
    median episode span, the same streams gave 21 of 36, none false. Where 64 units
    already reach the span (every world here: the spans are ~30 units) nothing changes.
    """
    out = list(multiples)
    if len(out) < 2 or out[-1] <= out[-2] or not reach > out[-1]:
        return tuple(out)
    ratio = out[-1] / out[-2]
    while out[-1] < reach and len(out) < 64:
        out.append(out[-1] * ratio)
    return tuple(out)


class _Episodes:
    """Per-episode slot structure: pairs within the gap window, presence, slot counts."""

    def __init__(self, log: EventLog, cfg: DiscoveryConfig, *, pairs: bool = True,
                 whole: _Episodes | None = None) -> None:
        """Index ``log``; see the flags for a log scanned in parts.

        ``pairs=False``: no slot pairs (the O(events) index the checks need, for a log
        scanned in parts); ``whole``: this log is a part of ``whole``'s and takes its
        median gap, scales and completeness, so per-episode sums match a whole-log pass.
        """
        self.log, self.cfg = log, cfg
        self.pass_s: dict[str, float] = {}  # seconds per pass of a scan in parts
        self.family: dict[str, float] = {}  # the pair family's budget, when it bound
        # each ordered code pair's binding test (``_pair_binding``), asked for by every
        # triple that holds the pair: hundreds of checks share a few dozen pairs
        self.bindings: dict[tuple[int, int], tuple[float, bool]] = {}
        self.n_ep = len(log.episode_ids)
        self.v = log.n_codes
        ep, t = log.episode, log.time
        self.start = np.searchsorted(ep, np.arange(self.n_ep + 1))
        self.n = np.diff(self.start)
        n = ep.size
        if whole is None:
            gaps = np.diff(t)[ep[1:] == ep[:-1]] if n > 1 else np.zeros(0)
            positive = gaps[gaps > 0]
            self.delta = float(np.median(positive)) if positive.size else 1.0
            del gaps, positive
            multiples = _ladder(cfg.scales, _median_span(t, self.start) / self.delta)
            self.scales = np.asarray(sorted(
                {s * self.delta for s in multiples if s * self.delta < cfg.max_gap}
                | {cfg.max_gap}), np.float64)
        else:
            self.delta, self.scales = whole.delta, np.asarray(whole.scales, np.float64)
        longest = int(self.n.max()) if self.n.size else 0
        self.complete = longest <= cfg.max_lookback if whole is None else whole.complete
        self.t2 = np.zeros((self.n_ep, self.scales.size))
        self.t3 = np.zeros((self.n_ep, self.scales.size))
        if pairs:
            self._slot_pairs(longest)
        self._index_codes()

    def _slot_pairs(self, longest: int) -> None:
        """Slot pairs within the gap window, and per episode the slot-pair/triple counts."""
        log, cfg = self.log, self.cfg
        ep, t, n = log.episode, log.time, log.episode.size
        out_i, out_j = [], []
        for d in range(1, min(longest, cfg.max_lookback + 1)):
            i = np.arange(n - d)
            j = i + d
            same = ep[i] == ep[j]
            gap = t[j] - t[i]
            within = same & (gap <= cfg.max_gap)
            if not within.any():
                break
            ok = within & (gap >= cfg.min_gap)
            out_i.append(i[ok])
            out_j.append(j[ok])
        self.pi = np.concatenate(out_i) if out_i else np.zeros(0, np.int64)
        self.pj = np.concatenate(out_j) if out_j else np.zeros(0, np.int64)
        self.pgap = t[self.pj] - t[self.pi]
        # slot-pair and slot-triple counts per episode and scale (code-independent)
        for s, g in enumerate(self.scales):
            sel = self.pgap <= g
            left = np.bincount(self.pj[sel], minlength=n).astype(np.float64)
            right = np.bincount(self.pi[sel], minlength=n).astype(np.float64)
            self.t2[:, s] = np.bincount(ep, weights=left, minlength=self.n_ep)
            self.t3[:, s] = np.bincount(ep, weights=left * right, minlength=self.n_ep)
        # counted over every slot above (the null); candidates only from eligible codes
        eligible = log.eligible
        if eligible is not None:
            keep = eligible[log.code[self.pi]] & eligible[log.code[self.pj]]
            self.pi, self.pj, self.pgap = self.pi[keep], self.pj[keep], self.pgap[keep]

    def _index_codes(self) -> None:
        """Which codes each episode holds and where each code sits (what the checks read)."""
        log = self.log
        ep, n = log.episode, log.episode.size
        # code presence: key = episode * V + code, with copies per episode
        self.pres_key, self.pres_count = _counts(ep * self.v + log.code)
        by_code = np.argsort(self.pres_key % self.v, kind="stable")
        self.code_episodes = (self.pres_key // self.v)[by_code]  # sorted within a code
        self.code_start = np.searchsorted((self.pres_key % self.v)[by_code],
                                          np.arange(self.v + 1))
        self.code_total = np.bincount(log.code, minlength=self.v)
        self.freq = self.code_total.astype(np.float64) / max(n, 1)
        by_code_rows = np.argsort(log.code, kind="stable")  # rows ascending within a code
        self._code_rows = by_code_rows
        self._code_row_start = np.searchsorted(log.code[by_code_rows], np.arange(self.v + 1))
        self._order_key: np.ndarray | None = None

    @property
    def order_key(self) -> np.ndarray:
        """A time that ascends over the whole log (episode after episode).

        Built on first use: only a positive ``min_gap`` needs it.
        """
        if self._order_key is None:
            t, ep, n = self.log.time, self.log.episode, self.log.episode.size
            span = float(t.max() - t.min()) + self.cfg.min_gap + 1.0 if n else 1.0
            self._order_key = (t - (t.min() if n else 0.0)) + ep * span
        return self._order_key

    @functools.cached_property
    def n_sources(self) -> int:
        """Distinct independent sources (robots) in the log; 0 when they are not known."""
        source = self.log.source
        return 0 if source is None else int(np.unique(source).size)

    def rows_of(self, code: int) -> np.ndarray:
        """Log rows holding ``code``, ascending."""
        return self._code_rows[self._code_row_start[code]:self._code_row_start[code + 1]]

    def copies(self, episodes: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Copies of ``codes`` in ``episodes`` (elementwise)."""
        return _lookup(self.pres_key, self.pres_count, episodes * self.v + codes)

    def exact_infinite(self) -> bool:
        """Whether p_e at the largest scale has the exact closed form."""
        return (self.cfg.min_gap == 0 and math.isinf(self.cfg.max_gap) and self.complete)
