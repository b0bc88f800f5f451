"""A round reads at most ``round_experiences`` decoded experiences: whole episodes, seeded."""

import tracemalloc

import numpy as np
import pytest
from test_store import exp

from thinkmem_ros.consolidator.round_read import choose_episodes, read_round
from thinkmem_ros.consolidator.store import EpisodeInfo, ExperienceStore
from thinkmem_ros.link.experience import encode_experience


def _fill(store, robots=3, episodes=10, per_episode=12, window=(2, 2)):
    seq = 0
    for r in range(robots):
        batch = []
        for e in range(episodes):
            for _ in range(per_episode):
                seq += 1
                record = exp(seq, robot=f"r{r}", episode=f"e{e}")
                batch.append(record)
        store.insert_many(batch)
    return robots * episodes * per_episode


def test_a_store_that_fits_is_read_whole_in_arrival_order(tmp_path):
    with ExperienceStore(tmp_path / "s.db", flush_rows=100) as store:  # lake and tail
        total = _fill(store)
        read = read_round(store, cap=total, seed=0)
        assert [e.seq for e in read.experiences] == list(range(1, total + 1))
        assert read.stored == total and not read.sampled


def test_a_larger_store_gives_a_sample_of_whole_episodes_within_the_cap(tmp_path):
    with ExperienceStore(tmp_path / "s.db", flush_rows=100) as store:
        total = _fill(store)
        read = read_round(store, cap=100, seed=3)
        assert read.sampled and read.stored == total
        assert 88 <= len(read.experiences) <= 100  # 12 per episode: 8 episodes fit
        per_episode = {}
        for e in read.experiences:
            per_episode[(e.robot_id, e.episode_id)] = per_episode.get(
                (e.robot_id, e.episode_id), 0) + 1
        assert set(per_episode.values()) == {12}  # episodes whole
        assert len({r for r, _ in per_episode}) > 1  # a sample across robots
        again = read_round(store, cap=100, seed=3)
        assert [e.seq for e in again.experiences] == [e.seq for e in read.experiences]
        other = read_round(store, cap=100, seed=4)
        assert [e.seq for e in other.experiences] != [e.seq for e in read.experiences]


def test_the_filter_drops_other_lines_records(tmp_path):
    with ExperienceStore(tmp_path / "s.db") as store:
        _fill(store, robots=2, episodes=2, per_episode=3)
        read = read_round(store, cap=0, seed=0, accept=lambda e: e.robot_id == "r1")
        assert {e.robot_id for e in read.experiences} == {"r1"}
        assert read.stored == 12


def test_memory_holds_the_sample_not_the_store(tmp_path):
    with ExperienceStore(tmp_path / "s.db", flush_rows=2000) as store:
        seq = 0
        for e in range(100):  # 6,000 experiences with 32 x 64 windows (~8 kB each)
            batch = []
            for _ in range(60):
                seq += 1
                record, _ = exp(seq, episode=f"e{e}")
                record.window = np.ones((32, 64), np.float32)
                batch.append((record, encode_experience(record)))
            store.insert_many(batch)
        tracemalloc.start()
        read = read_round(store, cap=300, seed=0)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        everything = list(store.iter_experiences())  # what a round used to hold
        _, whole = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(read.experiences) == 300 and len(everything) == 6000
        # the store decoded is ~6,000 x 8 kB; the round holds 300 of them and one page
        assert peak < whole / 4, (peak, whole)


@pytest.mark.parametrize("cap", [0, 10**9])
def test_no_cap_or_a_large_one_takes_every_episode(cap):
    infos = [EpisodeInfo("r", f"e{i}", 5, 0.0, 1.0) for i in range(4)]
    assert len(choose_episodes(infos, cap, 0)) == 4


def test_an_episode_larger_than_the_cap_is_taken_only_when_nothing_else_fits():
    infos = [EpisodeInfo("r", "big", 50, 0.0, 1.0), EpisodeInfo("r", "small", 5, 0.0, 1.0)]
    assert choose_episodes(infos, 10, 0) == {("r", "small")}
    assert choose_episodes(infos[:1] + [EpisodeInfo("r", "b2", 40, 0, 1)], 10, 0) == \
        {("r", "b2")}


def test_the_consolidator_refuses_a_negative_cap(tmp_path):
    from thinkmem_ros.consolidator.service import ConsolidatorConfig

    with pytest.raises(ValueError, match="round_experiences"):
        ConsolidatorConfig(signing_key=tmp_path / "k", round_experiences=-1)
