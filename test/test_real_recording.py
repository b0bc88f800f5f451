"""A real public recording end to end, as docs/your_robot.md walks through it.

adapters (the parameter file) -> calibrate -> train with a rules file (``thinkmem train
--bag``) -> play (the node's situation buffer and ONNX runtime) -> labels, on
``test/data/real/husky_outdoor.bag`` (a Husky's outdoor drive, not written by this
project; see LICENSE.md there). Training is cut short (a few hundred steps) to keep the
test quick; ``thinkmem bench real`` measures the full-length figures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from thinkmem_ros.commands import calibrate
from thinkmem_ros.core.label_rules import load_rules
from thinkmem_ros.playback.bag_files import convert_ros1
from thinkmem_ros.playback.recording import (
    load_signal_map,
    read_recording,
    score_recording,
    split_stream,
)
from thinkmem_ros.policy.bundle import load_bundle, signal_set_fingerprint

REAL = Path(__file__).parent / "data" / "real"
BAG, PARAMS, RULES = (REAL / "husky_outdoor.bag", REAL / "husky_params.yaml",
                      REAL / "husky_rules.yaml")


def test_recording_is_small_and_licensed():
    assert BAG.stat().st_size < 5 * 1024 * 1024
    licence = (REAL / "LICENSE.md").read_text()
    assert "cra-ros-pkg/robot_localization" in licence and "BSD" in licence


def test_rules_label_5_to_50_percent_of_both_splits():
    signal_map = load_signal_map(PARAMS)
    stream = read_recording(BAG, signal_map, rules=load_rules(RULES, signal_map.names))
    head, tail = split_stream(stream, 0.7)
    for part in (head, tail):
        share = part.labels.mean(axis=0)
        assert ((share >= 0.05) & (share <= 0.5)).all(), dict(zip(part.label_names, share))


def test_ros1_bag_and_its_rosbag2_conversion_give_the_same_frames(tmp_path):
    signal_map = load_signal_map(PARAMS)
    direct = read_recording(BAG, signal_map)
    convert_ros1(BAG, tmp_path / "husky")
    converted = read_recording(tmp_path / "husky", signal_map)
    np.testing.assert_array_equal(direct.values, converted.values)


def test_training_on_the_whole_recording_exits_cleanly(tmp_path, capsys):
    """The default ``--train-fraction 1`` holds nothing out: no held-out score, exit 0."""
    pytest.importorskip("torch")
    from thinkmem_ros import cli

    out = tmp_path / "whole"
    code = cli.main(["train", "--bag", str(BAG), "--params", str(PARAMS), "--labels",
                     str(RULES), "--window", "32", "--augment", "0", "--epochs", "1",
                     "--min-steps", "0", "--batch-size", "64", "--out", str(out),
                     "--no-progress"])
    assert code == 0
    assert "held-out" not in capsys.readouterr().err
    assert load_bundle(out).manifest.frame_rate_hz == 10.0


def test_adapters_calibrate_train_play_labels(tmp_path, capsys, ros_env):
    pytest.importorskip("torch")
    from thinkmem_ros import cli

    # adapters: the tutorial's parameter file loads without a configuration error
    signal_map = load_signal_map(PARAMS)
    assert signal_map.names == ("speed", "yaw_rate", "vibration", "gyro")
    # train on the first 70 % with labels from the rules (a short run: one relabelled copy
    # instead of the default 8 keeps the path and a tenth of the cost)
    out = tmp_path / "husky_bundle"
    code = cli.main(["train", "--bag", str(BAG), "--params", str(PARAMS), "--labels",
                     str(RULES), "--train-fraction", "0.7", "--window", "32", "--augment", "1",
                     "--epochs", "1", "--min-steps", "150", "--batch-size", "64",
                     "--out", str(out), "--no-progress"])
    assert code == 0
    err = capsys.readouterr().err
    assert "held-out last 30% of" in err
    bundle = load_bundle(out)
    m = bundle.manifest
    assert m.signals == list(signal_map.names) and m.frame_rate_hz == 10.0
    assert m.labels == ["turning", "rough_ground", "slowing_down", "speeding_up", "rough_turn"]
    assert m.signal_units == {"speed": "m/s", "yaw_rate": "rad/s", "vibration": "m/s^2",
                              "gyro": "rad/s"}
    assert m.signal_set == signal_set_fingerprint(m)
    assert set(m.signal_ranges) == set(m.signals)
    # the node takes the same parameter file with this bundle: no configuration error
    import yaml

    from thinkmem_ros.robot import node_config

    assert node_config.unknown_parameters(node_config.read_params_file(PARAMS),
                                          m.signals) == []
    entries = yaml.safe_load(PARAMS.read_text())["/**"]["ros__parameters"]["signals"]
    sources = {name: node_config.source_from_entry(name, entry)
               for name, entry in entries.items()}
    assert {n: s.adapter.unit for n, s in sources.items()} == m.signal_units
    # ... and starts on it with real rclpy: speed and yaw rate share the odometry topic,
    # vibration and gyro the IMU's, one subscription each (it refused to start before)
    subscribed = _node_topics(PARAMS, out)
    assert sorted(subscribed) == ["/husky_velocity_controller/odom", "/imu/data",
                                  "/sensors/events"], subscribed
    # calibrate the recording against the bundle trained for it: nothing to warn about
    args = argparse.Namespace(bag=str(BAG), params=str(PARAMS), bundle=str(out), json=None)
    assert calibrate.main(args) == 0
    assert "0 warning(s)" in capsys.readouterr().out
    # play the held-out 30 % the node's way and compare its labels with the rules
    stream = read_recording(BAG, signal_map, rules=load_rules(RULES, signal_map.names))
    _, tail = split_stream(stream, 0.7)
    arrays: list = []
    scores = score_recording(bundle, tail, predicted_out=arrays)
    predicted, truth = arrays
    assert scores["frames"] == tail.values.shape[0] - 31
    # even a short run beats labelling every frame with every label (the trivial F1)
    prevalence = truth.mean()
    assert scores["f1"] > 2 * prevalence / (1 + prevalence) + 0.05, scores
    assert predicted.any(axis=0).all()  # every label fires somewhere in the tail


def _node_topics(params: Path, bundle: Path) -> list[str]:
    """Topics the thinking node subscribes to, started as the robot starts it."""
    import rclpy

    from thinkmem_ros.robot.node import ThinkingNode

    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = ThinkingNode(context=context, cli_args=[
            "--ros-args", "--params-file", str(params), "-p", f"bundle_path:={bundle}"])
        try:
            return [sub.topic_name for sub in node._subs]
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown(context=context)
