"""Internalisation: promoted knowledge units become training situations for the policy.

A rule A...B...C becomes (prefix A...B, "consider:C") (seed 000, eq. 15): the training
situation stops BEFORE C, so the policy learns to raise the thinking before C happens.
Each unit yields positives (A ... B with unrelated filler events before, between and after)
and negatives that share part of the evidence but not the antecedent: filler only, A
alone, B alone, and the reversed B ... A (a one-code antecedent A -> C gets filler only:
"A alone" is the antecedent itself, and labelling it 0 halved the rule's recall). Filler
codes are drawn from the event vocabulary minus every code used by a unit, so a negative
never accidentally contains an antecedent.

Discovered situations carry no signal evidence: ``signals`` are zeros with ``mask`` 0
(nothing observed), and the event history (ids into ``event_vocabulary``, 0 = padding,
oldest first, right-aligned) holds the whole input.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from thinkmem_ros.consolidator.knowledge import KnowledgeUnit
from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.core.vocabulary import SIGNALS


def _encode(events: Sequence[str], lookup: dict[str, int], max_events: int) -> np.ndarray:
    ids = [lookup[e] for e in events][-max_events:]
    row = np.zeros(max_events, dtype=np.int64)
    if ids:
        row[max_events - len(ids):] = ids
    return row


def _interleave(items: Sequence[str], filler: np.ndarray, length: int,
                rng: np.random.Generator) -> list[str]:
    """``items`` in order at random positions of a ``length``-event filler sequence."""
    length = max(length, len(items))
    seq = [str(x) for x in rng.choice(filler, size=length - len(items))]
    slots = np.sort(rng.choice(length, size=len(items), replace=False))
    for pos, item in zip(slots.tolist(), items):
        seq.insert(pos, item)
    return seq[:length]


def prefix_events(antecedent: Sequence[str], filler: np.ndarray, length: int,
                  rng: np.random.Generator) -> list[str]:
    """An event history that contains ``antecedent`` in order and ends before any consequence."""
    return _interleave(list(antecedent), filler, length, rng)


def filler_codes(vocabulary: Sequence[str], units: Iterable[KnowledgeUnit]) -> np.ndarray:
    """Vocabulary codes no unit uses (safe background for positives and negatives)."""
    used = {code for u in units for code in u.pattern}
    free = np.array([c for c in vocabulary if c not in used])
    if free.size == 0:
        raise ValueError("every vocabulary code is used by a unit; no filler left")
    return free


def situations_from_events(histories: Sequence[Sequence[str]], labels: np.ndarray,
                           label_names: tuple[str, ...], vocabulary: tuple[str, ...],
                           max_events: int, window: int = 1) -> SituationSet:
    """Event-only situations: zero signals with mask 0 and the histories as event ids."""
    lookup = {code: i + 1 for i, code in enumerate(vocabulary)}
    try:
        events = np.stack([_encode(h, lookup, max_events) for h in histories]) if histories \
            else np.zeros((0, max_events), np.int64)
    except KeyError as err:
        raise ValueError(f"event {err.args[0]!r} is not in the event vocabulary") from None
    n = len(histories)
    shape = (n, window, len(SIGNALS))
    return SituationSet(signals=np.zeros(shape, np.float32), labels=labels,
                        mask=np.zeros(shape, np.float32), events=events,
                        groups=np.arange(n, dtype=np.int64), label_names=label_names,
                        event_vocabulary=tuple(vocabulary))


def knowledge_material(units: Iterable[KnowledgeUnit], vocabulary: Sequence[str],
                       rng: np.random.Generator, *, positives_per_unit: int = 64,
                       negatives_per_kind: int = 16, max_events: int = 16,
                       window: int = 1, include_inactive: bool = False) -> SituationSet:
    """Training situations for the promoted units (all units with ``include_inactive``)."""
    units = [u for u in units if include_inactive or u.active]
    if not units:
        raise ValueError("no promoted knowledge units to internalise")
    if positives_per_unit < 1 or negatives_per_kind < 0 or max_events < 3:
        raise ValueError(f"need positives_per_unit >= 1, negatives_per_kind >= 0, "
                         f"max_events >= 3; got {positives_per_unit}, {negatives_per_kind}, "
                         f"{max_events}")
    vocabulary = tuple(vocabulary)
    label_names = tuple(sorted({u.thinking for u in units}))
    filler = filler_codes(vocabulary, units)
    histories: list[list[str]] = []
    rows: list[np.ndarray] = []
    for unit in units:
        target = np.zeros(len(label_names), np.float32)
        target[label_names.index(unit.thinking)] = 1.0
        antecedent = list(unit.antecedent)
        for _ in range(positives_per_unit):
            histories.append(prefix_events(antecedent, filler, max_events, rng))
            rows.append(target)
        negatives: list[list[str]] = [[]]
        if len(antecedent) > 1:  # for A -> C, "B alone" would be A: a positive labelled 0
            negatives += [[antecedent[-1]], [antecedent[0]], list(reversed(antecedent))]
        for partial in negatives:
            for _ in range(negatives_per_kind):
                histories.append(prefix_events(partial, filler, max_events, rng))
                rows.append(np.zeros(len(label_names), np.float32))
    data = situations_from_events(histories, np.stack(rows), label_names, vocabulary,
                                  max_events, window)
    data.meta = {"source": "discovered", "units": [u.key for u in units]}
    return data


def with_labels(data: SituationSet, label_names: tuple[str, ...]) -> SituationSet:
    """``data`` relabelled to ``label_names`` (missing columns 0) so sets can be concatenated."""
    labels = np.zeros((len(data), len(label_names)), np.float32)
    for j, name in enumerate(label_names):
        if name in data.label_names:
            labels[:, j] = data.labels[:, data.label_names.index(name)]
    return SituationSet(signals=data.signals, labels=labels, mask=data.mask, events=data.events,
                        groups=data.groups, label_names=tuple(label_names),
                        signal_names=data.signal_names, event_vocabulary=data.event_vocabulary,
                        meta=dict(data.meta))
