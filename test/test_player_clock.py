"""``thinkmem bag play`` and the clock: a recorded /clock beside ``--clock``, over real DDS."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import spinning_node

pytestmark = pytest.mark.ros

ROOT = Path(__file__).resolve().parent.parent
START_NS = 1_700_000_000 * 10**9  # message stamps: wall time, as a robot records them
RATE_HZ = 10.0
COUNT = 20  # 2 s of recording
WAIT = ("--wait-for-subscribers", "30", "--delay", "0.3")  # nothing lost to discovery


@pytest.fixture(scope="module")
def ros(ros_env):
    with spinning_node("player_clock_test", ros_env["ROS_DOMAIN_ID"]) as node:
        yield node


def _sim_clock_bag(path: Path) -> Path:
    """A ``record -a``-like rosbag2: /chatter and a /clock of sim seconds from 0."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    types = store.types
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        chatter = writer.add_connection("/chatter", "std_msgs/msg/String", typestore=store)
        clock = writer.add_connection("/clock", "rosgraph_msgs/msg/Clock", typestore=store)
        for k in range(COUNT):
            t = START_NS + round(k * 1e9 / RATE_HZ)
            sim = round(k * 1e9 / RATE_HZ)
            writer.write(clock, t, bytes(store.serialize_cdr(types["rosgraph_msgs/msg/Clock"](
                clock=types["builtin_interfaces/msg/Time"](sec=sim // 10**9,
                                                           nanosec=sim % 10**9)),
                "rosgraph_msgs/msg/Clock")))
            writer.write(chatter, t, bytes(store.serialize_cdr(
                types["std_msgs/msg/String"](data=f"m{k}"), "std_msgs/msg/String")))
    return path


def _play(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "thinkmem_ros.cli", "bag", "play", *args],
                          env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=60)


def _clock_heard(ros, env: dict[str, str], *args: str, arrivals: list[float] | None = None):
    """(/clock values in ns, /chatter texts, the finished command) of one playback.

    /chatter is subscribed too: the player waits for a subscriber on every played topic.
    ``arrivals`` gets the monotonic time each /clock message arrived.
    """
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rosgraph_msgs.msg import Clock
    from std_msgs.msg import String

    heard: list[int] = []
    chatter: list[str] = []
    qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
    arrivals = [] if arrivals is None else arrivals

    def on_clock(m) -> None:
        heard.append(m.clock.sec * 10**9 + m.clock.nanosec)
        arrivals.append(time.monotonic())

    subs = [ros.create_subscription(Clock, "/clock", on_clock, qos),
        ros.create_subscription(String, "/chatter", lambda m: chatter.append(m.data), qos)]
    try:
        done = _play(env, *args, *WAIT)
        time.sleep(0.3)  # last messages in flight
    finally:
        for sub in subs:
            ros.destroy_subscription(sub)
    return heard, chatter, done


def test_clock_option_leaves_the_recorded_clock_out(ros, ros_env, tmp_path):
    """The recorded /clock (sim seconds 0-2) went out beside the player's own (epoch
    seconds): a node on sim time saw time jump on every tick, and play said nothing."""
    bag = _sim_clock_bag(tmp_path / "b")
    heard, chatter, done = _clock_heard(ros, ros_env, str(bag), "--clock", "20")
    assert done.returncode == 0, done.stderr
    assert chatter == [f"m{k}" for k in range(COUNT)], chatter
    end_ns = START_NS + round((COUNT - 1) * 1e9 / RATE_HZ)
    assert len(heard) >= 20, heard
    assert all(START_NS <= ns <= end_ns for ns in heard), heard
    assert all(b > a for a, b in zip(heard, heard[1:], strict=False)), heard
    assert done.stdout.count("recorded /clock left out: --clock publishes the clock") == 1
    assert f"published {COUNT} messages" in done.stdout, done.stdout


def test_without_clock_option_the_recorded_clock_plays_as_recorded(ros, ros_env, tmp_path):
    """Replaying sim time yourself: without --clock the recorded /clock is the clock."""
    bag = _sim_clock_bag(tmp_path / "b")
    heard, chatter, done = _clock_heard(ros, ros_env, str(bag))
    assert done.returncode == 0, done.stderr
    assert chatter == [f"m{k}" for k in range(COUNT)], chatter
    assert heard == [round(k * 1e9 / RATE_HZ) for k in range(COUNT)]
    assert "left out" not in done.stdout


def _chatter_bag(path: Path, count: int) -> Path:
    """A rosbag2 of /chatter alone at RATE_HZ, ``count`` messages."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    string = store.types["std_msgs/msg/String"]
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        chatter = writer.add_connection("/chatter", "std_msgs/msg/String", typestore=store)
        for k in range(count):
            writer.write(chatter, START_NS + round(k * 1e9 / RATE_HZ), bytes(
                store.serialize_cdr(string(data=f"m{k}"), "std_msgs/msg/String")))
    return path


def test_clock_hz_counts_wall_clock_seconds_at_any_rate(ros, ros_env, tmp_path):
    """ros2 bag play --clock HZ ticks from a wall timer: a 9.9 s bag at --rate 10 plays in
    ~1 s, so --clock 50 is ~50 ticks 0.2 s of bag time apart. Counted in bag time it was
    ~500 ticks in that second (500 Hz), 0.02 s apart."""
    count, rate, hz = 100, 10.0, 50.0
    arrivals: list[float] = []
    heard, chatter, done = _clock_heard(ros, ros_env, str(_chatter_bag(tmp_path / "b", count)),
                                        "--rate", str(rate), "--clock", str(hz),
                                        arrivals=arrivals)
    assert done.returncode == 0, done.stderr
    assert len(chatter) == count and f"{len(heard)} /clock ticks" in done.stdout, done.stdout
    wall_s = (count - 1) / RATE_HZ / rate
    assert 0.6 * wall_s * hz <= len(heard) <= wall_s * hz + 2, len(heard)
    assert 0.5 * hz <= (len(heard) - 1) / (arrivals[-1] - arrivals[0]) <= 1.5 * hz
    steps_s = [(b - a) / 1e9 for a, b in zip(heard, heard[1:], strict=False)]
    assert sorted(steps_s)[len(steps_s) // 2] == pytest.approx(rate / hz, abs=0.01), steps_s
    end_ns = START_NS + round((count - 1) * 1e9 / RATE_HZ)
    assert heard[0] == START_NS and all(START_NS <= ns <= end_ns for ns in heard)


# ---------------------------------------------------------------- ROS 1 bags' errors

def test_an_error_in_a_ros1_bag_names_the_users_file(ros_env, tmp_path):
    """A ROS 1 bag plays from a converted copy: its errors named that temporary folder
    (/tmp/thinkmem-ros1-XXXX/bag, deleted by then) instead of the file the user gave."""
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    bag = tmp_path / "two_types.bag"
    with Writer(bag) as writer:
        for k, kind in enumerate(("std_msgs/msg/Float64", "std_msgs/msg/Float32")):
            conn = writer.add_connection("/x", kind, typestore=store)
            writer.write(conn, START_NS + k * 10**8,
                         bytes(store.serialize_ros1(store.types[kind](data=1.0), kind)))
    done = _play(ros_env, str(bag))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"error: {bag}: topic /x is recorded with 2 message types" in done.stderr
    assert "thinkmem-ros1-" not in done.stderr, done.stderr
