"""``thinkmem bench node`` pieces without DDS: per-rate bundles and the per-case summary."""

import pytest

from thinkmem_ros.bench import node as bench_node
from thinkmem_ros.core.paths import default_bundle
from thinkmem_ros.policy.bundle import read_manifest
from thinkmem_ros.policy.runtime import PolicyRuntime


def test_each_rate_gets_a_bundle_made_for_it(tmp_path, monkeypatch):
    base = default_bundle()
    rate = read_manifest(base).frame_rate_hz
    assert bench_node.bundle_for_rate(rate, tmp_path, base) == (base, "default")
    monkeypatch.setattr(bench_node, "TRAIN_STEPS", 2)
    monkeypatch.setattr(bench_node, "TRAIN_SECONDS", 8.0)
    path, how = bench_node.bundle_for_rate(100.0, tmp_path, base)
    manifest = read_manifest(path)
    assert manifest.frame_rate_hz == 100.0 and "100 Hz" in how
    assert manifest.window == read_manifest(base).window
    assert manifest.signals == read_manifest(base).signals
    PolicyRuntime(path)  # loads and verifies
    assert bench_node.bundle_for_rate(100.0, tmp_path, base) == (path, how)  # reused


def test_summary_keeps_the_measured_span_and_counts_lost_samples():
    case = bench_node.Case(100.0, 1000.0, "timer")
    base = 1_700_000_000.0
    # frames stamped with sample k at 1 kHz: k < 5 is warm-up, k >= 20 never happened
    frames = [[base + k / 1000.0, 900.0 + k, 100.0, 800.0 + k] for k in range(0, 25)]
    frames.append([None, None, None, None])  # a frame without input
    stats = {"frames": frames, "inference_us": [50.0] * 25}
    sent = {"sent_at": {k: 0.0 for k in range(20)}, "warm": 5, "total": 20,
            "cpu_percent": 7.5, "stamp_base": base, "samples_published": 140,
            "samples_handled": 133, "sensor_rate_achieved_hz": 1000.0,
            "diagnostics": {"shipping": {"acked": "3"}}}
    out = bench_node._summarise(case, sent, {}, stats, rc=0)
    assert out["node_frames"] == 15  # k = 5 .. 19
    assert out["p50_ms"] == pytest.approx((900 + 12) * 1e-3)
    assert out["wait_p50_ms"] == pytest.approx(0.1)
    assert out["compute_p50_ms"] == pytest.approx((800 + 12) * 1e-3)
    assert out["lost"] == 7 and out["shipping"] == {"acked": "3"}
    assert out["executor"] == "events" and "hz100_single" in bench_node.CASES
    assert out["shipping_on"] and not bench_node.CASES["hz100_noship"].shipping
    assert "activations_lost" not in out  # timer frames are not one published sample set


@pytest.mark.ros
def test_the_middleware_floor_answers_every_sample_set_and_measures_its_cpu(ros_env):
    """The bare rclpy node gets the node's traffic and returns one stamped activation per
    sample set, so its CPU and external latency sit beside the thinking node's."""
    case = bench_node.Case(20.0, 20.0, "samples")
    signals = read_manifest(default_bundle()).signals
    floor = bench_node.measure_floor(case, 2.0, tuple(signals), seed=0)
    assert floor["frames"] == 40 and floor["activations_lost"] <= 2
    assert floor["cpu_percent"] > 0 and floor["executor"] == "events"
    assert 0 < floor["external_p50_ms"] <= floor["external_p99_ms"]
