"""Sequence-RAG: top-4 kNN over whole flattened windows, and the indexes a user would run.

This is the strongest explicit-memory baseline: it keeps every stored window verbatim, so
it can reproduce any rule its history covers, but its memory and per-query cost grow with
the history. It is written the way a careful user would write it, so that speed ratios
against the policy are honest: a float32 matrix, squared norms precomputed at fit time,
one matrix-vector product per query (``||x||^2 - 2 X q``) and ``np.argpartition`` for the
top-k. Latency comparisons limit BLAS to one thread (threadpoolctl), like the policy.

The same vectors can be searched by the indexes users actually deploy (Exp 1 compares the
policy against each of them): ``NumpyFlatIndex`` (the GEMV above, growable),
``FaissFlatIndex`` (faiss-cpu exact L2, its SIMD kernels) and ``HnswIndex`` (hnswlib HNSW,
approximate, with M and ef_construction at the values its users keep and ``ef`` chosen
by ``choose_ef`` as the smallest that reaches a recall target against exact search).
``RetrievalPeer`` wraps any of them with the vectoriser and the label vote, so a timed
query is the whole path from a raw (K, F) window to an activation. faiss and hnswlib are
offboard dependencies (``requirements/train.txt``) and are imported only when used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from thinkmem_ros.baselines.summary_rag import exact_knn, knn_vote
from thinkmem_ros.core.data import SituationSet

EF_LADDER = (4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 320,
             384, 512, 768, 1024, 1536, 2048)
"""Search-time ``ef`` values ``choose_ef`` tries, smallest first (hnswlib needs ef >= k)."""


@dataclass
class WindowVectoriser:
    """Per-channel standardisation and flattening of (K, F) windows into index vectors.

    Masked entries become 0 after standardisation (the channel mean), so a dropout does
    not pull a window towards windows that happen to hold zeros. The mask itself is
    appended only when ``use_mask`` is set (it doubles the dimension).
    """

    mu: np.ndarray  # (F,) float32
    sigma: np.ndarray  # (F,) float32, >= 1e-9
    window: int
    use_mask: bool = False

    @classmethod
    def fit(cls, train: SituationSet, append_mask: bool | None = None) -> WindowVectoriser:
        """Channel statistics over observed entries; ``append_mask=None``: only with gaps."""
        if len(train) == 0:
            raise ValueError("WindowVectoriser.fit needs at least one situation")
        observed = train.mask > 0.5
        count = np.maximum(observed.sum(axis=(0, 1)), 1)  # (F,)
        mu = (train.signals * observed).sum(axis=(0, 1)) / count
        var = (((train.signals - mu) * observed) ** 2).sum(axis=(0, 1)) / count
        sigma = np.sqrt(var).astype(np.float32)
        sigma[sigma < 1e-9] = 1.0
        use_mask = bool(not observed.all()) if append_mask is None else bool(append_mask)
        return cls(mu.astype(np.float32), sigma, train.window, use_mask)

    @property
    def dim(self) -> int:
        """Length of one vector: K * F, doubled when the mask is appended."""
        return self.window * self.mu.shape[0] * (2 if self.use_mask else 1)

    def __call__(self, signals: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(N, D) float32 vectors from (N, K, F) windows and masks."""
        if signals.ndim != 3 or signals.shape[1] != self.window:
            raise ValueError(f"windows must be (N, {self.window}, F), got {signals.shape}")
        z = ((signals - self.mu) / self.sigma) * mask  # masked entries -> 0
        flat = z.reshape(z.shape[0], -1).astype(np.float32)
        if self.use_mask:
            flat = np.concatenate([flat, mask.reshape(mask.shape[0], -1)], axis=1)
        return np.ascontiguousarray(flat, dtype=np.float32)

    def one(self, signals: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """(D,) vector of one (K, F) window (mask None: fully observed)."""
        if signals.ndim != 2 or signals.shape[0] != self.window:
            raise ValueError(f"window {signals.shape} is not ({self.window}, F)")
        if mask is None:
            mask = np.ones_like(signals)
        return self(signals[None], mask[None])[0]


@dataclass
class SequenceRAG:
    """Store each window (standardised per channel) and vote over its k nearest windows.

    The observation mask is appended to the vector only when the training set has missing
    values (``append_mask=None``); with complete data it is constant and would only double
    memory and time. Discrete events are not part of the vector (the signal families used
    with this baseline carry none).
    """

    k: int = 4
    append_mask: bool | None = None

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        self._index: np.ndarray | None = None

    def fit(self, train: SituationSet) -> SequenceRAG:
        """Build the float32 index, its squared norms and the label table."""
        if len(train) == 0:
            raise ValueError("SequenceRAG.fit needs at least one training situation")
        self.vectoriser = WindowVectoriser.fit(train, self.append_mask)
        self._mu, self._sigma = self.vectoriser.mu, self.vectoriser.sigma
        self._use_mask = self.vectoriser.use_mask
        self._window = train.window
        self._index = self.vectoriser(train.signals, train.mask)
        self._norms = np.einsum("ij,ij->i", self._index, self._index)
        self._labels = train.labels.astype(np.float32)
        return self

    def _vectors(self, signals: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(N, D) float32 query/index vectors from (N, K, F) windows."""
        return self.vectoriser(signals, mask)

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


# --------------------------------------------------------------------------- vector indexes

def _check_vectors(vectors: np.ndarray, dim: int) -> np.ndarray:
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise ValueError(f"vectors must be (N, {dim}), got {vectors.shape}")
    return vectors


class NumpyFlatIndex:
    """Exact squared-L2 search with one GEMV per query; rows can be appended up to capacity.

    Rows live in one preallocated matrix, so searching the first n rows is a contiguous
    view: a growing memory is measured without copying it at every size.
    """

    name = "numpy_flat"

    def __init__(self, dim: int, capacity: int) -> None:
        if dim < 1 or capacity < 1:
            raise ValueError(f"dim and capacity must be >= 1, got {dim}, {capacity}")
        self.dim = dim
        self._x = np.zeros((capacity, dim), np.float32)
        self._norms = np.zeros(capacity, np.float32)
        self.size = 0

    def add(self, vectors: np.ndarray) -> None:
        """Append rows (ids continue from the current size)."""
        vectors = _check_vectors(vectors, self.dim)
        end = self.size + vectors.shape[0]
        if end > self._x.shape[0]:
            raise ValueError(f"index capacity {self._x.shape[0]} exceeded ({end} rows)")
        self._x[self.size:end] = vectors
        self._norms[self.size:end] = np.einsum("ij,ij->i", vectors, vectors)
        self.size = end

    def search(self, queries: np.ndarray, k: int) -> np.ndarray:
        """(B, k) ids of the k nearest rows of each query (batched, exact)."""
        self._nonempty()
        return exact_knn(self._x[:self.size], self._norms[:self.size],
                         _check_vectors(queries, self.dim), k)

    def search_one(self, q: np.ndarray, k: int) -> np.ndarray:
        """(k,) ids of the k nearest rows of one (D,) query: the timed per-query path."""
        self._nonempty()
        dist = self._norms[:self.size] - 2.0 * (self._x[:self.size] @ q)  # (N,) one GEMV
        k = min(k, self.size)
        return np.argpartition(dist, k - 1)[:k] if k < self.size else np.arange(k)

    def _nonempty(self) -> None:
        if self.size == 0:
            raise RuntimeError(f"{self.name} index searched while empty")

    def stored_bytes(self) -> int:
        """Bytes of the stored rows and their norms."""
        return int(self.size * (self.dim + 1) * 4)


class FaissFlatIndex:
    """Exact squared-L2 search with faiss-cpu ``IndexFlatL2`` on one OpenMP thread."""

    name = "faiss_flat"

    def __init__(self, dim: int) -> None:
        import faiss

        faiss.omp_set_num_threads(1)
        self.dim = dim
        self._index = faiss.IndexFlatL2(dim)

    @property
    def size(self) -> int:
        """Rows stored."""
        return int(self._index.ntotal)

    def add(self, vectors: np.ndarray) -> None:
        """Append rows (ids continue from the current size)."""
        self._index.add(_check_vectors(vectors, self.dim))

    def search(self, queries: np.ndarray, k: int) -> np.ndarray:
        """(B, k) ids of the k nearest rows of each query."""
        _, ids = self._index.search(_check_vectors(queries, self.dim), k)
        return ids

    def search_one(self, q: np.ndarray, k: int) -> np.ndarray:
        """(k,) ids for one (D,) query: the timed per-query path."""
        _, ids = self._index.search(q[None], k)
        return ids[0]

    def stored_bytes(self) -> int:
        """Bytes of the stored rows."""
        return int(self.size * self.dim * 4)


class HnswIndex:
    """Approximate search with hnswlib HNSW; queries on one thread.

    ``m`` and ``ef_construction`` default to the values hnswlib's users keep (16, 200);
    ``ef`` (search breadth) is set with ``set_ef``, usually from ``choose_ef``. ``threads``
    is the build parallelism only: every search runs on one thread.
    """

    name = "hnsw"

    def __init__(self, dim: int, capacity: int, *, m: int = 16, ef_construction: int = 200,
                 seed: int = 0, threads: int = 1) -> None:
        import hnswlib

        if m < 2 or ef_construction < 1 or threads < 1:
            raise ValueError(f"m >= 2, ef_construction >= 1 and threads >= 1 needed, got "
                             f"{m}, {ef_construction}, {threads}")
        self.dim, self.m, self.ef_construction, self.threads = dim, m, ef_construction, threads
        self._index = hnswlib.Index(space="l2", dim=dim)
        self._index.init_index(max_elements=capacity, M=m, ef_construction=ef_construction,
                               random_seed=seed)
        self._index.set_num_threads(1)
        self.ef = 10
        self._index.set_ef(self.ef)

    @property
    def size(self) -> int:
        """Rows stored."""
        return int(self._index.get_current_count())

    def add(self, vectors: np.ndarray) -> None:
        """Insert rows (ids continue from the current size)."""
        vectors = _check_vectors(vectors, self.dim)
        ids = np.arange(self.size, self.size + vectors.shape[0])
        self._index.add_items(vectors, ids, num_threads=self.threads)
        self._index.set_num_threads(1)

    def set_ef(self, ef: int) -> None:
        """Search breadth (hnswlib needs ef >= k)."""
        if ef < 1:
            raise ValueError(f"ef must be >= 1, got {ef}")
        self.ef = int(ef)
        self._index.set_ef(self.ef)

    def search(self, queries: np.ndarray, k: int) -> np.ndarray:
        """(B, k) ids of the approximate k nearest rows of each query (one thread)."""
        ids, _ = self._index.knn_query(_check_vectors(queries, self.dim), k=k, num_threads=1)
        return ids.astype(np.int64)

    def search_one(self, q: np.ndarray, k: int) -> np.ndarray:
        """(k,) ids for one (D,) query: the timed per-query path."""
        ids, _ = self._index.knn_query(q, k=k)
        return ids[0]

    def stored_bytes(self) -> int:
        """Bytes of the vectors plus the level-0 links hnswlib keeps for each of them."""
        return int(self.size * (self.dim * 4 + 2 * self.m * 4 + 8))


def recall_at_k(approx: np.ndarray, exact: np.ndarray) -> float:
    """Mean fraction of each query's exact k neighbours that ``approx`` also returned."""
    if approx.shape != exact.shape or approx.ndim != 2 or approx.shape[0] == 0:
        raise ValueError(f"approx {approx.shape} and exact {exact.shape} must be the same "
                         "non-empty (B, k)")
    hits = [len(set(a.tolist()) & set(e.tolist())) for a, e in zip(approx, exact, strict=True)]
    return float(np.sum(hits) / exact.size)


def choose_ef(index: HnswIndex, queries: np.ndarray, exact: np.ndarray, k: int,
              target: float = 0.95, ladder: tuple[int, ...] = EF_LADDER) -> tuple[int, float]:
    """Smallest ``ef`` of ``ladder`` (>= k) whose recall@k against ``exact`` reaches ``target``.

    Returns (ef, recall) and leaves the index at that ef. When no ef of the ladder reaches
    the target the largest is kept and its (lower) recall returned, so a caller reports
    what was reached instead of a figure it assumed.
    """
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target recall must be in (0, 1], got {target}")
    candidates = [ef for ef in sorted(ladder) if ef >= k]
    if not candidates:
        raise ValueError(f"no ef in {ladder} is >= k={k}")
    recall = 0.0
    for ef in candidates:
        index.set_ef(ef)
        recall = recall_at_k(index.search(queries, k), exact)
        if recall >= target:
            return ef, recall
    return candidates[-1], recall


class RetrievalPeer:
    """Raw window -> vector -> k nearest stored windows -> label vote, for any index.

    ``query_one`` is the whole per-decision path a user's retrieval node would run, so its
    timing is comparable with the policy's ``predict_one``.
    """

    def __init__(self, vectoriser: WindowVectoriser, index, labels: np.ndarray,
                 k: int = 4) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.vectoriser, self.index, self.k = vectoriser, index, k
        self.labels = np.asarray(labels, dtype=np.float32)  # (capacity, L): ids index it

    def neighbours(self, data: SituationSet) -> np.ndarray:
        """(N, k) ids of the retrieved windows (batched)."""
        return self.index.search(self.vectoriser(data.signals, data.mask), self.k)

    def predict(self, data: SituationSet) -> np.ndarray:
        """(N, L) {0, 1} activation by top-k vote."""
        return knn_vote(self.labels[self.neighbours(data)])

    def query_one(self, signals: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Activation (L,) for one (K, F) window."""
        top = self.index.search_one(self.vectoriser.one(signals, mask), self.k)
        return knn_vote(self.labels[top][None])[0]
