"""``thinkmem bag write|play|info|convert``: synthetic scenarios to rosbag2, bags into ROS.

Verb classes in the style of ``ros2 bag``: each adds its own arguments and validates
input where it enters, naming the bad value; failures exit non-zero with one clear line.
``info`` and ``play`` take a rosbag2 folder (MCAP or sqlite3) or a ROS 1 ``.bag`` file;
``convert`` writes a ROS 1 bag as a rosbag2 folder once, for tools that need one.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from pathlib import Path

from thinkmem_ros.commands import one_line
from thinkmem_ros.core.arguments import non_negative_int

HELP = "write synthetic scenarios to rosbag2, play, inspect or convert a bag"


def positive_float(text: str) -> float:
    """Argparse type: a finite number > 0 (the error names the value)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """Argparse type: a finite number >= 0 (the error names the value)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


class WriteVerb:
    """Record a synthetic scenario stream as an MCAP bag on the node's topics."""

    NAME = "write"
    HELP = "record a synthetic scenario stream as a rosbag2 MCAP bag"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Scenario, duration, output and stream rate."""
        parser.add_argument("--scenario", required=True, help="world scenario name")
        parser.add_argument("--duration", type=positive_float, required=True,
                            help="seconds of stream to record")
        parser.add_argument("--out", required=True, help="output bag folder (must not exist)")
        parser.add_argument("--rate", type=positive_float, default=10.0,
                            help="frame rate in Hz (default 10)")
        parser.add_argument("--seed", type=non_negative_int, default=0,
                            help="world generator seed")
        parser.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
        parser.add_argument("--overwrite", action="store_true",
                            help="replace an existing bag there (never a folder of other files)")

    def main(self, args: argparse.Namespace) -> int:
        """Generate the stream and write it; prints the bag summary."""
        import numpy as np

        from thinkmem_ros.playback.bag_files import write_stream
        from thinkmem_ros.world.streams import SCENARIOS, generate_stream

        if args.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {args.scenario!r}; "
                             f"expected one of {sorted(SCENARIOS)}")
        stream = generate_stream(args.scenario, args.duration, args.rate,
                                 np.random.default_rng(args.seed))
        info = write_stream(stream, Path(args.out), storage=args.storage,
                            overwrite=args.overwrite)
        print_info(info)
        return 0


class PlayVerb:
    """Republish any rosbag2 bag (MCAP or sqlite3) into ROS with the recorded timing."""

    NAME = "play"
    HELP = "play a rosbag2 bag into ROS (like ros2 bag play)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the ``ros2 bag play`` options this player supports."""
        parser.add_argument("bag", help="rosbag2 folder, a lone .mcap or .db3 file, "
                                         "or a ROS 1 .bag")
        parser.add_argument("--rate", type=positive_float, default=1.0,
                            help="playback speed factor (default 1.0)")
        parser.add_argument("--loop", action="store_true", help="repeat until interrupted")
        parser.add_argument("--clock", type=positive_float, nargs="?", const=40.0,
                            default=None, metavar="HZ",
                            help="publish /clock (the bag time reached) HZ times per "
                            "wall-clock second, whatever --rate, as ros2 bag play "
                            "(default 40 Hz when given)")
        parser.add_argument("--topics", nargs="+", default=None, help="only these topics")
        parser.add_argument("--start-offset", type=non_negative_float, default=0.0,
                            help="skip this many seconds from the start of the bag")
        parser.add_argument("--delay", type=non_negative_float, default=0.0,
                            help="wait this many seconds before publishing")
        parser.add_argument("--wait-for-subscribers", type=non_negative_float, default=0.0,
                            metavar="S", help="first wait up to S seconds until every played "
                            "topic has a subscriber (nothing lost to discovery)")
        parser.add_argument("--namespace", default="", metavar="NS",
                            help="publish the recorded absolute topics under /NS (not "
                            "/clock), for a node launched with namespace:=NS")
        parser.add_argument("--skip-unknown", action="store_true",
                            help="leave out topics whose message type is not installed "
                            "here (one warning names them) instead of refusing to play")

    def main(self, args: argparse.Namespace) -> int:
        """Play and report how many messages went out; 130 after Ctrl-C, 0 after SIGTERM."""
        from thinkmem_ros.playback.player import PlayConfig, play_bag

        config = PlayConfig(rate=args.rate, loop=args.loop, clock_hz=args.clock,
                            topics=tuple(args.topics) if args.topics else None,
                            start_offset_s=args.start_offset, delay_s=args.delay,
                            wait_for_subscribers_s=args.wait_for_subscribers,
                            namespace=args.namespace, skip_unknown=args.skip_unknown)
        stats = play_bag(Path(args.bag), config)  # the player warns once of skipped topics
        state = "stopped" if stats.stopped else "done"
        print(f"{state}: published {stats.published} messages in {stats.loops} pass(es), "
              f"{stats.clock_ticks} /clock ticks", flush=True)
        return 130 if stats.signal == signal.SIGINT else 0


class InfoVerb:
    """Print what a bag holds (like ``ros2 bag info``)."""

    NAME = "info"
    HELP = "print storage, duration and topics of a bag"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Only the bag folder."""
        parser.add_argument("bag", help="rosbag2 folder, a lone .mcap or .db3 file, "
                                         "or a ROS 1 .bag")

    def main(self, args: argparse.Namespace) -> int:
        """Print the summary, once a pass over the bag has confirmed its metadata."""
        from thinkmem_ros.playback.bag_files import checked_bag_info

        print_info(checked_bag_info(Path(args.bag)))
        return 0


class ConvertVerb:
    """Convert a ROS 1 bag file into a rosbag2 folder (``rosbags``' converter)."""

    NAME = "convert"
    HELP = "convert a ROS 1 .bag file into a rosbag2 folder"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Input bag, output folder, storage."""
        parser.add_argument("bag", help="ROS 1 .bag file")
        parser.add_argument("out", help="output rosbag2 folder (must not exist)")
        parser.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
        parser.add_argument("--overwrite", action="store_true",
                            help="replace an existing bag there (never a folder of other files)")

    def main(self, args: argparse.Namespace) -> int:
        """Convert and print the new bag's summary."""
        from thinkmem_ros.playback.bag_files import convert_ros1

        info = convert_ros1(Path(args.bag), Path(args.out), storage=args.storage,
                            overwrite=args.overwrite)
        print_info(info)
        return 0


VERBS = {verb.NAME: verb for verb in (WriteVerb(), PlayVerb(), InfoVerb(), ConvertVerb())}


def print_info(info) -> None:
    """Print a ``ros2 bag info``-like table."""
    print(f"bag:      {info.path}\nstorage:  {info.storage}\n"
          f"duration: {info.duration_s:.3f} s\nmessages: {info.message_count}")
    for topic, (msgtype, count) in sorted(info.topics.items()):
        for kind, n in sorted(info.mixed.get(topic, {msgtype: count}).items()):
            print(f"  {topic:<32} {kind:<32} {n}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One sub-parser per bag verb."""
    sub = parser.add_subparsers(dest="bag_verb", metavar="BAG_VERB")
    sub.required = True
    for verb in VERBS.values():
        verb.add_arguments(sub.add_parser(verb.NAME, help=verb.HELP, description=verb.HELP))


def main(args: argparse.Namespace) -> int:
    """Run the chosen verb; bad input and bag errors exit 1 with one line on stderr.

    One line even when the reason spans several (a malformed metadata.yaml's YAML error).
    """
    from thinkmem_ros.playback.bag_files import BagError

    try:
        return VERBS[args.bag_verb].main(args)
    except BrokenPipeError:
        raise  # the reader of stdout went away: the CLI exits quietly
    except (BagError, ValueError, OSError) as exc:
        print(f"thinkmem bag {args.bag_verb}: error: {one_line(exc)}", file=sys.stderr)
        return 1
