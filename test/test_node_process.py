"""The node as a process: clean exit on SIGINT/SIGTERM, refusal of invalid parameters."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ros, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent


class NodeProcess:
    """A thinking_node child whose output is collected on a thread (reads never block)."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if text in self.output:
                return
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"{text!r} never appeared (rc={self.proc.returncode}):\n{self.output}")

    def finish(self, timeout: float = 15.0) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"node did not exit within {timeout} s:\n{self.output}")
        self.reader.join(timeout=2.0)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5.0)


def node_cmd(*ros_args: str) -> list[str]:
    return [sys.executable, "-m", "thinkmem_ros.robot.node", "--ros-args", *ros_args]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_clean_exit_on_signal(sig, ros_env, source_bundle, tmp_path):
    stats = tmp_path / "stats.json"
    node = NodeProcess(node_cmd("-p", f"bundle_path:={source_bundle}", "-p",
                                f"stats_file:={stats}", "-p", "frame_rate_hz:=50.0"), ros_env)
    node.wait_for("ready:")
    time.sleep(0.5)  # let a few frames through
    node.proc.send_signal(sig)
    assert node.finish() == 0, node.output
    assert "Traceback" not in node.output and "executor: events" in node.output
    data = json.loads(stats.read_text())  # written on the way out
    assert data["published"] > 0 and data["frame_rate_hz"] == 50.0


STOP_BEFORE_SPIN = """
import sys
import rclpy
import thinkmem_ros.robot.node as node_module

class StoppedAfterReady(node_module.ThinkingNode):
    # The race a loaded machine produces now and then: SIGINT lands after "ready" and
    # before the executor takes the node, so rclpy's handler has shut the context down and
    # the executor cannot create its guard condition. Shutting down right after the real
    # node is built makes that moment happen every time.
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        rclpy.shutdown()

node_module.ThinkingNode = StoppedAfterReady
sys.exit(node_module.main())
"""


def test_a_stop_between_ready_and_spin_is_a_clean_exit(ros_env, source_bundle):
    node = NodeProcess([sys.executable, "-c", STOP_BEFORE_SPIN, "--ros-args", "-p",
                        f"bundle_path:={source_bundle}"], ros_env)
    assert node.finish(timeout=30.0) == 0, node.output
    assert "ready:" in node.output and "Traceback" not in node.output, node.output


SIGNAL_WHILE_THE_EXECUTOR_REGISTERS = """
import os
import signal
import sys
import time

import rclpy.event_handler as handlers
import thinkmem_ros.robot.node as node_module

original = handlers.EventHandler.get_num_entities
fired = []

def get_num_entities(self):
    # The events executor asks each of the node's waitables for its entities while it
    # registers them (its first wake-up after add_node). A SIGINT landing between two of
    # them is the race a loaded machine produced about once in twenty stops sent right
    # after "ready"; here it lands there every time. (The sleep outlasts a signal
    # handler's thread; a KeyboardInterrupt raised in it would end the registration
    # early, which is not the race.)
    fired.append(1)
    if len(fired) == 2:
        os.kill(os.getpid(), signal.SIGINT)
        try:
            time.sleep(0.3)
        except KeyboardInterrupt:
            pass
    return original(self)

handlers.EventHandler.get_num_entities = get_num_entities
sys.exit(node_module.main())
"""


def test_a_stop_while_the_executor_registers_the_node_is_a_clean_exit(ros_env, source_bundle):
    # Once, rclpy's own handler shut the context down right there: the registration failed
    # half way ("failed to initialize wait set") and the executor, destroyed with callbacks
    # it no longer tracked, aborted the process (exit -6, or -11).
    node = NodeProcess([sys.executable, "-c", SIGNAL_WHILE_THE_EXECUTOR_REGISTERS,
                        "--ros-args", "-p", f"bundle_path:={source_bundle}"], ros_env)
    assert node.finish(timeout=30.0) == 0, node.output
    assert "executor: events" in node.output and "Traceback" not in node.output, node.output


@pytest.mark.parametrize("args, named", [
    (("-p", "frame_rate_hz:=-5.0"), "frame_rate_hz"),
    (("-p", "qos:=fastest"), "qos"),
    (("-p", "signals.temperature.field:=temp"), "signals.temperature.field"),
    (("-p", "thresholds:=hazard=2"), "thresholds"),
    (("-p", "bundle_path:=/nonexistent/bundle"), "/nonexistent/bundle"),
    (("-p", "stats_file:=/nonexistent/folder/stats.json"), "stats_file"),
    (("-p", "stats_file:=/"), "stats_file"),
    (("-p", "recall_endpoint:=tcp://127.0.0.1:*"), "recall_endpoint"),
    (("-p", "consolidator_endpoint:=tcp://127.0.0.1:*"), "consolidator_endpoint"),
    (("-p", "consolidator_endpoint:=tcp://127.0.0.1:5755", "-p", "spool_path:=/tmp"),
     "spool_path '/tmp' cannot hold the spool"),
], ids=["range", "choice", "field", "thresholds", "bundle", "stats_missing", "stats_folder",
        "recall_port", "consolidator_port", "spool_folder"])
def test_invalid_parameter_refused_naming_it(args, named, ros_env, source_bundle):
    base = () if "bundle_path" in args[1] else ("-p", f"bundle_path:={source_bundle}")
    node = NodeProcess(node_cmd(*base, *args), ros_env)
    rc = node.finish(timeout=30.0)
    assert rc == 2, node.output
    assert "refusing to start" in node.output and named in node.output, node.output


def test_a_second_node_with_the_same_robot_id_is_refused_with_one_line(ros_env, source_bundle,
                                                                       tmp_path):
    """Two namespaces, robot_id left at its default: one spool, so the second is refused."""
    env = dict(ros_env, XDG_STATE_HOME=str(tmp_path / "state"))
    args = ("-p", f"bundle_path:={source_bundle}", "-p", "watch_bundle:=false",
            "-p", "consolidator_endpoint:=tcp://127.0.0.1:9")
    first = NodeProcess(node_cmd(*args, "-r", "__ns:=/robot1"), env)
    try:
        first.wait_for("ready:")
        second = NodeProcess(node_cmd(*args, "-r", "__ns:=/robot2"), env)
        assert second.finish(timeout=30.0) == 2, second.output
        refusal = [line for line in second.lines if "refusing to start" in line]
        assert len(refusal) == 1 and "Traceback" not in second.output, second.output
        assert f"in use by pid {first.proc.pid} (node /robot1/thinking_node, robot_id robot)" \
            in refusal[0] and "give each robot its own robot_id" in refusal[0], refusal
    finally:
        first.proc.send_signal(signal.SIGINT)
        assert first.finish() == 0, first.output


# ---------------------------------------------------------------- hostile start-up input
# The same probes `thinkmem bench faults` runs: each starts the real node as a process and
# expects exit 2 with ONE line naming the problem, never a traceback or a silent start.

REFUSALS = ["params_missing", "params_unparsable", "params_unknown_parameter",
            "params_signal_key", "params_signal_name", "param_unknown_override",
            "bundle_list_field", "bundle_deep_nesting", "bundle_not_object",
            "params_aliases", "ros_args_typo", "frame_rate_tiny", "bundle_rate_tiny",
            "graph_fails_probe"]


@pytest.fixture
def probe_ctx(ros_env, source_bundle, tmp_path):
    from thinkmem_ros.bench.fault_probes_node import ProbeContext

    return ProbeContext(tmp_path / "probes", bundle=source_bundle, start_timeout_s=30.0)


@pytest.mark.parametrize("probe", REFUSALS)
def test_bad_start_input_exits_2_with_one_line(probe, probe_ctx):
    from thinkmem_ros.bench.fault_probes_node import PROBES

    record = PROBES[probe](probe_ctx)
    assert not record["crashed"] and record["ok"], record["detail"]


def test_shipped_params_file_is_accepted(ros_env, source_bundle):
    from thinkmem_ros.core.paths import default_params

    node = NodeProcess(node_cmd("--params-file", str(default_params()), "-p",
                                f"bundle_path:={source_bundle}"), ros_env)
    node.wait_for("ready:")
    node.proc.send_signal(signal.SIGINT)
    assert node.finish() == 0 and "Traceback" not in node.output, node.output


def test_an_artefact_that_is_a_fifo_never_blocks_the_start(probe_ctx):
    from thinkmem_ros.bench.fault_probes_node import PROBES

    record = PROBES["artefact_fifo"](probe_ctx)
    assert not record["crashed"] and record["ok"], record["detail"]


# ---------------------------------------------------------------- hostile topic input

@pytest.mark.parametrize("probe", ["feedback_deep_nesting", "feedback_malformed"])
def test_hostile_feedback_is_counted_and_never_stops_the_node(probe, probe_ctx):
    from thinkmem_ros.bench.fault_probes_node import PROBES

    record = PROBES[probe](probe_ctx)
    assert not record["crashed"] and record["ok"], record["detail"]
    assert record["rss_growth_mb"] < 50, record


def test_a_backward_sim_clock_jump_resets_the_window(probe_ctx):
    from thinkmem_ros.bench.fault_probes_node import probe_sim_clock_backward

    record = probe_sim_clock_backward(probe_ctx)
    assert not record["crashed"] and record["ok"], record["detail"]


def test_a_bad_bundle_path_set_at_runtime_is_refused_with_a_reason(probe_ctx):
    """A missing folder, and a name past the file system's limit (which stopped the node)."""
    from thinkmem_ros.bench.fault_probes_node import probe_param_set_bad_bundle

    record = probe_param_set_bad_bundle(probe_ctx)
    assert not record["crashed"] and record["ok"], record["detail"]
