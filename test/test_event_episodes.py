import numpy as np
import pytest

from thinkmem_ros.world.event_episodes import (
    COUNTER_KINDS,
    EventWorldConfig,
    generate_event_history,
)


def _small(**kw):
    return EventWorldConfig(n_codes=120, n_neutral=6, **kw)


def test_same_seed_same_history_and_different_seed_differs():
    a = generate_event_history(_small(repetitions=4), np.random.default_rng(3))
    b = generate_event_history(_small(repetitions=4), np.random.default_rng(3))
    c = generate_event_history(_small(repetitions=4), np.random.default_rng(4))
    assert [e.events for e in a.episodes] == [e.events for e in b.episodes]
    assert a.rules == b.rules and a.decoys == b.decoys
    assert [e.events for e in a.episodes] != [e.events for e in c.episodes]


def test_every_counter_evidence_kind_is_present_and_planted_correctly():
    cfg = _small(repetitions=4, counter_per_kind=2)
    hist = generate_event_history(cfg, np.random.default_rng(0))
    kinds = hist.kinds()
    assert kinds["rule"] == 4 * cfg.n_rules
    for kind in COUNTER_KINDS:
        assert kinds[kind] == 2 * cfg.n_rules
    assert kinds["neutral"] == cfg.n_neutral
    assert kinds["decoy"] == cfg.n_decoys * cfg.decoy_repetitions
    for ep in hist.episodes:
        names = [n for _, n in ep.events]
        times = [t for t, _ in ep.events]
        assert times == sorted(times)
        if ep.kind == "rule":
            a, b, c = hist.rules[ep.rule]
            ta = max(t for t, n in ep.events if n == a)
            # the planted chain has long gaps: some B at least gap_min after some A, etc.
            assert any(t - ta_ >= cfg.gap_min for t, n in ep.events if n == b
                       for ta_ in [t0 for t0, n0 in ep.events if n0 == a])
            assert c in names and ta is not None
        if ep.kind == "reversed_ba":
            a, b, _ = hist.rules[ep.rule]
            first_b = min(t for t, n in ep.events if n == b)
            assert any(t > first_b for t, n in ep.events if n == a)


def test_decoys_burst_in_one_partition_and_rules_use_distinct_codes():
    hist = generate_event_history(_small(repetitions=8), np.random.default_rng(1))
    for d in range(len(hist.decoys)):
        parts = {ep.partition for ep in hist.episodes if ep.kind == "decoy" and ep.rule == d}
        assert len(parts) == 1
    codes = [c for triple in hist.rules + hist.decoys for c in triple]
    assert len(codes) == len(set(codes))
    assert all(len(c) >= 4 and c.startswith("E") for c in codes)


def test_null_stream_has_no_rules_and_same_size():
    cfg = _small(repetitions=4)
    full = generate_event_history(cfg, np.random.default_rng(2))
    null = generate_event_history(_small(repetitions=4, null_stream=True),
                                  np.random.default_rng(2))
    assert null.rules == [] and null.decoys == []
    assert len(null.episodes) == len(full.episodes)
    assert set(null.kinds()) and null.kinds()["neutral"] == len(null.episodes)


@pytest.mark.parametrize("bad", [{"gap_min": 0.0}, {"n_codes": 5}, {"repetitions": -1},
                                 {"gap_max": 150.0}])
def test_bad_config_names_the_key(bad):
    with pytest.raises(ValueError):
        EventWorldConfig(**bad)
