import json
import sqlite3
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from thinkmem_ros.consolidator.discovery import (
    DiscoveryConfig,
    DiscoveryResult,
    EventLog,
    Relation,
    discover,
)
from thinkmem_ros.consolidator.knowledge import (
    KnowledgeConfig,
    KnowledgeStore,
    KnowledgeStoreError,
    KnowledgeUnit,
    consolidate,
)
from thinkmem_ros.world.event_episodes import EventWorldConfig, generate_event_history

CFG = KnowledgeConfig(rho=0.5, promote_at=0.5, demote_below=0.3, retire_below=0.1)


def _unit(**kw):
    base = dict(pattern=("E001", "E002", "E003"), relation="sequence3",
                constraints={"min_gap": 0.0, "max_gap": None}, thinking="consider:E003")
    return KnowledgeUnit(**{**base, **kw})


def _result(relations, read=None):
    return DiscoveryResult(accepted=relations, scored=relations, candidates={},
                           null_max={}, config=DiscoveryConfig(), n_events=0, n_episodes=0,
                           episode_ids=None if read is None else np.asarray(read, np.int64))


def _rel(pattern=("E001", "E002", "E003"), support=8, antecedent=10, episodes=(1, 2)):
    return Relation(pattern=pattern, support=support, antecedent_support=antecedent,
                    reverse=1, partition_support=(4, 4), p_value=0.01, accepted=True,
                    reasons=(), episodes=episodes, gaps=((20.0, 50.0), (21.0, 59.0)))


def test_confidence_update_follows_rho_rule():
    unit = _unit(confidence=0.6)
    unit.update(1.0, 1, CFG)
    assert unit.confidence == pytest.approx(0.5 * 0.6 + 0.5 * 1.0)
    unit.update(0.0, 2, CFG)
    assert unit.confidence == pytest.approx(0.4)


def test_promotion_demotion_retirement_and_reactivation():
    units = consolidate({}, _result([_rel()]), 0, CFG)
    unit = units["E001>E002>E003"]
    assert unit.confidence == pytest.approx(0.8) and unit.status == "promoted"
    assert unit.thinking == "consider:E003" and unit.experiences == (1, 2)
    consolidate(units, _result([]), 1, CFG)  # 0.4: still promoted (>= demote_below)
    assert unit.status == "promoted"
    consolidate(units, _result([]), 2, CFG)  # 0.2 < 0.3 -> demoted
    assert unit.status == "demoted" and not unit.active
    consolidate(units, _result([]), 3, CFG)  # 0.1 -> not yet below retire_below
    consolidate(units, _result([]), 4, CFG)  # 0.05 -> retired
    assert unit.status == "retired"
    consolidate(units, _result([_rel(episodes=(7,))]), 5, CFG)
    assert unit.status == "candidate"  # reactivated, needs confidence to be promoted again
    consolidate(units, _result([_rel(episodes=(8,))]), 6, CFG)
    assert unit.status == "promoted" and set(unit.experiences) == {1, 2, 7, 8}
    assert [h[0] for h in unit.history] == list(range(7))


def test_a_promoted_pair_gives_way_to_the_triple_that_contains_it():
    # the pair B...C promoted first (A not yet seen often enough), the rule A...B...C later:
    # the pair must stop making the robot consider C after every B
    pair = ("E002", "E003")
    units = consolidate({}, _result([_rel(pattern=pair, episodes=(1,))]), 1, CFG)
    assert units["E002>E003"].active
    consolidate(units, _result([_rel(), _rel(pattern=pair, episodes=(2,))]), 2, CFG)
    assert units["E001>E002>E003"].active
    assert units["E002>E003"].status == "demoted"
    assert units["E002>E003"].history[-1] == (2, 0.8, pytest.approx(0.8), "demoted")
    other = ("E004", "E003")  # same consequence, not inside the triple: left alone
    consolidate(units, _result([_rel(), _rel(pattern=other)]), 3, CFG)
    assert units["E004>E003"].active
    for r in range(4, 7):  # the triple fades: the pair, seen again, comes back
        consolidate(units, _result([_rel(pattern=pair)]), r, CFG)
    assert not units["E001>E002>E003"].active and units["E002>E003"].active


def _refusal(read, scored=(), candidate=False):
    """A round that read ``read`` and accepted nothing; the rule a candidate or not."""
    codes = ("E001", "E002", "E003")
    keys = {3: np.asarray([0 * 9 + 1 * 3 + 2], np.int64)} if candidate else {}
    return DiscoveryResult(accepted=[], scored=list(scored), candidates=keys, null_max={},
                           config=DiscoveryConfig(), n_events=0, n_episodes=len(read),
                           codes=codes, episode_ids=np.asarray(read, np.int64))


def _refused(significant, reason):
    return replace(_rel(), accepted=False, reasons=(reason,), significant=significant)


def test_a_round_that_reread_the_evidence_and_found_it_insignificant_demotes_at_once():
    # rounds re-read the histories within their horizon: a later, larger sample whose
    # FDR-controlled test no longer finds the pattern outweighs the smaller one that did
    units = consolidate({}, _result([_rel(support=10, episodes=(1, 2))]), 1, CFG)
    unit = units["E001>E002>E003"]
    assert unit.status == "promoted" and unit.confidence == pytest.approx(1.0)
    fdr = _refused(False, "weighted p 4e-05 above the FDR cutoff 8e-07")
    consolidate(units, _refusal([1, 2, 3, 4], [fdr]), 2, CFG)
    assert unit.status == "demoted" and unit.confidence == pytest.approx(0.5)
    consolidate(units, _refusal([1, 2, 3, 4, 5], [fdr]), 3, CFG)
    assert unit.status == "demoted"  # a refutation never promotes
    consolidate(units, _result([_rel(episodes=(5,))], read=[1, 2, 3, 4, 5]), 4, CFG)
    assert unit.status == "promoted"  # accepted again: back


def test_a_tested_candidate_the_round_did_not_score_is_refuted():
    units = consolidate({}, _result([_rel(support=10, episodes=(1, 2))]), 1, CFG)
    consolidate(units, _refusal([1, 2, 3], candidate=True), 2, CFG)  # p above alpha
    assert units["E001>E002>E003"].status == "demoted"


@pytest.mark.parametrize("case", ["check", "untested", "left_horizon"])
def test_persistence_holds_where_the_round_did_not_refute_the_evidence(case):
    # still significant but refused by a per-pattern check (a rule whose episodes now lie
    # in one period of the history); not tested at all; or its evidence no longer read:
    # the unit decays by rho as eq. 11 has it
    units = consolidate({}, _result([_rel(support=10, episodes=(1, 2))]), 1, CFG)
    unit = units["E001>E002>E003"]
    later = {"check": _refusal([1, 2, 3], [_refused(True, "partition share 0.80 > 0.75")]),
             "untested": _refusal([1, 2, 3]),
             "left_horizon": _refusal([2, 3], [_refused(False, "weighted p above")])}[case]
    consolidate(units, later, 2, CFG)
    assert unit.status == "promoted" and unit.confidence == pytest.approx(0.5)
    consolidate(units, _refusal([3, 4]), 3, CFG)
    assert unit.status == "demoted" and unit.confidence == pytest.approx(0.25)


def test_discovery_says_which_episodes_it_read():
    hist = generate_event_history(EventWorldConfig(repetitions=8), np.random.default_rng(0))
    log = EventLog.from_episodes(hist.episodes, hist.codes)
    part = log.select(np.flatnonzero(log.partition <= 1))
    res = discover(part, DiscoveryConfig(), np.random.default_rng(1))
    assert np.array_equal(res.episode_ids, part.episode_ids)
    assert len(res.episode_ids) < len(log.episode_ids)
    for rel in res.accepted:
        assert set(rel.episodes) <= set(res.episode_ids.tolist())
    assert res.scored and all(r.significant is not None for r in res.scored)
    assert all(r.significant for r in res.accepted)


def test_weak_relation_stays_candidate():
    units = consolidate({}, _result([_rel(support=4, antecedent=10)]), 0, CFG)
    assert units["E001>E002>E003"].status == "candidate"


def test_bad_values_rejected():
    with pytest.raises(ValueError, match="rho"):
        KnowledgeConfig(rho=1.0)
    with pytest.raises(ValueError, match="status"):
        _unit(status="bogus")
    with pytest.raises(ValueError, match="support"):
        _unit().update(1.5, 0, CFG)
    with pytest.raises(ValueError, match="refuted"):
        _unit().update(0.5, 0, CFG, refuted=True)


def test_store_round_trip_shares_file_and_lists(tmp_path):
    db = tmp_path / "consolidator.sqlite"
    with sqlite3.connect(db) as conn:  # someone else's table in the same file survives
        conn.execute("CREATE TABLE experiences (id INTEGER)")
    hist = generate_event_history(EventWorldConfig(repetitions=8), np.random.default_rng(0))
    res = discover(EventLog.from_episodes(hist.episodes, hist.codes),
                   DiscoveryConfig(), np.random.default_rng(1))
    units = consolidate({}, res, 0, KnowledgeConfig())
    with KnowledgeStore(db) as store:
        assert store.save(units.values()) == len(units)
    with KnowledgeStore(db) as store:
        loaded = store.units()
        promoted = store.load(status="promoted")
    assert set(loaded) == set(units)
    assert {u.pattern for u in promoted} == set(hist.rules)
    for key, unit in units.items():
        assert loaded[key].confidence == pytest.approx(unit.confidence)
        assert loaded[key].experiences == unit.experiences
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert {"experiences", "knowledge_units", "knowledge_schema_version"} <= tables
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    out = subprocess.run([sys.executable, "-m", "thinkmem_ros.cli", "knowledge", "list",
                          "--db", str(db), "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)
    assert {tuple(u["pattern"]) for u in listed if u["status"] == "promoted"} == set(hist.rules)
    missing = subprocess.run([sys.executable, "-m", "thinkmem_ros.cli", "knowledge", "list",
                              "--db", str(tmp_path / "nope.sqlite")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 2


def test_newer_schema_refused(tmp_path):
    db = tmp_path / "k.sqlite"
    KnowledgeStore(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO knowledge_schema_version VALUES (99, 0)")
    with pytest.raises(KnowledgeStoreError, match="newer"):
        KnowledgeStore(db)
