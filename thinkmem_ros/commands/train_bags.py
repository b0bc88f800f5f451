"""``thinkmem train --bag``: a bundle for a robot's own signals from its recordings.

Each bag is read through the parameter file's signal map (adapters included) and
resampled the node's way; the rules label every frame. ``--labels feedback`` labels only
the frames the recorded hindsight judged (``playback.feedback_labels``). With
``--train-fraction`` < 1 the last part of each bag is held out and the written bundle is
scored on it the node's way (``metrics.held_out``).

Nothing is trained on data that could not be read: the signal map must pass the checks
the node (and ``thinkmem calibrate``) makes at start, every present signal needs a usable
sample in every bag, a topic may hold at most 1 % undecodable messages (fewer are skipped
with a warning; see ``recording.check_readable``), and every rules label needs a positive
frame in the training data (a label that never fires trains a head that never fires, with
a perfect-looking validation score).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import dataclass

from thinkmem_ros.commands import one_line
from thinkmem_ros.core.rule_augment import AugmentConfig


@dataclass
class _Inputs:
    """What every bag is read with: the signal map, the labels' source, the augmentation."""

    signal_map: object
    rules: object | None  # None with --labels feedback
    hindsight: object | None  # HindsightLabels with --labels feedback
    augment: AugmentConfig
    rate: float


def main_bags(args: argparse.Namespace) -> int:
    """Train, write and (with a held-out part) score a bundle from ``args.bag``."""
    import torch

    inputs = _inputs(args)
    torch.set_num_threads(args.threads)
    data, tails = _situations(args, inputs)
    print(f"training on {len(data)} situations from {len(args.bag)} recording(s) at "
          f"{inputs.rate:g} Hz; signals {list(inputs.signal_map.names)}, labels "
          f"{list(data.label_names)}", file=sys.stderr)
    bundle = _fit(args, inputs, data)
    for bag, tail in zip(args.bag, tails, strict=True) if tails else ():
        _score_held_out(args, inputs, bundle, bag, tail)
    return 0


def _inputs(args: argparse.Namespace) -> _Inputs:
    """Check the options and read the signal map and the labels' source; exit naming a fault."""
    from thinkmem_ros.commands.calibrate import _check_as_the_node_does
    from thinkmem_ros.core.label_rules import RulesError, load_rules
    from thinkmem_ros.playback.bag_files import BagError
    from thinkmem_ros.playback.feedback_labels import FeedbackConfig, HindsightLabels
    from thinkmem_ros.playback.recording import load_signal_map

    if not args.labels or not args.params:
        raise SystemExit("--bag needs --labels RULES.yaml (or --labels feedback) and --params "
                         "FILE (the signal map)")
    if args.labels != "feedback" and (args.feedback_topic or args.feedback_labels):
        raise SystemExit("--feedback-topic and --feedback-labels need --labels feedback")
    _refuse_unreadable_inputs(args)
    if not 0.0 < args.train_fraction <= 1.0:
        raise SystemExit(f"--train-fraction must be in (0, 1], got {args.train_fraction}")
    try:
        augment = AugmentConfig(copies=args.augment)
    except ValueError as exc:
        raise SystemExit(f"--augment: {one_line(exc)}") from None
    hindsight = None
    try:
        signal_map = load_signal_map(args.params)
        _check_as_the_node_does(signal_map)
        rules = None if args.labels == "feedback" else load_rules(args.labels, signal_map.names)
        if rules is None:
            hindsight = HindsightLabels(args.bag, FeedbackConfig(
                topic=args.feedback_topic or FeedbackConfig.topic,
                labels=tuple(filter(None, args.feedback_labels.split(",")))
                if args.feedback_labels else None))
    except (ValueError, RulesError, BagError) as exc:
        raise SystemExit(one_line(exc)) from None
    return _Inputs(signal_map, rules, hindsight, augment, _rate(args, signal_map))


def _rate(args: argparse.Namespace, signal_map) -> float:
    """The params file's frame_rate_hz when it sets one, else --rate; exit on a conflict.

    The node runs the bundle at the file's frame_rate_hz, so that is the rate to train
    at; an explicit --rate that differs from it was dropped without a word, leaving a
    user who asked for 20 Hz with a 10 Hz bundle.
    """
    given = not getattr(args.rate, "is_default", False)  # train.DefaultRate: not typed
    if signal_map.frame_rate_hz and given and args.rate != signal_map.frame_rate_hz:
        raise SystemExit(f"--rate {args.rate:g} Hz differs from frame_rate_hz "
                         f"{signal_map.frame_rate_hz:g} Hz in {args.params}, the rate the node "
                         f"will run the bundle at: leave --rate out, or change frame_rate_hz "
                         f"(0 lets --rate choose)")
    return float(signal_map.frame_rate_hz or args.rate)


def _refuse_unreadable_inputs(args: argparse.Namespace) -> None:
    """Exit naming a --bag, --params or --labels that is a FIFO, device or socket.

    Opening one waits for a writer for ever; this runs before anything is opened.
    """
    from thinkmem_ros.core.input_files import input_file, input_path

    try:
        for bag in args.bag:
            input_path(bag, "--bag")
        input_file(args.params, "--params")
        if args.labels != "feedback":
            input_file(args.labels, "--labels")
    except ValueError as exc:
        raise SystemExit(one_line(exc)) from None


def _situations(args: argparse.Namespace, inputs: _Inputs):
    """Every bag's training windows (and held-out tails), checked as the module says."""
    from thinkmem_ros.core.data import SituationSet

    parts, tails = [], []
    for i, bag in enumerate(args.bag):
        stream = _read_bag(bag, i, inputs)
        if args.train_fraction < 1.0:
            from thinkmem_ros.playback.recording import split_stream

            stream, tail = split_stream(stream, args.train_fraction)
            tails.append(tail)
        parts.append(_windows(args, inputs, bag, i, stream))
        silent = parts[-1].meta.get("silent_frames", 0)
        if silent:
            print(f"WARN {bag}: {silent} frames without any fresh signal (gaps in the "
                  "recording) end no training window", file=sys.stderr)
    data = SituationSet.concat(parts)
    if inputs.rules is not None:
        _refuse_labels_without_positives(data, args.labels)
        _refuse_one_stretch(data)
    if inputs.hindsight:
        print("\n".join(inputs.hindsight.report_lines()), file=sys.stderr)
        try:
            inputs.hindsight.check(len(data), len(set(data.groups.tolist())), args.window)
        except ValueError as exc:
            raise SystemExit(one_line(exc)) from None
    return data, tails


def _refuse_one_stretch(data) -> None:
    """Exit unless the training windows span two stretches a validation split can part.

    Why: training holds out whole ``GROUP_SECONDS`` stretches of the drive for early
    stopping; a short recording is one stretch, and training then stopped with the
    training loop's own ValueError about "distinct groups".
    """
    from thinkmem_ros.playback.recording import GROUP_SECONDS

    if len(set(data.groups.tolist())) < 2:
        raise SystemExit(f"the recordings' training part spans less than two "
                         f"{GROUP_SECONDS:g} s stretches ({len(data)} windows): training "
                         f"holds one out to stop early, so record at least "
                         f"{2 * GROUP_SECONDS:g} s (more with --train-fraction < 1)")


def _read_bag(bag, index: int, inputs: _Inputs):
    """One recording as a labelled stream; exit naming the bag when it cannot be used."""
    from thinkmem_ros.playback.bag_files import BagError
    from thinkmem_ros.playback.recording import check_readable, read_recording, read_samples

    try:
        samples = read_samples(bag, inputs.signal_map)
        for warning in check_readable(bag, samples, inputs.signal_map):
            print(f"WARN {warning}", file=sys.stderr)
        stream = read_recording(bag, inputs.signal_map, inputs.rate, rules=inputs.rules,
                                samples=samples)
        return inputs.hindsight.label(stream, index) if inputs.hindsight else stream
    except (BagError, ValueError) as exc:
        raise SystemExit(one_line(exc)) from None


def _windows(args: argparse.Namespace, inputs: _Inputs, bag, index: int, stream):
    """The stream's training windows: every frame by the rules, or the judged ones."""
    from thinkmem_ros.playback.feedback_labels import labelled_ends
    from thinkmem_ros.playback.recording import recording_windows, training_windows

    try:
        if inputs.hindsight:
            return recording_windows(stream, args.window, group_base=index * 1_000_000,
                                     ends=labelled_ends(stream, args.window))
        return training_windows(stream, args.window, rules=inputs.rules,
                                augment=inputs.augment, seed=args.seed,
                                group_base=index * 1_000_000)
    except ValueError as exc:
        raise SystemExit(f"{bag}: {one_line(exc)}") from None


def _refuse_labels_without_positives(data, rules_path: str) -> None:
    """Exit naming each rules label that is never, or always, positive in the windows.

    A never-positive label trains a head that never fires; its validation F1 looks perfect
    (no positive to miss) and the bundle ships it. An always-positive one is the same
    mistake the other way round (``above: -1`` on a speed): a head that always fires says
    nothing. Usually a threshold on the wrong scale or unit, or a recording that never
    shows (or never leaves) the situation.
    """
    positive = data.labels > 0.5
    for kind, names in (("never", [n for j, n in enumerate(data.label_names)
                                   if not positive[:, j].any()]),
                        ("always", [n for j, n in enumerate(data.label_names)
                                    if positive[:, j].all()])):
        if names:
            raise SystemExit(f"{rules_path}: label(s) {names} are {kind} positive in the "
                             f"{len(data)} training situations; check their rules against "
                             f"'thinkmem calibrate' (scale, unit, thresholds) or remove them")


def _fit(args: argparse.Namespace, inputs: _Inputs, data):
    """Train and write the bundle, with the command and inputs it came from recorded."""
    from thinkmem_ros.policy.training.recording import fit_bundle

    command = "thinkmem train " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if sys.argv[1:2] == ["train"] else ""
    start = time.perf_counter()
    positives = {name: float(data.labels[:, j].mean())
                 for j, name in enumerate(data.label_names)}
    hindsight = inputs.hindsight
    bundle, _trained = fit_bundle(
        data, args.out, frame_rate_hz=inputs.rate, units=inputs.signal_map.units,
        preset=args.preset, seed=args.seed, epochs=args.epochs, batch_size=args.batch_size,
        lr=args.lr, patience=args.patience, min_steps=args.min_steps,
        signal_drop=args.signal_drop, model_version=args.model_version,
        progress=not args.no_progress,
        metrics={"train": {"situations": len(data), "recordings": list(map(str, args.bag)),
                           "label_positive_fraction": positives}},
        extras={"command": command, "labels": str(args.labels), "params": str(args.params),
                **({"feedback_topic": hindsight.config.topic} if hindsight else {})})
    print(f"wrote {bundle.path} (sha256 {bundle.manifest.sha256}, train "
          f"{time.perf_counter() - start:.0f} s, signal set {bundle.manifest.signal_set[:12]})")
    return bundle


def _score_held_out(args: argparse.Namespace, inputs: _Inputs, bundle, bag, tail) -> None:
    """Print the bundle's micro- and macro-F1 on one bag's held-out last part."""
    from thinkmem_ros.playback.feedback_labels import score_labelled
    from thinkmem_ros.playback.recording import score_recording

    held = f"held-out last {1 - args.train_fraction:.0%} of {bag}"
    if inputs.hindsight:
        scores = score_labelled(bundle, tail, stale_after_s=inputs.signal_map.stale_after_s)
    else:
        scores = score_recording(bundle, tail, stale_after_s=inputs.signal_map.stale_after_s,
                                 skip_silent=True)
        if scores["silent_frames"]:
            held += (f" ({scores['silent_frames']} frames without any fresh signal not "
                     "scored)")
    if inputs.hindsight and not scores["frames"]:
        print(f"{held}: no frame with feedback to score", file=sys.stderr)
        return
    print(f"{held}: micro-F1 {scores['f1']:.4f}, macro-F1 {scores['macro_f1']:.4f} on "
          f"{scores['frames']} frames", file=sys.stderr)
