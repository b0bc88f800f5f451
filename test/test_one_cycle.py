"""The learning-rate schedule survives runs of a handful of steps (a small round)."""

import pytest
import torch

from thinkmem_ros.policy.training.train import ONE_CYCLE_MIN_STEPS, one_cycle


@pytest.mark.parametrize("steps", [1, 2, 5, ONE_CYCLE_MIN_STEPS - 1])
def test_a_short_run_keeps_the_base_rate(steps):
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.01)
    schedule = one_cycle(opt, 0.01, steps)  # OneCycleLR raised ZeroDivisionError here
    for _ in range(steps):
        opt.step()
        schedule.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)


def test_a_long_run_warms_up_and_anneals():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.01)
    schedule = one_cycle(opt, 0.01, 100)
    rates = []
    for _ in range(99):
        opt.step()
        schedule.step()
        rates.append(opt.param_groups[0]["lr"])
    assert max(rates) == pytest.approx(0.01, rel=1e-3) and rates[-1] < 1e-4
