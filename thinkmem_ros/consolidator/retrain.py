"""Internalisation: D U D_dir U D_disc, anchored retraining from the running bundle, export.

D is the training set behind the running bundle (``rehearsal.py``); a round that trained
on its new material alone forgot the base skills (demo: held-out micro-F1 0.975 -> 0.913),
and rehearsal alone did not stop a warm start from drifting either (fresh streams: 0.984
-> 0.970), so the retraining is anchored to the running bundle (``anchored_finetune``:
distillation from its probabilities, its weights moving at a tenth of the new rows'
rate). Discovered prefixes are put on real signal windows (``with_context``).

The candidate must be a drop-in replacement on the robot, so it keeps the current bundle's
window K, signal order and event-history length M (the node's hot-swap refuses anything
else) and only *grows* names: labels gain the discovered ``consider:X`` thinking of the
promoted knowledge units (and a label records' ``required`` name, once enough records from
more than one episode do: ``candidate_labels``; never past the wire's label limit), the
event vocabulary gains the units' codes and codes the records carry in more than one
episode, up to ``RetrainConfig.max_event_vocabulary`` (``candidate_vocabulary``). Warm
start copies every known weight row by name (``train.warm_start``), so a grown head keeps
what it knew.

Direct rows get their discovered columns from the promoted rules themselves: a row whose
event history holds a unit's antecedent in order, with the consequence not yet after it,
is labelled ``consider:C`` like the discovered prefixes are. Leaving those cells 0 would
teach the policy the opposite of the rule on exactly the situations it is about.

Thresholds: labels whose tau can be tuned (positives in the validation split) take the
tuned value; base labels the new material has no positives for keep the current bundle's
tau, which was tuned on more data than a consolidation round sees. With distillation every
label the running bundle knows keeps its tau (its probabilities were anchored to it).

Material is drawn from a Generator seeded by ``RetrainConfig.seed`` alone, so the same
units and records give the same training set (and fingerprint) in every round.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from thinkmem_ros.consolidator.direct import (
    direct_material_on,
    split_heldout,
)
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
    """Anchored warm-start retraining: small epochs, one thread, deterministic material."""

    epochs: int = 15
    batch_size: int = 64
    # peak learning rate of what the round adds: the rows of new labels in the head and of
    # new codes in the event embedding (they start from scratch and must learn a rule)
    lr: float = 4e-3
    # peak learning rate of every weight the running bundle already had. Equal to ``lr``
    # (the old behaviour) a warm start on D alone fell from 0.984 to 0.974 base micro-F1
    # on fresh streams: 1,600 rows for 750 steps at 2e-3 leave the basin v1 was in
    base_lr: float = 2e-4
    # weight of the running bundle's probabilities as targets for its own (base) labels,
    # against 1 - distill for the recorded labels (see ``soft_targets``); 0 = labels only
    distill: float = 1.0
    anchor_weight: float = 1.0  # weight of the known labels' loss against the new labels'
    # None: distil every cell of a known label. A number: only cells where the running
    # bundle decides right with its probability at least this far from its threshold; the
    # recorded label elsewhere. Measured on the demo round (base_lr 2e-4): 0.979 with 0.1,
    # 0.981 with None; a running bundle whose outputs hug its thresholds (a barely trained
    # one) needs the margin, or copying it exactly flips decisions on the next nudge
    distill_margin: float | None = None
    # discovered prefixes get real signal windows (drawn from D, with D's base labels)
    # instead of zeros with mask 0: the robot never sees an empty window, and the base
    # outputs must be anchored on windows that hold the new event codes
    discovered_context: bool = True
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
    # a label a record's ``required`` names joins the candidate only with this much
    # evidence: its head row starts from scratch and learns from its positives alone, and a
    # quarter of the episodes go to the gate and a fifth of the rest to validation, so
    # fewer than 10 positive records leave nothing to learn or tune; and from at least 2
    # episodes, so one episode's (or one robot's free-form judge's) word is not a label.
    # The set never exceeds the wire's ``LIMITS["max_labels"]`` (most-evidenced first):
    # a robot running a bundle with more labels cannot ship any experience
    new_label_min_positives: int = 10
    new_label_min_episodes: int = 2
    # a code records carry joins the event vocabulary once seen in this many episodes (a
    # name one episode alone holds is an object id or a one-off, nothing to learn), most
    # episodes first, until the vocabulary holds ``max_event_vocabulary`` codes: 80,000
    # one-off names made an 80,008-row embedding, a 106 s round and 689 MB. 4,096 is 500x
    # the codes the shipped bundles know; the running codes and the promoted units' codes
    # always stay
    new_event_min_episodes: int = 2
    max_event_vocabulary: int = 4096
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "patience", "positives_per_unit", "threads",
                     "new_label_min_positives", "new_label_min_episodes",
                     "new_event_min_episodes", "max_event_vocabulary"):
            if getattr(self, name) < 1:
                raise ValueError(f"RetrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.negatives_per_kind < 0:
            raise ValueError(f"RetrainConfig.negatives_per_kind must be >= 0, got "
                             f"{self.negatives_per_kind}")
        if self.lr <= 0:
            raise ValueError(f"RetrainConfig.lr must be > 0, got {self.lr}")
        if self.base_lr < 0:
            raise ValueError(f"RetrainConfig.base_lr must be >= 0, got {self.base_lr}")
        if not self.anchor_weight > 0:
            raise ValueError(f"RetrainConfig.anchor_weight must be > 0, got "
                             f"{self.anchor_weight}")
        if self.distill_margin is not None and not 0.0 <= self.distill_margin < 1.0:
            raise ValueError(f"RetrainConfig.distill_margin must be in [0, 1), got "
                             f"{self.distill_margin}")
        if not 0.0 <= self.distill <= 1.0:
            raise ValueError(f"RetrainConfig.distill must be in [0, 1], got {self.distill}")
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


def evidenced_labels(experiences: Iterable[Experience], known: Sequence[str],
                     min_positives: int, min_episodes: int) -> list[str]:
    """Labels new to ``known`` that records' ``required`` name with enough evidence.

    A label qualifies with at least ``min_positives`` records naming it, from at least
    ``min_episodes`` distinct (robot, episode) pairs; the result is most-evidenced first
    (more records, then more episodes, then first seen).
    """
    known = set(known)
    records: dict[str, int] = {}
    episodes: dict[str, set] = {}
    for exp in experiences:
        for label in dict.fromkeys(exp.required or ()):
            if label in known:
                continue
            records[label] = records.get(label, 0) + 1
            episodes.setdefault(label, set()).add((exp.robot_id, exp.episode_id))
    order = {name: i for i, name in enumerate(records)}
    kept = [name for name in records
            if records[name] >= min_positives and len(episodes[name]) >= min_episodes]
    return sorted(kept, key=lambda n: (-records[n], -len(episodes[n]), order[n]))


def candidate_labels(running: Sequence[str], experiences: Sequence[Experience],
                     units: Sequence[KnowledgeUnit], cfg: RetrainConfig
                     ) -> tuple[tuple[str, ...], list[KnowledgeUnit]]:
    """(label list, units kept): the running labels, then new ones, within the wire limit.

    Every running label stays (the gate refuses a candidate that drops one). New labels are
    the promoted units' ``consider:C`` (discovery already judged their evidence), then the
    labels records' ``required`` name with ``cfg.new_label_min_*`` evidence, most-evidenced
    first, until ``LIMITS["max_labels"]``: a record carries one probability per label of
    the bundle, and one with more is refused on the robot and by the consolidator. A label
    left out is not learned this round; records that name it keep their other labels in
    the direct material (``labels_left_out``), and a unit whose label is left out is not
    trained.
    """
    from thinkmem_ros.link.experience import LIMITS

    room = max(0, LIMITS["max_labels"] - len(running))
    thinking = [name for name in dict.fromkeys(u.thinking for u in units)
                if name not in running]
    required = evidenced_labels(experiences, [*running, *thinking],
                                cfg.new_label_min_positives, cfg.new_label_min_episodes)
    new = [*thinking, *required][:room]
    labels = grow(running, new)
    return labels, [u for u in units if u.thinking in labels]


def candidate_vocabulary(running: Sequence[str], experiences: Sequence[Experience],
                         units: Sequence[KnowledgeUnit], cfg: RetrainConfig
                         ) -> tuple[str, ...]:
    """The running codes, the units' codes, then codes records carry, bounded.

    A code of the records (those with ``required``: the ones trained on) joins when seen in
    at least ``cfg.new_event_min_episodes`` distinct (robot, episode) pairs, most episodes
    first (then by name), until ``cfg.max_event_vocabulary`` codes in all. A code left out
    is dropped from the rows' histories, as the robot's buffer drops codes its bundle does
    not know.
    """
    base = grow(running, (c for u in units for c in u.pattern))
    known = set(base)  # a tuple's `in` scanned up to 4,096 codes per event
    episodes: dict[str, set] = {}
    for exp in experiences:
        if exp.required is None:
            continue
        for name in set(exp.events):
            if name not in known:
                episodes.setdefault(name, set()).add((exp.robot_id, exp.episode_id))
    seen = sorted((name for name, eps in episodes.items()
                   if len(eps) >= cfg.new_event_min_episodes),
                  key=lambda name: (-len(episodes[name]), name))
    return grow(base, seen[:max(0, cfg.max_event_vocabulary - len(base))])


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


def with_context(disc: SituationSet, donors: SituationSet, rng: np.random.Generator
                 ) -> SituationSet:
    """Discovered rows on real signal windows drawn from ``donors`` (D and direct rows).

    Each row takes a random donor's window, mask and labels of non-discovered thinking; its
    event history and ``consider:*`` labels stay. Why: an event-only row (zeros, mask 0) is
    a situation the robot never meets, and it teaches nothing about the base labels on the
    windows that will carry the new codes. With a donor's window the rule is learned beside
    real signals, and the base labels of those rows (with distillation, the running
    bundle's answers there) anchor the rest.
    """
    if len(disc) == 0 or len(donors) == 0:
        return disc
    if donors.label_names != disc.label_names or donors.window != disc.window:
        raise ValueError("context donors and discovered rows differ in labels or window")
    pick = rng.integers(0, len(donors), size=len(disc))
    labels = disc.labels.copy()
    base = [j for j, n in enumerate(disc.label_names) if not n.startswith(DISCOVERED_PREFIX)]
    labels[:, base] = donors.labels[np.ix_(pick, base)]
    return SituationSet(signals=donors.signals[pick], labels=labels, mask=donors.mask[pick],
                        events=disc.events, groups=disc.groups, label_names=disc.label_names,
                        signal_names=disc.signal_names, event_vocabulary=disc.event_vocabulary,
                        meta=dict(disc.meta, context="donor windows"))


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
             rehearsal: SituationSet | None = None, engine=None) -> Material:
    """Build D (train + held-out) U D_dir (train + held-out) U D_disc grown from ``current``.

    ``rehearsal`` is D, the training set behind ``current`` (``rehearsal.load_rehearsal``):
    its rows are renamed to the grown labels and vocabulary and the promoted rules are
    applied to them like to the direct rows. It is material to keep, not to train on alone:
    a round without direct or discovered material still builds no candidate. A seeded
    ``cfg.rehearsal_heldout_fraction`` of its rows is held out for the gate's regression
    check (``Material.heldout_rehearsal``) and never trained on in this round.

    ``engine`` (``consolidator/engine.py``) builds the direct rows in chunks, as Ray tasks
    for the Ray engine; the merged rows are exactly those of one pass.
    """
    m = current.manifest
    units = [u for u in units if u.active]
    labels, units = candidate_labels(m.labels, experiences, units, cfg)
    vocabulary = candidate_vocabulary(m.event_vocabulary, experiences, units, cfg)
    direct = direct_material_on(engine, experiences, label_names=labels,
                                signal_names=m.signals, window=m.window,
                                event_vocabulary=vocabulary, max_events=m.max_events)
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
    donors = [p for p in (old, train_dir) if p is not None and len(p)]
    if disc is not None and cfg.discovered_context and donors:
        disc = with_context(disc, SituationSet.concat(donors) if len(donors) > 1 else donors[0],
                            np.random.default_rng([cfg.seed, 5]))
        new = [p for p in (train_dir, disc) if p is not None and len(p)]
    train = SituationSet.concat(_distinct_groups([p for p in (old, *new) if p is not None]))
    train.meta = {"source": "consolidation", "units": [u.key for u in units]}
    counts = {"rehearsal": 0 if old is None else len(old), "direct_train": len(train_dir),
              "direct_heldout": len(heldout), "discovered": 0 if disc is None else len(disc),
              "rehearsal_heldout": 0 if old_held is None else len(old_held),
              "labels_left_out": direct.labels_left_out,
              **{f"skipped_{k}": v for k, v in direct.skipped.items()}}
    return Material(train=train, heldout=heldout, units=units, counts=counts,
                    heldout_rehearsal=old_held)


def retrain(material: Material, current: Bundle, cfg: RetrainConfig):
    """Anchored warm start of ``current`` on ``material.train``; returns a ``TrainedPolicy``.

    See ``anchored_finetune``: the running bundle's probabilities anchor its labels
    (``cfg.distill``) and its weights move at ``cfg.base_lr`` while what the round adds
    learns at ``cfg.lr``.
    """
    import torch

    torch.set_num_threads(cfg.threads)
    config = grown_config(material, current)
    teacher = running_probabilities(current, material.train) if cfg.distill > 0 else None
    return finish_retrained(anchored_finetune(material.train, config, current, cfg, teacher),
                            material, current, cfg)


def grown_config(material: Material, current: Bundle):
    """The running policy's architecture, sized for the material's labels and codes."""
    return running_config(current, n_labels=len(material.label_names),
                          n_event_vocab=len(material.event_vocabulary))


def running_config(current: Bundle, *, n_labels: int, n_event_vocab: int):
    """The running bundle's model config with the label and code counts a round needs.

    A streaming bundle stays streaming (same state size, taps and restart schedule): the
    round's candidate must run on the robot's compiled per-frame path as the running one
    does, and fine-tuning reads the same windows either way (``StreamingPolicy`` replays a
    window from its reset state, which is how it was trained).
    """
    from thinkmem_ros.policy.config import PolicyConfig
    from thinkmem_ros.policy.streaming_runtime import StreamingConfig

    m = current.manifest
    sizes = {"window": m.window, "n_signals": len(m.signals), "n_labels": n_labels,
             "max_events": m.max_events, "n_event_vocab": n_event_vocab}
    if m.streaming:
        return StreamingConfig.from_dict({**m.model_config, **sizes})
    if m.model_config:
        return PolicyConfig.from_dict({**m.model_config, **sizes})
    return PolicyConfig.from_preset(m.preset or "default", **sizes)


def finish_retrained(trained, material: Material, current: Bundle, cfg: RetrainConfig):
    """Thresholds merged with the running ones (known labels keep theirs), preset kept."""
    m = current.manifest
    trained.thresholds = merged_thresholds(trained.thresholds, material.train, m.thresholds,
                                          was_tuned=bool(trained.val_metrics),
                                          keep_known=cfg.distill > 0)
    trained.preset = m.preset
    return trained


def running_probabilities(current: Bundle, data: SituationSet, batch: int = 512) -> np.ndarray:
    """What the running bundle answers on ``data`` (N, L_running), as a robot would run it.

    ONNX Runtime on the rows with their events re-encoded into the running vocabulary
    (codes it does not know dropped, as the node's buffer drops them).
    """
    from thinkmem_ros.consolidator.gate import reencode_events
    from thinkmem_ros.policy.runtime import PolicyRuntime

    runtime = PolicyRuntime(current, threads=1)
    events = reencode_events(data.events, data.event_vocabulary,
                             current.manifest.event_vocabulary)
    if len(data) == 0:
        return np.zeros((0, len(current.manifest.labels)), np.float32)
    return np.concatenate([
        runtime.predict(data.signals[i:i + batch], data.mask[i:i + batch],
                        events[i:i + batch]).probabilities
        for i in range(0, len(data), batch)]).astype(np.float32)


def _init_grown(model, labels: list[int], codes: list[int], train_labels: np.ndarray,
                rng: np.random.Generator) -> None:
    """Start what a round adds where it can learn fast without shaking the rest.

    New event codes get embeddings at the scale of the known ones (``nn.Embedding``'s
    0.02 std is invisible next to trained rows, so only a large change of the shared
    encoder could make them matter); new labels keep their random head rows (a zero row
    passes no gradient to the new embeddings and nothing is learned) with the bias at the
    logit of the label's base rate, so the first steps do not push every row towards 0.
    """
    import torch

    with torch.no_grad():
        weight = model.event_embed.weight
        known = [i for i in range(1, weight.shape[0]) if i not in set(codes)]
        if codes and known:
            scale = float(weight[known].std())
            draws = rng.normal(0.0, scale, size=(len(codes), weight.shape[1]))
            weight[codes] = torch.from_numpy(draws).to(weight.dtype)
        if labels:
            prior = np.clip(train_labels[:, labels].mean(axis=0), 1e-3, 0.5)
            model.head.bias[labels] = torch.from_numpy(np.log(prior / (1.0 - prior))).to(
                model.head.bias.dtype)


def anchored_finetune(data: SituationSet, config, current: Bundle, cfg: RetrainConfig,
                      teacher: np.ndarray | None):
    """Fine-tune a warm start of ``current`` so it learns the new without forgetting the old.

    Why not ``train_policy(init_from=current)``: measured on the demo round (seed 7, base
    micro-F1 of the running bundle 0.9838 on five fresh 300 s ``mixed`` streams replayed
    through the node's buffer), that warm start (every weight at 2e-3, hard labels) gave
    0.970, and training on D alone nearly the same (0.974): the loss comes from the warm
    start drifting on a few thousand rows, not from the new material. Two anchors:

    * update scaling: each AdamW step of a weight the running bundle already had is scaled
      by ``base_lr / lr`` (exactly a step at ``base_lr`` with the same moments), while the
      rows of new labels in the head and of new codes in the event embedding take the
      full step: they start from scratch and must learn the rule (``_init_grown``);
    * distillation: for every label the running bundle knows, the loss is
      ``(1 - distill) * BCE(label, pos_weight) + distill * BCE(p_running)`` (times
      ``anchor_weight``), ``p_running`` from ``running_probabilities`` (cells outside
      ``distill_margin`` take the label instead). The soft term has no pos_weight: with
      one, its optimum is p > p_running and the base labels drift towards false positives
      at the running bundle's thresholds (measured: 734 false positives against 509).

    Same material and streams, 15 epochs at lr 4e-3: base_lr 2e-4 with distillation 0.982
    (the planted rule learned: recall 0.95 / false 0.10 on the gate's probes); distill 0
    0.979, 0.5 0.981 (base_lr 1e-4); base_lr 0 keeps 0.9838 exactly but learns no rule;
    more rehearsal rows (6,000) or interpolating the weights back towards the running
    ones trade rule for base along the same line. So a retrained candidate still loses
    ~0.002 here, which the gate sees; the round then keeps the running policy
    (``keep_running``) and ships its rules for the robot's tracker instead.

    Labels new to this round keep the plain pos-weighted BCE on their labels. Validation
    split, early stopping on the validation loss and tau tuning work as in ``train_policy``.
    """
    setup = finetune_setup(data, config, current, cfg, teacher)
    state, history, best = finetune_loop(setup, cfg)
    return finetune_result(setup, cfg, state, history, best)


@dataclass
class FinetuneSetup:
    """Everything the fine-tuning loop reads: built once, picklable, sent to each worker."""

    data: SituationSet
    config: object  # PolicyConfig
    model: object  # ThinkingPolicy, warm-started and grown
    scales: list  # per parameter: the update's scale (base_lr / lr, 1 on grown rows)
    train_rows: np.ndarray
    val_rows: np.ndarray
    known: list[int]
    fresh: list[int]
    soft: object  # torch tensor (N, L_known) or None
    trusted: object
    pos_weight: object
    rng_state: dict  # the epoch permutations' generator, after the validation split
    report: dict


def finetune_setup(data: SituationSet, config, current: Bundle, cfg: RetrainConfig,
                   teacher: np.ndarray | None) -> FinetuneSetup:
    """Split, warm start, grown rows, update scales and distillation targets."""
    import torch

    from thinkmem_ros.policy.training.train import build_model, split_by_group, warm_start

    rng = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)
    groups = len(np.unique(data.groups))
    train_rows, val_rows = split_by_group(data.groups, cfg.val_fraction if groups >= 2
                                          else 0.0, rng)
    model = build_model(config)
    report = warm_start(model, current, data.label_names, data.event_vocabulary)
    m = current.manifest
    known = [j for j, name in enumerate(data.label_names) if name in m.labels]
    fresh = [j for j, name in enumerate(data.label_names) if name not in m.labels]
    grown_rows = {  # rows that start from scratch: the full learning rate
        "head.weight": fresh,
        "event_embed.weight": [i + 1 for i, c in enumerate(data.event_vocabulary)
                               if c not in m.event_vocabulary]}
    grown_rows["head.bias"] = grown_rows["head.weight"]
    _init_grown(model, fresh, grown_rows["event_embed.weight"], data.labels[train_rows],
                np.random.default_rng([cfg.seed, 6]))
    scales = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        scale = torch.full_like(p, cfg.base_lr / cfg.lr)
        rows = grown_rows.get(name, [])
        if rows:
            scale[rows] = 1.0
        scales.append(scale)
    soft = trusted = None
    if teacher is not None and known:
        cols = [list(m.labels).index(data.label_names[j]) for j in known]
        t = np.ascontiguousarray(teacher[:, cols])  # (N, L_known)
        tau = np.array([m.thresholds[data.label_names[j]] for j in known], np.float32)
        # distil where the running bundle decides right with a margin, learn the label where
        # it is wrong or unsure (an unsure teacher copied exactly flips on the next nudge)
        right = (t >= tau) == (data.labels[:, known] > 0.5)
        trusted = torch.from_numpy(np.ones_like(right) if cfg.distill_margin is None
                                   else right & (np.abs(t - tau) >= cfg.distill_margin))
        soft = torch.from_numpy(t)
    hard_train = torch.from_numpy(data.labels)[train_rows]
    positives = hard_train.sum(0)
    pos_weight = torch.sqrt((len(train_rows) - positives) / positives.clamp_min(1.0)
                            ).clamp(1.0, 10.0)  # (L,) as train_policy balances
    return FinetuneSetup(data=data, config=config, model=model, scales=scales,
                         train_rows=train_rows, val_rows=val_rows, known=known, fresh=fresh,
                         soft=soft, trusted=trusted, pos_weight=pos_weight,
                         rng_state=rng.bit_generator.state, report=report)


def finetune_loop(setup: FinetuneSetup, cfg: RetrainConfig, rank: int = 0, world: int = 1,
                  wrap=None) -> tuple[dict, list[dict], dict]:
    """The epochs: anchored steps, validation, early stopping. Returns the best state.

    Data-parallel when ``world`` > 1 (``retrain_ray``): every worker walks the same
    permutation and takes its share of each batch (``rows[rank::world]``), ``wrap``
    (torch DDP) averages the gradients, and each worker's loss is scaled so that the
    average is the whole batch's mean: the step every worker applies is the one a single
    process would take (up to summation order). Validation runs whole on every worker,
    so early stopping agrees everywhere.
    """
    import copy

    import torch
    import torch.nn.functional as F

    from thinkmem_ros.policy.training.model import LogitsOnly
    from thinkmem_ros.policy.training.train import one_cycle

    data, model = setup.data, setup.model
    known, fresh, soft, trusted = setup.known, setup.fresh, setup.soft, setup.trusted
    rng = np.random.default_rng()
    rng.bit_generator.state = setup.rng_state
    params = [p for p in model.parameters() if p.requires_grad]
    labels = torch.from_numpy(data.labels)  # (N, L)
    tensors = (torch.from_numpy(data.signals), torch.from_numpy(data.mask),
               torch.from_numpy(data.events))
    forward = wrap(LogitsOnly(model)) if wrap is not None else LogitsOnly(model)

    def loss_sum(rows: np.ndarray, net) -> torch.Tensor:
        """Sum over the rows' cells of the anchored loss (divide by rows x L for the mean)."""
        idx = torch.from_numpy(rows)
        logits = net(*(t[idx] for t in tensors))  # (b, L)
        cells = F.binary_cross_entropy_with_logits(logits, labels[idx],
                                                   pos_weight=setup.pos_weight,
                                                   reduction="none")  # (b, L)
        if soft is None:
            return cells.sum()
        distilled = F.binary_cross_entropy_with_logits(
            logits[:, known], soft[idx], reduction="none")  # (b, L_known)
        distilled = torch.where(trusted[idx], distilled, cells[:, known])
        mixed = (1.0 - cfg.distill) * cells[:, known] + cfg.distill * distilled
        return cfg.anchor_weight * mixed.sum() + cells[:, fresh].sum()

    n_labels = labels.shape[1]
    train_rows, val_rows = setup.train_rows, setup.val_rows
    optimiser = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01)
    steps_per_epoch = max(1, -(-len(train_rows) // cfg.batch_size))
    scheduler = one_cycle(optimiser, cfg.lr, cfg.epochs * steps_per_epoch)
    history: list[dict] = [{"warm_start": setup.report, "base_lr": cfg.base_lr,
                            "lr": cfg.lr, "distill": cfg.distill}]
    best = {"loss": float("inf"), "state": copy.deepcopy(model.state_dict()), "epoch": 0}
    stale = 0
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        order = rng.permutation(train_rows)
        total = 0.0
        for start in range(0, len(order), cfg.batch_size):
            rows = order[start:start + cfg.batch_size]
            shared = len(rows) >= world  # too few rows to split: every worker takes all
            mine = rows[rank::world] if shared else rows
            loss = loss_sum(mine, forward) * ((world if shared else 1)
                                              / (len(rows) * n_labels))
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            before = [p.detach().clone() for p in params]
            optimiser.step()
            scheduler.step()
            with torch.no_grad():
                for p, old, scale in zip(params, before, setup.scales, strict=True):
                    p.copy_(old + (p - old) * scale)
            total += float(loss.detach()) / (world if shared else 1) * len(rows)
        row = {"epoch": epoch, "train_loss": total / max(len(train_rows), 1)}
        if len(val_rows):
            model.eval()
            with torch.no_grad():
                val_loss = sum(float(loss_sum(val_rows[i:i + 1024], LogitsOnly(model)))
                               for i in range(0, len(val_rows), 1024)) / (
                    len(val_rows) * n_labels)
            row["val_loss"] = val_loss
            if val_loss < best["loss"] - 1e-6:
                best = {"loss": val_loss, "state": copy.deepcopy(model.state_dict()),
                        "epoch": epoch}
                stale = 0
            else:
                stale += 1
        history.append(row)
        if len(val_rows) and stale >= cfg.patience:
            break
    state = best["state"] if len(val_rows) else copy.deepcopy(model.state_dict())
    return state, history, {"loss": best["loss"], "epoch": best["epoch"]}


def finetune_result(setup: FinetuneSetup, cfg: RetrainConfig, state: dict,
                    history: list[dict], best: dict):
    """The trained policy from the loop's best state: thresholds tuned on validation."""
    import torch

    from thinkmem_ros.policy.training.train import (
        TrainedPolicy,
        fingerprint,
        tune_thresholds,
    )

    data, model, val_rows = setup.data, setup.model, setup.val_rows
    model.load_state_dict(state)
    model.eval()
    thresholds = {name: 0.5 for name in data.label_names}
    val_metrics: dict = {}
    if len(val_rows):
        tensors = (torch.from_numpy(data.signals), torch.from_numpy(data.mask),
                   torch.from_numpy(data.events))
        with torch.no_grad():
            logits, _ = model.logits(*(t[torch.from_numpy(val_rows)] for t in tensors))
        probs = torch.sigmoid(logits).numpy()
        thresholds = tune_thresholds(probs, data.labels[val_rows], data.label_names)
        val_metrics = {"loss": best["loss"], "best_epoch": best["epoch"],
                       "rows": int(len(val_rows))}
    return TrainedPolicy(
        model=model, config=setup.config,
        normalisation={"mean": model.signal_mean.tolist(), "std": model.signal_std.tolist()},
        label_names=tuple(data.label_names), signal_names=tuple(data.signal_names),
        event_vocabulary=tuple(data.event_vocabulary), thresholds=thresholds,
        history=history, val_metrics=val_metrics, fingerprint=fingerprint(data),
        seed=cfg.seed)


def keep_running(material: Material, current: Bundle):
    """The running policy unchanged, as a candidate that carries the round's new labels.

    The fallback of a round whose retrained candidate the gate refused: weights and event
    vocabulary are the running bundle's (new codes are not fed to the policy, so its
    answers are the running bundle's on every input), each new label's head row is silent
    (weights 0, bias -20: it never fires), thresholds are the running ones. What the round
    learned still ships with it: rules for the robot's anticipation tracker, values and
    memory-control probes (``service``).
    """
    import torch

    from thinkmem_ros.policy.training.train import TrainedPolicy, build_model, warm_start

    m = current.manifest
    labels, vocabulary = tuple(material.label_names), tuple(m.event_vocabulary)
    config = running_config(current, n_labels=len(labels), n_event_vocab=len(vocabulary))
    model = build_model(config)
    report = warm_start(model, current, labels, vocabulary)
    fresh = [j for j, name in enumerate(labels) if name not in m.labels]
    with torch.no_grad():
        model.head.weight[fresh] = 0.0
        model.head.bias[fresh] = -20.0
    model.eval()
    thresholds = {name: float(m.thresholds.get(name, 0.5)) for name in labels}
    return TrainedPolicy(
        model=model, config=config, normalisation=dict(m.normalisation), label_names=labels,
        signal_names=tuple(m.signals), event_vocabulary=vocabulary, thresholds=thresholds,
        history=[{"warm_start": report, "kept": f"v{current.version}"}],
        fingerprint=m.training_fingerprint, preset=m.preset)


def merged_thresholds(tuned: dict[str, float], train: SituationSet,
                      current: dict[str, float], *, was_tuned: bool = True,
                      keep_known: bool = False) -> dict[str, float]:
    """Tuned tau where the material has positives for a label, else the current tau.

    Without a validation split nothing was tuned (``train_policy`` leaves every tau at
    0.5), so every label the running bundle knows keeps its tau, tuned on more data than
    a round sees; only grown labels start at 0.5. ``keep_known``: every label the running
    bundle knows keeps its tau anyway (distillation anchored its probabilities, so its
    calibration, to the running bundle's; a tau tuned on a round's small split would move
    the decision where the probabilities did not).
    """
    positives = train.labels.sum(axis=0) if len(train) else np.zeros(len(train.label_names))
    out = dict(tuned)
    for j, name in enumerate(train.label_names):
        if (positives[j] == 0 or not was_tuned or keep_known) and name in current:
            out[name] = float(current[name])
    return out


def export_candidate(trained, folder: Path | str, *, model_version: int, current: Bundle,
                     material: Material, extras: dict | None = None) -> Bundle:
    """Write the candidate bundle (unsigned) to a staging folder for the gate.

    The world scenario the lineage was trained on (``extras.scenario``) is carried over, so
    the next round's gate still knows which fresh streams judge it; so is the declared
    signal set (units, ranges), so the candidate stays in the line that serves its robots.
    """
    from thinkmem_ros.policy.training.export import export_bundle

    scenario = (current.manifest.extras or {}).get("scenario")
    info = {**({"scenario": scenario} if isinstance(scenario, str) else {}),
            "parent_version": current.version, "parent_sha256": current.manifest.sha256,
            "knowledge_units": [u.key for u in material.units],
            "discovered_labels": [n for n in material.label_names
                                  if n.startswith(DISCOVERED_PREFIX)],
            "material": dict(material.counts), **(extras or {})}
    return export_bundle(trained, folder, model_version=model_version,
                         frame_rate_hz=current.manifest.frame_rate_hz,
                         thresholds=trained.thresholds, extras=info,
                         signal_units=current.manifest.signal_units,
                         signal_ranges=current.manifest.signal_ranges)
