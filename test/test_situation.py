import math

import numpy as np
import pytest

from thinkmem_ros.policy.situation import BufferConfig, SituationBuffer, Verdict

SIGNALS = ("a", "b", "c")


def make(window=4, stale=0.5, max_events=3, vocab=("x", "y", "z"), horizon=0.0):
    return SituationBuffer(BufferConfig(SIGNALS, window, stale, max_events, vocab, horizon))


def test_frame_uses_latest_sample_and_fills_window_oldest_first():
    buf = make()
    for t in range(6):
        for i in range(3):
            buf.offer(i, 10.0 * i + t, now=t + 0.01 * i)
        frame = buf.assemble(now=t + 0.1)
    assert frame.seq == 6
    assert frame.signals.shape == (4, 3) and frame.mask.shape == (4, 3)
    np.testing.assert_allclose(frame.signals[:, 0], [2, 3, 4, 5])  # last K frames, oldest first
    np.testing.assert_allclose(frame.signals[-1], [5, 15, 25])
    assert frame.mask.min() == 1.0 and frame.stale == ()


def test_rows_before_the_window_fills_are_masked():
    buf = make()
    buf.offer(0, 1.0, now=0.0)
    frame = buf.assemble(now=0.1)
    assert frame.mask[:3].sum() == 0 and frame.signals[:3].sum() == 0
    np.testing.assert_array_equal(frame.mask[-1], [1, 0, 0])
    assert frame.stale == ("b", "c")


def test_stale_signal_is_masked_and_counted_not_reused():
    buf = make(stale=0.5)
    buf.offer(0, 7.0, now=0.0)
    buf.offer(1, 8.0, now=0.0)
    assert buf.assemble(now=0.4).mask[-1, 0] == 1.0
    buf.offer(1, 9.0, now=0.9)
    frame = buf.assemble(now=1.0)  # signal a last heard at 0.0 -> 1.0 s old
    assert frame.mask[-1, 0] == 0.0 and frame.signals[-1, 0] == 0.0
    assert frame.signals[-1, 1] == 9.0
    assert "a" in frame.stale and "b" not in frame.stale
    counters = buf.snapshot()
    assert counters.stale_frames["a"] == 1 and counters.stale_frames["c"] == 2
    # fresh again once a new sample arrives
    buf.offer(0, 1.5, now=1.05)
    assert buf.assemble(now=1.1).mask[-1, 0] == 1.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_samples_are_dropped_and_counted(bad):
    buf = make()
    buf.offer(0, 3.0, now=0.0)
    assert buf.offer(0, bad, now=0.1) is Verdict.INVALID
    frame = buf.assemble(now=0.2)
    assert frame.signals[-1, 0] == 3.0 and np.isfinite(frame.signals).all()
    assert buf.snapshot().invalid["a"] == 1


def test_duplicate_and_out_of_order_stamps_never_move_the_window_back():
    buf = make()
    assert buf.offer(0, 1.0, now=0.0, stamp=10.0) is Verdict.ACCEPTED
    assert buf.offer(0, 2.0, now=0.1, stamp=10.0) is Verdict.DUPLICATE
    assert buf.offer(0, 3.0, now=0.2, stamp=9.0) is Verdict.OUT_OF_ORDER
    assert buf.assemble(now=0.3).signals[-1, 0] == 1.0
    assert buf.offer(0, 4.0, now=0.4, stamp=11.0) is Verdict.ACCEPTED
    frame = buf.assemble(now=0.5)
    assert frame.signals[-1, 0] == 4.0 and frame.inputs_stamp == 11.0
    counters = buf.snapshot()
    counts = (counters.duplicate["a"], counters.out_of_order["a"], counters.accepted["a"])
    assert counts == (1, 1, 2)


def test_unstamped_samples_follow_arrival_order():
    buf = make()
    buf.offer(1, 5.0, now=0.0)
    buf.offer(1, 4.0, now=0.0)  # same clock reading (sim time step) is not a duplicate
    assert buf.assemble(now=0.1).signals[-1, 1] == 4.0
    assert buf.snapshot().duplicate["b"] == 0


def test_event_history_keeps_last_m_in_order_right_aligned():
    buf = make(max_events=3)
    assert buf.assemble(now=0.0).events.tolist() == [0, 0, 0]
    buf.offer_event("y", now=0.1)
    assert buf.assemble(now=0.2).events.tolist() == [0, 0, 2]
    for name in ("x", "z", "x"):
        buf.offer_event(name, now=0.3)
    assert buf.offer_event("nope", now=0.4) is Verdict.UNKNOWN_EVENT
    assert buf.assemble(now=0.5).events.tolist() == [1, 3, 1]
    assert buf.snapshot().unknown_events == 1


def test_event_horizon_expires_old_events_and_vocabulary_remaps_by_name():
    buf = make(horizon=1.0)
    buf.offer_event("x", now=0.0)
    buf.offer_event("z", now=0.8)
    assert buf.assemble(now=1.5).events.tolist() == [0, 0, 3]
    buf.set_event_vocabulary(("z", "x"))
    assert buf.assemble(now=1.6).events.tolist() == [0, 0, 1]


def test_complete_waits_for_every_fresh_signal():
    buf = make(stale=0.5)
    buf.offer(0, 1.0, now=0.0)
    assert buf.complete(now=0.0)  # b and c never heard: stale, so not awaited
    buf.offer(1, 1.0, now=0.0)
    buf.offer(2, 1.0, now=0.0)
    assert buf.complete(now=0.01)
    buf.assemble(now=0.01)
    buf.offer(0, 2.0, now=0.02)
    assert not buf.complete(now=0.02)
    buf.offer(1, 2.0, now=0.03)
    assert not buf.complete(now=0.03)
    buf.offer(2, 2.0, now=0.04)
    assert buf.complete(now=0.04)
    assert buf.complete(now=2.0)  # all stale but updated -> nothing left to wait for


def test_last_arrival_is_newest_sample_of_the_frame():
    buf = make()
    buf.offer(0, 1.0, now=0.0, arrival=100.0)
    buf.offer(1, 1.0, now=0.0, arrival=100.5)
    assert buf.assemble(now=0.1).last_arrival == 100.5
    assert buf.assemble(now=0.2).last_arrival is None  # nothing new since


@pytest.mark.parametrize("kwargs, key", [
    ({"window": 0}, "window"), ({"stale_after_s": 0.0}, "stale_after_s"),
    ({"max_events": 0}, "max_events"), ({"signals": ()}, "signals"),
    ({"signals": ("a", "a")}, "duplicates"), ({"event_horizon_s": -1.0}, "event_horizon_s")])
def test_config_validation_names_the_key(kwargs, key):
    base = {"signals": SIGNALS, "window": 2, "stale_after_s": 0.5}
    with pytest.raises(ValueError, match=key):
        BufferConfig(**{**base, **kwargs})
