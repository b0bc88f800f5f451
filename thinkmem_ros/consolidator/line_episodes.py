"""Discovery's episodes of one line: leave out those another robot model recorded.

A consolidator serves one line of robots (the running bundle's signal set); the histories
carried in the store are per episode, whatever signal set recorded it. A store holding
another robot model's experiences (another line's store, a bundle line changed under it,
rows a bare receiver wrote) had discovery mine that model's events and promote its
regularities, while the round's training read none of its experiences
(``SignalSetFilter``: a round reads only its line's experiences).
"""

from __future__ import annotations

import logging

from thinkmem_ros.consolidator.histories import newest_within
from thinkmem_ros.consolidator.round_read import PAGE
from thinkmem_ros.consolidator.store import ExperienceStore, StoreError, is_fatal

log = logging.getLogger(__name__)

Episode = tuple[str, str]  # (robot id, episode id)


class RefusedEpisodes:
    """The episodes of stored experiences whose signal set this line does not serve.

    Judged by the fingerprint each row carries (``store.signal_sets`` counts them by
    column), so only the rows of a fingerprint this line does not serve are read. A record
    without one (wire versions 1-2) is judged by its bundle and window, which takes decoding
    every such row each round: its episode stays in discovery, as the receiver, which
    refuses other lines' records of that kind, stored it. Rows already judged are not read
    again while the served fingerprints stay the same, so a round reads only what arrived
    since the last one.
    """

    def __init__(self) -> None:
        self._refused: set[Episode] = set()
        self._judged_through = 0
        self._judged_line: frozenset = frozenset()

    def of(self, store: ExperienceStore, served: frozenset) -> set[Episode]:
        """(robot, episode) of every stored experience of a fingerprint not in ``served``."""
        if served != self._judged_line:  # another line: every row is judged again
            self._judged_line, self._judged_through = served, 0
            self._refused.clear()
        through = store.last_id()
        if through <= self._judged_through:
            return self._refused
        for fingerprint in store.signal_sets():
            if fingerprint and fingerprint not in served:
                self._read(store, fingerprint, through)
        self._judged_through = through
        return self._refused

    def _read(self, store: ExperienceStore, fingerprint: str, through: int) -> None:
        """Add the episodes of ``fingerprint``'s rows judged since the last call."""
        after = self._judged_through
        while after < through:
            page = list(store.iter_experiences(after_id=after, limit=PAGE,
                                               signal_set=fingerprint))
            self._refused.update((exp.robot_id, exp.episode_id)
                                 for row_id, exp in page if row_id <= through)
            if len(page) < PAGE:
                return
            after = page[-1][0]


def line_histories(store: ExperienceStore, rows: list[tuple], folded: dict,
                   refused: set[Episode], budget: int) -> tuple[list[tuple], dict]:
    """``carried_histories``'s answer (``rows``, ``folded``) less the ``refused`` episodes.

    The horizon is chosen among this line's episodes: when it held every episode the store
    carries, the refused ones are dropped from it; when it left episodes out, the refused
    ones took part of the budget, so it is chosen again, fairly between robots as
    ``carried`` does, over every carried history of this line (``newest_within``; only such
    a store pays that read). ``folded["refused_episodes"]`` counts the episodes left out.
    """
    if not refused:
        return rows, folded
    own = [r for r in rows if (r[0], r[1]) not in refused]
    folded = {**folded, "refused_episodes": len(refused)}
    if budget <= 0:
        return own, folded
    turn = folded.get("through_id", store.last_id())  # ``carried``'s tie-break
    if folded["horizon"]["left_out_episodes"] and len(own) < len(rows):
        try:
            own = [r for r in store.histories() if (r[0], r[1]) not in refused]
        except StoreError as exc:
            if is_fatal(exc):
                raise
            log.warning("%s: discovery reads this line's episodes of the horizon the "
                        "refused ones shared", exc)
    own, horizon = newest_within(own, budget, turn)
    folded["horizon"] = {"max_events": budget, "episodes": horizon.episodes,
                         "events": horizon.events, "scan_cost": horizon.cost,
                         "robots": horizon.robots, "left_out_episodes": horizon.left_out}
    return own, folded
