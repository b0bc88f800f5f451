"""Canary publishing: a new version reaches a few robots first, live figures decide the rest.

A round that passes the offline gate has only been judged on replayed streams. A fleet
should not get it everywhere at once: the round's version v goes to the **canary**
robots only, the others keep running the version they run (v-1), and what the robots ship
afterwards decides.

**Who is a canary.** ``CanaryConfig.robots`` names them explicitly; otherwise a robot is a
canary when a stable hash of its id (sha256, read as a number in [0, 1)) is below
``fraction``. The hash does not depend on the round or on which robots happen to be
connected, so the same robots are canaries round after round and a restart changes
nothing. With few robots too few hashes may fall below the fraction: then the connected
robots with the smallest hashes are canaries anyway, up to ``min_robots`` of them when the
others can still number ``min_robots`` (a decision needs that many per group), and at
least one; when every connected robot would be a canary, the one with the largest hash
is not (someone must keep v-1 to compare with).

**Who counts in which group: the consolidator's side, checked against the record.** A
record counts for the canary group only when its robot is one the consolidator pushed v to
(the push's ``CanarySelector``), its ``bundle_version`` is v and its ``bundle_sha256`` is
v's; for the control group only when its robot is not a canary and it states v-1 (or the
version whose model v-1 republished) with that bundle's sha256. Anything else is left out
and counted by reason (``LiveFigures.ignored_by``, ``Decision.ignored``): another version
(a pinned robot, an older bundle), a non-canary claiming v, a canary still on v-1 (not
installed yet, or refused: it is not what the others run either), no sha256, another
sha256 (a bundle of the robot's own under that number). A robot cannot join the group it
likes by saying so.

**Live figures, per robot.** Each robot's own figures, over the labels both bundles emit
(a new label the baseline cannot emit would otherwise count as the baseline's miss and hide
a regression on the skills both have; the offline gate judges the new labels):

- micro-F1 of the activation (each label whose probability is >= the bundle's threshold)
  against ``required`` (what hindsight says the situation needed); only experiences with
  ``required`` count (``judged``);
- mean ``reward``, each reward clipped to [-1, 1] first (the wire allows up to 1e15: one
  record must not outweigh a robot's others).

A robot counts once it has ``min_feedback`` judged (for reward: rewarded) experiences:
``min_feedback`` is **per robot**, so a robot's figure has a known precision and one robot
cannot stand in for many. Pooled figures per group (``GroupFigures.micro_f1``,
``mean_reward``) are still reported, but they do not decide.

**The decision: medians over robots, a margin and a one-sided test.** The unit that is
independent is the robot, not the experience (hundreds of frames of one episode are not
independent samples), and a robot sending many records must weigh one. Per figure, once
both groups have ``min_robots`` robots that count, the groups' **medians** of the robots'
figures are compared (one robot with an extreme figure moves a median of three or more
robots by one rank at most; with two, the median is their mean, and a bounded figure
moves it by half the range at most). The difference is tested one-sided over robots
(``p_value``): t = difference / standard error, on Student's t with n_canary + n_control -
2 degrees of freedom, where a robot's variance is the larger of the robots' robust spread
(1.4826 MAD around their group's median) and the mean sampling variance of their figures
(binomial with pseudo-counts for micro-F1, the clipped rewards' variance for reward), so
neither one outlying robot nor a few lucky agreeing robots decide it:

- ``wait`` while either group has fewer than ``min_robots`` robots with ``min_feedback``
  judged experiences (and, for the reward criterion, rewarded ones), or while a figure is
  worse by more than its margin but its p-value is not below ``alpha`` (it could be noise:
  more experiences per robot tighten it), and ``max_wait_s`` has not passed;
- ``rollback`` when the canaries' median micro-F1 is below the others' by more than
  ``margin`` with a p-value below ``alpha``, or (with ``reward_margin`` set and enough
  rewarded robots) their median mean reward by more than ``reward_margin``, likewise:
  v-1's model is republished as version v+1 (signed, history kept,
  ``extras.rolled_back_from = v``; robots refuse a lower version than they run, so the
  old content needs a new, higher number) and pushed to the canaries;
- ``promote`` when every figure both groups have enough robots for is within its margin
  (micro-F1 alone suffices when rewards are short): ``current`` moves to v and v is pushed
  to every robot;
- ``hold`` when ``max_wait_s`` passes without enough evidence (too few robots, or worse
  but possibly noise): nothing is pushed, v is not promoted (promoting unproven is what
  the canary exists to prevent) and not rolled back (nothing shows it is worse beyond
  noise, and it passed the offline gate). The canaries keep v, the rest keep v-1
  (``current``), rounds resume, and the next round's version goes to the canaries again.

Two canaries are enough for a test: the robots' spread is pooled over both groups (the
canaries are assumed to vary like the others), and each robot's sampling variance bounds
it from below. The test is repeated at every check while a canary looks worse but not
significantly so, which raises the chance of a rollback on noise above ``alpha``; lower
``alpha`` when a needless rollback costs more than a late one.

While a canary is undecided the service runs no round: a round on top of an undecided
version would stack a second unproven change on it. The undecided canary is written to
``STATE_FILE`` beside ``current`` (with the store's last row id at the push), so a
restarted consolidator resumes it from the store instead of forgetting it (``resume``).
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from thinkmem_ros.consolidator.canary_selection import (
    STATE_FILE,
    CanaryConfig,
    CanarySelector,
    CanaryState,
    CanaryStateError,
    read_state,
)
from thinkmem_ros.consolidator.canary_stats import Decision, GroupFigures, decide
from thinkmem_ros.consolidator.publish import ARTEFACTS_KEY, Publication, Publisher
from thinkmem_ros.consolidator.rehearsal import rehearsal_path
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.policy.bundle import ONNX_FILE, Bundle, load_bundle, write_bundle

log = logging.getLogger(__name__)

ROLLED_BACK_FROM = "rolled_back_from"  # manifest extras: the version a rollback replaced
REPUBLISHED_FROM = "republished_from"  # manifest extras: the version whose model it carries
DECISIONS = ("wait", "promote", "rollback", "hold")


# ------------------------------------------------------------------ live figures

IGNORED_REASONS = ("other_version", "not_a_canary", "canary_on_previous", "no_sha256",
                   "wrong_sha256")
"""Why ``LiveFigures`` left a record out (``Decision.ignored``), in the order it checks."""


def _as_selector(canaries: Callable[[str], bool] | Iterable[str]) -> Callable[[str], bool]:
    """A predicate on robot ids from a predicate or a list of ids."""
    if callable(canaries):
        return canaries
    return CanarySelector(frozenset(canaries), explicit=True)


class LiveFigures:
    """Accumulates the two groups' figures from experiences (thread-safe, O(robots) memory).

    ``versions`` are the canary version and the control versions (the running version
    and any version carrying the same model, i.e. what a rollback republished); each
    version's thresholds and ONNX sha256. ``canaries`` are the robots the consolidator
    pushed the canary version to (a ``CanarySelector``, or their ids). A record counts
    only where the consolidator's side and the record agree (module docstring); the
    others are counted in ``ignored`` and, by reason, in ``ignored_by``.
    """

    def __init__(self, canary_version: int, control_versions: Iterable[int],
                 thresholds: dict[int, dict[str, float]],
                 sha256: dict[int, str] | None = None, *,
                 canaries: Callable[[str], bool] | Iterable[str]) -> None:
        self.canary_version = canary_version
        self.control_versions = frozenset(control_versions) - {canary_version}
        if not self.control_versions:
            raise ValueError("LiveFigures needs at least one control version")
        versions = {canary_version, *self.control_versions}
        missing = sorted(versions - set(thresholds))
        if missing:
            raise ValueError(f"LiveFigures: no thresholds for versions {missing}")
        self.sha256 = dict(sha256 or {})
        unknown = sorted(v for v in versions if not self.sha256.get(v))
        if unknown:
            raise ValueError(f"LiveFigures: no sha256 for versions {unknown} (a record "
                             f"proves the bundle it ran by its sha256)")
        self.thresholds = thresholds
        self.canaries = _as_selector(canaries)
        shared = set(thresholds[canary_version])
        for version in self.control_versions:
            shared &= set(thresholds[version])
        self.labels = frozenset(shared)
        self.canary = GroupFigures(versions=(canary_version,))
        self.control = GroupFigures(versions=tuple(sorted(self.control_versions)))
        self.ignored = 0
        self.ignored_by = dict.fromkeys(IGNORED_REASONS, 0)
        self._lock = threading.Lock()

    def group_of(self, experience: Experience) -> GroupFigures | str:
        """The group ``experience`` counts in, or why it counts in none.

        The role is the consolidator's (``canaries``), the version and the bundle's sha256
        the record's; all three must agree. A canary still on the previous version (not
        installed yet, or refused) is in neither group: it is not what the others run.
        """
        version, canary = experience.bundle_version, self.canaries(experience.robot_id)
        if version == self.canary_version:
            group = self.canary if canary else "not_a_canary"
        elif version in self.control_versions:
            group = "canary_on_previous" if canary else self.control
        else:
            return "other_version"
        if isinstance(group, str):
            return group
        if not experience.bundle_sha256:
            return "no_sha256"
        if experience.bundle_sha256 != self.sha256[version]:
            return "wrong_sha256"  # a bundle of the robot's own under that number
        return group

    def observe(self, experiences: Iterable[Experience]) -> None:
        """Count each experience in its group, or as ignored with the reason."""
        with self._lock:
            for exp in experiences:
                group = self.group_of(exp)
                if isinstance(group, str):
                    self.ignored += 1
                    self.ignored_by[group] += 1
                    continue
                group.add(exp, self.thresholds[exp.bundle_version], self.labels)

    def snapshot(self) -> tuple[GroupFigures, GroupFigures]:
        """Copies of (canary, control) figures, consistent with each other."""
        with self._lock:
            return (copy.deepcopy(self.canary), copy.deepcopy(self.control))

    def ignored_counts(self) -> dict[str, int]:
        """Records left out so far, by reason (non-zero ones) and in total."""
        with self._lock:
            counts = {reason: n for reason, n in self.ignored_by.items() if n}
            counts["total"] = self.ignored
            return counts


def _live_figures(candidate: Bundle, running: Bundle,
                  canaries: Callable[[str], bool]) -> LiveFigures:
    """Figures of ``candidate`` (canary) against what ``running`` stands for (control).

    The control group is the running version and, when that is a rollback's republished
    model, the version whose model it carries: robots still on it run the same model.
    """
    version = candidate.version
    original = running.manifest.extras.get(REPUBLISHED_FROM, running.version)
    control = {running.version, original}
    thresholds = {v: dict(running.manifest.thresholds) for v in control}
    thresholds[version] = dict(candidate.manifest.thresholds)
    sha = {v: running.manifest.sha256 for v in control}
    sha[version] = candidate.manifest.sha256
    return LiveFigures(version, control, thresholds, sha, canaries=canaries)


def evaluate(experiences: Sequence[Experience], canary_version: int,
             control_versions: Iterable[int], thresholds: dict[int, dict[str, float]],
             config: CanaryConfig, waited_s: float,
             sha256: dict[int, str] | None = None,
             canaries: Callable[[str], bool] | Iterable[str] | None = None) -> Decision:
    """Live figures from ``experiences`` and the decision on them (the pure entry point).

    ``canaries`` defaults to what ``config`` says (its ``robots``, else the hash rule for
    ``fraction``), never to what the records claim.
    """
    if canaries is None:
        canaries = CanarySelector.configured(config)
    figures = LiveFigures(canary_version, control_versions, thresholds, sha256,
                          canaries=canaries)
    figures.observe(experiences)
    decision = decide(figures.canary, figures.control, config, waited_s)
    decision.version = canary_version
    decision.ignored = figures.ignored_counts()
    return decision


# ------------------------------------------------------------------ rollback

def rollback_bundle(publisher: Publisher, source: Bundle, rolled_back_from: int,
                    staging: Path) -> Bundle:
    """Stage ``source``'s model as the next version, marked as a rollback of a version.

    The ONNX graph, thresholds and listed artefacts are ``source``'s, byte for byte; only
    the version and ``extras`` (``rolled_back_from``, ``republished_from``: the version
    whose model this is, followed through earlier rollbacks) change. The publisher signs it.
    """
    version = publisher.next_version()
    manifest = load_bundle(source.path).manifest
    original = manifest.extras.get(REPUBLISHED_FROM, source.version)
    manifest.model_version = version
    manifest.created_at = ""
    manifest.extras = {**manifest.extras, ROLLED_BACK_FROM: rolled_back_from,
                       REPUBLISHED_FROM: original}
    folder = staging / f"v{version:06d}"
    bundle = write_bundle(folder, (source.path / ONNX_FILE).read_bytes(), manifest)
    for name in (manifest.extras.get(ARTEFACTS_KEY) or {}):
        shutil.copyfile(source.path / name, folder / name)
    return bundle


def copy_rehearsal(publish_dir: Path, source_version: int, version: int) -> bool:
    """Give a rollback version the training set D of the version whose model it carries.

    The next round rehearses the D saved for ``current``; its sha256 (recorded in the
    copied manifest) matches since the file is copied unchanged. False when the source
    has none (it then rebuilds from the recipe, as the source would have).
    """
    src = rehearsal_path(publish_dir, source_version)
    if not src.is_file():
        return False
    dst = rehearsal_path(publish_dir, version)
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, dst)
    return True


# ------------------------------------------------------------------ the service's part

Push = Callable[..., int]  # receiver.push_bundle(frame, robots=None) -> connections


@dataclass
class CanaryRun:
    """One undecided canary: which version, for whom, since when, and what it shows."""

    version: int
    baseline: Bundle  # what the others run (``current``)
    selector: CanarySelector
    figures: LiveFigures
    started: float  # time.monotonic()


class CanaryController:
    """Publishes to canaries, collects live figures, then promotes, rolls back or holds.

    The consolidator service calls ``publish`` instead of ``Publisher.publish``,
    ``observe`` from its receiver hook and ``check`` from its loop; nothing here opens a
    socket (``push`` is the receiver's ``push_bundle``), so it is tested without one.
    """

    def __init__(self, config: CanaryConfig, publisher: Publisher,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.config = config
        self.publisher = publisher
        self.clock = clock
        self.wall = wall
        self.run: CanaryRun | None = None
        self.decisions: list[Decision] = []  # acted-on decisions (not the waits)
        self.state_path = Path(publisher.root) / STATE_FILE

    @property
    def pending(self) -> CanaryRun | None:
        """The undecided canary, if any."""
        return self.run

    def publish(self, candidate: Bundle, running: Bundle, known_robots: Iterable[str],
                push: Push | None, store_mark: int = 0) -> Publication:
        """Sign ``candidate`` into the history (``current`` stays) and push it to canaries.

        ``store_mark`` is the store's last row id before the push: a restarted consolidator
        replays the rows after it to rebuild the live figures (``resume``).
        """
        selector = CanarySelector.choose(known_robots, self.config)
        send = None if push is None else (lambda frame: push(frame, robots=selector))
        # counting starts before the push, so no experience of a fast canary is missed
        self.run = CanaryRun(candidate.version, running, selector,
                             _live_figures(candidate, running, selector), self.clock())
        try:
            publication = self.publisher.publish(candidate, push=send, link=False)
        except BaseException:
            self.run = None
            raise
        self._save(self.run, store_mark)
        self._warn_if_undecidable(selector, known_robots)
        log.info("canary: v%d pushed to %s robot connections of canaries %s (others stay on "
                 "v%d)", publication.version, publication.pushed_to,
                 sorted(selector.chosen) or "none connected yet", running.version)
        return publication

    def _warn_if_undecidable(self, selector: CanarySelector, known: Iterable[str]) -> None:
        """Say so when the robots connected now cannot give min_robots per group.

        The canary then waits for robots that connect later, or holds at max wait: an
        operator of a small fleet wants to know before the hour has passed.
        """
        known = set(known)
        canaries = sum(1 for r in known if selector(r))
        need = self.config.min_robots
        if canaries < need or len(known) - canaries < need:
            log.warning("canary: %d canary and %d other robots connected, %d per group "
                        "needed to decide (--canary-min-robots); until more connect it can "
                        "only hold after max wait", canaries, len(known) - canaries, need)

    def observe(self, experiences: Iterable[Experience]) -> None:
        """Count experiences stored since the push (receiver thread)."""
        run = self.run
        if run is not None:
            run.figures.observe(experiences)

    def check(self, push: Push | None) -> Decision | None:
        """Decide on the pending canary and act; None when there is none."""
        run = self.run
        if run is None:
            return None
        canary, control = run.figures.snapshot()
        decision = decide(canary, control, self.config, self.clock() - run.started)
        decision.version = run.version
        decision.ignored = run.figures.ignored_counts()
        if decision.action == "wait":
            return decision
        if decision.action == "promote":
            publication = self.publisher.promote(run.version, push=push)
        elif decision.action == "rollback":
            publication = self._rollback(run, push)
        else:
            publication = None
        if publication is not None:
            decision.published_version = publication.version
            decision.pushed_to = publication.pushed_to
        self.run = None
        self._forget()
        self.decisions.append(decision)
        log.log(logging.WARNING if decision.action != "promote" else logging.INFO,
                "canary v%d: %s%s: %s (canary %s, others %s, records ignored %s)",
                run.version, decision.action.upper(),
                "" if publication is None else f" as v{publication.version}",
                decision.reason, decision.canary.to_dict(), decision.control.to_dict(),
                decision.ignored)
        return decision

    def resume(self, stored_after: Callable[[int], Iterable[Experience]]) -> CanaryRun | None:
        """Take up the canary a previous process left undecided (``STATE_FILE``).

        ``stored_after(mark)`` yields the experiences stored after row id ``mark``: the live
        figures are rebuilt from them, and the wait counts from the original push. A state
        that no longer matches the history (the version is gone, or ``current`` moved on) is
        dropped with a warning: deciding it now could undo what an operator did since.
        """
        try:
            state = read_state(self.state_path.parent)
        except CanaryStateError as exc:
            log.warning("canary: ignoring an unreadable state (%s); no canary resumed", exc)
            self._forget()
            return None
        if state is None:
            return None
        if not self.config.enabled:
            log.warning("canary: %s names an undecided canary, but canary publishing is "
                        "off now; not resumed", self.state_path)
            self._forget()
            return None
        version, baseline = state.version, state.baseline_version
        running = self.publisher.current()
        folder = self.publisher.history / f"v{version:06d}"
        if running.version != baseline or not folder.is_dir() or version <= baseline:
            log.warning("canary: %s names v%d over v%d, but current is v%d; not resumed",
                        self.state_path, version, baseline, running.version)
            self._forget()
            return None
        figures = _live_figures(load_bundle(folder), running, state.selector)
        figures.observe(stored_after(state.store_mark))
        waited = max(0.0, self.wall() - state.started_unix)
        self.run = CanaryRun(version, running, state.selector, figures, self.clock() - waited)
        canary, control = figures.snapshot()
        log.info("canary: resumed v%d (over v%d, %.0f s since the push; %d canary and %d "
                 "other experiences so far)", version, baseline, waited, canary.experiences,
                 control.experiences)
        return self.run

    def _save(self, run: CanaryRun, store_mark: int) -> None:
        """Write the undecided canary beside ``current`` (atomically)."""
        state = CanaryState(run.version, run.baseline.version, run.selector, self.wall(),
                            int(store_mark))
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        tmp.write_text(state.to_json())
        os.replace(tmp, self.state_path)

    def _forget(self) -> None:
        self.state_path.unlink(missing_ok=True)

    def _rollback(self, run: CanaryRun, push: Push | None) -> Publication:
        """Republish the baseline's model as a new version and push it to the canaries."""
        root = Path(self.publisher.root)
        staging = root / "staging"
        bundle = rollback_bundle(self.publisher, run.baseline, run.version, staging)
        # D first, as a round does: a linked version always has its training set
        copy_rehearsal(root, run.baseline.version, bundle.version)
        send = None if push is None else (lambda frame: push(frame, robots=run.selector))
        try:
            return self.publisher.publish(bundle, push=send)
        finally:
            shutil.rmtree(bundle.path, ignore_errors=True)
