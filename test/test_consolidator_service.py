"""The consolidator as a process: config validation, SIGTERM and SIGKILL mid-write."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import consolidator_world as world
import pytest

from thinkmem_ros.consolidator.service import ConsolidatorConfig
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.consolidator.trigger import TriggerConfig
from thinkmem_ros.link.security import verify_signed_bundle, write_signing_keypair
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def setup(tmp_path):
    pub, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    return {"pub": pub, "key": key, "bundle": world.running_bundle(tmp_path / "running"),
            "db": tmp_path / "c.db", "pub_dir": tmp_path / "published"}


def start(setup, tmp_path, bind="tcp://127.0.0.1:*", name="log"):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    log = open(tmp_path / f"{name}.txt", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "thinkmem_ros.consolidator.service", "--db", str(setup["db"]),
         "--publish-dir", str(setup["pub_dir"]), "--signing-key", str(setup["key"]),
         "--initial-bundle", str(setup["bundle"]), "--bind", bind, "--buffer-limit", "100",
         "--check-s", "0.1", "--epochs", "4"],
        stdout=subprocess.PIPE, stderr=log, env=env, text=True)
    line = proc.stdout.readline()
    assert line.startswith("READY "), (tmp_path / f"{name}.txt").read_text()
    return proc, line.split()[1]


def shipper_for(endpoint, tmp_path):
    return ExperienceShipper(ShipperConfig(
        endpoint=endpoint, robot_id="r1", spool_path=tmp_path / "spool.db", ack_timeout_s=0.5,
        backoff_initial_s=0.05, backoff_max_s=0.3)).start()


def assert_consistent(setup, expected_rows):
    conn = sqlite3.connect(setup["db"])
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    with ExperienceStore(setup["db"]) as store:
        assert store.count() == expected_rows
        assert len(set(store.seqs("r1"))) == expected_rows
    history = setup["pub_dir"] / "history"
    for folder in history.glob("v*"):  # every visible version is complete and signed
        verify_signed_bundle(folder, setup["pub"])
    current = setup["pub_dir"] / "current"
    if current.is_symlink():
        verify_signed_bundle(current.resolve(), setup["pub"])


def test_config_names_the_bad_key(tmp_path):
    with pytest.raises(ValueError, match="signing_key"):
        ConsolidatorConfig()
    with pytest.raises(ValueError, match="bind"):
        ConsolidatorConfig(signing_key="k", bind="nowhere")
    with pytest.raises(ValueError, match="check_s"):
        ConsolidatorConfig(signing_key="k", check_s=0)
    with pytest.raises(ValueError, match="trigger"):
        ConsolidatorConfig(signing_key="k", trigger={"period_s": 1})
    with pytest.raises(ValueError, match="buffer_limit"):
        TriggerConfig(buffer_limit=0)


def test_sigterm_mid_round_exits_zero_with_the_store_consistent(setup, tmp_path):
    proc, endpoint = start(setup, tmp_path)
    records = world.experiences("r1", 30, 5, seed=3)
    try:
        with shipper_for(endpoint, tmp_path) as shipper:
            for record in records:
                assert shipper.ship(record)
            assert shipper.flush(20.0)
            time.sleep(0.5)  # the buffer trigger (100) has fired: a round is running
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "log.txt").read_text()
    assert "stopped cleanly" in log
    assert_consistent(setup, len(records))
    assert not list((setup["pub_dir"] / "history").glob(".staging-*"))


def test_sigkill_during_writes_then_restart_opens_cleanly(setup, tmp_path):
    proc, endpoint = start(setup, tmp_path)
    records = world.experiences("r1", 60, 5, seed=4)
    try:
        with shipper_for(endpoint, tmp_path) as shipper:
            for record in records[:150]:
                assert shipper.ship(record)
            assert shipper.flush(20.0)
            for record in records[150:]:  # keep the store writing while the round runs
                shipper.ship(record)
                time.sleep(0.004)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            proc, _ = start(setup, tmp_path, bind=endpoint, name="log2")
            assert shipper.flush(30.0), shipper.stats()
        assert_consistent(setup, len(records))  # nothing lost, nothing doubled
        assert not list((setup["pub_dir"] / "history").glob(".staging-*"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
