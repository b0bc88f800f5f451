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

from thinkmem_ros.robot.node_config import NodeConfig

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
