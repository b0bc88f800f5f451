"""rosbag2 writing and reading: topics, types, counts, timing, metadata and decoded values."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from thinkmem_ros.core.data import SignalStream
from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
from thinkmem_ros.playback.bag_files import (
    GROUND_TRUTH_TOPIC,
    BagError,
    BagStream,
    bag_info,
    decode,
    default_bindings,
    read_bag,
    write_stream,
)

RATE = 10.0
FRAMES = 40


def _stream(seed: int = 3) -> SignalStream:
    """A small hand-made stream: random values, one dropout, labels and two events."""
    rng = np.random.default_rng(seed)
    values = rng.normal(20.0, 5.0, size=(FRAMES, len(SIGNALS))).astype(np.float32)
    values[7, SIGNALS.index("vibration")] = np.nan
    labels = (rng.random((FRAMES, len(THINKING))) > 0.7).astype(np.float32)
    return SignalStream(rate_hz=RATE, values=values, labels=labels,
                        events=[(0.55, "door_open"), (2.0, "alarm")], scenario="hand")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    stream = _stream()
    out = tmp_path_factory.mktemp("bags") / "hand"
    info = write_stream(stream, out)
    return stream, out, info


def test_topics_types_and_counts_follow_the_node_defaults(written):
    stream, _, info = written
    bindings, events_topic = default_bindings()
    expected = {b.topic: b.msgtype for b in bindings.values()}
    expected[events_topic] = "std_msgs/msg/String"
    expected[GROUND_TRUTH_TOPIC] = "std_msgs/msg/String"
    assert {t: kind for t, (kind, _) in info.topics.items()} == expected
    for name, binding in bindings.items():
        column = stream.values[:, SIGNALS.index(name)]
        assert info.topics[binding.topic][1] == int(np.isfinite(column).sum())
    assert info.topics[bindings["vibration"].topic][1] == FRAMES - 1  # the dropout
    assert info.topics[events_topic][1] == 2
    assert info.topics[GROUND_TRUTH_TOPIC][1] == FRAMES
    assert info.storage == "mcap"
    assert info.duration_s == pytest.approx((FRAMES - 1) / RATE)


def test_metadata_yaml_is_standard_rosbag2(written):
    _, out, info = written
    meta = yaml.safe_load((out / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert meta["version"] == 9
    assert meta["storage_identifier"] == "mcap"
    assert meta["message_count"] == info.message_count
    for rel in meta["relative_file_paths"]:
        assert (out / rel).is_file() and rel.endswith(".mcap")
    listed = {t["topic_metadata"]["name"]: t["message_count"]
              for t in meta["topics_with_message_count"]}
    assert listed == {t: n for t, (_, n) in info.topics.items()}
    for entry in meta["topics_with_message_count"]:
        assert entry["topic_metadata"]["serialization_format"] == "cdr"
        assert entry["topic_metadata"]["type_description_hash"].startswith("RIHS01_")


def test_timing_is_the_frame_rate_and_header_stamps_agree(written):
    _, out, info = written
    _, messages = read_bag(out)
    assert [m.timestamp_ns for m in messages] == sorted(m.timestamp_ns for m in messages)
    bindings, _ = default_bindings()
    temps = [m for m in messages if m.topic == bindings["temperature"].topic]
    gaps = np.diff([m.timestamp_ns for m in temps])
    assert np.all(np.abs(gaps - 1e9 / RATE) <= 1)
    first = decode(temps[3])
    stamp_ns = first.header.stamp.sec * 10**9 + first.header.stamp.nanosec
    assert stamp_ns == temps[3].timestamp_ns == info.start_ns + 3 * 10**8


def test_values_decode_with_rclpy(written):
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import Range, Temperature
    from std_msgs.msg import Float32, String

    stream, out, _ = written
    bindings, events_topic = default_bindings()
    classes = {"sensor_msgs/msg/Temperature": Temperature, "sensor_msgs/msg/Range": Range,
               "std_msgs/msg/Float32": Float32}
    _, messages = read_bag(out)
    frame_of = {}
    for name, binding in bindings.items():
        column = stream.values[:, SIGNALS.index(name)]
        frames = np.flatnonzero(np.isfinite(column))
        got = [m for m in messages if m.topic == binding.topic]
        decoded = [getattr(deserialize_message(m.data, classes[binding.msgtype]),
                           binding.field) for m in got]
        np.testing.assert_allclose(decoded, column[frames], rtol=1e-6)
        frame_of[name] = frames
    truths = [json.loads(deserialize_message(m.data, String).data)
              for m in messages if m.topic == GROUND_TRUTH_TOPIC]
    assert [t["frame"] for t in truths] == list(range(FRAMES))
    for t in truths:
        expected = [THINKING[i] for i in np.flatnonzero(stream.labels[t["frame"]])]
        assert t["active"] == expected
    events = [(m.timestamp_ns, deserialize_message(m.data, String).data)
              for m in messages if m.topic == events_topic]
    start = messages[0].timestamp_ns
    assert [name for _, name in events] == ["door_open", "alarm"]
    assert [(ns - start) / 1e9 for ns, _ in events] == pytest.approx([0.55, 2.0])


def test_sqlite3_storage_reads_back_identically(written, tmp_path):
    stream, out, info = written
    other = write_stream(stream, tmp_path / "sq", storage="sqlite3")
    assert other.storage == "sqlite3"
    assert other.topics == info.topics
    _, a = read_bag(out)
    _, b = read_bag(tmp_path / "sq")
    key = lambda m: (m.timestamp_ns, m.topic)  # noqa: E731
    assert [(m.topic, m.timestamp_ns, m.data) for m in sorted(a, key=key)] == \
        [(m.topic, m.timestamp_ns, m.data) for m in sorted(b, key=key)]


def test_topic_filter_and_start_offset(written):
    _, out, info = written
    _, messages = read_bag(out, topics=[GROUND_TRUTH_TOPIC], start_offset_s=1.0)
    assert {m.topic for m in messages} == {GROUND_TRUTH_TOPIC}
    assert len(messages) == FRAMES - 10
    assert messages[0].timestamp_ns == info.start_ns + 10**9


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
@pytest.mark.parametrize("offset", [1e300, 1e10, FRAMES / RATE + 0.5])
def test_a_start_offset_past_the_end_is_refused_naming_the_duration(written, tmp_path,
                                                                    storage, offset):
    """1e300 s overflowed into an OverflowError, and 1e10 s on sqlite3 blamed the bag
    ("cannot read bag: int too big to convert")."""
    stream, out, _ = written
    bag = out if storage == "mcap" else write_stream(stream, tmp_path / "sq",
                                                      storage="sqlite3").path
    with pytest.raises(BagError, match=r"start offset .* s is past the end of bag .* which "
                                       r"lasts 3\.9 s"):
        BagStream(bag, start_offset_s=offset)
    assert len(list(BagStream(bag, start_offset_s=(FRAMES - 1) / RATE))) > 0


def test_bad_inputs_raise_naming_the_problem(written, tmp_path):
    stream, out, _ = written
    with pytest.raises(BagError, match="bag not found"):
        read_bag(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BagError, match="no metadata.yaml file\\): [^;]*$"):
        bag_info(tmp_path / "empty")
    (tmp_path / "killed").mkdir()  # the recorder was killed: storage file, no metadata
    (tmp_path / "killed" / "killed_0.mcap").write_bytes(b"")
    with pytest.raises(BagError, match="holds killed_0.mcap: .*ros2 bag reindex"):
        bag_info(tmp_path / "killed")
    with pytest.raises(BagError, match="/no/such"):
        read_bag(out, topics=["/no/such"])
    with pytest.raises(ValueError, match="start_offset_s"):
        read_bag(out, start_offset_s=-1)
    with pytest.raises(BagError, match="already exists"):
        write_stream(stream, out)
    with pytest.raises(ValueError, match="storage"):
        write_stream(stream, tmp_path / "x", storage="rosbag1")
    assert not (tmp_path / "x").exists()


def test_overwrite_replaces_a_bag_and_nothing_else(written, tmp_path):
    """A mistyped output path with ``overwrite`` must not delete someone's files."""
    stream, out, _ = written
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    plain = tmp_path / "plain.txt"
    plain.write_text("keep me too")
    for target in (precious, plain):
        with pytest.raises(BagError, match="not a rosbag2 folder"):
            write_stream(stream, target, overwrite=True)
    assert (precious / "notes.txt").read_text() == "keep me"
    assert plain.read_text() == "keep me too"
    assert write_stream(stream, out, overwrite=True).message_count > 0  # a bag: replaced


def test_the_player_streams_the_bag_instead_of_listing_it(written):
    """A pass pulls messages as it publishes them: memory does not grow with the bag."""
    from thinkmem_ros.playback.bag_files import BagStream
    from thinkmem_ros.playback.player import BagPlayer, PlayConfig

    _, out, info = written
    stream = BagStream(out)
    assert stream.count == info.message_count and set(stream.types) == set(info.topics)
    pulled = 0
    published = []

    class CountingStream(BagStream):
        def __iter__(self):
            nonlocal pulled
            for msg in super().__iter__():
                pulled += 1
                # never more than one message read ahead of what has been published
                assert pulled <= len(published) + 1, "the player read ahead of playback"
                yield msg

    class FakePublisher:
        def __init__(self, topic):
            self.topic = topic

        def publish(self, data):
            published.append((self.topic, data))

    class FakeNode:
        def create_publisher(self, cls, topic, qos):
            return FakePublisher(topic)

    player = BagPlayer(FakeNode(), CountingStream(out), PlayConfig(rate=1000.0))
    stats = player.play()
    assert stats.published == info.message_count == pulled
    _, listed = read_bag(out)
    assert [data for _, data in published] == [m.data for m in listed]


def test_bag_stream_refuses_unknown_topics(written):
    from thinkmem_ros.playback.bag_files import BagStream

    _, out, _ = written
    with pytest.raises(BagError, match="/no/such"):
        BagStream(out, topics=["/no/such"])


def test_a_damaged_storage_file_is_an_error_not_a_short_read(tmp_path):
    """A zeroed stretch of an MCAP file ends the reader's pass early without an error; the
    pass must say the bag is damaged instead of handing back part of it as the whole."""
    from thinkmem_ros.world.streams import generate_stream

    stream = generate_stream("mixed", 5.0, 10.0, np.random.default_rng(0))
    out = tmp_path / "damaged"
    info = write_stream(stream, out)
    storage = next(out.glob("*.mcap"))
    data = bytearray(storage.read_bytes())
    middle = len(data) * 3 // 10
    data[middle:middle + 64] = bytes(64)
    storage.write_bytes(bytes(data))
    with pytest.raises(BagError, match=f"damaged: read \\d+ of the {info.message_count}"):
        read_bag(out)


def test_sigterm_during_bag_write_removes_the_partial_bag(tmp_path):
    """SIGTERM ended the process without running the cleanup, leaving a hidden
    '.OUT.xxxx.partial' folder beside the output (Ctrl-C already cleaned up)."""
    root = Path(__file__).resolve().parent.parent
    writer = subprocess.Popen(
        [sys.executable, "-m", "thinkmem_ros.cli", "bag", "write", "--scenario", "mixed",
         "--duration", "20000", "--out", str(tmp_path / "out")],
        env=dict(os.environ, PYTHONPATH=str(root)), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(tmp_path.glob(".out.*.partial/out/*")) and writer.poll() is None:
            assert time.monotonic() < deadline, "the write never started"
            time.sleep(0.1)
        writer.send_signal(signal.SIGTERM)
        _, err = writer.communicate(timeout=60)
    finally:
        writer.kill()
    assert writer.returncode == 128 + signal.SIGTERM, err
    assert list(tmp_path.iterdir()) == []
