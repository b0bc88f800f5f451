"""The checks' per-episode terms kept between rounds give the same relations as none.

A consolidator keeps one ``CheckMemo`` and calls ``discover`` on a history that grows
round by round; episodes can also change (an open one gets more events) and the
vocabulary can grow (new names renumber the codes). Each case compares every scored
relation, field by field, with a discovery that keeps nothing.
"""

from dataclasses import replace

import numpy as np
import pytest

from thinkmem_ros.consolidator.discovery import CheckMemo, DiscoveryConfig, EventLog, discover
from thinkmem_ros.world.event_episodes import EventWorldConfig, generate_event_history

CFG = DiscoveryConfig()


def _scored(log: EventLog, memo: CheckMemo | None = None) -> list[str]:
    result = discover(log, CFG, np.random.default_rng(0), memo=memo)
    return [repr(r) for r in result.scored]  # repr: NaN fields compare equal


@pytest.fixture(scope="module")
def history():
    """A world whose time is each event's position, as the consolidator's event log has it.

    (With clock times the median gap, and with it the scale ladder, moves as the history
    grows, and a new ladder drops every term: the memo would only be used on a repeat.)
    """
    hist = generate_event_history(EventWorldConfig(repetitions=8),
                                  np.random.default_rng(3))
    return replace(hist, episodes=[
        replace(ep, events=[(float(i), n) for i, (_, n) in
                            enumerate(sorted(ep.events, key=lambda e: e[0]))])
        for ep in hist.episodes])


def _accepted_episode(history) -> tuple[int, str]:
    """An episode supporting an accepted triple, and the triple's last code."""
    result = discover(EventLog.from_episodes(history.episodes, history.codes), CFG,
                      np.random.default_rng(0))
    triple = next(r for r in result.accepted if len(r.pattern) == 3)
    return triple.episodes[0], triple.pattern[2]


def test_rounds_with_a_memo_score_every_relation_as_without(history):
    episodes = list(history.episodes)
    changed_id, last_code = _accepted_episode(history)
    memo = CheckMemo()
    first = EventLog.from_episodes(episodes[:2 * len(episodes) // 3], history.codes)
    assert _scored(first, memo) == _scored(first)
    stats = memo.stats()
    assert stats["hits"] == 0 and stats["misses"] > 0 and stats["held"] == stats["misses"]

    # round 2: every episode; one episode that round 1 read loses its copies of a rule's
    # last code (its checks' terms change), and a new name renumbers every code
    grown = []
    for ep in episodes:
        if ep.episode_id == changed_id:
            ep = replace(ep, events=[(t, n) for t, n in ep.events if n != last_code])
        grown.append(ep)
    grown.append(replace(episodes[0], episode_id=10_000,
                         events=[(float(i), n) for i, (_, n) in enumerate(
                             [(0.0, "0_new_code")] + list(episodes[0].events))]))
    second = EventLog.from_episodes(grown)
    assert second.codes[0] == "0_new_code"  # every other code's number moved by one
    assert _scored(second, memo) == _scored(second)
    stats = memo.stats()
    assert stats["hits"] > 0 and stats["misses"] > 0


def test_a_changed_episode_is_not_served_its_old_terms(history, monkeypatch):
    """Keyed by row instead of content, the memo would serve stale terms: the test sees it."""
    from thinkmem_ros.consolidator.discovery import memo as memo_module

    episodes = list(history.episodes)
    changed_id, last_code = _accepted_episode(history)
    changed = [replace(ep, events=[(t, n) for t, n in ep.events if n != last_code])
               if ep.episode_id == changed_id else ep for ep in episodes]
    before = EventLog.from_episodes(episodes, history.codes)
    after = EventLog.from_episodes(changed, history.codes)
    fresh = _scored(after)

    kept = CheckMemo()
    _scored(before, kept)
    assert _scored(after, kept) == fresh

    class ByRow(memo_module.EpisodeDigests):
        def __call__(self, e: int) -> bytes:
            return str(e).encode()

    monkeypatch.setattr("thinkmem_ros.consolidator.discovery.EpisodeDigests", ByRow)
    stale = CheckMemo()
    _scored(before, stale)
    assert _scored(after, stale) != fresh


def test_a_small_memo_keeps_at_most_its_size_and_changes_nothing(history):
    log = EventLog.from_episodes(history.episodes, history.codes)
    memo = CheckMemo(max_entries=50)
    plain = _scored(log)
    assert _scored(log, memo) == plain
    assert memo.stats()["held"] <= 50
    assert _scored(log, memo) == plain
    assert memo.stats()["held"] <= 50


def test_terms_nobody_asks_for_leave_after_keep_rounds():
    memo = CheckMemo(keep_rounds=2)
    memo.begin(("cfg",))
    assert memo.get(("a",), lambda: 1) == 1 and memo.get(("b",), lambda: 2) == 2
    memo.end()
    memo.begin(("cfg",))
    assert memo.get(("a",), lambda: -1) == 1  # held: not worked out again
    assert memo.stats() == {"hits": 1, "misses": 0, "held": 2}
    memo.end()  # "b" was not asked for this round: kept for one more
    memo.begin(("cfg",))
    memo.end()
    assert memo.stats()["held"] == 1  # "b" two rounds unasked: gone; "a" asked last round
    memo.begin(("another cfg",))
    assert memo.stats()["held"] == 0


def test_another_configuration_drops_every_term(history):
    log = EventLog.from_episodes(history.episodes, history.codes)
    memo = CheckMemo()
    _scored(log, memo)
    wider = DiscoveryConfig(max_lookback=CFG.max_lookback - 1)
    discover(log, wider, np.random.default_rng(0), memo=memo)
    assert memo.stats()["hits"] == 0
