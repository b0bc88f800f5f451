"""Baselines on tiny hand-made sets whose right answer is known."""

import numpy as np
import pytest

from thinkmem_ros.baselines import (
    FEATURE_NAMES,
    RFSummary,
    SequenceRAG,
    SummaryRAG,
    knn_vote,
    summary_features,
)
from thinkmem_ros.baselines.current_state import last_frame
from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.core.metrics import micro_scores

K, F, L = 6, 7, 10


def make_set(signals, labels, mask=None):
    return SituationSet(np.asarray(signals, np.float32), np.asarray(labels, np.float32), mask)


def order_pair_set(offsets):
    """Two classes with equal start/end/min/max/mean/std/change, differing only in order.

    Class A = bumps at positions 1 and 4, class B = bumps at 2 and 3: the same multiset and
    the same sum of t*x, so every summary statistic matches exactly.
    """
    a = np.array([0, 1, 0, 0, 1, 0], np.float32)
    b = np.array([0, 0, 1, 1, 0, 0], np.float32)
    signals, labels = [], []
    for off in offsets:
        for shape, label in ((a, 0), (b, 1)):
            window = np.zeros((K, F), np.float32)
            window[:, 0] = shape + off  # the identity is a level shift of the channel
            signals.append(window)
            row = np.zeros(L, np.float32)
            row[label] = 1
            labels.append(row)
    return make_set(signals, labels)


def test_features_of_a_ramp_are_exact():
    ramp = np.tile(np.arange(K, dtype=np.float32)[:, None] * 2.0 + 1.0, (1, F))
    feats = summary_features(make_set([ramp], [np.zeros(L)])).reshape(F, len(FEATURE_NAMES))
    got = dict(zip(FEATURE_NAMES, feats[0], strict=False))
    assert got["start"] == 1.0 and got["end"] == 11.0 and got["change"] == 10.0
    assert got["min"] == 1.0 and got["max"] == 11.0
    assert got["mean"] == pytest.approx(6.0)
    assert got["std"] == pytest.approx(np.std(ramp[:, 0]))


def test_features_ignore_masked_frames():
    window = np.arange(K, dtype=np.float32)[:, None].repeat(F, 1)
    mask = np.ones((K, F), np.float32)
    mask[0] = 0.0  # first frame missing: start becomes 1, min becomes 1
    window[0] = 100.0  # garbage under the mask must not leak into any statistic
    feats = summary_features(make_set([window], [np.zeros(L)], [mask]))
    got = dict(zip(FEATURE_NAMES, feats.reshape(F, -1)[0], strict=False))
    assert got["start"] == 1.0 and got["min"] == 1.0 and got["max"] == 5.0
    assert got["mean"] == pytest.approx(3.0)
    assert np.isfinite(feats).all()


def test_vote_rule_needs_half_of_the_neighbours():
    neighbours = np.zeros((1, 4, 3), np.float32)
    neighbours[0, :1, 0] = 1  # 1 of 4
    neighbours[0, :2, 1] = 1  # 2 of 4: a tie activates
    neighbours[0, :3, 2] = 1  # 3 of 4
    assert knn_vote(neighbours).tolist() == [[0.0, 1.0, 1.0]]


def test_sequence_rag_is_exact_on_duplicated_training_points():
    rng = np.random.default_rng(1)
    base = rng.normal(size=(20, K, F)).astype(np.float32)
    labels = (rng.random((20, L)) > 0.5).astype(np.float32)
    train = make_set(np.repeat(base, 4, axis=0), np.repeat(labels, 4, axis=0))
    model = SequenceRAG().fit(train)
    assert np.array_equal(model.predict(make_set(base, labels)), labels)


def test_summary_rag_cannot_separate_order_only_classes_but_sequence_rag_can():
    train, test = order_pair_set([0.0, 0.1, 0.2, 0.3]), order_pair_set([0.05, 0.15])
    feats = summary_features(test)
    assert np.allclose(feats[0], feats[1])  # the two classes share every statistic
    summary = SummaryRAG().fit(train).predict(test)
    assert np.array_equal(summary[0], summary[1])  # identical memory -> identical answer
    assert micro_scores(test.labels, summary)["f1"] < 0.9
    assert micro_scores(test.labels, SequenceRAG().fit(train).predict(test))["f1"] == 1.0
    rf = RFSummary(n_estimators=20).fit(train).predict(test)
    assert np.array_equal(rf[0], rf[1])


def test_sequence_rag_matches_brute_force_knn():
    rng = np.random.default_rng(2)
    train = make_set(rng.normal(size=(300, K, F)), (rng.random((300, L)) > 0.7))
    queries = make_set(rng.normal(size=(40, K, F)), np.zeros((40, L)))
    model = SequenceRAG().fit(train)
    got = model.neighbours(queries)
    def z(s):
        return ((s - model._mu) / model._sigma).reshape(len(s), -1).astype(np.float64)
    dist = ((z(queries.signals)[:, None, :] - z(train.signals)[None]) ** 2).sum(-1)
    ref = np.argsort(dist, axis=1)[:, :4]
    for row in range(40):
        assert set(got[row]) == set(ref[row])
    expected = knn_vote(train.labels[ref])
    assert np.array_equal(model.predict(queries), expected)
    for row in range(5):
        assert np.array_equal(model.query_one(queries.signals[row]), expected[row])


def test_sequence_rag_uses_mask_only_when_data_has_gaps_and_bytes_grow_linearly():
    rng = np.random.default_rng(3)
    small = make_set(rng.normal(size=(100, K, F)), np.zeros((100, L)))
    large = make_set(rng.normal(size=(400, K, F)), np.zeros((400, L)))
    a, b = SequenceRAG().fit(small), SequenceRAG().fit(large)
    assert b.stored_bytes() - a.stored_bytes() == pytest.approx(300 * a.bytes_per_record())
    mask = np.ones((100, K, F), np.float32)
    mask[:, 0, 0] = 0
    gappy = SequenceRAG().fit(make_set(small.signals, small.labels, mask))
    assert gappy.bytes_per_record() > a.bytes_per_record()
    # the mask can be left out on purpose (Exp 1 indexes K*F values per window)
    plain = SequenceRAG(append_mask=False).fit(make_set(small.signals, small.labels, mask))
    assert plain.bytes_per_record() == a.bytes_per_record()
    assert plain.vectoriser.dim == K * F and gappy.vectoriser.dim == 2 * K * F


def test_rf_summary_learns_a_rule_that_summaries_do_show():
    rng = np.random.default_rng(4)

    def sample(n):
        slope = rng.choice([-1.0, 1.0], size=n)
        t = np.arange(K, dtype=np.float32)
        sig = slope[:, None, None] * t[None, :, None] + rng.normal(0, 0.1, size=(n, K, F))
        lab = np.zeros((n, L), np.float32)
        lab[:, 0] = slope > 0
        lab[:, 1] = slope < 0
        return make_set(sig, lab)

    test = sample(50)
    assert micro_scores(test.labels, RFSummary(n_estimators=30).fit(sample(100))
                        .predict(test))["f1"] == 1.0
    assert micro_scores(test.labels, SummaryRAG().fit(sample(100)).predict(test))["f1"] == 1.0


def test_last_frame_keeps_only_the_final_observation():
    rng = np.random.default_rng(5)
    data = make_set(rng.normal(size=(3, K, F)), np.ones((3, L)))
    cut = last_frame(data)
    assert cut.window == 1 and np.array_equal(cut.signals[:, 0], data.signals[:, -1])
    assert np.array_equal(cut.labels, data.labels)


def test_baselines_refuse_use_before_fit_and_bad_k():
    data = make_set(np.zeros((1, K, F)), np.zeros((1, L)))
    with pytest.raises(RuntimeError):
        SequenceRAG().predict(data)
    with pytest.raises(ValueError, match="k must be"):
        SummaryRAG(k=0)


def test_features_are_blind_to_the_order_of_intermediate_frames():
    rng = np.random.default_rng(3)
    window = rng.normal(size=(K, F)).astype(np.float32)
    shuffled = window.copy()
    shuffled[1:-1] = window[1:-1][rng.permutation(K - 2)]
    feats = summary_features(make_set([window, shuffled], [np.zeros(L), np.zeros(L)]))
    assert np.allclose(feats[0], feats[1])
