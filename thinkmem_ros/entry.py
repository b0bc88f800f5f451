"""Console-script entry points: a Ctrl-C while a command's modules load is a clean stop.

Why: a console script imports its target module before any of the command's handlers
exist, and rclpy, numpy, ONNX Runtime and the consolidator's modules take ~0.5-2 s to
import; a Ctrl-C in that window printed a KeyboardInterrupt traceback. Each entry here
imports and runs its command inside a guard and, interrupted before the command's own
handling took over (or by a Ctrl-C it let escape), exits as the command itself does on
Ctrl-C (the node and the consolidator 0, ``thinkmem`` 130 with "interrupted").
"""

from __future__ import annotations

import importlib
import signal
import sys


def _run(target: str, interrupted: int, message: str = "") -> int:
    """Import ``module:function`` and call it.

    A Ctrl-C during the import, or one the command lets escape, returns ``interrupted``
    (printing ``message`` when given).
    """
    module, name = target.split(":")
    try:
        return getattr(importlib.import_module(module), name)()
    except KeyboardInterrupt:
        if message:
            print(message, file=sys.stderr)
        return interrupted


def thinking_node() -> int:
    """``thinking_node``: the robot's ROS 2 node."""
    return _run("thinkmem_ros.robot.node:main", 0)


def thinkmem() -> int:
    """``thinkmem``: the command-line tool."""
    return _run("thinkmem_ros.cli:main", 130, "interrupted")


def thinkmem_consolidator() -> int:
    """``thinkmem_consolidator``: the offboard consolidator (Ctrl-C: 0, even while exiting)."""
    return exit_quietly(_run("thinkmem_ros.consolidator.service:main", 0))


def exit_quietly(code: int) -> int:
    """``code``, with Ctrl-C ignored from now on: for a process's last step, once it is done.

    Why: tearing the interpreter down takes ~0.3 s with torch and numba loaded, and Python
    resets its handlers first, so a Ctrl-C then killed the consolidator with status 130
    after a clean stop. Not for in-process callers: what they start would inherit it.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code
