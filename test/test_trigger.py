"""The consolidation trigger fires on each of the paper's four conditions and not before."""

import pytest

from thinkmem_ros.consolidator.trigger import ConsolidationTrigger, TriggerConfig


class FakeClock:
    """A settable clock so the period condition is tested without sleeping."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _trigger(**cfg):
    clock = FakeClock()
    return ConsolidationTrigger(TriggerConfig(**cfg), clock=clock), clock


def test_nothing_fires_without_new_experience():
    trig, clock = _trigger(period_s=1.0)
    clock.now = 100.0
    assert trig.reason() is None


def test_buffer_limit_fires_and_resets():
    trig, _ = _trigger(buffer_limit=3, buffer_capacity=5)
    for i in range(2):
        trig.observe(i)
    assert trig.reason() is None
    trig.observe(2)
    assert trig.reason() == "buffer"
    trig.consolidated()
    assert trig.reason() is None
    assert list(trig.buffer) == [0, 1, 2]


def test_period_novelty_and_failures():
    trig, clock = _trigger(period_s=10.0, novelty_count=2, failure_count=3)
    trig.observe("a")
    clock.now = 9.9
    assert trig.reason() is None
    clock.now = 10.0
    assert trig.reason() == "period"
    trig.consolidated()
    trig.observe("b", novelty=0.9)
    trig.observe("c", novelty=0.9)
    assert trig.reason() == "novelty"
    trig.consolidated()
    for r in (-1.0, -1.0, 1.0, -1.0, -1.0):
        trig.observe("d", reward=r)
    assert trig.reason() is None  # the success in the middle broke the run
    trig.observe("e", reward=-0.5)
    assert trig.reason() == "failure"


def test_buffer_is_bounded():
    trig, _ = _trigger(buffer_limit=2, buffer_capacity=4)
    for i in range(10):
        trig.observe(i)
    assert list(trig.buffer) == [6, 7, 8, 9]


def test_invalid_config_names_field():
    with pytest.raises(ValueError, match="period_s"):
        TriggerConfig(period_s=0)
    with pytest.raises(ValueError, match="buffer_limit"):
        TriggerConfig(buffer_limit=10, buffer_capacity=5)
