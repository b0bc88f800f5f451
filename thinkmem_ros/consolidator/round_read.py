"""What a consolidation round reads from the store: bounded, whole episodes, seeded.

Retraining material, values and memory-control targets are built from decoded
experiences (each carries its signal window), so reading the whole store into memory is
what a round would outgrow first as the fleet's history grows. A round instead reads at
most ``cap`` experiences: every episode when the store holds no more than that (the round
sees what it always saw), otherwise a seeded uniform sample of whole episodes (memory
control and rule horizons read an episode's experiences in order, so episodes are kept
whole). The store is read a page at a time, so memory holds the sample and one page, not
the store. Discovery does not read experiences: it reads each episode's event history
(``discovery_log.event_log``), one history per episode, carried in the store and
updated from the rows new since the last round (``histories.py``).

Rounds after the first read what is new. The running bundle was trained on the store up to
a row id (its mark, ``round_marks``), and what it learned from older rows is carried by its
rehearsal set D (``rehearsal.py``: the training set behind it, capped). So a round on top
of a marked bundle decodes the rows that arrived after the mark (at most ``cap``, whole new
episodes sampled as above) and a *reservoir*: at most ``reservoir`` experiences of whole
older episodes, a uniform sample over the history (each episode's priority is a seeded
hash of its key, and the lowest priorities are taken while they fit, so the sample is the
same from round to round except where new episodes rank lower). Values, memory control
and rule horizons still see the past through it; their cost no longer grows with every
round's store.

The reservoir is carried, not searched for: a prefix of one priority order over a union is
the prefix over the prefixes of its parts, so the next round's reservoir is chosen from
this one's reservoir and this round's new episodes alone (``RoundRead.next_reservoir``:
episodes with their row counts and row-id spans through this round's newest row, plus the
first episode that did not fit, whose count decides where the next prefix stops), and
recorded with the mark; the spans let the next round open only the lake files that hold
those episodes. A mark recorded without one (or for another budget or seed) falls back to
counting rows per episode over the older rows (ids and stamps, not payloads): the only
query of the read that would see the whole store.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from thinkmem_ros.consolidator.store import EpisodeInfo, ExperienceStore
from thinkmem_ros.link.experience import Experience

DEFAULT_ROUND_EXPERIENCES = 200_000  # ~0.5-1 GB of decoded experiences at 32 x 7 windows
DEFAULT_RESERVOIR = 10_000  # experiences of older episodes a round on a marked bundle re-reads
PAGE = 500  # experiences decoded at a time while reading (a few MB)


Counted = tuple[str, str, int, int, int]  # (robot, episode, rows, first row id, last row id)


@dataclass(frozen=True)
class Reservoir:
    """A reservoir prefix and the first episode past it (None: every episode fitted)."""

    episodes: tuple[Counted, ...]
    stopper: Counted | None = None

    def to_json(self) -> list:
        """JSON-ready form (for the marks table)."""
        return [[list(e) for e in self.episodes], list(self.stopper) if self.stopper else None]

    @classmethod
    def from_json(cls, data: list) -> Reservoir:
        """The form ``to_json`` wrote; ValueError for anything else."""
        try:
            episodes, stopper = data
            return cls(tuple(_counted(e) for e in episodes),
                       None if stopper is None else _counted(stopper))
        except (TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"not a recorded reservoir: {exc}") from exc


def _counted(entry) -> Counted:
    robot_id, episode_id, rows, first, last = entry
    return str(robot_id), str(episode_id), int(rows), int(first), int(last)


@dataclass(frozen=True)
class RoundRead:
    """The experiences a round works on, and how many the store held."""

    experiences: list[Experience]
    stored: int  # experiences in the store (every signal set)
    episodes_read: int
    episodes_stored: int | None  # None: an incremental read does not count them
    since_id: int = 0  # rows after this id were new to the running bundle (0: all)
    through_id: int = 0  # the newest row id when the round read (the next round's mark)
    new: int = 0  # experiences read from rows after ``since_id``
    reservoir: int = 0  # experiences read from older episodes (the reservoir)
    # the reservoir of a round on top of this one (rows counted through through_id)
    next_reservoir: Reservoir | None = None

    @property
    def sampled(self) -> bool:
        """Whether a whole-store read took a sample of the episodes rather than all."""
        return self.episodes_stored is not None and self.episodes_read < self.episodes_stored


def choose_episodes(infos: Iterable[EpisodeInfo], cap: int, seed: int
                    ) -> set[tuple[str, str]]:
    """Whole episodes holding at most ``cap`` experiences together (all when they fit).

    A seeded shuffle, then episodes in that order while they fit; an episode larger than
    ``cap`` alone is never taken (it would break the bound), unless nothing else is.
    """
    infos = list(infos)
    if cap <= 0 or sum(i.count for i in infos) <= cap:
        return {(i.robot_id, i.episode_id) for i in infos}
    order = np.random.default_rng([seed, 11]).permutation(len(infos))
    chosen, total = set(), 0
    for idx in order.tolist():
        info = infos[idx]
        if total + info.count <= cap:
            chosen.add((info.robot_id, info.episode_id))
            total += info.count
    if not chosen and infos:  # every episode is larger than the cap: take the smallest
        smallest = min(infos, key=lambda i: (i.count, i.robot_id, i.episode_id))
        chosen.add((smallest.robot_id, smallest.episode_id))
    return chosen


def episode_priority(robot_id: str, episode_id: str, seed: int) -> int:
    """A seeded, stable pseudo-random rank of an episode (the same in every round)."""
    text = f"{seed}\n{robot_id}\n{episode_id}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def read_round(store: ExperienceStore, cap: int, seed: int,
               accept: Callable[[Experience], bool] = lambda e: True,
               since_id: int = 0, reservoir: int = DEFAULT_RESERVOIR,
               carried: Reservoir | None = None) -> RoundRead:
    """The round's experiences, at most ``cap`` new ones; see the module.

    ``since_id`` 0 (a bundle without a mark), or a mark beyond the store's newest row (the
    store was replaced): every episode, or a sample within ``cap``, in arrival order.
    Otherwise the reservoir's older rows come first, then the new rows in arrival order;
    ``carried`` is the reservoir recorded with the mark (``next_reservoir`` of the round
    that made it), None to choose it from the older rows' counts. Rows that arrive while
    the round reads are left to the next round.
    """
    through = store.last_id()
    since = since_id if 0 < since_id <= through else 0
    new_infos = store.episodes(after_id=since, through_id=through)
    chosen = choose_episodes(new_infos, cap, seed)
    experiences = [e for e in _rows(store, since, through)
                   if (e.robot_id, e.episode_id) in chosen and accept(e)]
    new = len(experiences)
    old = Reservoir(())
    if since and reservoir > 0:
        old = carried if carried is not None else _prefix(
            [_info_counted(i) for i in store.episodes(through_id=since)], reservoir, seed)
        experiences = [e for e in store.episodes_through(
            [(c[0], c[1]) for c in old.episodes], since, [(c[3], c[4]) for c in old.episodes])
            if accept(e)] + experiences
    merged: dict[tuple[str, str], Counted] = {}
    for c in (*old.episodes, *([old.stopper] if old.stopper else [])):
        merged[(c[0], c[1])] = c
    for info in new_infos:
        c, have = _info_counted(info), merged.get((info.robot_id, info.episode_id))
        merged[c[:2]] = c if have is None else (*c[:2], have[2] + c[2], min(have[3], c[3]),
                                                 max(have[4], c[4]))
    return RoundRead(experiences=experiences,
                     stored=store.count() if since else sum(i.count for i in new_infos),
                     episodes_read=len(chosen | {c[:2] for c in old.episodes}),
                     episodes_stored=None if since else len(new_infos),
                     since_id=since, through_id=through, new=new,
                     reservoir=len(experiences) - new,
                     next_reservoir=_prefix(merged.values(), reservoir, seed))


def _info_counted(info: EpisodeInfo) -> Counted:
    return info.robot_id, info.episode_id, info.count, info.min_id, info.max_id


def _prefix(counted: Iterable[Counted], budget: int, seed: int) -> Reservoir:
    """Whole episodes in priority order while their rows fit ``budget``.

    Stops at the first episode that does not fit (kept as the stopper): a prefix of the
    priority order, so the sample is uniform over episodes and a later round's reservoir
    keeps this one's episodes unless newer ones rank lower.
    """
    ranked = sorted(counted, key=lambda c: episode_priority(c[0], c[1], seed))
    total = 0
    for k, c in enumerate(ranked):
        if total + c[2] > budget:
            return Reservoir(tuple(ranked[:k]), ranked[k])
        total += c[2]
    return Reservoir(tuple(ranked))


def _rows(store: ExperienceStore, after_id: int, through_id: int):
    """Experiences with ``after_id`` < row id <= ``through_id``, a page at a time."""
    while after_id < through_id:
        rows = list(store.iter_experiences(after_id=after_id, limit=PAGE))
        for row_id, experience in rows:
            if row_id > through_id:
                return
            yield experience
        if len(rows) < PAGE:
            return
        after_id = rows[-1][0]
