"""``thinkmem demo``: the main job end to end (what ``make demo`` runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .bag import non_negative_float, positive_float

HELP = "run the main job end to end (bag -> node -> activations -> report)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Demo options; defaults give the few-minute run ``make demo`` promises."""
    parser.add_argument("--out", default="demo_output", help="output folder (default demo_output)")
    parser.add_argument("--scenario", default="mixed", help="world scenario (default mixed)")
    parser.add_argument("--duration", type=positive_float, default=75.0,
                        help="seconds of stream (played in real time; default 75)")
    parser.add_argument("--rate", type=non_negative_float, default=0.0,
                        help="frame rate in Hz (default: the bundle's)")
    parser.add_argument("--seed", type=int, default=7, help="world generator seed")
    parser.add_argument("--bundle", default=None, help="model bundle folder (default: shipped)")
    parser.add_argument("--offline", action="store_true",
                        help="no ROS: run the policy runtime over the stream's windows directly")
    parser.add_argument("--trigger", choices=("timer", "samples"), default="timer",
                        help="the node's frame_trigger (default timer)")
    parser.add_argument("--quiet", action="store_true", help="no live display")


def main(args: argparse.Namespace) -> int:
    """Run the demo; a failed step exits 1 with its reason."""
    from ..bag import BagError
    from ..bundle import BundleError
    from ..demo import DemoConfig, run_demo

    try:
        config = DemoConfig(out_dir=Path(args.out), scenario=args.scenario,
                            duration_s=args.duration, rate_hz=args.rate, seed=args.seed,
                            bundle=Path(args.bundle) if args.bundle else None,
                            offline=args.offline, frame_trigger=args.trigger, quiet=args.quiet)
        summary = run_demo(config)
    except (ValueError, BundleError, BagError, RuntimeError, FileNotFoundError) as exc:
        print(f"thinkmem demo: error: {exc}", file=sys.stderr)
        return 1
    micro = summary["activation"]["micro"]
    print(f"micro precision {micro['precision']:.3f} recall {micro['recall']:.3f} "
          f"F1 {micro['f1']:.3f}; {summary['total_s']:.1f} s; {summary['summary_json']}")
    return 0
