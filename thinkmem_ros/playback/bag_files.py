"""rosbag2 files without ROS: write scenario streams as MCAP bags and read any bag back.

Plain Python over the ``rosbags`` package, so bags can be written on a machine without a
ROS install and read back as timed raw CDR messages that a player republishes as-is.
Signals go out on exactly the topics and message types the thinking node subscribes to
(taken from :mod:`thinkmem_ros.robot.node_config`, the one place that defines them), with the
ground-truth thinking labels on a topic of their own so a run can be scored afterwards.

Recordings from real robots are often ROS 1 ``.bag`` files: ``bag_info`` reads them
directly, and ``convert_ros1`` turns one into a rosbag2 folder with ``rosbags``' converter
(message definitions come from the bag; ROS 1 types migrate to their ROS 2 forms, e.g.
``Header.seq`` is dropped), so the player and every other reader see rosbag2 only.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import io
import itertools
import json
import logging
import math
import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from thinkmem_ros.core.data import SignalStream

LOG = logging.getLogger(__name__)

GROUND_TRUTH_TOPIC = "/thinking/ground_truth"
"""Ground-truth thinking labels, one std_msgs/String JSON per frame (never read by the node)."""
STRING_TYPE = "std_msgs/msg/String"
DEFAULT_START_NS = 1_700_000_000 * 10**9
"""Bag start time: fixed so a seeded bag is byte-for-byte reproducible."""
STORAGES = ("mcap", "sqlite3")
ROS1_MAGIC = b"#ROSBAG V2.0\n"
"""First bytes of every ROS 1 bag file (format 2.0, the only one ROS 1 ever wrote)."""


class BagError(RuntimeError):
    """A bag that cannot be written or read, with the path and the reason."""


@dataclass(frozen=True)
class TopicBinding:
    """Where one signal travels: topic, ROS message type and the dotted numeric field."""

    topic: str
    msgtype: str
    field: str

    def __post_init__(self) -> None:
        if not self.topic.startswith("/"):
            raise ValueError(f"topic must be absolute, got {self.topic!r}")
        if self.msgtype.count("/") != 2:
            raise ValueError(f"msgtype must look like 'pkg/msg/Name', got {self.msgtype!r}")
        if not self.field or any(not part for part in self.field.split(".")):
            raise ValueError(f"field must be a dotted path, got {self.field!r}")


@dataclass(frozen=True)
class RawMessage:
    """One recorded message: topic, type, receive time (ns) and its serialized CDR bytes."""

    topic: str
    msgtype: str
    timestamp_ns: int
    data: bytes


@dataclass(frozen=True)
class RecordedQos:
    """What every recorded publisher of a topic offered, for a player to offer alike."""

    transient_local: bool = False  # all latched (/tf_static, /map)
    best_effort: bool = False  # all best effort (a camera, a lidar)


def recorded_qos(connections: Iterable[Any]) -> dict[str, RecordedQos]:
    """Per topic, whether all its recorded QoS profiles offer TRANSIENT_LOCAL / BEST_EFFORT.

    ``ros2 bag play`` adapts each publisher to the recorded offers this way: a latched
    topic goes out latched only when every recorded publisher latched it (one VOLATILE
    offer among them means subscribers had to accept VOLATILE). A connection recorded
    without profiles (sqlite3 bags before rosbag2 recorded QoS) leaves its topic as is.
    """
    from rosbags.interfaces import QosDurability, QosReliability

    offers: dict[str, list[Any]] = {}
    for conn in connections:
        profiles = list(getattr(conn.ext, "offered_qos_profiles", None) or [None])
        offers.setdefault(conn.topic, []).extend(profiles)
    return {topic: RecordedQos(
        transient_local=all(getattr(p, "durability", None) == QosDurability.TRANSIENT_LOCAL
                            for p in profiles),
        best_effort=all(getattr(p, "reliability", None) == QosReliability.BEST_EFFORT
                        for p in profiles)) for topic, profiles in offers.items()}


@dataclass
class BagInfo:
    """What ``ros2 bag info`` shows: storage, time range and per-topic type and count."""

    path: Path
    storage: str
    start_ns: int
    end_ns: int
    topics: dict[str, tuple[str, int]] = field(default_factory=dict)  # topic -> (type, count)
    # topics recorded with more than one message type: topic -> {type: count}; ``topics``
    # then holds the type with the most messages and the count over all of them
    mixed: dict[str, dict[str, int]] = field(default_factory=dict)
    qos: dict[str, RecordedQos] = field(default_factory=dict)  # as recorded (rosbag2 only)

    @property
    def duration_s(self) -> float:
        """Time from the first to the last message."""
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def message_count(self) -> int:
        """Messages over all topics."""
        return sum(count for _, count in self.topics.values())

    def check_one_type(self, topics: Iterable[str]) -> None:
        """BagError naming any of ``topics`` recorded with several message types.

        A ROS 2 topic carries one type, and a signal reads one: such a topic can be
        neither played nor read as a signal (other topics of the bag still can).
        """
        for topic in sorted(set(topics) & set(self.mixed)):
            kinds = ", ".join(f"{kind}: {n}" for kind, n in sorted(self.mixed[topic].items()))
            raise BagError(f"{self.path}: topic {topic} is recorded with "
                           f"{len(self.mixed[topic])} message types ({kinds}); a topic "
                           "carries one type, so leave it out (bag play --topics) or map "
                           "the signal to another topic")


def some_topics(topics: Iterable[str], shown: int = 10) -> str:
    """The first ``shown`` of ``topics`` as a sorted list, and how many more, for messages.

    A bag can record thousands of topics: an error that listed them all was one line of
    tens of kilobytes, the mistyped name lost in it.
    """
    names = sorted(topics)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{names[:shown]}{more}"


def per_topic(connections: Iterable[Any]) -> tuple[dict[str, tuple[str, int]],
                                                   dict[str, dict[str, int]]]:
    """``BagInfo.topics`` and ``.mixed`` from a reader's connections.

    A topic can have several connections: publishers with other QoS (a latched and an
    unlatched /odom in a ROS 1 bag, two QoS profiles in rosbag2), counted together; or,
    rarely, other message types, kept apart in ``mixed``.
    """
    counts: dict[str, dict[str, int]] = {}
    for conn in connections:
        kinds = counts.setdefault(conn.topic, {})
        kinds[conn.msgtype] = kinds.get(conn.msgtype, 0) + conn.msgcount
    topics = {topic: (max(kinds, key=lambda k: (kinds[k], k)), sum(kinds.values()))
              for topic, kinds in counts.items()}
    return topics, {topic: kinds for topic, kinds in counts.items() if len(kinds) > 1}


def default_bindings() -> tuple[dict[str, TopicBinding], str]:
    """Return the node's default signal map and events topic (the one shared definition).

    The node's names are relative (resolved in its namespace); a bag records absolute
    names, the ones a node without a namespace reads.
    """
    from thinkmem_ros.robot import node_config
    from thinkmem_ros.robot.msg_fields import canonical_type

    bindings = {name: TopicBinding(_absolute(spec.topic), canonical_type(spec.msg_type),
                                   spec.field)
                for name, spec in node_config.DEFAULT_SIGNAL_MAP.items()}
    return bindings, _absolute(node_config.DEFAULT_EVENTS_TOPIC)


def _absolute(topic: str) -> str:
    return topic if topic.startswith("/") else "/" + topic


def _typestore():
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_KILTED)


def _default_message(store, msgtype: str) -> Any:
    """Build a zero/empty ``msgtype`` message (rosbags types have no default constructor)."""
    from rosbags.typesys.base import Nodetype

    _, fields = store.fielddefs[msgtype]
    values = {}
    for name, (kind, detail) in fields:
        if kind == Nodetype.BASE:
            base = detail[0]
            values[name] = "" if base in ("string", "wstring") else (
                False if base == "bool" else (0.0 if base.startswith("float") else 0))
        elif kind == Nodetype.NAME:
            values[name] = _default_message(store, detail)
        elif kind == Nodetype.ARRAY:
            (sub_kind, sub_detail), length = detail
            if sub_kind == Nodetype.BASE and sub_detail[0] not in ("string", "wstring"):
                values[name] = np.zeros(length, dtype=_NUMPY[sub_detail[0]])
            else:
                raise BagError(f"{msgtype}.{name}: fixed arrays of {sub_detail} unsupported")
        else:  # SEQUENCE: empty
            (sub_kind, sub_detail), _ = detail
            is_numeric = sub_kind == Nodetype.BASE and sub_detail[0] not in ("string", "wstring")
            values[name] = np.zeros(0, dtype=_NUMPY[sub_detail[0]]) if is_numeric else []
    return store.types[msgtype](**values)


_NUMPY = {"bool": np.bool_, "byte": np.uint8, "char": np.uint8, "int8": np.int8,
          "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16, "int32": np.int32,
          "uint32": np.uint32, "int64": np.int64, "uint64": np.uint64,
          "float32": np.float32, "float64": np.float64}


def _set_path(msg: Any, path: str, value: Any) -> None:
    """Set the dotted attribute ``path`` on a (nested) rosbags message."""
    *parents, leaf = path.split(".")
    if any(part.isdigit() for part in (*parents, leaf)):
        raise BagError(f"field {path!r}: writing into array elements is not supported")
    target = msg
    for part in parents:
        target = getattr(target, part)
    if not hasattr(target, leaf):
        raise BagError(f"message {type(msg).__name__} has no field {path!r}")
    setattr(target, leaf, value)


def _stamp(store, msg: Any, t_ns: int) -> None:
    if hasattr(msg, "header"):
        msg.header.stamp = store.types["builtin_interfaces/msg/Time"](
            sec=t_ns // 10**9, nanosec=t_ns % 10**9)


def _check_replaceable(out: Path, overwrite: bool) -> None:
    """Refuse an output that exists, unless asked to replace it and it is a bag of ours.

    ``--overwrite`` is for re-running a command into the same output folder; a typo in
    the path must not delete a folder of other files (or a plain file) along with it, nor
    the folder the command runs in (``--out .``).
    """
    if out.name in ("", ".", "..") or Path.cwd().resolve().is_relative_to(out.resolve()):
        raise BagError(f"output {out} must name a bag folder of its own, not the folder "
                       "the command runs in or one above it")
    if not out.exists() and not out.is_symlink():
        return
    if not overwrite:
        raise BagError(f"output {out} already exists (pass --overwrite to replace it)")
    if out.is_symlink() or not out.is_dir() or not _bag_files_only(out):
        raise BagError(f"refusing to overwrite {out}: it is not a rosbag2 folder "
                       f"(files other than a bag's, or no .mcap/.db3 file); remove it "
                       f"yourself or pick another output")


BAG_FILE_SUFFIXES = (".yaml", ".mcap", ".db3", ".db3-wal", ".db3-shm", ".db3-journal")
"""What a rosbag2 folder holds (a run cut short leaves its storage file without the
metadata.yaml, and a re-run must still be able to replace it)."""


def _bag_files_only(folder: Path) -> bool:
    """A bag's files and at least one storage file (a folder of .yaml configs is not)."""
    files = list(folder.iterdir())
    return (all(p.is_file() and p.name.endswith(BAG_FILE_SUFFIXES) for p in files)
            and any(p.name.endswith((".mcap", ".db3")) for p in files))


@contextlib.contextmanager
def _output_bag(out: Path, overwrite: bool) -> Iterator[Path]:
    """Where to write the bag for ``out``; it replaces ``out`` only once fully written.

    The bag is written in a hidden folder beside ``out`` and renamed into place at the
    end. Deleting the old bag first lost it whenever the new one failed: a damaged input
    to convert, a Ctrl-C a second into ``bag write``, a refusal found after the delete.
    """
    _check_replaceable(out, overwrite)
    _check_writable(out)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    target = stage / out.name  # the bag's files are named after its folder
    try:
        with _sigterm_raises():
            yield target
        _check_replaceable(out, overwrite)  # still a bag of ours (or nothing) at the end
        old = stage / f"{out.name}.old"
        if out.exists():
            os.rename(out, old)
        try:
            os.rename(target, out)
        except OSError:
            if old.exists():
                os.rename(old, out)
            raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Meanwhile SIGTERM raises SystemExit(143), so the ``finally`` blocks around run.

    SIGTERM's default action ends the process on the spot: a ``bag write`` stopped that
    way left its hidden staging folder behind, where Ctrl-C (KeyboardInterrupt) cleaned
    up. Only the default action is replaced, and only in the main thread, so a caller's
    own handler (the player's, while it converts a ROS 1 bag) keeps working.
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def raise_exit(signum, _frame) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def write_stream(stream: SignalStream, out: Path | str, *,
                 bindings: Mapping[str, TopicBinding] | None = None,
                 events_topic: str | None = None,
                 truth_topic: str = GROUND_TRUTH_TOPIC,
                 start_ns: int = DEFAULT_START_NS,
                 storage: str = "mcap", overwrite: bool = False) -> BagInfo:
    """Record ``stream`` as a rosbag2 bag; a NaN (dropout) frame sends nothing on that topic.

    Each frame t is stamped ``start_ns + t / rate`` (header stamp and bag time agree);
    every frame also gets a ground-truth message ``{"frame", "stamp_ns", "active"}`` on
    ``truth_topic`` so playback can be scored against what the world generator intended.
    """
    out = Path(out)
    if bindings is None or events_topic is None:
        default_map, default_events = default_bindings()
        bindings = default_map if bindings is None else bindings
        events_topic = default_events if events_topic is None else events_topic
    missing = [name for name in stream.signal_names if name not in bindings]
    if missing:
        raise ValueError(f"no topic binding for signals {missing}")
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got {storage!r}")
    with _output_bag(out, overwrite) as target:
        _write_frames(stream, target, bindings, events_topic, truth_topic, start_ns, storage)
    LOG.info("wrote %s (%d frames of %r)", out, stream.values.shape[0], stream.scenario)
    return bag_info(out)


def _write_frames(stream: SignalStream, out: Path, bindings: Mapping[str, TopicBinding],
                  events_topic: str, truth_topic: str, start_ns: int, storage: str) -> None:
    """``write_stream``'s messages into the new bag folder ``out``."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    store = _typestore()
    period_ns = 1e9 / stream.rate_hz
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    writer = Writer(out, version=9, storage_plugin=plugin)
    writer.set_custom_data("thinkmem.scenario", stream.scenario)
    writer.set_custom_data("thinkmem.rate_hz", repr(float(stream.rate_hz)))
    writer.set_custom_data("thinkmem.label_names", ",".join(stream.label_names))
    writer.open()
    try:
        signal_conns = [(col, bindings[name], writer.add_connection(
            bindings[name].topic, bindings[name].msgtype, typestore=store))
            for col, name in enumerate(stream.signal_names)]
        events_conn = writer.add_connection(events_topic, STRING_TYPE, typestore=store)
        truth_conn = writer.add_connection(truth_topic, STRING_TYPE, typestore=store)
        string_type = store.types[STRING_TYPE]
        events = sorted(stream.events)
        next_event = 0
        for t in range(stream.values.shape[0]):
            t_ns = start_ns + round(t * period_ns)
            frame_end_ns = start_ns + round((t + 1) * period_ns)
            for col, binding, conn in signal_conns:
                value = float(stream.values[t, col])
                if math.isnan(value):
                    continue
                msg = _default_message(store, binding.msgtype)
                _stamp(store, msg, t_ns)
                _set_path(msg, binding.field, value)
                writer.write(conn, t_ns, bytes(store.serialize_cdr(msg, binding.msgtype)))
            while next_event < len(events) and start_ns + round(
                    events[next_event][0] * 1e9) < frame_end_ns:
                e_ns = max(t_ns, start_ns + round(events[next_event][0] * 1e9))
                data = store.serialize_cdr(string_type(data=events[next_event][1]), STRING_TYPE)
                writer.write(events_conn, e_ns, bytes(data))
                next_event += 1
            active = [stream.label_names[i] for i in np.flatnonzero(stream.labels[t] > 0.5)]
            truth = json.dumps({"frame": t, "stamp_ns": t_ns, "active": active})
            writer.write(truth_conn, t_ns,
                         bytes(store.serialize_cdr(string_type(data=truth), STRING_TYPE)))
    finally:
        writer.close()


def is_ros1_bag(path: Path | str) -> bool:
    """True when ``path`` is a ROS 1 bag file (checked by its magic bytes, not its name).

    Only a regular file is opened: opening a FIFO waits for a writer for ever, and Python
    retries the interrupted open after a SIGINT or SIGTERM handler has run. A regular file
    that cannot be read is a BagError naming why: answered False, an unreadable ROS 1 bag
    was reported as "no '#ROSBAG V2.0' header" or "not a bag", blaming its content.
    """
    path = Path(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
    except OSError:  # missing or unreachable: said by whoever opens it (check_bag_path)
        return False
    try:
        with path.open("rb") as handle:
            return handle.read(len(ROS1_MAGIC)) == ROS1_MAGIC
    except OSError as exc:
        raise BagError(f"cannot read {path}: {exc.strerror or exc}") from None


def _convert_hint(path: Path) -> str:
    return f"convert it with 'thinkmem bag convert {path} OUT_DIR'"


def _reader(path: Path):
    """An open rosbags reader of a rosbag2 folder or of a lone ``.mcap`` or ``.db3`` file.

    ``ros2 bag play drive.mcap`` plays one storage file as it stands (the launch file's
    ``play_bag:=/data/run.mcap``), and so do these paths: an MCAP file carries its own
    summary (topics, counts, time range and definitions), and a ``.db3`` file its topics
    and messages as tables that give the same.
    """
    from rosbags.rosbag2 import Reader

    check_bag_path(path)
    if not path.exists():
        raise BagError(f"bag not found: {path}")
    if is_ros1_bag(path):
        raise BagError(f"{path} is a ROS 1 bag: {_convert_hint(path)} (bag info and bag "
                       "play read it directly)")
    if not path.is_dir():
        if path.suffix not in STORAGE_SUFFIXES:
            raise BagError(f"not a bag: {path} is a file that is no ROS 1 bag (no "
                           f"'#ROSBAG V2.0' header) and no .mcap or .db3 file, and a "
                           "rosbag2 bag of another storage is a folder")
        return _opened(Reader(path), path)
    if not (path / "metadata.yaml").is_file():
        return _metadataless_reader(path)
    _check_metadata_lists(path)
    return _opened(Reader(path), path)


def _opened(reader, path: Path):
    """``reader`` opened; what rosbags raises for a corrupt bag becomes one BagError."""
    try:
        reader.open()
    except Exception as exc:  # rosbags raises several unrelated types for corrupt bags
        raise BagError(f"cannot open bag {path}: {exc}") from exc
    return reader


STORAGE_SUFFIXES = (".mcap", ".db3")
"""The rosbag2 storage files read without metadata.yaml: they describe themselves."""


def _storage_files(folder: Path) -> list[Path]:
    """The .db3 and .mcap files of a bag folder in recording order (``_2`` before ``_10``)."""
    def order(file: Path) -> tuple:
        stem, _, number = file.stem.rpartition("_")
        return (stem, int(number)) if number.isdigit() else (file.stem, -1)

    return sorted((p for p in folder.iterdir() if p.suffix in STORAGE_SUFFIXES),
                  key=lambda p: (*order(p), p.name))


def _metadataless_reader(path: Path):
    """A reader of a folder of complete storage files that has no metadata.yaml.

    A recorder stopped before it closed leaves no metadata.yaml, yet an MCAP file that
    it did close holds its own summary, and a .db3 file its topics and messages, so the
    folder reads as it stands (``ros2 bag reindex``, which needs a ROS install, only
    writes that metadata.yaml). An MCAP file cut short (no summary, no end) or a .db3
    file that is no database still needs the reindex, which the error says.
    """
    from rosbags.rosbag2 import Reader

    stored = _storage_files(path)
    if not stored:
        raise BagError(f"not a rosbag2 bag (no metadata.yaml file): {path}")
    reader = Reader(stored[0])
    reader.storage = StorageFolder(stored)
    try:
        return _opened(reader, path)
    except BagError as exc:
        why = " ".join(str(exc.__cause__).split())
        raise BagError(f"not a rosbag2 bag (no metadata.yaml file): {path}"
                       f"{_reindex_hint(path, stored, why)}") from exc


def _reindex_hint(path: Path, stored: list[Path], why: str = "") -> str:
    """What to do about a folder of storage files without metadata.yaml ('' if none)."""
    if not stored:
        return ""
    because = f" ({why})" if why else ""
    return (f"; it holds {stored[0].name}{' and more' if len(stored) > 1 else ''}: a "
            f"recording stopped before it closed{because}, which `ros2 bag reindex "
            f"{path}` repairs")


class StorageFolder:
    """A rosbags storage over MCAP or .db3 files without metadata.yaml, read as a split bag.

    Each file gives its own connections, counts and time range (an MCAP file's summary, a
    .db3 file's tables); the folder's are their union (a topic's connections in several
    files are counted together, as ``per_topic`` counts a split bag's). Messages come
    file by file, each through rosbags' own reader of its storage, and ``BagStream``
    merges the files by time.
    """

    def __init__(self, files: list[Path]) -> None:
        from rosbags.rosbag2.metadata import ReaderMetadata

        self.files = files
        self.storages: list[Any] = []
        self.connections: list[Any] = []
        self.metadata = ReaderMetadata(0, 2**63 - 1, 0, 0, None, None, None, None)

    def open(self) -> None:
        """Open every file, closing those already open when one fails."""
        from rosbags.rosbag2.storage_mcap import McapReader
        from rosbags.rosbag2.storage_sqlite3 import Sqlite3Reader

        try:
            for file in self.files:
                storage = (McapReader if file.suffix == ".mcap" else Sqlite3Reader)(file)
                storage.open()
                self.storages.append(storage)
        except BaseException:
            self.close()
            raise
        self.connections = [conn for one in self.storages for conn in one.connections]
        self.metadata = self._summary()

    def _summary(self):
        """The folder's ReaderMetadata: its files' counts and overall time range."""
        counted = [one.metadata for one in self.storages if one.metadata.message_count]
        if not counted:
            return self.metadata
        start = min(m.start_time for m in counted)
        end = max(m.end_time for m in counted)  # rosbags' end: last stamp + 1 ns
        return self.metadata._replace(duration=end - start, start_time=start, end_time=end,
                                      message_count=sum(m.message_count for m in counted))

    def close(self) -> None:
        """Close every open file."""
        storages, self.storages = self.storages, []
        for storage in storages:
            with contextlib.suppress(Exception):
                storage.close()
        self.connections = []

    def messages(self, connections, start: int | None = None, stop: int | None = None):
        """The files' messages one file after another (``BagStream`` merges them by time)."""
        for storage in self.storages:
            yield from storage.messages(_file_connections(storage, connections), start, stop)


def _declared_by(path: Path) -> str:
    """What states a bag's counts and time range: its metadata.yaml or its storage files."""
    if (path / "metadata.yaml").is_file():
        return "its metadata.yaml"
    return "its MCAP summary" if _storage_of(path) == "mcap" else "its database tables"


def _check_metadata_lists(path: Path) -> None:
    """BagError when metadata.yaml's lists are not lists (``files: abc``).

    rosbags takes them as they stand and failed later, in its own close, with an
    AttributeError that named nothing of the bag.
    """
    import yaml

    try:
        meta = yaml.safe_load((path / "metadata.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # rosbags' own open says what is wrong with such a file
    info = meta.get("rosbag2_bagfile_information") if isinstance(meta, dict) else None
    if not isinstance(info, dict):
        return
    for key in ("relative_file_paths", "files", "topics_with_message_count"):
        if key in info and not isinstance(info[key], (list, type(None))):
            raise BagError(f"bag {path} is damaged: its metadata.yaml's {key} is a "
                           f"{type(info[key]).__name__}, not a list")


def check_bag_path(path: Path | str) -> Path:
    """``path`` as a Path; ValueError when it, or an entry of its folder, is no file.

    A FIFO, device or socket as the bag, its metadata.yaml or a storage file would block
    the first read for ever; ``os.stat`` never blocks, so this runs before any open. A
    folder that cannot be listed (no read permission) is a BagError naming it: every
    reader of a bag comes through here, and a bare PermissionError escaped them. So is a
    path that cannot even be looked up (a symlink loop), which read as "bag not found".
    """
    from thinkmem_ros.core.input_files import input_path

    path = input_path(path, "bag")
    try:
        os.stat(path)
    except FileNotFoundError:
        return path  # "bag not found", said by whoever opens it
    except OSError as exc:
        raise BagError(f"cannot read bag {path}: {exc.strerror or exc}") from None
    if path.is_dir():
        try:
            entries = list(path.iterdir())
        except OSError as exc:
            raise BagError(f"cannot read bag folder {path}: {exc.strerror or exc}") from None
        for entry in entries:
            input_path(entry, "bag file")
    return path


def _storage_of(path: Path) -> str:
    """The storage metadata.yaml names; without one, that of the storage files."""
    import yaml

    if path.is_file():
        return "sqlite3" if path.suffix == ".db3" else "mcap"
    if not (path / "metadata.yaml").is_file():
        stored = _storage_files(path)
        return "sqlite3" if stored and stored[0].suffix == ".db3" else "mcap"
    meta = yaml.safe_load((path / "metadata.yaml").read_text())
    return str(meta.get("rosbag2_bagfile_information", {}).get("storage_identifier", ""))


def ros1_bag_info(path: Path | str) -> BagInfo:
    """Time range and per-topic type/count of a ROS 1 bag file (storage ``rosbag1``)."""
    from rosbags.rosbag1 import Reader as Reader1

    path = Path(path)
    try:
        with Reader1(path) as reader:
            topics, mixed = per_topic(reader.connections)
            count = reader.message_count
            start = reader.start_time if count else 0
            end = reader.end_time - 1 if count else start
    except Exception as exc:  # rosbags raises several unrelated types for corrupt bags
        raise BagError(f"cannot open ROS 1 bag {path}: {exc}") from exc
    return BagInfo(path=path, storage="rosbag1", start_ns=start, end_ns=end, topics=topics,
                   mixed=mixed)


def convert_ros1(src: Path | str, dst: Path | str, *, storage: str = "mcap",
                 overwrite: bool = False) -> BagInfo:
    """Convert ROS 1 bag ``src`` into rosbag2 folder ``dst``; BagError naming what failed.

    Uses ``rosbags.convert`` with the ROS 2 Kilted typestore as destination, so standard
    types are written in their ROS 2 form (what installed ROS 2 packages deserialise) and
    types the store lacks are carried over from the bag's own message definitions.
    """
    from rosbags.convert import convert

    src, dst = check_bag_path(src), Path(dst)
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got {storage!r}")
    if not src.exists():
        raise BagError(f"bag not found: {src}")
    if not is_ros1_bag(src):
        raise BagError(f"not a ROS 1 bag file (no '#ROSBAG V2.0' header): {src}")
    if dst.suffix == ".bag":
        raise BagError(f"output {dst} must be a folder name, not a .bag file")
    with _output_bag(dst, overwrite) as target:
        chatter = io.StringIO()  # rosbags prints notes ('copying from source') on stdout
        try:
            with contextlib.redirect_stdout(chatter):
                convert([src], target, storage, 9, None, "file", None, _typestore(), [], [],
                        [], [])
            for line in chatter.getvalue().splitlines():
                LOG.info("convert %s: %s", src, line)
        except Exception as exc:  # noqa: BLE001 - rosbags raises many types; each is one line
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise BagError(f"cannot convert {src}: {reason}") from exc
        written = bag_info(target).message_count
        listed = ros1_indexed_count(src)
        if written < listed:
            raise BagError(f"ROS 1 bag {src} is damaged: converting it read {written} "
                           f"of the {listed} messages its chunk index lists")
    return bag_info(dst)


def _check_writable(dst: Path) -> None:
    """Make ``dst``'s parent and probe it; BagError naming the output when it cannot be.

    rosbags' converter reports an unwritable output as "cannot convert <input>:
    FileNotFoundError", which blames the input bag. A probe file is the real test:
    permission bits say nothing to root, and /proc refuses only the actual write.
    """
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=dst.parent).close()
    except OSError as exc:
        raise BagError(f"cannot write the output {dst} in {dst.parent}: "
                       f"{exc.strerror or exc}") from None


def ros1_indexed_count(path: Path | str) -> int:
    """Messages a ROS 1 bag's chunk index lists (over every connection of every chunk).

    rosbags' own counts come from the per-chunk message indexes, which a damaged chunk
    cuts short without an error; this is what the bag was written with.
    """
    from rosbags.rosbag1 import Reader as Reader1

    try:
        with Reader1(Path(path)) as reader:
            return sum(sum(info.connection_counts.values()) for info in reader.chunk_infos)
    except Exception as exc:  # rosbags raises several unrelated types for corrupt bags
        raise BagError(f"cannot open ROS 1 bag {path}: {exc}") from exc


def bag_info(path: Path | str) -> BagInfo:
    """Storage, time range and per-topic type/count of a rosbag2 bag or a ROS 1 bag file."""
    path = check_bag_path(path)
    if is_ros1_bag(path):
        return ros1_bag_info(path)
    reader = _reader(path)
    try:
        topics, mixed = per_topic(reader.connections)
        # rosbags reports an exclusive end (last stamp + 1 ns); ros2 bag info shows the last
        end_ns = reader.end_time - 1 if reader.message_count else reader.start_time
        return BagInfo(path=path, storage=_storage_of(path), start_ns=reader.start_time,
                       end_ns=end_ns, topics=topics, mixed=mixed,
                       qos=recorded_qos(reader.connections))
    finally:
        reader.close()


INFO_SAMPLED = 1000
"""Messages ``checked_bag_info`` reads (raw, undecoded) to check the declared time range."""


def checked_bag_info(path: Path | str) -> BagInfo:
    """``bag_info`` once the bag's first messages and files agree with what it declares.

    A rosbag2 bag's time range and counts are metadata.yaml's claims: printed as they
    stand they were "duration: nan s" or 387 messages of a bag with no storage file,
    while play and calibrate, which read the messages, refuse that bag. So the range must
    be whole ns with end >= start, every listed storage file must be there, and the first
    ``INFO_SAMPLED`` messages (raw bytes, nothing decoded) must lie inside the range. Only
    that many: ``bag info`` answers at once on a bag of gigabytes, as ``ros2 bag info``
    does; play and calibrate read every message and check the rest. A ROS 1 bag's range
    comes from its own index; its chunk index must list no more messages than its readers
    find.
    """
    info = bag_info(path)
    if info.storage == "rosbag1":
        listed = ros1_indexed_count(info.path)
        if info.message_count < listed:
            raise BagError(f"ROS 1 bag {info.path} is damaged: its message indexes hold "
                           f"{info.message_count} of the {listed} messages its chunk index "
                           "lists")
        return info
    _check_time_range(info)
    if (info.path / "metadata.yaml").is_file():  # an MCAP file's summary lists no files
        _check_storage_files(info)
    one_type = [t for t in info.topics if t not in info.mixed]  # the rest are listed apart
    for message in itertools.islice(BagStream(info.path, one_type) if one_type else (),
                                    INFO_SAMPLED):
        if not info.start_ns <= message.timestamp_ns <= info.end_ns:
            raise BagError(f"{info.path}: a message on {message.topic} at "
                           f"{message.timestamp_ns} ns lies outside the time range "
                           f"{_declared_by(info.path)} declares ({info.start_ns} ns + "
                           f"{info.duration_s:.9g} s); the metadata (starting_time / "
                           "duration) is wrong or the timestamp is damaged")
    return info


def _check_storage_files(info: BagInfo) -> None:
    """Every storage file metadata.yaml lists is there, and it lists one if it counts any."""
    import yaml

    meta = yaml.safe_load((info.path / "metadata.yaml").read_text())
    files = (meta.get("rosbag2_bagfile_information") or {}).get("relative_file_paths") or []
    # by file name in the bag's folder, as the readers find them: Eloquent and early Foxy
    # listed them with the folder in front ("demo/demo_0.db3")
    missing = [str(f) for f in files if not (info.path / Path(str(f)).name).is_file()]
    if missing or (info.message_count and not files):
        what = f"storage file {missing[0]!r} is missing" if missing else "no storage file"
        raise BagError(f"bag {info.path} is damaged: its metadata.yaml lists "
                       f"{info.message_count} messages but {what}")


def _check_time_range(info: BagInfo) -> None:
    """metadata.yaml's start and end must be whole ns, the end not before the start."""
    ends = (info.start_ns, info.end_ns)
    if not all(isinstance(t, int) and not isinstance(t, bool) and -2**63 <= t < 2**63
               for t in ends) or info.end_ns < info.start_ns:
        raise BagError(f"bag {info.path} is damaged: its metadata.yaml declares the time "
                       f"range from {_short_number(info.start_ns)} to "
                       f"{_short_number(info.end_ns)} ns, not whole nanoseconds (64-bit, "
                       "as rosbag2 stores them) from a start to an end at or after it")


def _short_number(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"


class BagStream:
    """The messages of a bag, read lazily in time order; each iteration is a new pass.

    A player holds one message at a time instead of the whole bag (a list of 10^6
    messages costs hundreds of MB), and a looping player simply iterates again. Within
    one storage file rosbags yields messages in timestamp order, and the files of a split
    bag are merged by timestamp (``_per_file_messages``); ``types`` (topic ->
    message type) and ``count`` come from the bag's metadata, so publishers can be made
    before the first message is read. Unknown topic names raise BagError naming them.
    """

    def __init__(self, path: Path | str, topics: Iterable[str] | None = None,
                 start_offset_s: float = 0.0) -> None:
        self.path = Path(path)
        if is_ros1_bag(self.path):
            raise BagError(f"{self.path} is a ROS 1 bag: {_convert_hint(self.path)}")
        if start_offset_s < 0 or not math.isfinite(start_offset_s):
            raise ValueError(f"start_offset_s must be >= 0, got {start_offset_s}")
        self.info = bag_info(self.path)
        self._check_offset(start_offset_s)
        wanted = set(self.info.topics) if topics is None else set(topics)
        unknown = sorted(wanted - set(self.info.topics))
        if unknown:
            raise BagError(f"topics {unknown} not in bag {self.path}; it has "
                           f"{some_topics(self.info.topics)}")
        self.info.check_one_type(wanted)
        self.types = {t: self.info.topics[t][0] for t in sorted(wanted)}
        self.count = sum(self.info.topics[t][1] for t in wanted)
        self.start_ns = self.info.start_ns + round(start_offset_s * 1e9)

    def _check_offset(self, start_offset_s: float) -> None:
        """Refuse an offset past the bag's last message before it becomes a stamp.

        Past the end nothing plays, and a huge offset overflowed the ns conversion
        (1e300 s) or the storage's 64-bit query ("cannot read bag: int too big").
        """
        if start_offset_s > self.info.duration_s:
            raise BagError(f"start offset {start_offset_s:g} s is past the end of bag "
                           f"{self.path}, which lasts {self.info.duration_s:.9g} s")

    def __iter__(self) -> Iterator[RawMessage]:
        """One pass over the selected messages, opening the bag afresh.

        A damaged storage file can end the reader's pass early without an error (a
        zeroed chunk in an MCAP file: 161 of 387 messages, no exception), so a pass from
        the start that yields fewer messages than metadata.yaml lists raises at its end.
        """
        reader = _reader(self.path)
        yielded = 0
        try:
            conns = [c for c in reader.connections if c.topic in self.types]
            # from the start: every message, also one stamped before a (wrong) metadata
            # start, which readers then name instead of losing it to this filter
            start = self.start_ns if self.start_ns != self.info.start_ns else None
            messages = heapq.merge(*self._checked_files(reader, conns, start),
                                   key=lambda item: item[1])
            while True:
                try:
                    conn, stamp, data = next(messages)
                except StopIteration:
                    self._check_complete(yielded)
                    return
                except BagError:
                    raise
                except Exception as exc:  # rosbags raises several types for corrupt bags
                    raise BagError(f"cannot read bag {self.path}: {exc}") from exc
                yielded += 1
                yield RawMessage(conn.topic, conn.msgtype, stamp,
                                 self._bytes_of(conn.topic, stamp, data))
        finally:
            reader.close()

    def _checked_files(self, reader, conns: list, start: int | None) -> list[Iterator]:
        """Each storage file's messages, their stamps checked before they are compared."""
        return [((conn, self._stamp_of(conn.topic, stamp), data) for conn, stamp, data in one)
                for one in _per_file_messages(reader, conns, start)]

    def _stamp_of(self, topic: str, stamp: Any) -> int:
        """A message's receive time, refusing what a damaged storage row holds instead.

        SQLite stores whatever a row was given: a TEXT or NULL timestamp would otherwise
        reach the clock arithmetic of every reader as a TypeError without a topic.
        """
        if isinstance(stamp, bool) or not isinstance(stamp, int):
            raise BagError(f"bag {self.path} is damaged: a message on {topic} has the "
                           f"timestamp {stamp!r} ({type(stamp).__name__}), not integer ns")
        return stamp

    def _bytes_of(self, topic: str, stamp: int, data: Any) -> bytes:
        """A message's serialized bytes; NULL, TEXT or INTEGER storage data is a BagError.

        ``bytes(12)`` is twelve zero bytes and ``bytes(10**12)`` a terabyte, so a number
        stored where the CDR blob belongs must never be converted: it would decode as a
        plausible 0.0 or exhaust memory.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise BagError(f"bag {self.path} is damaged: the message on {topic} at "
                           f"{stamp} ns holds {type(data).__name__} data, not serialized "
                           f"bytes")
        return bytes(data)

    def _check_complete(self, yielded: int) -> None:
        """A full pass must read exactly the messages metadata.yaml lists.

        Fewer: a damaged storage file. More: a storage file listed twice or duplicated
        rows, which would be played twice and double every rate calibrate reports.
        """
        if self.start_ns != self.info.start_ns:
            return
        if yielded < self.count:
            raise BagError(f"bag {self.path} is damaged: read {yielded} of the {self.count} "
                           f"messages {_declared_by(self.path)} lists")
        if yielded > self.count:
            raise BagError(f"bag {self.path} is damaged: read {yielded} messages, more than "
                           f"the {self.count} {_declared_by(self.path)} lists (a storage file "
                           f"listed twice, or duplicated rows)")


def _per_file_messages(reader, conns: list, start: int | None) -> list[Iterator]:
    """One time-ordered message iterator per storage file of an open rosbags reader.

    rosbags reads a split bag's files one after another, so a file that starts a little
    before the previous one ends (a clock step or jitter at the split, or files listed out
    of order) would go backwards in time; ``ros2 bag play`` orders across files by time,
    and so does merging these. ``DirectoryReader.messages`` on a one-file view keeps
    rosbags' per-message decompression for each file; it is handed that file's own
    connections (``_file_connections``), never metadata.yaml's.
    """
    from rosbags.rosbag2.reader import DirectoryReader

    directory = reader.storage
    if isinstance(directory, StorageFolder):
        conns = conns or directory.connections
        return [one.messages(_file_connections(one, conns), start)
                for one in directory.storages]
    if not isinstance(directory, DirectoryReader):
        return [reader.messages(connections=conns, start=start)]
    conns = conns or directory.connections  # as Reader.messages: none means every one
    return [DirectoryReader.messages(  # type: ignore[arg-type]
        SimpleNamespace(storages=[one], metadata=directory.metadata),
        _file_connections(one, conns), start) for one in directory.storages]


def _file_connections(storage, conns: list) -> list:
    """The storage file's own connections of the topics and types in ``conns``.

    rosbags pairs a file's connections with metadata.yaml's only when their QoS text is
    equal, yet rosbag2 writes the two apart and they differ (its own test fixtures
    'talker' and 'convert_a': metadata.yaml says ``history: 1``, the storage file
    ``history: keep_last``), and a topic recorded from publishers of several QoS has one
    entry in metadata.yaml but a connection each in an MCAP file: unpaired, every message
    of such a connection was skipped and the bag called damaged. A topic and its type
    are what ``ros2 bag play`` goes by.
    """
    wanted = {(conn.topic, conn.msgtype) for conn in conns}
    return [conn for conn in storage.connections if (conn.topic, conn.msgtype) in wanted]


DISTRO_STORES = {"foxy": "ROS2_FOXY", "galactic": "ROS2_GALACTIC", "humble": "ROS2_HUMBLE",
                 "iron": "ROS2_IRON", "jazzy": "ROS2_JAZZY", "kilted": "ROS2_KILTED"}
"""rosbags' built-in store for a bag's ``ros_distro`` (metadata.yaml, rosbag2 since Iron)."""


def bag_typestore(path: Path | str):
    """The message types to decode a rosbag2 bag with: first those the bag recorded.

    rosbag2 records each connection's definition (``msgdef``): a robot's own messages
    (``acme_msgs/msg/Wheel``) are in no built-in store, and a standard type can differ
    between distros (Humble's ``sensor_msgs/msg/Range`` has no ``variance``, Jazzy's has):
    decoded with the newest store's definition, every message of a Humble robot's Range
    topic failed. So the recorded definitions come first; what the bag does not define
    (rosbag2's sqlite3 storage before Iron records none) comes from the built-in store of
    the distro the bag names, or Kilted's when it names none. A definition that does not
    parse is left out with a WARNING, and its messages are then counted as undecodable by
    the reader that needed them.
    """
    from rosbags.typesys import Stores, get_typestore

    reader = _reader(Path(path))
    try:
        connections = list(reader.connections)
        distro = str(getattr(reader, "ros_distro", None) or "").lower()
    finally:
        reader.close()
    store = get_typestore(Stores.EMPTY)
    for conn in connections:
        _register_definition(store, conn.msgtype, conn.msgdef)
    base = get_typestore(getattr(Stores, DISTRO_STORES.get(distro, "ROS2_KILTED")))
    store.register({k: v for k, v in base.fielddefs.items() if k not in store.fielddefs})
    return store


def _register_definition(store, msgtype: str, msgdef: Any) -> None:
    """Register the types of one recorded definition (.msg or .idl) that ``store`` lacks."""
    from rosbags.interfaces import MessageDefinitionFormat
    from rosbags.typesys import get_types_from_idl, get_types_from_msg

    if not getattr(msgdef, "data", ""):  # nothing recorded (sqlite3 storage before Iron)
        return
    try:
        if msgdef.format == MessageDefinitionFormat.MSG:
            types = get_types_from_msg(msgdef.data, msgtype)
        elif msgdef.format == MessageDefinitionFormat.IDL:
            types = get_types_from_idl(msgdef.data)
        else:
            return
        store.register({k: v for k, v in types.items() if k not in store.types})
    except Exception as exc:  # noqa: BLE001 - rosbags' parsers raise many types
        LOG.warning("cannot read the definition of %s recorded in the bag: %s", msgtype, exc)


def read_bag(path: Path | str, topics: Iterable[str] | None = None,
             start_offset_s: float = 0.0) -> tuple[BagInfo, list[RawMessage]]:
    """All messages of ``topics`` (all when None) in time order, skipping the first seconds.

    Holds the whole selection in memory (tests, small demo bags); a player streams with
    ``BagStream``. Unknown topic names raise, naming them and the bag's topics, rather
    than playing an empty selection silently.
    """
    stream = BagStream(path, topics, start_offset_s)
    messages = sorted(stream, key=lambda m: m.timestamp_ns)
    return stream.info, messages


def decode(message: RawMessage) -> Any:
    """Deserialize a recorded message with rosbags' typestore (no rclpy needed)."""
    return _decode_store().deserialize_cdr(message.data, message.msgtype)


@functools.cache
def _decode_store():
    """One read-only typestore for ``decode``: building one costs ~10 ms, a message ~10 us.

    Kept apart from ``_typestore()`` (a fresh store per writer or conversion, which may
    register a bag's own types) so nothing registered there leaks into decoding.
    """
    return _typestore()
