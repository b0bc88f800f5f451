"""Direct material (s_i, g_i): stored experiences whose hindsight names the thinking needed.

Seed 000's direct abstraction pairs a situation with the reasoning direction that later
feedback showed it needed. On the wire that is ``Experience.required`` (labels from the
trace h_t / feedback f_t); a record without it says nothing about what was needed and is
not direct material (its events still feed discovery).

Rows are encoded for one bundle's shapes: the record's (K, F) window must match the
bundle's window and signal count (others are skipped and counted, never reshaped), the
event history keeps only names in the bundle's event vocabulary (as the node's situation
buffer does) and its last M, right-aligned, oldest first. Groups are episodes, so splits
never put one episode on both sides.

Held-out episodes are chosen by their ordinal within the robot (episodes ranked by first
stamp, then id), every ``1/fraction``-th one, not by a random draw nor a hash of the ids:
episode ids carry the node's boot time, so a hash held out different episodes in every run
of the same scenario (run-to-run variance in the gate). Ordinals depend only on the store's
content; new episodes append at the end, so the same episodes stay held out in every round
and the gate never scores a candidate on situations an earlier round trained on.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.link.experience import Experience


@dataclass
class DirectMaterial:
    """Direct (s, g) rows plus what was skipped and why (for the round log).

    ``labels_left_out``: rows kept whose ``required`` also named labels outside the set
    built for (a judge's free-form word that has not earned a label yet).
    """

    data: SituationSet
    episodes: list[tuple[str, str]]  # (robot_id, episode_id) per group index
    first_stamps: list[float] = field(default_factory=list)  # earliest stamp per group
    skipped: dict[str, int] = field(default_factory=dict)
    labels_left_out: int = 0


def episode_key(robot_id: str, episode_id: str) -> int:
    """Stable 62-bit id of an episode (the same in every round and process)."""
    digest = hashlib.sha256(f"{robot_id}\x1f{episode_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2


def heldout_mask(episodes: Sequence[tuple[str, str]], first_stamps: Sequence[float],
                 fraction: float) -> np.ndarray:
    """Which episodes the gate holds out: every ``1/fraction``-th by first stamp per robot.

    Ordinal i (0-based, per robot, ranked by (first stamp, episode id)) is held out when
    floor((i + 1) * fraction) > floor(i * fraction): exactly floor(n * fraction) of n
    episodes, spread evenly over time, and the same ones for the same store content.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"held-out fraction must be in [0, 1), got {fraction!r}")
    if len(first_stamps) != len(episodes):
        raise ValueError(f"first_stamps has {len(first_stamps)} entries for "
                         f"{len(episodes)} episodes")
    order = sorted(range(len(episodes)),
                   key=lambda g: (episodes[g][0], first_stamps[g], episodes[g][1]))
    held = np.zeros(len(episodes), dtype=bool)
    ordinal: dict[str, int] = {}
    for g in order:
        i = ordinal.get(episodes[g][0], 0)
        ordinal[episodes[g][0]] = i + 1
        held[g] = math.floor((i + 1) * fraction) > math.floor(i * fraction)
    return held


def encode_events(events: Sequence[str], lookup: dict[str, int], max_events: int
                  ) -> np.ndarray:
    """Known event names -> ids (1..), last ``max_events``, right-aligned, 0 = padding."""
    ids = [lookup[e] for e in events if e in lookup][-max_events:]
    row = np.zeros(max_events, dtype=np.int64)
    if ids:
        row[max_events - len(ids):] = ids
    return row


def direct_material(experiences: Iterable[Experience], *, label_names: Sequence[str],
                    signal_names: Sequence[str], window: int,
                    event_vocabulary: Sequence[str], max_events: int) -> DirectMaterial:
    """Build (s, g) rows for the given shapes from the records that carry ``required``.

    A label ``required`` names outside ``label_names`` is left out of the row, the rest of
    it kept: the feedback still says which of the set's labels were needed and which not
    (skipping such records lost their base-label positives to every free-form word a
    judge wrote beside them).
    """
    label_names, signal_names = tuple(label_names), tuple(signal_names)
    label_index = {name: j for j, name in enumerate(label_names)}
    lookup = {name: i + 1 for i, name in enumerate(event_vocabulary)}
    skipped = {"no_required": 0, "shape": 0}
    left_out = 0
    groups_of: dict[tuple[str, str], int] = {}
    first: list[float] = []
    signals, masks, events, labels, groups = [], [], [], [], []
    for exp in experiences:
        if exp.required is None:
            skipped["no_required"] += 1
            continue
        if exp.window.shape != (window, len(signal_names)):
            skipped["shape"] += 1
            continue
        target = np.zeros(len(label_names), np.float32)
        known = [label_index[g] for g in exp.required if g in label_index]
        left_out += len(known) < len(exp.required)
        target[known] = 1.0
        mask = np.ones(exp.window.shape, np.float32) if exp.mask is None \
            else exp.mask.astype(np.float32)
        signals.append(np.where(mask > 0, exp.window, 0.0).astype(np.float32))
        masks.append(mask)
        events.append(encode_events(exp.events, lookup, max_events))
        labels.append(target)
        key = (exp.robot_id, exp.episode_id)
        group = groups_of.setdefault(key, len(groups_of))
        if group == len(first):
            first.append(float(exp.stamp))
        first[group] = min(first[group], float(exp.stamp))
        groups.append(group)
    n = len(labels)
    shape = (n, window, len(signal_names))
    data = SituationSet(
        signals=np.stack(signals) if n else np.zeros(shape, np.float32),
        labels=np.stack(labels) if n else np.zeros((0, len(label_names)), np.float32),
        mask=np.stack(masks) if n else np.zeros(shape, np.float32),
        events=np.stack(events) if n else np.zeros((0, max_events), np.int64),
        groups=np.asarray(groups, dtype=np.int64), label_names=label_names,
        signal_names=signal_names, event_vocabulary=tuple(event_vocabulary),
        meta={"source": "direct"})
    return DirectMaterial(data=data, episodes=list(groups_of), first_stamps=first,
                          skipped=skipped, labels_left_out=left_out)


MATERIAL_CHUNK = 20_000  # experiences per task when an engine builds the material


def _material_part(experiences: Sequence[Experience], first: int, last: int,
                   options: dict) -> DirectMaterial:
    return direct_material(experiences[first:last], **options)


def direct_material_on(engine, experiences: Sequence[Experience], chunk: int = MATERIAL_CHUNK,
                       **options) -> DirectMaterial:
    """``direct_material`` built ``chunk`` experiences at a time on ``engine``.

    Ray tasks or this process; merged into exactly what one call over all of them gives.
    """
    experiences = list(experiences)
    parts = [(i, min(i + chunk, len(experiences))) for i in range(0, len(experiences), chunk)]
    if engine is None or len(parts) < 2:
        return direct_material(experiences, **options)
    return merge_direct(list(engine.map(_material_part, experiences, parts, options)))


def merge_direct(parts: Sequence[DirectMaterial]) -> DirectMaterial:
    """Consecutive chunks' material as one.

    Rows in order, episodes numbered by first appearance over all chunks, each episode's
    earliest stamp, skipped and left-out counts summed.
    """
    groups_of: dict[tuple[str, str], int] = {}
    first: list[float] = []
    remapped = []
    skipped: dict[str, int] = {}
    for part in parts:
        local = np.empty(len(part.episodes), np.int64)
        for g, key in enumerate(part.episodes):
            group = groups_of.setdefault(key, len(groups_of))
            if group == len(first):
                first.append(part.first_stamps[g])
            first[group] = min(first[group], part.first_stamps[g])
            local[g] = group
        remapped.append(local[part.data.groups] if len(part.data) else
                        np.zeros(0, np.int64))
        for k, v in part.skipped.items():
            skipped[k] = skipped.get(k, 0) + v
    data = SituationSet.concat([p.data for p in parts])
    data.groups = np.concatenate(remapped).astype(np.int64)
    return DirectMaterial(data=data, episodes=list(groups_of), first_stamps=first,
                          skipped=skipped,
                          labels_left_out=sum(p.labels_left_out for p in parts))


def split_heldout(material: DirectMaterial, fraction: float
                  ) -> tuple[SituationSet, SituationSet]:
    """(train, held-out) rows of direct material by episode ordinal (``heldout_mask``)."""
    stamps = material.first_stamps or [0.0] * len(material.episodes)
    held = heldout_mask(material.episodes, stamps, fraction)
    rows_held = held[material.data.groups] if len(material.data) else np.zeros(0, bool)
    idx = np.arange(len(material.data))
    return material.data.subset(idx[~rows_held]), material.data.subset(idx[rows_held])
