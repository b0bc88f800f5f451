"""ExperienceBuilder: feedback matching, the pending window, thinning and episode rotation."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from thinkmem_ros.link.experience import decode_experience, encode_experience
from thinkmem_ros.robot.activation import FrameResult
from thinkmem_ros.robot.experience_builder import (
    MAX_EPISODE_N_DIGITS,
    MAX_ROBOT_ID_CHARS,
    BuilderConfig,
    ExperienceBuilder,
    Feedback,
    FeedbackError,
    parse_feedback,
)

LABELS = ("trend", "hazard", "consider:C")
PERIOD = 0.1  # 10 Hz frames


def frame(stamp: float, seq: int = 0, k: int = 4, f: int = 3) -> FrameResult:
    signals = np.arange(k * f, dtype=np.float32).reshape(k, f) + stamp
    mask = np.ones((k, f), np.float32)
    mask[0, 1] = 0.0
    signals[0, 1] = np.nan  # a masked cell may hold anything; the record must carry 0
    return FrameResult(
        seq=seq, stamp=stamp, signals=signals, mask=mask, events=np.zeros(2, np.int64),
        labels=LABELS, probabilities=np.array([0.9, 0.1, 0.5], np.float32),
        active=("trend",), embedding=np.zeros(4, np.float32), inference_us=100.0,
        latency_us=None, bundle_version=3, bundle_sha256="a" * 64, stale=(),
        inputs_stamp=None)


def make(**kw) -> tuple[ExperienceBuilder, list]:
    shipped: list = []
    cfg = dict(robot_id="bot", frame_period_s=PERIOD, feedback_window_s=1.0)
    cfg.update(kw)
    return ExperienceBuilder(BuilderConfig(**cfg), lambda e: shipped.append(e) or True,
                             boot_id="77"), shipped


def test_frames_wait_for_the_window_then_ship_as_valid_records():
    builder, shipped = make()
    for i in range(5):
        builder.add_frame(frame(10.0 + i * PERIOD, seq=i), now=100.0 + i * PERIOD)
    assert builder.release(now=100.5) == 0 and not shipped  # nobody held 1 s yet
    assert builder.release(now=101.15) == 2  # frames that arrived at 100.0 and 100.1
    assert builder.release(now=200.0) == 3
    exp = shipped[0]
    assert exp.robot_id == "bot" and exp.episode_id == "bot.77.1"
    assert exp.stamp == 10.0 and exp.labels == list(LABELS) and exp.bundle_version == 3
    assert exp.mask[0, 1] == 0 and exp.window[0, 1] == 0.0 and exp.window[1, 1] == 14.0
    assert exp.required is None and exp.reward is None
    assert decode_experience(encode_experience(exp, seq=1)).stamp == 10.0


def test_two_builders_of_one_robot_never_share_an_episode():
    """Two processes under one robot_id started in the same second: distinct episodes."""
    ids = []
    for _ in range(2):
        shipped: list = []
        builder = ExperienceBuilder(BuilderConfig("robot", PERIOD),
                                    lambda e, out=shipped: out.append(e) or True)
        builder.add_frame(frame(10.0), now=0.0)
        builder.release(now=0.0, everything=True)
        ids.append(shipped[0].episode_id)
    assert ids[0] != ids[1]
    for episode in ids:
        assert re.fullmatch(r"robot\.\d{10}-[0-9a-f]{6}\.1", episode), episode


def test_the_longest_robot_id_still_names_valid_episodes():
    shipped: list = []
    builder = ExperienceBuilder(BuilderConfig("r" * MAX_ROBOT_ID_CHARS, PERIOD),
                                lambda e: shipped.append(e) or True)  # a generated boot id
    builder._episode_n = 10**MAX_EPISODE_N_DIGITS - 2  # a long-lived robot's episode count
    builder.add_frame(frame(1.0), now=0.0)
    builder.release(now=0.0, everything=True)
    assert builder.stats()["build_errors"] == 0 and len(shipped[0].episode_id) <= 128


def test_feedback_attaches_to_the_nearest_frame_within_half_a_period():
    builder, shipped = make()
    for i in range(4):
        builder.add_frame(frame(10.0 + i * PERIOD), now=0.0)
    assert builder.add_feedback(Feedback(10.21, ("hazard",), None), now=0.1)  # -> 10.2
    assert builder.add_feedback(Feedback(10.19, ("consider:C", "hazard"), 0.5), now=0.1)
    assert builder.add_feedback(Feedback(10.0, None, -1.0), now=0.1)
    assert not builder.add_feedback(Feedback(10.36, ("trend",), None), now=0.1)  # 60 ms off
    builder.release(now=5.0)
    by_stamp = {round(e.stamp, 2): e for e in shipped}
    assert by_stamp[10.2].required == ["hazard", "consider:C"] and by_stamp[10.2].reward == 0.5
    assert by_stamp[10.0].required is None and by_stamp[10.0].reward == -1.0
    assert by_stamp[10.1].required is None and by_stamp[10.3].required is None
    stats = builder.stats()
    assert stats["feedback_matched"] == 3 and stats["feedback_unmatched"] == 1


def test_feedback_before_its_frame_waits_and_late_feedback_is_counted():
    builder, shipped = make()
    assert not builder.add_feedback(Feedback(20.0, ("hazard",), None), now=0.0)
    builder.add_frame(frame(20.02), now=0.3)
    builder.release(now=5.0)
    assert shipped[0].required == ["hazard"]
    assert not builder.add_feedback(Feedback(20.0, ("trend",), None), now=5.1)
    assert builder.stats()["feedback_late"] == 1


def test_every_nth_frame_ships_but_frames_with_feedback_always_do():
    builder, shipped = make(ship_every_n_frames=3)
    for i in range(9):
        builder.add_frame(frame(i * PERIOD), now=0.0)
    builder.add_feedback(Feedback(0.4, ("hazard",), None), now=0.0)  # frame 5: thinned out
    builder.release(now=9.0)
    assert [round(e.stamp, 1) for e in shipped] == [0.0, 0.3, 0.4, 0.6]
    assert builder.stats()["skipped"] == 5


def test_episodes_rotate_on_gaps_clock_jumps_and_episode_start():
    builder, shipped = make(episode_gap_s=2.0)
    builder.add_frame(frame(1.0), now=0.0)
    builder.add_event("door_open", 1.05)
    builder.add_frame(frame(1.1), now=0.0)
    builder.add_frame(frame(5.0), now=0.0)  # 3.9 s gap
    builder.add_event("alarm", 5.05)
    builder.add_event("episode_start", 5.1)
    builder.add_frame(frame(5.2), now=0.0)
    builder.add_event("door_open", 5.25)
    builder.add_frame(frame(5.3), now=0.0)
    builder.add_frame(frame(0.5), now=0.0)  # the clock went back (bag restarted)
    builder.release(now=9.0)
    episodes = [e.episode_id for e in shipped]
    assert episodes == ["bot.77.1", "bot.77.1", "bot.77.2", "bot.77.3", "bot.77.3",
                        "bot.77.4"]
    assert [e.events for e in shipped] == [[], ["door_open"], [], [], ["door_open"], []]
    assert builder.stats()["episodes"] == 4


def test_event_history_is_capped_and_bad_names_are_counted():
    builder, shipped = make(max_events=3)
    builder.add_frame(frame(1.0), now=0.0)
    for i in range(20):
        builder.add_event(f"e{i}", 1.0 + i * 0.001)
    builder.add_event("bad name with spaces", 1.03)
    builder.add_frame(frame(1.1), now=0.0)
    builder.release(now=9.0)
    assert shipped[1].events == ["e17", "e18", "e19"]
    assert builder.stats()["events_invalid"] == 1


def test_pending_is_bounded_and_a_full_shipper_is_counted():
    shipped: list = []
    builder = ExperienceBuilder(BuilderConfig("bot", PERIOD, max_pending=3),
                                lambda e: len(shipped) < 1 and not shipped.append(e))
    for i in range(5):
        builder.add_frame(frame(i * PERIOD), now=0.0)
    builder.release(now=0.0, everything=True)
    stats = builder.stats()
    assert stats["dropped_pending"] == 2 and stats["shipped"] == 1
    assert stats["sink_refused"] == 2 and stats["pending"] == 0


def test_feedback_waiting_for_its_frame_is_bounded_oldest_dropped_first():
    builder, shipped = make(max_early_feedback=4)
    for i in range(10):  # stamped ahead of every frame: none can match yet
        assert not builder.add_feedback(Feedback(50.0 + i, ("hazard",), None), now=0.0)
    stats = builder.stats()
    assert stats["feedback_waiting"] == 4 and stats["feedback_dropped"] == 6
    builder.add_frame(frame(50.0), now=0.1)  # its feedback was among the dropped
    builder.add_frame(frame(59.0), now=0.1)  # the newest feedback is still waiting
    builder.release(now=9.0)
    assert [e.required for e in shipped] == [None, ["hazard"]]
    stats = builder.stats()
    assert stats["feedback_waiting"] == 0 and stats["feedback_unmatched"] == 3
    assert stats["feedback_matched"] == 1


@pytest.mark.parametrize("text, field", [
    ("not json", "not JSON"),
    ("[1]", "expected an object"),
    ('{"stamp": "x", "required": []}', "feedback.stamp"),
    ('{"stamp": -1, "required": []}', "feedback.stamp"),
    ('{"stamp": 1, "required": "hazard"}', "feedback.required"),
    ('{"stamp": 1, "required": ["bad label"]}', "feedback.required"),
    ('{"stamp": 1, "reward": true}', "feedback.reward"),
    ('{"stamp": 1, "reward": NaN}', "feedback.reward"),
    ('{"stamp": 1}', "neither"),
    ('{"stamp": 1, "reward": 1, "extra": 2}', "unknown keys"),
    ('{"stamp": 1, "required": ["bad label"], "required": []}', "appears twice"),
])
def test_parse_feedback_refuses_bad_messages_naming_the_field(text, field):
    with pytest.raises(FeedbackError, match=field):
        parse_feedback(text)


def test_parse_feedback_accepts_the_documented_shape():
    fb = parse_feedback(json.dumps({"stamp": 12.5, "required": ["hazard", "hazard", "trend"],
                                    "reward": None}))
    assert fb == Feedback(12.5, ("hazard", "trend"), None)


@pytest.mark.parametrize("kw, key", [
    ({"frame_period_s": 0.0}, "frame_period_s"),
    ({"feedback_window_s": -1.0}, "feedback_window_s"),
    ({"ship_every_n_frames": 0}, "ship_every_n_frames"),
    ({"episode_gap_s": float("nan")}, "episode_gap_s"),
    ({"max_events": 5000}, "max_events"),
    ({"max_early_feedback": 0}, "max_early_feedback"),
])
def test_config_names_the_bad_key(kw, key):
    args = dict(robot_id="bot", frame_period_s=PERIOD)
    args.update(kw)
    with pytest.raises(ValueError, match=key):
        BuilderConfig(**args)
