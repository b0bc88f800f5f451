"""Several receive-only processes on one store: robots spread, one receiver dies, none lost."""

import multiprocessing as mp
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from thinkmem_ros.consolidator.store import SCHEMA_VERSION, ExperienceStore
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.link.shipper import (
    ExperienceShipper,
    ShipperConfig,
    endpoint_order,
    parse_endpoints,
)
from thinkmem_ros.robot.node_config import NodeConfig

ROOT = Path(__file__).resolve().parents[1]


def start_receive(db, bind="tcp://127.0.0.1:*", *extra):
    """``thinkmem consolidator receive`` as a process (the working tree's, not the venv's)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "thinkmem_ros.cli", "consolidator", "receive", "--db", str(db),
         "--bind", bind, "--curve", "off", *extra], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=env, text=True, cwd=ROOT)
    line = proc.stdout.readline()  # READY once bound and the store is open
    assert line.startswith("READY "), f"receiver did not start: {line!r}"
    return proc, line.split()[1]


def exp(robot, i):
    # 7 signals: the width of the shipped default bundle the receivers' filter serves
    return Experience(robot_id=robot, episode_id=f"e{i // 200}", stamp=float(i),
                      window=np.zeros((16, 7), dtype=np.float32), labels=["trend"],
                      probabilities=[0.5], bundle_version=1, trace=f"x{i}")


def robots_homed(endpoints, per_endpoint):
    """Robot ids whose home (the shipper's own rule) is each endpoint ``per_endpoint`` times."""
    out = {e: [] for e in endpoints}
    k = 0
    while any(len(v) < per_endpoint for v in out.values()):
        robot = f"robot-{k}"
        home = endpoint_order(robot, endpoints)[0]
        if len(out[home]) < per_endpoint:
            out[home].append(robot)
        k += 1
    return out


def wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def shipper_config(tmp_path, robot, endpoints, ack_timeout_s=5.0):
    """A longer ack timeout than the shipper's default: 0.5 s, and later 2 s, let the
    surviving receiver, starved of CPU (a 2-core machine running a training job beside the
    suite) while it took over the dead one's robots and flushed its lake, look dead to its
    own robots for a moment."""
    return ShipperConfig(endpoint=endpoints, robot_id=robot,
                         spool_path=tmp_path / f"{robot}.spool", batch_size=100,
                         ack_timeout_s=ack_timeout_s, backoff_initial_s=0.05,
                         backoff_max_s=0.3)


def test_sigkill_one_of_two_receivers_loses_and_doubles_nothing(tmp_path):
    db = tmp_path / "store.db"
    # both receivers also move the store's tail into its Parquet lake every 400 rows, so
    # the kill can land in a flush too
    (a, end_a), (b, end_b) = (start_receive(db, "tcp://127.0.0.1:*", "--flush-rows", "400")
                              for _ in range(2))
    n = 1500
    homes = robots_homed([end_a, end_b], 2)  # 4 robots, 2 on each receiver
    robots = homes[end_a] + homes[end_b]
    shippers = {}
    try:
        shippers.update({r: ExperienceShipper(shipper_config(tmp_path, r, f"{end_a},{end_b}"))
                         .start() for r in robots})
        assert {r: s.endpoint_now for r, s in shippers.items()} == {
            **dict.fromkeys(homes[end_a], end_a), **dict.fromkeys(homes[end_b], end_b)}

        def ship(first: int, last: int) -> None:
            for i in range(first, last):
                for robot, shipper in shippers.items():
                    while not shipper.ship(exp(robot, i)):
                        time.sleep(0.001)

        # mid-stream: the first half shipped and both of A's robots have had batches
        # committed by A (however slow the machine), then A dies and the second half follows
        ship(0, n // 2)
        assert wait_until(lambda: min(shippers[r].stats()["acked"]
                                      for r in homes[end_a]) >= 300, 60.0), \
            {r: s.stats() for r, s in shippers.items()}
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        ship(n // 2, n)
        assert all(s.flush(30.0) for s in shippers.values()), \
            {r: s.stats() for r, s in shippers.items()}
        stats = {r: s.stats() for r, s in shippers.items()}
        now = {r: s.endpoint_now for r, s in shippers.items()}
    finally:
        for shipper in shippers.values():
            shipper.close()
        for proc in (a, b):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
    assert b.wait(10) == 0  # the survivor shuts down cleanly on SIGTERM
    assert a.returncode == -signal.SIGKILL
    with sqlite3.connect(db) as conn:
        flushed = conn.execute("SELECT COUNT(*) FROM flushed_keys").fetchone()[0]
    assert flushed >= 400  # the lake took part
    with ExperienceStore(db) as store:
        assert store.count() == 4 * n
        for robot in robots:
            traces = [e.trace for _, e in store.iter_experiences(robot_id=robot)]
            assert sorted(traces) == sorted(f"x{i}" for i in range(n)), robot
    for robot in homes[end_a]:  # the dead receiver's robots moved to the survivor
        assert stats[robot]["failovers"] >= 1 and now[robot] == end_b, stats[robot]
    for robot in homes[end_b]:  # the survivor's robots never noticed
        assert stats[robot]["failovers"] == 0 and now[robot] == end_b, stats[robot]
    for robot, s in stats.items():  # every ACK is accounted: stored here or a duplicate
        assert s["acked"] >= n and s["stored"] + s["duplicates"] == s["acked"], (robot, s)


def test_a_silent_receiver_is_left_after_the_ack_timeout(tmp_path):
    """SIGSTOP: the TCP connection stays up but nothing is acknowledged."""
    db = tmp_path / "store.db"
    (a, end_a), (b, end_b) = start_receive(db), start_receive(db)
    robot = robots_homed([end_a, end_b], 1)[end_a][0]
    n = 600
    try:
        with ExperienceShipper(shipper_config(tmp_path, robot, [end_a, end_b])) as shipper:
            for i in range(n):
                while not shipper.ship(exp(robot, i)):
                    time.sleep(0.001)
                if i == 200:
                    assert shipper.flush(10.0)
                    a.send_signal(signal.SIGSTOP)
            assert shipper.flush(15.0), shipper.stats()
            stats, now = shipper.stats(), shipper.endpoint_now
    finally:
        a.send_signal(signal.SIGCONT)
        for proc in (a, b):
            proc.send_signal(signal.SIGTERM)
    assert a.wait(10) == 0 and b.wait(10) == 0
    assert now == end_b and stats["failovers"] >= 1 and stats["timeouts"] >= 1, stats
    with ExperienceStore(db) as store:
        traces = [e.trace for _, e in store.iter_experiences()]
    assert sorted(traces) == sorted(f"x{i}" for i in range(n))


def _open(path, barrier, results):
    barrier.wait()
    try:
        with ExperienceStore(path) as store:
            results.put(("ok", store.schema_version))
    except Exception as exc:  # noqa: BLE001 - the parent asserts on it
        results.put(("error", str(exc)))


def test_processes_opening_a_new_store_at_once_migrate_it_once(tmp_path):
    """Before the fix, about half of these trials failed (a migration applied twice, or
    "database is locked" from the switch to WAL)."""
    ctx = mp.get_context("fork")
    for trial in range(20):
        path = tmp_path / f"s{trial}.db"
        barrier, results = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_open, args=(path, barrier, results)) for _ in range(4)]
        for proc in procs:
            proc.start()
        got = [results.get(timeout=30) for _ in procs]
        for proc in procs:
            proc.join(10)
        assert got == [("ok", SCHEMA_VERSION)] * 4, (trial, got)
        with sqlite3.connect(path) as conn:
            versions = [r[0] for r in conn.execute("SELECT version FROM schema_version")]
        assert versions == list(range(1, SCHEMA_VERSION + 1))


def _receive_cli(*args, timeout=20):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "thinkmem_ros.cli", "consolidator",
                           "receive", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)


@pytest.mark.parametrize("args, says", [
    (["--bind", "nonsense"], "bind must look like tcp://host:port"),
    (["--bind", "tcp://127.0.0.1:99999", "--curve", "off"], "port must be 1-65535"),
    (["--bind", "tcp://10.9.8.7:5756"], "CURVE is required"),
    (["--bind", "tcp://127.0.0.1:*", "--curve", "off", "--once"], "rounds only: --once"),
    (["--bind", "tcp://127.0.0.1:*", "--curve", "off", "--initial-bundle", "/nonexistent"],
     "/nonexistent"),
    (["--bind", "tcp://127.0.0.1:*", "--curve", "off", "--flush-rows", "-1"],
     "--flush-rows must be >= 0"),
    (["--bind", "tcp://127.0.0.1:*", "--curve", "off", "--threads", "2"],
     "rounds only: --threads"),
])
def test_receive_refuses_bad_input_in_one_line(tmp_path, args, says):
    done = _receive_cli("--db", str(tmp_path / "s.db"), *args)
    errors = [line for line in done.stderr.splitlines() if "thinkmem consolidator" in line]
    assert done.returncode == 2 and len(errors) == 1 and says in errors[0], done.stderr


def test_receive_exits_cleanly_on_sigint(tmp_path):
    proc, _ = start_receive(tmp_path / "s.db")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(10) == 0
    with ExperienceStore(tmp_path / "s.db") as store:
        assert store.schema_version == SCHEMA_VERSION


def test_endpoint_lists_are_validated_and_spread():
    one = "tcp://127.0.0.1:5755"
    assert parse_endpoints(one) == (one,)
    assert parse_endpoints(f"{one}, tcp://h:2") == (one, "tcp://h:2")
    assert parse_endpoints([one, "tcp://h:2"]) == (one, "tcp://h:2")
    for bad in ("", "127.0.0.1:5755", f"{one},", f"{one},{one}", [one, "nope"], []):
        with pytest.raises(ValueError, match="endpoint"):
            ShipperConfig(endpoint=bad, robot_id="r", spool_path="/tmp/x")
    endpoints = [f"tcp://h:{p}" for p in range(3)]
    homes = [endpoint_order(f"robot-{k}", endpoints)[0] for k in range(300)]
    assert min(homes.count(e) for e in endpoints) > 60  # a fleet spreads
    order = endpoint_order("robot-7", endpoints)
    assert sorted(order) == endpoints and order == endpoint_order("robot-7", endpoints)
    cfg = NodeConfig(robot_id="r", consolidator_endpoint="tcp://127.0.0.1:1,tcp://127.0.0.1:2",
                     curve="off")
    assert cfg.shipping
    for bad in ("tcp://127.0.0.1:1,", "tcp://127.0.0.1:1,tcp://127.0.0.1:1", "tcp://a:1,b"):
        with pytest.raises(ValueError, match="consolidator_endpoint"):
            NodeConfig(robot_id="r", consolidator_endpoint=bad, curve="off")


def test_fleet_measurements_with_tiny_sizes():
    from thinkmem_ros.bench.fleet_ingest import ingest_rate

    result = ingest_rate(receivers=2, robots=2, records=400)
    assert result["lost"] == 0 and result["duplicated"] == 0, result
    assert result["robots_per_receiver"] == [1, 1] and result["ingest_per_s"] > 0
    assert result["receiver_exit_codes"] == [0, 0]
