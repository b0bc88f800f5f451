"""Scenario families: determinism, shapes and the matched statistics each experiment needs."""

import numpy as np
import pytest

from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
from thinkmem_ros.world import families
from thinkmem_ros.world.families import (
    FAMILIES,
    order_only,
    order_only_split,
    rare_onset,
    rare_onset_split,
    same_final_state,
)

TEMP = SIGNALS.index("temperature")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_is_deterministic_and_well_formed(name):
    kw = {"window": 32} if name == "mixed_windows" else {}
    a = FAMILIES[name](60, np.random.default_rng(7), **kw)
    b = FAMILIES[name](60, np.random.default_rng(7), **kw)
    c = FAMILIES[name](60, np.random.default_rng(8), **kw)
    assert a.signals.shape[0] == 60 and a.signals.shape[2] == len(SIGNALS)
    assert a.labels.shape == (60, len(THINKING))
    assert np.array_equal(a.signals, b.signals) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.signals, c.signals)
    assert np.isfinite(a.signals).all()
    assert set(np.unique(a.labels)) <= {0.0, 1.0}
    assert FAMILIES[name].__doc__ and "Hidden rule" in FAMILIES[name].__doc__


def test_order_only_classes_share_every_summary_statistic():
    data = order_only(240, np.random.default_rng(1), identities=[3, 11, 2024], window=12)
    temps = data.signals[:, :, TEMP].astype(np.float64)
    classes = data.meta["classes"]
    for ident in (3, 11, 2024):
        rows = np.flatnonzero(data.groups == ident)
        assert len(set(classes[rows])) == len(families.ORDER_CLASSES)
        ref = temps[rows[0]]
        for r in rows[1:]:
            x = temps[r]
            assert x[0] == pytest.approx(ref[0], abs=1e-6)
            assert x[-1] == pytest.approx(ref[-1], abs=1e-6)
            np.testing.assert_allclose(np.sort(x[1:-1]), np.sort(ref[1:-1]), atol=1e-6)
            assert x.mean() == pytest.approx(ref.mean(), abs=1e-6)
            assert x.std() == pytest.approx(ref.std(), abs=1e-6)
    # ...yet the sequences of different classes differ, and equal classes are equal
    for ident in (3, 11, 2024):
        rows = np.flatnonzero(data.groups == ident)
        seqs = {}
        for r in rows:
            seqs.setdefault(int(classes[r]), set()).add(temps[r].round(4).tobytes())
        assert all(len(s) == 1 for s in seqs.values())
        assert len(set().union(*seqs.values())) == len(families.ORDER_CLASSES)


def test_order_only_labels_follow_the_class_table_with_overlap():
    data = order_only(120, np.random.default_rng(2))
    counts = data.labels.sum(axis=1)
    assert counts.min() >= 2 and counts.max() <= 3
    per_class = {int(c): tuple(data.labels[i]) for i, c in enumerate(data.meta["classes"])}
    assert len(set(per_class.values())) == len(families.ORDER_CLASSES)
    per_label = np.array(list(per_class.values())).sum(axis=0)
    assert per_label.max() >= 2  # classes overlap, so no label alone names a class


def test_identity_ranges_differ_between_identities():
    a = families.identity_profile(1, 10)
    b = families.identity_profile(2, 10)
    assert a[2].mean() != pytest.approx(b[2].mean())
    assert families.identity_profile(1, 10)[0] == a[0]


def test_order_only_split_uses_disjoint_identities():
    train, test = order_only_split(300, 100, np.random.default_rng(3), n_train_ids=10,
                                   n_test_ids=5)
    assert len(train) == 300 and len(test) == 100
    assert len(set(train.groups)) == 10 and len(set(test.groups)) == 5
    assert not set(train.groups) & set(test.groups)


def test_summary_features_cannot_separate_order_classes():
    # aggregate features per channel, as Summary-RAG / RF-Summary see them
    data = order_only(300, np.random.default_rng(4), identities=[5, 6, 7])
    temps = data.signals[:, :, TEMP]
    feats = np.stack([temps.mean(1), temps.std(1), temps.min(1), temps.max(1),
                      temps[:, 0], temps[:, -1]], axis=1)
    for ident in (5, 6, 7):
        rows = data.groups == ident
        assert np.ptp(feats[rows], axis=0).max() < 1e-4


def test_same_final_state_pairs_end_on_identical_frames():
    data = same_final_state(90, np.random.default_rng(5))
    classes = data.meta["classes"]
    rising = np.flatnonzero(classes == 0)
    falling = np.flatnonzero(classes == 1)
    assert len(rising) == len(falling) == 30
    for r in rising:
        partner = falling[data.groups[falling] == data.groups[r]]
        assert len(partner) == 1
        assert np.array_equal(data.signals[r, -1], data.signals[partner[0], -1])
        # ...but they got there from opposite directions
        assert data.signals[r, 0, TEMP] < data.signals[r, -1, TEMP] - 5
        assert data.signals[partner[0], 0, TEMP] > data.signals[r, -1, TEMP] + 5
    assert not np.array_equal(data.labels[rising[0]], data.labels[falling[0]])


def test_same_final_state_leaks_nothing_through_the_last_step():
    # the shared last frame must not create a jump that only one history shows
    data = same_final_state(600, np.random.default_rng(8))
    classes = data.meta["classes"]
    step = np.abs(data.signals[:, -1] - data.signals[:, -2])  # (N, F)
    others = [SIGNALS.index(s) for s in ("vibration", "distance", "visibility", "load")]
    for col in others:
        rising = step[classes == 0, col].mean()
        falling = step[classes == 1, col].mean()
        assert falling < 2.0 * rising + 1e-6


def test_rare_onset_history_keeps_the_pattern_rare():
    small = rare_onset(100, np.random.default_rng(6), rare_fraction=0.01)
    assert small.meta["rare"].sum() == 2
    big = rare_onset(1000, np.random.default_rng(6), rare_fraction=0.05)
    assert big.meta["rare"].sum() == 50
    late = THINKING.index("late_change_inspection")
    assert np.array_equal(big.labels[:, late] > 0, big.meta["rare"])
    # rare rows are quiet in the first 2/3 and steep at the end
    rare = big.signals[big.meta["rare"], :, TEMP]
    assert np.ptp(rare[:, :20], axis=1).max() < 6.0
    assert (rare[:, -1] - rare[:, 20] > 15).all()


def test_rare_onset_split_mixes_the_test_set():
    train, test = rare_onset_split(250, 101, np.random.default_rng(7), rare_fraction=0.05)
    assert train.meta["rare"].mean() == pytest.approx(0.05, abs=0.01)
    assert test.meta["rare"].sum() == 51 and len(test) == 101
    assert not set(train.groups) & set(test.groups)
