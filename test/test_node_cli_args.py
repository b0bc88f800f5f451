"""The node's command line: ``--help`` answers, a stray argument or empty params file is refused.

The node takes no arguments of its own; everything else goes after ``--ros-args``. Each
refused case here once started the node: ``--help`` ran it until killed, ``--bogus`` was
ignored, ``--ros-arg -p robot_id:=r1`` (one letter short) ran it as robot "robot", and a
params file with nothing for this node (empty, comments only, another node's or
namespace's sections) ran it on defaults without a word.
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


# ------------------------------------------------------------------ params files

NOTHING = {
    "zero-bytes": ("", [], "it has no node sections"),
    "comments-only": ("# robot1's overrides go here\n", [], "it has no node sections"),
    "other-node": ("other_node:\n  ros__parameters:\n    robot_id: r1\n", [],
                   "its sections ['other_node'] name other nodes"),
    "other-namespace": ("/thinking_node:\n  ros__parameters:\n    robot_id: r1\n",
                        ["-r", "__ns:=/robot1"], "its sections ['/thinking_node'] name"),
}


@pytest.mark.ros
@pytest.mark.parametrize("case", sorted(NOTHING))
def test_a_params_file_with_nothing_for_this_node_is_refused(case, ros_env, tmp_path):
    text, remaps, says = NOTHING[case]
    path = tmp_path / "params.yaml"
    path.write_text(text)
    rc, out, err = run_node(node_env(ros_env), "--ros-args", *remaps, "--params-file",
                            str(path))
    assert rc == 2, (rc, out, err)
    fqn = "/robot1/thinking_node" if remaps else "/thinking_node"
    assert len(lines(err)) == 1, err
    assert err.startswith(f"thinking_node: refusing to start: params file {str(path)!r} "
                          f"holds no parameters for this node ({fqn}): {says}"), err
    looked = err.partition("looked for a section ")[2]
    assert looked.startswith("'/**'") and f"'{fqn}'" in looked, err


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


SETS_NOTHING = "/**:\n  ros__parameters: {}\n"
SETS_RATE = "thinking_node:\n  ros__parameters:\n    frame_rate_hz: 5.0\n"


@pytest.mark.parametrize("files, args", [
    ([SETS_NOTHING], []),  # launch_ros writes this for an empty parameter dict
    (["thinking_node:\n  ros__parameters: {}\n"], []),
    ([SETS_NOTHING, SETS_RATE], []),  # the other file sets them
    (["/cli/thinking_node:\n  ros__parameters:\n    robot_id: r1\n"],
     ["-r", "__ns:=/cli"]),  # launch_ros: a dict under a fully qualified name
    (["/*/thinking_node:\n  ros__parameters:\n    robot_id: r1\n"], ["-r", "__ns:=/cli"]),
    (["a:\n  ros__parameters:\n    robot_id: r1\n"], ["-r", "__node:=a", "-r", "__node:=b"]),
    (["tn:\n  ros__parameters:\n    robot_id: r1\n"], ["-r", "other:__node:=x", "-r",
                                                       "thinking_node:__node:=tn"]),
], ids=["empty-wildcard-section", "empty-own-section", "other-file-sets", "launch-fqn",
        "wildcard-namespace", "first-remap-wins", "node-prefixed-remap"])
def test_a_params_file_with_a_section_for_this_node_passes(files, args, tmp_path):
    from thinkmem_ros.robot.node_config import (
        node_fqn_from_args,
        params_and_sections,
        selector_matches,
        validate_ros_args,
    )

    paths = [write(tmp_path, f"p{index}.yaml", text) for index, text in enumerate(files)]
    files_args = [arg for path in paths for arg in ("--params-file", path)]
    argv = ["prog", "--ros-args", *args, *files_args]
    assert validate_ros_args(argv) is None  # raises ParamsFileError on a refusal
    assert validate_ros_args(["prog", "--ros-args", *args, "--params-file", str(PARAMS),
                              *files_args]) is None
    # each file has a section that applies to the node rcl will create
    fqn = node_fqn_from_args(argv)
    for path in paths:
        sections = params_and_sections(path, fqn)[1]
        assert any(selector_matches(section, fqn) for section in sections), (sections, fqn)


def test_the_node_name_is_the_one_rcl_gives(tmp_path):
    # rcl applies the first remap that matches, and a deprecated one outside --ros-args
    from thinkmem_ros.robot.node_config import ParamsFileError, validate_ros_args

    second = write(tmp_path, "b.yaml", "b:\n  ros__parameters:\n    robot_id: r1\n")
    with pytest.raises(ParamsFileError, match=r"for this node \(/a\)"):
        validate_ros_args(["prog", "--ros-args", "-r", "__node:=a", "-r", "__node:=b",
                           "--params-file", second])
    dep = write(tmp_path, "dep.yaml", "dep:\n  ros__parameters:\n    robot_id: r1\n")
    validate_ros_args(["prog", "__node:=dep", "--ros-args", "--params-file", dep])


def test_an_empty_file_is_refused_beside_one_that_sets_parameters(tmp_path):
    from thinkmem_ros.robot.node_config import ParamsFileError, validate_ros_args

    empty = write(tmp_path, "empty.yaml", "")
    with pytest.raises(ParamsFileError, match="empty.yaml' holds no parameters"):
        validate_ros_args(["prog", "--ros-args", "--params-file", str(PARAMS),
                           "--params-file", empty])
