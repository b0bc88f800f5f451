"""Bags that rosbag2 itself reads but the bag paths once refused or misread.

Real files written with ``rosbags``' writers, then shaped as real tools leave them: a
metadata.yaml whose QoS text differs from the QoS stored in the storage file (as in
ros2/rosbag2's own test fixtures), a lone ``.mcap`` or ``.db3`` file, a folder of complete
storage files without metadata.yaml, and a pre-Iron sqlite3 bag of a type installed nowhere.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import yaml
from test_bag_hostile import RATE, START_NS, float64, one_line_error, params, rules, speed, train

from thinkmem_ros import cli
from thinkmem_ros.playback.bag_files import BagError, BagStream, checked_bag_info

N = int(40 * RATE)  # messages of a 40 s bag (training holds out a 15 s stretch)

OTHER_QOS = ("- history: 1\n  depth: 10\n  reliability: 1\n  durability: 2\n"
             "  deadline:\n    sec: 0\n    nsec: 0\n  lifespan:\n    sec: 0\n    nsec: 0\n"
             "  liveliness: 1\n  liveliness_lease_duration:\n    sec: 0\n    nsec: 0\n"
             "  avoid_ros_namespace_conventions: false")
"""A QoS profile as an older rosbag2 wrote it into metadata.yaml (history and liveliness
as numbers), other than the one rosbags' writer stores in the storage file."""


def speed_bag(path: Path, storage: str = "mcap", start_ns: int = START_NS) -> Path:
    """``/x`` (std_msgs/msg/Float64) at ``RATE`` for 40 s, written with rosbags' writer."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        conn = writer.add_connection("/x", "std_msgs/msg/Float64", typestore=store)
        for k in range(N):
            writer.write(conn, start_ns + round(k * 1e9 / RATE), float64(store, speed(k)))
    return path


def with_metadata_qos(bag: Path, qos_text: str) -> Path:
    """Rewrite the QoS text of every topic in ``bag``'s metadata.yaml (storage untouched)."""
    meta_file = bag / "metadata.yaml"
    meta = yaml.safe_load(meta_file.read_text())
    for topic in meta["rosbag2_bagfile_information"]["topics_with_message_count"]:
        topic["topic_metadata"]["offered_qos_profiles"] = qos_text
    meta_file.write_text(yaml.safe_dump(meta))
    return bag


# --- metadata.yaml's QoS text differs from the storage file's ------------------------------

@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_bag_whose_metadata_qos_differs_from_its_storage_reads_whole(tmp_path, storage,
                                                                        capsys):
    """rosbags pairs a storage file's connections with metadata.yaml's only when their
    QoS is equal: such a bag (ros2/rosbag2's own 'talker' and 'convert_a' fixtures) read
    0 messages and was called 'damaged: read 0 of the 400 messages'."""
    bag = with_metadata_qos(speed_bag(tmp_path / "b", storage), OTHER_QOS)
    info = checked_bag_info(bag)
    assert info.topics == {"/x": ("std_msgs/msg/Float64", N)}
    assert sum(1 for _ in BagStream(bag)) == N
    assert cli.main(["bag", "info", str(bag)]) == 0
    assert f"messages: {N}" in capsys.readouterr().out
    assert train(bag, params(tmp_path), rules(tmp_path), tmp_path / "out") == 0


# --- a lone storage file, and a folder of storage files without metadata.yaml -------------

SUFFIX = {"mcap": ".mcap", "sqlite3": ".db3"}


def lone_mcap(tmp_path: Path, name: str = "drive.mcap", storage: str = "mcap") -> Path:
    """The storage file of a written bag on its own, as ``ros2 bag play drive.mcap`` takes
    it."""
    bag = speed_bag(tmp_path / "written", storage)
    return next(bag.glob(f"*{SUFFIX[storage]}")).rename(tmp_path / name)


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_lone_storage_file_reads_as_a_bag(tmp_path, capsys, storage):
    """A lone .mcap was refused ('not a bag: ... a rosbag2 bag is a folder') although it
    holds its own summary and ``ros2 bag play drive.mcap`` plays it; a lone .db3 too,
    though its tables hold its topics, counts and times as well."""
    drive = lone_mcap(tmp_path, f"drive{SUFFIX[storage]}", storage)
    assert cli.main(["bag", "info", str(drive)]) == 0
    out = capsys.readouterr().out
    assert f"messages: {N}" in out and f"storage:  {storage}" in out
    info = checked_bag_info(drive)
    assert info.topics == {"/x": ("std_msgs/msg/Float64", N)}
    assert info.end_ns - info.start_ns == round((N - 1) * 1e9 / RATE)
    assert [m.timestamp_ns for m in BagStream(drive)][-1] == info.end_ns
    assert train(drive, params(tmp_path), rules(tmp_path), tmp_path / "out") == 0


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_folder_of_complete_storage_files_without_metadata_reads_whole(tmp_path, capsys,
                                                                         storage):
    """Such a folder was sent to ``ros2 bag reindex`` ('a recording stopped before it
    closed'), which needs a ROS install; each MCAP file carries its own summary, and each
    .db3 file its own tables."""
    folder = tmp_path / "run"
    folder.mkdir()
    after = START_NS + N * round(1e9 / RATE)  # the second file goes on where the first ends
    written = (speed_bag(tmp_path / "a", storage),
               speed_bag(tmp_path / "b", storage, start_ns=after))
    for k, bag in enumerate(written):
        next(bag.glob(f"*{SUFFIX[storage]}")).rename(folder / f"run_{k}{SUFFIX[storage]}")
    assert cli.main(["bag", "info", str(folder)]) == 0
    out = capsys.readouterr().out
    assert f"messages: {2 * N}" in out and f"storage:  {storage}" in out
    stamps = [m.timestamp_ns for m in BagStream(folder)]
    assert len(stamps) == 2 * N and stamps == sorted(stamps)
    assert stamps[-1] - stamps[0] == round((2 * N - 1) * 1e9 / RATE)


def test_a_truncated_lone_mcap_file_is_one_line_naming_it(tmp_path, capsys):
    """A cut-short MCAP file has no summary and no end: refused in one line, not read."""
    drive = lone_mcap(tmp_path)
    drive.write_bytes(drive.read_bytes()[: drive.stat().st_size * 2 // 3])
    assert cli.main(["bag", "info", str(drive)]) == 1
    line = one_line_error(capsys)
    assert str(drive) in line and "cannot open bag" in line
    killed = tmp_path / "killed"
    killed.mkdir()
    drive.rename(killed / "killed_0.mcap")
    assert cli.main(["bag", "info", str(killed)]) == 1
    assert "holds killed_0.mcap: a recording stopped before it closed" in one_line_error(capsys)


def test_an_empty_or_cut_db3_file_is_one_line_naming_it(tmp_path, capsys):
    """A .db3 that is no database, whole or in a folder without metadata.yaml."""
    drive = lone_mcap(tmp_path, "drive.db3", "sqlite3")
    drive.write_bytes(drive.read_bytes()[:3000])
    assert cli.main(["bag", "info", str(drive)]) == 1
    line = one_line_error(capsys)
    assert str(drive) in line and "cannot open bag" in line
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "killed_0.db3").touch()
    assert cli.main(["bag", "info", str(killed)]) == 1
    assert "holds killed_0.db3: a recording stopped before it closed" in one_line_error(capsys)


# --- a pre-Iron sqlite3 bag of a type neither the bag nor this machine defines ------------

def undefined_wheel_bag(path: Path) -> Path:
    """``/wheel`` (acme_msgs/msg/Wheel) in sqlite3 storage without its definition stored,
    as rosbag2 before Iron recorded it (no message_definitions rows)."""
    import sqlite3

    from test_bag_hostile import WHEEL, _store, write_bag

    store = _store(custom=True)
    rows = [(START_NS + k * 100_000_000, "/wheel", WHEEL, bytes(store.serialize_cdr(
        store.types[WHEEL](speed=speed(k), note="hi"), WHEEL))) for k in range(N)]
    bag = write_bag(path, rows, storage="sqlite3", store=store)
    with contextlib.closing(sqlite3.connect(next(bag.glob("*.db3")))) as db, db:
        db.execute("DELETE FROM message_definitions")
    return bag


def test_a_type_without_definition_in_bag_or_here_is_named(tmp_path, capsys):
    """Every message was counted as 'could not be decoded (wrong type or damaged bag)',
    which sends one looking for damage instead of naming the missing definition."""
    from test_bag_hostile import WHEEL

    from thinkmem_ros.commands import calibrate

    bag = undefined_wheel_bag(tmp_path / "b")
    wheel_params = params(tmp_path, "speed", "/wheel", WHEEL)
    assert train(bag, wheel_params, rules(tmp_path), tmp_path / "out") == 1
    line = one_line_error(capsys)
    assert WHEEL in line and "no definition in the bag" in line
    assert "no standard ROS 2 type" in line and "could not be decoded" not in line
    with pytest.raises(BagError, match=f"/wheel is recorded as {WHEEL}, which has no "
                                       "definition in the bag"):
        calibrate.calibrate(bag, wheel_params)
