"""Launch the thinking node, optionally with bag playback and the consolidator.

    ros2 launch thinkmem_ros thinkmem.launch.py
    ros2 launch thinkmem_ros thinkmem.launch.py bundle:=/path/to/bundle namespace:=robot1 \
        robot_id:=robot1
    ros2 launch thinkmem_ros thinkmem.launch.py play_bag:=/data/run.mcap use_sim_time:=true
    ros2 launch thinkmem_ros thinkmem.launch.py consolidator:=true \
        signing_key:=keys/consolidator.sign.key signing_public_key:=keys/consolidator.sign.pub
    ros2 launch thinkmem_ros thinkmem.launch.py consolidator_endpoint:=tcp://10.0.0.5:5755

Playback runs ``thinkmem bag play`` (with ``--clock`` when use_sim_time is true, so the
node's frame timer follows the bag; with ``--namespace`` so a namespaced node hears it);
the consolidator runs ``thinkmem_consolidator`` bound to ``LOCAL_CONSOLIDATOR``. All three
are found as executables of this package (``ExecutableInPackage``, like ``ros2 run``).

The node is the reason for the launch: when it exits (a refused configuration, a crash,
Ctrl-C) the whole launch shuts down instead of leaving the player and the consolidator
running without it. ``consolidator:=true`` without a readable ``signing_key`` is refused
before anything starts, naming the argument: robots accept only signed bundles, so a
consolidator without a key could never push one.

The node's input topics are relative: with ``namespace:=robot1`` it reads
``/robot1/sensors/...``, so two robots launched side by side never read each other's
sensors.

``bundle``, ``use_sim_time``, ``robot_id``, ``consolidator_endpoint`` and
``signing_public_key`` override the params file only when given; with
``consolidator:=true`` and no endpoint given, the node ships to the local consolidator.
Arguments left empty leave the params file's values alone (``bundle`` and ``use_sim_time``
used to be passed always, so a params file's own ``bundle_path`` or ``use_sim_time: true``
was silently replaced by the shipped bundle and wall-clock time). Playback adds ``--clock``
only with ``use_sim_time:=true`` given here.

The local consolidator keeps its store (``consolidator.db``) and published bundles
(``consolidator_bundles/``) in the folder the launch was started from, its own defaults.
"""

import os

from launch.actions import (
    DeclareLaunchArgument,
    ExecuteProcess,
    LogInfo,
    OpaqueFunction,
    RegisterEventHandler,
    Shutdown,
)
from launch.conditions import IfCondition
from launch.event_handlers import OnProcessExit
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import Node
from launch_ros.substitutions import ExecutableInPackage, FindPackageShare

from launch import LaunchDescription

PACKAGE = "thinkmem_ros"
LOCAL_CONSOLIDATOR = "tcp://127.0.0.1:5755"


def _overrides(context) -> dict[str, object]:
    """Node parameters from the launch arguments; empty arguments override nothing."""
    endpoint = LaunchConfiguration("consolidator_endpoint").perform(context)
    local = LaunchConfiguration("consolidator").perform(context).lower() == "true"
    public_key = LaunchConfiguration("signing_public_key").perform(context)
    robot_id = LaunchConfiguration("robot_id").perform(context)
    bundle = LaunchConfiguration("bundle").perform(context)
    sim_time = LaunchConfiguration("use_sim_time").perform(context)
    out: dict[str, object] = {}
    if bundle:
        out["bundle_path"] = bundle
    if sim_time:
        out["use_sim_time"] = sim_time.lower() == "true"
    if robot_id:  # robots sharing one graph (namespaces) must ship under ids of their own
        out["robot_id"] = robot_id
    if endpoint or local:
        out["consolidator_endpoint"] = endpoint or LOCAL_CONSOLIDATOR
    if public_key:
        out["bundle_signing_public_key"] = public_key
    return out


def _node(context) -> list:
    """The thinking node, and the handler that ends the launch when it exits."""
    params = [LaunchConfiguration("params_file")]
    overrides = _overrides(context)
    if overrides:
        params.append(overrides)
    node = Node(package=PACKAGE, executable="thinking_node", name="thinking_node",
                namespace=LaunchConfiguration("namespace"), output="screen",
                emulate_tty=True, parameters=params)
    end_with_node = RegisterEventHandler(OnProcessExit(
        target_action=node,
        on_exit=[Shutdown(reason="thinking_node exited; stopping playback and the "
                                 "consolidator with it")]))
    return [node, end_with_node]


def signing_key_problem(key: str) -> str:
    """Why ``signing_key`` cannot run a consolidator ('' when it can)."""
    if not key:
        return ("consolidator:=true needs signing_key:=<name>.sign.key (create one with "
                "`thinkmem keys --out keys --name consolidator`): robots refuse unsigned "
                "bundles, so a consolidator without a signing key could never push one")
    if not os.path.isfile(key):
        return f"signing_key:={key}: no such file"
    if not os.access(key, os.R_OK):
        return f"signing_key:={key}: not readable"
    return ""


def _playback() -> list:
    """``thinkmem bag play`` into the node's namespace, with /clock under sim time."""
    play_bag = LaunchConfiguration("play_bag")
    playing = ["'", play_bag, "' != ''"]
    sim = ["'", LaunchConfiguration("use_sim_time"), "'.lower() == 'true'"]
    play_cmd = [ExecutableInPackage("thinkmem", PACKAGE), "bag", "play", play_bag,
                "--rate", LaunchConfiguration("play_rate"),
                "--namespace", LaunchConfiguration("namespace")]
    return [ExecuteProcess(cmd=[*play_cmd, "--clock"], output="screen",
                           name="thinkmem_bag_play",
                           condition=IfCondition(PythonExpression([*playing, " and ", *sim]))),
            ExecuteProcess(cmd=play_cmd, output="screen", name="thinkmem_bag_play",
                           condition=IfCondition(PythonExpression(
                               [*playing, " and not ", *sim])))]


def _processes(context) -> list:
    """Everything that runs: refused as a whole when the consolidator cannot start."""
    processes = []
    if LaunchConfiguration("consolidator").perform(context).lower() == "true":
        key = LaunchConfiguration("signing_key").perform(context)
        problem = signing_key_problem(key)
        if problem:
            return [LogInfo(msg=f"ERROR: {problem}"), Shutdown(reason=problem)]
        processes.append(ExecuteProcess(
            cmd=[ExecutableInPackage("thinkmem_consolidator", PACKAGE), "--signing-key", key,
                 "--bind", LOCAL_CONSOLIDATOR],
            output="screen", name="thinkmem_consolidator"))
    return [*processes, *_node(context), *_playback()]


def generate_launch_description() -> LaunchDescription:
    """Declare the arguments; the processes are chosen once they are known."""
    arguments = [
        DeclareLaunchArgument("bundle", default_value="",
                              description="model bundle folder; '' = the params file's "
                              "bundle_path (the shipped default when it has none)"),
        DeclareLaunchArgument(
            "params_file",
            default_value=PathJoinSubstitution([FindPackageShare(PACKAGE), "config",
                                                "thinkmem.yaml"]),
            description="node parameters (YAML)"),
        DeclareLaunchArgument("namespace", default_value="",
                              description="namespace of the node, its inputs and outputs"),
        DeclareLaunchArgument("use_sim_time", default_value="",
                              choices=["", "true", "false", "True", "False"],
                              description="follow /clock (bag playback with --clock); '' = "
                              "the params file's use_sim_time, playback without --clock"),
        DeclareLaunchArgument("play_bag", default_value="",
                              description="rosbag2 to play into the node; '' = no playback"),
        DeclareLaunchArgument("play_rate", default_value="1.0",
                              description="playback rate factor"),
        DeclareLaunchArgument("consolidator", default_value="false",
                              choices=["true", "false", "True", "False"],
                              description="also run the offboard consolidator here"),
        DeclareLaunchArgument("consolidator_endpoint", default_value="",
                              description="ship experiences there; '' = the params file's "
                              "value (or the local consolidator with consolidator:=true)"),
        DeclareLaunchArgument("signing_key", default_value="",
                              description="the local consolidator's Ed25519 .sign.key "
                              "(required with consolidator:=true)"),
        DeclareLaunchArgument("robot_id", default_value="",
                              description="the id this robot ships experiences under; '' = "
                              "the params file's robot_id"),
        DeclareLaunchArgument("signing_public_key", default_value="",
                              description="accept pushed bundles signed by this .sign.pub; "
                              "'' = the params file's bundle_signing_public_key"),
    ]

    return LaunchDescription([*arguments, OpaqueFunction(function=_processes)])
