"""Replaying a stream through the node's SituationBuffer: live staleness, vocabulary, truth."""

import numpy as np
import pytest

from thinkmem_ros.core.data import SignalStream
from thinkmem_ros.policy.bundle import load_bundle
from thinkmem_ros.policy.replay import ReplayConfig, predict_frames, replay_for, replay_stream
from thinkmem_ros.policy.runtime import PolicyRuntime


def _stream(n=40, rate=10.0, events=()):
    values = np.stack([np.arange(n, dtype=np.float32), 100 + np.arange(n, dtype=np.float32)], 1)
    labels = np.zeros((n, 2), np.float32)
    labels[np.arange(n) % 7 == 0, 1] = 1.0
    return SignalStream(rate_hz=rate, values=values, labels=labels, events=list(events),
                        label_names=("a", "b"), signal_names=("x", "y"))


def _replay(stream, **kw):
    cfg = kw.pop("config", None)
    args = dict(signals=("x", "y"), window=4, max_events=3, event_vocabulary=("e1", "e2"),
                frame_rate_hz=10.0)
    args.update(kw)
    return replay_stream(stream, config=cfg, **args)


def test_frames_hold_the_newest_samples_and_the_truth_of_the_frame_they_saw():
    stream = _stream()
    frames = _replay(stream)
    assert len(frames) == 40 - 3  # the first K-1 frames are warm-up
    assert frames.stream_frames[0] == 3 and frames.times_s[0] == pytest.approx(0.3)
    assert np.array_equal(frames.signals[0, :, 0], [0, 1, 2, 3])
    assert np.array_equal(frames.signals[-1, :, 1], 100 + np.arange(36, 40))
    assert frames.mask.min() == 1.0
    assert np.array_equal(frames.truth, stream.labels[frames.stream_frames])
    everything = _replay(stream, config=ReplayConfig(skip_warmup=False))
    assert len(everything) == 40 and everything.mask[0, :3].max() == 0.0


def test_a_short_dropout_keeps_the_last_value_a_long_one_is_masked():
    stream = _stream()
    stream.values[10:13, 0] = np.nan  # 0.3 s: within stale_after_s = 0.5, value held
    stream.values[20:30, 0] = np.nan  # 1.0 s: stale after 0.5 s, masked
    frames = _replay(stream)
    at = {int(f): i for i, f in enumerate(frames.stream_frames)}
    short = frames.signals[at[12], -1]
    assert short[0] == 9.0 and frames.mask[at[12], -1, 0] == 1.0  # held, not masked
    assert frames.mask[at[24], -1, 0] == 1.0  # 0.5 s since the last sample: still fresh
    assert frames.mask[at[25], -1, 0] == 0.0 and frames.signals[at[25], -1, 0] == 0.0
    assert frames.mask[at[25], -1, 1] == 1.0  # the other signal is unaffected
    assert frames.mask[at[30], -1, 0] == 1.0 and frames.signals[at[30], -1, 0] == 30.0
    # a signal the stream does not carry is never offered: always masked
    missing = _replay(stream, signals=("x", "y", "z"))
    assert missing.mask[:, :, 2].max() == 0.0


def test_unknown_events_never_take_a_slot_and_events_arrive_in_time():
    events = [(0.05, "e1"), (0.5, "zz"), (0.61, "e2"), (0.7, "zz"), (0.95, "e1")]
    frames = _replay(_stream(events=events))
    at = {int(f): i for i, f in enumerate(frames.stream_frames)}
    assert list(frames.events[at[5]]) == [0, 0, 1]
    assert list(frames.events[at[6]]) == [0, 0, 1]  # e2 at 0.61 s arrives after frame 0.6
    assert list(frames.events[at[7]]) == [0, 1, 2]
    assert list(frames.events[at[10]]) == [1, 2, 1]  # 'zz' was dropped, not kept in a slot
    horizon = _replay(_stream(events=events), config=ReplayConfig(event_horizon_s=0.5))
    assert list(horizon.events[at[10]]) == [0, 2, 1]  # e1 at 0.05 s expired at 1.0 s


def test_replay_config_names_the_bad_value():
    with pytest.raises(ValueError, match="stale_after_s"):
        ReplayConfig(stale_after_s=0)
    with pytest.raises(ValueError, match="frame_rate_hz"):
        ReplayConfig(frame_rate_hz=-1)


def test_bundle_replay_matches_predict_one_frame_by_frame(window_bundle):
    from thinkmem_ros.world.streams import generate_stream

    bundle = load_bundle(window_bundle)
    m = bundle.manifest
    stream = generate_stream("mixed", 8.0, m.frame_rate_hz, np.random.default_rng(3))
    frames = replay_for(stream, m)
    runtime = PolicyRuntime(bundle)
    assert not runtime.streaming
    probs = predict_frames(runtime, frames, batch=16)
    assert probs.shape == (len(frames), len(m.labels))
    for i in (0, len(frames) // 2, len(frames) - 1):
        one = runtime.predict_one(frames.signals[i], frames.mask[i], frames.events[i])
        assert np.allclose(one.probabilities[0], probs[i], atol=1e-5)
    other = replay_stream(stream, signals=tuple(m.signals), window=m.window,
                          max_events=m.max_events, event_vocabulary=("x",),
                          frame_rate_hz=m.frame_rate_hz)
    with pytest.raises(ValueError, match="another bundle"):
        predict_frames(runtime, other)


def test_a_streaming_bundle_is_replayed_through_its_per_frame_state():
    """Each stream starts from a reset and is stepped as the node steps it: the same answers
    whatever was replayed before, and the restart schedule (not a window replayed from the
    reset state every frame) decides them."""
    from pathlib import Path

    from thinkmem_ros.world.streams import generate_stream

    folder = Path(__file__).resolve().parent.parent / "models" / "default"
    bundle = load_bundle(folder)
    m = bundle.manifest
    assert m.streaming
    first, second = (replay_for(generate_stream("mixed", 12.0, m.frame_rate_hz,
                                                np.random.default_rng(s)), m) for s in (3, 4))
    runtime = PolicyRuntime(bundle)
    predict_frames(runtime, first)
    after_first = predict_frames(runtime, second)
    fresh = PolicyRuntime(bundle)
    node = np.stack([fresh.predict_frame(second.signals[j], second.mask[j], second.events[j],
                                         t=float(second.times_s[j])).probabilities[0]
                     for j in range(len(second))])
    assert np.allclose(after_first, node, atol=1e-6)
    assert runtime.stream_resets["start"] >= 2
    windows = runtime.predict(second.signals, second.mask, second.events).probabilities
    assert np.allclose(windows[0], node[0], atol=1e-4)  # right after the reset: the window
    assert np.abs(windows - node).max() > 1e-3  # later: states restarted half a period apart
