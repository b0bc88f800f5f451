"""Value table: clustering, TD, UCB, exploration, suppression, forgetting, artefact."""

from __future__ import annotations

import math

import numpy as np
import pytest

from thinkmem_ros.policy.value_table import ValueArtefactError, ValueConfig, ValueTable

LABELS = ["trend", "cause", "hazard", "future_impact", "information_seeking",
          "temp_current_inconsistency", "late_change_inspection"]


def _emb(axis: int, rng: np.random.Generator, d: int = 8, noise: float = 0.05) -> np.ndarray:
    e = np.zeros(d)
    e[axis] = 1.0
    return e + noise * rng.normal(size=d)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="alpha"):
        ValueConfig(alpha=0.0)
    with pytest.raises(ValueError, match="theta"):
        ValueConfig(theta=1.5)


def test_clustering_merges_near_and_opens_far():
    rng = np.random.default_rng(0)
    table = ValueTable(LABELS, 8)
    a = [table.assign(_emb(0, rng)) for _ in range(5)]
    b = table.assign(_emb(3, rng))
    assert a == [0] * 5 and b == 1 and table.n_clusters == 2
    assert table.lookup(_emb(3, rng)) == 1
    assert table.lookup(_emb(6, rng)) == -1  # novel, and lookup never opens a cluster
    assert table.n_clusters == 2


def test_td_update_and_bootstrap():
    table = ValueTable(LABELS, 4, ValueConfig(alpha=0.5, gamma=0.5, forgetting=False))
    s = table.assign(np.array([1.0, 0, 0, 0]))
    nxt = table.assign(np.array([0, 1.0, 0, 0]))
    table.update(nxt, "cause", 2.0)
    assert table.update(s, "trend", 1.0, next_s=nxt) == pytest.approx(1.0 + 0.5 * 2.0)
    # second visit: (1-a) Q + a (r + g max Q(s'))
    assert table.update(s, "trend", 0.0, next_s=nxt) == pytest.approx(0.5 * 2.0 + 0.5 * 1.0)
    assert table.n_sg[s, 0] == 2 and table.n_s[s] == 2
    assert math.isfinite(table.uncertainty(s, 0)) and math.isinf(table.uncertainty(s, 1))
    assert table.ucb(s, "trend") > table.q[s, 0]
    assert table.ucb(s, "cause") == math.inf


def test_epsilon_decays_as_documented():
    cfg = ValueConfig(horizon=100)
    assert cfg.epsilon(0) == pytest.approx(0.95)
    assert cfg.epsilon(100) == pytest.approx(0.95 * math.exp(-6))
    rng = np.random.default_rng(1)
    table = ValueTable(LABELS, 4, cfg)
    early = sum(table.explore(np.ones(4), ["trend"], 0, rng)[1] for _ in range(200))
    late = sum(table.explore(np.ones(4), ["trend"], 100, rng)[1] for _ in range(200))
    assert early > 150 and late < 10


def _learned(rng, forgetting=True) -> tuple[ValueTable, int]:
    table = ValueTable(LABELS, 8, ValueConfig(gamma=0.0, forgetting=forgetting))
    rewards = {"trend": -0.1, "cause": 1.0, "hazard": -0.5, "future_impact": 1.0,
               "information_seeking": 0.8, "temp_current_inconsistency": 0.9,
               "late_change_inspection": 1.0}
    for _ in range(30):
        s = table.assign(_emb(0, rng))
        for label, r in rewards.items():
            table.update(s, label, r + 0.05 * rng.normal())
    return table, s


def test_suppression_drops_low_value_but_never_hazard():
    rng = np.random.default_rng(2)
    table, s = _learned(rng, forgetting=False)
    ranked = table.rerank(_emb(0, rng), ["trend", "hazard", "cause", "future_impact"])
    assert ranked.suppressed == {"trend": "low_value"}
    assert ranked.kept[0] == "hazard"  # safety first even though its value is negative
    assert set(ranked.kept) == {"hazard", "cause", "future_impact"}
    # a novel situation keeps everything
    assert table.rerank(_emb(5, rng), ["trend"]).kept == ["trend"]


def test_forgetting_archives_with_counts_and_reactivates():
    rng = np.random.default_rng(3)
    table, s = _learned(rng)
    g = table.column("trend")
    assert table.archived[s, g] and table.n_sg[s, g] > 0  # counts kept in the archive
    assert len(table.valued(s)) <= 5 or not any(
        table._inconsistent(s, c, table.valued(s)[table.valued(s) != c])
        for c in table.valued(s))
    assert table.rerank(_emb(0, rng), ["trend"]).suppressed == {"trend": "archived"}
    assert table.rerank(_emb(0, rng), ["hazard"]).kept == ["hazard"]
    visits = table.n_sg[s, g]
    table.update(s, "trend", 2.0)  # supporting evidence
    assert not table.archived[s, g] and table.n_sg[s, g] == visits + 1
    assert any(e["event"] == "reactivate" for e in table.archive_log)


def test_consistent_entries_are_not_archived():
    rng = np.random.default_rng(4)
    table = ValueTable(LABELS, 8, ValueConfig(gamma=0.0))
    for _ in range(20):
        s = table.assign(_emb(0, rng))
        for label in LABELS:
            table.update(s, label, 1.0 + 0.05 * rng.normal())
    assert not table.archived.any() and table.entries == len(LABELS)


def test_artefact_round_trip_drops_empty_rows_and_columns(tmp_path):
    rng = np.random.default_rng(5)
    table, s = _learned(rng)
    table.assign(_emb(4, rng))  # a cluster with no valued entry: dropped when shipped
    table.save(tmp_path)
    loaded = ValueTable.load(tmp_path)
    assert loaded.n_clusters == 1 and set(loaded.labels) == set(table.labels)
    e = _emb(0, rng)
    active = ["trend", "cause", "hazard"]
    assert loaded.rerank(e, active).kept == table.rerank(e, active).kept
    assert loaded.rerank(e, active).suppressed == table.rerank(e, active).suppressed
    (tmp_path / "values.npz").write_bytes(b"tampered")
    with pytest.raises(ValueArtefactError, match="sha256"):
        ValueTable.load(tmp_path)


def test_learn_values_from_experiences(source_bundle):
    from thinkmem_ros.consolidator.values import learn_values
    from thinkmem_ros.link.experience import Experience
    from thinkmem_ros.policy.runtime import PolicyRuntime

    runtime = PolicyRuntime(source_bundle)
    rng = np.random.default_rng(6)
    k, f = runtime.window, len(runtime.signals)
    labels = runtime.labels
    exps = []
    for i in range(12):
        probs = np.zeros(len(labels), np.float32)
        probs[[0, 1]] = 0.99
        exps.append(Experience("r1", "ep1", float(i), rng.normal(size=(k, f)), labels, probs, 1,
                               reward=1.0, required=[labels[1]], seq=i))
    table = learn_values(exps, runtime, ValueConfig(theta=-0.99, gamma=0.0))
    assert table.n_clusters == 1
    assert table.q[0, 1] > 0.5 and table.q[0, 0] < 0  # not required -> token cost
    assert table.n_sg[0, 0] == 12


def test_activation_keyed_clusters_split_by_what_the_policy_activated(tmp_path):
    rng = np.random.default_rng(6)
    table = ValueTable(LABELS, 8, ValueConfig(gamma=0.0, activation_weight=1.0))
    for _ in range(10):  # same embedding region: trend alone earns, trend beside cause wastes
        alone = table.assign(_emb(0, rng), ["trend"])
        table.update(alone, "trend", 1.0 + 0.05 * rng.normal())
        both = table.assign(_emb(0, rng), ["trend", "cause"])
        table.update(both, "trend", -0.3 + 0.05 * rng.normal())
        table.update(both, "cause", 1.0 + 0.05 * rng.normal())
    assert alone != both and table.n_clusters == 2
    e = _emb(0, rng)
    assert table.rerank(e, ["trend"]).kept == ["trend"]
    assert table.rerank(e, ["trend", "cause"]).suppressed == {"trend": "low_value"}
    table.save(tmp_path)  # compaction drops unvalued columns; keys keep the full label list
    loaded = ValueTable.load(tmp_path)
    assert len(loaded.labels) == 2 and loaded.key_labels == LABELS
    assert loaded.rerank(e, ["trend", "cause"]).suppressed == {"trend": "low_value"}
    assert loaded.rerank(e, ["trend"]).kept == ["trend"]
    plain = ValueTable(LABELS, 8)  # w = 0: the activation does not enter the key
    assert plain.assign(_emb(0, rng), ["trend"]) == plain.assign(_emb(0, rng), ["cause"])


def _batch(table: ValueTable, rng: np.random.Generator) -> tuple[int, int, list]:
    a, b = table.assign(_emb(0, rng)), table.assign(_emb(3, rng))
    rows = [(a, 0, 1.0, b, 1.0), (a, 0, 0.0, b, 1.0), (a, 0, 0.5, b, 2.0),
            (a, 1, -0.1, b, 1.0), (a, 1, -0.1, b, 1.0), (a, 1, -0.1, b, 1.0),
            *[(b, 0, 0.2, -1, 1.0)] * 4]
    return a, b, rows


def test_fit_batch_is_the_order_free_weighted_td_fixed_point(tmp_path):
    rng = np.random.default_rng(2)
    fits = []
    for order in (None, rng.permutation(10)):
        table = ValueTable(LABELS, 8, ValueConfig(gamma=0.5))
        a, b, rows = _batch(table, np.random.default_rng(2))
        rows = rows if order is None else [rows[i] for i in order]
        assert table.fit_batch(*(list(col) for col in zip(*rows, strict=True))) == 3
        fits.append(table)
    table, again = fits
    np.testing.assert_allclose(table.q, again.q, atol=1e-12)  # whatever the sample order
    np.testing.assert_array_equal(table.n_sg, again.n_sg)
    # b is terminal: Q(b, trend) = 0.2 = V(b); a bootstraps from it
    assert table.q[b, 0] == pytest.approx(0.2)
    assert table.q[a, 0] == pytest.approx((1.0 + 0.0 + 2 * 0.5) / 4 + 0.5 * 0.2)
    assert table.n_sg[a, 0] == 4 and table.n_sg[a, 1] == 3  # visits = total weight
    ranked = table.rerank(_emb(0, np.random.default_rng(9)), ["trend", "cause"])
    assert ranked.worth["trend"] == pytest.approx(0.5)  # Q - gamma * Vbar: what trend earns
    assert ranked.worth["cause"] == pytest.approx(-0.1)
    table.save(tmp_path)  # the artefact format is the one the robot already loads
    loaded = ValueTable.load(tmp_path).rerank(_emb(0, rng), ["trend", "cause"])
    assert loaded.worth == pytest.approx(ranked.worth)


def test_fit_batch_archives_and_leaves_archived_values_out_of_bootstrap():
    table = ValueTable(LABELS, 8, ValueConfig(gamma=0.5, max_entries=1, consistency_z=0.0))
    rng = np.random.default_rng(4)
    a, b = table.assign(_emb(0, rng)), table.assign(_emb(3, rng))
    s = [a] * 4 + [b] * 8
    g = [0] * 4 + [0] * 4 + [1] * 4
    r = [0.0] * 4 + [-1.0] * 4 + [1.0] * 4
    table.fit_batch(s, g, r, [b] * 4 + [-1] * 8)
    assert table.archived[b, 0] and not table.archived[b, 1]
    assert table.q[a, 0] == pytest.approx(0.5 * 1.0)  # V(b) = 1: the archived -1 is left out
    with pytest.raises(ValueError, match="weights"):
        table.fit_batch([a], [0], [1.0], [-1], [0.0])
