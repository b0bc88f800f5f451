"""Hostile and documented input to ``thinkmem train``, ``calibrate`` and ``bag``.

Each refusal is one line and a non-zero exit before any work; each documented input (a
params file that declares a sensor ``absent: true``, a ROS 1 bag with another suffix) is
read as the node reads it. FIFO cases get a writer thread that unblocks a reader after a
few seconds, so a command that opens the FIFO fails its timing instead of hanging the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli_checks import assert_one_line, run, unprivileged

from thinkmem_ros.commands import train

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "test" / "data" / "real"
WHEELED = ROOT / "config" / "wheeled_robot.yaml"
SMALL = ["--duration", "30", "--streams", "2", "--window", "8", "--epochs", "1", "--patience",
         "1", "--test-duration", "0", "--no-progress", "--preset", "fast"]






# ------------------------------------------------------------------ absent signals

@pytest.fixture(scope="module")
def wheeled_bag(tmp_path_factory) -> Path:
    """60 s of odometry and IMU on the topics config/wheeled_robot.yaml reads (odom, imu/data):
    the robot stops and drives in turn every 5 s."""
    from thinkmem_ros.core.data import SignalStream
    from thinkmem_ros.playback.bag_files import TopicBinding, write_stream

    rate, frames = 10.0, 600
    t = np.arange(frames) / rate
    motion = np.where((t // 5) % 2 == 0, 0.0, 1.0)
    vibration = 9.80665 + 0.3 * np.random.default_rng(0).standard_normal(frames)
    stream = SignalStream(rate_hz=rate, values=np.stack([motion, vibration], 1).astype(np.float32),
                          labels=np.zeros((frames, 0), np.float32), label_names=(),
                          signal_names=("motion", "vibration"), scenario="wheeled")
    bindings = {"motion": TopicBinding("/odom", "nav_msgs/msg/Odometry", "twist.twist.linear.x"),
                "vibration": TopicBinding("/imu/data", "sensor_msgs/msg/Imu",
                                          "linear_acceleration.z")}
    out = tmp_path_factory.mktemp("wheeled") / "bag"
    write_stream(stream, out, bindings=bindings, events_topic="/events")
    return out


def test_calibrate_reads_the_shipped_wheeled_robot_params(wheeled_bag, tmp_path, capsys):
    """Its five ``{absent: true}`` entries have no field/topic/type, as docs/adapters.md
    documents and the node accepts; calibrate refused it ("signals.temperature.field is
    required")."""
    report = tmp_path / "report.json"
    code, err = run(capsys, "calibrate", wheeled_bag, "--params", WHEELED, "--json", report)
    assert code == 0, err
    rows = json.loads(report.read_text())["signals"]
    assert [n for n, row in rows.items() if row["absent"]] == [
        "temperature", "current", "distance", "visibility", "load"]
    assert rows["motion"]["samples"] == 600 and rows["motion"]["p99"] == pytest.approx(1.0)


def test_train_bag_reads_the_shipped_wheeled_robot_params(wheeled_bag, tmp_path, capsys):
    """The absent signals are inputs the bundle sees masked (NaN) in every frame."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("labels:\n  moving:\n    threshold: {signal: motion, above: 0.5}\n")
    code, err = run(capsys, "train", "--bag", wheeled_bag, "--labels", rules, "--params",
                    WHEELED, "--out", tmp_path / "b", "--window", "8", "--epochs", "1",
                    "--patience", "1", "--min-steps", "0", "--augment", "0", "--preset", "fast",
                    "--no-progress")
    assert code == 0, err
    manifest = json.loads((tmp_path / "b" / "bundle.json").read_text())
    assert manifest["signals"][:2] == ["motion", "vibration"] and "load" in manifest["signals"]


def test_a_map_where_every_signal_is_absent_is_refused_as_the_node_refuses_it(
        wheeled_bag, tmp_path, capsys):
    raw = yaml.safe_load(WHEELED.read_text())
    signals = raw["/**"]["ros__parameters"]["signals"]
    for name in signals:
        signals[name] = {"absent": True}
    params = tmp_path / "all_absent.yaml"
    params.write_text(yaml.safe_dump(raw))
    code, err = run(capsys, "calibrate", wheeled_bag, "--params", params)
    assert_one_line(code, err, "every signal", "declared absent")


# ------------------------------------------------------------------ FIFOs

@pytest.fixture
def fifo(tmp_path):
    """A FIFO, and a thread that unblocks any reader of it after 3 s (so nothing hangs)."""
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    done = threading.Event()

    def unblock() -> None:
        if done.wait(3.0):
            return
        while not done.is_set():
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader yet
                time.sleep(0.05)

    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    yield path
    done.set()
    thread.join(5)


def _fifo_cases(fifo: Path, bag: Path) -> dict[str, list]:
    rules, params = REAL / "husky_rules.yaml", REAL / "husky_params.yaml"
    return {
        "info": ["bag", "info", fifo],
        "convert": ["bag", "convert", fifo, fifo.parent / "cv"],
        "calibrate-bag": ["calibrate", fifo, "--params", params],
        "calibrate-params": ["calibrate", bag, "--params", fifo],
        "train-bag": ["train", "--bag", fifo, "--labels", rules, "--params", params],
        "train-labels": ["train", "--bag", bag, "--labels", fifo, "--params", params],
        "train-params": ["train", "--bag", bag, "--labels", rules, "--params", fifo],
    }


@pytest.mark.parametrize("case", ["info", "convert", "calibrate-bag", "calibrate-params",
                                  "train-bag", "train-labels", "train-params"])
def test_a_fifo_input_is_refused_before_it_is_opened(fifo, tmp_path, capsys, case):
    argv = _fifo_cases(fifo, REAL / "husky_outdoor.bag")[case]
    if argv[0] == "train":
        argv += ["--out", tmp_path / "b"]
    start = time.monotonic()
    code, err = run(capsys, *argv)
    assert time.monotonic() - start < 2.5, "it waited on the FIFO"
    assert_one_line(code, err, "is a FIFO")


def test_bag_play_of_a_fifo_is_refused_before_it_is_opened(fifo, capsys):
    """Blocked in open(), play ignored SIGINT and SIGTERM (only SIGKILL stopped it)."""
    pytest.importorskip("rclpy")
    start = time.monotonic()
    code, err = run(capsys, "bag", "play", fifo)
    assert time.monotonic() - start < 2.5, "it waited on the FIFO"
    assert_one_line(code, err, "is a FIFO")


# ------------------------------------------------------------------ Ctrl-C at start-up

def test_a_ctrl_c_while_the_verb_module_loads_is_a_clean_exit_130(tmp_path):
    """The verb's import ran outside main's guard (build_parser -> _load), ~0.25 s for
    ``train``: too short to hit by timing a real Ctrl-C, so a verb module that sends its
    own process SIGINT while it loads stands in for it."""
    (tmp_path / "slow_verb.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\n")
    code = ("import importlib, sys; from thinkmem_ros import cli; "
            "cli._load = lambda verb: importlib.import_module('slow_verb'); "
            "sys.exit(cli.main(['train', '--out', 'x']))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 130, out.stderr
    assert out.stderr.strip() == "interrupted"


# ------------------------------------------------------------------ train options

@pytest.mark.parametrize("argv, names", [
    (["--threads", "100000"], ["--threads must be in [1, "]),
    (["--model-version", str(2**63)], ["--model-version must be in [0, 9223372036854775807]"]),
    (["--group-seconds", "0.01"], ["--group-seconds", "one frame"]),
    (["--train-fraction", "7"], ["--train-fraction: only with --bag"]),
    (["--augment", "5"], ["--augment: only with --bag"]),
    (["--feedback-topic", "/x"], ["--feedback-topic: only with --bag"]),
    (["--min-steps", "3", "--labels", "r.yaml"], ["--labels, --min-steps: only with --bag"]),
    (["--seed", "-1"], ["argument --seed:", "integer >= 0"]),
], ids=["threads", "model-version", "group-seconds", "train-fraction", "augment",
        "feedback-topic", "two-bag-options", "seed"])
def test_train_refuses_options_it_cannot_use_before_training(tmp_path, capsys, argv, names):
    code, err = run(capsys, "train", *SMALL, *argv, "--out", tmp_path / "b")
    assert_one_line(code, err, *names)
    assert "training on" not in err and not (tmp_path / "b").exists()


def test_train_accepts_the_largest_model_version_the_wire_carries(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args([*SMALL, "--model-version", str(2**63 - 1), "--threads", "64",
                              "--out", str(tmp_path / "b")])
    train.refuse_bag_only_options(args)
    train.resolve_defaults(args)
    train.check_options(args)  # no SystemExit


def test_train_refuses_a_symlink_loop_as_out_before_training(tmp_path, capsys):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    code, err = run(capsys, "train", *SMALL, "--out", tmp_path / "loop1")
    assert_one_line(code, err, "--out", "symlink that leads nowhere")
    assert "training on" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop1", "loop2"]


def test_bag_write_names_seed(tmp_path, capsys):
    code, err = run(capsys, "bag", "write", "--scenario", "mixed", "--duration", "1", "--out",
                    tmp_path / "b", "--seed", "-1")
    assert_one_line(code, err, "argument --seed:")
    assert not (tmp_path / "b").exists()


# ------------------------------------------------------------------ calibrate params

def _params(tmp_path: Path, **changes) -> Path:
    raw = yaml.safe_load((REAL / "husky_params.yaml").read_text())
    section = raw["/**"]["ros__parameters"]
    for key, value in changes.items():
        if key == "offset":
            section["signals"]["speed"]["offset"] = value
        else:
            section[key] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_calibrate_refuses_a_bundle_path_that_is_not_text(tmp_path, capsys):
    """``bundle_path: 5`` fell back to the shipped bundle without a word."""
    code, err = run(capsys, "calibrate", REAL / "husky_outdoor.bag", "--params",
                    _params(tmp_path, bundle_path=5))
    assert_one_line(code, err, "bundle_path must be a string", "got 5")


def test_calibrate_names_an_offset_too_large_for_a_number(tmp_path, capsys):
    code, err = run(capsys, "calibrate", REAL / "husky_outdoor.bag", "--params",
                    _params(tmp_path, offset=10**400))
    assert_one_line(code, err, "signals.speed.offset", "too large")
    assert "OverflowError" not in err


# ------------------------------------------------------------------ what a bag is

@pytest.mark.parametrize("content", [b"", bytes(range(256)) * 8], ids=["empty", "random"])
def test_bag_info_of_a_file_that_is_no_bag_says_so(tmp_path, capsys, content):
    """It said "a ROS 1 .bag file? convert it", and convert then said it is not ROS 1."""
    path = tmp_path / "x.bag"
    path.write_bytes(content)
    code, err = run(capsys, "bag", "info", path)
    assert_one_line(code, err, "not a bag", "no ROS 1 bag")
    assert "convert" not in err


def test_bag_convert_blames_an_unwritable_output_not_the_input(tmp_path, capsys):
    code, err = run(capsys, "bag", "convert", REAL / "husky_outdoor.bag", "/proc/x")
    assert_one_line(code, err, "cannot write the output /proc/x")
    assert "husky_outdoor.bag" not in err


def test_calibrate_reads_a_ros1_bag_by_its_content_not_its_name(tmp_path, capsys):
    """bag info read ``husky.dat`` (a ROS 1 bag without the .bag name); calibrate refused it."""
    from test_calibrate import _bundle

    bag = tmp_path / "husky.dat"
    shutil.copyfile(REAL / "husky_outdoor.bag", bag)
    code, err = run(capsys, "calibrate", bag, "--params", REAL / "husky_params.yaml",
                    "--bundle", _bundle(tmp_path / "b"))
    assert code == 0, err


@pytest.fixture(scope="module")
def small_bag(tmp_path_factory) -> Path:
    from thinkmem_ros.playback.bag_files import write_stream
    from thinkmem_ros.world.streams import generate_stream

    out = tmp_path_factory.mktemp("small") / "bag"
    write_stream(generate_stream("mixed", 2.0, 10.0, np.random.default_rng(0)), out)
    return out


@pytest.mark.parametrize("mutate, says", [
    (lambda m: m["duration"].update(nanoseconds=float("nan")), "is damaged"),
    (lambda m: m["duration"].update(nanoseconds=-5), "is damaged"),
    # a start past 64 bits: refused as metadata rosbag2 cannot have written
    (lambda m: m["starting_time"].update(nanoseconds_since_epoch=10**30), "is damaged"),
    (lambda m: m.update(relative_file_paths=[]), "no storage file"),
    (lambda m: m.update(relative_file_paths=["gone.mcap"]), "missing"),
], ids=["duration-nan", "duration-negative", "start-late", "no-storage-file",
        "storage-file-gone"])
def test_bag_info_refuses_metadata_that_the_messages_contradict(small_bag, tmp_path, capsys,
                                                                mutate, says):
    """info printed "duration: nan s" or listed messages of a bag with no storage file,
    exit 0, where play or calibrate refused the same bag."""
    bag = tmp_path / "bag"
    shutil.copytree(small_bag, bag)
    meta = yaml.safe_load((bag / "metadata.yaml").read_text())
    mutate(meta["rosbag2_bagfile_information"])
    (bag / "metadata.yaml").write_text(yaml.safe_dump(meta))
    code, err = run(capsys, "bag", "info", bag)
    assert_one_line(code, err, "thinkmem bag info: error:", says)
    capsys.readouterr()
    assert run(capsys, "bag", "info", small_bag)[0] == 0


def test_train_bag_refuses_the_worlds_options_it_would_ignore(tmp_path, capsys):
    # --duration, --scenario and the rest shape the synthetic world; with --bag they were
    # accepted and silently ignored
    code, err = run(capsys, "train", "--bag", tmp_path / "nowhere", "--duration", "5",
                    "--scenario", "thermal", "--out", tmp_path / "b")
    assert_one_line(code, err, "--scenario, --duration: only for the synthetic world")




@pytest.mark.parametrize("argv, code", [
    (["calibrate", "BAG", "--params", "WHEELED"], 2),
    (["train", "--bag", "BAG", "--params", "WHEELED", "--labels", "RULES", "--out", "OUT"], 1),
    (["bag", "info", "BAG"], 1),
], ids=["calibrate", "train", "info"])
def test_an_unreadable_bag_folder_is_one_line_naming_it(small_bag, tmp_path, argv, code):
    """A PermissionError from listing the folder escaped calibrate (exit 1, not its
    documented 2) and train --bag through the catch-all as an unexpected error."""
    prefix = unprivileged()
    bag = tmp_path / "bag"
    shutil.copytree(small_bag, bag)
    rules = tmp_path / "rules.yaml"
    rules.write_text("labels:\n  moving:\n    threshold: {signal: motion, above: 0.5}\n")
    names = {"BAG": bag, "WHEELED": WHEELED, "RULES": rules, "OUT": tmp_path / "out"}
    bag.chmod(0)
    try:
        done = subprocess.run([*prefix, sys.executable, "-m", "thinkmem_ros.cli",
                               *[str(names.get(a, a)) for a in argv]], capture_output=True,
                              text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    finally:
        bag.chmod(0o755)
    assert done.returncode == code, done.stderr
    assert_one_line(done.returncode, done.stderr, f"cannot read bag folder {bag}",
                    "Permission denied")
    assert "PermissionError" not in done.stderr


@pytest.mark.parametrize("argv", [
    ["calibrate", "LOOP", "--params", "WHEELED"],
    ["train", "--bag", "LOOP", "--params", "WHEELED", "--labels", "RULES", "--out", "OUT"],
    ["bag", "info", "LOOP"],
    ["bag", "play", "LOOP"],
], ids=["calibrate", "train", "info", "play"])
def test_a_symlink_loop_as_the_bag_is_named_as_such_not_as_missing(tmp_path, capsys, argv):
    """A loop read as "bag not found", which sent the user looking for a typo."""
    loop = tmp_path / "loop1"
    loop.symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(loop)
    rules = tmp_path / "rules.yaml"
    rules.write_text("labels:\n  moving:\n    threshold: {signal: motion, above: 0.5}\n")
    names = {"LOOP": loop, "WHEELED": WHEELED, "RULES": rules, "OUT": tmp_path / "out"}
    code, err = run(capsys, *[names.get(a, a) for a in argv])
    assert_one_line(code, err, f"cannot read bag {loop}", "symbolic links")
    assert "not found" not in err
