"""Damaged and hostile recordings: every one is a one-line refusal, never a silent result.

Each bag here is a small real rosbag2 (MCAP or SQLite) or ROS 1 file written with
``rosbags`` the way a recorder writes it, then damaged the way the field damages them: a
robot's own message type, messages cut short, rows of the wrong SQL type, a metadata.yaml
that lies about its time range, storage files listed out of order, a far-off stamp, a
damaged ROS 1 chunk.
"""

from __future__ import annotations

import math
import os
import random
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from thinkmem_ros.commands import calibrate
from thinkmem_ros.playback.bag_files import BagError
from thinkmem_ros.playback.recording import (
    MAX_RECORDING_FRAMES,
    check_readable,
    load_signal_map,
    parse_signal_map,
    read_recording,
    read_samples,
)

START_NS = 1_700_000_000 * 10**9
RATE = 10.0
WHEEL = "acme_msgs/msg/Wheel"
WHEEL_MSG = "float64 speed\nstring note\n"


def _store(custom: bool = False):
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    if custom:
        store.register(get_types_from_msg(WHEEL_MSG, WHEEL))
    return store


def speed(k: int) -> float:
    """Frame k's value: 2 s fast, 2 s slow, so a threshold rule has both classes."""
    return 1.0 if (k // 20) % 2 == 0 else 0.0


def float64(store, value: float) -> bytes:
    return bytes(store.serialize_cdr(store.types["std_msgs/msg/Float64"](data=value),
                                     "std_msgs/msg/Float64"))


def write_bag(path: Path, rows: list[tuple[int, str, str, bytes]], *,
              storage: str = "mcap", store=None) -> Path:
    """A rosbag2 bag of raw (t_ns, topic, msgtype, cdr) rows, definitions from ``store``."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    store = store or _store()
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        conns = {}
        for t_ns, topic, msgtype, data in rows:
            if topic not in conns:
                conns[topic] = writer.add_connection(topic, msgtype, typestore=store)
            writer.write(conns[topic], t_ns, data)
    return path


def float_bag(path: Path, seconds: float = 8.0, *, storage: str = "mcap",
              data=None) -> Path:
    """``/x`` (std_msgs/Float64) at RATE carrying speed(k); ``data(k, cdr)`` may damage it."""
    store = _store()
    rows = []
    for k in range(int(seconds * RATE)):
        cdr = float64(store, speed(k))
        rows.append((START_NS + round(k * 1e9 / RATE), "/x", "std_msgs/msg/Float64",
                     data(k, cdr) if data else cdr))
    return write_bag(path, rows, storage=storage, store=store)


def params(tmp_path: Path, field: str = "data", topic: str = "/x",
           msgtype: str = "std_msgs/msg/Float64", **extra) -> Path:
    path = tmp_path / "params.yaml"
    signal = {"topic": topic, "type": msgtype, "field": field, "unit": "m/s", **extra}
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": {
        "frame_rate_hz": RATE, "signals": {"motion": signal}}}}))
    return path


def rules(tmp_path: Path, above: float = 0.5) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"labels": {"fast": {"threshold": {
        "signal": "motion", "above": above}}}}))
    return path


def train(bag: Path, params_file: Path, rules_file: Path, out: Path) -> int:
    """Exit status of a tiny ``thinkmem train --bag``; a SystemExit message goes to stderr."""
    from thinkmem_ros import cli

    try:
        return cli.main(["train", "--bag", str(bag), "--params", str(params_file), "--labels",
                         str(rules_file), "--window", "8", "--augment", "0", "--epochs", "1",
                         "--min-steps", "0", "--batch-size", "64", "--patience", "1",
                         "--preset", "fast", "--no-progress", "--out", str(out)])
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return 1
        return exc.code


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err.splitlines()[-1]


# --- a robot's own message types --------------------------------------------------------

@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_custom_message_type_decodes_from_the_bags_own_definition(tmp_path, storage):
    store = _store(custom=True)
    wheel = store.types[WHEEL]
    rows = [(START_NS + k * 100_000_000, "/wheel", WHEEL, bytes(store.serialize_cdr(
        wheel(speed=math.sin(k / 5), note="hi"), WHEEL))) for k in range(50)]
    bag = write_bag(tmp_path / "b", rows, storage=storage, store=store)
    signal_map = load_signal_map(params(tmp_path, "speed", "/wheel", WHEEL))
    samples = read_samples(bag, signal_map)
    assert samples.undecodable() == {}
    np.testing.assert_allclose(samples.values["motion"], np.sin(np.arange(50) / 5))


# --- messages that cannot be decoded ----------------------------------------------------

def test_undecodable_messages_are_counted_and_refuse_training(tmp_path, capsys):
    pytest.importorskip("torch")
    bag = float_bag(tmp_path / "b", data=lambda k, cdr: cdr[:6])  # every message cut short
    p, r = params(tmp_path), rules(tmp_path)
    samples = read_samples(bag, load_signal_map(p))
    assert samples.undecodable() == {"/x": (80, 80)}
    out = tmp_path / "bundle"
    assert train(bag, p, r, out) != 0
    assert "80 of 80 messages on /x could not be decoded" in one_line_error(capsys)
    assert not out.exists()
    report = calibrate.calibrate(bag, p)
    assert any("80 of 80 messages on /x could not be decoded" in w
               for w in report["warnings"])
    assert report["signals"]["motion"]["undecodable"] == 80


def test_a_few_undecodable_messages_are_a_warning_and_more_are_refused(tmp_path):
    signal_map = load_signal_map(params(tmp_path))
    few = float_bag(tmp_path / "few", seconds=20.0,
                    data=lambda k, cdr: cdr[:6] if k == 7 else cdr)  # 1 of 200
    assert check_readable(few, read_samples(few, signal_map), signal_map) == [
        f"{few}: 1 of 200 messages on /x could not be decoded; they are skipped"]
    half = float_bag(tmp_path / "half", data=lambda k, cdr: cdr[:6] if k % 2 else cdr)
    with pytest.raises(BagError, match="40 of 80 messages on /x could not be decoded"):
        check_readable(half, read_samples(half, signal_map), signal_map)


# --- a map that reads nothing usable ----------------------------------------------------

def test_train_refuses_a_field_the_node_refuses(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("std_msgs.msg")
    bag = float_bag(tmp_path / "b")
    assert train(bag, params(tmp_path, field="q"), rules(tmp_path), tmp_path / "o") != 0
    line = one_line_error(capsys)
    assert "signals.motion.field" in line and "the node refuses to start" in line


def test_train_refuses_a_signal_without_a_usable_sample(tmp_path, capsys):
    pytest.importorskip("torch")
    store = _store()
    array = store.types["std_msgs/msg/Float64MultiArray"]
    layout = store.types["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)
    rows = [(START_NS + k * 100_000_000, "/y", "std_msgs/msg/Float64MultiArray",
             bytes(store.serialize_cdr(array(layout=layout, data=np.array([speed(k)])),
                                       "std_msgs/msg/Float64MultiArray"))) for k in range(80)]
    bag = write_bag(tmp_path / "b", rows, store=store)
    p = params(tmp_path, "data", "/y", "std_msgs/msg/Float64MultiArray", index=7)
    assert train(bag, p, rules(tmp_path), tmp_path / "o") != 0
    assert "signals.motion: no usable sample on /y (80 message(s)" in one_line_error(capsys)


def test_train_refuses_a_label_that_is_always_positive(tmp_path, capsys):
    """``above: -1`` on a value that is never negative: a head that always fires."""
    pytest.importorskip("torch")
    bag = float_bag(tmp_path / "b")
    out = tmp_path / "o"
    assert train(bag, params(tmp_path), rules(tmp_path, above=-1.0), out) != 0
    assert "label(s) ['fast'] are always positive" in one_line_error(capsys)
    assert not out.exists()


def test_train_refuses_a_label_that_is_never_positive(tmp_path, capsys):
    pytest.importorskip("torch")
    bag = float_bag(tmp_path / "b")
    out = tmp_path / "o"
    assert train(bag, params(tmp_path), rules(tmp_path, above=5.0), out) != 0
    assert "label(s) ['fast'] are never positive" in one_line_error(capsys)
    assert not out.exists()


# --- storage rows of the wrong SQL type -------------------------------------------------

@pytest.mark.parametrize(("column", "value", "says"), [
    ("data", 12, "holds int data, not serialized bytes"),
    ("data", None, "holds NoneType data, not serialized bytes"),
    ("data", "abc", "holds str data, not serialized bytes"),
    ("timestamp", "soon", "has the timestamp 'soon' (str), not integer ns"),
])
def test_a_storage_row_of_the_wrong_sql_type_is_named(tmp_path, capsys, column, value, says):
    bag = float_bag(tmp_path / "b", storage="sqlite3")
    with sqlite3.connect(bag / "b.db3") as con:
        # a table without NOT NULL whose BLOB column keeps any type it is given (SQLite's
        # type affinity), as another writer or a repair tool may leave it
        con.executescript("CREATE TABLE m2 (id INTEGER PRIMARY KEY, topic_id INTEGER, "
                          "timestamp INTEGER, data BLOB); INSERT INTO m2 SELECT id, topic_id, "
                          "timestamp, data FROM messages; DROP TABLE messages; "
                          "ALTER TABLE m2 RENAME TO messages;")
        con.execute(f"UPDATE messages SET {column} = ? WHERE id = 5", (value,))
    with pytest.raises(BagError, match="message on /x.*" + re.escape(says)):
        read_samples(bag, load_signal_map(params(tmp_path)))
    from thinkmem_ros import cli

    assert cli.main(["calibrate", str(bag), "--params", str(tmp_path / "params.yaml")]) == 2
    assert says in one_line_error(capsys)


# --- timing: what the messages say, not what metadata.yaml claims ------------------------

def _edit_metadata(bag: Path, edit) -> None:
    meta = yaml.safe_load((bag / "metadata.yaml").read_text())
    edit(meta["rosbag2_bagfile_information"])
    (bag / "metadata.yaml").write_text(yaml.safe_dump(meta))


@pytest.mark.parametrize("edit", [
    lambda i: i["starting_time"].update(nanoseconds_since_epoch=START_NS - 3600 * 10**9),
    lambda i: i["duration"].update(nanoseconds=2 * 10**9),
    lambda i: i["starting_time"].update(nanoseconds_since_epoch=START_NS + 10**9),
], ids=["hour_early", "short_duration", "late_start"])
def test_metadata_that_lies_about_the_time_range_is_refused(tmp_path, edit):
    bag = float_bag(tmp_path / "b", storage="sqlite3")
    _edit_metadata(bag, edit)
    with pytest.raises(BagError, match="lies outside the time range the bag declares"):
        read_recording(bag, load_signal_map(params(tmp_path)), RATE)


@pytest.mark.parametrize(("edit", "says"), [
    (lambda i: i.update(files="abc"), "files is a str, not a list"),
    (lambda i: i.update(relative_file_paths={"a": 1}), "relative_file_paths is a dict"),
    (lambda i: i["duration"].update(nanoseconds=10**400), "(401 digits) ns, not whole"),
], ids=["files_str", "paths_dict", "duration_past_int64"])
def test_metadata_of_the_wrong_shape_is_named_not_a_traceback(tmp_path, edit, says):
    from thinkmem_ros.playback.bag_files import checked_bag_info

    bag = float_bag(tmp_path / "b")
    _edit_metadata(bag, edit)
    with pytest.raises(BagError, match=re.escape(says)):
        checked_bag_info(bag)


def split_out_of_order(tmp_path: Path) -> tuple[Path, Path]:
    """``float_bag``'s 8 s as one bag, and split in two files listed later file first."""
    store = _store()
    whole = float_bag(tmp_path / "whole", storage="sqlite3")
    split = tmp_path / "split"
    split.mkdir()
    for i, ks in enumerate((range(0, 40), range(40, 80))):
        part = write_bag(tmp_path / f"part{i}", [
            (START_NS + k * 100_000_000, "/x", "std_msgs/msg/Float64",
             float64(store, speed(k))) for k in ks], storage="sqlite3", store=store)
        (part / f"part{i}.db3").rename(split / f"part{i}.db3")
    meta = yaml.safe_load((whole / "metadata.yaml").read_text())
    info = meta["rosbag2_bagfile_information"]
    info["relative_file_paths"], info["files"] = ["part1.db3", "part0.db3"], []
    (split / "metadata.yaml").write_text(yaml.safe_dump(meta))
    return whole, split


def test_storage_files_listed_out_of_order_still_give_the_timeline(tmp_path):
    whole, split = split_out_of_order(tmp_path)
    signal_map = load_signal_map(params(tmp_path))
    expected = read_recording(whole, signal_map, RATE).values
    np.testing.assert_array_equal(read_recording(split, signal_map, RATE).values, expected)


def test_a_far_off_stamp_is_refused_before_anything_is_allocated(tmp_path):
    bag = float_bag(tmp_path / "b", storage="sqlite3")
    store = _store()
    write_bag(tmp_path / "far", [(START_NS, "/x", "std_msgs/msg/Float64", float64(store, 1.0)),
                                 (2**62, "/x", "std_msgs/msg/Float64", float64(store, 1.0))])
    with pytest.raises(BagError, match=r"at 10 Hz that is .* frames, more than the 5e\+07"):
        read_recording(tmp_path / "far", load_signal_map(params(tmp_path)), RATE)
    assert read_recording(bag, load_signal_map(params(tmp_path)), RATE).values.shape[0] == 80
    assert MAX_RECORDING_FRAMES == 50_000_000


def test_frame_rate_beyond_the_nodes_bounds_is_refused():
    signals = {"a": {"topic": "/a", "type": "std_msgs/msg/Float64", "field": "data"}}
    for rate in (1e12, 1001.0, 0.001):
        with pytest.raises(ValueError, match=r"frame_rate_hz must be 0 .* \[0.01, 1000\]"):
            parse_signal_map({"signals": signals, "frame_rate_hz": rate})
    assert parse_signal_map({"signals": signals, "frame_rate_hz": 1000}).frame_rate_hz == 1000


# --- parameter files --------------------------------------------------------------------

def test_a_yaml_alias_chain_reads_in_linear_time(tmp_path):
    chain = ["k0: &k0 {a: 1, b: 2}"] + [f"k{i}: &k{i} {{x: *k{i - 1}, y: *k{i - 1}}}"
                                         for i in range(1, 25)]  # 2^24 paths, 25 mappings
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(chain) + "\n" + params(tmp_path).read_text())
    started = time.perf_counter()
    # 2^24 values once expanded: refused, as every reader would walk them as a tree
    with pytest.raises(ValueError, match="aliases"):
        load_signal_map(path)
    assert calibrate._find_key(yaml.safe_load(path.read_text()), "bundle_path") is None
    assert time.perf_counter() - started < 2.0


# --- damaged ROS 1 chunks ---------------------------------------------------------------

def _damaged_ros1_bag(path: Path) -> Path:
    """A 400-message ROS 1 bag of small chunks whose middle chunk's message index is zeroed.

    rosbags then skips that chunk's messages without a word (and counts them out of its
    own ``msgcount``); only the chunk index still lists them.
    """
    from rosbags.rosbag1 import Reader as Reader1
    from rosbags.rosbag1 import Writer as Writer1
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    with Writer1(path) as writer:
        writer.chunk_threshold = 2000  # many small chunks, as a long recording has
        conn = writer.add_connection("/x", "std_msgs/msg/Float64", typestore=store)
        for k in range(400):
            writer.write(conn, START_NS + k * 100_000_000, store.serialize_ros1(
                store.types["std_msgs/msg/Float64"](data=speed(k)), "std_msgs/msg/Float64"))
    with Reader1(path) as reader:  # the message index records after a middle chunk
        infos = reader.chunk_infos
        chunk = reader.chunks[infos[len(infos) // 2].pos]
        lo, hi = chunk.datapos + chunk.datasize, infos[len(infos) // 2 + 1].pos
    raw = bytearray(path.read_bytes())
    raw[lo:hi] = bytes(hi - lo)
    path.write_bytes(bytes(raw))
    return path


def test_a_damaged_ros1_chunk_is_an_error_not_a_short_read(tmp_path):
    signal_map = load_signal_map(params(tmp_path))
    with pytest.raises(BagError, match=r"b.bag is damaged: read \d+ of the 400 messages"):
        read_samples(_damaged_ros1_bag(tmp_path / "b.bag"), signal_map)


# --- playing ----------------------------------------------------------------------------

def _play(bag: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, ROS_DOMAIN_ID=str(random.randint(100, 199)),
               ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return subprocess.run([sys.executable, "-m", "thinkmem_ros.cli", "bag", "play", str(bag),
                           "--rate", "10000"], env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.ros
def test_play_refuses_to_wait_out_a_far_off_stamp(tmp_path):
    pytest.importorskip("rclpy")
    store = _store()
    rows = [(START_NS + k * 100_000_000, "/x", "std_msgs/msg/Float64", float64(store, 1.0))
            for k in range(5)] + [(2**62, "/x", "std_msgs/msg/Float64", float64(store, 2.0))]
    done = _play(write_bag(tmp_path / "far", rows))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"the message on /x at {2**62} ns comes" in done.stderr
    assert "gap over 86400 s is a damaged timestamp" in done.stderr


@pytest.mark.ros
def test_play_names_the_topic_of_a_message_rclpy_cannot_publish(tmp_path):
    pytest.importorskip("rclpy")
    store = _store()
    good = float64(store, 1.0)
    rows = [(START_NS, "/x", "std_msgs/msg/Float64", good),
            (START_NS + 10**8, "/x", "std_msgs/msg/Float64", good + bytes(64))]  # too long
    done = _play(write_bag(tmp_path / "long", rows))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"cannot publish the message on /x at {START_NS + 10**8} ns" in done.stderr


def test_converting_a_damaged_ros1_chunk_is_an_error(tmp_path):
    from thinkmem_ros.playback.bag_files import convert_ros1

    bag = _damaged_ros1_bag(tmp_path / "b.bag")
    with pytest.raises(BagError, match=r"b.bag is damaged: converting it read \d+ of the 400"):
        convert_ros1(bag, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # over an existing bag with --overwrite: the old one stays until a new one is whole
    old = float_bag(tmp_path / "out")
    before = sorted((p.name, p.read_bytes()) for p in old.iterdir())
    with pytest.raises(BagError, match="is damaged"):
        convert_ros1(bag, tmp_path / "out", overwrite=True)
    assert sorted((p.name, p.read_bytes()) for p in old.iterdir()) == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_duplicated_storage_rows_are_an_error_not_double_rates(tmp_path):
    bag = float_bag(tmp_path / "b", storage="sqlite3")
    with sqlite3.connect(bag / "b.db3") as con:
        con.execute("INSERT INTO messages (topic_id, timestamp, data) "
                    "SELECT topic_id, timestamp, data FROM messages")
    with pytest.raises(BagError, match="read 160 messages, more than the 80 its metadata"):
        read_samples(bag, load_signal_map(params(tmp_path)))
