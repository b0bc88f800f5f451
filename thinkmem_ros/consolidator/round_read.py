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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from thinkmem_ros.consolidator.store import EpisodeInfo, ExperienceStore
from thinkmem_ros.link.experience import Experience

DEFAULT_ROUND_EXPERIENCES = 200_000  # ~0.5-1 GB of decoded experiences at 32 x 7 windows
PAGE = 500  # experiences decoded at a time while reading (a few MB)


@dataclass(frozen=True)
class RoundRead:
    """The experiences a round works on, and how many the store held."""

    experiences: list[Experience]
    stored: int  # experiences in the store (every signal set)
    episodes_read: int
    episodes_stored: int

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


def read_round(store: ExperienceStore, cap: int, seed: int,
               accept: Callable[[Experience], bool] = lambda e: True) -> RoundRead:
    """The round's experiences (arrival order), at most ``cap`` of them; see the module."""
    infos = store.episodes()
    chosen = choose_episodes(infos, cap, seed)
    experiences = [e for e in store.iter_all(page=PAGE)
                   if (e.robot_id, e.episode_id) in chosen and accept(e)]
    return RoundRead(experiences=experiences, stored=sum(i.count for i in infos),
                     episodes_read=len(chosen), episodes_stored=len(infos))
