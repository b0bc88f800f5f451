"""Internalisation: D U D_dir U D_disc, warm-start retraining from the running bundle, export.

D is the training set behind the running bundle (``rehearsal.py``); a round that trained
on its new material alone forgot the base skills (demo: held-out micro-F1 0.975 -> 0.913).

The candidate must be a drop-in replacement on the robot, so it keeps the current bundle's
window K, signal order and event-history length M (the node's hot-swap refuses anything
else) and only *grows* names: labels gain the discovered ``consider:X`` thinking of the
promoted knowledge units (and any label a record's ``required`` names), the event
vocabulary gains codes seen in the units and the records. Warm start copies every known
weight row by name (``train.warm_start``), so a grown head keeps what it knew.

Direct rows get their discovered columns from the promoted rules themselves: a row whose
event history holds a unit's antecedent in order, with the consequence not yet after it,
is labelled ``consider:C`` like the discovered prefixes are. Leaving those cells 0 would
teach the policy the opposite of the rule on exactly the situations it is about.

Thresholds: labels whose tau can be tuned (positives in the validation split) take the
tuned value; base labels the new material has no positives for keep the current bundle's
tau, which was tuned on more data than a consolidation round sees.

Material is drawn from a Generator seeded by ``RetrainConfig.seed`` alone, so the same
units and records give the same training set (and fingerprint) in every round.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from thinkmem_ros.consolidator.direct import direct_material, required_labels, split_heldout
from thinkmem_ros.consolidator.knowledge import KnowledgeUnit
from thinkmem_ros.consolidator.material import knowledge_material, with_labels
from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.core.vocabulary import DISCOVERED_PREFIX
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.policy.bundle import Bundle


class NothingToTrain(RuntimeError):
    """A round has neither direct nor discovered material: no candidate is built."""


@dataclass
class RetrainConfig:
    """Quick warm-start retraining: small epochs, one thread, deterministic material."""

    epochs: int = 20
    batch_size: int = 64
    lr: float = 2e-3  # with rehearsal: 3e-3 drifted the base skills past the gate (1 of 3 seeds)
    val_fraction: float = 0.2
    patience: int = 4
    heldout_fraction: float = 0.25  # direct episodes kept for the gate, never trained on
    # rows of D kept for the gate, never trained on this round: one held-out episode is
    # ~120 rows, where one row moves micro-F1 by ~0.01, too few to judge a 0.02 tolerance
    rehearsal_heldout_fraction: float = 0.2
    positives_per_unit: int = 96  # 48 left a one-code rule A->C at 65 % recall (demo seed 8)
    # 12 left consider:C firing on 25-40 % of B...A probes; 24 still on 30 % of the gate's
    # no-antecedent probes in some demo runs: as many negatives of each kind the gate
    # probes (filler, B alone, B...A) as positives, so no kind is outweighed by A...B
    negatives_per_kind: int = 48
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "patience", "positives_per_unit", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"RetrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.negatives_per_kind < 0:
            raise ValueError(f"RetrainConfig.negatives_per_kind must be >= 0, got "
                             f"{self.negatives_per_kind}")
        if self.lr <= 0:
            raise ValueError(f"RetrainConfig.lr must be > 0, got {self.lr}")
        for name in ("val_fraction", "heldout_fraction", "rehearsal_heldout_fraction"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"RetrainConfig.{name} must be in [0, 1), got "
                                 f"{getattr(self, name)}")


@dataclass
class Material:
    """The round's training set, the gate's held-out rows and what went in.

    ``heldout`` holds the held-out direct episodes, ``heldout_rehearsal`` the held-out slice
    of D (None without rehearsal); the gate judges regression on both together.
    """

    train: SituationSet
    heldout: SituationSet
    units: list[KnowledgeUnit]
    counts: dict[str, int] = field(default_factory=dict)
    heldout_rehearsal: SituationSet | None = None

    @property
    def label_names(self) -> tuple[str, ...]:
        """The candidate's label list (current labels first, then grown ones)."""
        return self.train.label_names

    @property
    def event_vocabulary(self) -> tuple[str, ...]:
        """The candidate's event vocabulary (current codes first, then new ones)."""
        return self.train.event_vocabulary


def grow(base: Sequence[str], extra: Iterable[str]) -> tuple[str, ...]:
    """Return ``base`` in its order, then every new name of ``extra`` in first-seen order."""
    out = dict.fromkeys(base)
    for name in extra:
        out.setdefault(name, None)
    return tuple(out)


def rule_fires(history: Sequence[str], unit: KnowledgeUnit) -> bool:
    """Whether ``history`` holds the unit's antecedent in order with no consequence after it."""
    need = list(unit.antecedent)
    done_at = None
    for i, name in enumerate(history):
        if need and name == need[0]:
            need.pop(0)
            if not need:
                done_at = i
                break
    if done_at is None:
        return False
    return unit.consequence not in history[done_at + 1:]


def apply_rules(data: SituationSet, units: Sequence[KnowledgeUnit]) -> SituationSet:
    """Set each unit's ``consider:C`` column on rows whose event history fires the rule."""
    if not units or len(data) == 0:
        return data
    vocab = ("",) + tuple(data.event_vocabulary)
    labels = data.labels.copy()
    for row, ids in enumerate(data.events):
        history = [vocab[i] for i in ids if i > 0]
        for unit in units:
            if unit.thinking in data.label_names and rule_fires(history, unit):
                labels[row, data.label_names.index(unit.thinking)] = 1.0
    return SituationSet(signals=data.signals, labels=labels, mask=data.mask,
                        events=data.events, groups=data.groups, label_names=data.label_names,
                        signal_names=data.signal_names, event_vocabulary=data.event_vocabulary,
                        meta=dict(data.meta))


def discovered_material(units: Sequence[KnowledgeUnit], current: Bundle,
                        label_names: tuple[str, ...], vocabulary: tuple[str, ...],
                        cfg: RetrainConfig, rng: np.random.Generator) -> SituationSet | None:
    """Prefix situations (A...B -> consider:C) at the bundle's K, F and M; None if no units."""
    if not units:
        return None
    m = current.manifest
    data = knowledge_material(units, vocabulary, rng, positives_per_unit=cfg.positives_per_unit,
                              negatives_per_kind=cfg.negatives_per_kind,
                              max_events=m.max_events, window=m.window)
    shape = (len(data), m.window, len(m.signals))  # event-only rows: nothing observed
    data = SituationSet(signals=np.zeros(shape, np.float32), labels=data.labels,
                        mask=np.zeros(shape, np.float32), events=data.events,
                        groups=data.groups, label_names=data.label_names,
                        signal_names=tuple(m.signals), event_vocabulary=vocabulary,
                        meta=data.meta)
    return with_labels(data, label_names)


def _distinct_groups(parts: list[SituationSet]) -> list[SituationSet]:
    """Offset each part's groups past the previous parts' so sources never share a group."""
    out, offset = [], 0
    for part in parts:
        groups = part.groups - int(part.groups.min(initial=0)) + offset
        offset = int(groups.max(initial=offset - 1)) + 1
        out.append(SituationSet(signals=part.signals, labels=part.labels, mask=part.mask,
                                events=part.events, groups=groups, label_names=part.label_names,
                                signal_names=part.signal_names,
                                event_vocabulary=part.event_vocabulary, meta={}))
    return out


def split_rehearsal(data: SituationSet, fraction: float, rng: np.random.Generator
                    ) -> tuple[SituationSet, SituationSet | None]:
    """(train, held-out) rows of D: a seeded ``fraction`` of rows, at least one left to train.

    Rows, not groups: D is a stratified subsample of whole streams, so a group-wise split
    would hold out one or two streams and with them most of a rare label's positives.
    """
    n_held = min(int(round(fraction * len(data))), len(data) - 1)
    if n_held <= 0:
        return data, None
    held = np.zeros(len(data), dtype=bool)
    held[rng.choice(len(data), size=n_held, replace=False)] = True
    return data.subset(np.flatnonzero(~held)), data.subset(np.flatnonzero(held))


def assemble(experiences: Sequence[Experience], units: Sequence[KnowledgeUnit],
             current: Bundle, cfg: RetrainConfig,
             rehearsal: SituationSet | None = None) -> Material:
    """Build D (train + held-out) U D_dir (train + held-out) U D_disc grown from ``current``.

    ``rehearsal`` is D, the training set behind ``current`` (``rehearsal.load_rehearsal``):
    its rows are renamed to the grown labels and vocabulary and the promoted rules are
    applied to them like to the direct rows. It is material to keep, not to train on alone:
    a round without direct or discovered material still builds no candidate. A seeded
    ``cfg.rehearsal_heldout_fraction`` of its rows is held out for the gate's regression
    check (``Material.heldout_rehearsal``) and never trained on in this round.
    """
    m = current.manifest
    units = [u for u in units if u.active]
    labels = grow(m.labels, [*required_labels(experiences), *(u.thinking for u in units)])
    seen_events = (e for exp in experiences if exp.required is not None for e in exp.events)
    vocabulary = grow(m.event_vocabulary,
                      [*(c for u in units for c in u.pattern), *sorted(set(seen_events))])
    direct = direct_material(experiences, label_names=labels, signal_names=m.signals,
                             window=m.window, event_vocabulary=vocabulary,
                             max_events=m.max_events)
    train_dir, heldout = split_heldout(direct, cfg.heldout_fraction)
    train_dir, heldout = apply_rules(train_dir, units), apply_rules(heldout, units)
    rng = np.random.default_rng([cfg.seed, 1])
    disc = discovered_material(units, current, labels, vocabulary, cfg, rng)
    new = [p for p in (train_dir, disc) if p is not None and len(p)]
    if not new:
        raise NothingToTrain("no direct material (records with `required`) and no promoted "
                             "knowledge units")
    old = old_held = None
    if rehearsal is not None and len(rehearsal):
        from thinkmem_ros.consolidator.rehearsal import aligned

        old = apply_rules(aligned(rehearsal, labels, vocabulary, m.signals, m.window,
                                  m.max_events), units)
        old, old_held = split_rehearsal(old, cfg.rehearsal_heldout_fraction,
                                        np.random.default_rng([cfg.seed, 3]))
    train = SituationSet.concat(_distinct_groups([p for p in (old, *new) if p is not None]))
    train.meta = {"source": "consolidation", "units": [u.key for u in units]}
    counts = {"rehearsal": 0 if old is None else len(old), "direct_train": len(train_dir),
              "direct_heldout": len(heldout), "discovered": 0 if disc is None else len(disc),
              "rehearsal_heldout": 0 if old_held is None else len(old_held),
              **{f"skipped_{k}": v for k, v in direct.skipped.items()}}
    return Material(train=train, heldout=heldout, units=units, counts=counts,
                    heldout_rehearsal=old_held)


def retrain(material: Material, current: Bundle, cfg: RetrainConfig):
    """Warm-start ``current`` on ``material.train``; returns a ``TrainedPolicy``."""
    import torch

    from thinkmem_ros.policy.config import PolicyConfig
    from thinkmem_ros.policy.training.train import train_policy

    torch.set_num_threads(cfg.threads)
    m = current.manifest
    sizes = {"window": m.window, "n_signals": len(m.signals),
             "n_labels": len(material.label_names), "max_events": m.max_events,
             "n_event_vocab": len(material.event_vocabulary)}
    if m.model_config:
        config = PolicyConfig.from_dict({**m.model_config, **sizes})
    else:
        config = PolicyConfig.from_preset(m.preset or "default", **sizes)
    groups = len(np.unique(material.train.groups))
    val_fraction = cfg.val_fraction if groups >= 2 else 0.0
    trained = train_policy(material.train, config, seed=cfg.seed, epochs=cfg.epochs,
                           batch_size=cfg.batch_size, lr=cfg.lr, val_fraction=val_fraction,
                           patience=cfg.patience, progress=False, init_from=current)
    trained.thresholds = merged_thresholds(trained.thresholds, material.train, m.thresholds,
                                          was_tuned=bool(trained.val_metrics))
    trained.preset = m.preset
    return trained


def merged_thresholds(tuned: dict[str, float], train: SituationSet,
                      current: dict[str, float], *, was_tuned: bool = True) -> dict[str, float]:
    """Tuned tau where the material has positives for a label, else the current tau.

    Without a validation split nothing was tuned (``train_policy`` leaves every tau at
    0.5), so every label the running bundle knows keeps its tau, tuned on more data than
    a round sees; only grown labels start at 0.5.
    """
    positives = train.labels.sum(axis=0) if len(train) else np.zeros(len(train.label_names))
    out = dict(tuned)
    for j, name in enumerate(train.label_names):
        if (positives[j] == 0 or not was_tuned) and name in current:
            out[name] = float(current[name])
    return out


def export_candidate(trained, folder: Path | str, *, model_version: int, current: Bundle,
                     material: Material, extras: dict | None = None) -> Bundle:
    """Write the candidate bundle (unsigned) to a staging folder for the gate."""
    from thinkmem_ros.policy.training.export import export_bundle

    info = {"parent_version": current.version, "parent_sha256": current.manifest.sha256,
            "knowledge_units": [u.key for u in material.units],
            "discovered_labels": [n for n in material.label_names
                                  if n.startswith(DISCOVERED_PREFIX)],
            "material": dict(material.counts), **(extras or {})}
    return export_bundle(trained, folder, model_version=model_version,
                         frame_rate_hz=current.manifest.frame_rate_hz,
                         thresholds=trained.thresholds, extras=info)
