"""Training loop for the thinking policy: BCE + AdamW, group-aware split, early stopping.

Kept apart from the model (nanoGPT style). Everything random comes from one seed: torch's
generator for initialisation and dropout, a numpy ``Generator`` for the split and the batch
order, so the same data and seed give the same weights on the same machine.

Thresholds: after training, each label's tau is tuned on the validation split (the value on
a 0.1..0.9 grid with the best F1 for that label; ties go to the value nearest 0.5). A label
with no positive validation rows keeps tau = 0.5, since there is nothing to tune against.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from thinkmem_ros.core.data import SituationSet, signal_drop_mask
from thinkmem_ros.core.metrics import micro_scores
from thinkmem_ros.policy.bundle import Bundle, load_bundle
from thinkmem_ros.policy.config import PolicyConfig
from thinkmem_ros.policy.streaming_runtime import StreamingConfig
from thinkmem_ros.policy.training.model import ThinkingPolicy
from thinkmem_ros.policy.training.streaming_model import StreamingPolicy

STREAMING_PRESETS = {"streaming": {"hidden": 64}, "streaming-small": {"hidden": 48},
                     "streaming-restart": {"hidden": 64, "restart": -1}}
"""Presets of the per-frame GRU policy (streaming_model.py); the rest are window presets.

``restart: -1`` means "restart every K frames" (the data's window): two staggered states,
the answer from one that has seen K/2..K frames (``StreamingConfig.restart``)."""

TAU_GRID = np.round(np.arange(0.1, 0.91, 0.05), 2)


@dataclass
class TrainedPolicy:
    """A trained model plus everything a bundle needs to describe it."""

    model: ThinkingPolicy | StreamingPolicy
    config: PolicyConfig | StreamingConfig
    normalisation: dict[str, list[float]]
    label_names: tuple[str, ...]
    signal_names: tuple[str, ...]
    event_vocabulary: tuple[str, ...]
    thresholds: dict[str, float]
    history: list[dict] = field(default_factory=list)
    val_metrics: dict = field(default_factory=dict)
    fingerprint: str = ""
    preset: str = ""
    seed: int = 0

    @property
    def threshold_array(self) -> np.ndarray:
        """Thresholds in label order, shape (L,)."""
        return np.array([self.thresholds[name] for name in self.label_names], dtype=np.float32)


WarmStart = TrainedPolicy | Bundle | str | Path


def fingerprint(data: SituationSet) -> str:
    """sha256 over the training arrays and names: ties a bundle to the data it learned."""
    digest = hashlib.sha256()
    for array in (data.signals, data.mask, data.events, data.labels):
        digest.update(np.ascontiguousarray(array).tobytes())
    for names in (data.label_names, data.signal_names, data.event_vocabulary):
        digest.update("\x1f".join(names).encode("utf-8") + b"\x1e")
    return digest.hexdigest()


def split_by_group(groups: np.ndarray, val_fraction: float,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, val) such that no group appears on both sides."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
    rows = np.arange(len(groups))
    if val_fraction == 0.0:
        return rows, rows[:0]
    unique = rng.permutation(np.unique(groups))
    if len(unique) < 2:
        raise ValueError(
            "a validation split needs at least 2 distinct groups (episodes/components); "
            f"got {len(unique)}. Give SituationSet.groups or pass val_fraction=0")
    counts = {g: c for g, c in zip(*np.unique(groups, return_counts=True), strict=True)}
    target = val_fraction * len(groups)
    chosen, total = [], 0
    for g in unique[:-1]:  # leave at least one group for training
        if total >= target:
            break
        chosen.append(g)
        total += counts[g]
    val = np.isin(groups, chosen)
    return rows[~val], rows[val]


def signal_statistics(data: SituationSet) -> tuple[np.ndarray, np.ndarray]:
    """Per-signal mean/std over observed entries only (masked zeros would bias them)."""
    values = data.signals.reshape(-1, data.signals.shape[-1]).astype(np.float64)
    weight = data.mask.reshape(values.shape).astype(np.float64)
    count = np.maximum(weight.sum(0), 1.0)
    mean = (values * weight).sum(0) / count
    var = (((values - mean) ** 2) * weight).sum(0) / count
    std = np.sqrt(var)
    std[std < 1e-6] = 1.0
    return mean.astype(np.float32), std.astype(np.float32)


def build_model(config: PolicyConfig | StreamingConfig) -> ThinkingPolicy | StreamingPolicy:
    """The module a config describes: the per-frame GRU or the window Transformer."""
    if isinstance(config, StreamingConfig):
        return StreamingPolicy(config)
    return ThinkingPolicy(config)


def _resolve_config(data: SituationSet, config: PolicyConfig | StreamingConfig | str
                    ) -> tuple[PolicyConfig | StreamingConfig, str]:
    sizes = {"window": data.window, "n_signals": len(data.signal_names),
             "n_labels": len(data.label_names), "max_events": int(data.events.shape[1]),
             "n_event_vocab": len(data.event_vocabulary)}
    if isinstance(config, str) and config in STREAMING_PRESETS:
        preset = dict(STREAMING_PRESETS[config])
        if preset.get("restart") == -1:
            preset["restart"] = data.window
        return StreamingConfig(**sizes, **preset), config
    if isinstance(config, str):
        return PolicyConfig.from_preset(config, **sizes), config
    for key, value in sizes.items():
        if getattr(config, key) != value:
            raise ValueError(f"PolicyConfig.{key}={getattr(config, key)} does not match the "
                             f"data ({value})")
    return config, ""


ONE_CYCLE_MIN_STEPS = 20
"""Below this, a one-cycle warm-up (10 % of the steps) would be shorter than one step."""


def one_cycle(optimiser: torch.optim.Optimizer, lr: float, total_steps: int):
    """One-cycle learning rate over ``total_steps``; a constant rate for very short runs.

    ``OneCycleLR`` divides by its warm-up length, which is zero or negative below
    ``ONE_CYCLE_MIN_STEPS`` (a round with a handful of new experiences): such a run keeps
    the base rate throughout.
    """
    if total_steps < ONE_CYCLE_MIN_STEPS:
        return torch.optim.lr_scheduler.LambdaLR(optimiser, lambda _: 1.0)
    return torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=lr, total_steps=total_steps,
                                               pct_start=0.1)


def _tensors(data: SituationSet, rows: np.ndarray) -> tuple[torch.Tensor, ...]:
    return (torch.from_numpy(data.signals[rows]), torch.from_numpy(data.mask[rows]),
            torch.from_numpy(data.events[rows]), torch.from_numpy(data.labels[rows]))


def _check_data(data: SituationSet) -> None:
    if len(data) == 0:
        raise ValueError("cannot train on an empty SituationSet")
    if not np.isfinite(data.signals).all():
        raise ValueError("SituationSet.signals contain NaN/inf; masked entries must be 0")
    if data.events.min() < 0 or data.events.max() > len(data.event_vocabulary):
        raise ValueError(f"event ids must be in [0, {len(data.event_vocabulary)}], got "
                         f"[{data.events.min()}, {data.events.max()}]")


def tune_thresholds(probabilities: np.ndarray, labels: np.ndarray,
                    label_names: tuple[str, ...]) -> dict[str, float]:
    """Per-label tau maximising that label's validation F1 (0.5 when nothing to tune on)."""
    out = {}
    truth = labels > 0.5
    for j, name in enumerate(label_names):
        if not truth[:, j].any():
            out[name] = 0.5
            continue
        best, best_tau = -1.0, 0.5
        for tau in sorted(TAU_GRID, key=lambda t: abs(t - 0.5)):
            pred = probabilities[:, j] >= tau
            tp = float((pred & truth[:, j]).sum())
            f1 = 2 * tp / (pred.sum() + truth[:, j].sum())
            if f1 > best + 1e-9:
                best, best_tau = f1, float(tau)
        out[name] = best_tau
    return out


def _warm_state(init_from: WarmStart) -> tuple[dict, tuple[str, ...], tuple[str, ...], dict]:
    """(state_dict, label_names, event_vocabulary, normalisation) of a policy or bundle."""
    if isinstance(init_from, TrainedPolicy):
        return (init_from.model.state_dict(), init_from.label_names,
                init_from.event_vocabulary, init_from.normalisation)
    bundle = init_from if isinstance(init_from, Bundle) else load_bundle(init_from)
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(bundle.onnx_path)).graph
    # export.py exports without constant folding, so initialisers keep their module names.
    state = {init.name: torch.from_numpy(numpy_helper.to_array(init).copy())
             for init in graph.initializer}
    m = bundle.manifest
    return state, tuple(m.labels), tuple(m.event_vocabulary), m.normalisation


def warm_start(model: ThinkingPolicy, init_from: WarmStart, label_names: tuple[str, ...],
               event_vocabulary: tuple[str, ...]) -> dict[str, list[str]]:
    """Copy weights from ``init_from`` into ``model``; rows of labels/events matched by name.

    A grown label list keeps every known label's output row and starts new ones fresh; the
    same for the event vocabulary. Returns which tensors were copied, partly copied or kept
    fresh, for the training history.
    """
    source, old_labels, old_events, _ = _warm_state(init_from)
    target = model.state_dict()
    report: dict[str, list[str]] = {"copied": [], "rows": [], "fresh": []}
    row_maps = {
        "head.weight": (old_labels, label_names), "head.bias": (old_labels, label_names),
        "event_embed.weight": (("<pad>",) + tuple(old_events),
                               ("<pad>",) + tuple(event_vocabulary)),
    }
    with torch.no_grad():
        for key, tensor in target.items():
            if key not in source:
                report["fresh"].append(key)
                continue
            src = source[key].to(tensor.dtype)
            if key in row_maps:
                old, new = row_maps[key]
                index = {name: i for i, name in enumerate(old)}
                for i, name in enumerate(new):
                    if name in index and src.shape[1:] == tensor.shape[1:]:
                        tensor[i] = src[index[name]]
                report["rows"].append(key)
            elif src.shape == tensor.shape:
                tensor.copy_(src)
                report["copied"].append(key)
            else:
                report["fresh"].append(key)
        if "shape_in.weight" in target and not any(key.startswith("shape_in.")
                                                   for key in source):
            # A bundle from before the window-shape input: start that input at zero so the
            # warm-started model computes exactly what the old one did, then learns it.
            for key in ("shape_in.weight", "shape_in.bias"):
                target[key].zero_()
                report["zeroed"] = report.get("zeroed", []) + [key]
    model.load_state_dict(target)
    return report


def train_policy(data: SituationSet, config: PolicyConfig | str = "default", *, seed: int = 0,
                 epochs: int = 30, batch_size: int = 128, lr: float = 2e-3,
                 weight_decay: float = 0.01, val_fraction: float = 0.15, patience: int = 5,
                 progress: bool = True, init_from: WarmStart | None = None,
                 tune_tau: bool = True, balance: bool = True,
                 min_steps: int = 0, signal_drop: float = 0.0) -> TrainedPolicy:
    """Train a policy on ``data`` and return it with thresholds and validation metrics.

    Early stopping watches validation loss and restores the best epoch's weights; with
    ``val_fraction=0`` it trains for ``epochs`` and keeps tau = 0.5. ``balance`` weighs each
    label's positives by sqrt(negatives / positives) (1..10): rare thinking such as a
    late change seen in 2% of frames is otherwise never predicted at all.

    ``min_steps`` is a floor on optimiser steps: ``epochs`` grows until it is reached, and
    early stopping waits for it. A few hundred rows give a handful of steps per epoch, and
    a fixed epoch count would end training before the model learned anything (order over
    unseen identities took > 1,000 steps where 105 left it at chance).

    ``signal_drop`` > 0 masks each signal of each training row for its whole window with
    that probability, drawn afresh every epoch (validation rows stay intact): a robot
    without one of the signals then runs in-distribution instead of on inputs the policy
    never saw (a bundle trained without it lost 0.045 micro-F1 with ``visibility``
    absent). Labels are kept: they say what thinking the situation needs, whatever the
    robot can observe of it.
    """
    _check_data(data)
    if epochs < 1 or batch_size < 1 or patience < 1 or min_steps < 0:
        raise ValueError(f"epochs, batch_size and patience must be >= 1 and min_steps >= 0, "
                         f"got {epochs}, {batch_size}, {patience}, {min_steps}")
    if not 0.0 <= signal_drop < 1.0:
        raise ValueError(f"signal_drop must be in [0, 1), got {signal_drop!r}")
    config, preset = _resolve_config(data, config)
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    train_rows, val_rows = split_by_group(data.groups, val_fraction, rng)
    model = build_model(config)
    history: list[dict] = []
    if init_from is not None:
        report = warm_start(model, init_from, data.label_names, data.event_vocabulary)
        history.append({"warm_start": report})
    else:
        mean, std = signal_statistics(data.subset(train_rows))
        model.set_normalisation(torch.from_numpy(mean), torch.from_numpy(std))
    train_t = _tensors(data, train_rows)
    val_t = _tensors(data, val_rows) if len(val_rows) else None
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = max(1, -(-len(train_rows) // batch_size))
    epochs = max(epochs, -(-min_steps // steps_per_epoch))
    scheduler = one_cycle(optimiser, lr, epochs * steps_per_epoch)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=_pos_weight(train_t[3]) if balance else None)
    best = {"loss": float("inf"), "state": copy.deepcopy(model.state_dict()), "epoch": 0}
    stale = 0
    with _progress(progress, epochs * steps_per_epoch) as (bar, task):
        for epoch in range(1, epochs + 1):
            epoch_t = train_t
            if signal_drop > 0:
                keep = torch.from_numpy(signal_drop_mask(
                    len(train_rows), train_t[0].shape[2], signal_drop, rng))
                epoch_t = (train_t[0] * keep, train_t[1] * keep, *train_t[2:])
            train_loss = _run_epoch(model, epoch_t, batch_size, rng, optimiser, scheduler,
                                    loss_fn, bar, task)
            row = {"epoch": epoch, "train_loss": train_loss}
            if val_t is not None:
                val_loss, probs = _evaluate(model, val_t, loss_fn, batch_size * 4)
                f1 = micro_scores(val_t[3].numpy(), probs >= 0.5)["f1"]
                row.update(val_loss=val_loss, val_f1=f1)
                if val_loss < best["loss"] - 1e-6:
                    best = {"loss": val_loss, "state": copy.deepcopy(model.state_dict()),
                            "epoch": epoch}
                    stale = 0
                else:
                    stale += 1
            history.append(row)
            if bar is not None:
                bar.update(task, description=_describe(row))
                bar.console.log(_describe(row))  # a lasting line per epoch, also in logs
            if val_t is not None and stale >= patience \
                    and epoch * steps_per_epoch >= min_steps:
                break
    if val_t is not None:
        model.load_state_dict(best["state"])
    model.eval()
    thresholds = {name: 0.5 for name in data.label_names}
    val_metrics: dict = {}
    if val_t is not None:
        val_loss, probs = _evaluate(model, val_t, loss_fn, batch_size * 4)
        labels = val_t[3].numpy()
        if tune_tau:
            thresholds = tune_thresholds(probs, labels, data.label_names)
        tau = np.array([thresholds[n] for n in data.label_names], dtype=np.float32)
        val_metrics = {"loss": val_loss, "best_epoch": best["epoch"], "rows": int(len(val_rows)),
                       "groups": int(len(np.unique(data.groups[val_rows]))),
                       **{f"micro_{k}": v for k, v in micro_scores(labels, probs >= tau).items()}}
    return TrainedPolicy(
        model=model, config=config,
        normalisation={"mean": model.signal_mean.tolist(), "std": model.signal_std.tolist()},
        label_names=tuple(data.label_names), signal_names=tuple(data.signal_names),
        event_vocabulary=tuple(data.event_vocabulary), thresholds=thresholds,
        history=history, val_metrics=val_metrics, fingerprint=fingerprint(data),
        preset=preset, seed=seed)


def _pos_weight(labels: torch.Tensor) -> torch.Tensor:
    positives = labels.sum(0)  # (L,)
    negatives = labels.shape[0] - positives  # (L,)
    return torch.sqrt(negatives / positives.clamp_min(1.0)).clamp(1.0, 10.0)  # (L,)


def _run_epoch(model, tensors, batch_size, rng, optimiser, scheduler, loss_fn, bar, task):
    model.train()
    signals, mask, events, labels = tensors
    order = torch.from_numpy(rng.permutation(len(labels)))
    total, count = 0.0, 0
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        logits, _ = model.logits(signals[idx], mask[idx], events[idx])  # (b, L)
        loss = loss_fn(logits, labels[idx])
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        scheduler.step()
        total += loss.item() * len(idx)
        count += len(idx)
        if bar is not None:
            bar.advance(task)
    return total / max(count, 1)


@torch.no_grad()
def _evaluate(model, tensors, loss_fn, batch_size) -> tuple[float, np.ndarray]:
    model.eval()
    signals, mask, events, labels = tensors
    logits = torch.cat([model.logits(signals[i:i + batch_size], mask[i:i + batch_size],
                                     events[i:i + batch_size])[0]
                        for i in range(0, len(labels), batch_size)])
    return float(loss_fn(logits, labels)), torch.sigmoid(logits).numpy()


def predict_proba(trained: TrainedPolicy, data: SituationSet,
                  batch_size: int = 1024) -> np.ndarray:
    """Probabilities (N, L) of the torch model on ``data`` (evaluation; the robot uses ONNX)."""
    if tuple(data.label_names) != tuple(trained.label_names):
        raise ValueError("data.label_names differ from the policy's labels")
    tensors = _tensors(data, np.arange(len(data)))
    return _evaluate(trained.model, tensors, nn.BCEWithLogitsLoss(), batch_size)[1]


def evaluate(trained: TrainedPolicy, data: SituationSet) -> dict[str, float]:
    """Micro precision/recall/F1 of the policy on ``data`` with its tuned thresholds."""
    probs = predict_proba(trained, data)
    return micro_scores(data.labels, probs >= trained.threshold_array)


def _describe(row: dict) -> str:
    text = f"epoch {row['epoch']} loss {row['train_loss']:.4f}"
    if "val_loss" in row:
        text += f" val {row['val_loss']:.4f} F1 {row['val_f1']:.3f}"
    return text


class _progress:
    """A rich progress bar, or nothing when ``enabled`` is False (tests, benchmarks)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total, self.bar = enabled, total, None

    def __enter__(self):
        if not self.enabled:
            return None, None
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                            TimeRemainingColumn(), transient=False)
        self.bar.__enter__()
        return self.bar, self.bar.add_task("training", total=self.total)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
