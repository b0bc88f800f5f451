"""``thinkmem bag play`` over real DDS: recorded timing, rate, topic filter, offset, clock."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import recorded_qos, spinning_node

from thinkmem_ros.core.data import SignalStream
from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
from thinkmem_ros.playback.bag_files import GROUND_TRUTH_TOPIC, default_bindings, write_stream

pytestmark = pytest.mark.ros

ROOT = Path(__file__).resolve().parent.parent
DOMAIN = str(random.randint(1, 200))
RATE = 10.0
FRAMES = 20  # 2 s of stream
WAIT = ("--wait-for-subscribers", "30", "--delay", "0.3")  # nothing lost to discovery


def _env() -> dict[str, str]:
    env = dict(os.environ, ROS_DOMAIN_ID=DOMAIN, ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               PYTHONPATH=str(ROOT))
    return env


def _stream() -> SignalStream:
    values = np.tile(np.arange(FRAMES, dtype=np.float32)[:, None], (1, len(SIGNALS)))
    labels = np.zeros((FRAMES, len(THINKING)), dtype=np.float32)
    return SignalStream(rate_hz=RATE, values=values, labels=labels, scenario="ramp")


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    root = tmp_path_factory.mktemp("play")
    write_stream(_stream(), root / "mcap")
    write_stream(_stream(), root / "sqlite", storage="sqlite3")
    return root


@pytest.fixture(scope="module")
def ros():
    with spinning_node("bag_play_test", DOMAIN) as node:
        yield node


class Recorder:
    """Subscriptions that log (receive monotonic time, decoded message) per topic."""

    def __init__(self, node, topics: dict[str, type]) -> None:
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        qos = QoSProfile(depth=500, reliability=ReliabilityPolicy.RELIABLE)
        self.node = node
        self.got: dict[str, list[tuple[float, object]]] = {t: [] for t in topics}
        self._subs = [node.create_subscription(
            cls, topic, lambda msg, t=topic: self.got[t].append((time.monotonic(), msg)), qos)
            for topic, cls in topics.items()]

    def close(self) -> None:
        for sub in self._subs:
            self.node.destroy_subscription(sub)


def _play(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "thinkmem_ros.cli", "bag", "play", *args],
                          env=_env(), capture_output=True, text=True, timeout=timeout)


def _temperature_topic() -> str:
    return default_bindings()[0]["temperature"].topic


def _record_play(ros, bag: Path, *args: str, extra: dict[str, type] | None = None):
    from thinkmem_ros.playback.bag_files import bag_info
    from thinkmem_ros.robot.msg_fields import message_class

    topics = {t: message_class(kind) for t, (kind, _) in bag_info(bag).topics.items()}
    recorder = Recorder(ros, {**topics, **(extra or {})})
    try:
        done = _play(str(bag), *WAIT, *args)
        time.sleep(0.3)  # last messages in flight
    finally:
        recorder.close()
    assert done.returncode == 0, done.stderr
    return recorder.got, done


def _gaps(samples) -> np.ndarray:
    return np.diff([t for t, _ in samples])


def test_recorded_timing_and_values(ros, bags):
    got, done = _record_play(ros, bags / "mcap")
    temps = got[_temperature_topic()]
    assert [m.temperature for _, m in temps] == pytest.approx(list(range(FRAMES)))
    assert len(got[GROUND_TRUTH_TOPIC]) == FRAMES
    gaps = _gaps(temps)
    assert np.median(gaps) == pytest.approx(1 / RATE, abs=0.015)
    assert temps[-1][0] - temps[0][0] == pytest.approx((FRAMES - 1) / RATE, abs=0.15)
    assert f"published {FRAMES * (len(SIGNALS) + 1)} messages" in done.stdout


def test_a_fast_play_exits_once_a_subscriber_in_another_process_acknowledged(ros, bags):
    """Played in a burst, the last messages are acknowledged at the writer's next heartbeat
    (Fast DDS: every 3 s), ~2.6 s after the end: the player waited 2 s and warned "some
    messages were not acknowledged" on every such run. It now waits up to 5 s."""
    got, done = _record_play(ros, bags / "mcap", "--rate", "100")
    assert "not acknowledged" not in done.stderr, done.stderr
    assert len(got[GROUND_TRUTH_TOPIC]) == FRAMES


def test_rate_topics_and_start_offset(ros, bags):
    got, _ = _record_play(ros, bags / "mcap", "--rate", "2", "--topics", _temperature_topic(),
                          "--start-offset", "1.0")
    temps = got[_temperature_topic()]
    assert got[GROUND_TRUTH_TOPIC] == []  # filtered out
    assert [m.temperature for _, m in temps] == pytest.approx(list(range(10, FRAMES)))
    assert np.median(_gaps(temps)) == pytest.approx(0.5 / RATE, abs=0.012)


def test_sqlite3_bag_plays_with_clock(ros, bags):
    from rosgraph_msgs.msg import Clock

    got, done = _record_play(ros, bags / "sqlite", "--clock", "50", extra={"/clock": Clock})
    assert len(got[_temperature_topic()]) == FRAMES
    clock_ns = [m.clock.sec * 10**9 + m.clock.nanosec for _, m in got["/clock"]]
    assert len(clock_ns) >= 0.8 * (FRAMES - 1) / RATE * 50
    assert np.all(np.diff(clock_ns) > 0)
    first_stamp = got[_temperature_topic()][0][1].header.stamp
    assert clock_ns[0] == first_stamp.sec * 10**9 + first_stamp.nanosec


@pytest.mark.parametrize("args, code, message", [
    (["/definitely/not/a/bag"], 1, "bag not found"),
    (["BAG", "--rate", "-1"], 2, "--rate: must be a finite number > 0, got '-1'"),
    (["BAG", "--start-offset", "nan"], 2, "--start-offset"),
    (["BAG", "--topics", "/nope"], 1, "/nope"),
])
def test_bad_play_input_exits_nonzero(bags, args, code, message):
    args = [str(bags / "mcap") if a == "BAG" else a for a in args]
    done = _play(*args)
    assert done.returncode == code
    assert message in done.stderr


def test_bad_write_input_exits_nonzero(tmp_path):
    base = [sys.executable, "-m", "thinkmem_ros.cli", "bag", "write", "--out",
            str(tmp_path / "b")]
    done = subprocess.run([*base, "--scenario", "nosuch", "--duration", "1"], env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "unknown scenario 'nosuch'" in done.stderr
    done = subprocess.run([*base, "--scenario", "mixed", "--duration", "-3"], env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--duration" in done.stderr
    assert not (tmp_path / "b").exists()


def test_write_command_records_a_scenario(tmp_path):
    out = tmp_path / "mixed"
    done = subprocess.run(
        [sys.executable, "-m", "thinkmem_ros.cli", "bag", "write", "--scenario", "mixed",
         "--duration", "5", "--rate", "10", "--seed", "2", "--out", str(out)],
        env=_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (out / "metadata.yaml").is_file()
    assert f"{GROUND_TRUTH_TOPIC:<32} std_msgs/msg/String              50" in done.stdout


# ---------------------------------------------------------------- signals, loops, memory

@pytest.fixture
def probe_ctx(tmp_path):
    from thinkmem_ros.bench.fault_probes_node import ProbeContext

    return ProbeContext(tmp_path / "probes", domain_id=int(DOMAIN), start_timeout_s=30.0)


@pytest.mark.parametrize("probe", ["bag_play_sigint", "bag_play_sigterm"])
def test_a_signal_while_playing_exits_quietly(probe, probe_ctx):
    """Ctrl-C exits 130, SIGTERM 0, each with one summary line and no RCLError."""
    from thinkmem_ros.bench.fault_probes_node import PROBES

    record = PROBES[probe](probe_ctx)
    assert not record["crashed"] and record["ok"], record["detail"]


def test_looped_play_with_clock_keeps_stamped_signals_live(probe_ctx, source_bundle):
    """Each loop sends /clock back; the node resets its window instead of going blind."""
    from thinkmem_ros.bench.fault_probes_node import probe_bag_loop_clock

    probe_ctx.bundle = source_bundle
    record = probe_bag_loop_clock(probe_ctx, loops=2)
    assert not record["crashed"] and record["ok"], record["detail"]


def test_namespace_option_moves_topics_but_not_clock(ros, bags):
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import Temperature

    recorder = Recorder(ros, {"/robot7/sensors/temperature": Temperature,
                              "/sensors/temperature": Temperature, "/clock": Clock})
    try:
        done = _play(str(bags / "mcap"), *WAIT, "--namespace", "robot7", "--clock", "20",
                     "--topics", _temperature_topic())
        time.sleep(0.3)
    finally:
        recorder.close()
    assert done.returncode == 0, done.stderr
    assert len(recorder.got["/robot7/sensors/temperature"]) >= FRAMES - 2
    assert recorder.got["/sensors/temperature"] == []
    assert recorder.got["/clock"]


# ---------------------------------------------------------------- recorded QoS

def _qos_bag(path: Path) -> Path:
    """``/latched`` recorded TRANSIENT_LOCAL (5 messages), ``/lossy`` BEST_EFFORT, and
    ``/mixed`` from a latched and a volatile publisher."""
    from rosbags.interfaces import QosReliability
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    volatile, latched = recorded_qos(1)
    lossy = volatile._replace(reliability=QosReliability.BEST_EFFORT)
    string = store.types["std_msgs/msg/String"]
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        for topic, offers in (("/latched", [latched]), ("/lossy", [lossy]),
                              ("/mixed", [latched, volatile])):
            conn = writer.add_connection(topic, "std_msgs/msg/String", typestore=store,
                                         offered_qos_profiles=offers)
            for k in range(5):
                writer.write(conn, 1_700_000_000 * 10**9 + k * 10**7, bytes(
                    store.serialize_cdr(string(data=f"m{k}"), "std_msgs/msg/String")))
    return path


def test_a_topic_recorded_latched_reaches_a_latching_subscriber_that_joins_late(ros,
                                                                                tmp_path):
    """Every publisher was RELIABLE+VOLATILE: a TRANSIENT_LOCAL subscriber (tf2's static
    listener, a map client) never matched it and got nothing, while play exited 0."""
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    from thinkmem_ros.playback.bag_files import BagStream
    from thinkmem_ros.playback.player import BagPlayer, PlayConfig

    player = BagPlayer(ros, BagStream(_qos_bag(tmp_path / "qos")),
                       PlayConfig(rate=1000.0, qos_depth=1))
    got: list[str] = []
    sub = None
    try:
        assert player.play().published == 15
        offered = {topic: {(info.qos_profile.durability, info.qos_profile.reliability)
                           for info in ros.get_publishers_info_by_topic(topic)}
                   for topic in ("/latched", "/lossy", "/mixed")}
        assert offered == {
            "/latched": {(DurabilityPolicy.TRANSIENT_LOCAL, ReliabilityPolicy.RELIABLE)},
            "/lossy": {(DurabilityPolicy.VOLATILE, ReliabilityPolicy.BEST_EFFORT)},
            "/mixed": {(DurabilityPolicy.VOLATILE, ReliabilityPolicy.RELIABLE)}}
        sub = ros.create_subscription(String, "/latched", lambda m: got.append(m.data),
                                      QoSProfile(depth=10, durability=DurabilityPolicy
                                                 .TRANSIENT_LOCAL))
        deadline = time.monotonic() + 10
        while len(got) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if sub is not None:
            ros.destroy_subscription(sub)
        player.destroy()
    assert got == [f"m{k}" for k in range(5)]


# ---------------------------------------------------------------- names ROS refuses

@pytest.mark.parametrize("topic, says", [
    ("/sensors/vibrätiøn", "characters other than alphanumerics"),
    ("/sensors//vibration", "repeated '/'"),
    ("/sensors/vibration/", "must not end with"),
    ("/1sensors/vibration", "starts with a number"),
    ("", "must not be empty"),
])
def test_a_recorded_topic_name_ros_refuses_is_one_line_naming_it(tmp_path, topic, says):
    """rclpy's InvalidTopicNameException reached the command's catch-all as an
    unexpected error."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    string = store.types["std_msgs/msg/String"]
    with Writer(tmp_path / "b", version=9, storage_plugin=StoragePlugin.SQLITE3) as writer:
        for name in (topic, "/fine"):
            conn = writer.add_connection(name, "std_msgs/msg/String", typestore=store)
            writer.write(conn, 1_700_000_000 * 10**9, bytes(
                store.serialize_cdr(string(data="x"), "std_msgs/msg/String")))
    done = _play(str(tmp_path / "b"))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"{topic!r} (" in done.stderr and says in done.stderr
    assert "no valid ROS 2 topic name" in done.stderr and "--topics" in done.stderr
    assert "InvalidTopicNameException" not in done.stderr
    assert _play(str(tmp_path / "b"), "--topics", "/fine").returncode == 0


def test_a_namespace_of_non_ascii_letters_is_refused(bags):
    done = _play(str(bags / "mcap"), "--namespace", "ä")
    assert done.returncode == 1 and "namespace must be ROS names" in done.stderr


# ---------------------------------------------------------------- /clock's range

@pytest.mark.parametrize("start_ns", [2**63 - 10**9, 2**31 * 10**9 - 10**8],
                         ids=["year-2262", "past-2038"])
def test_clock_is_refused_for_a_bag_stamped_past_what_clock_can_hold(tmp_path, start_ns):
    """builtin_interfaces/Time.sec is an int32: a bag stamped in 2262 published /clock
    in 1990 (the seconds wrapped on the wire), silently."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    string = store.types["std_msgs/msg/String"]
    with Writer(tmp_path / "b", version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        conn = writer.add_connection("/late", "std_msgs/msg/String", typestore=store)
        for k in range(5):
            writer.write(conn, start_ns + k * 10**8, bytes(
                store.serialize_cdr(string(data="x"), "std_msgs/msg/String")))
    done = _play(str(tmp_path / "b"), "--clock", "20", "--rate", "100")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "play this bag without --clock" in done.stderr and "published" not in done.stdout
    assert _play(str(tmp_path / "b"), "--rate", "100").returncode == 0


def test_skip_unknown_warns_once_naming_the_skipped_topic(tmp_path):
    """The player's warning and the command's own line both named the skipped topic."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    store.register(get_types_from_msg("float64 speed\n", "acme_msgs/msg/Wheel"))
    wheel, string = store.types["acme_msgs/msg/Wheel"], store.types["std_msgs/msg/String"]
    with Writer(tmp_path / "b", version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        for topic, msg, kind in (("/wheel", wheel(speed=1.0), "acme_msgs/msg/Wheel"),
                                 ("/fine", string(data="x"), "std_msgs/msg/String")):
            conn = writer.add_connection(topic, kind, typestore=store)
            writer.write(conn, 1_700_000_000 * 10**9, bytes(store.serialize_cdr(msg, kind)))
    done = _play(str(tmp_path / "b"), "--skip-unknown", "--rate", "100")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("/wheel (acme_msgs/msg/Wheel)") == 1, done.stderr
    assert "published 1 messages" in done.stdout
