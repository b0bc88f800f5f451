"""``bench real``'s absent-signal measures on a toy-size world (the real code path, tiny sizes)."""

import numpy as np
import pytest
import torch

from thinkmem_ros.bench.real import _without, information_bound, per_label_drop
from thinkmem_ros.policy.training.train import train_policy
from thinkmem_ros.world.recipe import StreamRecipe


@pytest.fixture(scope="module")
def toy():
    torch.set_num_threads(1)
    data = StreamRecipe(duration=240.0, streams=2, stride=4, seed=3).windows()
    test = StreamRecipe(duration=120.0, streams=1, stride=4, seed=4).windows()
    trained = train_policy(data, "fast", seed=0, epochs=1, batch_size=128, patience=1,
                           progress=False)
    return data, test, trained


def test_without_masks_one_signal_everywhere_and_leaves_the_input_alone(toy):
    data, _, _ = toy
    column = data.signal_names.index("temperature")
    before = data.mask.copy()
    view = _without(data, column)
    assert view.mask[:, :, column].max() == 0.0 and view.signals[:, :, column].max() == 0.0
    others = [j for j in range(len(data.signal_names)) if j != column]
    np.testing.assert_array_equal(view.mask[:, :, others], data.mask[:, :, others])
    np.testing.assert_array_equal(data.mask, before)
    assert before[:, :, column].max() == 1.0


def test_information_bound_and_per_label_drop_report_every_label(toy):
    data, test, trained = toy
    drops = per_label_drop(trained, test, "temperature")
    assert set(drops) == set(test.label_names)
    assert all(-1.0 <= d <= 1.0 for d in drops.values())
    bound = information_bound(data, test, "temperature", seed=0, epochs=1)
    assert bound["absent_signal_trained_without_signal"] == "temperature"
    assert 0.0 <= bound["absent_signal_f1_trained_without"] <= 1.0
