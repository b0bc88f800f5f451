"""Plain-Python parts of the node: diagnostics levels, activation format, hot-swap."""

import json
import time

import numpy as np
import pytest
from conftest import copy_bundle, wait_for

from thinkmem_ros.core.vocabulary import SIGNALS
from thinkmem_ros.policy.bundle import BundleError
from thinkmem_ros.robot.activation import (
    FrameResult,
    activation_json,
    active_labels,
    probabilities_layout,
)
from thinkmem_ros.robot.diagnostics import (
    COUNTERS,
    ERROR,
    OK,
    WARN,
    ClockWatch,
    HealthSnapshot,
    build_status,
)
from thinkmem_ros.robot.hotswap import HotSwapper, PolicySlot, load_policy

TOTALS = {key: 0 for key in COUNTERS}


def snapshot(**kw):
    base = dict(robot_id="r1", expected_rate_hz=10.0, elapsed_s=1.0, uptime_s=10.0,
                totals=dict(TOTALS, frames=110), previous=dict(TOTALS, frames=100),
                inference_us=np.full(10, 300.0), latency_us=np.full(10, 400.0),
                signals=("a", "b"), stale=(), bundle_version=3, bundle_sha256="ab" * 32)
    base.update(kw)
    return HealthSnapshot(**base)


def values(report):
    return dict(report.values)


def test_healthy_node_is_ok_with_numbers():
    report = build_status(snapshot())
    assert report.level == OK and report.message == "running"
    v = values(report)
    assert float(v["frame_rate_hz"]) == pytest.approx(10.0)
    assert float(v["inference_p99_us"]) == pytest.approx(300.0)
    assert v["bundle_version"] == "3" and v["bundle_sha256"] == "ab" * 32


@pytest.mark.parametrize("kw, level, text", [
    ({"stale": ("b",)}, WARN, "stale: b"),
    ({"stale": ("a", "b")}, ERROR, "every signal is stale"),
    ({"totals": dict(TOTALS, frames=110, invalid=3)}, WARN, "3 NaN/inf"),
    ({"totals": dict(TOTALS, frames=110, out_of_order=1)}, WARN, "out-of-order"),
    ({"totals": dict(TOTALS, frames=110, duplicate=2)}, WARN, "duplicate"),
    ({"totals": dict(TOTALS, frames=110, stamp_restarts=1)}, WARN,
     "1 signal stamp restarts taken as a new timeline"),
    ({"totals": dict(TOTALS, frames=108)}, WARN, "frame rate 8.0"),
    ({"totals": dict(TOTALS, frames=102)}, ERROR, "frame rate 2.0"),
    ({"totals": dict(TOTALS, frames=110, inference_errors=1)}, ERROR, "inference errors"),
    ({"type_mismatch": {"/s/a": ["std_msgs/msg/String"]}}, WARN, "wrong type on /s/a"),
    ({"bundle_error": "sha256 mismatch"}, WARN, "bundle rejected"),
    ({"inference_us": np.full(10, 80_000.0)}, WARN, "inference p99"),
])
def test_levels(kw, level, text):
    report = build_status(snapshot(**kw))
    assert report.level == level, report.message
    assert text in report.message


def test_a_sim_clock_that_stands_still_is_reported():
    watch = ClockWatch()
    assert watch.still_for(0.0, steady_now=100.0) == 0.0  # no /clock yet: counted from here
    assert watch.still_for(0.0, steady_now=103.0) == 3.0
    assert watch.still_for(5.0, steady_now=104.0) == 0.0  # it moved
    assert watch.still_for(5.0, steady_now=104.5) == 0.5
    report = build_status(snapshot(ros_time_still_s=3.0), clock_still_warn_s=2.0)
    assert report.level == WARN and "ROS time not advancing for 3 s" in report.message
    assert values(report)["ros_time_still_s"] == "3.0"
    assert build_status(snapshot(ros_time_still_s=1.0), clock_still_warn_s=2.0).level == OK


def test_old_problems_do_not_keep_the_node_in_warn():
    old = dict(TOTALS, frames=100, invalid=5)
    report = build_status(snapshot(previous=old, totals=dict(old, frames=110)))
    assert report.level == OK
    assert values(report)["invalid"] == "5"  # cumulative count still reported


def test_rate_is_not_judged_during_warmup():
    report = build_status(snapshot(uptime_s=0.5, totals=dict(TOTALS, frames=100)))
    assert report.level == OK


def make_result(probs, labels=("trend", "hazard", "cause")):
    probs = np.asarray(probs, np.float32)
    return FrameResult(
        seq=7, stamp=12.5, signals=np.zeros((2, 3)), mask=np.ones((2, 3)), events=np.zeros(2),
        labels=labels, probabilities=probs,
        active=active_labels(labels, probs, np.array([0.5, 0.3, 0.9], np.float32)),
        embedding=np.zeros(4), inference_us=123.4, latency_us=456.7, bundle_version=2,
        bundle_sha256="x", stale=("load",), inputs_stamp=11.0)


def test_activation_json_carries_what_consumers_need():
    record = json.loads(activation_json(make_result([0.6, 0.2, 0.95]), "r1"))
    assert record["active"] == [{"label": "trend", "probability": 0.6},
                                {"label": "cause", "probability": 0.95}]
    assert set(record["probabilities"]) == {"trend", "hazard", "cause"}
    assert record["bundle_version"] == 2 and record["stamp"] == 12.5 and record["seq"] == 7
    assert record["inference_us"] == 123.4 and record["stale"] == ["load"]


def test_probabilities_layout_labels_every_element():
    layout = probabilities_layout(("a", "b", "c"))
    assert [d[0] for d in layout] == ["a", "b", "c"]
    assert all(size == 1 for _, size, _ in layout)


# -- hot-swap ----------------------------------------------------------------------------------
def test_load_policy_verifies_and_probes(source_bundle):
    policy = load_policy(source_bundle, signals=SIGNALS, thresholds={"hazard": 0.2})
    assert policy.signals == SIGNALS
    assert policy.thresholds[policy.labels.index("hazard")] == pytest.approx(0.2)
    with pytest.raises(BundleError, match="no topic"):
        load_policy(source_bundle, signals=SIGNALS[:3])
    with pytest.raises(BundleError, match="unknown labels"):
        load_policy(source_bundle, thresholds={"nonsense": 0.2})


def test_tampered_bundle_is_refused(bundle_copy):
    onnx = bundle_copy / "policy.onnx"
    data = bytearray(onnx.read_bytes())
    data[-10] ^= 0xFF
    onnx.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="sha256"):
        load_policy(bundle_copy)


def test_slot_swaps_only_between_frames(source_bundle):
    first = load_policy(source_bundle)
    slot = PolicySlot(first)
    assert slot.current() == (first, False)
    second = load_policy(source_bundle)
    slot.offer(second)
    assert slot.peek() is second
    assert slot.current() == (second, True)
    assert slot.current() == (second, False) and slot.swaps == 1



def test_watcher_swaps_replaced_files_and_keeps_old_on_tamper(source_bundle, tmp_path):
    live = copy_bundle(source_bundle, tmp_path / "live")
    slot = PolicySlot(load_policy(live))
    results = []
    swapper = HotSwapper(slot, load_policy, watch=True, period_s=0.05,
                         on_result=lambda p, e: results.append((p, e)))
    swapper.start()
    try:
        onnx = live / "policy.onnx"
        onnx.write_bytes(onnx.read_bytes() + b"\0")  # tamper: hash no longer matches
        assert wait_for(lambda: results and results[-1][1])
        assert "sha256" in swapper.error
        assert slot.peek().version == 1 and slot.swaps == 0
        copy_bundle(source_bundle, tmp_path / "v2", model_version=2)
        for name in ("policy.onnx", "bundle.json"):  # a push: files replaced by rename
            (tmp_path / "v2" / name).replace(live / name)
        assert wait_for(lambda: slot.peek().version == 2)
        assert swapper.error == ""
        swapper.request(tmp_path / "missing")
        assert wait_for(lambda: "not found" in swapper.error)
        assert slot.current()[0].version == 2
    finally:
        swapper.stop()
    assert not swapper.is_alive()


def test_activation_splits_latency_into_wait_and_compute():
    result = make_result([0.6, 0.2, 0.95])
    record = json.loads(activation_json(result, "r1"))
    assert record["wait_us"] is None and record["compute_us"] is None  # unknown: null
    result.wait_us, result.compute_us = 80000.04, 312.26
    record = json.loads(activation_json(result, "r1"))
    assert record["wait_us"] == 80000.0 and record["compute_us"] == 312.3
    assert record["latency_us"] == 456.7  # kept for readers of the old field


def test_diagnostics_report_wait_and_compute_percentiles():
    v = values(build_status(snapshot(wait_us=np.arange(1.0, 101.0),
                                     compute_us=np.full(100, 250.0))))
    assert float(v["wait_p50_us"]) == pytest.approx(50.5)
    assert float(v["wait_p99_us"]) == pytest.approx(99.01, abs=0.05)  # one decimal
    assert float(v["compute_p50_us"]) == 250.0 and float(v["compute_p99_us"]) == 250.0
    assert v["wait_p50_us"] != v["compute_p50_us"]
    empty = values(build_status(snapshot()))  # a node that has not published yet
    assert empty["wait_p50_us"] == "nan" and empty["compute_p99_us"] == "nan"


def test_frames_carry_their_assembly_time_after_the_newest_sample():

    from thinkmem_ros.policy.situation import BufferConfig, SituationBuffer

    buffer = SituationBuffer(BufferConfig(signals=("a", "b"), window=3, stale_after_s=1.0))
    first = time.perf_counter()
    buffer.offer(0, 1.0, now=0.0, arrival=first)
    newest = time.perf_counter()
    buffer.offer(1, 2.0, now=0.0, arrival=newest)
    frame = buffer.assemble(0.05)
    assert frame.last_arrival == newest
    assert frame.assembled_at is not None and frame.assembled_at >= newest
    assert frame.assembled_at - frame.last_arrival < 1.0  # the wait part of the latency
