"""``bench fleet``'s pieces: the fleet stream it builds and one discovery size end to end."""

import numpy as np

from thinkmem_ros.bench import BENCHMARKS, load
from thinkmem_ros.bench.fleet import ROBOTS, discovery_at, fleet_log, plot


def test_the_fleet_stream_has_its_size_robots_partitions_and_rules():
    log, w, robot_of = fleet_log(60_000, 400, seed=3)
    assert abs(log.code.size - 60_000) < 3_000
    assert robot_of.max() + 1 == ROBOTS and log.n_partitions == 4
    assert np.all(np.diff(log.episode) >= 0)  # sorted by episode, then time
    same = log.episode[1:] == log.episode[:-1]
    assert np.all(np.diff(log.time)[same] >= 0)
    # the rule episodes are spread over the timeline, not bunched where they were drawn
    names = {c: i for i, c in enumerate(log.codes)}
    a, b, c = (names[x] for x in w.rules[0])
    holding = [e for e in range(len(log.episode_ids))
               if {a, b, c} <= set(log.code[log.episode == e].tolist())] \
        if len(log.episode_ids) < 5000 else []
    parts = {int(log.partition[e]) for e in holding}
    assert len(parts) >= 2


def test_one_size_runs_in_its_own_process_and_finds_the_rules(tmp_path):
    row = discovery_at(40_000, n_codes=2000, seed=1, timeout_s=300)
    assert "error" not in row, row
    assert row["rule_recall"] >= 0.9 and row["false_relations"] == 0
    assert 0 < row["peak_rss_gb"] < 4 and row["robots"] == ROBOTS
    report = {"curves": {"discovery": [row, {**row, "n_events": 80_000}]},
              "results": {"rule_recall_1e7": None, "false_relations_1e7": None,
                          "ingest_per_s_1": 1.0, "ingest_per_s_2": 2.0,
                          "receiver_kill": {"lost": 0}}}
    plot(report, tmp_path / "fleet.png")
    assert (tmp_path / "fleet.png").stat().st_size > 10_000
    assert "fleet" in BENCHMARKS and load("fleet").run is not None


def test_the_ray_run_is_compared_with_the_embedded_one_of_the_same_size():
    from thinkmem_ros.bench.fleet import _ray_results

    embedded = discovery_at(60_000, n_codes=2000, seed=2, timeout_s=300)
    ray = discovery_at(60_000, n_codes=2000, seed=2, timeout_s=300, engine="ray")
    assert "error" not in ray, ray
    assert ray["parts"] > 1 and ray["engine"] == "ray" and ray["patterns"]
    out = _ray_results(ray, [embedded])
    assert out["same_patterns"] is True and out["discovery_s_1e7"] is None
    assert out["discovery_s_1e6"] == ray["seconds"] and out["error"] is None


def test_a_rounds_read_is_measured_whole_and_incremental_on_the_same_stores(tmp_path):
    from thinkmem_ros.bench.round_read import read_scaling

    out = read_scaling((800, 1600), new=200, reservoir=500)
    small, large = out["rows"]
    for row in out["rows"]:  # the whole store, and the new rows plus whole old episodes
        assert row["whole_decoded"] == row["stored_before"] + 200
        assert row["new"] == 200 and 0 < row["reservoir"] <= 500
        assert row["incremental_decoded"] == row["new"] + row["reservoir"]
        assert row["incremental_counted_s"] > 0
        # discovery's histories: the carried fold reads only the new rows' episodes
        assert row["histories_scan_s"] > 0 and row["events"] > row["episodes"] > 0
        assert 0 < row["histories_folded_episodes"] <= row["episodes"]
    assert out["growth_whole"] is not None and out["growth_incremental"] is not None
    report = {"curves": {"discovery": []}, "round_read": out,
              "results": {"rule_recall_1e7": None, "false_relations_1e7": None,
                          "ingest_per_s_1": 1.0, "ingest_per_s_2": 2.0,
                          "receiver_kill": {"lost": 0}}}
    plot(report, tmp_path / "fleet.png")
    assert (tmp_path / "fleet.png").stat().st_size > 10_000
