"""The consolidator is killed with SIGKILL mid-stream and restarted: nothing lost or doubled."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig

ROOT = Path(__file__).resolve().parents[1]


def start_receiver(db, bind="tcp://127.0.0.1:*"):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "thinkmem_ros.consolidator.ingest", "serve", "--db", str(db),
         "--bind", bind], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
        text=True)
    line = proc.stdout.readline()  # the child prints READY after binding
    assert line.startswith("READY "), f"receiver did not start: {line!r}"
    return proc, line.split()[1]


def exp(i):
    return Experience(robot_id="r1", episode_id="e", stamp=float(i),
                      window=np.zeros((16, 4), dtype=np.float32), labels=["trend"],
                      probabilities=[0.5], bundle_version=1, trace=f"x{i}")


def test_receiver_sigkill_and_restart_loses_and_doubles_nothing(tmp_path):
    db = tmp_path / "store.db"
    proc, endpoint = start_receiver(db)
    n = 3000
    cfg = ShipperConfig(endpoint=endpoint, robot_id="r1", spool_path=tmp_path / "spool.db",
                        batch_size=100, ack_timeout_s=0.5, backoff_initial_s=0.05,
                        backoff_max_s=0.3)
    try:
        with ExperienceShipper(cfg) as shipper:
            killed = False
            for i in range(n):
                while not shipper.ship(exp(i)):
                    time.sleep(0.001)
                if not killed and shipper.stats()["acked"] >= 600:
                    proc.send_signal(signal.SIGKILL)  # mid-stream, batches in flight
                    proc.wait(10)
                    killed = True
                    time.sleep(0.2)  # ship into a dead consolidator for a while
            if not killed:  # the stream outran the kill point: kill before the last acks
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
            assert shipper.stats()["acked"] < n
            proc, _ = start_receiver(db, bind=endpoint)
            assert shipper.flush(30.0), shipper.stats()
            stats = shipper.stats()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0  # clean shutdown on SIGTERM
    with ExperienceStore(db) as store:
        got = [e.trace for _, e in store.iter_experiences()]
    assert len(got) == n and set(got) == {f"x{i}" for i in range(n)}
    assert stats["disconnects"] + stats["timeouts"] >= 1
