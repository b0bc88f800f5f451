import math

import numpy as np
import pytest

from thinkmem_ros.world.event_worlds import (
    CONDITIONS,
    COUNTER_KINDS,
    WorldConfig,
    condition_config,
    generate_world,
    score_triples,
    world,
)


def _times(ep, name):
    return [t for t, n in ep.events if n == name]


def test_same_seed_same_world_and_different_seed_differs():
    a = world("heartbeat", 4, np.random.default_rng(3))
    b = world("heartbeat", 4, np.random.default_rng(3))
    c = world("heartbeat", 4, np.random.default_rng(4))
    assert [e.events for e in a.episodes] == [e.events for e in b.episodes]
    assert a.rules == b.rules and a.heartbeat == b.heartbeat
    assert [e.events for e in a.episodes] != [e.events for e in c.episodes]


@pytest.mark.parametrize("condition", sorted(CONDITIONS))
def test_every_condition_has_its_size_rules_and_counter_evidence(condition):
    w = world(condition, 8, np.random.default_rng(0))
    cfg = w.config
    assert len(w.episodes) == 120 and len(w.codes) == cfg.n_codes
    kinds = w.kinds()
    assert kinds["rule"] == 8 * cfg.n_rules
    for kind in COUNTER_KINDS:
        assert kinds[kind] == 2 * cfg.n_rules  # a quarter of the repetitions each
    background = [len(ep.events) for ep in w.episodes if ep.kind == "neutral"]
    assert 15 <= np.mean(background) - cfg.heartbeat <= 25
    for ep in w.episodes:
        times = [t for t, _ in ep.events]
        assert times == sorted(times) and 0 <= times[0] and times[-1] <= cfg.duration
        if ep.kind == "rule":  # complete and in order, steps 2-300 s apart
            a, b, c = w.rules[ep.rule]
            ok = [(ta, tb, tc) for ta in _times(ep, a) for tb in _times(ep, b)
                  for tc in _times(ep, c)
                  if 2 <= tb - ta <= 300 and 2 <= tc - tb <= 300]
            assert ok, (condition, ep.events)
        if ep.kind == "reversed_ba":
            a, b, _ = w.rules[ep.rule]
            assert any(tb < ta for ta in _times(ep, a) for tb in _times(ep, b))


def test_structures_share_and_chain_codes():
    shared = world("shared", 4, np.random.default_rng(1)).rules
    (a, b, c), (a2, d, e), (x, b2, c2) = shared
    assert a == a2 and (b, c) == (b2, c2) and len({a, b, c, d, e, x}) == 6
    chain = world("chain", 4, np.random.default_rng(1)).rules
    assert chain[0][2] == chain[1][0] and len({*chain[0], *chain[1], *chain[2]}) == 8


def test_heartbeat_is_frequent_and_leads_the_consequence_half_the_time():
    w = world("heartbeat", 16, np.random.default_rng(2))
    h = w.heartbeat
    assert h is not None and all(h not in rule for rule in w.rules)
    per_episode = [len(_times(ep, h)) for ep in w.episodes]
    assert 3.5 <= np.mean(per_episode) <= 5.5
    led, total = 0, 0
    for ep in w.episodes:
        if ep.kind != "rule":
            continue
        tc = min(_times(ep, w.rules[ep.rule][2]))
        total += 1
        led += any(1 <= tc - th <= 20 for th in _times(ep, h))
    assert 0.35 <= led / total <= 0.8


def test_zipf_is_skewed_and_rules_avoid_the_frequent_codes():
    w = world("zipf", 8, np.random.default_rng(5))
    rates = np.sort(w.rates)[::-1]
    assert rates[0] > 10 * rates[-1] and rates[0] > 3.0
    for rule in w.rules:
        assert all(w.rates[w.codes.index(code)] <= 0.5 for code in rule)


def test_decoys_burst_in_one_partition_and_null_stream_has_no_rules():
    w = world("decoy", 8, np.random.default_rng(6))
    assert len(w.decoys) == 2
    for d in range(2):
        assert len({ep.partition for ep in w.episodes if ep.kind == "decoy"
                    and ep.rule == d}) == 1
    null = generate_world(condition_config("sparse", n_episodes=1000, null_stream=True),
                          np.random.default_rng(6))
    assert null.rules == [] and len(null.episodes) == 1000
    assert set(null.kinds()) == {"neutral"}


@pytest.mark.parametrize("law", ["loguniform", "uniform", "exponential"])
def test_gap_laws_stay_in_bounds(law):
    w = generate_world(WorldConfig(gap_law=law, repetitions=16), np.random.default_rng(7))
    gaps = []
    for ep in w.episodes:
        if ep.kind == "rule":
            a, b, _ = w.rules[ep.rule]
            gaps += [tb - ta for ta in _times(ep, a) for tb in _times(ep, b) if tb > ta]
    gaps = np.array(gaps)
    assert gaps.size >= 48 and (gaps >= 2 - 1e-9).mean() > 0.95
    if law == "uniform":
        assert 100 < np.median(gaps) < 200
    else:
        assert np.median(gaps) < 100


def test_scoring_ignores_pairs_and_counts_heartbeat_triples_false():
    w = world("heartbeat", 4, np.random.default_rng(8))
    (a, b, c), *_ = w.rules
    found = {(a, b, c), (a, w.heartbeat, c), (a, b)}
    score = score_triples(found, w)
    assert score["tp"] == 1 and score["fp"] == 1 and score["fn"] == len(w.rules) - 1
    assert score["f1"] == pytest.approx(2 / (2 + 1 + len(w.rules) - 1))


def test_per_rule_repetitions():
    w = generate_world(WorldConfig(repetitions=(2, 4, 8)), np.random.default_rng(9))
    counts = [sum(ep.kind == "rule" and ep.rule == r for ep in w.episodes) for r in range(3)]
    assert counts == [2, 4, 8]
    assert WorldConfig(repetitions=8).counter_per_kind(1) == math.ceil(0.25)


@pytest.mark.parametrize("bad, key", [
    ({"gap_law": "cauchy"}, "gap_law"), ({"repetitions": (1, 2)}, "repetitions"),
    ({"gap_max": 1000.0}, "duration"), ({"repetitions": 40}, "n_episodes"),
    ({"structure": "shared", "n_rules": 2}, "structure"), ({"n_codes": 0}, "n_codes")])
def test_bad_config_names_the_key(bad, key):
    with pytest.raises(ValueError, match=key):
        WorldConfig(**bad)
    with pytest.raises(ValueError, match="condition"):
        condition_config("nope")


def test_phased_codes_keep_to_their_phase_and_other_worlds_are_unchanged():
    w = world("phased", 8, np.random.default_rng(2))
    duration = w.config.duration
    spread = {}
    for code in w.codes:
        times = [t for ep in w.episodes if ep.kind == "neutral" for t, n in ep.events
                 if n == code]
        if len(times) >= 20:
            spread[code] = np.std(times) / duration
    tight = [s for s in spread.values() if s < 0.15]  # uniform on [0, 1] has std 0.29
    assert 0.2 * len(spread) <= len(tight) <= 0.4 * len(spread)
    # a world without phased codes draws nothing for them: its seed gives the same world
    plain = world("sparse", 8, np.random.default_rng(2))
    same = generate_world(WorldConfig(repetitions=8, phased_share=0.0),
                          np.random.default_rng(2))
    assert [e.events for e in plain.episodes] == [e.events for e in same.episodes]
