r"""``thinkmem train``: generate world streams, train a policy and export it as a bundle.

The shipped default bundle ``models/default`` is reproduced by exactly::

    thinkmem train --scenario mixed --duration 900 --streams 8 --stride 3 --rate 10 \
        --window 32 --preset default --epochs 16 --batch-size 256 --seed 0 --out models/default

Training streams and the held-out evaluation stream come from independent child
generators of ``--seed``; the held-out micro-F1 (computed through ONNX Runtime, the path
the robot uses) is written to ``bundle.json`` under ``metrics.held_out``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

from thinkmem_ros.world.recipe import RecipeError, StreamRecipe

HELP = "train a policy and export it as a model bundle"

REPRODUCE_DEFAULT = (
    "thinkmem train --scenario mixed --duration 900 --streams 8 --stride 3 --rate 10 "
    "--window 32 --preset default --epochs 16 --batch-size 256 --seed 0 --out models/default")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``thinkmem train``: the data recipe, then training (defaults: models/default)."""
    parser.epilog = f"models/default is reproduced by: {REPRODUCE_DEFAULT}"
    StreamRecipe.add_arguments(parser)
    parser.add_argument("--test-duration", type=float, default=600.0,
                        help="seconds of the held-out evaluation stream (0 = none)")
    parser.add_argument("--preset", default="default", help="policy preset (default, paper)")
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--patience", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for training")
    parser.add_argument("--model-version", type=int, default=1)
    parser.add_argument("--out", default="models/default", help="bundle folder to write")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def main(args: argparse.Namespace) -> int:
    """Generate, train, export, evaluate the exported bundle on a held-out stream."""
    import torch

    from thinkmem_ros.policy.bundle import write_bundle
    from thinkmem_ros.policy.training.export import build_manifest, export_bundle
    from thinkmem_ros.policy.training.train import train_policy

    if args.streams < 1:
        raise SystemExit(f"--streams must be >= 1, got {args.streams}")
    torch.set_num_threads(args.threads)
    try:
        recipe = StreamRecipe.from_args(args)
    except RecipeError as exc:
        raise SystemExit(str(exc)) from None
    data = recipe.windows()
    print(f"training on {len(data)} situations from {args.streams} x {args.duration:g} s "
          f"of {args.scenario!r} at {args.rate:g} Hz", file=sys.stderr)
    start = time.perf_counter()
    trained = train_policy(data, args.preset, seed=args.seed, epochs=args.epochs,
                           batch_size=args.batch_size, lr=args.lr, patience=args.patience,
                           progress=not args.no_progress)
    wall = time.perf_counter() - start
    command = "thinkmem train " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if sys.argv[1:2] == ["train"] else REPRODUCE_DEFAULT
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


def held_out_metrics(bundle, args: argparse.Namespace, rng) -> dict:
    """Micro and per-label F1 of the exported ONNX bundle on a fresh held-out stream."""
    import numpy as np

    from thinkmem_ros.core.metrics import micro_scores
    from thinkmem_ros.policy.runtime import PolicyRuntime
    from thinkmem_ros.world.streams import generate_stream, stream_windows

    stream = generate_stream(args.scenario, args.test_duration, args.rate, rng)
    test = stream_windows(stream, args.window, max_events=args.max_events)
    runtime = PolicyRuntime(bundle)
    probs = np.concatenate([runtime.predict(test.signals[i:i + 1024], test.mask[i:i + 1024],
                                            test.events[i:i + 1024]).probabilities
                            for i in range(0, len(test), 1024)])
    predicted = probs >= runtime.thresholds
    scores = micro_scores(test.labels, predicted)
    per_label = {name: micro_scores(test.labels[:, j], predicted[:, j])["f1"]
                 for j, name in enumerate(test.label_names)}
    print(f"held-out micro-F1 {scores['f1']:.4f} (precision {scores['precision']:.4f}, "
          f"recall {scores['recall']:.4f}) on {len(test)} situations", file=sys.stderr)
    return {"scenario": args.scenario, "duration_s": args.test_duration,
            "situations": len(test), **{f"micro_{k}": v for k, v in scores.items()},
            "per_label_f1": per_label}
