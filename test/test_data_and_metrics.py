"""Shared containers and metrics that every benchmark's numbers rest on."""

import numpy as np
import pytest

from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.core.metrics import mean_std, micro_scores
from thinkmem_ros.core.vocabulary import SIGNALS, THINKING, label_index, signal_index


def _set(n=4, k=3, m=2):
    rng = np.random.default_rng(0)
    return SituationSet(signals=rng.normal(size=(n, k, len(SIGNALS))),
                        labels=rng.integers(0, 2, size=(n, len(THINKING))),
                        events=np.zeros((n, m), dtype=np.int64))


def test_situation_set_defaults_and_validation():
    data = _set()
    assert data.mask.shape == data.signals.shape and data.mask.min() == 1.0
    assert len(data) == 4 and data.window == 3
    with pytest.raises(ValueError, match="labels must be"):
        SituationSet(signals=np.zeros((2, 3, len(SIGNALS))), labels=np.zeros((3, 10)))
    with pytest.raises(ValueError, match="channels"):
        SituationSet(signals=np.zeros((2, 3, 2)), labels=np.zeros((2, 10)))


def test_concat_right_aligns_events_and_subset_keeps_rows():
    a = _set(m=1)
    b = _set(m=3)
    b.events[:] = 7
    both = SituationSet.concat([a, b])
    assert both.events.shape == (8, 3)
    assert (both.events[:4, :2] == 0).all() and (both.events[4:] == 7).all()
    sub = both.subset(np.array([4, 5]))
    assert len(sub) == 2 and (sub.events == 7).all()


def test_micro_scores_counts_cells():
    truth = np.array([[1, 0, 1], [0, 1, 0]])
    pred = np.array([[1, 1, 0], [0, 1, 0]])
    scores = micro_scores(truth, pred)
    assert scores["precision"] == pytest.approx(2 / 3)
    assert scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 / 3)
    assert micro_scores(np.zeros((2, 3)), np.zeros((2, 3)))["f1"] == 1.0
    with pytest.raises(ValueError):
        micro_scores(truth, pred[:1])


def test_mean_std_and_lookup_errors():
    assert mean_std([1.0, 3.0]) == {"mean": 2.0, "std": 1.0}
    assert signal_index("load") == len(SIGNALS) - 1
    with pytest.raises(ValueError, match="unknown signal 'torque'"):
        signal_index("torque")
    with pytest.raises(ValueError, match="unknown thinking label"):
        label_index("nap")


def test_per_row_meta_follows_subset_and_concat():
    data = _set(n=4)
    data.meta = {"rare": np.array([True, False, True, False]), "family": "x"}
    sub = data.subset(np.array([2, 3]))
    assert sub.meta["rare"].tolist() == [True, False] and sub.meta["family"] == "x"
    both = SituationSet.concat([data, sub])
    assert both.meta["rare"].tolist() == [True, False, True, False, True, False]
