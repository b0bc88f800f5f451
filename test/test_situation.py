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


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e39, -3.5e38])
def test_non_finite_samples_are_dropped_and_counted(bad):  # > float32 max: inf in the window
    buf = make()
    buf.offer(0, 3.0, now=0.0)
    assert buf.offer(0, bad, now=0.1) is Verdict.INVALID
    frame = buf.assemble(now=0.2)
    assert frame.signals[-1, 0] == 3.0 and np.isfinite(frame.signals).all()
    assert buf.snapshot().invalid["a"] == 1


def test_duplicate_and_out_of_order_stamps_never_move_the_window_back():
    buf = make()
    assert buf.offer(0, 1.0, now=10.0, stamp=10.0) is Verdict.ACCEPTED
    assert buf.offer(0, 2.0, now=10.1, stamp=10.0) is Verdict.DUPLICATE
    assert buf.offer(0, 3.0, now=10.2, stamp=9.0) is Verdict.OUT_OF_ORDER
    assert buf.assemble(now=10.3).signals[-1, 0] == 1.0
    assert buf.offer(0, 4.0, now=10.4, stamp=11.0) is Verdict.ACCEPTED
    frame = buf.assemble(now=10.5)
    assert frame.signals[-1, 0] == 4.0 and frame.inputs_stamp == 11.0
    counters = buf.snapshot()
    counts = (counters.duplicate["a"], counters.out_of_order["a"], counters.accepted["a"])
    assert counts == (1, 1, 2)


def test_stamps_that_restart_without_a_clock_jump_start_a_new_timeline():
    """A bag looped without --clock: wall-clock 'now' runs on, the stamps go back."""
    buf = make(stale=0.5)
    for i in range(10):  # first pass, stamps 1000.0 .. 1000.9
        assert buf.offer(0, 1.0, now=5000.0 + 0.1 * i, stamp=1000.0 + 0.1 * i) \
            is Verdict.ACCEPTED
    verdicts = [buf.offer(0, 2.0, now=5001.0 + 0.1 * i, stamp=1000.0 + 0.1 * i)
                for i in range(12)]  # second pass from 1000.0: refused while a is fresh
    first = verdicts.index(Verdict.ACCEPTED)
    assert set(verdicts[:first]) == {Verdict.OUT_OF_ORDER}
    assert set(verdicts[first:]) == {Verdict.ACCEPTED}
    assert 0.1 + 0.1 * first > 0.5  # taken only once the old timeline went stale
    frame = buf.assemble(now=5002.2)
    assert frame.mask[-1, 0] == 1.0 and frame.signals[-1, 0] == 2.0
    counters = buf.snapshot()
    assert counters.stamp_restarts == {"a": 1, "b": 0, "c": 0}
    assert counters.out_of_order["a"] == first and counters.time_jumps == 0


def test_stray_old_samples_never_restart_a_signals_timeline():
    buf = make(stale=0.5)
    assert buf.offer(0, 1.0, now=1000.0, stamp=100.0) is Verdict.ACCEPTED
    # long after a went stale: two stray old samples, and three that do not move forward
    assert buf.offer(0, 9.0, now=1010.0, stamp=50.0) is Verdict.OUT_OF_ORDER
    assert buf.offer(0, 9.0, now=1010.1, stamp=50.1) is Verdict.OUT_OF_ORDER
    for stamp in (49.0, 48.0, 47.0):
        assert buf.offer(0, 9.0, now=1010.2, stamp=stamp) is Verdict.OUT_OF_ORDER
    assert buf.offer(0, 3.0, now=1010.3, stamp=100.1) is Verdict.ACCEPTED  # the real one
    assert buf.offer(0, 9.0, now=1010.4, stamp=99.0) is Verdict.OUT_OF_ORDER  # fresh again
    assert buf.snapshot().stamp_restarts["a"] == 0


def test_a_far_future_stamp_is_refused_and_never_blinds_the_signal():
    buf = make()
    assert buf.offer(0, 1.0, now=100.0, stamp=100.0) is Verdict.ACCEPTED
    assert buf.offer(0, 9.0, now=100.1, stamp=2_145_916_800.0) is Verdict.FUTURE  # 2038
    assert buf.offer(0, 9.0, now=100.1, stamp=math.nan) is Verdict.FUTURE
    for i in range(1, 6):  # genuine samples keep coming in afterwards
        assert buf.offer(0, 1.0 + i, now=100.0 + 0.1 * i, stamp=100.0 + 0.1 * i) \
            is Verdict.ACCEPTED
    frame = buf.assemble(now=100.55)
    assert frame.signals[-1, 0] == 6.0 and frame.mask[-1, 0] == 1.0
    counters = buf.snapshot()
    assert counters.future["a"] == 2 and counters.out_of_order["a"] == 0
    # within the tolerance (a sensor clock slightly ahead) is still fine
    assert buf.offer(0, 7.0, now=101.0, stamp=101.9) is Verdict.ACCEPTED


def test_old_stamps_stay_legitimate():
    buf = make()  # a recording played without sim time: stamps years behind the clock
    for i in range(5):
        assert buf.offer(0, float(i), now=1.8e9 + 0.1 * i, stamp=1.7e9 + 0.1 * i) \
            is Verdict.ACCEPTED
    assert buf.snapshot().future["a"] == 0


def test_a_backward_clock_step_resets_the_window_cleanly():
    buf = make(stale=0.5)
    for t in range(10):  # first pass of a looped bag, sim time 50.0 .. 50.9
        now = 50.0 + 0.1 * t
        buf.offer(0, 1.0, now=now, stamp=now)
        buf.offer_event("x", now=now)
        buf.assemble(now=now)
    # the loop restarts: clock and stamps go back to 50.0
    assert buf.offer(0, 2.0, now=50.0, stamp=50.0) is Verdict.ACCEPTED
    frame = buf.assemble(now=50.05)
    assert frame.signals[-1, 0] == 2.0 and frame.mask[-1, 0] == 1.0
    assert frame.mask[:-1].sum() == 0, "rows of the abandoned timeline must be gone"
    assert frame.events.tolist() == [0, 0, 0]
    assert frame.stale == ("b", "c")
    counters = buf.snapshot()
    assert counters.time_jumps == 1 and counters.out_of_order["a"] == 0


def test_reset_time_forgets_clock_readings_so_dead_signals_go_stale():
    buf = make(stale=0.5)
    buf.offer(1, 3.0, now=80.0)
    buf.reset_time(now=20.0)  # the node's jump callback, before any new sample
    frame = buf.assemble(now=20.1)  # b was heard at 80.0, "in the future": must not be fresh
    assert frame.mask[-1].sum() == 0 and frame.stale == SIGNALS
    assert buf.snapshot().time_jumps == 1
    buf.assemble(now=20.05)  # jitter below JUMP_BACK_S is no jump
    assert buf.snapshot().time_jumps == 1


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
    buf.assemble(now=2.0)
    assert not buf.complete(now=2.0)  # nothing new since the frame
    for value in (3.0, 4.0):  # one signal twice still leaves the other fresh ones awaited
        buf.offer(0, value, now=2.0)
        buf.offer(1, value, now=2.0)
    buf.offer(2, 3.0, now=2.0)
    buf.assemble(now=2.0)
    buf.offer(0, 5.0, now=2.1)
    buf.offer(0, 6.0, now=2.1)
    buf.offer(1, 5.0, now=2.1)
    assert not buf.complete(now=2.1)
    buf.reset_time(now=0.0)  # a clock jump forgets what was new
    assert not buf.complete(now=0.0)


def test_last_arrival_is_newest_sample_of_the_frame():
    buf = make()
    buf.offer(0, 1.0, now=0.0, arrival=100.0)
    buf.offer(1, 1.0, now=0.0, arrival=100.5)
    assert buf.assemble(now=0.1).last_arrival == 100.5
    assert buf.assemble(now=0.2).last_arrival is None  # nothing new since


@pytest.mark.parametrize("kwargs, key", [
    ({"window": 0}, "window"), ({"stale_after_s": 0.0}, "stale_after_s"),
    ({"max_events": 0}, "max_events"), ({"signals": ()}, "signals"),
    ({"signals": ("a", "a")}, "duplicates"), ({"event_horizon_s": -1.0}, "event_horizon_s"),
    ({"future_tolerance_s": 0.0}, "future_tolerance_s")])
def test_config_validation_names_the_key(kwargs, key):
    base = {"signals": SIGNALS, "window": 2, "stale_after_s": 0.5}
    with pytest.raises(ValueError, match=key):
        BufferConfig(**{**base, **kwargs})
