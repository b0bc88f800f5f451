"""Summary-RAG: retrieve the 4 most similar stored summaries and vote on their thinking."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from thinkmem_ros.baselines.features import summary_features
from thinkmem_ros.core.data import SituationSet


def knn_vote(neighbour_labels: np.ndarray) -> np.ndarray:
    """Label active when at least half of the retrieved neighbours carry it.

    ``neighbour_labels`` is (N, k, L); ties (2 of 4) activate, following the paper's
    "majority of the top-4" with a bias towards recall a reasoning agent prefers.
    """
    k = neighbour_labels.shape[1]
    votes = (neighbour_labels > 0.5).sum(axis=1)  # (N, L)
    return (2 * votes >= k).astype(np.float32)


def exact_knn(index: np.ndarray, norms: np.ndarray, queries: np.ndarray, k: int,
              chunk: int | None = None) -> np.ndarray:
    """Return indices (N, k) of the k nearest rows of ``index`` (squared L2), exactly.

    ``norms`` are the precomputed squared norms of ``index`` rows; the distance is
    ``||x||^2 - 2 x.q`` (``||q||^2`` is constant per query and does not change the order).
    """
    k = min(k, index.shape[0])
    if chunk is None:  # keep each (chunk, N) distance block near 64 MB
        chunk = int(max(1, min(1024, 2**24 // max(index.shape[0], 1))))
    out = np.empty((queries.shape[0], k), dtype=np.int64)
    for start in range(0, queries.shape[0], chunk):
        q = queries[start:start + chunk]
        dist = norms[None, :] - 2.0 * (q @ index.T)  # (B, N)
        if k < index.shape[0]:
            out[start:start + chunk] = np.argpartition(dist, k - 1, axis=1)[:, :k]
        else:
            out[start:start + chunk] = np.argsort(dist, axis=1)[:, :k]
    return out


@dataclass
class SummaryRAG:
    """kNN over standardised aggregate statistics (per channel: mean, std, min, max, ...).

    Standardisation uses the training set's feature mean and std so that no statistic
    dominates the distance by its units.
    """

    k: int = 4

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        self._index: np.ndarray | None = None

    def fit(self, train: SituationSet) -> SummaryRAG:
        """Store the standardised summaries and labels of ``train``."""
        if len(train) == 0:
            raise ValueError("SummaryRAG.fit needs at least one training situation")
        feats = summary_features(train)
        self._mu = feats.mean(axis=0)
        self._sigma = feats.std(axis=0)
        self._sigma[self._sigma < 1e-9] = 1.0
        self._index = ((feats - self._mu) / self._sigma).astype(np.float32)
        self._norms = np.einsum("ij,ij->i", self._index, self._index)
        self._labels = train.labels.astype(np.float32)
        return self

    def _embed(self, data: SituationSet) -> np.ndarray:
        if self._index is None:
            raise RuntimeError("SummaryRAG used before fit()")
        return ((summary_features(data) - self._mu) / self._sigma).astype(np.float32)

    def neighbours(self, data: SituationSet) -> np.ndarray:
        """(N, k) indices of the retrieved training situations."""
        return exact_knn(self._index, self._norms, self._embed(data), self.k)

    def predict(self, data: SituationSet) -> np.ndarray:
        """(N, L) {0, 1} thinking activation by top-k vote."""
        top = self.neighbours(data)  # checks fit() first
        return knn_vote(self._labels[top])

    def stored_bytes(self) -> int:
        """Bytes held as memory: the summary index, its norms and the stored labels."""
        if self._index is None:
            return 0
        return int(self._index.nbytes + self._norms.nbytes + self._labels.nbytes
                   + self._mu.nbytes + self._sigma.nbytes)
