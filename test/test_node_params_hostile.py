"""The node's parameters from hostile input: FIFOs, devices, duplicate keys, path-like ids.

Each case once hung the node, read without end or ran it with a value the user did not
mean; the node must refuse it at start in one line and exit 2. Node processes are
bounded (a timeout, and a memory cap where the old behaviour read without end).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from thinkmem_ros.robot.node_config import NodeConfig, ParamsFileError, read_params_file

REPO = Path(__file__).resolve().parent.parent
MEMORY_CAP = 2 * 1024 ** 3
"""Address space a refused node gets: ample for start-up, far from the host's RAM."""


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_node(env: dict[str, str], *ros_args: str, timeout: float = 30.0
             ) -> tuple[int | None, str]:
    """Exit status (None when it had to be killed) and stderr of a node started with args."""
    cmd = [sys.executable, "-m", "thinkmem_ros.robot.node", "--ros-args", *ros_args]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_cap_memory)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return None, err
    return proc.returncode, err


def refusal_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "params.yaml"
    os.mkfifo(path)
    return path


# ------------------------------------------------------------------ params file kind

@pytest.mark.ros
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_params_file_that_is_no_file_is_refused_in_one_line(kind, fifo, ros_env):
    path = str(fifo) if kind == "fifo" else "/dev/zero"
    rc, err = run_node(ros_env, "--params-file", path, timeout=30.0)
    assert rc == 2, (rc, err)
    lines = refusal_lines(err)
    assert len(lines) == 1, err
    assert lines[0].startswith("thinking_node: refusing to start: params file"), err
    assert path in lines[0], err
    said = "a FIFO" if kind == "fifo" else "a character device"
    assert f"is {said}, not a file" in lines[0], err


# ------------------------------------------------------------------ stats_file kind

@pytest.mark.ros
def test_a_stats_file_that_is_a_fifo_is_refused_in_one_line(fifo, ros_env):
    # it hung the node in open(), and SIGTERM could not stop it
    rc, err = run_node(ros_env, "-p", f"stats_file:={fifo}", timeout=30.0)
    assert rc == 2, (rc, err)
    lines = refusal_lines(err)
    assert len(lines) == 1, err
    assert lines[0] == (f"thinking_node: refusing to start: stats_file {str(fifo)!r} is a "
                        "FIFO, not a file"), err


def test_a_stats_file_that_is_a_device_is_refused():
    with pytest.raises(ValueError, match="stats_file '/dev/null' is a character device"):
        NodeConfig(stats_file="/dev/null").check_stats_file()


def test_a_stats_file_is_still_created_and_left_as_it_was(tmp_path):
    NodeConfig(stats_file=str(tmp_path / "new.json")).check_stats_file()
    assert (tmp_path / "new.json").read_bytes() == b""
    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    NodeConfig(stats_file=str(kept)).check_stats_file()
    assert kept.read_text() == "{}"


# ------------------------------------------------------------------ duplicate keys

SECTION = "/**:\n  ros__parameters:\n"


@pytest.mark.parametrize("text, says", [
    (SECTION + "    frame_rate_hz: 5.0\n    frame_rate_hz: 20.0\n",
     "line 4: 'frame_rate_hz' is given twice in one mapping (first at line 3)"),
    (SECTION + "    frame_rate_hz: 5.0\n" + SECTION + "    qos: reliable\n",
     "line 4: '/**' is given twice in one mapping (first at line 1)"),
    (SECTION + '    signals:\n      temperature: {topic: "a", topic: "b"}\n',
     "line 4: 'signals.temperature.topic' is given twice in one mapping (on that line)"),
    (SECTION + "    signals:\n      temperature:\n        topic: a\n"
     "      temperature:\n        field: temperature\n",
     "line 6: 'signals.temperature' is given twice in one mapping (first at line 4)"),
    (SECTION + "    signals.temperature.topic: a\n    signals:\n      temperature:\n"
     "        topic: b\n",
     "line 6: parameter 'signals.temperature.topic' is given twice (first at line 3)"),
], ids=["plain", "section", "flow", "nested", "dotted_and_nested"])
def test_a_key_given_twice_is_refused_naming_it_and_its_lines(tmp_path, text, says):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(ParamsFileError) as caught:
        read_params_file(path)
    assert str(caught.value).startswith(f"params file {str(path)!r}: "), caught.value
    assert says in str(caught.value), caught.value


@pytest.mark.parametrize("first, second", [("/**", "/thinking_node"),
                                           ("thinking_node", "/**")])
def test_a_parameter_set_by_two_matching_sections_is_refused_naming_both(tmp_path, first,
                                                                          second):
    # rcl keeps the one later in the file, not the more specific section
    path = tmp_path / "params.yaml"
    path.write_text(f"{first}:\n  ros__parameters:\n    frame_rate_hz: 5.0\n"
                    f"{second}:\n  ros__parameters:\n    frame_rate_hz: 20.0\n")
    with pytest.raises(ParamsFileError) as caught:
        read_params_file(path)
    assert (f"parameter 'frame_rate_hz' is set by two sections that both match "
            f"/thinking_node: {first!r} (line 3) and {second!r} (line 6)") in str(caught.value)


def test_sections_that_set_different_parameters_or_other_nodes_are_read(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("/**:\n  ros__parameters:\n    frame_rate_hz: 5.0\n"
                    "/thinking_node:\n  ros__parameters:\n    qos: reliable\n"
                    "/other_node:\n  ros__parameters:\n    frame_rate_hz: 20.0\n")
    assert read_params_file(path) == {"frame_rate_hz": "5.0", "qos": "reliable"}
    assert read_params_file(path, "/ns/thinking_node") == {"frame_rate_hz": "5.0"}


@pytest.mark.ros
def test_the_node_refuses_a_params_file_with_a_key_given_twice(tmp_path, ros_env):
    path = tmp_path / "params.yaml"
    path.write_text(SECTION + "    frame_rate_hz: 5.0\n    frame_rate_hz: 20.0\n")
    rc, err = run_node(ros_env, "--params-file", str(path), timeout=30.0)
    assert rc == 2, (rc, err)
    assert refusal_lines(err) == [
        f"thinking_node: refusing to start: params file {str(path)!r}: line 4: "
        "'frame_rate_hz' is given twice in one mapping (first at line 3); rcl would "
        "silently use the last"], err


# ------------------------------------------------------------------ robot_id as a folder

@pytest.mark.parametrize("robot_id, says", [
    ("..", "must not start with '.'"),
    (".", "must not start with '.'"),
    (".hidden", "must not start with '.'"),
    ("../other", "must not start with '.'"),
    ("a/b", "must be one folder name"),
    ("/abs", "must be one folder name"),
    ("a\\b", "must be one folder name"),
    ("a\nb", "must not hold control characters"),
    ("r" * 256, "is longer than a folder name"),
])
def test_a_robot_id_that_is_no_single_folder_name_is_refused(robot_id, says):
    with pytest.raises(ValueError) as caught:
        NodeConfig(robot_id=robot_id)
    assert str(caught.value).startswith(f"robot_id {robot_id!r} {says}"), caught.value


def test_a_shipping_robot_id_may_not_start_with_a_dot_either():
    with pytest.raises(ValueError) as caught:
        NodeConfig(robot_id=".r1", consolidator_endpoint="tcp://127.0.0.1:5999")
    assert "robot_id '.r1'" in str(caught.value), caught.value


@pytest.mark.parametrize("robot_id", ["robot", "r1.v2", "disk-bot", "ns:robot_7", "bot 7"])
def test_robot_ids_that_are_folder_names_are_kept(robot_id, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    config = NodeConfig(robot_id=robot_id)
    assert config.bundles_folder() == tmp_path / "thinkmem_ros" / robot_id / "bundles"


@pytest.mark.ros
def test_the_node_refuses_robot_id_dot_dot_before_making_its_spool(tmp_path, ros_env):
    # '..' once put the spool at $XDG_STATE_HOME/spool.db, outside thinkmem_ros/
    state = tmp_path / "state"
    env = dict(ros_env, XDG_STATE_HOME=str(state))
    rc, err = run_node(env, "-p", "robot_id:=..", "-p",
                       "consolidator_endpoint:=tcp://127.0.0.1:5999", timeout=30.0)
    assert rc == 2, (rc, err)
    assert refusal_lines(err) == [
        "thinking_node: refusing to start: robot_id '..' must not start with '.' (it names "
        "this robot's state folder)"], err
    assert not (state / "spool.db").exists()
    assert not (state / "bundles").exists()


def test_a_stats_file_under_home_is_written_where_the_start_check_made_it(
        tmp_path, monkeypatch, ros_env, source_bundle):
    """``stats_file: ~/s.json`` passed the check (which expands ``~``) and was then
    written at shutdown to ``./~/s.json``, a folder named '~' that only logged an error."""
    import rclpy
    from rclpy.parameter import Parameter

    from thinkmem_ros.robot.node import ThinkingNode

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = ThinkingNode(context=context, parameter_overrides=[
            Parameter("bundle_path", value=str(source_bundle)),
            Parameter("stats_file", value="~/s.json")])
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)
    written = tmp_path / "home" / "s.json"
    assert written.is_file() and '"frame_trigger"' in written.read_text()
    assert not (tmp_path / "~").exists()
