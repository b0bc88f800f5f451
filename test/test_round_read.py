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


def _episode_counts(experiences):
    counts = {}
    for e in experiences:
        counts[(e.robot_id, e.episode_id)] = counts.get((e.robot_id, e.episode_id), 0) + 1
    return counts


@pytest.mark.parametrize("flush_rows", [0, 100])  # the tail alone, and lake plus tail
def test_a_marked_round_reads_the_new_rows_and_a_reservoir_of_whole_older_episodes(
        tmp_path, flush_rows):
    with ExperienceStore(tmp_path / "s.db", flush_rows=flush_rows) as store:
        old_total = _fill(store)  # 3 robots x 10 episodes x 12
        mark = store.last_id()
        batch = [exp(10_000 + i, robot="r0", episode="new") for i in range(30)]
        store.insert_many(batch)
        read = read_round(store, cap=0, seed=0, since_id=mark, reservoir=50)
        assert (read.since_id, read.through_id) == (mark, store.last_id())
        assert read.new == 30 and read.stored == old_total + 30
        assert [e.seq for e in read.experiences[-30:]] == [10_000 + i for i in range(30)]
        older = _episode_counts(read.experiences[:-30])
        assert read.reservoir == sum(older.values()) == 48  # 4 whole episodes of 12 fit 50
        assert set(older.values()) == {12} and ("r0", "new") not in older
        again = read_round(store, cap=0, seed=0, since_id=mark, reservoir=50)
        assert [e.seq for e in again.experiences] == [e.seq for e in read.experiences]
        none = read_round(store, cap=0, seed=0, since_id=mark, reservoir=0)
        assert [e.seq for e in none.experiences] == [10_000 + i for i in range(30)]


def test_the_reservoir_keeps_its_episodes_as_the_history_grows(tmp_path):
    """A prefix of a fixed priority order: later rounds keep earlier picks unless newer
    episodes rank lower, and the sample spreads over the whole history."""
    with ExperienceStore(tmp_path / "s.db", flush_rows=0) as store:
        _fill(store, robots=2, episodes=20, per_episode=3)
        first_mark = store.last_id()
        first = _episode_counts(read_round(store, cap=0, seed=1, since_id=first_mark,
                                           reservoir=30).experiences)
        _fill_more = [exp(50_000 + i, robot="r9", episode=f"late{i // 3}") for i in range(60)]
        store.insert_many(_fill_more)
        later = _episode_counts(read_round(store, cap=0, seed=1, since_id=store.last_id(),
                                           reservoir=30).experiences)
        assert len(first) == len(later) == 10
        newcomers = set(later) - set(first)
        assert all(r == "r9" for r, _ in newcomers)  # only newer episodes can displace
        assert len({r for r, _ in later}) >= 2


def test_a_mark_past_the_store_reads_everything(tmp_path):
    """A mark from another store (ids beyond this one's newest row) is not trusted."""
    with ExperienceStore(tmp_path / "s.db", flush_rows=0) as store:
        total = _fill(store, robots=1, episodes=3, per_episode=4)
        read = read_round(store, cap=0, seed=0, since_id=store.last_id() + 100)
        assert read.since_id == 0 and len(read.experiences) == total == read.new


def test_the_new_rows_obey_the_cap_as_whole_episodes(tmp_path):
    with ExperienceStore(tmp_path / "s.db", flush_rows=0) as store:
        _fill(store, robots=1, episodes=2, per_episode=5)
        mark = store.last_id()
        store.insert_many([exp(1000 + i, robot="r5", episode=f"n{i // 10}") for i in range(100)])
        read = read_round(store, cap=35, seed=2, since_id=mark, reservoir=0)
        counts = _episode_counts(read.experiences)
        assert read.new == 30 and set(counts.values()) == {10}


def test_the_consolidator_refuses_a_negative_reservoir(tmp_path):
    from thinkmem_ros.consolidator.service import ConsolidatorConfig

    with pytest.raises(ValueError, match="round_reservoir"):
        ConsolidatorConfig(signing_key=tmp_path / "k", round_reservoir=-1)


@pytest.mark.parametrize("budget", [7, 40, 400])
def test_a_carried_reservoir_is_the_one_the_row_counts_would_choose(tmp_path, budget):
    """Each round chooses the next reservoir from its own reservoir and new episodes only;
    over rounds whose rows extend older episodes (the stopper's too) it stays the prefix
    a count over every older row gives."""
    rng = np.random.default_rng(budget)
    with ExperienceStore(tmp_path / "s.db", flush_rows=150) as store:
        seq, episodes, mark, carried = 0, [], 0, None
        for _ in range(6):
            batch = []
            for _ in range(int(rng.integers(20, 60))):
                if episodes and rng.random() < 0.4:  # an older episode goes on
                    robot, episode = episodes[int(rng.integers(len(episodes)))]
                else:
                    robot, episode = f"r{rng.integers(3)}", f"e{len(episodes)}"
                    episodes.append((robot, episode))
                seq += 1
                batch.append(exp(seq, robot=robot, episode=episode))
            store.insert_many(batch)
            with_carried = read_round(store, cap=0, seed=5, since_id=mark, reservoir=budget,
                                      carried=carried)
            counted = read_round(store, cap=0, seed=5, since_id=mark, reservoir=budget)
            assert [e.seq for e in with_carried.experiences] == \
                [e.seq for e in counted.experiences]
            assert with_carried.next_reservoir == counted.next_reservoir
            if mark:
                assert with_carried.reservoir > 0 or budget < 10
            mark, carried = with_carried.through_id, with_carried.next_reservoir
        assert sum(c[2] for c in carried.episodes) <= budget


def test_a_reservoir_round_trips_through_json_and_refuses_garbage():
    from thinkmem_ros.consolidator.round_read import Reservoir

    kept = Reservoir((("r1", "e1", 4, 10, 13), ("r2", "e9", 2, 5, 6)), ("r1", "e3", 50, 1, 99))
    assert Reservoir.from_json(kept.to_json()) == kept
    assert Reservoir.from_json(Reservoir(()).to_json()) == Reservoir(())
    for garbage in (None, [], [[["r", "e"]], None], [[["r", "e", "x", 1, 2]], None], "abc",
                    [[["r", "e", 4]], None]):  # the form without row-id spans
        with pytest.raises(ValueError, match="not a recorded reservoir"):
            Reservoir.from_json(garbage)
