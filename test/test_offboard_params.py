"""``thinkmem calibrate`` and ``thinkmem train --bag`` read a params file as the node does.

The same file drives the node on the robot and the offboard tools; a file the node refuses
(an unknown name, an alias, an integer where it declares a double, a key given twice, a
value outside the range it declares) must be refused offboard too, naming the file and the
key, and only the sections the thinking node reads may count.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_checks import assert_one_line, run

from thinkmem_ros.playback.recording import load_signal_map

REAL = Path(__file__).parent / "data" / "real"
BAG = REAL / "husky_outdoor.bag"
RULES = REAL / "husky_rules.yaml"
HUSKY = (REAL / "husky_params.yaml").read_text()
SPEED = ('{topic: "/husky_velocity_controller/odom", type: "nav_msgs/msg/Odometry", '
         'field: "twist.twist.linear.x", unit: "m/s"}')


def params(tmp_path: Path, text: str, name: str = "params.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def calibrate(capsys, path: Path, *extra) -> tuple[int, str]:
    return run(capsys, "calibrate", BAG, "--params", path, *extra)


def train(capsys, tmp_path: Path, path: Path, *extra) -> tuple[int, str]:
    return run(capsys, "train", "--bag", BAG, "--params", path, "--labels", RULES,
               "--window", "8", "--augment", "0", "--epochs", "1", "--min-steps", "0",
               "--batch-size", "64", "--patience", "1", "--preset", "fast", "--no-progress",
               "--out", tmp_path / "bundle", *extra)


REFUSED = {
    "typo": (HUSKY.replace("frame_rate_hz: 10.0", "frame_rate_hx: 5.0"),
             ["unknown parameter 'frame_rate_hx'", "did you mean 'frame_rate_hz'"]),
    "bundle_typo": (HUSKY.replace("    stale_after_s: 0.5\n",
                                  "    stale_after_s: 0.5\n    bundle_pth: /nonexistent\n"),
                    ["'bundle_pth'", "did you mean 'bundle_path'"]),
    "alias": (HUSKY.replace("speed: {topic", "speed: &odom {topic").replace(
        'yaw_rate: {topic: "/husky_velocity_controller/odom", type: "nav_msgs/msg/Odometry",'
        '\n                 field: "twist.twist.angular.z", unit: "rad/s"}',
        'yaw_rate: {<<: *odom, field: "twist.twist.angular.z", unit: "rad/s"}'),
              ["aliases (*odom)"]),
    "integer_rate": (HUSKY.replace("frame_rate_hz: 10.0", "frame_rate_hz: 10"),
                     ["frame_rate_hz", "integer", "double"]),
    "string_depth": (HUSKY.replace("    stale_after_s: 0.5\n",
                                   "    stale_after_s: 0.5\n    qos_depth: '10'\n"),
                     ["qos_depth", "string", "integer"]),
    "other_node": (HUSKY.replace("/**:", "some_other_node:"),
                   ["/thinking_node", "some_other_node"]),
    "duplicate": (HUSKY + "    frame_rate_hz: 5.0\n", ["'frame_rate_hz'", "twice"]),
    "out_of_range": (HUSKY.replace("stale_after_s: 0.5", "stale_after_s: 7200.0"),
                     ["stale_after_s", "[0.001, 3600]", "7200.0"]),
    "two_robots": (HUSKY.replace("/**:", "/robot1/thinking_node:")
                   + "/robot2/thinking_node:\n  ros__parameters:\n    frame_rate_hz: 5.0\n",
                   ["/robot1/thinking_node", "/robot2/thinking_node"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_params_file_the_node_refuses_is_refused_offboard(tmp_path, capsys, case):
    text, names = REFUSED[case]
    path = params(tmp_path, text)
    with pytest.raises(ValueError) as refused:
        load_signal_map(path)
    for name in [str(path), *names]:
        assert name in str(refused.value), refused.value
    code, err = calibrate(capsys, path)
    assert code == 2, err
    assert_one_line(code, err, "thinkmem calibrate: error:", str(path), *names)
    code, err = train(capsys, tmp_path, path)
    assert_one_line(code, err, str(path), *names)
    assert not (tmp_path / "bundle").exists()


def test_another_nodes_bundle_path_is_not_the_one_calibrated_against(tmp_path, capsys):
    other = params(tmp_path, HUSKY + "other_node:\n  ros__parameters:\n"
                   "    bundle_path: /nonexistent/bundle\n")
    code, err = calibrate(capsys, other)
    assert code == 0, err  # the node reads the shipped bundle: so does calibrate
    mine = params(tmp_path, HUSKY + "thinking_node:\n  ros__parameters:\n"
                  "    bundle_path: /nonexistent/bundle\n", "mine.yaml")
    code, err = calibrate(capsys, mine)
    assert_one_line(code, err, "/nonexistent/bundle")


def test_sections_merge_name_by_name_as_rcl_merges_them(tmp_path):
    path = params(tmp_path, HUSKY + "thinking_node:\n  ros__parameters:\n"
                  "    signals:\n      speed: {scale: 2.0}\n"
                  "    signals.gyro.scale: 3.0\n"
                  "some_other_node:\n  ros__parameters:\n    frame_rate_hz: 5.0\n")
    signal_map = load_signal_map(path)
    assert signal_map.names == ("speed", "yaw_rate", "vibration", "gyro")
    assert signal_map.bindings["speed"].topic == "/husky_velocity_controller/odom"
    assert signal_map.bindings["speed"].adapter.scale == 2.0
    assert signal_map.bindings["gyro"].adapter.scale == 3.0
    assert (signal_map.frame_rate_hz, signal_map.stale_after_s) == (10.0, 0.5)


def test_a_namespaced_thinking_node_is_read_with_the_wildcard_sections(tmp_path):
    path = params(tmp_path, "/**:\n  ros__parameters:\n    stale_after_s: 0.25\n"
                  f"robot1:\n  thinking_node:\n    ros__parameters:\n"
                  f"      frame_rate_hz: 20.0\n      signals:\n        speed: {SPEED}\n")
    signal_map = load_signal_map(path)
    assert signal_map.names == ("speed",)
    assert (signal_map.frame_rate_hz, signal_map.stale_after_s) == (20.0, 0.25)
    typo = params(tmp_path, path.read_text().replace("frame_rate_hz", "frame_rate_hx"),
                  "typo.yaml")
    with pytest.raises(ValueError, match="unknown parameter 'frame_rate_hx'"):
        load_signal_map(typo)


def test_the_tutorial_params_file_still_reads():
    signal_map = load_signal_map(REAL / "husky_params.yaml")
    assert signal_map.names == ("speed", "yaw_rate", "vibration", "gyro")
    assert (signal_map.frame_rate_hz, signal_map.stale_after_s) == (10.0, 0.5)


def test_an_explicit_rate_that_differs_from_the_files_is_refused_not_dropped(tmp_path, capsys):
    path = params(tmp_path, HUSKY)  # frame_rate_hz: 10.0, the rate the node runs at
    code, err = train(capsys, tmp_path, path, "--rate", "20")
    assert_one_line(code, err, "--rate 20", "frame_rate_hz 10", str(path))
    assert not (tmp_path / "bundle").exists()


def test_rate_trains_a_file_that_leaves_the_rate_to_the_bundle(tmp_path, capsys):
    from thinkmem_ros.policy.bundle import load_bundle

    path = params(tmp_path, HUSKY.replace("    frame_rate_hz: 10.0", "    frame_rate_hz: 0.0"))
    code, err = train(capsys, tmp_path, path, "--rate", "5")
    assert code == 0, err
    assert load_bundle(tmp_path / "bundle").manifest.frame_rate_hz == 5.0
    # the same rate given twice is no conflict
    code, err = train(capsys, tmp_path, params(tmp_path, HUSKY, "ten.yaml"), "--rate", "10")
    assert code == 0, err
    assert load_bundle(tmp_path / "bundle").manifest.frame_rate_hz == 10.0


def test_calibrate_refuses_an_empty_json_path(tmp_path, capsys):
    code, err = calibrate(capsys, REAL / "husky_params.yaml", "--json", "")
    assert_one_line(code, err, "thinkmem calibrate: error:", "--json")
    assert "warning(s)" not in capsys.readouterr().out
