"""Launch the thinking node, optionally with bag playback and the consolidator.

    ros2 launch thinkmem_ros thinkmem.launch.py
    ros2 launch thinkmem_ros thinkmem.launch.py bundle:=/path/to/bundle namespace:=robot1
    ros2 launch thinkmem_ros thinkmem.launch.py play_bag:=/data/run.mcap use_sim_time:=true
    ros2 launch thinkmem_ros thinkmem.launch.py consolidator:=true

Playback runs ``thinkmem bag play`` (with ``--clock`` when use_sim_time is true, so the
node's frame timer follows the bag); the consolidator runs ``thinkmem_consolidator``.
Both are found in ``<prefix>/lib/thinkmem_ros/`` like the node itself.
"""

from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import Node
from launch_ros.descriptions import ParameterValue
from launch_ros.substitutions import FindPackagePrefix, FindPackageShare

from launch import LaunchDescription

PACKAGE = "thinkmem_ros"


def _executable(name: str) -> PathJoinSubstitution:
    """``<prefix>/lib/thinkmem_ros/<name>``: the colcon script or the pip launcher."""
    return PathJoinSubstitution([FindPackagePrefix(PACKAGE), "lib", PACKAGE, name])


def generate_launch_description() -> LaunchDescription:
    """Declare the arguments and the processes they switch on."""
    bundle = LaunchConfiguration("bundle")
    params_file = LaunchConfiguration("params_file")
    namespace = LaunchConfiguration("namespace")
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
    ]

    node = Node(
        package=PACKAGE, executable="thinking_node", name="thinking_node",
        namespace=namespace, output="screen", emulate_tty=True,
        parameters=[params_file, {
            "bundle_path": ParameterValue(bundle, value_type=str),
            "use_sim_time": ParameterValue(use_sim_time, value_type=bool)}])

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
        cmd=[_executable("thinkmem_consolidator")], output="screen",
        name="thinkmem_consolidator", condition=IfCondition(consolidator))

    return LaunchDescription([*arguments, node, play_with_clock, play_plain, consolidator_proc])
