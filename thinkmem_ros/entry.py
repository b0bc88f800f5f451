"""Console-script entry points: a Ctrl-C while a command's modules load is a clean stop.

Why: a console script imports its target module before any of the command's handlers
exist, and rclpy, numpy, ONNX Runtime and the consolidator's modules take ~0.5-2 s to
import; a Ctrl-C in that window printed a KeyboardInterrupt traceback. Each entry here
imports its command inside a guard and, interrupted there, exits as the command itself
does on Ctrl-C (the node and the consolidator 0, ``thinkmem`` 130 with "interrupted").
"""

from __future__ import annotations

import importlib
import sys


def _run(target: str, interrupted: int, message: str = "") -> int:
    """Import ``module:function`` and call it.

    A Ctrl-C during the import returns ``interrupted`` (printing ``message`` when given).
    """
    module, name = target.split(":")
    try:
        command = getattr(importlib.import_module(module), name)
    except KeyboardInterrupt:
        if message:
            print(message, file=sys.stderr)
        return interrupted
    return command()


def thinking_node() -> int:
    """``thinking_node``: the robot's ROS 2 node."""
    return _run("thinkmem_ros.robot.node:main", 0)


def thinkmem() -> int:
    """``thinkmem``: the command-line tool."""
    return _run("thinkmem_ros.cli:main", 130, "interrupted")


def thinkmem_consolidator() -> int:
    """``thinkmem_consolidator``: the offboard consolidator."""
    return _run("thinkmem_ros.consolidator.service:main", 0)
