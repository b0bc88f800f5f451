"""``thinkmem demo``: the main job end to end (what ``make demo`` runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from thinkmem_ros.commands import check_output, one_line
from thinkmem_ros.commands.bag import non_negative_float, positive_float
from thinkmem_ros.core.arguments import non_negative_int

HELP = ("run the main job end to end (bag -> node -> activations -> one consolidation round "
        "-> report)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Demo options; defaults give the few-minute run ``make demo`` promises."""
    parser.add_argument("--out", default="demo_output",
                        help="output folder (default demo_output); its bag, bag_after, keys, "
                        "consolidator and node_state are remade each run, and any of them the "
                        "demo did not make (no .thinkmem-demo file in it) refuses the run")
    parser.add_argument("--scenario", default="mixed", help="world scenario (default mixed)")
    parser.add_argument("--duration", type=positive_float, default=288.0,
                        help="seconds of the (before) stream, played in real time; default 288")
    parser.add_argument("--rate", type=non_negative_float, default=0.0,
                        help="frame rate in Hz (default: the bundle's)")
    parser.add_argument("--seed", type=non_negative_int, default=7, help="world generator seed")
    parser.add_argument("--bundle", default=None, help="model bundle folder (default: shipped)")
    parser.add_argument("--offline", action="store_true",
                        help="no ROS: run the policy runtime over the stream's windows directly")
    parser.add_argument("--trigger", choices=("timer", "samples"), default=None,
                        help="the node's frame_trigger (default timer; not with --offline, "
                        "which runs no node)")
    parser.add_argument("--quiet", action="store_true", help="no live display")
    parser.add_argument("--no-consolidation", action="store_true",
                        help="skip the consolidation round (one bag, the bundle as shipped)")
    parser.add_argument("--missions", type=int, default=None,
                        help="episodes of the before stream with the rule's evidence, for "
                        "discovery (default 16)")
    parser.add_argument("--plain-missions", type=int, default=None,
                        help="more episodes of the before stream without any (default 8)")
    parser.add_argument("--after-duration", type=positive_float, default=None,
                        help="seconds of the after stream (default 96)")
    parser.add_argument("--after-missions", type=int, default=None,
                        help="episodes of the after stream (default 8)")
    parser.add_argument("--epochs", type=int, default=None,  # = DemoConfig.retrain_epochs
                        help="retraining epochs of the round (default 15)")
    parser.add_argument("--lr", type=float, default=None,  # = DemoConfig.retrain_lr
                        help="retraining peak learning rate of what the round adds "
                        "(default 4e-3; the running bundle's weights move at base_lr)")


_ROUND_FLAGS = {"missions": "--missions", "plain_missions": "--plain-missions",
                "after_duration_s": "--after-duration", "after_missions": "--after-missions",
                "retrain_epochs": "--epochs", "retrain_lr": "--lr"}


def main(args: argparse.Namespace) -> int:
    """Run the demo; a failed step exits 1 with its reason on one line.

    OSError, not only FileNotFoundError: an --out that is a file is FileExistsError.
    """
    from thinkmem_ros.demo import DemoConfig, run_demo
    from thinkmem_ros.playback.bag_files import BagError
    from thinkmem_ros.policy.bundle import BundleError

    round_options = {key: value for key, value in (
        ("missions", args.missions), ("plain_missions", args.plain_missions),
        ("after_duration_s", args.after_duration), ("after_missions", args.after_missions),
        ("retrain_epochs", args.epochs), ("retrain_lr", args.lr)) if value is not None}
    if round_options and (args.offline or args.no_consolidation):
        print(f"thinkmem demo: error: {', '.join(_ROUND_FLAGS[k] for k in round_options)} "
              "shape the consolidation round, which "
              f"{'--offline' if args.offline else '--no-consolidation'} does not run",
              file=sys.stderr)
        return 2
    if args.offline and args.trigger is not None:  # it would be silently ignored
        print("thinkmem demo: error: --trigger sets the ROS node's frame_trigger, and "
              "--offline runs no node", file=sys.stderr)
        return 2
    check_output(args.out, "--out", folder=True)  # before a minute of set-up, not after
    try:
        config = DemoConfig(out_dir=Path(args.out), scenario=args.scenario,
                            duration_s=args.duration, rate_hz=args.rate, seed=args.seed,
                            bundle=Path(args.bundle) if args.bundle else None,
                            offline=args.offline, frame_trigger=args.trigger or "timer",
                            quiet=args.quiet,
                            consolidation=not args.no_consolidation, **round_options)
        summary = run_demo(config)
    except (ValueError, BundleError, BagError, RuntimeError, OSError) as exc:
        print(f"thinkmem demo: error: {one_line(exc)}", file=sys.stderr)
        return 1
    if "before" in summary:
        before, after = (summary[k]["activation"]["micro"] for k in ("before", "after"))
        rnd = summary["round"]
        version = summary["bundle"]["version"]
        bundles = (f"v{version} -> v{rnd['published_version']}" if rnd.get("swapped")
                   else f"v{version} kept")
        print(f"micro F1 before {before['f1']:.3f} -> after {after['f1']:.3f}; round "
              f"{rnd['outcome']}, {len(rnd['promoted'])} unit(s) promoted, bundle {bundles}; "
              f"{summary['total_s']:.1f} s; {summary['summary_json']}")
        if rnd["gate"]["reasons"]:
            print("gate: " + "; ".join(rnd["gate"]["reasons"]))
        return 0
    micro = summary["activation"]["micro"]
    print(f"micro precision {micro['precision']:.3f} recall {micro['recall']:.3f} "
          f"F1 {micro['f1']:.3f}; {summary['total_s']:.1f} s; {summary['summary_json']}")
    return 0
