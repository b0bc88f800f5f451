"""Labels from recorded hindsight: real bags (MCAP, SQLite, ROS 1) with a signal and feedback.

Every bag here is written by ``rosbags`` the way a recorder writes it: a ``std_msgs/Float64``
signal at 10 Hz and ``std_msgs/String`` feedback whose record time is later than the
activation it judges (the judge's latency), so a test that matched by record time instead
of by stamp would label the wrong frame and fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from thinkmem_ros.playback.bag_files import BagError
from thinkmem_ros.playback.feedback_labels import (
    MIN_LABELLED_FRAMES,
    FeedbackConfig,
    FeedbackLabelError,
    HindsightLabels,
    align_feedback,
    feedback_label_names,
    labelled_ends,
    read_feedback,
    with_labels,
)
from thinkmem_ros.playback.recording import (
    parse_signal_map,
    read_recording,
    recording_windows,
)

START_NS = 1_700_000_000 * 10**9
RATE = 10.0
LATENCY_S = 0.3  # the judge answers 3 frames after the activation
REPO = Path(__file__).resolve().parents[1]


def level(k: int) -> float:
    """The signal at frame k: 4 s high, 4 s low, so 'high' is learnable from the window."""
    return 1.0 if (k // 40) % 2 == 0 else 0.0


def write_bag(path: Path, *, seconds: float, feedback: list[tuple[float, float, str]],
              storage: str = "mcap", topic: str = "/thinking/feedback") -> Path:
    """A bag with ``/level`` (Float64 at RATE) and feedback (stamp_s, record_s, text).

    Feedback times are seconds after START_NS; the stamp goes into the JSON only when the
    text has a ``{stamp}`` placeholder, so malformed texts stay as they are.
    """
    frames = int(seconds * RATE)
    rows = [(START_NS + round(k * 1e9 / RATE), "/level", level(k)) for k in range(frames)]
    rows += [(START_NS + round(rec * 1e9), topic, text.replace("{stamp}", repr(
        (START_NS + round(stamp * 1e9)) / 1e9))) for stamp, rec, text in feedback]
    rows.sort(key=lambda r: r[0])
    if storage == "ros1":
        from rosbags.rosbag1 import Writer as Writer1
        from rosbags.typesys import Stores, get_typestore

        store = get_typestore(Stores.ROS1_NOETIC)
        with Writer1(path) as writer:
            conns = {"/level": writer.add_connection("/level", "std_msgs/msg/Float64",
                                                     typestore=store),
                     topic: writer.add_connection(topic, "std_msgs/msg/String",
                                                  typestore=store)}
            for t, name, value in rows:
                msg, kind = _message(store, value)
                writer.write(conns[name], t, store.serialize_ros1(msg, kind))
        return path
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        conns = {"/level": writer.add_connection("/level", "std_msgs/msg/Float64",
                                                 typestore=store),
                 topic: writer.add_connection(topic, "std_msgs/msg/String", typestore=store)}
        for t, name, value in rows:
            msg, kind = _message(store, value)
            writer.write(conns[name], t, store.serialize_cdr(msg, kind))
    return path


def _message(store, value):
    if isinstance(value, str):
        return store.types["std_msgs/msg/String"](data=value), "std_msgs/msg/String"
    return store.types["std_msgs/msg/Float64"](data=float(value)), "std_msgs/msg/Float64"


def fb(required, reward=0.5) -> str:
    """Feedback text as the oracle sends it (stamp filled in by write_bag)."""
    return '{"stamp": {stamp}, "required": ' + json.dumps(required) + \
        f', "reward": {json.dumps(reward)}}}'


SIGNAL_MAP = parse_signal_map({"/**": {"ros__parameters": {
    "frame_rate_hz": RATE, "stale_after_s": 0.5,
    "signals": {"level": {"topic": "/level", "type": "std_msgs/msg/Float64",
                          "field": "data"}}}}})


def labelled(bag: Path, config: FeedbackConfig | None = None):
    """(stream labelled by the bag's feedback, its report)."""
    hindsight = HindsightLabels([bag], config)
    stream = hindsight.label(read_recording(bag, SIGNAL_MAP, RATE), 0)
    return stream, hindsight.bags[0].report


@pytest.mark.parametrize("storage", ["mcap", "sqlite3", "ros1"])
def test_feedback_labels_exactly_its_frame_in_every_bag_format(tmp_path, storage):
    name = "b.bag" if storage == "ros1" else "b"
    bag = write_bag(tmp_path / name, seconds=10.0, storage=storage, feedback=[
        (5.7 + 0.04, 5.7 + LATENCY_S, fb(["high"])),  # frame 57, stamp 40 ms late
        (2.06, 2.06 + LATENCY_S, fb([])),  # 60 ms after frame 20: nearest is frame 21
        (8.0, 8.0 + LATENCY_S, fb(["calm"])),  # frame 80, twice: labels are united
        (8.01, 8.0 + LATENCY_S + 0.01, fb(["high", "calm"], None)),
    ])
    stream, report = labelled(bag)
    assert stream.label_names == ("calm", "high")  # sorted union
    assert stream.values.shape[0] == 100  # 0 .. 9.9 s
    rows = np.flatnonzero(np.isfinite(stream.labels).all(axis=1))
    assert rows.tolist() == [21, 57, 80]
    assert stream.labels[57].tolist() == [0.0, 1.0]
    assert stream.labels[21].tolist() == [0.0, 0.0]  # required [] = needed none: negative
    assert stream.labels[80].tolist() == [1.0, 1.0]
    assert np.isnan(stream.labels[[20, 22, 56, 58, 60, 83]]).all()  # not the record time
    assert report.clock == "stamp" and report.matched == 4 and report.labelled_frames == 3


def test_unlabelled_frames_never_end_a_training_window(tmp_path):
    feedback = [(k / RATE, k / RATE + LATENCY_S, fb(["high"] if level(k) else []))
                for k in (3, 12, 40, 41, 95)]
    bag = write_bag(tmp_path / "b", seconds=10.0, feedback=feedback)
    stream, _ = labelled(bag)
    ends = labelled_ends(stream, window=8)
    assert ends.tolist() == [12, 40, 41, 95]  # frame 3 has no full window
    data = recording_windows(stream, 8, ends=ends)
    assert len(data) == 4 and data.meta["end_frames"].tolist() == [12, 40, 41, 95]
    assert data.label_names == ("high",) and data.labels[:, 0].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert np.isfinite(data.labels).all()
    # the window's newest frame is the labelled one
    assert data.signals[0, -1, 0] == level(12) and data.signals[1, -1, 0] == level(40)
    with pytest.raises(ValueError, match="end frames must be in"):
        recording_windows(stream, 8, ends=np.array([3]))


def test_malformed_feedback_is_counted_and_skipped(tmp_path):
    bag = write_bag(tmp_path / "b", seconds=5.0, feedback=[
        (1.0, 1.1, "not json"),
        (1.1, 1.2, '{"stamp": "soon", "required": ["high"]}'),
        (1.2, 1.3, '{"stamp": {stamp}, "required": "high"}'),
        (1.3, 1.4, '{"stamp": {stamp}, "required": [3]}'),
        (1.4, 1.5, '{"stamp": {stamp}, "required": ["high"], "mood": 1}'),
        (1.5, 1.6, '[1, 2]'),
        (1.6, 1.7, '{"stamp": {stamp}, "reward": 0.9}'),  # valid, but says nothing on labels
        (2.0, 2.1, fb(["high"])),
        (-5.0, 0.2, fb(["calm"])),  # an activation from before the recorder started
    ])
    parsed = read_feedback(bag)
    report = parsed.report
    assert report.messages == 9 and report.skipped == 6 and report.reward_only == 1
    assert dict(report.malformed) == {"not JSON": 1, "stamp": 1, "required": 2,
                                      "unknown keys": 1, "expected an object": 1}
    assert report.first_error.startswith("feedback: not JSON")
    names = feedback_label_names([parsed])
    labels = align_feedback(parsed, 51, RATE, names)
    assert report.clock == "stamp" and report.matched == 1 and report.outside_bag == 1
    assert np.flatnonzero(np.isfinite(labels).all(axis=1)).tolist() == [20]
    assert "6 malformed skipped" in report.line() and "1 outside the bag" in report.line()


def test_stamps_on_another_clock_fall_back_to_record_time(tmp_path):
    # the node ran on sim time (stamps of a few seconds), the recorder on the system clock
    bag = write_bag(tmp_path / "b", seconds=5.0, feedback=[
        (0.0, 2.34, '{"stamp": 12.5, "required": ["high"]}'),
        (0.0, 3.0, '{"stamp": 13.1, "required": ["calm"]}'),
    ])
    stream, report = labelled(bag)
    assert report.clock == "record" and report.matched == 2
    rows = np.flatnonzero(np.isfinite(stream.labels).all(axis=1)).tolist()
    assert rows == [23, 30]  # the latest frame at or before each arrival
    # forcing the stamp clock drops them all as outside the bag: nothing to train on
    with pytest.raises(FeedbackLabelError, match="no feedback falls on a frame"):
        labelled(bag, FeedbackConfig(clock="stamp"))


def test_restricting_labels_and_config_checks(tmp_path):
    bag = write_bag(tmp_path / "b", seconds=5.0, feedback=[
        (1.0, 1.3, fb(["high", "calm"])), (2.0, 2.3, fb(["calm"]))])
    stream, _ = labelled(bag, FeedbackConfig(labels=("high",)))
    assert stream.label_names == ("high",)
    assert stream.labels[10].tolist() == [1.0] and stream.labels[20].tolist() == [0.0]
    with pytest.raises(FeedbackLabelError, match=r"labels \['fast'\] never appear"):
        labelled(bag, FeedbackConfig(labels=("fast",)))
    with pytest.raises(ValueError, match="the feedback clock must be one of"):
        FeedbackConfig(clock="wall")
    assert FeedbackConfig(topic="thinking/feedback").topic == "/thinking/feedback"
    with pytest.raises(ValueError, match="do not fit"):
        with_labels(stream, np.zeros((3, 1), np.float32), ("high",))


def test_missing_topic_or_bag_is_named(tmp_path):
    bag = write_bag(tmp_path / "b", seconds=2.0, feedback=[(1.0, 1.3, fb(["high"]))],
                    topic="/judge")
    with pytest.raises(FeedbackLabelError, match=r"'/thinking/feedback' is not in the bag; "
                                                  r"it has \['/judge', '/level'\]"):
        read_feedback(bag)
    assert read_feedback(bag, FeedbackConfig(topic="/judge")).report.messages == 1
    with pytest.raises(FeedbackLabelError, match="recorded as 'std_msgs/msg/Float64'"):
        read_feedback(bag, FeedbackConfig(topic="/level"))
    with pytest.raises(BagError, match="bag not found"):
        read_feedback(tmp_path / "nothing")


# ---- the CLI, end to end

def _params(tmp_path: Path) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": {
        "frame_rate_hz": RATE, "stale_after_s": 0.5,
        "signals": {"level": {"topic": "/level", "type": "std_msgs/msg/Float64",
                              "field": "data", "unit": "1"}}}}}))
    return path


def _train(bag: Path, params: Path, out: Path, *extra: str) -> int:
    from thinkmem_ros import cli

    return cli.main(["train", "--bag", str(bag), "--params", str(params), "--labels",
                     "feedback", "--window", "8", "--preset", "fast", "--epochs", "1",
                     "--min-steps", "30", "--batch-size", "32", "--no-progress",
                     "--out", str(out), *extra])


def test_cli_trains_from_recorded_feedback(tmp_path, capsys):
    pytest.importorskip("torch")
    from thinkmem_ros.policy.bundle import load_bundle

    # 40 s; feedback on every second frame from 1 s on, judged 0.3 s later
    feedback = [(k / RATE + 0.01, k / RATE + LATENCY_S,
                 fb(["high"] if level(k) else ["calm"])) for k in range(10, 400, 2)]
    feedback.append((20.0, 20.3, "garbage"))
    bag = write_bag(tmp_path / "b", seconds=40.0, feedback=feedback)
    out = tmp_path / "bundle"
    assert _train(bag, _params(tmp_path), out, "--train-fraction", "0.75") == 0
    err = capsys.readouterr().err
    assert "196 feedback message(s), 195 matched to 195 frame(s) by stamp time" in err
    assert "1 malformed skipped (1 not JSON)" in err
    # 401 frames, the first 301 train: labelled frames 10, 12, ..., 300 (all >= window - 1)
    assert "training on 146 situations" in err and "labels ['calm', 'high']" in err
    held = [line for line in err.splitlines() if line.startswith("held-out last 25%")]
    assert len(held) == 1 and "micro-F1" in held[0]
    # 402 frames (the last feedback ends the bag at 40.1 s): the tail holds labelled
    # frames 302..398, 49 of them, less those in the replay's first window - 1 frames
    frames = int(held[0].rsplit(" on ", 1)[1].split()[0])
    assert frames == 49 - 4
    m = load_bundle(out).manifest
    assert m.labels == ["calm", "high"] and m.signals == ["level"]
    assert m.extras["labels"] == "feedback"
    assert m.extras["feedback_topic"] == "/thinking/feedback"


def test_cli_error_paths_are_one_line(tmp_path):
    pytest.importorskip("torch")
    params = _params(tmp_path)
    out = tmp_path / "bundle"
    few = write_bag(tmp_path / "few", seconds=30.0, feedback=[
        (k / RATE, k / RATE + LATENCY_S, fb(["high"])) for k in (20, 30, 200)])
    with pytest.raises(SystemExit) as exc:
        _train(few, params, out)
    assert str(exc.value).startswith(
        "thinkmem train: error: too few labelled frames to train: 3 frame(s)")
    assert f"at least {MIN_LABELLED_FRAMES}" in str(exc.value)
    bad = write_bag(tmp_path / "bad", seconds=5.0, feedback=[
        (1.0, 1.3, "nope"), (2.0, 2.3, '{"stamp": {stamp}, "reward": 1.0}')])
    with pytest.raises(SystemExit) as exc:
        _train(bad, params, out)
    assert "no feedback with labels on '/thinking/feedback' (2 message(s): 1 malformed, " \
           "1 reward-only)" in str(exc.value)
    assert "\n" not in str(exc.value)
    with pytest.raises(SystemExit, match="need --labels feedback"):
        from thinkmem_ros import cli

        cli.main(["train", "--bag", str(bad), "--params", str(params), "--labels",
                  "rules.yaml", "--feedback-topic", "/x"])
    assert not out.exists()
    # the real entry point: exit status 1 and one line on stderr, no traceback
    proc = subprocess.run(
        [sys.executable, "-m", "thinkmem_ros.cli", "train", "--bag", str(bad), "--params",
         str(params), "--labels", "feedback", "--feedback-topic", "/judge", "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "feedback topic '/judge' is not in the bag" in proc.stderr
