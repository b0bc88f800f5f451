"""``thinkmem bench NAME``: run one benchmark, print its table, write JSON and PNG."""

from __future__ import annotations

import argparse
import inspect
import json

from thinkmem_ros.bench import BENCHMARKS, MAX_SEEDS, load
from thinkmem_ros.commands import check_output, check_plot, json_report

HELP = "run a benchmark and write its JSON (and PNG)"
SEEDS, QUICK_SEEDS = 5, 2
"""Seeds when --seeds is not given; a benchmark's own ``DEFAULT_SEEDS``/``QUICK_SEEDS``
win (``real``: 3 and 1, what its published figures used)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments shared by every benchmark (the README's Benchmarks section)."""
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="benchmark to run")
    parser.add_argument("--quick", action="store_true",
                        help="fewer seeds/epochs/queries, same x values (a few minutes)")
    parser.add_argument("--seeds", type=int, default=None,
                        help=f"number of seeds (default {SEEDS}, or {QUICK_SEEDS} with "
                             "--quick; real: 3, or 1)")
    parser.add_argument("--json", dest="json_path", default=None, help="write results here")
    parser.add_argument("--plot", dest="plot_path", default=None, help="write a PNG here")
    parser.add_argument("--bundle", default=None,
                        help="measure this bundle instead of models/default (benchmarks "
                             "that run the robot's policy: exp1, latency, node, rounds)")
    parser.add_argument("--preset", default=None,
                        help="train the policy with this preset (benchmarks that train it: "
                             "exp2, exp3, exp5), e.g. streaming-restart")




def main(args: argparse.Namespace) -> int:
    """Run ``args.name`` and report; exit code 0 even when a target is missed (it is data)."""
    from thinkmem_ros.bench.common import finish_report

    if args.seeds is not None and not 1 <= args.seeds <= MAX_SEEDS:
        raise SystemExit(f"--seeds must be in [1, {MAX_SEEDS}], got {args.seeds}")
    if args.json_path:  # written after a run of minutes: refuse an unwritable one now
        check_output(args.json_path, "--json", replaces=json_report("experiment"))
    if args.plot_path:  # and a format matplotlib cannot save
        check_plot(args.plot_path, "--plot")
    module = load(args.name)
    if args.seeds is not None and not getattr(module, "SEEDS_APPLY", True):
        raise SystemExit(f"bench {args.name}: --seeds does not apply (it runs each case "
                         "once); leave it out")
    seeds = _seeds(module, args)
    extra = {}
    if args.bundle is not None:
        extra["bundle"] = _bundle_arg(args.name, module, args.bundle)
    if args.preset is not None:
        extra["preset"] = _preset_arg(args.name, module, args.preset)
    result = module.run(quick=args.quick, seeds=seeds, **extra)
    report = finish_report(result, name=args.name, quick=args.quick, seeds=seeds,
                           threads=result.pop("threads", 1), json_path=args.json_path)
    if args.plot_path:
        module.plot(report, args.plot_path)
    print(json.dumps({"experiment": report["experiment"], "results": report["results"]},
                     indent=2))
    return 0


def _seeds(module, args: argparse.Namespace) -> int:
    """``--seeds``, else the benchmark's default (its own where it has one).

    Why the module's: ``bench real`` was passed 5 (the shared default) where its published
    figures and its ``run`` used 3, and its report's ``seeds`` then said what the run was
    given, not what the README cites.
    """
    if args.seeds is not None:
        return args.seeds
    if args.quick:
        return getattr(module, "QUICK_SEEDS", QUICK_SEEDS)
    return getattr(module, "DEFAULT_SEEDS", SEEDS)


def _bundle_arg(name: str, module, path: str) -> str:
    """``path`` when ``name`` can measure a given bundle and it loads; else one line, exit 1.

    Loaded the way the node loads it (``load_policy``: ONNX Runtime plus the load-time test
    inference), not only its manifest read: a model whose sha256 matches but that ONNX
    Runtime cannot load or run would otherwise fail once the benchmark has started.
    """
    from thinkmem_ros.policy.bundle import BundleError
    from thinkmem_ros.robot.hotswap import load_policy

    if "bundle" not in inspect.signature(module.run).parameters:
        raise SystemExit(f"{name} does not take --bundle (it trains or builds what it "
                         "measures)")
    try:
        load_policy(path, threads=1)
    except (BundleError, FileNotFoundError, OSError, ValueError) as exc:
        raise SystemExit(f"--bundle {path}: {exc}") from None
    return path


def _preset_arg(name: str, module, preset: str) -> str:
    """``preset`` when ``name`` trains the policy and the preset exists; else one line, exit 1."""
    from thinkmem_ros.policy.config import PRESETS
    from thinkmem_ros.policy.training.train import STREAMING_PRESETS

    if "preset" not in inspect.signature(module.run).parameters:
        raise SystemExit(f"{name} does not take --preset (it does not train the policy "
                         "it measures)")
    known = sorted({*PRESETS, *STREAMING_PRESETS})
    if preset not in known:
        raise SystemExit(f"--preset {preset!r}: unknown; choose one of {', '.join(known)}")
    return preset
