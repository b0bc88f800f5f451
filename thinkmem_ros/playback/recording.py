"""A robot's recording as frames: bag -> adapted signals -> fixed-rate frames with masks.

Training and calibrating on one's own recordings needs the same numbers the node will see
at run time, so this module reads a bag through the node's own signal map (the
``signals`` section of a node parameter file: topic, type and the adapter keys of
:mod:`thinkmem_ros.core.signal_adapters`) and resamples it the node's way: frame k at
``start + k / rate`` takes the latest sample of each signal received at or before it, and
a signal whose latest sample is older than ``stale_after_s`` (or that has none yet, or
that the map declares ``absent``) is NaN, which windows turn into mask 0.

rosbag2 folders are read with :mod:`thinkmem_ros.playback.bag_files`; a ROS 1 bag file
(known by its header, whatever its name) is read directly with ``rosbags``' ROS 1 reader
(message definitions come from the bag itself), so a recording needs no conversion before
it is calibrated or trained on.
Times are bag receive times, the clock the node uses for staleness.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from thinkmem_ros.core.data import SignalStream, SituationSet
from thinkmem_ros.core.rule_augment import AugmentConfig, augmented_copies
from thinkmem_ros.core.signal_adapters import SignalAdapter
from thinkmem_ros.playback.bag_files import (
    BagError,
    BagInfo,
    BagStream,
    bag_info,
    bag_typestore,
    check_bag_path,
    is_ros1_bag,
    per_topic,
    some_topics,
)
from thinkmem_ros.playback.node_params import (
    check_parameter_types,
    node_name_of,
    node_parameters,
    node_sections,
    short_repr,
)
from thinkmem_ros.policy.situation import FLOAT32_MAX

MAX_PARAMS_BYTES = 1024 * 1024
MAX_RECORDING_FRAMES = 50_000_000
"""Most frames one recording may resample to (the bound ``world.streams`` puts on a
simulated stream, which playback may not import): a day at 500 Hz. One stamp decades
late or a ``frame_rate_hz`` of 1e12 would otherwise ask for terabytes."""
MAX_UNDECODABLE_FRACTION = 0.01
"""Training tolerates at most 1 % undecodable messages on a topic (a few torn writes at
shutdown), with a warning; more means a wrong type or a damaged bag, and is refused."""


@dataclass(frozen=True)
class SignalBinding:
    """One signal of a robot: where it is recorded and how its number is read."""

    topic: str
    msg_type: str
    adapter: SignalAdapter
    absent: bool = False

    @property
    def unit(self) -> str:
        """The unit the adapter declares ('' when none is declared)."""
        return self.adapter.unit


@dataclass
class SignalMap:
    """The signals section of a node parameter file, plus the rate settings beside it."""

    bindings: dict[str, SignalBinding]
    frame_rate_hz: float = 0.0  # 0 = take the bundle's
    stale_after_s: float = 0.5
    source: str = "params"

    @property
    def names(self) -> tuple[str, ...]:
        """Signal names in file order (the order a bundle trained from them uses)."""
        return tuple(self.bindings)

    @property
    def units(self) -> dict[str, str]:
        """Declared unit of each signal."""
        return {name: b.unit for name, b in self.bindings.items()}


@dataclass
class Samples:
    """Raw adapted samples of each signal: receive times (s from bag start) and values."""

    times: dict[str, np.ndarray]
    values: dict[str, np.ndarray]
    start_ns: int
    duration_s: float
    skipped: dict[str, int] = field(default_factory=dict)  # topic -> messages not decodable
    read: dict[str, int] = field(default_factory=dict)  # topic -> messages read

    def undecodable(self) -> dict[str, tuple[int, int]]:
        """Topic -> (messages that could not be decoded, messages read), for those with any."""
        return {topic: (n, self.read.get(topic, n)) for topic, n in self.skipped.items() if n}

    def rate_hz(self, name: str) -> float:
        """Mean sample rate of ``name`` while it publishes (0 with fewer than 2 samples).

        Over its own samples' span less its gaps (``gaps``): a 20 Hz odometry with five
        minutes of silence in a six-minute recording read as 3.3 Hz.
        """
        t = self.times[name]
        if t.size < 2 or not t[-1] > t[0]:
            return 0.0
        steps = np.diff(t)
        active = steps[steps <= _gap_after(steps)]
        return float(active.size / active.sum()) if active.sum() > 0 else 0.0

    def repeated(self, name: str) -> int:
        """Samples of ``name`` stamped the same as the one before (a topic recorded twice)."""
        t = self.times[name]
        return int((np.diff(t) == 0).sum()) if t.size > 1 else 0

    def gaps(self, name: str) -> list[tuple[float, float]]:
        """(start s, length s) of each silence in ``name``, from the recording's start to its end.

        A silence is no sample for longer than ``GAP_S`` and ten of its median intervals.
        A topic that starts late or stops early is silent from the start or to the end
        too: frames there have it masked, and only the silences between samples were
        counted (a magnetometer first heard 60 s into a 92 s drive said nothing).
        """
        t = self.times[name]
        if t.size == 0:
            return []
        steps = np.diff(t)
        limit = _gap_after(steps) if steps.size else GAP_S
        edges = [(0.0, float(t[0]))] if t[0] > limit else []
        edges += [(float(t[i]), float(steps[i])) for i in np.flatnonzero(steps > limit)]
        if self.duration_s - t[-1] > limit:
            edges.append((float(t[-1]), float(self.duration_s - t[-1])))
        return edges

    def gap_warning(self, name: str) -> str | None:
        """One line naming ``name``'s longest silence (None without any)."""
        gaps = self.gaps(name)
        if not gaps:
            return None
        start, length = max(gaps, key=lambda g: g[1])
        return (f"{name}: no sample for {length:.1f} s from {start:.1f} s"
                f"{f' ({len(gaps)} gaps)' if len(gaps) > 1 else ''}: frames there have no "
                "input (its rate is over the rest)")


GAP_S = 5.0
"""A silence longer than this (and ten median intervals) is a gap, not a slow sensor."""


def _gap_after(steps: np.ndarray) -> float:
    return max(GAP_S, 10.0 * float(np.median(steps)))


def parse_signal_map(raw: Any, source: str = "params") -> SignalMap:
    """SignalMap from a parsed parameter file (or a plain ``{signals: ...}`` mapping).

    Strict as the node is: an unknown key or a bad adapter raises ValueError naming
    ``<source>: signals.<name>.<key>``. Entries are read as the node reads them
    (``robot.node_config.source_from_entry``: a topic, type or field left out takes the
    node's default), so a file the robot runs is never refused offboard; a map with every
    signal absent is refused, as the node refuses it. Only the sections the thinking node
    reads count (``node_parameters``).
    """
    params = node_parameters(raw, source)
    signals = params.get("signals")
    if not isinstance(signals, dict) or not signals:
        raise ValueError(f"{source}: no 'signals' mapping (signals.<name>: {{topic, type, "
                         f"field, ...}}) under ros__parameters")
    bindings = {str(name): _binding(str(name), entry, source)
                for name, entry in signals.items()}
    if all(b.absent for b in bindings.values()):
        raise ValueError(f"{source}: every signal ({sorted(bindings)}) is declared absent; "
                         "at least one must be read (the node refuses to start with it)")
    rate = params.get("frame_rate_hz", 0.0)
    stale = params.get("stale_after_s", 0.5)
    for key, value, low in (("frame_rate_hz", rate, 0.0), ("stale_after_s", stale, 1e-3)):
        if not _number_at_least(value, low):
            raise ValueError(f"{source}: {key} must be a number >= {low}, got "
                             f"{short_repr(value)}")
    _check_frame_rate(rate, source)
    return SignalMap(bindings, float(rate), float(stale), source)


def _binding(name: str, entry: Any, source: str) -> SignalBinding:
    """One ``signals.<name>`` entry as a binding; ValueError naming the key otherwise.

    Read as the node reads it (``robot.node_config.source_from_entry``): a topic, type or
    field left out takes the node's default for that signal, so a params file the robot
    runs is never refused offboard. A signal declared ``absent`` is never read (its frames
    are NaN, masked); only its name and place in the map matter.
    """
    from thinkmem_ros.robot.node_config import source_from_entry

    if not isinstance(entry, Mapping):
        raise ValueError(f"{source}: signals.{name} must be a mapping (topic, type, field, "
                         f"...), got {short_repr(entry)}")
    absent = entry.get("absent", False)
    if not isinstance(absent, bool):
        raise ValueError(f"{source}: signals.{name}.absent must be true or false, "
                         f"got {absent!r}")
    for key in ("topic", "type"):
        if key in entry and not (isinstance(entry[key], str) and entry[key]):
            raise ValueError(f"{source}: signals.{name}.{key} must be a non-empty string, "
                             f"got {short_repr(entry[key])}")
    try:
        spec = source_from_entry(name, entry)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    except OverflowError:  # math.isfinite of an integer past the float range
        raise ValueError(f"{source}: signals.{name}.{_huge_key(entry)} is too large "
                         "for a number") from None
    return SignalBinding(_absolute(spec.topic), _canonical(spec.msg_type), spec.reader(),
                         absent=absent)


def _huge_key(entry: Mapping[str, Any]) -> str:
    """The key of an entry whose integer value no float holds (YAML reads 1e400 digits)."""
    for key, value in entry.items():
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                float(value)
            except OverflowError:
                return str(key)
    return "?"


def _number_at_least(value: Any, low: float) -> bool:
    """True for a finite int or float >= ``low`` (an integer too large for a float is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value) and value >= low
    except OverflowError:
        return False


def _absolute(topic: str) -> str:
    return topic if topic.startswith("/") else "/" + topic


def _check_frame_rate(rate: float, source: str) -> None:
    """The node's bounds on ``frame_rate_hz``: 0 (the bundle's) or [0.01, 1000] Hz.

    A map the node would refuse must not train a bundle either, and 1e12 Hz frames
    would be a petabyte of NaN.
    """
    from thinkmem_ros.robot.node_config import MAX_FRAME_RATE_HZ, MIN_FRAME_RATE_HZ

    if rate and not MIN_FRAME_RATE_HZ <= rate <= MAX_FRAME_RATE_HZ:
        raise ValueError(f"{source}: frame_rate_hz must be 0 (the bundle's) or in "
                         f"[{MIN_FRAME_RATE_HZ:g}, {MAX_FRAME_RATE_HZ:g}] Hz as the node "
                         f"requires, got {rate!r}")


def _canonical(msg_type: str) -> str:
    """'sensor_msgs/Imu' -> 'sensor_msgs/msg/Imu' (the form rosbags reports for any bag)."""
    parts = msg_type.split("/")
    return f"{parts[0]}/msg/{parts[1]}" if len(parts) == 2 else msg_type


def load_params(path: Path | str) -> tuple[dict[str, Any], SignalMap]:
    """(the parameters a file gives the thinking node, its signal map), checked as the node checks.

    The offboard tools read the file the node reads, so they refuse what the node refuses,
    with the node's own checks (``robot.node_config``: the file's structure, YAML aliases,
    a key given twice, the signal map's entries, parameter names with a suggestion for a
    typo) and rcl's types (``check_parameter_types``). Only the thinking node's sections
    are read (``node_parameters``). ValueError naming the file and the key.
    """
    import yaml

    from thinkmem_ros.core.input_files import input_file
    from thinkmem_ros.core.yaml_numbers import load_numbers_yaml
    from thinkmem_ros.robot.node_config import read_params_file, validate_ros_args

    path = input_file(path, "parameter file")  # a FIFO would block the read for ever
    source = str(path)
    try:
        if path.stat().st_size > MAX_PARAMS_BYTES:
            raise ValueError(f"{path}: larger than {MAX_PARAMS_BYTES} bytes")
        raw = load_numbers_yaml(path.read_text(encoding="utf-8"), unique_keys=True)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read parameters: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc
        raise ValueError(f"{path}: cannot read parameters: {at}{problem}") from None
    fqn = node_name_of([key for key, _ in node_sections(raw)], source)
    read_params_file(path, fqn)  # the structure rcl needs; aliases; a name given twice
    params = node_parameters(raw, source)
    signal_map = parse_signal_map(params, source)
    namespace, _, name = fqn.rpartition("/")  # checked as the node launched there checks
    validate_ros_args(["--ros-args", "-r", f"__ns:={namespace or '/'}", "-r",
                       f"__node:={name}", "--params-file", source])
    check_parameter_types(params, source)
    return params, signal_map


def load_signal_map(path: Path | str) -> SignalMap:
    """Read a node parameter file's signal map (ValueError naming the file and key).

    The file is read as the node reads it (``load_params``): one the node refuses is
    refused here, before a bundle is calibrated or trained for it.
    """
    return load_params(path)[1]


def _messages(path: Path, topics: set[str]) -> tuple[Iterator[tuple[str, str, int, Any]],
                                                     dict[str, str], int, int]:
    """(iterator of (topic, type, t_ns, msg), topic types, start_ns, end_ns) of any bag."""
    if is_ros1_bag(path):  # by content, as bag info does: a copy may be named .dat
        from rosbags.rosbag1 import Reader

        try:
            reader = Reader(path)
            reader.open()
        except Exception as exc:  # rosbags raises several types for corrupt bags
            raise BagError(f"cannot open ROS 1 bag {path}: {exc}") from exc
        recorded, mixed = per_topic(reader.connections)
        types = {t: _canonical(m) for t, (m, _) in recorded.items()}
        start, end = reader.start_time, reader.end_time
        try:
            BagInfo(path, "rosbag1", start, end, recorded, mixed).check_one_type(topics)
        except BagError:
            reader.close()
            raise

        def ros1() -> Iterator[tuple[str, str, int, Any]]:
            from rosbags.typesys import Stores, get_types_from_msg, get_typestore

            store = get_typestore(Stores.EMPTY)
            conns = [c for c in reader.connections if c.topic in topics]
            for conn in conns:
                store.register(get_types_from_msg(conn.msgdef.data, conn.msgtype))
            try:
                yielded = 0
                for conn, stamp, data in _ros1_messages(path, reader, conns):
                    yielded += 1
                    yield conn.topic, conn.msgtype, stamp, _decode1(store, data, conn.msgtype)
                _check_ros1_complete(path, yielded, sum(
                    info.connection_counts.get(c.id, 0) for c in conns
                    for info in reader.chunk_infos))
            finally:
                reader.close()

        return ros1(), types, start, end
    info = bag_info(path)
    types = {t: _canonical(m) for t, (m, _) in info.topics.items()}
    chosen = BagStream(path, sorted(topics & set(types))) if topics & set(types) else None

    def ros2() -> Iterator[tuple[str, str, int, Any]]:
        # built once (the typestore bag_files writes with, plus the bag's own types):
        # per message it would cost ~10 ms
        store = bag_typestore(path) if chosen else None
        if chosen:
            _check_defined(path, store, chosen.types)
        for raw in chosen or ():
            try:
                msg = store.deserialize_cdr(raw.data, raw.msgtype)
            except Exception:  # noqa: BLE001 - undecodable message: counted by the caller
                msg = None
            yield raw.topic, raw.msgtype, raw.timestamp_ns, msg

    return ros2(), types, info.start_ns, info.end_ns + 1


def _check_defined(path: Path, store, types: dict[str, str]) -> None:
    """BagError naming a topic whose type neither the bag nor this machine defines.

    rosbag2's sqlite3 storage recorded no message definitions before Iron, so a robot's
    own type (``acme_msgs/msg/Wheel``) is then defined nowhere: every message of it was
    counted as undecodable, 'a wrong message type or a damaged bag', which sends one
    looking for damage. Checked once, before the first message is decoded.
    """
    for topic, msgtype in sorted(types.items()):
        if msgtype not in store.types:
            raise BagError(f"{path}: {topic} is recorded as {msgtype}, which has no "
                           "definition in the bag (rosbag2's sqlite3 storage records none "
                           "before Iron) and none here: it is no standard ROS 2 type, the "
                           "only ones known without the bag's; record with the mcap storage "
                           "or ROS 2 Iron or later, so the bag carries its definitions")


def _ros1_messages(path: Path, reader, conns) -> Iterator[tuple[Any, int, bytes]]:
    """The reader's messages; an exception from a damaged chunk becomes a BagError."""
    messages = reader.messages(connections=conns)
    while True:
        try:
            item = next(messages)
        except StopIteration:
            return
        except Exception as exc:  # rosbags raises several types for corrupt chunks
            raise BagError(f"cannot read ROS 1 bag {path}: {exc}") from exc
        yield item


def _check_ros1_complete(path: Path, yielded: int, listed: int) -> None:
    """A damaged chunk can end rosbags' pass early without an error: refuse a short read.

    The bag's index lists how many messages each chunk holds per connection (as
    metadata.yaml does for rosbag2, which ``BagStream`` checks the same way); rosbags'
    own ``msgcount`` comes from the per-chunk message indexes that the damage may have
    cut short, so it cannot tell.
    """
    if yielded < listed:
        raise BagError(f"ROS 1 bag {path} is damaged: read {yielded} of the {listed} "
                       f"messages its chunk index lists")


def _decode1(store, data: bytes, msgtype: str) -> Any:
    try:
        return store.deserialize_ros1(data, msgtype)
    except Exception:  # noqa: BLE001 - an undecodable message is counted, not fatal
        return None


def read_samples(path: Path | str, signal_map: SignalMap) -> Samples:
    """Every adapted sample of the map's (present) signals in a bag, with receive times.

    A topic the bag lacks, or one recorded with another message type than the map says,
    raises BagError naming the signal; signals declared ``absent`` are not read. Times
    are those of the messages read: one outside the time range the bag declares (a
    metadata.yaml that lies about its start or duration) is a BagError, and samples are
    sorted by time (rosbags reads a bag's storage files one after another, in the order
    metadata.yaml lists them). Undecodable messages are counted per topic
    (``skipped`` of ``read``), for the caller to judge (:func:`check_readable`).
    """
    path = check_bag_path(path)
    if not path.exists():
        raise BagError(f"bag not found: {path}")
    wanted = {name: b for name, b in signal_map.bindings.items() if not b.absent}
    topics = {b.topic for b in wanted.values()}
    messages, types, start_ns, end_ns = _messages(path, topics)
    for name, binding in wanted.items():
        if binding.topic not in types:
            raise BagError(f"signals.{name}.topic: {binding.topic!r} is not in {path}; it has "
                           f"{some_topics(types)}")
        if types[binding.topic] != binding.msg_type:
            raise BagError(f"signals.{name}.type: {path} records {binding.topic!r} as "
                           f"{types[binding.topic]!r}, not {binding.msg_type!r}")
    by_topic: dict[str, list[str]] = {}
    for name, binding in wanted.items():
        by_topic.setdefault(binding.topic, []).append(name)
    times: dict[str, list[float]] = {name: [] for name in signal_map.bindings}
    values: dict[str, list[float]] = {name: [] for name in signal_map.bindings}
    skipped: dict[str, int] = {}
    read: dict[str, int] = {}
    for topic, _, stamp, msg in messages:
        read[topic] = read.get(topic, 0) + 1
        _check_in_range(path, topic, stamp, start_ns, end_ns)
        if msg is None:
            skipped[topic] = skipped.get(topic, 0) + 1
            continue
        t = (stamp - start_ns) / 1e9
        for name in by_topic.get(topic, ()):
            times[name].append(t)
            values[name].append(wanted[name].adapter.read(msg))
    sorted_times, sorted_values = {}, {}
    for name in times:
        sorted_times[name], sorted_values[name] = _in_time_order(times[name], values[name])
    return Samples(times=sorted_times, values=sorted_values, start_ns=start_ns,
                   duration_s=max(0.0, (end_ns - start_ns) / 1e9), skipped=skipped, read=read)


def _check_in_range(path: Path, topic: str, stamp: int, start_ns: int, end_ns: int) -> None:
    """Frames span the bag's declared time range, so a message outside it must not exist.

    A metadata.yaml whose start is an hour early or whose duration is a minute short
    would otherwise put every frame before the messages, or cut the recording silently.
    """
    if not start_ns <= stamp < end_ns:
        raise BagError(f"{path}: a message on {topic} at {stamp} ns lies outside the time "
                       f"range the bag declares ({start_ns} ns + "
                       f"{(end_ns - 1 - start_ns) / 1e9:.9g} s); its metadata (starting_time "
                       f"/ duration) is wrong or the message's timestamp is damaged")


def _in_time_order(times: list[float], values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """(times, values) as arrays sorted by time, keeping the read order among equal times."""
    t = np.asarray(times, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if t.size > 1 and (np.diff(t) < 0).any():
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
    return t, v


def check_readable(path: Path | str, samples: Samples, signal_map: SignalMap,
                   max_undecodable: float = MAX_UNDECODABLE_FRACTION) -> list[str]:
    """Refuse samples a bundle must not be trained on; return warnings for the rest.

    BagError when a topic has more than ``max_undecodable`` of its messages undecodable
    (say how many of how many) or a present signal has no usable sample at all (every
    input would be masked and every rule label 0, yet training would 'succeed'). Fewer
    undecodable messages come back as warning lines.
    """
    warnings = []
    for topic, (bad, total) in sorted(samples.undecodable().items()):
        line = f"{path}: {bad} of {total} messages on {topic} could not be decoded"
        if bad > max_undecodable * total:
            raise BagError(f"{line} (more than {max_undecodable:.0%}: a wrong message type "
                           f"or a damaged bag)")
        warnings.append(f"{line}; they are skipped")
    for name, binding in signal_map.bindings.items():
        values = samples.values.get(name, np.zeros(0))
        if not binding.absent and not usable(values).any():
            raise BagError(f"{path}: signals.{name}: no usable sample on {binding.topic} "
                           f"({values.size} message(s), none gave a finite number within "
                           f"float32's range; check the field and index, or declare it "
                           f"absent: true)")
        gap = None if binding.absent else samples.gap_warning(name)
        if gap is not None:
            warnings.append(f"{path}: {gap}")
    return warnings


def resample(samples: Samples, names: tuple[str, ...], rate_hz: float,
             stale_after_s: float) -> np.ndarray:
    """(T, F) float32 frames the node's way: latest sample at each tick, NaN when stale.

    Frame k sits at ``k / rate_hz`` seconds after the bag's first message (as
    ``policy.replay`` assembles frames), T = floor(duration * rate) + 1, so a bag written
    from a stream at the same rate reads back frame for frame. A NaN sample (the adapter
    found no number) is skipped, as the node's buffer refuses it: the previous sample
    stays until it is stale.
    """
    if not math.isfinite(rate_hz) or rate_hz <= 0:
        raise ValueError(f"rate_hz must be a finite number > 0, got {rate_hz!r}")
    if not math.isfinite(stale_after_s) or stale_after_s <= 0:
        raise ValueError(f"stale_after_s must be a finite number > 0, got {stale_after_s!r}")
    count = frame_count(samples.duration_s, rate_hz)
    ticks = np.arange(count, dtype=np.float64) / rate_hz
    out = np.full((count, len(names)), np.nan, dtype=np.float32)
    for j, name in enumerate(names):
        t, v = samples.times.get(name), samples.values.get(name)
        if t is None or t.size == 0:
            continue
        ok = usable(v)
        t, v = t[ok], v[ok]
        if t.size == 0:
            continue
        idx = np.searchsorted(t, ticks + 1e-6, side="right") - 1  # 1 us: stamp rounding
        has = idx >= 0
        age = np.where(has, ticks - t[np.maximum(idx, 0)], np.inf)
        fresh = has & (age <= stale_after_s)
        out[fresh, j] = v[idx[fresh]]
    return out


def frame_count(duration_s: float, rate_hz: float) -> int:
    """Frames of a recording of ``duration_s`` at ``rate_hz``; ValueError past the bound.

    Checked before anything is allocated: one stamp at 2^62 ns makes a bag 146 years long.
    """
    frames = duration_s * rate_hz
    if not frames + 1 <= MAX_RECORDING_FRAMES:
        raise ValueError(f"the recording spans {duration_s:.6g} s: at {rate_hz:g} Hz that is "
                         f"{frames:.3g} frames, more than the {MAX_RECORDING_FRAMES:.0e} "
                         f"allowed (a far-off or damaged timestamp?)")
    return int(math.floor(frames + 1e-6)) + 1


def read_recording(path: Path | str, signal_map: SignalMap, rate_hz: float | None = None,
                   *, rules=None, stale_after_s: float | None = None,
                   samples: Samples | None = None) -> SignalStream:
    """A bag as a SignalStream at ``rate_hz`` (default: the map's), labelled by ``rules``.

    ``rules`` is a :class:`thinkmem_ros.core.label_rules.LabelRules`; without it the
    stream has no labels (an (T, 0) array). ``samples`` (from :func:`read_samples`, when
    the caller has checked them already) saves reading the bag again.
    """
    rate = rate_hz if rate_hz else signal_map.frame_rate_hz
    if not rate:
        raise ValueError("no frame rate: give rate_hz or frame_rate_hz in the parameters")
    stale = signal_map.stale_after_s if stale_after_s is None else stale_after_s
    samples = read_samples(path, signal_map) if samples is None else samples
    try:
        values = resample(samples, signal_map.names, rate, stale)
    except ValueError as exc:
        raise BagError(f"{path}: {exc}") from None
    if rules is not None:
        labels = rules.apply(values, signal_map.names, rate)
        label_names = rules.label_names
    else:
        labels, label_names = np.zeros((values.shape[0], 0), dtype=np.float32), ()
    return SignalStream(rate_hz=float(rate), values=values, labels=labels, events=[],
                        label_names=tuple(label_names), signal_names=signal_map.names,
                        scenario=f"recording:{Path(path).name}")


def split_stream(stream: SignalStream, fraction: float) -> tuple[SignalStream, SignalStream]:
    """(first ``fraction`` of the frames, the rest): a time split, never shuffled."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    cut = int(round(stream.values.shape[0] * fraction))

    def part(lo: int, hi: int, tag: str) -> SignalStream:
        return SignalStream(rate_hz=stream.rate_hz, values=stream.values[lo:hi],
                            labels=stream.labels[lo:hi], events=[],
                            label_names=stream.label_names, signal_names=stream.signal_names,
                            scenario=f"{stream.scenario}:{tag}")

    return part(0, cut, "head"), part(cut, stream.values.shape[0], "tail")


GROUP_SECONDS = 15.0
"""Length of the recording chunks that form validation groups (a few turns or stops each)."""


def recording_windows(stream: SignalStream, window: int, *, stride: int = 1,
                      group_seconds: float = GROUP_SECONDS,
                      group_base: int = 0, ends: np.ndarray | None = None) -> SituationSet:
    """Windows ending at every ``stride``-th frame t >= window - 1, labelled by frame t.

    ``ends`` (frames >= window - 1) replaces that choice of end frames: labels from
    hindsight exist only on some frames, and only those may end a training window.
    Otherwise a frame without any fresh signal (a gap in the recording: every input
    masked, every rule label negative) ends no window: it would teach the policy nothing
    about the robot (``meta["silent_frames"]`` counts them).

    A recording has no discrete events, so every row's event slot is padding. Groups are
    ``group_seconds`` chunks of the recording (offset by ``group_base`` so several bags
    never share a group): a validation split then holds whole stretches of the drive,
    not frames interleaved with the training ones.
    """
    if window < 1 or stride < 1 or not group_seconds > 0:
        raise ValueError(f"window and stride must be >= 1 and group_seconds > 0, got "
                         f"{window}, {stride}, {group_seconds}")
    values = np.asarray(stream.values, dtype=np.float32)
    if values.shape[0] < window:
        raise ValueError(f"recording has {values.shape[0]} frames, fewer than "
                         f"window={window} ({window / stream.rate_hz:g} s)")
    silent = 0
    if ends is None:
        ends = np.arange(window - 1, values.shape[0], stride)
        heard = np.isfinite(values[ends]).any(axis=1)  # frames with some fresh signal
        silent = int((~heard).sum())
        ends = ends[heard]
    elif len(ends) and (np.min(ends) < window - 1 or np.max(ends) >= values.shape[0]):
        raise ValueError(f"end frames must be in [{window - 1}, {values.shape[0]})")
    ends = np.asarray(ends, dtype=np.int64)
    view = np.lib.stride_tricks.sliding_window_view(values, window, axis=0)  # (T-K+1, F, K)
    signals = np.transpose(view[ends - window + 1], (0, 2, 1))
    mask = np.isfinite(signals).astype(np.float32)
    signals = np.where(mask > 0, signals, 0.0).astype(np.float32)
    groups = group_base + ends // max(1, int(round(group_seconds * stream.rate_hz)))
    return SituationSet(signals=signals, labels=stream.labels[ends], mask=mask, events=None,
                        groups=groups.astype(np.int64), label_names=stream.label_names,
                        signal_names=stream.signal_names, event_vocabulary=(),
                        meta={"family": "recording", "scenario": stream.scenario,
                              "rate_hz": stream.rate_hz, "end_frames": ends,
                              "silent_frames": silent})


AUGMENT_GROUP_STRIDE = 100_000
"""Group-id offset between a stream's windows and each of its augmented copies' windows."""


def training_windows(stream: SignalStream, window: int, *, rules=None,
                     augment: AugmentConfig | None = None, seed: int = 0,
                     group_base: int = 0) -> SituationSet:
    """The stream's windows plus those of ``augment.copies`` copies relabelled by ``rules``.

    ``thinkmem train --bag`` and ``thinkmem bench real`` both train this way, so the
    benchmark scores what a user gets. Without rules or with 0 copies it is
    ``recording_windows``. Each copy's windows get their own group ids (a copy is shuffled
    and stretched, so its frame index says nothing about the original's stretches).
    """
    parts = [recording_windows(stream, window, group_base=group_base)]
    if rules is not None and augment is not None and augment.copies:
        rng = np.random.default_rng([seed, group_base])
        for k, copy in enumerate(augmented_copies(stream, rules, augment, rng), start=1):
            if copy.values.shape[0] >= window:
                parts.append(recording_windows(
                    copy, window, group_base=group_base + k * AUGMENT_GROUP_STRIDE))
    return SituationSet.concat(parts) if len(parts) > 1 else parts[0]


def score_recording(bundle, stream: SignalStream, *, stale_after_s: float = 0.5,
                    predicted_out: list | None = None, labelled_only: bool = False,
                    skip_silent: bool = False) -> dict:
    """Play ``stream`` into ``bundle`` the node's way and score its labels against the rules.

    The stream is pushed through the node's ``SituationBuffer`` at the bundle's rate and
    the ONNX runtime the node runs (``policy.replay``); the activation at each label's
    threshold is compared with the label of the newest recording frame it saw. Returns
    micro/macro F1 and per-label F1; ``predicted_out`` (a list) receives the (N, L)
    activation and truth arrays when given. ``labelled_only``: labels from hindsight exist
    on some frames only (NaN elsewhere); every frame is still played (a streaming policy
    must see them all, in order) but only labelled ones are scored, as an unlabelled frame
    is unknown, not negative (``frames`` 0 and NaN scores when none is labelled).
    ``skip_silent``: frames whose newest row has no fresh signal (a gap in the recording)
    are played but not scored (``silent_frames`` counts them): every label is trivially
    negative there, and a long gap inflated held-out F1 (0.653 -> 0.835).
    """
    from thinkmem_ros.core.metrics import micro_scores
    from thinkmem_ros.policy.replay import ReplayConfig, predict_frames, replay_for
    from thinkmem_ros.policy.runtime import PolicyRuntime

    runtime = PolicyRuntime(bundle)
    labels = list(runtime.manifest.labels)
    if list(stream.label_names) != labels:
        raise ValueError(f"the stream is labelled {list(stream.label_names)} but the bundle "
                         f"predicts {labels}")
    frames = replay_for(stream, runtime.manifest, ReplayConfig(stale_after_s=stale_after_s))
    predicted = predict_frames(runtime, frames) >= runtime.thresholds
    truth = frames.truth
    keep = np.ones(len(frames), bool)
    if labelled_only:
        keep &= np.isfinite(truth).all(axis=1) if len(frames) else np.zeros(0, bool)
    silent = 0
    if skip_silent and len(frames):
        heard = frames.mask[:, -1, :].any(axis=1)
        silent = int((keep & ~heard).sum())
        keep &= heard
    if not keep.all():
        if not keep.any():
            return {"frames": 0, "precision": math.nan, "recall": math.nan, "f1": math.nan,
                    "macro_f1": math.nan, "per_label_f1": {}, "silent_frames": silent}
        predicted, truth = predicted[keep], truth[keep]
    truth = truth > 0.5
    per_label = {name: micro_scores(truth[:, j], predicted[:, j])["f1"]
                 for j, name in enumerate(labels)}
    if predicted_out is not None:
        predicted_out.extend([predicted, truth])
    return {"frames": len(truth), **micro_scores(truth, predicted),
            "macro_f1": float(np.mean(list(per_label.values()))), "per_label_f1": per_label,
            "silent_frames": silent}


def usable(values: np.ndarray) -> np.ndarray:
    """Which samples the node would take: finite and within float32 (its window's type).

    The node refuses the rest as it refuses NaN (``policy.situation``); offboard, a value
    of 1e308 became +inf in the float32 frames, masked everywhere, while the checks on the
    float64 values passed it.
    """
    return np.isfinite(values) & (np.abs(values) <= FLOAT32_MAX)


def summarise(samples: Samples, names: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Per signal: count, rate (Hz), unusable count (``nan``) and p1/p50/p99 of the rest."""
    out: dict[str, dict[str, float]] = {}
    for name in names:
        v = samples.values.get(name, np.zeros(0))
        ok = v[usable(v)]
        row = {"samples": int(v.size), "nan": int(v.size - ok.size),
               "rate_hz": samples.rate_hz(name)}
        if ok.size:
            p1, p50, p99 = np.percentile(ok, [1, 50, 99])
            row.update(min=float(ok.min()), p1=float(p1), p50=float(p50), p99=float(p99),
                       max=float(ok.max()))
        out[name] = row
    return out


def params_text(signal_map: Mapping[str, Mapping[str, Any]]) -> str:
    """YAML of a ``signals`` mapping under ``/**: ros__parameters`` (a node parameter file)."""
    import yaml

    return yaml.safe_dump({"/**": {"ros__parameters": {"signals": dict(signal_map)}}},
                          sort_keys=False)
