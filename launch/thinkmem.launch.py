"""Launch the thinking node, optionally with bag playback and the consolidator.

    ros2 launch thinkmem_ros thinkmem.launch.py
    ros2 launch thinkmem_ros thinkmem.launch.py bundle:=/path/to/bundle namespace:=robot1
    ros2 launch thinkmem_ros thinkmem.launch.py play_bag:=/data/run.mcap use_sim_time:=true
    ros2 launch thinkmem_ros thinkmem.launch.py consolidator:=true \
        signing_key:=keys/consolidator.sign.key signing_public_key:=keys/consolidator.sign.pub
    ros2 launch thinkmem_ros thinkmem.launch.py consolidator_endpoint:=tcp://10.0.0.5:5755

Playback runs ``thinkmem bag play`` (with ``--clock`` when use_sim_time is true, so the
node's frame timer follows the bag); the consolidator runs ``thinkmem_consolidator``
(it needs ``signing_key``: robots refuse unsigned bundles) bound to ``LOCAL_CONSOLIDATOR``.
Both are found in ``<prefix>/lib/thinkmem_ros/`` like the node itself.

Experience shipping: ``consolidator_endpoint`` (when not empty) and
``signing_public_key`` (when not empty) override the params file; with
``consolidator:=true`` and no endpoint given, the node ships to the local consolidator.
Arguments left empty leave the params file's values alone.
"""

from launch.actions import DeclareLaunchArgument, ExecuteProcess, OpaqueFunction
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import Node
from launch_ros.descriptions import ParameterValue
from launch_ros.substitutions import FindPackagePrefix, FindPackageShare

from launch import LaunchDescription

PACKAGE = "thinkmem_ros"
LOCAL_CONSOLIDATOR = "tcp://127.0.0.1:5755"


def _executable(name: str) -> PathJoinSubstitution:
    """``<prefix>/lib/thinkmem_ros/<name>``: the colcon script or the pip launcher."""
    return PathJoinSubstitution([FindPackagePrefix(PACKAGE), "lib", PACKAGE, name])


def _shipping_overrides(context) -> dict[str, str]:
    """Node parameters from the shipping arguments; empty arguments override nothing."""
    endpoint = LaunchConfiguration("consolidator_endpoint").perform(context)
    local = LaunchConfiguration("consolidator").perform(context).lower() == "true"
    public_key = LaunchConfiguration("signing_public_key").perform(context)
    out = {}
    if endpoint or local:
        out["consolidator_endpoint"] = endpoint or LOCAL_CONSOLIDATOR
    if public_key:
        out["bundle_signing_public_key"] = public_key
    return out


def _node(context) -> list[Node]:
    """Build the thinking node with its parameters resolved at launch time."""
    params = [LaunchConfiguration("params_file"), {
        "bundle_path": ParameterValue(LaunchConfiguration("bundle"), value_type=str),
        "use_sim_time": ParameterValue(LaunchConfiguration("use_sim_time"), value_type=bool)}]
    overrides = _shipping_overrides(context)
    if overrides:
        params.append(overrides)
    return [Node(package=PACKAGE, executable="thinking_node", name="thinking_node",
                 namespace=LaunchConfiguration("namespace"), output="screen",
                 emulate_tty=True, parameters=params)]


def generate_launch_description() -> LaunchDescription:
    """Declare the arguments and the processes they switch on."""
    use_sim_time = LaunchConfiguration("use_sim_time")
    play_bag = LaunchConfiguration("play_bag")
    play_rate = LaunchConfiguration("play_rate")
    consolidator = LaunchConfiguration("consolidator")

    arguments = [
        DeclareLaunchArgument("bundle", default_value="",
                              description="model bundle folder; '' = the shipped default"),
        DeclareLaunchArgument(
            "params_file",
            default_value=PathJoinSubstitution([FindPackageShare(PACKAGE), "config",
                                                "thinkmem.yaml"]),
            description="node parameters (YAML)"),
        DeclareLaunchArgument("namespace", default_value="",
                              description="namespace of the node and its outputs"),
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              choices=["true", "false", "True", "False"],
                              description="follow /clock (bag playback with --clock)"),
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
                              description="the local consolidator's Ed25519 .sign.key"),
        DeclareLaunchArgument("signing_public_key", default_value="",
                              description="accept pushed bundles signed by this .sign.pub; "
                              "'' = the params file's bundle_signing_public_key"),
    ]

    node = OpaqueFunction(function=_node)

    playing = ["'", play_bag, "' != ''"]
    sim = ["'", use_sim_time, "'.lower() == 'true'"]
    play_cmd = [_executable("thinkmem"), "bag", "play", play_bag, "--rate", play_rate]
    play_with_clock = ExecuteProcess(
        cmd=[*play_cmd, "--clock"], output="screen", name="thinkmem_bag_play",
        condition=IfCondition(PythonExpression([*playing, " and ", *sim])))
    play_plain = ExecuteProcess(
        cmd=play_cmd, output="screen", name="thinkmem_bag_play",
        condition=IfCondition(PythonExpression([*playing, " and not ", *sim])))
    consolidator_proc = ExecuteProcess(
        cmd=[_executable("thinkmem_consolidator"), "--signing-key",
             LaunchConfiguration("signing_key"), "--bind", LOCAL_CONSOLIDATOR], output="screen",
        name="thinkmem_consolidator", condition=IfCondition(consolidator))

    return LaunchDescription([*arguments, node, play_with_clock, play_plain, consolidator_proc])
