"""The node's own command line: ``--help`` answers, a stray argument is refused.

The node takes no arguments of its own; everything else goes after ``--ros-args``. Each
case here once started the node: ``--help`` ran it until killed, ``--bogus`` was ignored
and ``--ros-arg -p robot_id:=r1`` (one letter short) ran it as robot "robot".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PARAMS = REPO / "config" / "thinkmem.yaml"


def node_env(ros_env: dict[str, str]) -> dict[str, str]:
    """The test's ROS domain, and this working tree on the path (not the installed copy)."""
    return {**ros_env, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [ros_env.get("PYTHONPATH")])])}


def run_node(env: dict[str, str], *args: str, timeout: float = 30.0
             ) -> tuple[int | None, str, str]:
    """Exit status (None when it had to be killed), stdout and stderr of a node."""
    cmd = [sys.executable, "-m", "thinkmem_ros.robot.node", *args]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15.0)
        return None, out, err
    return proc.returncode, out, err


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# ------------------------------------------------------------------ --help

@pytest.mark.ros
@pytest.mark.parametrize("args", [["--help"], ["-h"],
                                  ["--ros-args", "-p", "robot_id:=r1", "--", "--help"]],
                         ids=["long", "short", "after-ros-args"])
def test_help_prints_the_usage_and_starts_nothing(args, ros_env):
    rc, out, err = run_node(node_env(ros_env), *args)
    assert rc == 0, (rc, out, err)
    assert out.startswith("usage: thinking_node [--ros-args -p name:=value | "
                          "--params-file FILE ...]"), out
    assert "config/thinkmem.yaml" in out and "README" in out, out
    assert err == "", err  # no rcl, no node: nothing logged


# ------------------------------------------------------------------ stray arguments

@pytest.mark.ros
@pytest.mark.parametrize("args, stray, hint", [
    (["--bogus"], "--bogus", "ROS arguments go after --ros-args"),
    (["--ros-arg", "-p", "robot_id:=r1"], "--ros-arg", "did you mean --ros-args?"),
    (["--ros-args", "-p", "robot_id:=r1", "--", "extra"], "extra",
     "ROS arguments go after --ros-args"),
    (["-p", "robot_id:=r1"], "-p", "ROS arguments go after --ros-args"),
], ids=["bogus", "ros-arg-typo", "after-the-section", "p-without-ros-args"])
def test_an_argument_outside_ros_args_is_refused_in_one_line(args, stray, hint, ros_env):
    rc, out, err = run_node(node_env(ros_env), *args)
    assert rc == 2, (rc, out, err)
    assert len(lines(err)) == 1, err
    assert err.startswith(f"thinking_node: error: unknown argument {stray!r} ({hint}"), err
    assert err.rstrip().endswith("; see thinking_node --help)"), err


# ------------------------------------------------------------------ what ROS passes

@pytest.mark.parametrize("argv, outside", [
    (["prog"], ["prog"]),
    (["prog", "--ros-args", "-r", "__node:=n", "--", "--help"], ["prog", "--help"]),
    (["prog", "--", "x"], ["prog", "--", "x"]),  # '--' ends a ROS section, nothing else
    (["prog", "a", "--ros-args", "-p", "x:=1", "--ros-args", "-r", "__ns:=/r", "--", "b"],
     ["prog", "a", "b"]),
])
def test_the_split_is_rcls(argv, outside):
    from rclpy.utilities import remove_ros_args

    from thinkmem_ros.robot.node_config import args_outside_ros

    assert args_outside_ros(argv) == outside
    assert remove_ros_args(argv) == outside


def read_until_ready(stream, seen: list[str]) -> None:
    """Collect the node's log lines into ``seen`` up to its "ready:" line (or its end)."""
    for line in stream:
        seen.append(line)
        if "ready:" in line:
            return


def wait_until_ready(proc: subprocess.Popen, timeout: float) -> str:
    """The node's log up to its "ready:" line, its exit or ``timeout``."""
    seen: list[str] = []
    reader = threading.Thread(target=read_until_ready, args=(proc.stderr, seen), daemon=True)
    reader.start()
    reader.join(timeout)
    return "".join(seen)


@pytest.mark.ros
def test_what_ros2_launch_passes_still_starts_the_node(ros_env, tmp_path):
    # launch_ros: its 'arguments', '--ros-args' + its 'ros_arguments', then '--ros-args'
    # with the name, the namespace, each params file or -p, and the remaps
    args = ["--ros-args", "--log-level", "info", "--ros-args", "-r", "__node:=thinking_node",
            "-r", "__ns:=/cli_args", "--params-file", str(PARAMS), "-p", "robot_id:=r1",
            "-p", f"spool_path:={tmp_path / 'spool.db'}", "-r", "sensors/load:=load"]
    proc = subprocess.Popen([sys.executable, "-m", "thinkmem_ros.robot.node", *args],
                            cwd=REPO, env=node_env(ros_env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        log = wait_until_ready(proc, timeout=30.0)
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=15.0)
    assert "ready:" in log and "[cli_args.thinking_node]" in log, log
    assert rc == 0, log
