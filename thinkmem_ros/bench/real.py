"""A real robot's recording end to end, and signal sets on the synthetic world.

Reproduce: ``thinkmem bench real [--quick] --json bench_results/real.json --plot real.png``
(from a checkout: the recording lives in ``test/data/real``).

Part 1, the real recording (``test/data/real/husky_outdoor.bag``, a Clearpath Husky's
outdoor drive from robot_localization's tests, BSD-3-Clause; see LICENSE.md there): the
signals are read through ``husky_params.yaml`` (the node's adapters), resampled the
node's way at 10 Hz and labelled by ``husky_rules.yaml`` (written before any model was
trained on the recording). A bundle is trained on the first 70 % of the drive, with the
relabelled copies ``thinkmem train --bag`` adds by default (``core.rule_augment``), and
played on the last 30 % through the node's SituationBuffer and ONNX runtime:

- ``results.f1_holdout`` / ``results.macro_f1_holdout``: micro / macro F1 against the
  rules on the last 30 % (mean over seeds; ``*_std`` beside);
- ``results.current_state_f1_holdout``: the Current-State-Only baseline (the same policy
  shown only the last frame) trained and scored on the same split;
- ``results.label_positive_fraction``: per label, the positive share in each split;
- ``results.signals`` (name -> unit, topic, rate), ``results.duration_s``,
  ``results.source``.

Part 2, signal sets (synthetic ``mixed`` world): a bundle trained with signal-drop
augmentation is scored on a held-out stream with every signal present and then with
each signal absent by design (masked for the whole stream, as a robot without that
sensor fills its windows). ``results.absent_signal_f1_drop`` is the worst signal's loss:
micro-F1 with all present minus micro-F1 with that signal absent (positive = worse);
``results.absent_signal_f1_drop_per_signal`` has each signal, and
``results.absent_signal_f1_drop_shipped`` the same measure for the shipped default
bundle (trained without augmentation) on the same stream.
``results.absent_signal_f1_drop_trained_without`` is the loss of a bundle trained for
the robot that never has the worst signal (``absent_signal_f1_trained_without``): what
no training can recover, because the labels need that signal; per label in
``absent_signal_f1_drop_per_label``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from thinkmem_ros.core.metrics import micro_scores
from thinkmem_ros.core.paths import find_data

RECORDING = "test/data/real/husky_outdoor.bag"
PARAMS = "test/data/real/husky_params.yaml"
RULES = "test/data/real/husky_rules.yaml"
SOURCE = ("robot_localization test/test1.bag (cra-ros-pkg/robot_localization, commit "
          "70b25e4c): Clearpath Husky outdoor drive, 2015-05-21, ROS 1 bag, BSD-3-Clause")
TRAIN_FRACTION = 0.7
WINDOW = 32
SIGNAL_DROP = 0.15
DEFAULT_SEEDS = 3
"""Seeds when none are given: what ``docs/results/real.json`` and the README's figure used
(``thinkmem bench`` reads it, where the other benchmarks run 5)."""
QUICK_SEEDS = 1
"""Seeds with ``--quick`` when none are given (the others run 2)."""


def real_recording(seeds: int, *, min_steps: int, bag: str | Path | None = None,
                   params: str | Path | None = None, rules_path: str | Path | None = None,
                   baseline: bool = True, augment_copies: int | None = None,
                   tick=None) -> dict:
    """Part 1: train on the first 70 % of the recording, score on the rest (see module)."""
    from thinkmem_ros.baselines.current_state import CurrentStateOnly
    from thinkmem_ros.core.label_rules import load_rules
    from thinkmem_ros.core.rule_augment import AugmentConfig
    from thinkmem_ros.playback.recording import (
        load_signal_map,
        read_recording,
        read_samples,
        recording_windows,
        score_recording,
        split_stream,
        training_windows,
    )
    from thinkmem_ros.policy.training.recording import fit_bundle

    bag = Path(bag) if bag else find_data(RECORDING)
    signal_map = load_signal_map(params or find_data(PARAMS))
    rules = load_rules(rules_path or find_data(RULES), signal_map.names)
    rate = signal_map.frame_rate_hz or 10.0
    stream = read_recording(bag, signal_map, rate, rules=rules)
    head, tail = split_stream(stream, TRAIN_FRACTION)
    train = recording_windows(head, WINDOW)  # the baseline's: the drive as recorded
    test = recording_windows(tail, WINDOW)
    samples = read_samples(bag, signal_map)
    augment = AugmentConfig() if augment_copies is None else AugmentConfig(copies=augment_copies)
    f1, macro, current, per_label, wall = [], [], [], [], []
    for seed in range(seeds):
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="thinkmem-real-") as scratch:
            data = training_windows(head, WINDOW, rules=rules, augment=augment, seed=seed)
            bundle, _ = fit_bundle(data, Path(scratch) / "bundle", frame_rate_hz=rate,
                                   units=signal_map.units, seed=seed, min_steps=min_steps)
            scores = score_recording(bundle, tail, stale_after_s=signal_map.stale_after_s)
        wall.append(time.perf_counter() - start)
        if tick:
            tick(f"recording: seed {seed} scored")
        f1.append(scores["f1"])
        macro.append(scores["macro_f1"])
        per_label.append(scores["per_label_f1"])
        if baseline:
            model = CurrentStateOnly(seed=seed).fit(train)
            current.append(micro_scores(test.labels, model.predict(test))["f1"])
    positive = {name: {"first_70": float(head.labels[:, j].mean()),
                       "last_30": float(tail.labels[:, j].mean())}
                for j, name in enumerate(stream.label_names)}
    results = {
        "f1_holdout": float(np.mean(f1)), "f1_holdout_std": float(np.std(f1)),
        "macro_f1_holdout": float(np.mean(macro)), "macro_f1_holdout_std": float(np.std(macro)),
        "per_label_f1_holdout": {name: float(np.mean([p[name] for p in per_label]))
                                 for name in stream.label_names},
        "label_positive_fraction": positive,
        "signals": {name: {"unit": b.unit, "topic": b.topic, "type": b.msg_type,
                           "rate_hz": samples.rate_hz(name)}
                    for name, b in signal_map.bindings.items()},
        "duration_s": float(samples.duration_s), "source": SOURCE,
        "frames": {"first_70": int(head.values.shape[0]), "last_30": int(tail.values.shape[0])},
        "train_windows": len(train), "augment_copies": augment.copies,
        "train_wall_s": float(np.mean(wall)),
    }
    if current:
        results["current_state_f1_holdout"] = float(np.mean(current))
        results["current_state_f1_holdout_std"] = float(np.std(current))
    return results


def absent_signals(quick: bool, seed: int = 0, *, drop: float = SIGNAL_DROP,
                   tick=None) -> dict:
    """Part 2: per-signal micro-F1 loss with the signal absent by design (see module)."""
    from thinkmem_ros.core.paths import default_bundle
    from thinkmem_ros.policy.runtime import PolicyRuntime
    from thinkmem_ros.policy.training.train import predict_proba, train_policy
    from thinkmem_ros.world.recipe import StreamRecipe
    from thinkmem_ros.world.streams import generate_stream, stream_windows

    recipe = StreamRecipe(duration=300.0 if quick else 900.0, streams=4 if quick else 8,
                          seed=seed)
    data = recipe.windows()
    start = time.perf_counter()
    trained = train_policy(data, "default", seed=seed, epochs=8 if quick else 16,
                           batch_size=256, patience=4, progress=False, signal_drop=drop)
    wall = time.perf_counter() - start
    if tick:
        tick("absent signals: signal-drop bundle trained")
    stream = generate_stream("mixed", 300.0 if quick else 600.0, recipe.rate,
                             recipe.rng_children()[-1])
    test = stream_windows(stream, recipe.window, max_events=recipe.max_events)

    def scores(predict, data=test) -> dict[str, float]:
        out = {}
        for j in [None, *range(len(data.signal_names))]:
            view = data if j is None else _without(data, j)
            probs, tau = predict(view.signals, view.mask, view.events)
            name = "all" if j is None else data.signal_names[j]
            out[name] = micro_scores(data.labels, probs >= tau)["f1"]
        return out

    def trained_predict(signals, mask, events):
        view = test.subset(np.arange(len(test)))
        view.signals, view.mask = signals, mask
        return predict_proba(trained, view), trained.threshold_array

    shipped = PolicyRuntime(default_bundle())
    # The shipped bundle is scored on windows of its own K (a streaming one: replayed from
    # its reset state over K frames, the span its restart schedule guarantees).
    shipped_test = stream_windows(stream, shipped.window, max_events=shipped.max_events)

    def shipped_predict(signals, mask, events):
        probs = np.concatenate([shipped.predict(signals[i:i + 1024], mask[i:i + 1024],
                                                events[i:i + 1024]).probabilities
                                for i in range(0, len(signals), 1024)])
        return probs, shipped.thresholds

    ours = scores(trained_predict)
    theirs = scores(shipped_predict, shipped_test)
    drops = {name: ours["all"] - f for name, f in ours.items() if name != "all"}
    drops_shipped = {name: theirs["all"] - f for name, f in theirs.items() if name != "all"}
    worst = max(drops, key=drops.get)
    if tick:
        tick(f"absent signals: scored, training without {worst}")
    bound = information_bound(data, test, worst, seed=seed, epochs=8 if quick else 16)
    if tick:
        tick("absent signals: done")
    return {**bound, "absent_signal_f1_drop_trained_without":
            float(ours["all"] - bound["absent_signal_f1_trained_without"]),
            "absent_signal_f1_drop_per_label": per_label_drop(trained, test, worst),
            "absent_signal_f1_drop": float(drops[worst]), "absent_signal_worst": worst,
            "absent_signal_f1_drop_per_signal": drops,
            "absent_signal_f1_all_present": float(ours["all"]),
            "absent_signal_f1_drop_shipped": float(max(drops_shipped.values())),
            "absent_signal_f1_drop_shipped_per_signal": drops_shipped,
            "absent_signal_shipped_f1_all_present": float(theirs["all"]),
            "absent_signal_signal_drop": drop, "absent_signal_train_wall_s": wall,
            "absent_signal_train_situations": len(data)}


def _without(data, column: int):
    """A copy of ``data`` with signal ``column`` absent by design in every row."""
    view = data.subset(np.arange(len(data)))  # fancy indexing: arrays are copies
    view.mask[:, :, column] = 0.0
    view.signals[:, :, column] = 0.0
    return view


def per_label_drop(trained, test, signal: str) -> dict[str, float]:
    """Per label: F1 with every signal present minus F1 with ``signal`` absent."""
    from thinkmem_ros.policy.training.train import predict_proba

    tau = trained.threshold_array
    full = predict_proba(trained, test) >= tau
    absent = predict_proba(trained, _without(test, test.signal_names.index(signal))) >= tau
    return {name: float(micro_scores(test.labels[:, j], full[:, j])["f1"]
                        - micro_scores(test.labels[:, j], absent[:, j])["f1"])
            for j, name in enumerate(test.label_names)}


def information_bound(data, test, signal: str, *, seed: int, epochs: int) -> dict:
    """A bundle trained for the robot that never has ``signal``, scored without it.

    What a policy can do without a sensor is bounded by what the other signals say about
    the labels: a label defined by the missing signal alone cannot be recovered by any
    training. This bundle is that robot's best case; the signal-drop bundle's loss beyond
    it is what the augmentation failed to learn, the rest is information the robot lacks.
    """
    from thinkmem_ros.policy.training.train import predict_proba, train_policy

    column = test.signal_names.index(signal)
    trained = train_policy(_without(data, column), "default", seed=seed, epochs=epochs,
                           batch_size=256, patience=4, progress=False)
    probs = predict_proba(trained, _without(test, column))
    return {"absent_signal_f1_trained_without": float(
        micro_scores(test.labels, probs >= trained.threshold_array)["f1"]),
        "absent_signal_trained_without_signal": signal}


def run(quick: bool = False, seeds: int | None = None) -> dict:
    """Both parts; quick: fewer steps on the recording, a smaller synthetic set.

    ``seeds`` (None: ``DEFAULT_SEEDS``, ``QUICK_SEEDS`` with ``quick``) is honoured with
    ``quick`` too, as the other benchmarks honour it: it used to be forced to 1 there, so
    ``--quick --seeds 5`` ran one seed and said nothing.
    """
    from thinkmem_ros.bench.common import bench_progress

    seeds = max(1, seeds if seeds is not None else QUICK_SEEDS if quick else DEFAULT_SEEDS)
    with bench_progress() as bar:
        task = bar.add_task("real: training on the recording", total=seeds + 3)

        def tick(description: str) -> None:
            bar.update(task, advance=1, description=description)

        results = real_recording(seeds, min_steps=800 if quick else 2000, tick=tick)
        results.update(absent_signals(quick, tick=tick))
    return {"experiment": "real", "metric": "micro_f1",
            "config": {"quick": quick, "seeds": seeds, "train_fraction": TRAIN_FRACTION,
                       "window": WINDOW, "signal_drop": SIGNAL_DROP,
                       "recording": RECORDING, "params": PARAMS, "rules": RULES},
            "results": results,
            "curves": {"per_label_f1_holdout": results["per_label_f1_holdout"],
                       "absent_signal_f1_drop_per_signal":
                           results["absent_signal_f1_drop_per_signal"]},
            "mean_std": {"f1_holdout": {"mean": results["f1_holdout"],
                                        "std": results["f1_holdout_std"]}}}


def plot(result: dict, path: str | Path) -> None:
    """Per-label hold-out F1 on the recording, and per-signal absent-signal loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = result["results"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = list(r["per_label_f1_holdout"])
    left.bar(labels, [r["per_label_f1_holdout"][k] for k in labels], color="tab:blue")
    left.axhline(r["f1_holdout"], color="k", ls="--", label=f"micro {r['f1_holdout']:.3f}")
    if "current_state_f1_holdout" in r:
        left.axhline(r["current_state_f1_holdout"], color="tab:red", ls=":",
                     label=f"current-state {r['current_state_f1_holdout']:.3f}")
    left.set_ylim(0, 1.05)
    left.set_ylabel("F1 on the last 30 %")
    left.set_title("real recording (Husky outdoor drive)")
    left.tick_params(axis="x", rotation=30)
    left.legend(loc="lower right")
    names = list(r["absent_signal_f1_drop_per_signal"])
    x = np.arange(len(names))
    right.bar(x - 0.2, [r["absent_signal_f1_drop_per_signal"][n] for n in names], 0.4,
              label="trained with signal drop")
    right.bar(x + 0.2, [r["absent_signal_f1_drop_shipped_per_signal"][n] for n in names], 0.4,
              label="shipped default bundle")
    right.axhline(0.01, color="k", ls="--", lw=0.8)
    right.set_xticks(x, names, rotation=30)
    right.set_ylabel("micro-F1 loss with the signal absent")
    right.set_title("synthetic mixed world: one signal absent by design")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
