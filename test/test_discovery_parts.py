"""Discovery over a log scanned in parts gives what one pass over the whole log gives.

Every statistic of the candidate tests is a sum over episodes; the partitioned scan
(``DiscoveryConfig.part_events``) adds them part by part. The worlds vary the generator,
the vocabulary, the background law and the gap law, and the part sizes cut episodes'
ranges at odd places, so an equality here is not a property of one generator.
"""

from dataclasses import replace

import numpy as np
import pytest

from thinkmem_ros.consolidator.discovery import DiscoveryConfig, EventLog, discover
from thinkmem_ros.world.event_episodes import EventWorldConfig, generate_event_history
from thinkmem_ros.world.event_worlds import WorldConfig, condition_config, generate_world


def _world_log(name: str) -> EventLog:
    rng = np.random.default_rng(len(name))
    if name == "paper":
        h = generate_event_history(EventWorldConfig(), rng)
        return EventLog.from_episodes(h.episodes, h.codes)
    if name == "bursty":  # a ladder continued past 64 median gaps, the whole log's
        from test_discovery import _bursty_episodes

        return EventLog.from_episodes(_bursty_episodes(1)[0])
    if name == "uniform_gaps_zipf":
        cfg = WorldConfig(code_law="zipf", gap_law="uniform", gap_min=5.0, gap_max=120.0,
                          repetitions=(8, 10, 12), n_episodes=100)
    else:
        cfg = condition_config(name, repetitions=8)
    w = generate_world(cfg, rng)
    return EventLog.from_episodes(w.episodes, w.codes)


def _scored(result):
    return [(r.pattern, r.accepted, r.support, r.reasons, r.episodes, r.p_value)
            for r in result.scored]


@pytest.mark.parametrize("name", ["paper", "heartbeat", "shared", "uniform_gaps_zipf",
                                  "bursty"])
def test_parts_give_the_whole_logs_relations(name):
    log = _world_log(name)
    whole = discover(log, DiscoveryConfig(part_events=0), np.random.default_rng(0))
    assert whole.notes["parts"] == 1
    assert whole.accepted  # the world's rules are found at all, so the comparison bites
    for part_events in (379, 1000):
        parts = discover(log, DiscoveryConfig(part_events=part_events),
                         np.random.default_rng(0))
        assert parts.notes["parts"] >= log.code.size // part_events
        got, want = _scored(parts), _scored(whole)
        assert [g[:5] for g in got] == [w[:5] for w in want], (name, part_events)
        np.testing.assert_allclose([g[5] for g in got], [w[5] for w in want], rtol=1e-9)
        for n in (2, 3):
            assert np.array_equal(parts.candidates[n], whole.candidates[n])


def test_parts_without_pairs_and_with_a_gap_window():
    log = _world_log("sparse")
    cfg = DiscoveryConfig(part_events=0, pairs=False, max_gap=400.0, min_gap=1.0)
    whole = discover(log, cfg, np.random.default_rng(0))
    parts = discover(log, replace(cfg, part_events=700), np.random.default_rng(0))
    assert parts.notes["parts"] > 1
    assert [r.pattern for r in parts.scored] == [r.pattern for r in whole.scored]
    assert parts.accepted_patterns() == whole.accepted_patterns()


def test_a_slice_is_episodes_renumbered_from_zero():
    log = _world_log("sparse")
    part = log.slice(10, 25)
    assert len(part.episode_ids) == 15 and part.episode.min() == 0
    assert part.episode.max() == 14
    lo, hi = np.searchsorted(log.episode, [10, 25])
    assert np.array_equal(part.code, log.code[lo:hi])
    assert np.array_equal(part.episode_ids, log.episode_ids[10:25])


def test_part_events_is_validated():
    with pytest.raises(ValueError, match="part_events"):
        DiscoveryConfig(part_events=-1)


def test_parts_built_a_few_candidates_at_a_time_give_the_same(monkeypatch):
    from thinkmem_ros.consolidator.discovery import scan

    log = _world_log("heartbeat")
    want = discover(log, DiscoveryConfig(part_events=0), np.random.default_rng(0))
    monkeypatch.setattr(scan, "FRAME_BLOCK", 400)  # several blocks per part
    got = discover(log, DiscoveryConfig(part_events=900), np.random.default_rng(0))
    _assert_same(got, want)


def _assert_same(got, want):
    """Same scored patterns, reasons and episodes; p-values to 1e-9 (summation order)."""
    a, b = _scored(got), _scored(want)
    assert [x[:5] for x in a] == [y[:5] for y in b]
    np.testing.assert_allclose([x[5] for x in a], [y[5] for y in b], rtol=1e-9)
    assert got.notes["family_2"] == want.notes["family_2"]
    assert got.notes["family_3"] == want.notes["family_3"]
    for n in (2, 3):
        assert np.array_equal(got.candidates[n], want.candidates[n])


def test_counts_and_frames_spilled_to_disk_give_the_same(monkeypatch, tmp_path):
    """A fleet log's key counts and frames go through files; results must not change."""
    from thinkmem_ros.consolidator import bucket_files, key_tally
    from thinkmem_ros.consolidator.discovery import spill

    log = _world_log("shared")
    want = discover(log, DiscoveryConfig(part_events=0), np.random.default_rng(0))
    made = []
    real = bucket_files.BucketFiles.__init__

    def counting(self, buckets, dtype, directory=None):
        real(self, buckets, dtype, str(tmp_path))
        made.append(self)

    monkeypatch.setattr(key_tally, "MEMORY_ROWS", 500)  # every tally spills
    monkeypatch.setattr(spill, "TEST_BLOCK", 300)  # many frame buckets
    monkeypatch.setattr(bucket_files.BucketFiles, "__init__", counting)
    got = discover(log, DiscoveryConfig(part_events=800), np.random.default_rng(0))
    _assert_same(got, want)
    tallies = [f for f in made if f.dtype.names == ("key", "count")]
    frames = [f for f in made if "cand" in f.dtype.names]
    assert len(tallies) == 4 and all(f.rows > 0 for f in tallies)
    assert len(frames) == 2 and all(f.buckets > 3 for f in frames)
    assert list(tmp_path.iterdir()) == []  # every spill folder removed


def test_the_python_loops_for_a_few_slots_agree_with_the_gap_matrices(monkeypatch):
    """``_tightest`` and ``_fits_any`` loop in Python below SMALL_SLOTS; the numpy path
    (gap matrices) must give the same answer on every episode, gap bound and lookback."""
    from thinkmem_ros.consolidator.discovery import occurrences as d

    rng = np.random.default_rng(7)
    cases = []
    for _ in range(400):
        n = int(rng.integers(2, 10))
        t = np.sort(rng.choice([0.0, 0.5, 1.0, 2.0, 3.5, 7.0, 11.0], n) + rng.integers(0, 3, n))
        pos = [np.sort(rng.choice(n, int(rng.integers(1, min(n, 3) + 1)), replace=False))
               for _ in range(int(rng.integers(2, 4)))]
        cfg = DiscoveryConfig(min_gap=float(rng.choice([0.0, 0.5])),
                                max_gap=float(rng.choice([np.inf, 3.0])),
                                max_lookback=int(rng.choice([1, 2, 256])))
        g = float(rng.choice([0.5, 2.0, 5.0, np.inf]))
        disjoint = [np.setdiff1d(p, np.concatenate(pos[:i]) if i else []) for i, p in
                    enumerate(pos)]  # an episode's slots hold one code each
        eligible = [d._eligible(t, disjoint, w, n, g, cfg) for w in range(len(pos))]
        cases.append((t, pos, cfg, g, d._tightest(t, pos, cfg),
                      d._fits_any(t, pos[0], pos[1], g, cfg), disjoint, eligible))
    monkeypatch.setattr(d, "SMALL_SLOTS", 0)  # every case through the gap matrices
    for t, pos, cfg, g, tight, fits, disjoint, eligible in cases:
        assert d._tightest(t, pos, cfg) == tight
        assert d._fits_any(t, pos[0], pos[1], g, cfg) == fits
        assert [d._eligible(t, disjoint, w, t.size, g, cfg)
                for w in range(len(pos))] == eligible
        assert fits == bool(d._fits(t, pos[0], pos[1], g, cfg).any())
