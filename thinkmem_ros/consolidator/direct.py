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

Held-out episodes are chosen by a hash of (robot_id, episode_id), not by a random draw,
so the same episodes stay held out in every round and the gate never scores a candidate
on situations an earlier round trained on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..data import SituationSet
from ..experience import Experience


@dataclass
class DirectMaterial:
    """Direct (s, g) rows plus what was skipped and why (for the round log)."""

    data: SituationSet
    episodes: list[tuple[str, str]]  # (robot_id, episode_id) per group index
    skipped: dict[str, int] = field(default_factory=dict)


def episode_key(robot_id: str, episode_id: str) -> int:
    """Stable 62-bit id of an episode (the same in every round and process)."""
    digest = hashlib.sha256(f"{robot_id}\x1f{episode_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2


def is_heldout(robot_id: str, episode_id: str, fraction: float) -> bool:
    """Whether an episode belongs to the gate's held-out set (hash-based, stable)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"held-out fraction must be in [0, 1), got {fraction!r}")
    return (episode_key(robot_id, episode_id) % 10_000) < fraction * 10_000


def required_labels(experiences: Iterable[Experience]) -> list[str]:
    """Every label some record says was needed, in first-seen order."""
    seen: dict[str, None] = {}
    for exp in experiences:
        for label in exp.required or ():
            seen.setdefault(label, None)
    return list(seen)


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
    """Build (s, g) rows for the given shapes from the records that carry ``required``."""
    label_names, signal_names = tuple(label_names), tuple(signal_names)
    label_index = {name: j for j, name in enumerate(label_names)}
    lookup = {name: i + 1 for i, name in enumerate(event_vocabulary)}
    skipped = {"no_required": 0, "shape": 0, "unknown_label": 0}
    groups_of: dict[tuple[str, str], int] = {}
    signals, masks, events, labels, groups = [], [], [], [], []
    for exp in experiences:
        if exp.required is None:
            skipped["no_required"] += 1
            continue
        if exp.window.shape != (window, len(signal_names)):
            skipped["shape"] += 1
            continue
        target = np.zeros(len(label_names), np.float32)
        unknown = [g for g in exp.required if g not in label_index]
        if unknown:
            skipped["unknown_label"] += 1
            continue
        target[[label_index[g] for g in exp.required]] = 1.0
        mask = np.ones(exp.window.shape, np.float32) if exp.mask is None \
            else exp.mask.astype(np.float32)
        signals.append(np.where(mask > 0, exp.window, 0.0).astype(np.float32))
        masks.append(mask)
        events.append(encode_events(exp.events, lookup, max_events))
        labels.append(target)
        key = (exp.robot_id, exp.episode_id)
        groups.append(groups_of.setdefault(key, len(groups_of)))
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
    return DirectMaterial(data=data, episodes=list(groups_of), skipped=skipped)


def split_heldout(material: DirectMaterial, fraction: float
                  ) -> tuple[SituationSet, SituationSet]:
    """(train, held-out) rows of direct material by the stable episode hash."""
    held = np.array([is_heldout(r, e, fraction) for r, e in material.episodes], dtype=bool)
    rows_held = held[material.data.groups] if len(material.data) else np.zeros(0, bool)
    idx = np.arange(len(material.data))
    return material.data.subset(idx[~rows_held]), material.data.subset(idx[rows_held])
