"""Training: learning works, splits never leak a group, runs are seeded."""

import numpy as np
import pytest
import torch

from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.policy.config import PolicyConfig
from thinkmem_ros.policy.training.train import (
    evaluate,
    signal_statistics,
    split_by_group,
    train_policy,
    tune_thresholds,
)

K = 8
TINY = PolicyConfig(window=K, n_signals=7, n_labels=10, d_model=16, n_layers=1, n_heads=2,
                    d_ff=32, max_events=1, n_event_vocab=0, dropout=0.0)


def separable(n: int, rng: np.random.Generator) -> SituationSet:
    """Order-dependent labels: rising vs falling temperature, late current step, raw scale."""
    signals = rng.normal(scale=0.2, size=(n, K, 7)).astype(np.float32)
    signals[:, :, 0] += 40.0
    direction = rng.choice([-1.0, 1.0], size=n)
    signals[:, :, 0] += direction[:, None] * np.linspace(0.0, 4.0, K)
    late = rng.random(n) < 0.4
    signals[late, -2:, 1] += 3.0
    labels = np.zeros((n, 10), np.float32)
    labels[:, 0] = direction > 0
    labels[:, 1] = direction < 0
    labels[:, 8] = late
    return SituationSet(signals, labels, groups=np.arange(n) // 8)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    torch.set_num_threads(1)


def test_tiny_policy_learns_a_separable_set():
    data = separable(480, np.random.default_rng(0))
    test = separable(200, np.random.default_rng(1))
    trained = train_policy(data, TINY, epochs=12, batch_size=32, lr=5e-3, progress=False)
    assert trained.val_metrics["micro_f1"] >= 0.95
    assert evaluate(trained, test)["f1"] >= 0.95
    losses = [row["train_loss"] for row in trained.history]
    assert losses[-1] < 0.5 * losses[0]


def test_same_seed_same_weights_other_seed_other_weights():
    data = separable(96, np.random.default_rng(2))
    kwargs = dict(epochs=1, batch_size=32, progress=False)
    a = train_policy(data, TINY, seed=5, **kwargs).model.head.weight
    b = train_policy(data, TINY, seed=5, **kwargs).model.head.weight
    c = train_policy(data, TINY, seed=6, **kwargs).model.head.weight
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_split_never_puts_one_group_on_both_sides():
    groups = np.repeat(np.arange(30), np.random.default_rng(3).integers(1, 9, size=30))
    train, val = split_by_group(groups, 0.2, np.random.default_rng(4))
    assert set(groups[train]).isdisjoint(groups[val])
    assert len(train) + len(val) == len(groups) and len(val) >= 0.2 * len(groups)
    with pytest.raises(ValueError, match="at least 2 distinct groups"):
        split_by_group(np.zeros(10, np.int64), 0.2, np.random.default_rng(0))


def test_normalisation_ignores_masked_entries():
    signals = np.full((4, K, 7), 10.0, np.float32)
    mask = np.ones_like(signals)
    mask[:2] = 0.0
    signals[:2] = 0.0
    mean, std = signal_statistics(SituationSet(signals, np.zeros((4, 10)), mask=mask))
    np.testing.assert_allclose(mean, 10.0)
    np.testing.assert_allclose(std, 1.0)  # constant signal: floored to 1, never 0


def test_threshold_tuning_moves_tau_towards_the_separating_value():
    probs = np.array([[0.1], [0.2], [0.3], [0.35], [0.9]])
    truth = np.array([[0], [0], [1], [1], [1]], dtype=np.float32)
    tau = tune_thresholds(probs, truth, ("trend",))["trend"]
    assert 0.2 < tau <= 0.3
    assert tune_thresholds(probs, np.zeros_like(truth), ("trend",)) == {"trend": 0.5}


def test_bad_training_input_is_refused():
    data = separable(32, np.random.default_rng(5))
    with pytest.raises(ValueError, match="PolicyConfig.window=9 does not match the data"):
        train_policy(data, PolicyConfig(**{**TINY.to_dict(), "window": 9}), progress=False)
    data.signals[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN/inf"):
        train_policy(data, TINY, progress=False)
