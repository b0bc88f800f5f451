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


@pytest.fixture
def seeds_run(monkeypatch):
    """``real.run`` with both parts replaced by stubs that note the seeds they were given."""
    from thinkmem_ros.bench import real

    given = []

    def recording(seeds, **_kwargs):
        given.append(seeds)
        return {"per_label_f1_holdout": {}, "f1_holdout": 0.0, "f1_holdout_std": 0.0}

    monkeypatch.setattr(real, "real_recording", recording)
    monkeypatch.setattr(real, "absent_signals",
                        lambda quick, **_k: {"absent_signal_f1_drop_per_signal": {}})
    return real, given


def test_an_explicit_seed_count_is_honoured_with_quick(seeds_run):
    real, given = seeds_run
    assert real.run(quick=True, seeds=5)["config"]["seeds"] == 5
    assert real.run(quick=True)["config"]["seeds"] == 1
    assert real.run()["config"]["seeds"] == 3
    assert given == [5, 1, 3]


def test_the_command_runs_real_with_its_own_defaults_and_reports_them(seeds_run, capsys):
    """3 seeds (1 with --quick), what docs/results/real.json and the README's figure used."""
    import argparse
    import json

    from thinkmem_ros.commands.bench import main

    real, given = seeds_run
    for quick, seeds in ((False, None), (True, None), (True, 5)):
        args = argparse.Namespace(name="real", quick=quick, seeds=seeds, json_path=None,
                                  plot_path=None, bundle=None, preset=None)
        assert main(args) == 0
        assert json.loads(capsys.readouterr().out)["experiment"] == "real"
    assert given == [3, 1, 5]


@pytest.mark.parametrize("name", ["faults", "fleet"])
def test_seeds_given_to_a_benchmark_that_runs_each_case_once_are_refused(name, monkeypatch):
    """faults and fleet ran once whatever --seeds said, and the report said it had run N."""
    import argparse

    from thinkmem_ros.bench import load
    from thinkmem_ros.commands.bench import main

    module = load(name)
    monkeypatch.setattr(module, "run", lambda **_k: pytest.fail("the run started"))
    args = argparse.Namespace(name=name, quick=True, seeds=3, json_path=None,
                              plot_path=None, bundle=None, preset=None)
    with pytest.raises(SystemExit) as refused:
        main(args)
    assert "--seeds does not apply" in str(refused.value)
    assert "\n" not in str(refused.value)
