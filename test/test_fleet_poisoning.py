"""One robot, or a few, cannot steer the values and probes every robot gets, nor break a fit."""

from __future__ import annotations

import tracemalloc
from dataclasses import replace

import consolidator_world as world
import numpy as np
import pytest
import torch

from thinkmem_ros.consolidator.memctl_train import (
    compress_targets,
    experience_targets,
    fit_memctl_heads,
    fit_probe,
    fit_round_memctl,
    probe_weights,
    recall_targets,
    set_frequencies,
)
from thinkmem_ros.consolidator.values import (
    REWARD_BOUND,
    cap_level,
    fit_round_values,
    label_rewards,
    learn_values,
    robot_weights,
)
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.policy.runtime import PolicyRuntime
from thinkmem_ros.policy.value_table import ValueConfig, ValueTable

ONE_CLUSTER = ValueConfig(theta=-0.99, gamma=0.0)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory) -> PolicyRuntime:
    torch.set_num_threads(1)
    return PolicyRuntime(world.running_bundle(tmp_path_factory.mktemp("fleet") / "b"),
                         threads=1)


def _rated(runtime, robot: str, n: int, reward, seed: int, label: str = "trend",
           episode_len: int = 5) -> list[Experience]:
    """``n`` records of ``robot`` that activated and needed ``label``, rewarded ``reward``."""
    rng = np.random.default_rng(seed)
    labels = list(runtime.labels)
    out = []
    for i in range(n):
        window, _ = world.situation(rng)
        probs = np.full(len(labels), 0.1, np.float32)
        probs[labels.index(label)] = 0.9
        r = reward(rng) if callable(reward) else reward
        out.append(Experience(robot, f"ep{i // episode_len}", float(i), window, labels,
                              probs, 1, events=[], required=[label], reward=r, seq=i))
    return out


def _honest(runtime, robots: int = 8, per_robot: int = 5) -> list[Experience]:
    return [e for k in range(robots)
            for e in _rated(runtime, f"robot{k}", per_robot,
                            lambda rng: 0.8 + 0.1 * rng.random(), seed=k)]


# ---------------------------------------------------------------- values


def test_rewards_are_clipped_to_the_documented_range(runtime):
    exp = _rated(runtime, "r", 1, 1e15, seed=0)[0]
    assert label_rewards(exp, {}) == {"trend": REWARD_BOUND}
    assert label_rewards(replace(exp, reward=-1e15), {}) == {"trend": -REWARD_BOUND}
    fleet = _honest(runtime) + _rated(runtime, "evil", 5, 1e15, seed=9, label="cause")
    table = learn_values(fleet, runtime)
    # |Q| <= bound / (1 - gamma): no value swamps the others through the bootstrap term
    assert np.abs(table.q).max() <= REWARD_BOUND / (1 - table.config.gamma) + 1e-9


def test_the_value_table_does_not_depend_on_robot_ids_or_store_order(runtime):
    rng = np.random.default_rng(3)
    fleet = [replace(e, reward=float(rng.uniform(-1, 1)))
             for k in range(4) for e in _rated(runtime, f"robot{k}", 12, 0.0, seed=20 + k)]
    first = learn_values(fleet, runtime)
    renamed = {f"robot{k}": f"robot{(k + 1) % 4}" for k in range(4)}
    shuffled = [replace(fleet[i], robot_id=renamed[fleet[i].robot_id])
                for i in rng.permutation(len(fleet))]
    second = learn_values(shuffled, runtime)
    np.testing.assert_array_equal(first.centroids, second.centroids)
    np.testing.assert_allclose(first.q, second.q, atol=1e-12)
    np.testing.assert_array_equal(first.n_sg, second.n_sg)


def test_the_robot_whose_id_sorts_last_does_not_decide(runtime):
    fleet = _honest(runtime) + _rated(runtime, "zzz-evil", 5, -1.0, seed=9)
    table = learn_values(fleet, runtime, ONE_CLUSTER)
    col = table.column("trend")
    assert table.q[0, col] > 0.5  # the mean of 45 targets, not the last five
    assert table.should_suppress(0, "trend") is None


def test_one_robot_flooding_a_cell_carries_at_most_its_share(runtime):
    fleet = _honest(runtime) + _rated(runtime, "evil", 60, -1.0, seed=9)
    table = learn_values(fleet, runtime, ONE_CLUSTER)
    col = table.column("trend")
    assert table.should_suppress(0, "trend") is None  # pooled: 60 of 100 records say -1
    # 8 honest robots x 5: the flood counts as 40 / 3 records (a quarter of the cell)
    assert table.n_sg[0, col] == round(40 + 40 / 3)
    assert table.q[0, col] == pytest.approx((40 * 0.85 - 40 / 3) / (40 + 40 / 3), abs=0.05)


def test_cap_level_and_weights():
    assert cap_level([60] + [5] * 9) == pytest.approx(15.0)  # 15 = 0.25 * (45 + 15)
    assert cap_level([10, 10, 10, 10, 1]) == 10.0  # nobody over the share: no cap
    assert cap_level([100, 2]) == 2.0  # two robots: balanced
    assert cap_level([7]) == 7.0  # a lone robot keeps its evidence
    w = robot_weights([0] * 62 + [1] * 3, ["evil"] * 60 + ["a", "b"] + ["evil"] * 3)
    assert w[:60].sum() == pytest.approx(1.0)  # three robots in group 0: one vote each
    assert w[60:62].tolist() == [1.0, 1.0] and w[62:].tolist() == [1.0] * 3


def test_a_record_that_embeds_to_nan_is_dropped_not_fatal(runtime, tmp_path):
    fleet = _honest(runtime, robots=4, per_robot=15)
    bad = replace(fleet[0], robot_id="evil", window=np.full_like(fleet[0].window, 3e38))
    info = fit_round_values(fleet + [bad], runtime, tmp_path / "v")
    assert info["status"] == "fitted" and info["dropped_nonfinite"] == 1
    assert ValueTable.load(tmp_path / "v").n_clusters > 0


# ---------------------------------------------------------------- memory control


def _judged(robot: str, n_episodes: int, per_episode: int, seed: int) -> list[Experience]:
    return [replace(e, robot_id=robot) for e in world.experiences(robot, n_episodes,
                                                                  per_episode, seed=seed)]


def test_memctl_nonfinite_rows_are_dropped_and_the_probes_still_fit(runtime, tmp_path):
    records = _judged("r1", 44, 5, seed=1)
    bad = replace(records[0], robot_id="evil", episode_id="big",
                  window=np.full_like(records[0].window, 3e38))
    info = fit_round_memctl(records + [bad], runtime, tmp_path / "m")
    assert info["status"] == "fitted" and info["dropped_nonfinite"] == 1


def test_memctl_targets_memory_does_not_follow_stamps():
    records = _judged("r1", 2, 3, seed=1)
    long = [replace(records[0], episode_id="long", stamp=0.0),
            replace(records[1], episode_id="long", stamp=1e5),
            replace(records[2], episode_id="long", stamp=1e15)]
    tracemalloc.start()
    try:
        ordered, compress, recall = experience_targets(records + long, ["trend", "hazard"],
                                                       10.0, 4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000  # a dense per-frame array of 1e5 s alone would be 8 MB
    near = [replace(e, stamp=s) for e, s in zip(long, (0.0, 10.0, 20.0), strict=True)]
    assert experience_targets(records + near, ["trend", "hazard"], 10.0, 4)[1].tolist() \
        == compress.tolist()  # a gap beyond every span a rule reads changes no target
    assert len(ordered) == compress.size == recall.size == 9


def _dense_reference(episodes, names, rate, window):
    """The per-frame construction the rules are defined on (frames repeat the last set)."""
    dense_eps = []
    for episode in episodes:
        at = np.maximum.accumulate(np.round((np.array([e.stamp for e in episode])
                                             - episode[0].stamp) * rate)).astype(int)
        rows = np.array([[1.0 if n in e.required else 0.0 for n in names] for e in episode])
        owner = np.searchsorted(at, np.arange(at[-1] + 1), side="right") - 1
        dense_eps.append((rows[owner], at))
    freq = set_frequencies(np.concatenate([d[a] for d, a in dense_eps]))
    return (np.concatenate([compress_targets(d, a, window, rate, label_names=names)
                            for d, a in dense_eps]),
            np.concatenate([recall_targets(d, a, rate, freq) for d, a in dense_eps]))


def test_sparse_targets_equal_the_per_frame_rules():
    rng = np.random.default_rng(5)
    names = ["trend", "hazard", "cause"]
    records = []
    for ep in range(30):
        stamp = 0.0
        for i in range(int(rng.integers(1, 12))):
            stamp += float(rng.choice([0.0, 0.1, 0.3, 1.0, 2.5, 40.0]))  # repeats and gaps
            required = [n for n in names if rng.random() < 0.3]
            records.append(Experience("r1", f"ep{ep:02d}", stamp, np.zeros((4, 7), np.float32),
                                      names, np.zeros(3, np.float32), 1, events=[],
                                      required=required, seq=i))
    ordered, compress, recall = experience_targets(records, names, 10.0, 4)
    episodes = [[e for e in ordered if e.episode_id == f"ep{ep:02d}"] for ep in range(30)]
    ref_c, ref_r = _dense_reference(episodes, names, 10.0, 4)
    assert compress.tolist() == ref_c.tolist() and recall.tolist() == ref_r.tolist()


def test_one_robots_flood_does_not_decide_which_label_sets_are_rare():
    honest = []
    for k in range(6):  # every record its own episode: RECALL is the rare rule alone
        for i in range(100):
            required = ["trend"] if i < 3 else []  # {trend}: 3 % of honest records
            honest.append(Experience(f"robot{k}", f"e{i}", 0.0, np.zeros((4, 7), np.float32),
                                     ["trend", "hazard"], np.zeros(2, np.float32), 1,
                                     events=[], required=required))
    flood = [replace(honest[-1], robot_id="evil", episode_id=f"x{i}", required=["hazard"])
             for i in range(1000)]
    ordered, _, recall = experience_targets(honest + flood, ["trend", "hazard"], 10.0, 4)
    rare = {e.robot_id for e, r in zip(ordered, recall, strict=True) if r}
    assert rare == set()  # pooled, {trend} fell to 18 / 1600 = 1.1 %: "rare" for every robot


def test_one_robot_in_the_rare_class_does_not_steer_the_probe():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 4))
    y = (x[:, 0] > -1.6).astype(int)  # RECALL: 95 % positive, 32 honest negatives
    robots = [f"robot{i % 6}" for i in range(600)] + ["evil"] * 60
    evil_x = rng.normal(size=(60, 4))
    evil_x[:, 0] = rng.uniform(0.0, 2.0, size=60)  # honest-looking positive situations ...
    x_all = np.vstack([x, evil_x])
    y_all = np.concatenate([y, np.zeros(60, int)])  # ... all labelled 0
    w = probe_weights(y_all, robots)
    assert w[600:].sum() / w[y_all == 0].sum() == pytest.approx(0.25)  # pooled: 65 %
    test = rng.normal(size=(2000, 4))
    test = test[test[:, 0] > -1.6]
    heads = fit_memctl_heads(x_all, y_all, y_all, robots=robots)
    fires = (heads.recall.probability(test) >= heads.recall.threshold).mean()
    assert fires > 0.75  # 0.97 without the flood, 0.57 with it pooled


def test_one_robots_probe_weights_are_sklearns_balanced_ones():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 3))
    y = (x[:, 0] > 1.0).astype(int)
    w = probe_weights(y, ["r1"] * 200)
    assert w.sum() == pytest.approx(200)
    assert w[y == 1].sum() == pytest.approx(100) and w[y == 0].sum() == pytest.approx(100)
    ours = fit_probe(x, y, weight=w)
    theirs = fit_probe(x, y)
    np.testing.assert_allclose(ours.weights, theirs.weights, rtol=1e-4, atol=1e-6)


def test_a_fleet_with_nobody_over_its_share_fits_as_one_pooled_robot():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(600, 4))
    compress = (x[:, 0] > 1.2).astype(int)
    recall = (x[:, 1] > -1.0).astype(int)
    pooled = fit_memctl_heads(x, compress, recall)
    fleet = fit_memctl_heads(x, compress, recall, robots=[f"r{i % 6}" for i in range(600)])
    for ours, theirs in ((fleet.compress, pooled.compress), (fleet.recall, pooled.recall)):
        np.testing.assert_allclose(ours.weights, theirs.weights, rtol=0.05, atol=0.02)
        assert ours.threshold == pytest.approx(theirs.threshold, abs=0.02)
