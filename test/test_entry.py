"""Console scripts load their command under a Ctrl-C guard (``thinkmem_ros.entry``).

The window is a module import, too short to hit by timing a real signal reliably, so the
fault is injected: a command module that sends its own process SIGINT while it loads.
"""

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("interrupted", "message"), [(0, ""), (130, "interrupted")])
def test_a_ctrl_c_while_a_command_loads_is_a_clean_stop(tmp_path, interrupted, message):
    (tmp_path / "slow_command.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(30)\n"
        "def main():\n"
        "    return 7\n")
    code = ("import sys; from thinkmem_ros.entry import _run; "
            f"sys.exit(_run('slow_command:main', {interrupted}, {message!r}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == interrupted, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.strip() == message


def test_a_command_that_loads_runs_and_returns_its_code(tmp_path):
    (tmp_path / "quick_command.py").write_text("def main():\n    return 7\n")
    code = ("import sys; from thinkmem_ros.entry import _run; "
            "sys.exit(_run('quick_command:main', 0))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 7, out.stderr


def test_every_console_script_goes_through_the_guard():
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")
               if e.value.startswith("thinkmem_ros")}
    assert scripts == {"thinkmem": "thinkmem_ros.entry:thinkmem",
                       "thinking_node": "thinkmem_ros.entry:thinking_node",
                       "thinkmem_consolidator": "thinkmem_ros.entry:thinkmem_consolidator"}
