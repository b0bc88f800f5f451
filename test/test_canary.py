"""Canary publishing: who is a canary, the live figures, the decision, and a real rollback.

The decision logic runs on synthetic experience lists; the controller on a real publisher
(signed history, ``current`` link), also across a restart with a real store; a real
receive-only process pushing the canary to its canaries; the end-to-end test on a real
consolidator service with a real round, real ZeroMQ and four robots (shippers with
BundleReceivers).
"""

from __future__ import annotations

import threading

import consolidator_world as world
import numpy as np
import pytest
import torch
from conftest import copy_bundle
from waiting import wait

from thinkmem_ros.consolidator import service as service_module
from thinkmem_ros.consolidator.canary import (
    REPUBLISHED_FROM,
    ROLLED_BACK_FROM,
    CanaryController,
    evaluate,
)
from thinkmem_ros.consolidator.canary_selection import CanaryConfig, CanarySelector, robot_score
from thinkmem_ros.consolidator.gate import GateConfig
from thinkmem_ros.consolidator.ingest import open_receiver
from thinkmem_ros.consolidator.publish import PublishConfig, Publisher
from thinkmem_ros.consolidator.retrain import RetrainConfig
from thinkmem_ros.consolidator.service import ConsolidatorConfig, ConsolidatorService
from thinkmem_ros.consolidator.trigger import TriggerConfig
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.link.receiver import ReceiverConfig
from thinkmem_ros.link.security import verify_signed_bundle, write_signing_keypair
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig
from thinkmem_ros.policy.bundle import load_bundle
from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig

LABELS = ["trend", "hazard", "novel"]
THRESHOLDS = {1: {"trend": 0.5, "hazard": 0.5}, 2: {"trend": 0.5, "hazard": 0.5, "novel": 0.5}}
SHA = {0: "0" * 64, 1: "b" * 64, 2: "a" * 64}  # each version's ONNX sha256




def record(robot, version, active, required, reward=None, sha=None, labels=LABELS):
    """An experience whose activation (probability >= 0.5) is ``active``.

    ``sha`` defaults to the sha256 of the bundle ``version`` names, as a robot running it
    sends.
    """
    probs = [0.9 if label in active else 0.1 for label in labels]
    return Experience(robot_id=robot, episode_id="e", stamp=0.0,
                      window=np.zeros((2, 3), np.float32), labels=list(labels),
                      probabilities=probs, bundle_version=version, required=required,
                      reward=reward, bundle_sha256=SHA.get(version, "") if sha is None else sha)


def good(robot, version, n, **kw):
    return [record(robot, version, ["trend"], ["trend"], **kw) for _ in range(n)]


def bad(robot, version, n, **kw):  # activates hazard where trend was needed
    return [record(robot, version, ["hazard"], ["trend"], **kw) for _ in range(n)]


def each(robots, make, version, n, **kw):
    """``make(robot, version, n)`` for every robot in ``robots``."""
    return [e for robot in robots for e in make(robot, version, n, **kw)]


CANARIES = ("c1", "c2")
OTHERS = ("r1", "r2", "r3")
CFG = CanaryConfig(robots=CANARIES, min_feedback=20, margin=0.05, max_wait_s=60)


def judge(exps, cfg=CFG, waited_s=1.0, **kw):
    """The decision on ``exps``: v2 on the canaries ``cfg`` names, against v1."""
    return evaluate(exps, 2, [1], THRESHOLDS, cfg, waited_s, sha256=SHA, **kw)


def test_promote_when_the_canary_is_not_worse():
    exps = each(CANARIES, good, 2, 20) + good("r1", 1, 18) + bad("r1", 1, 2) + good("r2", 1, 20)
    d = judge(exps)
    assert d.action == "promote", d.reason
    assert d.canary.micro_f1 == 1.0 and d.control.micro_f1 == pytest.approx(76 / 80)
    # a canary slightly worse, within the margin, is still promoted
    exps = (good("c1", 2, 39) + bad("c1", 2, 1) + good("c2", 2, 40)
            + each(OTHERS, good, 1, 20))  # medians 0.9875 vs 1.0
    assert judge(exps).action == "promote"


def test_rollback_when_the_canary_is_worse_by_more_than_the_margin():
    exps = each(CANARIES, good, 2, 28) + each(CANARIES, bad, 2, 12) + each(OTHERS, good, 1, 40)
    d = judge(exps)
    assert d.action == "rollback" and "micro-F1" in d.reason, d.reason
    assert d.canary.micro_f1 == pytest.approx(56 / 80) and d.control.micro_f1 == 1.0
    (f1,) = d.comparisons
    assert (f1.canary_median, f1.control_median) == (pytest.approx(0.7), 1.0)
    assert f1.worse and f1.significant and f1.p_value < CFG.alpha


def test_wait_then_hold_while_evidence_is_insufficient():
    exps = each(CANARIES, bad, 2, 19) + each(OTHERS, good, 1, 50)  # 19 < 20 judged each
    assert judge(exps, waited_s=59.0).action == "wait"
    d = judge(exps, waited_s=60.0)
    assert d.action == "hold" and "max wait" in d.reason
    # experiences without hindsight (`required`) are not evidence for micro-F1
    unjudged = ([record(r, 2, ["hazard"], None) for r in CANARIES for _ in range(50)]
                + each(OTHERS, good, 1, 50))
    d = judge(unjudged)
    assert d.action == "wait" and d.canary.experiences == 100 and d.canary.judged == 0


def test_a_record_counts_only_where_the_consolidator_and_the_record_agree():
    """The group comes from who the consolidator pushed v to, proven by version and sha.

    Before: a record was grouped by the version it claimed, and an empty sha256 passed, so
    a non-canary claiming v2 decided the canary (the audit: 5 records rolled a good
    bundle back; 50 promoted one before any canary reported).
    """
    honest = each(CANARIES, good, 2, 20) + each(OTHERS, good, 1, 20)
    liars = (bad("r1", 2, 20)  # a non-canary claiming the canary version, with its sha
             + bad("x", 2, 20, sha="")  # a robot nobody pushed v2 to, no sha
             + bad("c1", 2, 20, sha="")  # a canary without a sha256
             + bad("c2", 2, 20, sha="f" * 64)  # a canary with a bundle of its own
             + good("c1", 1, 20)  # a canary still on v1: not what the others run
             + bad("r2", 1, 20, sha="")  # a non-canary on v1 without a sha256
             + bad("old", 0, 5))  # another version
    d = judge(honest + liars)
    assert d.action == "promote", d.reason
    assert d.canary.experiences == 40 and d.canary.robots == set(CANARIES)
    assert d.control.experiences == 60 and d.control.robots == set(OTHERS)
    assert d.ignored == {"not_a_canary": 40, "no_sha256": 40, "wrong_sha256": 20,
                         "canary_on_previous": 20, "other_version": 5, "total": 125}
    assert d.to_dict()["ignored"]["total"] == 125
    # nobody the consolidator chose has reported: one robot's claims decide nothing
    d = judge(good("r1", 2, 50) + each(OTHERS, good, 1, 50))
    assert d.action == "wait" and d.canary.experiences == 0, d.reason
    # the canaries may also be given as a predicate (a push's CanarySelector) or ids
    assert judge(honest + liars, canaries=lambda r: r in CANARIES).ignored["total"] == 125
    assert judge(honest, canaries={"c1"}).ignored == {"not_a_canary": 20, "total": 20}
    # the consolidator must know every version's sha256: nothing could count otherwise
    with pytest.raises(ValueError, match="sha256"):
        evaluate(honest, 2, [1], THRESHOLDS, CFG, 1.0)


def test_each_robot_weighs_one_and_needs_its_own_feedback():
    """Figures per robot, medians across robots, min_feedback per robot, min_robots.

    Before: experiences were pooled, so one robot's volume decided the group's figure, and
    min_feedback counted a group's experiences, whichever robots sent them.
    """
    cfg = CanaryConfig(robots=("c1", "c2", "c3"), min_feedback=20, margin=0.05,
                       max_wait_s=60)
    others = each(OTHERS, good, 1, 20)
    # one canary flooding bad records: the median of three canaries does not move
    d = judge(each(("c1", "c2"), good, 2, 20) + bad("c3", 2, 1000) + others, cfg)
    assert d.action == "promote", d.reason
    assert d.canary.micro_f1 < 0.1 and d.comparisons[0].canary_median == 1.0
    # nor does one other robot flooding bad records hide a worse canary
    d = judge(each(("c1", "c2", "c3"), bad, 2, 20) + bad("r3", 1, 1000)
              + each(("r1", "r2"), good, 1, 20), cfg)
    assert d.action == "rollback", d.reason
    # one canary with 40 judged experiences (twice min_feedback) is still one robot
    d = judge(good("c1", 2, 40) + others, cfg)
    assert d.action == "wait" and "canary 1, others 3; 2 each needed" in d.reason, d.reason
    # min_feedback is per robot: two canaries with 15 each (30 in all) do not count yet
    d = judge(each(CANARIES, bad, 2, 15) + others)
    assert d.action == "wait" and d.canary.judged == 30, d.reason
    assert "robots with >= 20 judged experiences: canary 0" in d.reason


def test_a_difference_that_could_be_noise_waits_then_holds():
    """Worse by more than the margin is not enough: it must be unlikely under noise.

    Before: the margin on pooled point estimates rolled back on one unlucky error per robot.
    """
    cfg = CanaryConfig(robots=CANARIES, min_feedback=20, margin=0.02, max_wait_s=60)
    others = each(OTHERS + ("r4", "r5"), good, 1, 20)
    exps = each(CANARIES, good, 2, 19) + each(CANARIES, bad, 2, 1) + others  # 0.95 vs 1.0
    d = judge(exps, cfg, waited_s=59.0)
    (f1,) = d.comparisons
    assert f1.worse and not f1.significant and f1.p_value > 0.1, f1.to_dict()
    assert d.action == "wait" and "could be noise" in d.reason, d.reason
    d = judge(exps, cfg, waited_s=60.0)  # as with too few robots: hold at max wait
    assert d.action == "hold" and "could be noise" in d.reason, d.reason
    # the same regression seen over more experiences per robot is no longer noise
    exps = each(CANARIES, good, 2, 190) + each(CANARIES, bad, 2, 10) + each(
        OTHERS + ("r4", "r5"), good, 1, 200)
    assert judge(exps, cfg).action == "rollback"


def test_honest_noise_rarely_rolls_back_and_a_real_regression_still_does():
    """Two canaries and eighteen others drawing Bernoulli outcomes, as a fleet does.

    Seeds 0 and 13: the canaries' pooled agreement came out 0.925 vs 0.953 and 0.940 vs
    0.968 at the same true 0.95, which the pooled margin rule rolled back (the audit's
    case); over robots, p = 0.056 and 0.036: not below alpha 0.01.
    """
    def fleet(seed, canary_quality, per=100):
        rng = np.random.default_rng(seed)
        exps = [e for r in CANARIES for ok in rng.random(per) < canary_quality
                for e in (good if ok else bad)(r, 2, 1)]
        return exps + [e for i in range(18) for ok in rng.random(per) < 0.95
                       for e in (good if ok else bad)(f"r{i}", 1, 1)]

    cfg = CanaryConfig(robots=CANARIES, min_feedback=50, margin=0.02)
    for seed in (0, 13):
        d = judge(fleet(seed, 0.95), cfg)
        assert d.canary.micro_f1 < d.control.micro_f1 - 0.02  # unlucky canaries ...
        assert d.action == "wait", d.reason  # ... are not rolled back on that
    d = judge(fleet(0, 0.80), cfg)
    assert d.action == "rollback" and d.comparisons[0].p_value < 1e-4, d.reason


def test_one_extreme_robot_does_not_hide_a_regression_in_the_spread():
    """The robots' spread is robust (MAD): one robot at F1 0 among the others is no noise."""
    rng = np.random.default_rng(0)
    others = [e for i in range(9) for ok in rng.random(60) < 0.95
              for e in (good if ok else bad)(f"r{i}", 1, 1)]
    exps = each(CANARIES, good, 2, 48) + each(CANARIES, bad, 2, 12) + others
    assert judge(exps).action == "rollback"
    d = judge(exps + bad("r9", 1, 60))  # a broken (or lying) robot among the others
    assert d.action == "rollback", d.reason


def test_only_labels_both_bundles_emit_count():
    # v2 adds "novel"; hindsight needing "novel" must not make v1 look worse, nor hide a
    # regression of v2 on the shared labels
    exps = ([record(c, 2, ["novel", "hazard"], ["novel", "trend"])
             for c in CANARIES for _ in range(20)]
            + [record(r, 1, ["trend"], ["novel", "trend"]) for r in OTHERS for _ in range(20)])
    d = judge(exps)
    assert d.control.micro_f1 == 1.0 and d.canary.micro_f1 == 0.0
    assert d.action == "rollback"


def test_reward_margin_rolls_back_on_reward_alone():
    cfg = CanaryConfig(robots=CANARIES, min_feedback=20, margin=0.05, reward_margin=0.1)
    exps = [record(c, 2, [], None, reward=0.2) for c in CANARIES for _ in range(20)] + [
        record(r, 1, [], None, reward=0.6) for r in OTHERS for _ in range(20)]
    d = judge(exps, cfg)
    assert d.action == "rollback" and "mean reward" in d.reason
    assert d.canary.mean_reward == pytest.approx(0.2)
    # without reward_margin, rewards are reported only: no F1 evidence -> wait
    assert judge(exps).action == "wait"


def test_rewards_are_clipped_so_one_record_cannot_decide():
    """Each reward counts in [-1, 1]; the wire allows 1e15.

    Before: one canary record of -1e15 (or -100) rolled a good bundle back, one of +1e15
    promoted a worse one.
    """
    cfg = CanaryConfig(robots=CANARIES, min_feedback=20, margin=0.05, reward_margin=0.1)

    def rewarded(robots, version, reward, n=40):
        return [record(r, version, ["trend"], ["trend"], reward=reward + 0.01 * (i % 5))
                for r in robots for i in range(n)]

    fine = rewarded(CANARIES, 2, 0.8) + rewarded(OTHERS, 1, 0.8)
    for outlier in (-1e15, -100.0):
        d = judge(fine + [record("c1", 2, ["trend"], ["trend"], reward=outlier)], cfg)
        assert d.action == "promote", d.reason
        assert d.canary.mean_reward > 0.7  # -1 among 81 rewards
    worse = rewarded(CANARIES, 2, 0.3) + rewarded(OTHERS, 1, 0.8)
    for robot, version, outlier in (("c1", 2, 1e15), ("r1", 1, -1e15)):
        d = judge(worse + [record(robot, version, ["trend"], ["trend"], reward=outlier)], cfg)
        assert d.action == "rollback" and "mean reward" in d.reason, d.reason


def test_canary_selection_is_stable_and_keeps_both_groups():
    robots = [f"robot{i:03d}" for i in range(200)]
    cfg = CanaryConfig(fraction=0.1)
    sel = CanarySelector.choose(robots, cfg)
    assert 8 <= len(sel.chosen) <= 35
    assert sel.chosen == CanarySelector.choose(reversed(robots), cfg).chosen
    assert all(sel(r) == (robot_score(r) < 0.1) for r in robots)
    # a robot unknown at push time is judged by its own hash
    late = [f"late{i}" for i in range(50)]
    assert [sel(r) for r in late] == [robot_score(r) < 0.1 for r in late]
    # few robots: at least one canary, never all of them
    three = ["a", "b", "c"]
    small = CanarySelector.choose(three, CanaryConfig(fraction=0.01))
    assert small.chosen == {min(three, key=robot_score)}
    # enough canaries to decide on (min_robots per group) when the fleet allows it: the
    # smallest hashes, as stable as the fraction's
    four = ["a", "b", "c", "d"]
    assert CanarySelector.choose(four, CanaryConfig(fraction=0.01)).chosen == set(
        sorted(four, key=robot_score)[:2])
    assert len(CanarySelector.choose(four, CanaryConfig(fraction=0.01, min_robots=1))
               .chosen) == 1
    assert len(CanarySelector.choose(three, CanaryConfig(fraction=0.99)).chosen) == 2
    explicit = CanarySelector.choose(three, CanaryConfig(robots=("b", "zz")))
    assert explicit("b") and explicit("zz") and not explicit("a")
    assert not any(explicit(r) for r in late)


def test_config_and_cli_name_the_bad_value(capsys, tmp_path):
    for kwargs, name in (({"fraction": 1.0}, "fraction"), ({"fraction": -0.1}, "fraction"),
                         ({"min_feedback": 0}, "min_feedback"), ({"margin": 2}, "margin"),
                         ({"reward_margin": -1}, "reward_margin"),
                         ({"max_wait_s": 0}, "max_wait_s"), ({"robots": ("",)}, "robots"),
                         ({"min_robots": 0}, "min_robots"), ({"min_robots": 1.5}, "min_robots"),
                         ({"alpha": 0}, "alpha"), ({"alpha": 1}, "alpha")):
        with pytest.raises(ValueError, match=name):
            CanaryConfig(**kwargs)
    assert not CanaryConfig().enabled and CanaryConfig(robots="a,b").robots == ("a", "b")
    with pytest.raises(ValueError, match="canary"):
        ConsolidatorConfig(signing_key="k", canary={"fraction": 0.1})
    for argv, words in ((["--canary-fraction", "1.5"], "--canary-fraction"),
                        (["--canary-min-feedback", "0"], "--canary-min-feedback"),
                        (["--canary-max-wait-s", "-3"], "--canary-max-wait-s"),
                        (["--canary-min-robots", "0"], "--canary-min-robots"),
                        (["--canary-alpha", "1.5"], "--canary-alpha")):
        assert service_module.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
    _, key = write_signing_keypair(tmp_path / "keys", "c")
    assert service_module.main(["--signing-key", str(key), "--once",
                                "--canary-robots", "r1"]) == 2
    assert "--once" in capsys.readouterr().err


class FakePushes:
    """Stands in for ``receiver.push_bundle``: records who each frame was meant for."""

    def __init__(self, robots):
        self.robots, self.calls = robots, []

    def __call__(self, frame, robots=None):
        chosen = [r for r in self.robots if robots is None or robots(r)]
        self.calls.append(chosen)
        return len(chosen)


def test_controller_promotes_links_current_and_rolls_back_as_a_new_version(
        tmp_path, source_bundle):
    pub, key = write_signing_keypair(tmp_path / "keys", "c")
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    publisher = Publisher(PublishConfig(tmp_path / "pub", key), initial)
    now = [0.0]
    canaries, others = ["c", "d"], ["r", "s", "t"]
    ctl = CanaryController(CanaryConfig(robots=tuple(canaries), min_feedback=5,
                                        max_wait_s=100), publisher, clock=lambda: now[0])
    push = FakePushes(canaries + others)
    labels = load_bundle(initial).manifest.labels
    thr = load_bundle(initial).manifest.thresholds
    sha = load_bundle(initial).manifest.sha256  # every version here carries the same ONNX

    def exps(robots, version, right, n=5):
        need = [labels[0]]
        probs = [(thr[lb] + 1) / 2 if (lb in need) == right else thr[lb] / 2 for lb in labels]
        return [Experience(robot_id=robot, episode_id="e", stamp=0.0,
                           window=np.zeros((2, 3), np.float32), labels=labels,
                           probabilities=probs, bundle_version=version, required=need,
                           bundle_sha256=sha)
                for robot in robots for _ in range(n)]

    # round 1: v2 to the canaries only; current stays v1; wait, then promote
    staged = load_bundle(copy_bundle(source_bundle, tmp_path / "s2", model_version=2))
    running = publisher.current()
    assert ctl.publish(staged, running, canaries + others, push).version == 2
    assert push.calls == [canaries] and publisher.current().version == 1
    ctl.observe(exps(canaries, 2, True, 3) + exps(others, 1, True))
    assert ctl.check(push).action == "wait" and ctl.pending is not None
    ctl.observe(exps(canaries, 2, True, 2))
    decision = ctl.check(push)
    assert decision.action == "promote" and decision.published_version == 2
    assert push.calls[-1] == canaries + others and publisher.current().version == 2
    assert ctl.pending is None

    # round 2: v3 is worse on the canaries: rolled back as v4 = v2's model, to the canaries;
    # a canary's records on v2 and another robot's claims of v3 are left out, and counted
    staged = load_bundle(copy_bundle(source_bundle, tmp_path / "s3", model_version=3))
    ctl.publish(staged, publisher.current(), canaries + others, push)
    ctl.observe(exps(canaries, 3, False) + exps(others, 2, True) + exps(["c"], 2, True)
                + exps(["r"], 3, True, 50))
    decision = ctl.check(push)
    assert decision.action == "rollback" and decision.published_version == 4, decision
    assert decision.ignored == {"canary_on_previous": 5, "not_a_canary": 50, "total": 55}
    assert decision.to_dict()["comparisons"][0]["significant"]
    assert push.calls[-1] == canaries and publisher.current().version == 4
    v4 = verify_signed_bundle(publisher.history / "v000004", pub)
    v2 = load_bundle(publisher.history / "v000002")
    assert v4.manifest.extras[ROLLED_BACK_FROM] == 3 and v4.manifest.extras[REPUBLISHED_FROM] == 2
    assert v4.manifest.sha256 == v2.manifest.sha256
    assert v4.manifest.thresholds == v2.manifest.thresholds
    assert publisher.versions() == [2, 3, 4]  # history kept

    # round 3: nobody ships judged experiences: hold after max wait, nothing pushed
    staged = load_bundle(copy_bundle(source_bundle, tmp_path / "s5", model_version=5))
    ctl.publish(staged, publisher.current(), canaries + others, push)
    # the others still run v2, the model v4 republished: they are the control group
    assert ctl.pending.figures.control_versions == {4, 2}
    calls = len(push.calls)
    now[0] = 100.0
    assert ctl.check(push).action == "hold"
    assert len(push.calls) == calls and publisher.current().version == 4
    assert publisher.next_version() == 6


def test_publishing_to_too_few_robots_to_decide_is_said(tmp_path, source_bundle, caplog):
    """One canary with min_robots 2 can only hold: the operator hears it at the push."""
    _, key = write_signing_keypair(tmp_path / "keys", "c")
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    publisher = Publisher(PublishConfig(tmp_path / "pub", key), initial)
    staged = load_bundle(copy_bundle(source_bundle, tmp_path / "s2", model_version=2))
    ctl = CanaryController(CanaryConfig(robots=("c",)), publisher)
    with caplog.at_level("WARNING", logger="thinkmem_ros.consolidator.canary"):
        ctl.publish(staged, publisher.current(), ["c", "r", "s"], None)
    assert any("1 canary and 2 other robots connected, 2 per group needed" in r.getMessage()
               for r in caplog.records), caplog.text


def test_a_restarted_controller_resumes_the_undecided_canary(tmp_path, source_bundle):
    from thinkmem_ros.consolidator.canary_selection import STATE_FILE
    from thinkmem_ros.consolidator.store import ExperienceStore
    from thinkmem_ros.link.experience import encode_experience

    _, key = write_signing_keypair(tmp_path / "keys", "c")
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    config = PublishConfig(tmp_path / "pub", key)
    cfg = CanaryConfig(robots=("c",), min_feedback=5, max_wait_s=100, min_robots=1)
    now, wall = [0.0], [1000.0]
    labels = load_bundle(initial).manifest.labels
    thr = load_bundle(initial).manifest.thresholds

    def exps(robot, version, first_seq, n):
        need = [labels[0]]
        probs = [(thr[lb] + 1) / 2 if lb in need else thr[lb] / 2 for lb in labels]
        return [Experience(robot_id=robot, episode_id="e", stamp=float(i), seq=i,
                           window=np.zeros((2, 3), np.float32), labels=labels,
                           probabilities=probs, bundle_version=version, required=need,
                           bundle_sha256=load_bundle(initial).manifest.sha256)
                for i in range(first_seq, first_seq + n)]

    def store_all(store, batch):
        store.insert_many([(e, encode_experience(e)) for e in batch])

    with ExperienceStore(tmp_path / "store.db") as store:
        store_all(store, exps("r", 1, 0, 7))  # before the push: not the canary's evidence
        mark = store.last_id()
        first = CanaryController(cfg, Publisher(config, initial), clock=lambda: now[0],
                                 wall=lambda: wall[0])
        staged = load_bundle(copy_bundle(source_bundle, tmp_path / "s2", model_version=2))
        first.publish(staged, first.publisher.current(), ["c", "r"], None, store_mark=mark)
        assert (tmp_path / "pub" / STATE_FILE).exists()
        store_all(store, exps("c", 2, 0, 3) + exps("r", 1, 100, 5))

        # the process dies; a new one (its own clock) resumes from the state and the store
        now[0], wall[0] = 500.0, 1030.0
        second = CanaryController(cfg, Publisher(config, initial), clock=lambda: now[0],
                                  wall=lambda: wall[0])
        run = second.resume(lambda m: (e for _, e in store.iter_experiences(after_id=m)))
        assert run is not None and run.version == 2 and run.selector.chosen == {"c"}
        canary, control = run.figures.snapshot()
        assert (canary.experiences, control.experiences) == (3, 5)
        assert now[0] - run.started == pytest.approx(30.0)  # the wait counts from the push
        assert second.check(None).action == "wait"
        second.observe(exps("c", 2, 3, 2))
        assert second.check(None).action == "promote"
        assert second.publisher.current().version == 2
        assert not (tmp_path / "pub" / STATE_FILE).exists()

    # a state that does not fit the history any more, or cannot be read: dropped, said
    def restart(text, canary_cfg=cfg):
        (tmp_path / "pub" / STATE_FILE).write_text(text)
        ctl = CanaryController(canary_cfg, Publisher(config, initial))
        run = ctl.resume(lambda m: iter(()))
        return run, (tmp_path / "pub" / STATE_FILE).exists()

    stale = ('{"version": 2, "baseline_version": 1, "chosen": ["c"], "fraction": 0.0, '
             '"explicit": true, "started_unix": 0, "store_mark": 0}')
    assert restart(stale) == (None, False)  # current is v2 now
    assert restart("{not json") == (None, False)
    assert restart('{"version": 3}') == (None, False)
    assert restart(stale, CanaryConfig()) == (None, False)  # canary publishing turned off


def test_late_robots_get_the_newest_push_meant_for_them(tmp_path, source_bundle):
    """A subset push is remembered for its robots; a push to all supersedes it."""
    pub, key = write_signing_keypair(tmp_path / "keys", "c")
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    publisher = Publisher(PublishConfig(tmp_path / "pub", key), initial)
    rx = open_receiver(ReceiverConfig(bind="tcp://127.0.0.1:*", db_path=tmp_path / "s.db",
                                      max_frame_bytes=1 << 22, poll_s=0.02)).start()
    shippers = []

    def robot(name):
        got = BundleReceiver(BundleReceiverConfig(tmp_path / name, pub, current_version=1))
        shipper = ExperienceShipper(ShipperConfig(
            endpoint=rx.endpoint, robot_id=name, spool_path=tmp_path / f"{name}.db",
            on_bundle_push=got.handle_push)).start()
        shippers.append(shipper)
        assert shipper.ship(record(name, 1, [], None)) and shipper.flush(10.0)
        return got

    def stage(version):
        return load_bundle(copy_bundle(source_bundle, tmp_path / f"s{version}",
                                       model_version=version))

    try:
        assert publisher.publish(stage(2), push=rx.push_bundle).pushed_to == 0
        canary = CanarySelector(frozenset({"c"}), explicit=True)
        assert publisher.publish(stage(3), link=False,
                                 push=lambda f: rx.push_bundle(f, robots=canary)).pushed_to == 0
        c, r = robot("c"), robot("r")  # both connect after the pushes
        assert wait(lambda: c.version == 3 and r.version == 2), (c.stats(), r.stats())
        assert publisher.promote(3, push=rx.push_bundle).pushed_to == 2
        assert wait(lambda: r.version == 3) and c.stats()["accepted"] == 1
        late = robot("late")  # after a push to all, nobody gets the older subset push
        assert wait(lambda: late.version == 3), late.stats()
    finally:
        for shipper in shippers:
            shipper.close()
        rx.stop()


def test_a_receive_only_process_pushes_the_canary_to_its_canaries(tmp_path, source_bundle):
    """Robots on a receive-only process get the same roles as on the consolidator."""
    from thinkmem_ros.consolidator.receive import ReceiveConfig, ReceiveProcess

    pub, key = write_signing_keypair(tmp_path / "keys", "c")
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    publisher = Publisher(PublishConfig(tmp_path / "pub", key), initial)
    ctl = CanaryController(CanaryConfig(robots=("c",), min_feedback=3, max_wait_s=100,
                                        min_robots=1), publisher)
    sha = load_bundle(initial).manifest.sha256
    process = ReceiveProcess(ReceiveConfig(db_path=tmp_path / "s.db", bind="tcp://127.0.0.1:*",
                                           curve="off", initial_bundle=initial,
                                           publish_dir=tmp_path / "pub")).start()
    shippers, robots = [], {}
    try:
        for name in ("c", "r"):
            robots[name] = BundleReceiver(BundleReceiverConfig(tmp_path / name, pub,
                                                               current_version=1))
            shipper = ExperienceShipper(ShipperConfig(
                endpoint=process.endpoint, robot_id=name, spool_path=tmp_path / f"{name}.db",
                curve="off", on_bundle_push=robots[name].handle_push)).start()
            shippers.append(shipper)
            assert shipper.ship(record(name, 1, [], None)) and shipper.flush(10.0)
        assert not process.check_canary()  # nothing undecided yet
        staged = load_bundle(copy_bundle(source_bundle, tmp_path / "s2", model_version=2))
        ctl.publish(staged, publisher.current(), ["c", "r"], None)
        assert process.check_canary() and not process.check_canary()  # once per version
        assert wait(lambda: robots["c"].version == 2), robots["c"].stats()
        assert not process.check_publications()  # current is still v1
        assert robots["r"].version == 1 and robots["r"].stats()["accepted"] == 0
        # promoted by the consolidator: current moves, everyone here gets v2
        ctl.observe([record("c", 2, ["trend"], ["trend"], sha=sha) for _ in range(3)]
                    + [record("r", 1, ["trend"], ["trend"], sha=sha) for _ in range(3)])
        assert ctl.check(None).action == "promote"
        assert process.check_publications()
        assert wait(lambda: robots["r"].version == 2), robots["r"].stats()
    finally:
        for shipper in shippers:
            shipper.close()
        process.stop()
        process.receiver.stop()


@pytest.fixture
def one_thread():
    torch.set_num_threads(1)


def test_end_to_end_canary_rollback_over_zeromq(tmp_path, one_thread):
    """A real round publishes v2 to the canary only; its worse live figures roll it back."""
    pub, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    bundle = world.running_bundle(tmp_path / "running")
    names = ["r0", "r1", "r2", "r3"]
    canary_cfg = CanaryConfig(fraction=0.25, min_feedback=20, margin=0.05, max_wait_s=120)
    canaries = CanarySelector.choose(names, canary_cfg).chosen
    assert 1 <= len(canaries) < len(names)
    config = ConsolidatorConfig(db_path=tmp_path / "c.db", publish_dir=tmp_path / "pub",
                                signing_key=key, initial_bundle=bundle,
                                bind="tcp://127.0.0.1:*", check_s=0.05,
                                trigger=TriggerConfig(period_s=1e6, buffer_limit=10000),
                                retrain=RetrainConfig(epochs=2, distill_margin=0.1),
                                canary=canary_cfg,  # the canary, not the gate's floors
                                gate=GateConfig(**world.JUDGE_SMALL))
    installed = {name: [] for name in names}
    receivers, shippers = {}, {}
    with ConsolidatorService(config) as service:
        loop = threading.Thread(target=service.serve, daemon=True)
        try:
            for i, name in enumerate(names):
                receivers[name] = BundleReceiver(
                    BundleReceiverConfig(tmp_path / name, pub, current_version=1),
                    on_install=installed[name].append)
                shippers[name] = ExperienceShipper(ShipperConfig(
                    endpoint=service.endpoint, robot_id=name,
                    spool_path=tmp_path / f"{name}.db",
                    on_bundle_push=receivers[name].handle_push)).start()
                for exp in world.experiences(name, 10, 5, seed=10 + i):
                    assert shippers[name].ship(exp)
            for shipper in shippers.values():
                assert shipper.flush(20.0), shipper.stats()
            assert wait(lambda: set(service.receiver.peers.values()) == set(names))
            report = service.run_round("test")
            assert report.outcome == "published to canaries", report.to_dict()
            assert report.published_version == 2 and set(report.canaries) == canaries
            assert service.run_round("again").outcome == "skipped: canary v2 undecided"
            # a consolidator restarted now takes the undecided canary up again (same
            # version, same canaries) instead of forgetting it and running rounds on top
            restarted = ConsolidatorService(config)
            assert restarted.canary.pending is not None
            assert restarted.canary.pending.version == 2
            assert restarted.canary.pending.selector.chosen == canaries
            restarted.close()
            loop.start()  # the service's own loop decides from here on
            for name in canaries:
                assert wait(lambda n=name: installed[n]), receivers[name].stats()
            v2 = load_bundle(tmp_path / "pub" / "history" / "v000002")
            v1 = load_bundle(bundle)
            assert (tmp_path / "pub" / "current").resolve().name != "v000002"

            # live experiences after the push: canaries on v2 activate the wrong thinking
            rng = np.random.default_rng(5)
            for name in names:
                on_v2 = name in canaries
                running = v2 if on_v2 else v1
                for i in range(25):
                    window, needed = world.situation(rng)
                    needed = needed or ["trend"]
                    thr = running.manifest.thresholds
                    labels = running.manifest.labels
                    probs = [min(1.0, thr[lb] + 0.3) if (lb in needed) != on_v2
                             else thr[lb] * 0.5 for lb in labels]
                    assert shippers[name].ship(Experience(
                        robot_id=name, episode_id=f"live{i}", stamp=1e4 + i, window=window,
                        labels=labels, probabilities=probs, bundle_version=running.version,
                        bundle_sha256=running.manifest.sha256, required=needed,
                        events=["F1"]))
                assert shippers[name].flush(20.0)
            assert wait(lambda: service.canary.decisions, 20.0), \
                service.canary.pending.figures.snapshot()
            decision = service.canary.decisions[0]
            assert decision.action == "rollback", decision.to_dict()
            assert decision.published_version == 3
            # decided as soon as each group had min_feedback judged experiences
            assert decision.canary.judged >= 20 and decision.control.judged >= 20
            assert decision.canary.robots <= canaries
            assert not decision.control.robots & canaries
            assert decision.canary.micro_f1 < decision.control.micro_f1 - 0.05
            for name in canaries:  # the rollback (v1's model as v3) reaches the canaries
                assert wait(lambda n=name: len(installed[n]) == 2), receivers[name].stats()
                assert receivers[name].version == 3
                v3 = verify_signed_bundle(installed[name][1], pub)
                assert v3.manifest.extras[ROLLED_BACK_FROM] == 2
                assert v3.manifest.sha256 == v1.manifest.sha256
            for name in set(names) - canaries:  # the rest never ran v2 (nor needed v3)
                assert installed[name] == [] and receivers[name].version == 1
                assert receivers[name].stats()["accepted"] == 0
            assert (tmp_path / "pub" / "current").resolve().name == "v000003"
        finally:
            service.stop()
            if loop.is_alive():
                loop.join(10)
            for shipper in shippers.values():
                shipper.close()
