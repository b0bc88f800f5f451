"""Canary publishing: who is a canary, the live figures, the decision, and a real rollback.

The decision logic runs on synthetic experience lists; the controller on a real publisher
(signed history, ``current`` link), also across a restart with a real store; a real
receive-only process pushing the canary to its canaries; the end-to-end test on a real
consolidator service with a real round, real ZeroMQ and four robots (shippers with
BundleReceivers).
"""

from __future__ import annotations

import threading
import time

import consolidator_world as world
import numpy as np
import pytest
import torch
from conftest import copy_bundle

from thinkmem_ros.consolidator import service as service_module
from thinkmem_ros.consolidator.canary import (
    REPUBLISHED_FROM,
    ROLLED_BACK_FROM,
    CanaryConfig,
    CanaryController,
    CanarySelector,
    evaluate,
    robot_score,
)
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


def wait(pred, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def record(robot, version, active, required, reward=None, sha="", labels=LABELS):
    """An experience whose activation (probability >= 0.5) is ``active``."""
    probs = [0.9 if label in active else 0.1 for label in labels]
    return Experience(robot_id=robot, episode_id="e", stamp=0.0,
                      window=np.zeros((2, 3), np.float32), labels=list(labels),
                      probabilities=probs, bundle_version=version, required=required,
                      reward=reward, bundle_sha256=sha)


def good(robot, version, n, **kw):
    return [record(robot, version, ["trend"], ["trend"], **kw) for _ in range(n)]


def bad(robot, version, n, **kw):  # activates hazard where trend was needed
    return [record(robot, version, ["hazard"], ["trend"], **kw) for _ in range(n)]


CFG = CanaryConfig(fraction=0.1, min_feedback=20, margin=0.05, max_wait_s=60)


def test_promote_when_the_canary_is_not_worse():
    exps = good("c", 2, 20) + good("r", 1, 18) + bad("r", 1, 2)
    d = evaluate(exps, 2, [1], THRESHOLDS, CFG, waited_s=1.0)
    assert d.action == "promote", d.reason
    assert d.canary.micro_f1 == 1.0 and d.control.micro_f1 == pytest.approx(0.9)
    # a canary slightly worse, within the margin, is still promoted
    exps = good("c", 2, 39) + bad("c", 2, 1) + good("r", 1, 20)  # 0.975 vs 1.0
    assert evaluate(exps, 2, [1], THRESHOLDS, CFG, 1.0).action == "promote"


def test_rollback_when_the_canary_is_worse_by_more_than_the_margin():
    exps = good("c", 2, 14) + bad("c", 2, 6) + good("r", 1, 20)
    d = evaluate(exps, 2, [1], THRESHOLDS, CFG, 1.0)
    assert d.action == "rollback" and "micro-F1" in d.reason, d.reason
    assert d.canary.micro_f1 == pytest.approx(28 / 40) and d.control.micro_f1 == 1.0


def test_wait_then_hold_while_evidence_is_insufficient():
    exps = bad("c", 2, 19) + good("r", 1, 50)  # clearly worse, but 19 < 20 judged
    assert evaluate(exps, 2, [1], THRESHOLDS, CFG, 59.0).action == "wait"
    d = evaluate(exps, 2, [1], THRESHOLDS, CFG, 60.0)
    assert d.action == "hold" and "max wait" in d.reason
    # experiences without hindsight (`required`) are not evidence for micro-F1
    unjudged = [record("c", 2, ["hazard"], None) for _ in range(50)] + good("r", 1, 50)
    d = evaluate(unjudged, 2, [1], THRESHOLDS, CFG, 1.0)
    assert d.action == "wait" and d.canary.experiences == 50 and d.canary.judged == 0


def test_groups_follow_bundle_version_and_sha_not_the_robot_role():
    # the canary robot "c" still on v1 (not installed yet) counts as v1; a robot claiming
    # v2 with another bundle's hash (its own bundle under that number) is ignored
    exps = (good("c", 2, 20, sha="a" * 64) + bad("c", 1, 20, sha="b" * 64)
            + bad("x", 2, 20, sha="f" * 64) + good("r", 1, 20, sha="b" * 64)
            + bad("old", 0, 5))
    d = evaluate(exps, 2, [1], THRESHOLDS, CFG, 1.0, sha256={2: "a" * 64, 1: "b" * 64})
    assert d.canary.experiences == 20 and d.canary.micro_f1 == 1.0
    assert d.control.experiences == 40 and d.control.robots == {"c", "r"}
    assert d.action == "promote"


def test_only_labels_both_bundles_emit_count():
    # v2 adds "novel"; hindsight needing "novel" must not make v1 look worse, nor hide a
    # regression of v2 on the shared labels
    exps = ([record("c", 2, ["novel", "hazard"], ["novel", "trend"]) for _ in range(20)]
            + [record("r", 1, ["trend"], ["novel", "trend"]) for _ in range(20)])
    d = evaluate(exps, 2, [1], THRESHOLDS, CFG, 1.0)
    assert d.control.micro_f1 == 1.0 and d.canary.micro_f1 == 0.0
    assert d.action == "rollback"


def test_reward_margin_rolls_back_on_reward_alone():
    cfg = CanaryConfig(fraction=0.1, min_feedback=20, margin=0.05, reward_margin=0.1)
    exps = [record("c", 2, [], None, reward=0.2) for _ in range(20)] + [
        record("r", 1, [], None, reward=0.6) for _ in range(20)]
    d = evaluate(exps, 2, [1], THRESHOLDS, cfg, 1.0)
    assert d.action == "rollback" and "mean reward" in d.reason
    assert d.canary.mean_reward == pytest.approx(0.2)
    # without reward_margin, rewards are reported only: no F1 evidence -> wait
    assert evaluate(exps, 2, [1], THRESHOLDS, CFG, 1.0).action == "wait"


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
    assert len(CanarySelector.choose(three, CanaryConfig(fraction=0.99)).chosen) == 2
    explicit = CanarySelector.choose(three, CanaryConfig(robots=("b", "zz")))
    assert explicit("b") and explicit("zz") and not explicit("a")
    assert not any(explicit(r) for r in late)


def test_config_and_cli_name_the_bad_value(capsys, tmp_path):
    for kwargs, name in (({"fraction": 1.0}, "fraction"), ({"fraction": -0.1}, "fraction"),
                         ({"min_feedback": 0}, "min_feedback"), ({"margin": 2}, "margin"),
                         ({"reward_margin": -1}, "reward_margin"),
                         ({"max_wait_s": 0}, "max_wait_s"), ({"robots": ("",)}, "robots")):
        with pytest.raises(ValueError, match=name):
            CanaryConfig(**kwargs)
    assert not CanaryConfig().enabled and CanaryConfig(robots="a,b").robots == ("a", "b")
    with pytest.raises(ValueError, match="canary"):
        ConsolidatorConfig(signing_key="k", canary={"fraction": 0.1})
    for argv, words in ((["--canary-fraction", "1.5"], "--canary-fraction"),
                        (["--canary-min-feedback", "0"], "--canary-min-feedback"),
                        (["--canary-max-wait-s", "-3"], "--canary-max-wait-s")):
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
    ctl = CanaryController(CanaryConfig(robots=("c",), min_feedback=5, max_wait_s=100),
                           publisher, clock=lambda: now[0])
    push = FakePushes(["c", "r"])
    labels = load_bundle(initial).manifest.labels
    thr = load_bundle(initial).manifest.thresholds

    def exps(robot, version, right, n=5):
        need = [labels[0]]
        probs = [(thr[lb] + 1) / 2 if (lb in need) == right else thr[lb] / 2 for lb in labels]
        return [Experience(robot_id=robot, episode_id="e", stamp=0.0,
                           window=np.zeros((2, 3), np.float32), labels=labels,
                           probabilities=probs, bundle_version=version, required=need)
                for _ in range(n)]

    # round 1: v2 to the canary only; current stays v1; wait, then promote
    staged = load_bundle(copy_bundle(source_bundle, tmp_path / "s2", model_version=2))
    running = publisher.current()
    assert ctl.publish(staged, running, ["c", "r"], push).version == 2
    assert push.calls == [["c"]] and publisher.current().version == 1
    ctl.observe(exps("c", 2, True, 3) + exps("r", 1, True))
    assert ctl.check(push).action == "wait" and ctl.pending is not None
    ctl.observe(exps("c", 2, True, 2))
    decision = ctl.check(push)
    assert decision.action == "promote" and decision.published_version == 2
    assert push.calls[-1] == ["c", "r"] and publisher.current().version == 2
    assert ctl.pending is None

    # round 2: v3 is worse on the canary: rolled back as v4 = v2's model, to the canary
    staged = load_bundle(copy_bundle(source_bundle, tmp_path / "s3", model_version=3))
    ctl.publish(staged, publisher.current(), ["c", "r"], push)
    ctl.observe(exps("c", 3, False) + exps("r", 2, True) + exps("c", 2, True))
    decision = ctl.check(push)
    assert decision.action == "rollback" and decision.published_version == 4, decision
    assert push.calls[-1] == ["c"] and publisher.current().version == 4
    v4 = verify_signed_bundle(publisher.history / "v000004", pub)
    v2 = load_bundle(publisher.history / "v000002")
    assert v4.manifest.extras[ROLLED_BACK_FROM] == 3 and v4.manifest.extras[REPUBLISHED_FROM] == 2
    assert v4.manifest.sha256 == v2.manifest.sha256
    assert v4.manifest.thresholds == v2.manifest.thresholds
    assert publisher.versions() == [2, 3, 4]  # history kept

    # round 3: nobody ships judged experiences: hold after max wait, nothing pushed
    staged = load_bundle(copy_bundle(source_bundle, tmp_path / "s5", model_version=5))
    ctl.publish(staged, publisher.current(), ["c", "r"], push)
    # the others still run v2, the model v4 republished: they are the control group
    assert ctl.pending.figures.control_versions == {4, 2}
    calls = len(push.calls)
    now[0] = 100.0
    assert ctl.check(push).action == "hold"
    assert len(push.calls) == calls and publisher.current().version == 4
    assert publisher.next_version() == 6


def test_a_restarted_controller_resumes_the_undecided_canary(tmp_path, source_bundle):
    from thinkmem_ros.consolidator.canary import STATE_FILE
    from thinkmem_ros.consolidator.store import ExperienceStore
    from thinkmem_ros.link.experience import encode_experience

    _, key = write_signing_keypair(tmp_path / "keys", "c")
    initial = copy_bundle(source_bundle, tmp_path / "initial", model_version=1)
    config = PublishConfig(tmp_path / "pub", key)
    cfg = CanaryConfig(robots=("c",), min_feedback=5, max_wait_s=100)
    now, wall = [0.0], [1000.0]
    labels = load_bundle(initial).manifest.labels
    thr = load_bundle(initial).manifest.thresholds

    def exps(robot, version, first_seq, n):
        need = [labels[0]]
        probs = [(thr[lb] + 1) / 2 if lb in need else thr[lb] / 2 for lb in labels]
        return [Experience(robot_id=robot, episode_id="e", stamp=float(i), seq=i,
                           window=np.zeros((2, 3), np.float32), labels=labels,
                           probabilities=probs, bundle_version=version, required=need)
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
    ctl = CanaryController(CanaryConfig(robots=("c",), min_feedback=3, max_wait_s=100),
                           publisher)
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
        ctl.observe([record("c", 2, ["trend"], ["trend"]) for _ in range(3)]
                    + [record("r", 1, ["trend"], ["trend"]) for _ in range(3)])
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
                                canary=canary_cfg)
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
