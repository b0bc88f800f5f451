"""The signal-set fingerprint travels with every experience: wire, robot, store, filter.

The consolidator accepts experiences by signal set (names, order, units, frame rate), not
by which bundle made them, so a robot running a bundle trained on the robot itself (never
published by the consolidator) still feeds the line when its signals are the line's.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time

import msgpack
import numpy as np
import pytest

from thinkmem_ros.consolidator.ingest import SignalSetFilter, open_receiver
from thinkmem_ros.consolidator.store import SCHEMA_VERSION, ExperienceStore
from thinkmem_ros.link.experience import (
    LIMITS,
    MAX_RECORD_BYTES,
    Experience,
    ExperienceError,
    decode_experience,
    encode_experience,
)
from thinkmem_ros.link.receiver import ReceiverConfig
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig
from thinkmem_ros.policy.bundle import (
    BundleError,
    load_bundle,
    parse_manifest,
    signal_set_fingerprint,
    write_bundle,
)
from thinkmem_ros.robot.activation import FrameResult
from thinkmem_ros.robot.experience_builder import BuilderConfig, ExperienceBuilder
from thinkmem_ros.robot.hotswap import load_policy

FP = "c0ffee" + "1" * 58


def make(**kw) -> Experience:
    base = dict(robot_id="robot-1", episode_id="ep.1", stamp=3.0,
                window=np.arange(6, dtype=np.float32).reshape(2, 3), labels=["trend"],
                probabilities=[0.5], bundle_version=2, bundle_sha256="b" * 64,
                required=["trend"], seq=7, signal_set=FP)
    base.update(kw)
    return Experience(**base)


def packed(data: dict) -> bytes:
    return msgpack.packb(data, use_bin_type=True)


# ------------------------------------------------------------------------------ wire

def test_fingerprint_round_trips_in_a_version_3_record():
    exp = make()
    wire = msgpack.unpackb(encode_experience(exp), raw=False)
    assert wire["v"] == 3 and wire["signal_set"] == FP
    back = decode_experience(encode_experience(exp))
    assert back.signal_set == FP and back.to_wire() == exp.to_wire()
    assert back.with_seq(8).signal_set == FP
    assert decode_experience(encode_experience(make(signal_set=""))).signal_set == ""


def test_version_1_and_2_records_still_decode_without_a_fingerprint():
    v2 = make().to_wire()
    v2["v"] = 2
    del v2["signal_set"]
    back = decode_experience(packed(v2))
    assert back.signal_set == "" and back.required == ["trend"]
    assert back.bundle_sha256 == "b" * 64 and back.seq == 7
    v1 = dict(v2, v=1)
    del v1["required"]
    back = decode_experience(packed(v1))
    assert back.signal_set == "" and back.required is None
    # re-encoded, an old record becomes a current one that says the same
    assert msgpack.unpackb(encode_experience(back), raw=False)["v"] == 3


def test_each_version_keeps_its_exact_key_set():
    v2_with = dict(make().to_wire(), v=2)
    with pytest.raises(ExperienceError, match=r"unknown fields \['signal_set'\]"):
        decode_experience(packed(v2_with))
    v3_without = make().to_wire()
    del v3_without["signal_set"]
    with pytest.raises(ExperienceError, match=r"missing fields \['signal_set'\]"):
        decode_experience(packed(v3_without))


@pytest.mark.parametrize("value, match", [
    ("Z" * 64, "signal_set: expected '' or the bundle's signal-set fingerprint"),
    (FP.upper(), "signal_set: expected ''"),
    (FP[:-1], "signal_set: expected ''"),
    (FP + "0", "signal_set: expected ''"),
    ("x" * 100_000, "signal_set: expected ''"),
    (5, "signal_set: expected str, got int"),
    (None, "signal_set: expected str, got NoneType"),
    (FP.encode(), "signal_set: expected str, got bytes"),
])
def test_a_tampered_fingerprint_is_refused_naming_the_field(value, match):
    data = make().to_wire()
    data["signal_set"] = value
    with pytest.raises(ExperienceError, match=match):
        decode_experience(packed(data))
    with pytest.raises(ExperienceError, match="signal_set"):  # and never built on the robot
        make(signal_set=value)


def test_the_largest_valid_record_still_fits_the_size_caps():
    four_byte = "\U0001F600"  # the longest UTF-8 character: the worst case for text caps
    name = "n" * LIMITS["max_name"]
    labels = [f"{i:03d}" + "l" * (LIMITS["max_name"] - 3) for i in range(LIMITS["max_labels"])]
    frames, features = LIMITS["max_frames"], LIMITS["max_features"]
    exp = Experience(
        robot_id="r" * LIMITS["max_id"], episode_id="e" * LIMITS["max_id"], stamp=1.0,
        window=np.ones((frames, features), np.float32),
        mask=np.ones((frames, features), np.uint8),
        events=[name] * LIMITS["max_events"], labels=labels,
        probabilities=np.full(len(labels), 0.5), bundle_version=2**62,
        bundle_sha256="a" * 64, action=four_byte * LIMITS["max_text"],
        trace=four_byte * LIMITS["max_trace"], outcome=four_byte * LIMITS["max_text"],
        reward=1.0, seq=2**63 - 1, required=list(labels), signal_set=FP)
    payload = encode_experience(exp)
    assert len(payload) < MAX_RECORD_BYTES
    back = decode_experience(payload)
    assert back.signal_set == FP and back.trace == exp.trace


def test_a_bundle_manifest_with_a_malformed_fingerprint_is_refused(source_bundle):
    text = (source_bundle / "bundle.json").read_text()
    manifest = load_bundle(source_bundle).manifest
    good = dataclasses.replace(manifest, signal_set=FP).to_json()
    assert parse_manifest(good).signal_set == FP
    bad = dataclasses.replace(manifest, signal_set="not-a-fingerprint").to_json()
    with pytest.raises(BundleError, match="signal_set must be '' or 64 lowercase hex"):
        parse_manifest(bad)
    assert parse_manifest(text).sha256 == manifest.sha256


# ------------------------------------------------------------------------------ robot

@pytest.fixture(scope="module")
def bundles(source_bundle, tmp_path_factory):
    """The served line, a bundle trained locally on the same signals, another signal set."""
    import onnx

    root = tmp_path_factory.mktemp("signal_set_wire")
    line = load_bundle(source_bundle)
    model = onnx.load(str(line.onnx_path))
    model.doc_string = "trained on the robot with thinkmem train --bag"
    local = write_bundle(root / "local", model.SerializeToString(), dataclasses.replace(
        line.manifest, sha256="", signal_set="", created_at="", model_version=1))
    signals = line.manifest.signals
    other = write_bundle(root / "other", line.onnx_path.read_bytes(), dataclasses.replace(
        line.manifest, sha256="", signal_set="", created_at="",
        signal_units={signals[0]: "furlong/fortnight"}))
    served = line.manifest.signal_set or signal_set_fingerprint(line.manifest)
    assert local.manifest.sha256 != line.manifest.sha256
    assert local.manifest.signal_set == served != other.manifest.signal_set
    return {"line": line, "local": local, "other": other, "served": served}


def robot_experiences(folder, robot_id: str, frames: int) -> list[Experience]:
    """What a robot running ``folder`` ships: load_policy -> FrameResult -> builder."""
    policy = load_policy(folder)
    shipped: list[Experience] = []
    builder = ExperienceBuilder(BuilderConfig(robot_id, 0.1, feedback_window_s=0.0),
                                lambda e: shipped.append(e) or True, boot_id="t")
    width = len(policy.signals)
    for i in range(frames):
        stamp = 0.1 * i
        builder.add_frame(FrameResult(
            seq=i, stamp=stamp, signals=np.full((policy.window, width), i, np.float32),
            mask=np.ones((policy.window, width), np.float32),
            events=np.zeros(policy.max_events, np.int64), labels=policy.labels,
            probabilities=np.full(len(policy.labels), 0.5, np.float32), active=(),
            embedding=np.zeros(1, np.float32), inference_us=0.0, latency_us=None,
            bundle_version=policy.version, bundle_sha256=policy.sha256, stale=(),
            inputs_stamp=stamp, signal_set=policy.signal_set), now=stamp)
        builder.release(stamp)
    builder.release(float("inf"), everything=True)
    assert len(shipped) == frames
    return shipped


def test_the_robot_ships_its_bundles_fingerprint(bundles):
    served = bundles["served"]
    # the line bundle declares none (an older bundle.json): the robot computes it
    assert bundles["line"].manifest.signal_set in ("", served)
    assert {e.signal_set for e in robot_experiences(bundles["line"].path, "a", 3)} == {served}
    local = robot_experiences(bundles["local"].path, "b", 3)
    assert {(e.signal_set, e.bundle_sha256) for e in local} == {
        (served, bundles["local"].manifest.sha256)}
    other = robot_experiences(bundles["other"].path, "c", 3)
    assert {e.signal_set for e in other} == {bundles["other"].manifest.signal_set}


def test_a_real_receiver_accepts_a_locally_trained_bundle_of_the_served_signal_set(
        bundles, tmp_path):
    served = bundles["served"]
    line_sha = bundles["line"].manifest.sha256
    local = robot_experiences(bundles["local"].path, "local-robot", 5)
    other = robot_experiences(bundles["other"].path, "other-robot", 4)
    # robots that send no fingerprint (older ones) keep today's rules: the bundle hash
    old_line = [dataclasses.replace(e, signal_set="") for e in robot_experiences(
        bundles["line"].path, "old-robot", 3)]
    old_local = [dataclasses.replace(e, signal_set="") for e in robot_experiences(
        bundles["local"].path, "old-local-robot", 2)]
    db = tmp_path / "consolidator.db"
    accept = SignalSetFilter([bundles["line"]])
    cfg = ReceiverConfig(bind="tcp://127.0.0.1:*", db_path=db, poll_s=0.02)
    with open_receiver(cfg, accept=accept) as rx:
        for robot, records in (("local-robot", local), ("other-robot", other),
                               ("old-robot", old_line), ("old-local-robot", old_local)):
            with ExperienceShipper(ShipperConfig(
                    endpoint=rx.endpoint, robot_id=robot, spool_path=tmp_path / f"{robot}.db",
                    ack_timeout_s=0.5, backoff_initial_s=0.05, backoff_max_s=0.5)) as ship:
                assert all(ship.ship(e) for e in records)
                assert ship.flush(15.0), f"{robot}: not acknowledged"
                stats = ship.stats()
            assert stats["acked"] == len(records) and stats["spool_rows"] == 0, robot
            # a refused robot is told why (by index, in the ACK), not sent an empty ACK
            refused = robot in ("other-robot", "old-local-robot")
            assert stats["rejected"] == (len(records) if refused else 0), (robot, stats)
        deadline = time.monotonic() + 5.0
        while sum(accept.refused.values()) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert accept.refused == {"signal_set": 4, "unknown_bundle": 2}
    with ExperienceStore(db) as store:
        assert store.count("local-robot") == 5 and store.count("old-robot") == 3
        assert store.count("other-robot") == 0 and store.count("old-local-robot") == 0
        assert store.signal_sets() == {"": 3, served: 5}
        kept = [e for _, e in store.iter_experiences(signal_set=served)]
        assert {e.robot_id for e in kept} == {"local-robot"}
        assert {e.bundle_sha256 for e in kept} == {bundles["local"].manifest.sha256}
        assert all(e.bundle_sha256 == line_sha and e.signal_set == ""
                   for _, e in store.iter_experiences(robot_id="old-robot"))


def test_the_filter_judges_by_fingerprint_then_hash_then_width(bundles):
    accept = SignalSetFilter([bundles["line"]])
    served, width = bundles["served"], len(bundles["line"].manifest.signals)
    other_fp = bundles["other"].manifest.signal_set

    def exp(fingerprint: str, sha: str, columns: int = width) -> Experience:
        return make(window=np.zeros((2, columns), np.float32), signal_set=fingerprint,
                    bundle_sha256=sha)

    unknown = "f" * 64
    assert accept.reason(exp(served, unknown)) is None  # any bundle of the signal set
    assert accept.reason(exp(served, "")) is None
    assert accept.reason(exp(other_fp, bundles["line"].manifest.sha256)) == "signal_set"
    assert accept.reason(exp(served, unknown, width + 1)) == "window_width"
    assert accept.reason(exp("", unknown)) == "unknown_bundle"
    assert accept.reason(exp("", bundles["line"].manifest.sha256)) is None
    assert accept.reason(exp("", "", width)) is None
    assert accept.reason(exp("", "", width + 1)) == "window_width"
    accept.serve(bundles["other"])  # a consolidator serving both lines
    assert accept.reason(exp(other_fp, unknown)) is None


# ------------------------------------------------------------------------------ store

def test_the_store_keeps_the_fingerprint_across_reopen(tmp_path):
    path = tmp_path / "store.db"
    with ExperienceStore(path) as store:
        assert store.insert_many([(e, encode_experience(e)) for e in (
            make(seq=1), make(seq=2, signal_set=""))]) == (2, 0)
    with ExperienceStore(path) as store:
        assert store.get("robot-1", 1).signal_set == FP
        assert store.get("robot-1", 2).signal_set == ""
        assert store.signal_sets() == {"": 1, FP: 1}
        assert [e.seq for _, e in store.iter_experiences(signal_set=FP)] == [1]
        assert [e.seq for _, e in store.iter_experiences(signal_set="")] == [2]
    with sqlite3.connect(path) as conn:  # the column itself, not only the payload
        assert conn.execute("SELECT seq, signal_set FROM experiences ORDER BY seq"
                            ).fetchall() == [(1, FP), (2, "")]


def test_a_store_of_the_previous_schema_opens_and_keeps_its_rows(tmp_path):
    path = tmp_path / "old.db"
    v2 = make(seq=5).to_wire()
    v2["v"] = 2
    del v2["signal_set"]
    with ExperienceStore(path, target_version=2) as old:
        assert old.schema_version == 2
        columns = {r[1] for r in old._conn.execute("PRAGMA table_info(experiences)")}
        assert "signal_set" not in columns
        with old._conn:  # a row the way schema 2 wrote it, from a version 2 robot
            old._conn.execute(
                "INSERT INTO experiences (robot_id, seq, episode_id, stamp, bundle_version,"
                " payload, events, reward, received_at) VALUES (?, ?, ?, ?, ?, ?, '', NULL,"
                " 0)", ("robot-1", 5, "ep.1", 3.0, 2, packed(v2)))
    with ExperienceStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 10
        assert store.get("robot-1", 5).signal_set == ""
        assert store.insert_many([(make(seq=5), encode_experience(make(seq=5)))]) == (0, 1)
        assert store.insert_many([(make(seq=6), encode_experience(make(seq=6)))]) == (1, 0)
        assert store.signal_sets() == {"": 1, FP: 1}
