"""Republish a rosbag2 bag into ROS with its recorded timing, like ``ros2 bag play``.

rosbag2 itself has no Python wheels, so this player reads bags with ``rosbags``
(:mod:`thinkmem_ros.playback.bag_files`) and publishes the recorded CDR bytes unchanged through
rclpy publishers of the recorded types (``Publisher.publish`` accepts serialized bytes), so
nothing is decoded or re-encoded on the way and any message type installed works. Each
publisher offers the durability and reliability its topic was recorded with where all
recorded publishers agree (a latched /tf_static stays latched), as ``ros2 bag play`` does.

Bags are streamed (``BagStream``): memory does not grow with the bag. ``play_bag`` handles
SIGINT and SIGTERM itself (rclpy's handlers would shut the context down under a publish
and end in an RCLError traceback): the signal stops playback at the next wait, and the
command exits 130 after Ctrl-C, 0 after SIGTERM, with one summary line.

A real robot's recording carries types this machine may not have installed (a vendor's
messages, a package left out): by default that is an error naming the type and the
``--skip-unknown`` flag; with ``skip_unknown`` those topics are left out with one warning
naming them and everything else plays. A ROS 1 ``.bag`` is converted to a temporary
rosbag2 first (``bag_files.convert_ros1``), so it plays like any recording.

With ``clock_hz`` (``--clock``) the player's /clock is the one clock: a recorded /clock
(sim time, ``record -a``) is left out, and ``play_bag`` says so in one line. It ticks
``clock_hz`` times per wall-clock second, as ``ros2 bag play --clock`` (a wall timer),
each tick carrying the bag time reached then, so ``--rate`` changes how far it moves.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from thinkmem_ros.playback.bag_files import (
    BagError,
    BagStream,
    RawMessage,
    RecordedQos,
    convert_ros1,
    is_ros1_bag,
)

LOG = logging.getLogger(__name__)


MIN_RATE, MAX_RATE = 1e-3, 1e4
"""Playback speed bounds: a bag played a thousand times slower, or ten thousand times
faster; past them the player's sleeps overflow the clock or it publishes as fast as it can
anyway."""
MIN_CLOCK_HZ, MAX_CLOCK_HZ = 1e-3, 1e4
MAX_WAIT_S = 7 * 86_400.0  # a --delay past a week is a typo
FLUSH_TIMEOUT_S = 5.0
"""How long the player waits at exit for reliable subscribers to acknowledge: a subscriber
in another process acknowledges the last messages when the writer's next heartbeat asks
(Fast DDS: every 3 s), ~2.6 s after the end, so a shorter wait warned on every run."""
MAX_GAP_S = 86_400.0
"""Longest silence between two recorded messages the player waits out: past a day it is a
damaged stamp (one at 2^62 ns) or recordings glued together, and even --rate 10000 would
wait for days without a word."""


@dataclass(frozen=True)
class PlayConfig:
    """How to play: speed, repetition, simulated clock, topic filter and start."""

    rate: float = 1.0
    loop: bool = False
    clock_hz: float | None = None  # /clock ticks per wall-clock second, None = off
    topics: tuple[str, ...] | None = None  # None = every topic in the bag
    start_offset_s: float = 0.0
    delay_s: float = 0.0
    wait_for_subscribers_s: float = 0.0  # wait up to this long for every topic to be heard
    qos_depth: int = 100
    namespace: str = ""  # play absolute topics under /<namespace> (not /clock); '' = as recorded
    skip_unknown: bool = False  # leave out topics whose type is not installed (one warning)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and MIN_RATE <= self.rate <= MAX_RATE):
            raise ValueError(f"rate must be in [{MIN_RATE:g}, {MAX_RATE:g}], got {self.rate}")
        if self.clock_hz is not None and not (math.isfinite(self.clock_hz)
                                              and MIN_CLOCK_HZ <= self.clock_hz <= MAX_CLOCK_HZ):
            raise ValueError(f"clock_hz must be in [{MIN_CLOCK_HZ:g}, {MAX_CLOCK_HZ:g}] Hz, "
                             f"got {self.clock_hz}")
        if not (math.isfinite(self.start_offset_s) and self.start_offset_s >= 0):
            raise ValueError(f"start_offset_s must be >= 0, got {self.start_offset_s}")
        if not (math.isfinite(self.delay_s) and 0 <= self.delay_s <= MAX_WAIT_S):
            raise ValueError(f"delay_s must be in [0, {MAX_WAIT_S:g}] s, got {self.delay_s}")
        if not (math.isfinite(self.wait_for_subscribers_s)
                and 0 <= self.wait_for_subscribers_s <= MAX_WAIT_S):
            # past a week is a typo, and 1e30 overflowed the wait into "stopped" at once
            raise ValueError(f"wait_for_subscribers_s must be in [0, {MAX_WAIT_S:g}] s, got "
                             f"{self.wait_for_subscribers_s}")
        if self.qos_depth < 1:
            raise ValueError(f"qos_depth must be >= 1, got {self.qos_depth}")
        if self.topics is not None and not self.topics:
            raise ValueError("topics must name at least one topic (or be None for all)")
        if self.namespace and not all(part.isascii() and part.isidentifier()
                                      for part in self.namespace.strip("/").split("/")):
            # ROS name tokens: ASCII letters, digits and '_', no leading digit (isidentifier
            # alone accepts 'ä', which rclpy then refused as a topic name)
            raise ValueError(f"namespace must be ROS names (ASCII letters, digits and '_', "
                             f"not starting with a digit) separated by '/', "
                             f"got {self.namespace!r}")

    def topic_name(self, recorded: str) -> str:
        """Where a recorded topic is published: under ``namespace`` when it is absolute."""
        ns = self.namespace.strip("/")
        if not ns or not recorded.startswith("/") or recorded == "/clock":
            return recorded
        return f"/{ns}{recorded}"


@dataclass(frozen=True)
class Published:
    """One message as it left the player: bag time and the wall time of publishing (ns)."""

    topic: str
    bag_ns: int
    wall_ns: int


@dataclass
class PlayStats:
    """What a playback did, for logs and tests."""

    published: int = 0
    clock_ticks: int = 0
    loops: int = 0
    stopped: bool = False
    per_topic: dict[str, int] = field(default_factory=dict)
    signal: int | None = None  # the signal that stopped playback (play_bag), if any
    skipped: dict[str, str] = field(default_factory=dict)  # topic -> type not installed
    clock_left_out: bool = False  # the recorded /clock was not played (--clock replaces it)


CLOCK_LEFT_OUT = "recorded /clock left out: --clock publishes the clock"


def _message_class(msgtype: str) -> type:
    """Import the rclpy class of a recorded type, as a BagError naming it when missing."""
    from thinkmem_ros.robot.msg_fields import message_class

    try:
        return message_class(msgtype)
    except ValueError as exc:
        raise BagError(f"cannot play {msgtype!r}: {exc}") from exc


class BagPlayer:
    """Publish timed raw messages on an rclpy node; :meth:`play` blocks until done or stopped."""

    def __init__(self, node, messages: Sequence[RawMessage] | BagStream, config: PlayConfig,
                 on_publish: Callable[[Published], None] | None = None) -> None:
        """``messages``: a list in time order, or a ``BagStream`` read one pass at a time."""
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        self._node = node
        self._config = config
        self._on_publish = on_publish
        self._stop = threading.Event()
        qos = QoSProfile(depth=config.qos_depth, reliability=ReliabilityPolicy.RELIABLE)
        types: dict[str, str] = {}
        recorded: dict[str, tuple[RecordedQos, int]] = {}
        if isinstance(messages, BagStream):
            if not messages.count:
                raise BagError("nothing to play: the selection has no messages")
            self._messages: Iterable[RawMessage] = messages
            types = dict(messages.types)
            recorded = {topic: (offer, messages.info.topics[topic][1])
                        for topic, offer in messages.info.qos.items()}
        else:
            if not messages:
                raise BagError("nothing to play: the selection has no messages")
            self._messages = list(messages)
            for msg in self._messages:
                if types.setdefault(msg.topic, msg.msgtype) != msg.msgtype:
                    raise BagError(f"topic {msg.topic} carries two types: "
                                   f"{types[msg.topic]} and {msg.msgtype}")
        clock_left_out = _leave_out_recorded_clock(types, config)
        classes: dict[str, type] = {}
        unknown: dict[str, str] = {}
        for topic, kind in types.items():
            try:
                classes[topic] = _message_class(kind)
            except BagError:
                unknown[topic] = kind
        if unknown and not config.skip_unknown:
            kinds = sorted(set(unknown.values()))
            raise BagError(f"cannot play {', '.join(map(repr, kinds))} (not installed here; "
                           f"on {', '.join(sorted(unknown))}); pass --skip-unknown to play "
                           "the other topics")
        if unknown:
            LOG.warning("skipping %d topic(s) of types not installed here: %s", len(unknown),
                        ", ".join(f"{t} ({k})" for t, k in sorted(unknown.items())))
        if not classes:
            raise BagError("nothing to play: no installed type among "
                           f"{sorted(set(types.values()))}")
        types = {topic: kind for topic, kind in types.items() if topic in classes}
        _check_topic_names({topic: config.topic_name(topic) for topic in types})
        self._publishers = {topic: node.create_publisher(
            classes[topic], config.topic_name(topic),
            _publisher_qos(config.qos_depth, *recorded.get(topic, (RecordedQos(), 0))))
            for topic in types}
        self._clock_pub = self._clock_publisher(qos) if config.clock_hz is not None else None
        self.stats = PlayStats(per_topic={topic: 0 for topic in types}, skipped=unknown,
                               clock_left_out=clock_left_out)

    def _clock_publisher(self, qos):
        """The /clock publisher, once the played time range fits builtin_interfaces/Time."""
        from rosgraph_msgs.msg import Clock

        if isinstance(self._messages, BagStream):
            span = (self._messages.start_ns, self._messages.info.end_ns)
        else:
            stamps = [msg.timestamp_ns for msg in self._messages]
            span = (min(stamps), max(stamps))
        for bag_ns in span:
            _clock_time(bag_ns)
        return self._node.create_publisher(Clock, "/clock", qos)

    def wait_for_subscribers(self, topics: Sequence[str] | None, timeout_s: float) -> bool:
        """Block until each of ``topics`` has a matched subscriber; False on timeout or stop.

        Messages published before DDS matched a subscriber are lost, so a demo waits here.
        ``None`` waits for every played topic (and /clock when it is published).
        """
        publishers = dict(self._publishers)
        if self._clock_pub is not None:
            publishers["/clock"] = self._clock_pub
        topics = list(publishers) if topics is None else list(topics)
        missing = [t for t in topics if t not in publishers]
        if missing:
            raise BagError(f"cannot wait for {missing}: not among the played topics")
        deadline = time.monotonic() + timeout_s
        while not all(publishers[t].get_subscription_count() > 0 for t in topics):
            if time.monotonic() > deadline or self._stop.wait(0.05):
                return False
        return True

    def stop(self) -> None:
        """Ask a running :meth:`play` to return at its next wait."""
        self._stop.set()

    def _wait_until(self, deadline_ns: int) -> bool:
        """Sleep until the monotonic deadline; False when stopped meanwhile."""
        remaining = (deadline_ns - time.monotonic_ns()) / 1e9
        if remaining > 0:
            return not self._stop.wait(remaining)
        return not self._stop.is_set()

    def _publish_clock(self, bag_ns: int) -> None:
        from rosgraph_msgs.msg import Clock

        msg = Clock()
        msg.clock.sec, msg.clock.nanosec = _clock_time(bag_ns)
        self._clock_pub.publish(msg)
        self.stats.clock_ticks += 1

    def _tick_until(self, ticks: _ClockTicks | None, bag_ns: int) -> bool:
        """Publish each /clock tick due up to bag time ``bag_ns``; False when stopped."""
        while ticks is not None and ticks.bag_ns() <= bag_ns:
            if not self._wait_until(ticks.wall_ns()):
                return False
            self._publish_clock(ticks.bag_ns())
            ticks.advance(time.monotonic_ns())
        return True

    def _play_once(self) -> bool:
        """One pass over the messages (read as they are played); False when stopped."""
        first_ns: int | None = None
        wall0 = time.monotonic_ns()
        rate = self._config.rate
        ticks: _ClockTicks | None = None
        last_ns: int | None = None
        for msg in self._messages:
            if first_ns is None:
                first_ns, wall0 = msg.timestamp_ns, time.monotonic_ns()
                if self._clock_pub is not None:
                    ticks = _ClockTicks(first_ns, wall0, 1e9 / self._config.clock_hz, rate)
            _check_gap(msg, last_ns)
            last_ns = max(msg.timestamp_ns, last_ns or msg.timestamp_ns)
            if not self._tick_until(ticks, msg.timestamp_ns):
                return False
            publisher = self._publishers.get(msg.topic)
            if publisher is None:
                continue  # a skipped type (skip_unknown)
            if not self._wait_until(wall0 + round((msg.timestamp_ns - first_ns) / rate)):
                return False
            _publish(publisher, msg)
            self.stats.published += 1
            self.stats.per_topic[msg.topic] += 1
            if self._on_publish is not None:
                self._on_publish(Published(msg.topic, msg.timestamp_ns, time.time_ns()))
        return True

    def play(self) -> PlayStats:
        """Wait for subscribers and ``delay_s``, then play (``loop``: again) until done."""
        wait_s = self._config.wait_for_subscribers_s
        if wait_s and not self.wait_for_subscribers(None, wait_s) and not self._stop.is_set():
            idle = sorted(t for t, p in self._publishers.items()
                          if p.get_subscription_count() == 0)
            LOG.warning("no subscriber after %.1f s on %s; playing anyway", wait_s, idle)
        if self._config.delay_s and self._stop.wait(self._config.delay_s):
            self.stats.stopped = True
            return self.stats
        count = (self._messages.count if isinstance(self._messages, BagStream)
                 else len(self._messages))
        LOG.info("playing %d messages on %d topics at rate %.3g",
                 count, len(self._publishers), self._config.rate)
        while True:
            before = self.stats.published
            if not self._play_once():
                self.stats.stopped = True
                break
            if self.stats.published == before:  # e.g. a start offset past the end
                raise BagError("nothing to play: no message after the start offset")
            self.stats.loops += 1
            if not self._config.loop:
                break
        return self.stats

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait until reliable subscribers acknowledged everything, so exiting loses nothing."""
        from rclpy.duration import Duration

        deadline = time.monotonic() + timeout_s
        pubs = [*self._publishers.values(), *([self._clock_pub] if self._clock_pub else [])]
        return all(pub.wait_for_all_acked(Duration(seconds=max(0.0, deadline - time.monotonic())))
                   for pub in pubs)

    def destroy(self) -> None:
        """Release the publishers (the node stays the caller's)."""
        for pub in self._publishers.values():
            self._node.destroy_publisher(pub)
        if self._clock_pub is not None:
            self._node.destroy_publisher(self._clock_pub)


@dataclass
class _ClockTicks:
    """When /clock ticks in one pass: every ``period_ns`` of wall time from ``wall0``.

    ``ros2 bag play --clock HZ`` publishes from a wall timer, so HZ counts wall-clock
    seconds whatever ``--rate``; counted in bag time, --rate 10 sent 400 ticks a second.
    Each tick carries the bag time reached at its wall time (``rate`` bag ns per wall ns).
    """

    first_ns: int
    wall0: int
    period_ns: float
    rate: float
    index: int = 0

    def wall_ns(self) -> int:
        return self.wall0 + round(self.index * self.period_ns)

    def bag_ns(self) -> int:
        return self.first_ns + round(self.index * self.period_ns * self.rate)

    def advance(self, now_ns: int) -> None:
        """Move to the next tick, or past the missed ones when late (as a timer does).

        A player held up (a slow publish, a loaded machine) sends one tick at once, not a
        burst of stale times.
        """
        self.index = max(self.index + 1, int((now_ns - self.wall0) // self.period_ns))


CLOCK_END_NS = 2**31 * 10**9
"""builtin_interfaces/Time.sec is an int32: /clock ends at 2038-01-19 03:14:08 UTC."""


def _clock_time(bag_ns: int) -> tuple[int, int]:
    """(sec, nanosec) of /clock at a bag time; BagError where Time cannot hold it.

    A larger sec wrapped on the wire (a bag stamped in 2262 published /clock in 1990),
    and ROS time is never negative, so such a bag plays only without --clock.
    """
    if not 0 <= bag_ns < CLOCK_END_NS:
        raise BagError(f"--clock cannot publish the bag time {bag_ns} ns: /clock "
                       "(builtin_interfaces/Time) holds 0 to 2^31 s after 1970 (until "
                       "2038-01-19); play this bag without --clock")
    sec, nanosec = divmod(bag_ns, 10**9)
    return sec, nanosec


def _leave_out_recorded_clock(types: dict[str, str], config: PlayConfig) -> bool:
    """Drop a recorded /clock from ``types`` when the player publishes its own; True if so.

    A recording made in simulation or with ``record -a`` holds /clock, usually another
    time base than the message stamps (sim seconds from 0 beside epoch stamps). Played
    beside the player's clock, a node on sim time saw time jump back and forth on every
    tick. With --clock the player's clock is the one clock; without it the recorded /clock
    plays as recorded (how a user replays sim time). BagError when nothing else is left.
    """
    if config.clock_hz is None or types.pop("/clock", None) is None:
        return False
    if not types:
        raise BagError("nothing to play: the selection holds only the recorded /clock, "
                       "which --clock replaces with the player's own; play it without "
                       "--clock")
    return True


def _check_topic_names(names: dict[str, str]) -> None:
    """BagError naming each recorded topic whose published name is no ROS 2 topic name.

    ``names`` maps recorded to published names; checked before anything is published. A
    recording can hold any string as a topic (one made by another tool, a damaged
    metadata.yaml); rclpy refused it at ``create_publisher`` with an exception of its own
    that the command could only report as an unexpected error.
    """
    from rclpy.exceptions import InvalidTopicNameException
    from rclpy.validate_full_topic_name import validate_full_topic_name
    from rclpy.validate_topic_name import validate_topic_name

    bad = []
    for recorded, name in names.items():
        try:  # a relative name is resolved in the node's namespace, as rclpy does
            (validate_full_topic_name if name.startswith("/") else validate_topic_name)(name)
        except InvalidTopicNameException as exc:
            reason = str(exc).splitlines()[0].removeprefix("Invalid topic name: ")
            bad.append(f"{recorded!r} ({reason.rstrip(':')})")
    if bad:
        raise BagError(f"cannot play {len(bad)} recorded topic(s) whose names are no valid "
                       f"ROS 2 topic names: {', '.join(bad)}; pass --topics to play the "
                       "others")


MAX_LATCHED_DEPTH = 1000
"""Most messages of a latched topic kept for subscribers that join late: a latched topic
holds a few (one per /tf_static broadcaster); past this it is a stream recorded latched."""


def _publisher_qos(depth: int, recorded: RecordedQos, count: int):
    """The QoS to republish a topic with, adapted to the recorded offers as ros2 bag play.

    A latching subscriber (tf2's static listener, a map client) never matches a VOLATILE
    publisher, so a topic recorded TRANSIENT_LOCAL by all its publishers is played
    TRANSIENT_LOCAL, with a depth that keeps every recorded message for late joiners.
    BEST_EFFORT only when every recorded offer was; RELIABLE matches every subscriber.
    """
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    durability = DurabilityPolicy.VOLATILE
    if recorded.transient_local:
        durability = DurabilityPolicy.TRANSIENT_LOCAL
        depth = max(depth, min(count, MAX_LATCHED_DEPTH))
    reliability = (ReliabilityPolicy.BEST_EFFORT if recorded.best_effort
                   else ReliabilityPolicy.RELIABLE)
    return QoSProfile(depth=depth, reliability=reliability, durability=durability)


def _check_gap(msg: RawMessage, last_ns: int | None) -> None:
    """Refuse to wait out a silence longer than MAX_GAP_S before ``msg``, naming it.

    Also refuse a message older than one already played, which would go out at once in
    a burst: a ``BagStream`` merges a split bag's files by time, so only a message list
    handed over out of order (or a storage file that is not in time order) gets here.
    """
    if last_ns is not None and msg.timestamp_ns < last_ns:
        raise BagError(f"the message on {msg.topic} at {msg.timestamp_ns} ns comes after one "
                       f"at {last_ns} ns: the messages are not in time order")
    if last_ns is not None and msg.timestamp_ns - last_ns > MAX_GAP_S * 1e9:
        raise BagError(f"the message on {msg.topic} at {msg.timestamp_ns} ns comes "
                       f"{(msg.timestamp_ns - last_ns) / 1e9:.6g} s after the one before; a "
                       f"gap over {MAX_GAP_S:g} s is a damaged timestamp or recordings "
                       f"joined together, not something to wait for")


def _publish(publisher, msg: RawMessage) -> None:
    """Publish the recorded bytes, or raise a BagError naming the topic and stamp.

    rclpy refuses bytes that are no valid message of the type with an RCLError that
    names neither.
    """
    try:
        publisher.publish(msg.data)
    except Exception as exc:  # noqa: BLE001 - rclpy raises RCLError, TypeError, ...
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise BagError(f"cannot publish the message on {msg.topic} at {msg.timestamp_ns} "
                       f"ns ({msg.msgtype}): {reason}") from exc


def _ros1_as_rosbag2(stack: contextlib.ExitStack, path) -> Path:
    """Convert a ROS 1 bag into a temporary rosbag2 (the player streams rosbag2 only).

    The folder lives as long as ``stack``; a BagError raised under ``stack`` names the
    user's file instead of the copy, which is gone by the time the error is read.
    """
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="thinkmem-ros1-")))
    stack.enter_context(_errors_naming(folder, path))
    LOG.info("converting ROS 1 bag %s to a temporary rosbag2", path)
    return convert_ros1(path, folder / "bag").path


@contextlib.contextmanager
def _errors_naming(copy: Path, original):
    """Re-raise a BagError with each path under ``copy`` replaced by ``original``.

    A ROS 1 bag plays from a converted copy in a temporary folder: its errors (a topic
    recorded with two types) named ``/tmp/thinkmem-ros1-.../bag``, a folder already
    deleted, instead of the file the user passed.
    """
    try:
        yield
    except BagError as exc:
        said = str(exc)
        named = re.sub(re.escape(str(copy)) + r"[^\s:;,'\")]*", lambda _: str(original), said)
        if named == said:
            raise
        raise BagError(named) from exc


def play_bag(path, config: PlayConfig, node_name: str = "thinkmem_bag_player") -> PlayStats:
    """Stream ``path`` onto a node of its own until done or stopped by SIGINT/SIGTERM.

    rclpy's own signal handlers are not installed: they would shut the context down
    while a publish is under way. Ours are installed first thing, so a signal during
    start-up (opening the bag, starting rclpy) stops the player before it plays instead
    of killing it or raising out of an rclpy call; ``PlayStats.signal`` says which one.
    A ROS 1 ``.bag`` is converted into a temporary rosbag2 folder, removed afterwards.
    """
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    caught: list[int] = []
    players: list[BagPlayer] = []

    def on_signal(signum, _frame) -> None:
        caught.append(signum)
        for player in players:
            player.stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with contextlib.ExitStack() as stack:
            if is_ros1_bag(path):
                path = _ros1_as_rosbag2(stack, path)
            source = BagStream(path, topics=config.topics,
                               start_offset_s=config.start_offset_s)
            with rclpy.init(signal_handler_options=SignalHandlerOptions.NO):
                node = rclpy.create_node(node_name)
                player = BagPlayer(node, source, config)
                players.append(player)
                if player.stats.clock_left_out:  # said here once, where the user reads it
                    print(CLOCK_LEFT_OUT, flush=True)
                if caught:
                    player.stop()
                try:
                    stats = player.play()
                    if not stats.stopped and not player.flush():
                        LOG.warning("some messages were not acknowledged before exit")
                finally:
                    player.destroy()
                    node.destroy_node()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    stats.signal = caught[0] if caught else None
    return stats
