r"""``thinkmem train``: generate world streams, train a policy and export it as a bundle.

The shipped default bundle ``models/default`` (a streaming GRU) is reproduced by::

    thinkmem train --scenario mixed --duration 900 --streams 16 --stride 3 --rate 10 \
        --window 64 --preset streaming-restart --epochs 45 --patience 8 --batch-size 256 \
        --seed 0 --out models/default

and those are the defaults of ``thinkmem train`` on the synthetic world. Training on a
robot's own recordings (``--bag``) keeps the window policy's defaults (``--preset default
--window 32 --epochs 16 --patience 4``): on the Husky recording the streaming preset scored
below it (README, "Known limitations"). ``models/window`` (the previous default) came
from ``--streams 8 --window 32 --preset default --epochs 16``.

The command recorded in ``bundle.json`` spells out every recipe option, whatever was
typed: the consolidator rebuilds the bundle's training set from it, so it must not depend
on the defaults of the version that reads it.

Training streams and the held-out evaluation stream come from independent child
generators of ``--seed``; the held-out micro-F1 (computed through ONNX Runtime, the path
the robot uses) is written to ``bundle.json`` under ``metrics.held_out``.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from thinkmem_ros.commands import check_output, one_line
from thinkmem_ros.core.rule_augment import AugmentConfig
from thinkmem_ros.policy.bundle import MAX_MODEL_VERSION
from thinkmem_ros.policy.config import DEFAULT_PRESET
from thinkmem_ros.world.recipe import StreamRecipe

HELP = "train a policy and export it as a model bundle"


class DefaultRate(float):
    """``--rate`` when none is given: a float, told apart from an explicit ``--rate`` by type.

    With --bag the params file's frame_rate_hz, when set, is the rate (the node runs the
    bundle at it); a --rate given as well must be seen to be checked against it, and an
    explicit ``--rate 10`` equals the default. ``commands.train_bags`` (which this module
    imports) reads ``is_default`` rather than the class.
    """

    is_default = True

REPRODUCE_DEFAULT = (
    "thinkmem train --scenario mixed --duration 900 --streams 16 --stride 3 --rate 10 "
    "--window 64 --preset streaming-restart --epochs 45 --patience 8 --batch-size 256 "
    "--seed 0 --out models/default")

# Options whose default depends on what is trained on (None on the command line).
WORLD_DEFAULTS = {"streams": 16, "window": 64, "preset": DEFAULT_PRESET, "epochs": 45,
                  "patience": 8}
BAG_DEFAULTS = {"streams": 8, "window": 32, "preset": "default", "epochs": 16, "patience": 4}
BAG_ONLY = {"labels": None, "params": None, "feedback_topic": None, "feedback_labels": None,
            "train_fraction": 1.0, "augment": AugmentConfig.copies, "min_steps": 1500}
"""Options that only mean something with --bag, and their defaults there. They default to
None on the command line, so one given without --bag is seen and refused: ignoring it
would train on the synthetic world as if a typo'd value had been accepted."""
WORLD_ONLY = {"scenario": "mixed", "duration": 900.0, "streams": None, "stride": 3,
              "group_seconds": 60.0, "max_events": 8, "test_duration": 600.0}
"""Options of the synthetic world that --bag does not read, and their defaults: one set to
anything else with --bag is refused, as a bag-only option without --bag is."""


def max_threads() -> int:
    """Most --threads accepted (4 per core, at least 64).

    libgomp segfaulted creating 100000 threads; past a few per core training only slows.
    """
    return max(4 * (os.cpu_count() or 1), 64)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``thinkmem train``: the data recipe, then training (defaults: models/default)."""
    parser.epilog = (f"models/default is reproduced by: {REPRODUCE_DEFAULT}. With --bag the "
                     "defaults are the window policy's: --preset default --window 32 "
                     "--epochs 16 --patience 4.")
    StreamRecipe.add_arguments(parser)
    # The recipe parser keeps its historical defaults (they read old recorded commands);
    # here they depend on --bag and are filled in by resolve_defaults.
    parser.set_defaults(streams=None, window=None)
    parser.set_defaults(rate=DefaultRate(parser.get_default("rate")))
    parser.add_argument("--test-duration", type=float, default=600.0,
                        help="seconds of the held-out evaluation stream (0 = none)")
    parser.add_argument("--preset", default=None,
                        help="policy preset: per-frame (streaming-restart: the default, "
                             "streaming, streaming-small) or window (default: the default "
                             "with --bag, paper, fast)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="training epochs (default 45; 16 with --bag)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--patience", type=int, default=None,
                        help="epochs without improvement before stopping (default 8; 4 "
                             "with --bag)")
    parser.add_argument("--threads", type=int, default=1,
                        help=f"torch threads for training (1 to {max_threads()})")
    parser.add_argument("--model-version", type=int, default=1,
                        help="the bundle's version (0 to 2^63-1; a consolidator "
                        "publishes the next ones above it, so leave room for them)")
    parser.add_argument("--out", default="models/default", help="bundle folder to write")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--signal-drop", type=float, default=0.0,
                        help="probability of masking a signal for a whole training window, "
                             "so a robot without it stays in-distribution (0 = off)")
    own = parser.add_argument_group(
        "training on your own recordings (instead of the synthetic world)")
    own.add_argument("--bag", action="append", default=[], metavar="BAG",
                     help="a recording (rosbag2 folder, .mcap or .db3 file, or ROS 1 .bag); "
                          "repeat for several")
    own.add_argument("--labels", metavar="RULES.yaml|feedback",
                     help="labelling rules (threshold, trend, co_occurrence) for --bag, or "
                          "the word 'feedback': label from the hindsight the bag recorded")
    own.add_argument("--feedback-topic", metavar="TOPIC",
                     help="with --labels feedback: the recorded feedback topic "
                          "(default /thinking/feedback)")
    own.add_argument("--feedback-labels", metavar="A,B",
                     help="with --labels feedback: train only these labels (default: every "
                          "label the feedback names)")
    own.add_argument("--params", metavar="FILE",
                     help="node parameter file whose 'signals' (topics, types, adapters) "
                          "read --bag; its frame_rate_hz, when set, overrides --rate")
    own.add_argument("--train-fraction", type=float, default=None,
                     help="train on the first fraction of each bag and score the bundle on "
                          "the rest (1 = train on everything)")
    own.add_argument("--augment", type=int, default=None, metavar="N",
                     help=f"with a rules file (default {AugmentConfig.copies}): add N copies "
                          "of each recording, time-stretched, shuffled in chunks, rescaled and "
                          "sign-flipped, relabelled by the rules (0 = off; hindsight labels "
                          "are never augmented)")
    own.add_argument("--min-steps", type=int, default=None,
                     help="floor on optimiser steps when training on --bag (default 1500)")


def main(args: argparse.Namespace) -> int:
    """Generate, train, export, evaluate the exported bundle on a held-out stream."""
    import torch

    from thinkmem_ros.policy.bundle import write_bundle
    from thinkmem_ros.policy.training.export import build_manifest, export_bundle
    from thinkmem_ros.policy.training.train import train_policy

    refuse_bag_only_options(args)
    resolve_defaults(args)
    check_options(args)
    if args.bag:
        from thinkmem_ros.commands.train_bags import main_bags

        return main_bags(args)
    check_validation_groups(args)
    torch.set_num_threads(args.threads)
    try:
        recipe = StreamRecipe.from_args(args)
        data = recipe.windows()  # an unknown --scenario, too few frames for --window
    except ValueError as exc:
        raise SystemExit(f"thinkmem train: error: {one_line(exc)}") from None
    print(f"training on {len(data)} situations from {args.streams} x {args.duration:g} s "
          f"of {args.scenario!r} at {args.rate:g} Hz", file=sys.stderr)
    start = time.perf_counter()
    try:
        trained = train_policy(data, args.preset, seed=args.seed, epochs=args.epochs,
                               batch_size=args.batch_size, lr=args.lr, patience=args.patience,
                               progress=not args.no_progress, signal_drop=args.signal_drop)
    except ValueError as exc:  # an unknown preset, too little data to split, ...
        raise SystemExit(f"thinkmem train: error: {one_line(exc)}") from None
    wall = time.perf_counter() - start
    command = recorded_command(recipe, args)
    metrics = {"validation": trained.val_metrics,
               "train": {"situations": len(data), "streams": args.streams,
                         "duration_s": args.duration, "wall_s": round(wall, 1),
                         "epochs_run": sum("epoch" in h for h in trained.history),
                         "torch_threads": args.threads}}
    extras = {"command": command, "scenario": args.scenario, "seed": args.seed}
    # Export and score in a scratch folder, then write --out once, complete with its
    # held-out metrics: a live models/default is never replaced by an unscored bundle.
    with tempfile.TemporaryDirectory(prefix="thinkmem-train-") as scratch:
        staged = export_bundle(trained, Path(scratch) / "bundle",
                               model_version=args.model_version, frame_rate_hz=args.rate,
                               metrics=metrics, extras=extras)
        if args.test_duration > 0:
            metrics["held_out"] = held_out_metrics(staged, args, recipe.rng_children()[-1])
        onnx = staged.onnx_path.read_bytes()
    # Same ONNX bytes, richer manifest: the sha256 and the graph stay as exported.
    manifest = build_manifest(trained, model_version=args.model_version,
                              frame_rate_hz=args.rate, metrics=metrics, extras=extras)
    bundle = write_bundle(args.out, onnx, manifest)
    print(f"wrote {bundle.path} (sha256 {bundle.manifest.sha256}, train {wall:.0f} s)")
    return 0


def check_options(args: argparse.Namespace) -> None:
    """Refuse bad numbers, an unknown preset and an unusable --out before any work.

    Building the training set takes seconds to minutes and training far longer: a typo
    must not wait for them (train_policy would refuse the same numbers only then).
    """
    from thinkmem_ros.policy.config import PRESETS
    from thinkmem_ros.policy.training.train import STREAMING_PRESETS

    for name, low in (("epochs", 1), ("patience", 1), ("batch_size", 1), ("streams", 1),
                      ("min_steps", 0)):
        value = getattr(args, name)
        if value is not None and value < low:  # min_steps is None without --bag
            raise SystemExit(f"--{name.replace('_', '-')} must be >= {low}, got {value}")
    for name in ("epochs", "patience", "batch_size", "streams", "min_steps", "window",
                 "max_events", "stride", "augment", "duration", "group_seconds",
                 "test_duration", "rate", "lr"):
        value = getattr(args, name, None)  # past these, numpy and torch fail mid-run
        if isinstance(value, (int, float)) and abs(value) > OPTION_MAX:
            raise SystemExit(f"--{name.replace('_', '-')} {value:g} is beyond any run this "
                             f"command can make (at most {OPTION_MAX:g})")
    if getattr(args, "seed", 0) >= 2**63:  # numpy's seeds are 64-bit
        raise SystemExit(f"--seed must be below 2^63, got {args.seed}")
    for name, low, high in (("threads", 1, max_threads()),
                            ("model_version", 0, MAX_MODEL_VERSION)):
        if not low <= getattr(args, name) <= high:
            raise SystemExit(f"--{name.replace('_', '-')} must be in [{low}, {high}], "
                             f"got {getattr(args, name)}")
    for name, ok, rule in (("lr", args.lr > 0, "> 0"), ("rate", args.rate > 0, "> 0"),
                           ("signal_drop", 0 <= args.signal_drop < 1, "in [0, 1)"),
                           ("test_duration", args.test_duration >= 0, ">= 0")):
        if not (ok and math.isfinite(getattr(args, name))):  # NaN fails every comparison
            raise SystemExit(f"--{name.replace('_', '-')} must be a finite number {rule}, "
                             f"got {getattr(args, name)}")
    known = sorted({*PRESETS, *STREAMING_PRESETS})
    if args.preset not in known:
        raise SystemExit(f"--preset {args.preset!r}: unknown; choose one of {', '.join(known)}")
    if not args.bag and 0 < args.test_duration * args.rate < args.window:
        raise SystemExit(f"--test-duration {args.test_duration:g} s at {args.rate:g} Hz is "
                         f"fewer frames than --window {args.window} (0 = no held-out stream)")
    if not args.bag:
        check_group_seconds(args.group_seconds, args.rate)
        check_data_size(args)
    check_bundle_out(args.out)


OPTION_MAX = 1e9
"""Largest number any ``train`` option takes: 10^9 streams, epochs or seconds (31 years)."""
MAX_TRAINING_BYTES = 8 << 30
"""Most memory the synthetic world's situations may take (signals, mask, events, labels):
the default run takes ~50 MB; past this the set cannot be built, let alone trained on."""


def check_data_size(args: argparse.Namespace) -> None:
    """Refuse a synthetic training set too large to build, before any of it is generated.

    Each option stayed within ``OPTION_MAX``, but their product did not: --streams 10^9
    hung spawning one generator per stream, --streams 100000 ended in a segfault or a
    MemoryError after minutes, and --max-events 1e9 in a MemoryError (an event slot
    beyond what an experience carries is never filled on a robot anyway).
    """
    from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
    from thinkmem_ros.link.experience import LIMITS

    if args.max_events > LIMITS["max_events"]:
        raise SystemExit(f"--max-events must be at most {LIMITS['max_events']} (the events "
                         f"an experience carries), got {args.max_events}")
    per_stream = args.duration * args.rate / args.stride + 1  # windows, stride apart
    situations = args.streams * per_stream + args.test_duration * args.rate  # + held out
    row = 4 * (2 * args.window * len(SIGNALS) + len(THINKING)) + 8 * (args.max_events + 1)
    if not math.isfinite(situations):  # a NaN --duration: the recipe names it
        return
    if situations * row > MAX_TRAINING_BYTES:
        raise SystemExit(
            f"--streams {args.streams} x --duration {args.duration:g} s at --rate "
            f"{args.rate:g} Hz every --stride {args.stride} frames (with --test-duration "
            f"{args.test_duration:g} s) is {situations:,.0f} situations of --window "
            f"{args.window} and --max-events {args.max_events}, about "
            f"{situations * row / 2**30:,.1f} GiB: at most {MAX_TRAINING_BYTES / 2**30:g} GiB "
            f"is built in memory; use fewer or shorter streams or a larger --stride")


def check_validation_groups(args: argparse.Namespace) -> None:
    """Refuse a world training set of one validation group, before it is built.

    The validation split holds out whole ``--group-seconds`` chunks of the streams
    (``StreamRecipe.windows``), and needs two. ``--streams 1 --duration 60`` made one:
    the data was built, then training failed with its internal hint ("Give
    SituationSet.groups or pass val_fraction=0"), which no option of this command sets.
    """
    frames = args.duration * args.rate
    if (args.streams != 1 or not math.isfinite(frames) or not frames >= 1
            or min(args.window, args.stride) < 1):
        return  # two streams are two groups; bad numbers are the recipe's to name
    n = int(round(frames))  # as generate_stream renders it
    if n < args.window:
        return  # too few frames for --window: the recipe says so
    group = int(round(args.group_seconds * args.rate))
    last_end = args.window - 1 + (n - args.window) // args.stride * args.stride
    if (args.window - 1) // group == last_end // group:
        raise SystemExit(
            f"--streams 1 x --duration {args.duration:g} s is one --group-seconds "
            f"{args.group_seconds:g} chunk, and validation holds out whole chunks: use "
            f"--streams >= 2, a --duration longer than --group-seconds, or a shorter "
            f"--group-seconds")


def check_group_seconds(seconds: float, rate: float) -> None:
    """A validation group must hold at least one frame: shorter chunks divide by zero.

    ``--group-seconds 0.01`` at 10 Hz rounded to 0 frames per group: numpy warned of a
    division by zero and every stream became one group, a validation split of nothing.
    """
    frames = seconds * rate  # the recipe rounds it; 0.5 and less round to 0
    if not (math.isfinite(frames) and frames > 0.5):
        raise SystemExit(f"--group-seconds must be a finite number of at least one frame "
                         f"({1 / rate:g} s at --rate {rate:g}), got {seconds}")


def refuse_bag_only_options(args: argparse.Namespace) -> None:
    """Exit naming options the data source would ignore without a word.

    The --bag options given without --bag (``BAG_ONLY``), or the synthetic world's set
    with --bag (``WORLD_ONLY``).
    """
    if args.bag:
        ignored = [f"--{name.replace('_', '-')}" for name, default in WORLD_ONLY.items()
                   if getattr(args, name) != default]
        if ignored:
            raise SystemExit(f"{', '.join(ignored)}: only for the synthetic world; with "
                             f"--bag the recordings are the data (their rate: --rate or "
                             f"the params file's frame_rate_hz)")
        return
    given = [f"--{name.replace('_', '-')}" for name in BAG_ONLY
             if getattr(args, name) is not None]
    if given:
        them = "it" if len(given) == 1 else "them"
        raise SystemExit(f"{', '.join(given)}: only with --bag (your recordings); "
                         f"the synthetic world has no use for {them}")


def check_bundle_out(out: str) -> None:
    """--out must be writable and, if it exists, a bundle: write_bundle replaces the folder.

    A symlink that resolves to nothing (a loop, a removed target) reads as "no such
    path" to the checks below; write_bundle refused it only after training, leaving its
    staging folder behind.
    """
    if Path(out).name in ("", ".", ".."):  # write_bundle names its staging folder after it
        raise SystemExit(f"--out {out!r}: name the bundle's folder (e.g. models/mine), not "
                         "the current folder or one above it")
    if Path(out).is_symlink() and not Path(out).exists():
        raise SystemExit(f"--out {out}: a symlink that leads nowhere (a loop or a missing "
                         "target)")
    folder = check_output(out, "--out", folder=True)
    if folder.is_dir() and any(folder.iterdir()) and not (folder / "bundle.json").is_file():
        raise SystemExit(f"--out {out}: a folder that is not a bundle; training would "
                         "replace it and everything in it")


def resolve_defaults(args: argparse.Namespace) -> None:
    """Fill the options left unset with the defaults of what is trained on (world or bags)."""
    defaults = {**BAG_DEFAULTS, **BAG_ONLY} if args.bag else WORLD_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def recorded_command(recipe: StreamRecipe, args: argparse.Namespace) -> str:
    """The ``thinkmem train`` command that reproduces this bundle, recipe spelt out.

    The consolidator reads the recipe back with its own parser defaults.
    """
    tokens = ["thinkmem", "train", *recipe.arguments(), "--preset", args.preset,
              "--epochs", str(args.epochs), "--patience", str(args.patience),
              "--batch-size", str(args.batch_size), "--lr", f"{args.lr:g}"]
    if args.signal_drop:
        tokens += ["--signal-drop", f"{args.signal_drop:g}"]
    if args.test_duration != 600.0:
        tokens += ["--test-duration", f"{args.test_duration:g}"]
    if args.model_version != 1:
        tokens += ["--model-version", str(args.model_version)]
    return " ".join(shlex.quote(t) for t in [*tokens, "--out", str(args.out)])


def streamed_probabilities(runtime, test):
    """(N, L) probabilities of a streaming runtime stepped over consecutive windows' rows.

    ``test`` holds stride-1 windows of one stream, so row t's newest frame is frame t: the
    runtime sees every frame once, in order, from the first window's replay on.
    """
    import numpy as np

    ends = np.asarray(test.meta["end_frames"])
    if len(ends) > 1 and not (np.diff(ends) == 1).all():
        raise ValueError("streamed scoring needs stride-1 windows of one stream")
    runtime.reset()
    out = np.empty((len(test), len(test.label_names)), np.float32)
    out[0] = runtime.predict_frame(test.signals[0], test.mask[0], test.events[0]
                                   ).probabilities[0]
    for i in range(1, len(test)):
        out[i] = runtime.step(test.signals[i, -1], test.mask[i, -1], test.events[i])
    return out


def held_out_metrics(bundle, args: argparse.Namespace, rng) -> dict:
    """Micro and per-label F1 of the exported ONNX bundle on a fresh held-out stream."""
    import numpy as np

    from thinkmem_ros.core.metrics import micro_scores
    from thinkmem_ros.policy.runtime import PolicyRuntime
    from thinkmem_ros.world.streams import generate_stream, stream_windows

    stream = generate_stream(args.scenario, args.test_duration, args.rate, rng)
    test = stream_windows(stream, args.window, max_events=args.max_events)
    runtime = PolicyRuntime(bundle)
    if runtime.streaming:
        # Scored the way the robot runs it: one update per frame over the whole stream,
        # never reset, read at each situation's last frame.
        probs = streamed_probabilities(runtime, test)
    else:
        probs = np.concatenate([runtime.predict(
            test.signals[i:i + 1024], test.mask[i:i + 1024],
            test.events[i:i + 1024]).probabilities for i in range(0, len(test), 1024)])
    predicted = probs >= runtime.thresholds
    scores = micro_scores(test.labels, predicted)
    per_label = {name: micro_scores(test.labels[:, j], predicted[:, j])["f1"]
                 for j, name in enumerate(test.label_names)}
    print(f"held-out micro-F1 {scores['f1']:.4f} (precision {scores['precision']:.4f}, "
          f"recall {scores['recall']:.4f}) on {len(test)} situations", file=sys.stderr)
    return {"scenario": args.scenario, "duration_s": args.test_duration,
            "situations": len(test), **{f"micro_{k}": v for k, v in scores.items()},
            "per_label_f1": per_label}
