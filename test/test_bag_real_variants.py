"""Recordings as real robots make them, which the bag paths once refused or misread.

Real rosbag2 and ROS 1 files written with ``rosbags``: a topic with two publishers of
other QoS (two connections), a topic recorded with two message types, an Eloquent-era
metadata.yaml whose file paths include the bag folder, and a Humble robot's standard type
whose definition differs from the newest distro's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import recorded_qos
from test_bag_hostile import RATE, START_NS, float64, one_line_error, params, rules, speed, train

from thinkmem_ros.playback.bag_files import BagError, BagStream, checked_bag_info

N = int(40 * RATE)  # messages of a 40 s bag (training holds out a 15 s stretch)




def two_connection_bag(path: Path, *, other_type: bool = False, storage: str = "mcap"):
    """``/x`` from two publishers (alternate frames), the second with another QoS or type."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    first, second = recorded_qos(10)
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        a = writer.add_connection("/x", "std_msgs/msg/Float64", typestore=store,
                                  offered_qos_profiles=[first])
        b = writer.add_connection("/x", "std_msgs/msg/Float32" if other_type
                                  else "std_msgs/msg/Float64", typestore=store,
                                  offered_qos_profiles=[second])
        for k in range(N):
            t = START_NS + round(k * 1e9 / RATE)
            if k % 2 and other_type:
                msg = store.types["std_msgs/msg/Float32"](data=speed(k))
                writer.write(b, t, bytes(store.serialize_cdr(msg, "std_msgs/msg/Float32")))
            else:
                writer.write(b if k % 2 else a, t, float64(store, speed(k)))
    return path


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_topic_of_two_publishers_is_counted_whole(tmp_path, storage, capsys):
    """Its count was the last connection's: 'damaged: read 80 messages, more than the 40
    its metadata.yaml lists', and bag info showed half the messages."""
    bag = two_connection_bag(tmp_path / "b", storage=storage)
    info = checked_bag_info(bag)
    assert info.topics == {"/x": ("std_msgs/msg/Float64", N)} and not info.mixed
    assert sum(1 for _ in BagStream(bag)) == N
    assert train(bag, params(tmp_path), rules(tmp_path), tmp_path / "out") == 0


def test_a_ros1_topic_with_a_latched_and_an_unlatched_publisher_converts(tmp_path):
    """The converted bag's count was one connection's, so conversion called the ROS 1 bag
    damaged and deleted its output."""
    from rosbags.rosbag1 import Writer as Writer1
    from rosbags.typesys import Stores, get_typestore

    from thinkmem_ros.playback.bag_files import convert_ros1

    store = get_typestore(Stores.ROS1_NOETIC)
    src = tmp_path / "two.bag"
    with Writer1(src) as writer:
        plain = writer.add_connection("/x", "std_msgs/msg/Float64", typestore=store,
                                      callerid="/a")
        latched = writer.add_connection("/x", "std_msgs/msg/Float64", typestore=store,
                                        callerid="/b", latching=1)
        for k in range(40):
            msg = store.types["std_msgs/msg/Float64"](data=speed(k))
            writer.write(latched if k % 2 else plain, START_NS + k * 10**8,
                         bytes(store.serialize_ros1(msg, "std_msgs/msg/Float64")))
    info = convert_ros1(src, tmp_path / "out")
    assert info.topics["/x"] == ("std_msgs/msg/Float64", 40)


def test_a_topic_recorded_with_two_types_is_named_not_called_damaged(tmp_path, capsys):
    bag = two_connection_bag(tmp_path / "b", other_type=True)
    info = checked_bag_info(bag)  # bag info lists both, with their counts
    assert info.mixed == {"/x": {"std_msgs/msg/Float32": 200, "std_msgs/msg/Float64": 200}}
    types = r"\(std_msgs/msg/Float32: 200, std_msgs/msg/Float64: 200\)"
    with pytest.raises(BagError, match=r"topic /x is recorded with 2 message types " + types):
        BagStream(bag)
    assert train(bag, params(tmp_path), rules(tmp_path), tmp_path / "out") != 0
    assert "recorded with 2 message types" in one_line_error(capsys)
    from thinkmem_ros import cli

    assert cli.main(["calibrate", str(bag), "--params", str(params(tmp_path))]) != 0
    assert "recorded with 2 message types" in one_line_error(capsys)


def test_eloquent_file_paths_that_name_the_bag_folder_are_found(tmp_path):
    """rosbag2 of Eloquent / early Foxy listed 'demo/demo_0.db3'; bag info called such a
    bag damaged ('storage file ... is missing') while every reader opened it."""
    from test_bag_hostile import float_bag

    bag = float_bag(tmp_path / "demo", storage="sqlite3", seconds=40.0)
    meta_path = bag / "metadata.yaml"
    meta = yaml.safe_load(meta_path.read_text())
    info = meta["rosbag2_bagfile_information"]
    info["relative_file_paths"] = [f"demo/{Path(f).name}" for f in info["relative_file_paths"]]
    meta_path.write_text(yaml.safe_dump(meta))
    assert checked_bag_info(bag).message_count == N


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_humble_robots_standard_type_decodes_with_the_definition_it_recorded(tmp_path,
                                                                              storage):
    """Humble's sensor_msgs/msg/Range has no ``variance``: decoded with the newest
    distro's definition, every message failed ('could not be decoded ... a wrong message
    type or a damaged bag'). The bag records its own definition; it comes first."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    humble = get_typestore(Stores.ROS2_HUMBLE)
    assert "variance" not in [f[0] for f in humble.fielddefs["sensor_msgs/msg/Range"][1]]
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    bag = tmp_path / "range"
    with Writer(bag, version=9, storage_plugin=plugin) as writer:
        conn = writer.add_connection("/range", "sensor_msgs/msg/Range", typestore=humble)
        for k in range(N):
            t = START_NS + round(k * 1e9 / RATE)
            header = humble.types["std_msgs/msg/Header"](
                stamp=humble.types["builtin_interfaces/msg/Time"](sec=t // 10**9,
                                                                  nanosec=t % 10**9),
                frame_id="range")
            msg = humble.types["sensor_msgs/msg/Range"](
                header=header, radiation_type=0, field_of_view=0.5, min_range=0.0,
                max_range=4.0, range=float(speed(k)))
            writer.write(conn, t, bytes(humble.serialize_cdr(msg, "sensor_msgs/msg/Range")))
    params_file = params(tmp_path, field="range", topic="/range",
                         msgtype="sensor_msgs/msg/Range")
    assert train(bag, params_file, rules(tmp_path), tmp_path / "out") == 0


def test_a_recording_too_short_to_hold_a_stretch_out_is_one_line(tmp_path, capsys):
    """It stopped in the training loop with 'ValueError: a validation split needs at least
    2 distinct groups (episodes/components)'."""
    from test_bag_hostile import float_bag

    bag = float_bag(tmp_path / "short", seconds=8.0)
    assert train(bag, params(tmp_path), rules(tmp_path), tmp_path / "out") != 0
    assert "spans less than two 15 s stretches" in one_line_error(capsys)


def test_values_no_float32_holds_are_unusable_as_on_the_node(tmp_path, capsys):
    """1e308 passed the float64 checks, became +inf in the float32 frames and was masked
    everywhere: training exited 0 on a signal it never saw (the node refuses such
    samples as it refuses NaN)."""
    from test_bag_hostile import write_bag

    from thinkmem_ros import cli
    from thinkmem_ros.playback.bag_files import _typestore

    store = _typestore()
    rows = [(START_NS + round(k * 1e9 / RATE), "/x", "std_msgs/msg/Float64",
             float64(store, 1e308)) for k in range(N)]
    bag = write_bag(tmp_path / "huge", rows)
    assert train(bag, params(tmp_path), rules(tmp_path), tmp_path / "out") != 0
    assert "none gave a finite number within float32's range" in one_line_error(capsys)
    assert cli.main(["calibrate", str(bag), "--params", str(params(tmp_path))]) == 0
    assert "1e+308" not in capsys.readouterr().out


def test_a_gap_in_the_recording_is_named_and_neither_trained_nor_scored(tmp_path, capsys):
    """Five minutes without a message in a six-minute drive: calibrate showed a 10 Hz
    sensor at 1.1 Hz and said nothing of the gap; train fitted thousands of windows with
    every input masked and every label negative, and counted them in its held-out F1."""
    from test_bag_hostile import write_bag

    from thinkmem_ros import cli
    from thinkmem_ros.playback.bag_files import _typestore

    store = _typestore()
    ks = list(range(N)) + list(range(N + 3000, 2 * N + 3000))  # 40 s, 300 s silent, 40 s
    rows = [(START_NS + round(k * 1e9 / RATE), "/x", "std_msgs/msg/Float64",
             float64(store, speed(k))) for k in ks]
    bag = write_bag(tmp_path / "gap", rows)
    assert cli.main(["calibrate", str(bag), "--params", str(params(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "motion: no sample for 300.1 s from 39.9 s" in out
    rate = float(next(line for line in out.splitlines() if line.startswith("motion"))
                 .split()[2])
    assert rate == pytest.approx(RATE, rel=0.01)
    assert cli.main(["train", "--bag", str(bag), "--params", str(params(tmp_path)),
                     "--labels", str(rules(tmp_path)), "--train-fraction", "0.7",
                     "--window", "8", "--augment", "0", "--epochs", "1", "--min-steps", "0",
                     "--patience", "1", "--preset", "fast", "--no-progress", "--out",
                     str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "frames without any fresh signal (gaps in the recording) end no training" in err
    assert "frames without any fresh signal not scored" in err


def test_a_topic_that_starts_late_or_stops_early_is_named(tmp_path, capsys):
    """A sensor first heard 30 s into the recording (another topic ran from its start),
    or silent for its last 30 s: frames there have it masked, yet calibrate said 0
    warnings and training said nothing, since only silences between samples counted."""
    from test_bag_hostile import write_bag

    from thinkmem_ros import cli
    from thinkmem_ros.playback.bag_files import _typestore

    store = _typestore()
    late = int(30 * RATE)
    total = N + late
    for name, ks in (("late", range(late, total)), ("early", range(N))):
        other = [(START_NS + round(k * 1e9 / RATE), "/other", "std_msgs/msg/Float64",
                  float64(store, 0.0)) for k in range(total)]
        rows = [(START_NS + round(k * 1e9 / RATE), "/x", "std_msgs/msg/Float64",
                 float64(store, speed(k))) for k in ks]
        bag = write_bag(tmp_path / name, sorted(other + rows))
        assert cli.main(["calibrate", str(bag), "--params", str(params(tmp_path))]) == 0
        start = 0.0 if name == "late" else (N - 1) / RATE
        said = f"motion: no sample for 30.0 s from {start:.1f} s"
        assert said in capsys.readouterr().out, name
        assert train(bag, params(tmp_path), rules(tmp_path), tmp_path / f"out_{name}") == 0
        assert f"WARN {bag}: {said}" in capsys.readouterr().err, name


def test_calibrate_checks_the_signals_the_bundle_lacks_too(tmp_path, capsys):
    """A field typo on a signal the comparison bundle does not have printed a NaN row and
    only 'not a signal of the bundle': the sample checks were skipped for it."""
    from test_bag_hostile import WHEEL, _store, write_bag

    from thinkmem_ros import cli

    store = _store(custom=True)  # a robot's own type: its fields are known from the bag only
    rows = [(START_NS + k * 100_000_000, "/wheel", WHEEL, bytes(store.serialize_cdr(
        store.types[WHEEL](speed=speed(k), note="x"), WHEEL))) for k in range(50)]
    bag = write_bag(tmp_path / "b", rows, store=store)
    typo = tmp_path / "typo.yaml"  # a signal the shipped default bundle does not have
    typo.write_text(yaml.safe_dump({"/**": {"ros__parameters": {"frame_rate_hz": RATE,
                                                                "signals": {"wheel_speed": {
        "topic": "/wheel", "type": WHEEL, "field": "sped"}}}}}))
    assert cli.main(["calibrate", str(bag), "--params", str(typo)]) == 0
    out = capsys.readouterr().out
    assert "WARN wheel_speed: no usable sample on /wheel" in out


def test_a_topic_recorded_twice_is_named_by_calibrate(tmp_path, capsys):
    """Every message twice at the same stamp read as 20 Hz for a 10 Hz sensor, silently."""
    from test_bag_hostile import write_bag

    from thinkmem_ros import cli
    from thinkmem_ros.playback.bag_files import _typestore

    store = _typestore()
    rows = [(START_NS + round(k * 1e9 / RATE), "/x", "std_msgs/msg/Float64",
             float64(store, speed(k))) for k in range(N) for _ in range(2)]
    bag = write_bag(tmp_path / "twice", rows)
    assert cli.main(["calibrate", str(bag), "--params", str(params(tmp_path))]) == 0
    assert f"motion: {N} of {2 * N} samples arrive at the same time" in capsys.readouterr().out


class _Node:
    """Publishers that drop what they get: these tests check what the player is handed."""

    def create_publisher(self, cls, topic, qos):
        return type("Publisher", (), {"publish": lambda self, data: None})()


def test_play_merges_split_files_listed_out_of_time_order(tmp_path):
    """It played the later file first, then the earlier one in one burst; now the files
    are merged by time, as ``ros2 bag play`` orders them."""
    from test_bag_hostile import split_out_of_order

    from thinkmem_ros.playback.player import BagPlayer, PlayConfig

    whole, split = split_out_of_order(tmp_path)
    assert [m.timestamp_ns for m in BagStream(split)] == [m.timestamp_ns
                                                         for m in BagStream(whole)]
    stats = BagPlayer(_Node(), BagStream(split), PlayConfig(rate=1000.0)).play()
    assert stats.published == 80


def split_with_overlap(tmp_path: Path, storage: str, overlap_ns: int) -> Path:
    """``/x`` for 8 s in two storage files, the second starting ``overlap_ns`` before the
    first ends (a recorder's clock stepped back or jittered at the split)."""
    from test_bag_hostile import _store, write_bag

    store, ext = _store(), ("mcap" if storage == "mcap" else "db3")
    split = tmp_path / "split"
    split.mkdir()
    period = round(1e9 / RATE)
    stamps = [[START_NS + k * period for k in range(40)],
              [START_NS + k * period - (period + overlap_ns) for k in range(40, 80)]]
    for i, part_stamps in enumerate(stamps):
        part = write_bag(tmp_path / f"part{i}", [(t, "/x", "std_msgs/msg/Float64",
                                                  float64(store, speed(k)))
                                                 for k, t in enumerate(part_stamps)],
                         storage=storage, store=store)
        (part / f"part{i}.{ext}").rename(split / f"part{i}.{ext}")
    meta = yaml.safe_load((tmp_path / "part0" / "metadata.yaml").read_text())
    info = meta["rosbag2_bagfile_information"]
    info["relative_file_paths"], info["files"] = [f"part0.{ext}", f"part1.{ext}"], []
    info["message_count"] = info["topics_with_message_count"][0]["message_count"] = 80
    info["duration"]["nanoseconds"] = max(stamps[0][-1], stamps[1][-1]) - START_NS
    (split / "metadata.yaml").write_text(yaml.safe_dump(meta))
    return split


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
@pytest.mark.parametrize("overlap_ns", [1_000, 300_000_000])
def test_a_split_file_starting_before_the_last_one_ends_plays_in_time_order(
        tmp_path, storage, overlap_ns):
    """A valid recording was refused as 'listed out of time order' when the second file
    began a microsecond before the first one's last message."""
    from thinkmem_ros import cli
    from thinkmem_ros.playback.player import BagPlayer, PlayConfig

    split = split_with_overlap(tmp_path, storage, overlap_ns)
    stamps = [m.timestamp_ns for m in BagStream(split)]
    assert len(stamps) == 80 and stamps == sorted(stamps)
    assert BagPlayer(_Node(), BagStream(split), PlayConfig(rate=1000.0)).play().published == 80
    assert checked_bag_info(split).message_count == 80
    assert cli.main(["calibrate", str(split), "--params", str(params(tmp_path))]) == 0
