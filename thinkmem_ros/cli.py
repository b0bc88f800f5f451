"""The ``thinkmem`` command: one small verb module per sub-command (like ``ros2 bag``).

Each verb lives in ``thinkmem_ros/commands/<verb>.py`` and provides ``HELP`` (one line),
``add_arguments(parser)`` and ``main(args) -> int``. Verbs are imported only when the
command line names them, so ``thinkmem bag play`` on a robot never imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys

from thinkmem_ros.core.arguments import OneLineParser

VERBS: dict[str, str] = {
    "demo": "run the main job end to end (bag -> node -> activations -> report)",
    "train": "train a policy and export it as a model bundle",
    "bench": "run a benchmark and write its JSON (and PNG)",
    "bag": "write synthetic scenarios to rosbag2 or play a bag into ROS",
    "keys": "generate CURVE and signing key pairs",
    "consolidator": "run the offboard consolidator service",
    "knowledge": "list knowledge units the consolidator has discovered",
    "calibrate": "report a recording's adapted signals (range, rate, unit) against a bundle",
}


def _load(verb: str):
    """Import one verb's module; static imports, so the import contracts see every edge."""
    match verb:
        case "demo":
            from thinkmem_ros.commands import demo as module
        case "train":
            from thinkmem_ros.commands import train as module
        case "bench":
            from thinkmem_ros.commands import bench as module
        case "bag":
            from thinkmem_ros.commands import bag as module
        case "keys":
            from thinkmem_ros.commands import keys as module
        case "consolidator":
            from thinkmem_ros.commands import consolidator as module
        case "knowledge":
            from thinkmem_ros.commands import knowledge as module
        case "calibrate":
            from thinkmem_ros.commands import calibrate as module
        case _:
            raise KeyError(verb)
    return module


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """Top-level parser; only ``verb``'s module is imported (all, when ``verb`` is None)."""
    parser = OneLineParser(prog="thinkmem", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for name, summary in VERBS.items():
        child = sub.add_parser(name, help=summary, description=summary)
        if verb is None or verb == name:
            _load(name).add_arguments(child)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``thinkmem`` console script.

    Parsing imports the verb's module (numpy and more: ~0.25 s for ``train``), so it
    runs inside the Ctrl-C guard too: a Ctrl-C there printed a KeyboardInterrupt
    traceback.
    """
    argv = sys.argv[1:] if argv is None else argv
    verb = next((a for a in argv if not a.startswith("-")), None)
    verb = verb if verb in VERBS else None
    try:
        args = build_parser(verb).parse_args(argv)
        return int(_load(args.verb).main(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_gone()
    except SystemExit as exc:
        raise _named(verb, exc) from None
    except Exception as exc:  # noqa: BLE001 - the last line of defence, see below
        return _unexpected(verb, exc)


def _named(verb: str | None, stop: SystemExit) -> SystemExit:
    """A refusal's line, led by the command as argparse's own are (``thinkmem X: error:``).

    Shared checks (an unwritable ``--json`` or ``--out``) know the option, not the
    command, and exit with ``--json /proc/x: cannot write ...`` alone; whoever reads a
    log of several commands cannot tell which one refused.
    """
    if not isinstance(stop.code, str) or stop.code.startswith("thinkmem"):
        return stop
    return SystemExit(f"{' '.join(filter(None, ('thinkmem', verb)))}: error: {stop.code}")


def _reader_gone() -> int:
    """Exit quietly when whatever read stdout went away (``thinkmem bag info | head``).

    As other command-line tools on a closed pipe: no message, and 141 (128 + SIGPIPE),
    the status of a tool SIGPIPE ended. stdout is pointed at /dev/null first, so the
    interpreter's last flush of what is still buffered does not fail on the pipe again.
    """
    with contextlib.suppress(OSError, ValueError):  # stdout may be no real file (tests)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 128 + signal.SIGPIPE


TRACEBACK_ENV = "THINKMEM_TRACEBACK"
"""Set (to anything) to see the traceback of an error no verb turned into a message."""


def _unexpected(verb: str | None, exc: Exception) -> int:
    """One line and exit 1 for an error no verb anticipated (never a traceback).

    Each verb names the input errors it knows; what slips past them (a full disk under
    stdout, a bug) still reaches the user as one line with the exception's kind, and
    ``THINKMEM_TRACEBACK=1`` shows where it came from.
    """
    if os.environ.get(TRACEBACK_ENV):
        raise exc
    from thinkmem_ros.commands import one_line

    text = one_line(exc)
    if len(text) > 300:
        text = text[:297] + "..."
    try:
        print(f"{' '.join(filter(None, ('thinkmem', verb)))}: error: "
              f"{type(exc).__name__}: {text} "
              f"({TRACEBACK_ENV}=1 shows where)", file=sys.stderr)
    except OSError:
        pass
    return 1


if __name__ == "__main__":
    sys.exit(main())
