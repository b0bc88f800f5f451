"""What a consolidation round reads from the store: bounded, whole episodes, seeded.

Retraining material, values and memory-control targets are built from decoded
experiences (each carries its signal window), so reading the whole store into memory is
what a round would outgrow first as the fleet's history grows. A round instead reads at
most ``cap`` experiences: every episode when the store holds no more than that (the round
sees what it always saw), otherwise a seeded uniform sample of whole episodes (memory
control and rule horizons read an episode's experiences in order, so episodes are kept
whole). The store is read a page at a time, so memory holds the sample and one page, not
the store. Discovery does not read experiences: it reads each episode's event history
(``service.event_log``), which is a few names per episode.

Rounds after the first read what is new. The running bundle was trained on the store up to
a row id (its mark, ``round_marks``), and what it learned from older rows is carried by its
rehearsal set D (``rehearsal.py``: the training set behind it, capped). So a round on top
of a marked bundle decodes the rows that arrived after the mark (at most ``cap``, whole new
episodes sampled as above) and a *reservoir*: at most ``reservoir`` experiences of whole
older episodes, a uniform sample over the history (each episode's priority is a seeded
hash of its key, and the lowest priorities are taken while they fit, so the sample is the
same from round to round except where new episodes rank lower). Values, memory control
and rule horizons still see the past through it; their cost no longer grows with every
round's store. Choosing the reservoir counts rows per episode (ids and stamps, not
payloads): that metadata query is the only part of the read that sees the whole store.
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


@dataclass(frozen=True)
class RoundRead:
    """The experiences a round works on, and how many the store held."""

    experiences: list[Experience]
    stored: int  # experiences in the store (every signal set)
    episodes_read: int
    episodes_stored: int
    since_id: int = 0  # rows after this id were new to the running bundle (0: all)
    through_id: int = 0  # the newest row id when the round read (the next round's mark)
    new: int = 0  # experiences read from rows after ``since_id``
    reservoir: int = 0  # experiences read from older episodes (the reservoir)

    @property
    def sampled(self) -> bool:
        """Whether the round read a sample of the episodes rather than all of them."""
        return self.episodes_read < self.episodes_stored


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


def episode_priority(info: EpisodeInfo, seed: int) -> int:
    """A seeded, stable pseudo-random rank of an episode (the same in every round)."""
    text = f"{seed}\n{info.robot_id}\n{info.episode_id}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def choose_reservoir(infos: Iterable[EpisodeInfo], budget: int, seed: int
                     ) -> list[tuple[str, str]]:
    """Whole episodes in priority order while their experiences fit ``budget``.

    Stops at the first episode that does not fit (a prefix of the priority order), so the
    sample is uniform over episodes and a later round's reservoir keeps this one's episodes
    unless newer ones rank lower.
    """
    chosen, total = [], 0
    for info in sorted(infos, key=lambda i: episode_priority(i, seed)):
        if total + info.count > budget:
            break
        chosen.append((info.robot_id, info.episode_id))
        total += info.count
    return chosen


def read_round(store: ExperienceStore, cap: int, seed: int,
               accept: Callable[[Experience], bool] = lambda e: True,
               since_id: int = 0, reservoir: int = DEFAULT_RESERVOIR) -> RoundRead:
    """The round's experiences, at most ``cap`` new ones; see the module.

    ``since_id`` 0 (a bundle without a mark), or a mark beyond the store's newest row (the
    store was replaced): every episode, or a sample within ``cap``, in arrival order.
    Otherwise the reservoir's older rows come first, then the new rows in arrival order.
    Rows that arrive while the round reads are left to the next round.
    """
    through = store.last_id()
    since = since_id if 0 < since_id <= through else 0
    infos = store.episodes(through_id=through)
    new_infos = store.episodes(after_id=since, through_id=through) if since else infos
    chosen = choose_episodes(new_infos, cap, seed)
    experiences = [e for e in _rows(store, since, through)
                   if (e.robot_id, e.episode_id) in chosen and accept(e)]
    new, kept = len(experiences), []
    if since and reservoir > 0:
        kept = choose_reservoir(store.episodes(through_id=since), reservoir, seed)
        experiences = [e for e in store.episodes_through(kept, since) if accept(e)] \
            + experiences
    return RoundRead(experiences=experiences, stored=sum(i.count for i in infos),
                     episodes_read=len(chosen | set(kept)), episodes_stored=len(infos),
                     since_id=since, through_id=through, new=new,
                     reservoir=len(experiences) - new)


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
