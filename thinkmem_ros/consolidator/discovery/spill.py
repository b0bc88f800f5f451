"""A scan in parts' frames, shuffled to disk by candidate bucket and tested by bucket.

Why: a candidate's test needs all of its frames at once and a part holds only some; keeping
per-candidate sums for tens of millions of candidates in memory would not fit.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import numpy as np

from thinkmem_ros.consolidator.bucket_files import BucketFiles
from thinkmem_ros.consolidator.discovery.arrays import _candidate_codes, _expand
from thinkmem_ros.consolidator.discovery.episodes import _Episodes
from thinkmem_ros.consolidator.discovery.significance import (
    _Frames,
    _null_probs,
    _Sums,
    _Tested,
    _tested,
)
from thinkmem_ros.consolidator.engine import (
    ordered_map,
    release_free_memory,
)

TEST_BLOCK = 250_000
"""Frames tested at once: a bucket's (frames, scales) probabilities and their temporaries
are its peak (~40 MB each on the sqrt(2) ladder; a million frames made 3x10^6 events
peak at 1.44 GB)."""


class _FrameSpill:
    """Every frame of a scan in parts, shuffled to disk by candidate, then tested by bucket.

    A candidate's test needs all of its frames at once, and a part holds only some of
    them; rather than keep per-candidate sums for every candidate in memory (tens of
    millions of pairs on a fleet log), each part's frames go to the file of their
    candidate's bucket: consecutive candidates holding about ``TEST_BLOCK`` frames
    together (a candidate's frames are its code set's episodes, known from the set counts).
    A bucket is then tested alone, and only candidates that can still be significant keep
    their frames; the others leave only their smallest achievable p-value (for Tarone).
    """

    def __init__(self, ctx: _Episodes, keys: np.ndarray, length: int, width: np.ndarray,
                 threads: int = 1) -> None:
        """Buckets for ``keys``, the candidates of ``length`` codes.

        ``width``: each candidate's frames; ``threads``: buckets tested at once (each is
        that many times smaller, so the buckets in flight hold what one did).
        """
        self.ctx, self.length = ctx, length
        ends = np.cumsum(width)
        block = max(1, TEST_BLOCK // max(1, threads))
        # bucket b holds candidates bounds[b] .. bounds[b + 1] - 1
        cuts = np.searchsorted(ends, np.arange(block, int(ends[-1]) if ends.size
                                               else 0, block), side="right")
        self.bounds = np.unique(np.concatenate(([0], cuts, [keys.size])))
        index = np.int32 if max(keys.size, ctx.n_ep) < 2 ** 31 else np.int64
        self.files = BucketFiles(max(self.bounds.size - 1, 1), np.dtype(
            [("cand", index), ("ep", index), ("m", np.float64), ("k", np.int32, (length,))]))

    def add(self, cand: np.ndarray, ep: np.ndarray, m: np.ndarray, k: np.ndarray) -> None:
        """Frames of one part: global candidate index, global episode row, gap, copies."""
        bucket = np.searchsorted(self.bounds, cand, side="right") - 1
        self.files.append(bucket, cand=cand, ep=ep, m=m, k=k)

    def tested(self, keys: np.ndarray, weight: np.ndarray, alpha: float, threads: int = 1
               ) -> _Tested:
        """Test each bucket's candidates; keep those that may be significant.

        ``threads`` buckets are tested at once and gathered in order, so the result is the
        same for any thread count.
        """
        kept = []
        # the left-out candidates' minp, filled in place (a list of parts concatenated at
        # the end held them twice: tens of millions of values on a fleet log)
        other, n_other = np.empty(keys.size), 0
        for t, dropped in ordered_map(
                lambda b: self._test_bucket(b, keys, weight, alpha, trim=threads > 1),
                range(self.bounds.size - 1), threads):
            kept.append(t)
            other[n_other:n_other + dropped.size] = dropped
            n_other += dropped.size
        out = _concat_tested(kept, self.length, self.ctx.scales.size)
        out.other_minp = other[:n_other]
        return out

    def _test_bucket(self, b: int, keys: np.ndarray, weight: np.ndarray, alpha: float,
                     trim: bool = False) -> tuple[_Tested, np.ndarray]:
        """Bucket ``b``'s candidates that may be significant, and the others' minp.

        ``trim``: hand the bucket's freed temporaries back to the OS (on several threads
        each thread's heap arena would otherwise keep a bucket's worth).
        """
        ctx = self.ctx
        lo, hi = int(self.bounds[b]), int(self.bounds[b + 1])
        rec = self.files.read(b)
        self.files.drop(b)
        rec = rec[np.argsort(rec["cand"], kind="stable")]  # parts in order: episodes too
        ep = rec["ep"].astype(np.int64)
        frames = _Frames(rec["cand"].astype(np.int64) - lo, ep, rec["m"],
                         _null_probs(ctx, ep, rec["k"]), rec["k"])
        del rec
        sums = _Sums.zeros(hi - lo, ctx.scales.size)
        sums.add(frames, ctx.scales)
        t = _tested(ctx, keys[lo:hi], _candidate_codes(keys[lo:hi], self.length, ctx.v),
                    sums, frames)
        del frames, sums
        w = weight[lo:hi]
        keep = (t.p <= alpha) | (t.p / w <= alpha)
        out = _subset(t, keep), t.minp[~keep] / w[~keep]
        out[0].weight = w[keep]  # the weights travel with the candidates (no second lookup)
        del t
        if trim:
            release_free_memory()
        return out

    def close(self) -> None:
        """Delete the spilled frames."""
        self.files.close()


def _subset(t: _Tested, keep: np.ndarray) -> _Tested:
    """The candidates ``keep`` of ``t``, with their frames."""
    idx = np.flatnonzero(keep)
    lo, hi = t.frame_start[idx], t.frame_start[idx + 1]
    g, off = _expand(hi - lo)
    rows = lo[g] + off
    return _Tested(keys=t.keys[idx], codes=t.codes[idx], p=t.p[idx], minp=t.minp[idx],
                   scale=t.scale[idx], support=t.support[idx], expected=t.expected[idx],
                   frame_start=np.concatenate(([0], np.cumsum(hi - lo))),
                   frame_ep=t.frame_ep[rows], frame_m=t.frame_m[rows],
                   frame_k=t.frame_k[rows])


def _concat_tested(parts: list[_Tested], length: int, n_scales: int) -> _Tested:
    """Candidates of consecutive buckets as one ``_Tested`` (key order kept)."""
    if not parts:
        z = np.zeros(0, np.int64)
        return _Tested(keys=z, codes=np.zeros((0, length), np.int64), p=np.zeros(0),
                       minp=np.zeros(0), scale=z, support=np.zeros((0, n_scales)),
                       expected=np.zeros((0, n_scales)), frame_start=np.zeros(1, np.int64),
                       frame_ep=z, frame_m=np.zeros(0),
                       frame_k=np.zeros((0, length), np.int32))
    offsets = np.cumsum([0] + [t.frame_ep.size for t in parts[:-1]])
    return _Tested(
        keys=np.concatenate([t.keys for t in parts]),
        codes=np.concatenate([t.codes for t in parts]),
        p=np.concatenate([t.p for t in parts]), minp=np.concatenate([t.minp for t in parts]),
        scale=np.concatenate([t.scale for t in parts]),
        support=np.concatenate([t.support for t in parts]),
        expected=np.concatenate([t.expected for t in parts]),
        frame_start=np.concatenate([[0]] + [t.frame_start[1:] + o
                                            for t, o in zip(parts, offsets)]),
        frame_ep=np.concatenate([t.frame_ep for t in parts]),
        frame_m=np.concatenate([t.frame_m for t in parts]),
        frame_k=np.concatenate([t.frame_k for t in parts]),
        weight=np.concatenate([t.weight for t in parts]))
