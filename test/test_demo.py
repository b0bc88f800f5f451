"""The demo job: scoring helpers, step runner, the offline path and the ROS path end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from thinkmem_ros.core.metrics import micro_scores
from thinkmem_ros.demo import DemoConfig, DemoContext, Step, insert_before, run_demo, run_steps
from thinkmem_ros.demo.scoring import (
    build_timeline,
    label_matrix,
    match_frames,
    percentiles,
    score,
)

REPO = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ scoring (no ROS, no model)

def test_match_frames_picks_latest_ready_frame():
    ready = np.array([100, 200, 300])
    got = match_frames(np.array([50, 100, 199, 250, 10_000]), ready)
    assert got.tolist() == [-1, 0, 0, 1, 2]
    with pytest.raises(ValueError, match="non-decreasing"):
        match_frames(np.array([1]), np.array([3, 2]))


def test_label_matrix_ignores_labels_outside_ground_truth():
    rows = label_matrix([["b"], ["a", "consider:E9"], []], ("a", "b"))
    assert rows.tolist() == [[0, 1], [1, 0], [0, 0]]


def test_timeline_scores_only_full_windows_and_known_frames():
    truth = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=np.float32)
    frames = np.array([0, 1, 2, 2, 3, 7])  # frame 7 does not exist, 0 is before min_frame
    rows = np.array([[0, 0], [1, 0], [0, 0], [0, 1], [1, 1], [1, 1]], dtype=np.float32)
    tl = build_timeline(np.arange(4) / 10, np.zeros((4, 1)), truth, frames, rows, min_frame=1,
                        signal_names=("x",), label_names=("a", "b"))
    assert tl.evaluated.tolist() == [False, True, True, True]
    assert tl.predicted[2].tolist() == [0, 1]  # the later activation of frame 2 wins the plot
    result = score(tl)
    # scored rows: (1,0)/(1,0), (0,1)/(0,0), (0,1)/(0,1), (0,1)/(1,1): tp 3, fp 1, fn 1
    assert result["micro"] == pytest.approx({"precision": 0.75, "recall": 0.75, "f1": 0.75})
    assert result["activations_scored"] == 4 and result["frames_scored"] == 3
    assert result["per_label"]["a"]["support"] == 1


def test_missed_ticks_counts_only_skipped_periods():
    from thinkmem_ros.demo.ros import missed_ticks

    period = 100.0
    on_time = np.arange(10) * period
    assert missed_ticks(on_time, period) == 0
    assert missed_ticks(np.array([0, 160, 200, 300]), period) == 0  # late, then on schedule
    assert missed_ticks(np.array([0, 100, 400, 500]), period) == 2  # two periods without a tick
    assert missed_ticks(np.array([500, 0, 100]), period) == 3  # order of receipt does not matter
    assert missed_ticks(np.array([7]), period) == 0


def test_ticks_after_the_last_frame_are_not_late():
    from thinkmem_ros.demo.ros import late_and_after_end

    period = 100.0
    ready = np.array([0, 100, 200, 300])
    stamps = np.array([10, 350, 110, 320, 450, 550])
    frames = match_frames(stamps, ready)  # 0, 3, 1, 3, 3, 3
    late, after_end = late_and_after_end(frames, stamps - ready[frames], ready.size, period)
    assert late.tolist() == [False] * 6  # frame 1 at 350 would be late, but frame 3 is newer
    assert after_end.tolist() == [False, False, False, False, False, True]
    late, _ = late_and_after_end(np.array([0]), np.array([330]), ready.size, period)
    assert late.tolist() == [True]  # an old frame assessed long after a newer one was ready


def test_percentiles_and_empty():
    cell = percentiles(np.arange(1, 101), scale=2.0)
    assert cell["p50"] == pytest.approx(101.0) and cell["max"] == 200.0 and cell["count"] == 100
    assert percentiles([]) == {"count": 0}


# ------------------------------------------------------------------ step runner

def test_steps_insert_and_cleanup_on_failure(tmp_path):
    from rich.console import Console

    calls = []

    def ok(ctx):
        calls.append("ok")
        ctx.cleanups.append(lambda: calls.append("cleanup"))

    def boom(ctx):
        raise RuntimeError("step failed")

    steps = [Step("a", ok), Step("report", ok)]
    steps = insert_before(steps, "report", Step("extra", boom))
    assert [s.name for s in steps] == ["a", "extra", "report"]
    ctx = DemoContext(config=DemoConfig(out_dir=tmp_path, quiet=True),
                      console=Console(quiet=True))
    with pytest.raises(RuntimeError, match="step failed"):
        run_steps(steps, ctx)
    assert calls == ["ok", "cleanup"]
    with pytest.raises(ValueError, match="no step named 'nope'"):
        insert_before(steps, "nope", Step("x", ok))


@pytest.mark.parametrize("kwargs, key", [
    ({"duration_s": 0}, "duration_s"), ({"rate_hz": -1}, "rate_hz"),
    ({"frame_trigger": "sometimes"}, "frame_trigger"), ({"ros_domain_id": 999}, "ros_domain_id"),
    ({"missions": 0}, "missions"), ({"plain_missions": -1}, "plain_missions"),
    ({"round_timeout_s": 0}, "round_timeout_s"),
])
def test_config_names_bad_values(kwargs, key):
    with pytest.raises(ValueError, match=key):
        DemoConfig(**kwargs)


@pytest.mark.parametrize("folders, shown", [
    ((), "--out's summary.json, timeline.png, before_after.png and node.log are the demo's "
         "to replace"),
    (("bag",), "--out's bag/, summary.json, timeline.png, before_after.png and node.log are "
               "the demo's to replace"),
])
def test_the_check_out_line_names_what_it_checks(folders, shown):
    """The offline demo replaces no folder: its line read "--out's  are the demo's to"."""
    from thinkmem_ros.demo.offline import offline_steps
    from thinkmem_ros.demo.own_folders import check_out_step

    assert check_out_step(folders).description == shown
    assert offline_steps()[0].description == check_out_step(()).description


# ------------------------------------------------------------------ offline path

def test_offline_demo_writes_summary_and_png(source_bundle, tmp_path):
    from thinkmem_ros.demo.offline import _bundle_event_ids
    from thinkmem_ros.policy.runtime import PolicyRuntime
    from thinkmem_ros.world.streams import generate_stream, stream_windows

    config = DemoConfig(out_dir=tmp_path / "out", duration_s=8.0, seed=3, bundle=source_bundle,
                        offline=True, quiet=True)
    summary = run_demo(config)
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk["activation"] == summary["activation"]
    assert (tmp_path / "out" / "timeline.png").read_bytes()[:8] == PNG_MAGIC
    runtime = PolicyRuntime(source_bundle)
    window = runtime.window
    assert summary["frames"] == 80 and summary["mode"] == "offline"
    assert summary["activation"]["activations_scored"] == 80 - (window - 1)
    assert summary["latency"]["inference_us"]["count"] == 80 - (window - 1)
    assert list(summary["steps"]) == ["check out", "load bundle", "generate stream",
                                      "run policy", "score", "plot", "report"]
    # the demo's scoring agrees with a batch prediction over the same frames
    stream = generate_stream("mixed", 8.0, runtime.manifest.frame_rate_hz,
                             np.random.default_rng(3))
    windows = stream_windows(stream, window, max_events=runtime.max_events)
    events = _bundle_event_ids(windows, runtime)
    predicted = runtime.predict(windows.signals, windows.mask, events).active
    expected = micro_scores(windows.labels, label_matrix(predicted, stream.label_names))
    assert summary["activation"]["micro"] == pytest.approx(expected)


def test_offline_demo_rejects_unknown_scenario(source_bundle, tmp_path):
    config = DemoConfig(out_dir=tmp_path, scenario="nosuch", bundle=source_bundle,
                        offline=True, quiet=True)
    with pytest.raises(ValueError, match="unknown scenario 'nosuch'"):
        run_demo(config)


# ------------------------------------------------------------------ ROS path (real node, DDS)

def _is_shipped(bundle: Path) -> bool:
    return Path(bundle).resolve() == (REPO / "models" / "default").resolve()


@pytest.fixture(scope="module")
def ros_demo(ros_env, source_bundle, tmp_path_factory):
    """One end-to-end run: bag -> thinking_node subprocess -> activations -> summary."""
    duration = 40.0 if _is_shipped(source_bundle) else 8.0
    config = DemoConfig(out_dir=tmp_path_factory.mktemp("demo") / "out", duration_s=duration,
                        seed=11, bundle=source_bundle, quiet=True, settle_s=1.0,
                        consolidation=False)  # the round has its own test (test_demo_round)
    return config, run_demo(config)


@pytest.mark.ros
def test_ros_demo_runs_end_to_end(ros_demo):
    config, summary = ros_demo
    frames = summary["frames"]
    assert summary["mode"] == "ros"
    assert summary["node"]["exit_code"] == 0  # SIGINT is a clean shutdown
    assert summary["playback"]["ground_truth_received"] == frames
    matched = summary["matching"]["matched"]
    # about one activation per frame once the window is full (timer at the bundle's rate)
    window = summary["bundle"]["window"]
    assert 0.8 * (frames - window) <= matched <= 1.2 * frames
    lat = summary["latency"]
    assert lat["inference_us"]["count"] >= matched
    assert 0 < lat["end_to_end_ms"]["p50"] < 1000
    counts = summary["diagnostics"]["counts"]
    assert counts["frames"] >= matched and counts["inference_errors"] == 0
    assert (config.out_dir / "timeline.png").read_bytes()[:8] == PNG_MAGIC
    assert json.loads((config.out_dir / "summary.json").read_text())["matching"]["matched"] \
        == matched


@pytest.mark.ros
def test_ros_path_scores_like_the_offline_path(ros_demo, tmp_path):
    """Transport, framing in the node and stamp matching lose (almost) nothing vs offline.

    Ticks the node's timer missed because the machine starved it are measured from the
    activation stamps and reported apart; they are allowed, but only a few per cent.
    """
    from dataclasses import replace

    config, summary = ros_demo
    offline = run_demo(replace(config, offline=True, out_dir=tmp_path))
    scored = offline["activation"]["activations_scored"]
    matching = summary["matching"]
    load_loss = matching["missed_ticks"] + matching["late"]
    assert load_loss <= 0.03 * scored, matching
    assert abs(summary["activation"]["activations_scored"] - scored) <= 3 + load_loss, matching
    assert summary["activation"]["micro"]["f1"] == pytest.approx(
        offline["activation"]["micro"]["f1"], abs=0.03)


@pytest.mark.ros
def test_ros_playback_f1_against_ground_truth(ros_demo, source_bundle):
    """Issue 3 §7: a known scenario through the real node reaches micro-F1 >= 0.95."""
    if not _is_shipped(source_bundle):
        pytest.skip("needs the trained default bundle in models/default (not shipped yet)")
    _, summary = ros_demo
    assert summary["activation"]["micro"]["f1"] >= 0.95, summary["activation"]["micro"]
