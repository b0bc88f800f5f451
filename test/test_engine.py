"""Discovery's passes run in this process or as Ray tasks on a real local Ray cluster."""

import numpy as np
import pytest
from test_discovery_parts import _assert_same, _world_log

from thinkmem_ros.consolidator.discovery import DiscoveryConfig, discover
from thinkmem_ros.consolidator.engine import (
    EmbeddedEngine,
    EngineError,
    RayEngine,
    make_engine,
    ordered_map,
    release_free_memory,
)


@pytest.fixture(scope="module")
def ray_engine():
    engine = RayEngine(num_cpus=2)  # a real local Ray instance: raylet, object store, workers
    yield engine
    engine.close()


@pytest.mark.parametrize("name", ["shared", "heartbeat"])
def test_ray_and_embedded_engines_accept_the_same_patterns(ray_engine, name):
    log = _world_log(name)
    cfg = DiscoveryConfig(part_events=600)
    embedded = discover(log, cfg, np.random.default_rng(0), engine=EmbeddedEngine())
    distributed = discover(log, cfg, np.random.default_rng(0), engine=ray_engine)
    assert embedded.notes["parts"] > 4 and embedded.accepted
    _assert_same(distributed, embedded)
    assert distributed.accepted_patterns() == embedded.accepted_patterns()


@pytest.mark.parametrize("name", ["shared", "zipf"])
def test_embedded_threads_change_nothing_but_the_time(monkeypatch, name):
    from thinkmem_ros.consolidator.discovery import spill

    monkeypatch.setattr(spill, "TEST_BLOCK", 200)  # many test buckets, on threads too
    log = _world_log(name)
    cfg = DiscoveryConfig(part_events=600)
    one = discover(log, cfg, np.random.default_rng(0), engine=EmbeddedEngine(threads=1))
    three = discover(log, cfg, np.random.default_rng(0), engine=EmbeddedEngine(threads=3))
    assert one.notes["parts"] > 4
    assert three.notes["parts"] > 2 * one.notes["parts"]  # parts side by side are smaller
    _assert_same(three, one)
    assert three.accepted_patterns() == one.accepted_patterns()


def test_ordered_map_keeps_order_runs_at_once_and_bounds_what_waits():
    import threading
    import time

    lock, started, names = threading.Lock(), [], set()

    def work(i):
        with lock:
            started.append(i)
            names.add(threading.current_thread().name)
        time.sleep(0.02 * (i % 3 == 0))  # every third item finishes last
        return i * i

    got = []
    for value in ordered_map(work, range(12), threads=3):
        with lock:  # items started but not yet handed over: at most the thread count
            assert len(started) - len(got) <= 3 + 1
        got.append(value)
    assert got == [i * i for i in range(12)]
    assert len(names) > 1  # really on several threads
    assert list(ordered_map(work, range(4), threads=1)) == [0, 1, 4, 9]


def test_ordered_map_raises_the_first_failure_and_the_engine_refuses_no_threads():
    def work(i):
        if i == 2:
            raise ValueError("part 2 is bad")
        return i

    with pytest.raises(ValueError, match="part 2"):
        list(ordered_map(work, range(8), threads=2))
    with pytest.raises(EngineError, match="threads"):
        EmbeddedEngine(threads=0)
    assert make_engine("embedded", threads=1).threads == 1
    release_free_memory()  # glibc's malloc_trim here; a no-op elsewhere, never an error
    with pytest.raises(EngineError, match="threads"):
        make_engine("embedded", threads=0)


def test_ray_tasks_ran_in_other_processes(ray_engine):
    import os

    def where(log, first, last):
        return os.getpid(), first, last

    parts = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    got = list(ray_engine.map(where, None, parts))
    assert [g[1:] for g in got] == parts  # in part order, whatever finished first
    assert all(pid != os.getpid() for pid, _, _ in got)


def test_engine_names_and_bad_addresses_are_one_line_errors():
    assert make_engine("embedded").name == "embedded"
    with pytest.raises(EngineError, match="unknown engine"):
        make_engine("spark")
    with pytest.raises(EngineError, match="only applies"):
        make_engine("embedded", address="ray://x:1")


def test_a_round_on_the_ray_engine_promotes_what_the_embedded_one_does(ray_engine, tmp_path):
    from dataclasses import replace

    import consolidator_world as world

    from thinkmem_ros.consolidator.retrain import RetrainConfig
    from thinkmem_ros.consolidator.service import ConsolidatorConfig, ConsolidatorService
    from thinkmem_ros.consolidator.store import ExperienceStore
    from thinkmem_ros.link.experience import encode_experience
    from thinkmem_ros.link.security import write_signing_keypair

    _, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    bundle = world.running_bundle(tmp_path / "running")
    records = [replace(e, seq=i) for i, e in enumerate(world.experiences("r1", 40, 5, seed=1))]
    promoted = {}
    for engine in ("embedded", "ray"):
        db = tmp_path / f"{engine}.db"
        with ExperienceStore(db) as store:
            store.insert_many([(e, encode_experience(e)) for e in records])
        config = ConsolidatorConfig(
            db_path=db, publish_dir=tmp_path / f"pub-{engine}", signing_key=key,
            initial_bundle=bundle, retrain=RetrainConfig(epochs=2), engine=engine,
            train_workers=2,
            discovery=DiscoveryConfig(part_events=100))  # several parts: the engine runs
        service = ConsolidatorService(config)
        try:
            report = service.run_round("test")
        finally:
            service.close()
        promoted[engine] = sorted(report.promoted)
        assert report.engine.startswith(engine) and report.policy, report.to_dict()
    assert "EA>EB>EC" in promoted["embedded"]
    assert promoted["ray"] == promoted["embedded"]


def test_the_consolidator_refuses_an_unknown_engine(tmp_path):
    from thinkmem_ros.consolidator.service import ConsolidatorConfig

    with pytest.raises(ValueError, match="engine must be one of"):
        ConsolidatorConfig(signing_key=tmp_path / "k", engine="spark")
    with pytest.raises(ValueError, match="only applies"):
        ConsolidatorConfig(signing_key=tmp_path / "k", engine_address="ray://x:1")


def test_an_address_nothing_listens_at_fails_in_seconds_with_one_line(tmp_path):
    import subprocess
    import sys

    from thinkmem_ros.link.security import write_signing_keypair

    _, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    with pytest.raises(EngineError, match="no Ray cluster answers"):
        RayEngine(address="127.0.0.1:1")
    with pytest.raises(EngineError, match="host:port"):
        RayEngine(address="nowhere")
    done = subprocess.run(
        [sys.executable, "-m", "thinkmem_ros.consolidator.service", "--once", "--db",
         str(tmp_path / "c.db"), "--signing-key", str(key), "--engine", "ray",
         "--address", "127.0.0.1:1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "thinkmem consolidator: error: no Ray cluster answers at 127.0.0.1:1: [Errno 111] "
        "Connection refused"]
    done = subprocess.run(
        [sys.executable, "-m", "thinkmem_ros.consolidator.service", "--once", "--db",
         str(tmp_path / "c.db"), "--signing-key", str(key), "--threads", "-1"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "thinkmem consolidator: error: --threads must be >= 0, got -1"]


def test_the_engines_build_the_same_material(ray_engine):
    from dataclasses import replace

    import consolidator_world as world

    from thinkmem_ros.consolidator.direct import direct_material, direct_material_on

    records = [replace(e, seq=i) for i, e in enumerate(world.experiences("r1", 30, 5, seed=2))]
    records += [replace(e, seq=1000 + i, robot_id="r2")
                for i, e in enumerate(world.experiences("r2", 20, 5, seed=3))]
    records.insert(7, replace(records[0], required=None, seq=5000))  # one skipped
    records.insert(9, replace(records[1], required=[*records[1].required, "inspect"],
                              seq=5001))  # a label outside the set: left out, row kept
    options = dict(label_names=(*world.THINKING, "consider:EC"),
                   signal_names=tuple(f"s{i}" for i in range(7)), window=world.K,
                   event_vocabulary=("EA", "EB", "EC", "EX"), max_events=6)
    whole = direct_material(records, **options)
    for engine in (EmbeddedEngine(), ray_engine):
        got = direct_material_on(engine, records, chunk=37, **options)  # chunks cut episodes
        for name in ("signals", "labels", "mask", "events", "groups"):
            assert np.array_equal(getattr(got.data, name), getattr(whole.data, name)), name
        assert got.episodes == whole.episodes and got.first_stamps == whole.first_stamps
        assert got.skipped == whole.skipped and got.skipped["no_required"] >= 1
        assert got.labels_left_out == whole.labels_left_out
    assert len(whole.data) == 251 and len(set(whole.data.groups.tolist())) == 50
    assert whole.labels_left_out == 1
