"""Sequence-RAG: exact top-4 kNN over whole flattened windows, as fast as numpy allows.

This is the strongest explicit-memory baseline: it keeps every stored window verbatim, so
it can reproduce any rule its history covers, but its memory and per-query cost grow with
the history. It is written the way a careful user would write it, so that speed ratios
against the policy are honest: a float32 matrix, squared norms precomputed at fit time,
one matrix-vector product per query (``||x||^2 - 2 X q``) and ``np.argpartition`` for the
top-k. Latency comparisons limit BLAS to one thread (threadpoolctl), like the policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from thinkmem_ros.baselines.summary_rag import exact_knn, knn_vote
from thinkmem_ros.core.data import SituationSet


@dataclass
class SequenceRAG:
    """Store each window (standardised per channel) and vote over its k nearest windows.

    The observation mask is appended to the vector only when the training set has missing
    values; with complete data it is constant and would only double memory and time.
    Discrete events are not part of the vector (the signal families used with this
    baseline carry none).
    """

    k: int = 4

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        self._index: np.ndarray | None = None

    def fit(self, train: SituationSet) -> SequenceRAG:
        """Build the float32 index, its squared norms and the label table."""
        if len(train) == 0:
            raise ValueError("SequenceRAG.fit needs at least one training situation")
        observed = train.mask > 0.5
        count = np.maximum(observed.sum(axis=(0, 1)), 1)  # (F,)
        self._mu = (train.signals * observed).sum(axis=(0, 1)) / count
        var = (((train.signals - self._mu) * observed) ** 2).sum(axis=(0, 1)) / count
        self._sigma = np.sqrt(var).astype(np.float32)
        self._sigma[self._sigma < 1e-9] = 1.0
        self._mu = self._mu.astype(np.float32)
        self._use_mask = bool(not observed.all())
        self._window = train.window
        self._index = np.ascontiguousarray(self._vectors(train.signals, train.mask))
        self._norms = np.einsum("ij,ij->i", self._index, self._index)
        self._labels = train.labels.astype(np.float32)
        return self

    def _vectors(self, signals: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(N, D) float32 query/index vectors from (N, K, F) windows."""
        z = ((signals - self._mu) / self._sigma) * mask  # masked entries -> 0
        flat = z.reshape(z.shape[0], -1).astype(np.float32)
        if self._use_mask:
            flat = np.concatenate([flat, mask.reshape(mask.shape[0], -1)], axis=1)
        return flat.astype(np.float32, copy=False)

    def _check(self, data_window: int) -> None:
        if self._index is None:
            raise RuntimeError("SequenceRAG used before fit()")
        if data_window != self._window:
            raise ValueError(f"window {data_window} differs from the index window {self._window}")

    def neighbours(self, data: SituationSet) -> np.ndarray:
        """(N, k) indices of the retrieved training windows (batched GEMM, exact)."""
        self._check(data.window)
        return exact_knn(self._index, self._norms, self._vectors(data.signals, data.mask), self.k)

    def predict(self, data: SituationSet) -> np.ndarray:
        """(N, L) {0, 1} activation by top-k vote."""
        top = self.neighbours(data)  # checks fit() first
        return knn_vote(self._labels[top])

    def query_one(self, signals: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Activation (L,) for one (K, F) window: the per-query path timed in Exp 1."""
        self._check(signals.shape[0])
        if mask is None:
            mask = np.ones_like(signals)
        q = self._vectors(signals[None], mask[None])[0]  # (D,)
        dist = self._norms - 2.0 * (self._index @ q)  # (N,) one GEMV
        k = min(self.k, dist.shape[0])
        top = np.argpartition(dist, k - 1)[:k] if k < dist.shape[0] else np.arange(k)
        return knn_vote(self._labels[top][None])[0]

    def stored_bytes(self) -> int:
        """Bytes of the explicit memory: the vector index, its norms and stored labels."""
        if self._index is None:
            return 0
        return int(self._index.nbytes + self._norms.nbytes + self._labels.nbytes
                   + self._mu.nbytes + self._sigma.nbytes)

    def bytes_per_record(self) -> float:
        """Memory added by one more stored window (vector + norm + labels)."""
        if self._index is None:
            raise RuntimeError("SequenceRAG used before fit()")
        return float(self._index.itemsize * self._index.shape[1] + self._norms.itemsize
                     + self._labels.itemsize * self._labels.shape[1])
