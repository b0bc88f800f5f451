"""The pip install into .venv as ROS sees it: ament index, share/ files, lib/ launchers.

Run after ``make setup`` (``make test`` does that first): these tests look at the
installed package, not the source tree.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PREFIX = Path(sys.prefix)
SHARE = PREFIX / "share" / "thinkmem_ros"
LIB = PREFIX / "lib" / "thinkmem_ros"
LAUNCH_FILE = "thinkmem.launch.py"
LAUNCH_ARGS = {"bundle", "params_file", "namespace", "use_sim_time", "play_bag", "consolidator",
               "robot_id"}


def _installed(relative: str) -> Path:
    path = SHARE / relative
    if not path.exists():
        pytest.fail(f"{path} is not installed; run `make setup` to reinstall the package")
    return path


def test_ament_index_and_share_files():
    marker = PREFIX / "share" / "ament_index" / "resource_index" / "packages" / "thinkmem_ros"
    assert marker.is_file(), f"ament index marker missing: {marker}"
    for relative in ("package.xml", f"launch/{LAUNCH_FILE}", "config/thinkmem.yaml"):
        installed = _installed(relative)
        assert installed.read_bytes() == (REPO / relative).read_bytes(), (
            f"{installed} differs from the source tree; run `make setup`")


def test_ament_index_python_finds_the_package(monkeypatch):
    ament = pytest.importorskip("ament_index_python.packages")
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(PREFIX))
    assert Path(ament.get_package_share_directory("thinkmem_ros")) == SHARE
    assert Path(ament.get_package_prefix("thinkmem_ros")) == PREFIX


def test_launchers_are_executable_and_reach_the_console_scripts():
    for exe in ("thinking_node", "thinkmem", "thinkmem_consolidator"):
        launcher = LIB / exe
        assert launcher.is_file() and os.access(launcher, os.X_OK), launcher
    out = subprocess.run([str(LIB / "thinkmem"), "bench", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "--quick" in out.stdout, out.stderr


@contextmanager
def _launched_node(args: list[str], env: dict[str, str]
                   ) -> Iterator[tuple[subprocess.Popen, object]]:
    """The installed ``thinking_node`` and an rclpy node watching the graph; both are gone
    afterwards, whatever the test asserted."""
    import rclpy

    context = rclpy.Context()
    rclpy.init(context=context)
    observer = rclpy.create_node("install_observer", context=context)
    proc = subprocess.Popen([str(LIB / "thinking_node"), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield proc, observer
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5.0)
        observer.destroy_node()
        rclpy.shutdown(context=context)


@pytest.mark.ros
@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGSEGV])
def test_thinking_node_launcher_comes_up_on_the_graph(ros_env, source_bundle, stop):
    """Ctrl-C ends it with status 0; a crash in native code (a real SIGSEGV sent to it)
    leaves every thread's Python stack in its output (``faulthandler``), so a robot's log
    says where it died."""
    shipped = SHARE / "models" / "default" / "bundle.json"
    # With the bundle installed under share/ the node must find it on its own (the default
    # bundle_path ''); rcl cannot parse an empty `-p bundle_path:=`, so pass nothing then.
    args = [] if shipped.is_file() else ["--ros-args", "-p", f"bundle_path:={source_bundle}"]
    env = dict(ros_env, AMENT_PREFIX_PATH=str(PREFIX))
    with _launched_node(args, env) as (proc, observer):
        deadline = time.monotonic() + 40.0
        names: list = []
        while time.monotonic() < deadline and proc.poll() is None:
            names = observer.get_node_names_and_namespaces()
            if ("thinking_node", "/") in names:
                break
            time.sleep(0.2)
        assert ("thinking_node", "/") in names, (
            f"node not on the graph (rc={proc.poll()}): {names}")
        proc.send_signal(stop)
        output, _ = proc.communicate(timeout=15.0)
        if stop == signal.SIGINT:
            assert proc.returncode == 0, output
        else:
            assert proc.returncode == -signal.SIGSEGV, output
            assert "Fatal Python error: Segmentation fault" in output, output
            # where the threads were (the stack may still be deep in loading the bundle)
            assert "most recent call first" in output and 'File "' in output, output


@pytest.mark.ros
@pytest.mark.slow
def test_ctrl_c_while_the_streaming_step_compiles_is_a_clean_stop(ros_env, source_bundle,
                                                                   tmp_path):
    """The node loads numba's streaming step before rclpy owns Ctrl-C: a Ctrl-C that lands
    in that compile (seconds, with an empty kernel cache) exits 0 without a traceback and
    without the node ever joining the graph half-built."""
    cache = tmp_path / "numba-cache"  # empty: the step compiles from scratch
    args = ["--ros-args", "-p", f"bundle_path:={source_bundle}"]
    env = dict(ros_env, AMENT_PREFIX_PATH=str(PREFIX), NUMBA_CACHE_DIR=str(cache),
               THINKMEM_STREAMING_ENGINE="auto")
    with _launched_node(args, env) as (proc, observer):
        deadline = time.monotonic() + 60.0
        # the folder is made right after numba imports, before the compile starts
        while time.monotonic() < deadline and proc.poll() is None and not cache.exists():
            time.sleep(0.02)
        assert cache.exists(), f"the node never started loading numba (rc={proc.poll()})"
        time.sleep(0.3)  # into the compile; a node made before it would be seen by now
        names = observer.get_node_names_and_namespaces()
        proc.send_signal(signal.SIGINT)
        assert ("thinking_node", "/") not in names, "on the graph before the step compiled"
        output, _ = proc.communicate(timeout=30.0)
        assert proc.returncode == 0, output
        assert "Traceback" not in output and "Fatal Python error" not in output, output
        assert "executor:" not in output, output  # stopped before the node was built


def test_launch_file_declares_the_arguments():
    """Checked without launch_ros: the declared arguments and the executables it starts."""
    tree = ast.parse((REPO / "launch" / LAUNCH_FILE).read_text())
    declared = {node.args[0].value for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") ==
                "DeclareLaunchArgument"}
    assert LAUNCH_ARGS <= declared
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
    for exe in ("thinking_node", "thinkmem", "thinkmem_consolidator"):
        assert exe in strings and (LIB / exe).is_file(), exe


def test_launch_description_builds():
    if importlib.util.find_spec("launch_ros") is None:
        reason = ("launch_ros is not installed here (no wheels on the registries); the launch "
                  "file is built on a robot with ROS 2 installed")
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    spec = importlib.util.spec_from_file_location("thinkmem_launch", REPO / "launch" / LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    from launch.actions import DeclareLaunchArgument

    names = {a.name for a in description.entities if isinstance(a, DeclareLaunchArgument)}
    assert LAUNCH_ARGS <= names


# ------------------------------------------------------------------ the launch file
# launch / launch_ros have no wheels here, so the launch file runs against stand-ins that
# only record what it builds. They provide exactly the documented names the file may use
# (an import of anything else fails), and the assertions are about its structure: which
# executables, which handlers, what happens without a signing key.

class _Recorded:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class _LaunchConfiguration(_Recorded):
    def perform(self, context):
        return context[self.args[0]]


def _stub_launch_modules(monkeypatch):
    import types

    names = {
        "launch": ["LaunchDescription"],
        "launch.actions": ["DeclareLaunchArgument", "ExecuteProcess", "LogInfo",
                           "OpaqueFunction", "RegisterEventHandler", "Shutdown"],
        "launch.conditions": ["IfCondition"],
        "launch.event_handlers": ["OnProcessExit"],
        "launch.substitutions": ["LaunchConfiguration", "PathJoinSubstitution",
                                 "PythonExpression"],
        "launch_ros": [],
        "launch_ros.actions": ["Node"],
        "launch_ros.descriptions": ["ParameterValue"],
        "launch_ros.substitutions": ["ExecutableInPackage", "FindPackageShare"],
    }
    for module_name, classes in names.items():
        module = types.ModuleType(module_name)
        for cls in classes:
            base = _LaunchConfiguration if cls == "LaunchConfiguration" else _Recorded
            setattr(module, cls, type(cls, (base,), {}))
        monkeypatch.setitem(sys.modules, module_name, module)


def _launch_module(monkeypatch):
    _stub_launch_modules(monkeypatch)
    spec = importlib.util.spec_from_file_location("thinkmem_launch_stubbed",
                                                  REPO / "launch" / LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _processes(module, **arguments):
    context = {"consolidator": "false", "consolidator_endpoint": "", "signing_key": "",
               "signing_public_key": "", "robot_id": "", "bundle": "", "use_sim_time": "",
               **arguments}
    description = module.generate_launch_description()
    opaque = [e for e in description.args[0] if type(e).__name__ == "OpaqueFunction"]
    assert len(opaque) == 1
    return opaque[0].kwargs["function"](context)


def _kinds(actions):
    return [type(a).__name__ for a in actions]


def test_launch_ends_when_the_node_exits(monkeypatch):
    module = _launch_module(monkeypatch)
    actions = _processes(module)
    node = next(a for a in actions if type(a).__name__ == "Node")
    assert node.kwargs["package"] == "thinkmem_ros"
    assert node.kwargs["executable"] == "thinking_node"
    handler = next(a for a in actions if type(a).__name__ == "RegisterEventHandler")
    on_exit = handler.args[0]
    assert type(on_exit).__name__ == "OnProcessExit"
    assert on_exit.kwargs["target_action"] is node
    assert _kinds(on_exit.kwargs["on_exit"]) == ["Shutdown"]


def test_launch_passes_a_robot_id_to_the_node_only_when_given(monkeypatch):
    """Robots on one graph (namespaces) need ids of their own to ship: a second node on
    the same spool is refused, and the consolidator tells robots apart by the id."""
    module = _launch_module(monkeypatch)

    def node_params(**arguments):
        node = next(a for a in _processes(module, **arguments) if type(a).__name__ == "Node")
        return [p for p in node.kwargs["parameters"] if isinstance(p, dict)]

    assert not any("robot_id" in p for p in node_params())
    assert {"robot_id": "robot1"} in node_params(robot_id="robot1")


def test_launch_leaves_the_params_files_bundle_and_clock_alone_unless_given(monkeypatch):
    """``bundle`` and ``use_sim_time`` were passed to the node always, after the params
    file: a file's own ``bundle_path`` or ``use_sim_time: true`` was silently replaced by
    the shipped bundle and wall-clock time."""
    module = _launch_module(monkeypatch)

    def node_params(**arguments):
        node = next(a for a in _processes(module, **arguments) if type(a).__name__ == "Node")
        params = node.kwargs["parameters"]
        assert type(params[0]).__name__ == "LaunchConfiguration"  # the params file first
        return {k: v for p in params[1:] for k, v in p.items()}

    assert node_params() == {}
    assert node_params(bundle="/opt/models/v7", use_sim_time="True") == {
        "bundle_path": "/opt/models/v7", "use_sim_time": True}
    assert node_params(use_sim_time="false") == {"use_sim_time": False}


def test_launch_finds_executables_in_the_package_not_by_joined_paths(monkeypatch, tmp_path):
    module = _launch_module(monkeypatch)
    key = tmp_path / "c.sign.key"
    key.write_text("00" * 32)
    actions = _processes(module, consolidator="true", signing_key=str(key))
    processes = [a for a in actions if type(a).__name__ == "ExecuteProcess"]
    executables = []
    for proc in processes:
        first = proc.kwargs["cmd"][0]
        assert type(first).__name__ == "ExecutableInPackage", proc.kwargs["cmd"]
        executables.append(first.args)
    assert ("thinkmem_consolidator", "thinkmem_ros") in executables
    assert executables.count(("thinkmem", "thinkmem_ros")) == 2  # bag play, with/without clock
    source = (REPO / "launch" / LAUNCH_FILE).read_text()
    assert "FindPackagePrefix" not in source and '"lib"' not in source
    player = next(p for p in processes if p.kwargs["name"] == "thinkmem_bag_play")
    assert "--namespace" in player.kwargs["cmd"]  # a namespaced node hears its playback


@pytest.mark.parametrize("key, says", [("", "needs signing_key"),
                                       ("/nonexistent/c.sign.key", "no such file")])
def test_consolidator_without_a_signing_key_is_refused_clearly(monkeypatch, key, says):
    module = _launch_module(monkeypatch)
    actions = _processes(module, consolidator="true", signing_key=key)
    assert _kinds(actions) == ["LogInfo", "Shutdown"], "nothing may start"
    assert says in actions[0].kwargs["msg"] and says in actions[1].kwargs["reason"]


# ------------------------------------------------------------------ colcon --symlink-install

def _data_files_via(folder: Path) -> list:
    """Run setup.py from ``folder`` with setup() stubbed; returns its data_files."""
    runner = ("import json, runpy, setuptools\n"
              "setuptools.setup = lambda **kw: print(json.dumps(kw['data_files']))\n"
              "runpy.run_path('setup.py', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", runner], cwd=folder, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_setup_py_works_through_colcon_symlinks(tmp_path):
    """colcon --symlink-install links setup.py and the data files into a build folder and
    runs setup.py there; every file must be found as from the source folder."""
    source = _data_files_via(REPO)
    build = tmp_path / "build" / "thinkmem_ros"
    links = ["setup.py", "setup.cfg", "thinkmem_ros",
             *[path for _, files in source for path in files]]
    for item in links:
        (build / item).parent.mkdir(parents=True, exist_ok=True)
        (build / item).symlink_to(REPO / item)
    assert _data_files_via(build) == source
    for _, files in source:
        for path in files:
            assert not Path(path).is_absolute() and (build / path).exists(), path
