import numpy as np
import pytest

from thinkmem_ros.consolidator.discovery import DiscoveryConfig, EventLog, discover, relation_f1
from thinkmem_ros.world.event_episodes import Episode, EventWorldConfig, generate_event_history

CFG = DiscoveryConfig(permutations=40)


def _run(seed, **world):
    hist = generate_event_history(EventWorldConfig(**world), np.random.default_rng(seed))
    log = EventLog.from_episodes(hist.episodes, hist.codes)
    return hist, discover(log, CFG, np.random.default_rng(seed + 100))


@pytest.fixture(scope="module")
def eight():
    return _run(0, repetitions=8)


def test_planted_rules_recovered_at_eight_repetitions(eight):
    hist, res = eight
    found = res.accepted_patterns(3)
    assert relation_f1(found, set(hist.rules))["f1"] == 1.0
    for rel in res.accepted:
        if rel.pattern in set(hist.rules):
            assert rel.support >= 8 and rel.p_value <= CFG.alpha
            assert len(rel.episodes) == rel.support
            assert all(lo >= 0 for lo, _ in rel.gaps)
            assert rel.thinking == f"consider:{rel.pattern[-1]}"


def test_decoys_and_reversed_orders_rejected(eight):
    hist, res = eight
    found = res.accepted_patterns(3)
    by_pattern = {r.pattern: r for r in res.scored}
    for decoy in hist.decoys:
        assert decoy not in found
        assert any("partition" in reason for reason in by_pattern[decoy].reasons)
    for a, b, c in hist.rules:
        for wrong in [(b, a, c), (c, b, a), (a, c, b)]:
            assert wrong not in found
        # pairs of an accepted rule are folded into it, never reported on their own
        assert not res.accepted_patterns(2) & {(a, b), (b, c), (a, c)}


def test_candidate_stage_is_over_complete(eight):
    hist, res = eight
    assert all(res.is_candidate(rule) for rule in hist.rules)
    assert len(res.candidates[3]) > 10 * len(hist.rules)


def test_single_repetition_gives_nothing():
    hist, res = _run(1, repetitions=1)
    assert not res.accepted_patterns(3) & set(hist.rules)


def test_null_stream_accepts_nothing():
    _, res = _run(2, repetitions=8, null_stream=True)
    assert res.accepted == []


def test_reversed_majority_is_rejected_by_order_clause():
    # a hand-built history: A...B...C in 5 episodes, but B...A in 6 others
    eps = []
    for i in range(11):
        events = [(0.0, "A"), (10.0, "B"), (20.0, "C")] if i < 5 else [(0.0, "B"), (10.0, "A")]
        events += [(5.0 + j, f"N{(i * 7 + j) % 40}") for j in range(3)]
        eps.append(Episode(episode_id=i, partition=i % 3, start_time=0.0, kind="x", rule=-1,
                           events=sorted(events)))
    log = EventLog.from_episodes(eps)
    res = discover(log, DiscoveryConfig(permutations=40, pairs=False), np.random.default_rng(0))
    rel = {r.pattern: r for r in res.scored}.get(("A", "B", "C"))
    assert rel is not None and not rel.accepted
    assert any("reverse" in reason for reason in rel.reasons)


def test_local_gap_limit_loses_long_range_rules(eight):
    hist, _ = eight
    log = EventLog.from_episodes(hist.episodes, hist.codes)
    res = discover(log, DiscoveryConfig(permutations=20, max_gap=5.0), np.random.default_rng(0))
    assert not res.accepted_patterns(3) & set(hist.rules)


def test_bad_config_rejected():
    with pytest.raises(ValueError, match="alpha"):
        DiscoveryConfig(alpha=1.5)
    with pytest.raises(ValueError, match="accept_support"):
        DiscoveryConfig(candidate_support=4, accept_support=3)


def test_unknown_event_rejected():
    ep = Episode(episode_id=0, partition=0, start_time=0.0, kind="x", rule=-1,
                 events=[(0.0, "Z")])
    with pytest.raises(ValueError, match="vocabulary"):
        EventLog.from_episodes([ep], codes=("A",))
