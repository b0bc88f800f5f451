"""Retraining as torch DDP over Ray Train workers on a real local Ray instance."""

from dataclasses import replace

import consolidator_world as world
import numpy as np
import pytest
import torch

from thinkmem_ros.consolidator.retrain import RetrainConfig, assemble, retrain
from thinkmem_ros.policy.bundle import load_bundle


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_two_ddp_workers_take_the_steps_one_process_takes(local_ray, tmp_path):
    from thinkmem_ros.consolidator.retrain_ray import retrain_on_ray

    torch.set_num_threads(1)
    current = load_bundle(world.running_bundle(tmp_path / "running"))
    records = [replace(e, seq=i) for i, e in enumerate(world.experiences("r1", 40, 5, seed=1))]
    cfg = RetrainConfig(epochs=3, seed=4)
    material = assemble(records, [], current, cfg)
    alone = retrain(material, current, cfg)
    ddp = retrain_on_ray(material, current, cfg, workers=2, storage=tmp_path / "ray")
    assert ddp.history[0]["ray_train_workers"] == 2
    assert [r["epoch"] for r in ddp.history[1:]] == [r["epoch"] for r in alone.history[1:]]
    # each step's gradient is the whole batch's, summed in another order: weights agree
    # to float precision, and moved away from the warm start the same way
    a, b = alone.model.state_dict(), ddp.model.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], atol=2e-4, rtol=1e-3), key
    assert ddp.thresholds == alone.thresholds
    assert np.isclose(ddp.history[-1]["val_loss"], alone.history[-1]["val_loss"], rtol=1e-3)
