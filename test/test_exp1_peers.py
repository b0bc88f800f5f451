"""Exp 1's retrieval peers and measurement helpers: recall, ef choice, distinctness, indexes."""

import numpy as np
import pytest

from thinkmem_ros.baselines import knn_vote
from thinkmem_ros.baselines.sequence_rag import (
    EF_LADDER,
    FaissFlatIndex,
    HnswIndex,
    NumpyFlatIndex,
    RetrievalPeer,
    WindowVectoriser,
    choose_ef,
    recall_at_k,
)
from thinkmem_ros.bench import exp1
from thinkmem_ros.core.data import SituationSet


def brute_force(x, q, k):
    d = ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    return np.argsort(d, axis=1)[:, :k]


def test_recall_counts_shared_neighbours_whatever_their_order():
    exact = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])
    approx = np.array([[3, 2, 1, 0], [4, 5, 9, 8]])  # all 4, then 2 of 4
    assert recall_at_k(approx, exact) == pytest.approx(6 / 8)
    assert recall_at_k(exact, exact) == 1.0
    with pytest.raises(ValueError, match="same"):
        recall_at_k(approx[:1], exact)


class _FakeIndex:
    """Returns the exact neighbours only from ef >= ``good``; records the efs tried."""

    def __init__(self, exact, good):
        self.exact, self.good, self.tried, self.ef = exact, good, [], None

    def set_ef(self, ef):
        self.ef = ef
        self.tried.append(ef)

    def search(self, queries, k):
        if self.ef >= self.good:
            return self.exact
        wrong = self.exact.copy()
        wrong[:, 0] += 1000  # one of four neighbours missed: recall 0.75
        return wrong


def test_choose_ef_takes_the_smallest_ef_that_reaches_the_target():
    exact = np.arange(40).reshape(10, 4)
    index = _FakeIndex(exact, good=24)
    ef, recall = choose_ef(index, np.zeros((10, 3)), exact, 4, 0.95)
    assert (ef, recall) == (24, 1.0)
    assert index.tried == [e for e in EF_LADDER if 4 <= e <= 24] and index.ef == 24
    # a target that no ef reaches: the largest ef and the recall it really had
    index = _FakeIndex(exact, good=10**9)
    ef, recall = choose_ef(index, np.zeros((10, 3)), exact, 4, 0.95)
    assert ef == max(EF_LADDER) and recall == pytest.approx(0.75)
    with pytest.raises(ValueError, match="target"):
        choose_ef(index, np.zeros((10, 3)), exact, 4, 0.0)


def test_hnsw_ef_choice_is_minimal_on_a_real_index():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 24)).astype(np.float32)
    q = rng.normal(size=(200, 24)).astype(np.float32)
    exact = brute_force(x, q, 4)
    index = HnswIndex(24, 3000, seed=1)
    index.add(x[:1000])
    index.add(x[1000:])  # grown in two steps, as Exp 1 grows its memory
    assert index.size == 3000
    ef, recall = choose_ef(index, q, exact, 4, 0.95)
    assert recall >= 0.95 and index.ef == ef
    smaller = [e for e in EF_LADDER if 4 <= e < ef]
    if smaller:  # the next smaller ef must really miss the target
        index.set_ef(smaller[-1])
        assert recall_at_k(index.search(q, 4), exact) < 0.95
    index.set_ef(ef)
    assert np.array_equal(index.search(q[:3], 4)[1], index.search_one(q[1], 4))


def test_exact_indexes_agree_with_brute_force_when_grown_in_steps():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 12)).astype(np.float32)
    q = rng.normal(size=(30, 12)).astype(np.float32)
    expected = np.sort(brute_force(x[:300], q, 4), axis=1)
    for index in (NumpyFlatIndex(12, 500), FaissFlatIndex(12)):
        index.add(x[:100])
        index.add(x[100:300])
        got = np.sort(index.search(q, 4), axis=1)
        assert np.array_equal(got, expected), index.name
        assert np.array_equal(np.sort(index.search_one(q[5], 4)), expected[5]), index.name
    numpy_index = NumpyFlatIndex(12, 200)
    with pytest.raises(ValueError, match="capacity"):
        numpy_index.add(x[:201])


def test_peer_query_one_is_the_batched_vote_and_the_vectoriser_keeps_224_dims():
    rng = np.random.default_rng(2)
    signals = rng.normal(size=(300, 32, 7)).astype(np.float32)
    mask = (rng.random((300, 32, 7)) > 0.05).astype(np.float32)
    labels = (rng.random((300, 10)) > 0.5).astype(np.float32)
    data = SituationSet(signals=signals * mask, labels=labels, mask=mask)
    vec = WindowVectoriser.fit(data, append_mask=False)
    assert vec.dim == 224 and vec(data.signals, data.mask).shape == (300, 224)
    assert WindowVectoriser.fit(data).dim == 448  # gaps: the mask is appended by default
    index = NumpyFlatIndex(vec.dim, 300)
    index.add(vec(data.signals[:250], data.mask[:250]))
    peer = RetrievalPeer(vec, index, labels, k=4)
    test = data.subset(np.arange(250, 300))
    batch = peer.predict(test)
    one = np.stack([peer.query_one(s, m) for s, m in zip(test.signals, test.mask, strict=True)])
    assert np.array_equal(batch, one)
    top = peer.neighbours(test)
    assert top.max() < 250  # only stored rows are ever retrieved
    assert np.array_equal(batch, knn_vote(labels[top]))


def test_distinct_fraction_and_query_overlap_are_measured_not_assumed():
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert exp1.distinct_fraction(rows) == 1.0
    assert exp1.distinct_fraction(np.concatenate([rows, rows[:1]])) == pytest.approx(4 / 5)
    assert exp1.found_in(rows[[1, 3]] + np.array([0, 0, 1e-3], np.float32), rows) == 0
    assert exp1.found_in(rows[[1, 3]], rows) == 2


def test_memory_from_many_streams_is_distinct_and_queries_are_held_out():
    from thinkmem_ros.core.paths import default_bundle
    from thinkmem_ros.policy.bundle import read_manifest

    manifest = read_manifest(default_bundle())
    vec, vectors, labels, info = exp1.build_memory(manifest, "mixed", seed=0, n=1500)
    assert vectors.shape == (1500, vec.dim) and labels.shape[0] == 1500
    assert info["streams"] >= 2  # more than one stream was cut
    assert exp1.distinct_fraction(vectors) == 1.0
    test, streams, where = exp1.query_set(manifest, "mixed", 0, 1, 1, 50)
    assert len(test) == 50 and len(streams) == 1 and where.shape == (50, 2)
    assert exp1.found_in(vec(test.signals, test.mask), vectors) == 0
    # the recorded (stream, last frame) points at the very window that was sampled
    row = where[7]
    frames = streams[row[0]].values[row[1] - manifest.window + 1:row[1] + 1]
    assert np.array_equal(np.nan_to_num(frames), test.signals[7])
